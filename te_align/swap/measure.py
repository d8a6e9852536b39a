"""Conditioning statistics: the mean and standard deviation of what a denoiser attends to.

The positions measured are the ones the denoiser attends to. A profile that hands the denoiser a mask
(an output that is a slot's ``denoiser_mask``) is measured over the positions that mask lets through;
one without (SD 1.5: the UNet's cross-attention sees all 77 positions, BOS and padding included) over
every position. ``global`` statistics are one mean and one std over every value of those positions;
``channel`` statistics one per feature channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

import te_align
from te_align._types import JSONObject
from te_align.profiles.expr import Node, Ref, output_specs, refs
from te_align.profiles.model import AlignmentProfile

STATS_MODES = ("global", "channel")


@dataclass(frozen=True)
class Stats:
    """Statistics of one output over a caption set (float64; ``mean``/``std`` have one value in
    ``global`` mode, one per channel in ``channel`` mode)."""

    mode: str
    mean: torch.Tensor
    std: torch.Tensor
    #: Positions measured (summed over captions) and captions.
    positions: int
    captions: int

    def summary(self) -> JSONObject:
        """Plain numbers: the mean and std (for ``channel`` mode, the average over channels and the range)."""
        out: JSONObject = {"mode": self.mode, "positions": self.positions, "captions": self.captions}
        if self.mode == "global":
            out.update(mean=float(self.mean[0]), std=float(self.std[0]))
        else:
            out.update(
                mean=float(self.mean.mean()),
                std=float(self.std.mean()),
                std_min=float(self.std.min()),
                std_max=float(self.std.max()),
            )
        return out


def attended_mask_output(profile: AlignmentProfile, output: str) -> str | None:
    """The name of the mask output the denoiser gets for ``output`` (None: it attends to every position)."""
    specs = {o.name: o for o in output_specs(profile)}
    slots = {r.slot for r in _refs(specs[output].node)}
    for o in specs.values():
        if o.kind != "mask":
            continue
        refs = _refs(o.node)
        if refs and all(r.attr == "denoiser_mask" and r.slot in slots for r in refs):
            if any(profile.slot(s).masks.denoiser for s in slots):
                return o.name
    return None


def _refs(node: Node) -> list[Ref]:
    return refs(node)


def measure(
    profile: AlignmentProfile,
    captions: Sequence[str],
    *,
    mode: str = "global",
    output: str = "prompt_embeds",
    batch: int = 16,
    **encode_kwargs: Any,
) -> Stats:
    """Mean and std of ``output`` over the attended positions of ``captions``, encoded by
    ``te_align.encode(profile, ..., **encode_kwargs)`` (pipeline= or tokenizers= / text_encoders=)."""
    mask_name = attended_mask_output(profile, output)
    rows = []
    for i in range(0, len(captions), batch):
        cond = te_align.encode(profile, list(captions[i : i + batch]), **encode_kwargs)
        x = cond[output].detach().to(torch.float64)
        keep = cond[mask_name].bool() if mask_name else torch.ones(x.shape[:-1], dtype=torch.bool)
        rows.append(x[keep.to(x.device)].cpu())
    values = torch.cat(rows, dim=0)  # (positions, channels)
    if mode == "global":
        flat = values.reshape(-1)
        mean, std = flat.mean().reshape(1), flat.std(unbiased=False).reshape(1)
    else:
        mean, std = values.mean(dim=0), values.std(dim=0, unbiased=False)
    return Stats(mode, mean, std, int(values.shape[0]), len(captions))


__all__ = ["STATS_MODES", "Stats", "attended_mask_output", "measure"]
