"""Prompt accuracy: does the finetuned model draw what the prompt asks?

For a validation folder with a shapes-world answer key (:func:`te_align.tiny.datasets.write_world_split`),
every validation caption is sampled once with the official pipeline, conditioned by the *profile* (what
inference uses), from a fixed seed per caption, and the image is read back by
:func:`te_align.tiny.world.score`. Both arms of a seed are scored on identical prompts and noise.

Reported per arm: ``object_accuracy`` (objects read exactly: colour, shape and position), ``concept_accuracy``
(the same over objects that carry the finetuned concept), per-attribute accuracies, ``image_accuracy`` and
spurious readings per image.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import te_align
from te_align._lazy import lazy_module
from te_align._types import JSONObject
from te_align.tiny import world

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch
    from diffusers import DiffusionPipeline

    from te_align.encoding.core import EncodeOptions
    from te_align.profiles.model import AlignmentProfile

#: Deferred: it imports torch, which this module leaves to the functions that sample.
_encoding_core = lazy_module("te_align.encoding.core")
#: The trainer's sampling helpers (pipeline keywords, the denoiser mask as trained); deferred with the rest.
_sampling = lazy_module("te_align.train.sampling")

#: An answer-key object: ``[colour, shape, position, carries_concept]``.
_KeyObject = Sequence[str | bool]

__all__ = ["encode_each", "read_probes", "sample_prompts", "save_images", "score_images"]


def _per_prompt(profile: AlignmentProfile, options: EncodeOptions | None) -> bool:
    """True where a prompt's conditioning depends on the other prompts of its batch (padding to the longest,
    chunking): such prompts are encoded one at a time, as an inference tool encodes them."""
    return bool(options is not None and getattr(options, "long_prompt_chunks", 0)) or any(
        s.tokenizer.padding == "longest" for s in profile.slots)


def _repeat_to(t: torch.Tensor, length: int) -> torch.Tensor:
    return t if t.shape[1] == length else t.repeat(1, length // t.shape[1], *([1] * (t.dim() - 2)))


def _pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    import torch

    return t if t.shape[1] == length else torch.nn.functional.pad(t, [0, 0] * (t.dim() - 2) + [0, length - t.shape[1]])


#: ComfyUI batches a prompt with its negative only while the least common multiple of their lengths is at most
#: this many times the shorter one; otherwise it runs them as separate passes.
_COMFY_REPEAT_LIMIT = 4


def _match_lengths(pos: dict[str, torch.Tensor], neg: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Make a prompt's and its negative's sequence tensors batchable as ComfyUI does
    (comfyanonymous/ComfyUI@fe25114 comfy/conds.py:46-76, CONDCrossAttn): where the least common multiple of the
    two lengths is at most 4 times the shorter, both are repeated to it (for cross-attention this changes nothing);
    beyond that ComfyUI runs them as separate passes, which here is zero-padding to the longer length and
    returning ``{name: (negative length, prompt length)}`` for :func:`_separate_passes` to cut each back."""
    import math

    separate: dict[str, tuple[int, int]] = {}
    for k in list(pos):
        if k in neg and pos[k].dim() >= 3 and neg[k].dim() == pos[k].dim() and pos[k].shape[1] != neg[k].shape[1]:
            lp, ln = pos[k].shape[1], neg[k].shape[1]
            n = math.lcm(lp, ln)
            if n // min(lp, ln) <= _COMFY_REPEAT_LIMIT:
                pos[k], neg[k] = _repeat_to(pos[k], n), _repeat_to(neg[k], n)
            else:
                m = max(lp, ln)
                pos[k], neg[k] = _pad_to(pos[k], m), _pad_to(neg[k], m)
                separate[k] = (ln, lp)
    return separate


def _pad_pair(pos: dict[str, torch.Tensor], neg: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Zero-pad a prompt's and its negative's sequence tensors to one length (a pipeline's shape check), returning
    ``{name: (negative length, prompt length)}`` so that each call is cut back to its own length."""
    out: dict[str, tuple[int, int]] = {}
    for k in list(pos):
        if k in neg and pos[k].dim() >= 3 and neg[k].dim() == pos[k].dim() and pos[k].shape[1] != neg[k].shape[1]:
            lp, ln = pos[k].shape[1], neg[k].shape[1]
            m = max(lp, ln)
            pos[k], neg[k] = _pad_to(pos[k], m), _pad_to(neg[k], m)
            out[k] = (ln, lp)
    return out


class _separate_passes:
    """While active, the denoiser runs the negative rows (the first half of a guidance batch) and the prompt rows
    (the second half) as two calls, each with its own sequence length: ComfyUI's separate passes for a prompt and
    a negative it cannot batch. Every batched tensor argument is split by rows."""

    def __init__(
        self,
        denoiser: torch.nn.Module,
        lengths: dict[str, tuple[int, int]],
        names: dict[str, str],
        by_tensor: dict[int, int] | None = None,
    ) -> None:
        self.denoiser, self.lengths, self.names = denoiser, lengths, names
        #: For pipelines that call the prompt and the negative separately: the padded tensor's data pointer -> its
        #: real length.
        self.by_tensor = dict(by_tensor or {})
        self.forward: Callable[..., Any] | None = None

    def __enter__(self) -> _separate_passes:
        if not self.lengths and not self.by_tensor:
            return self
        import torch

        orig = self.denoiser.forward
        cut = {self.names[k]: v for k, v in self.lengths.items() if k in self.names}

        def forward(*args: Any, **kwargs: Any) -> Any:
            ehs = kwargs.get("encoder_hidden_states")
            if ehs is None:
                return orig(*args, **kwargs)
            own = self.by_tensor.get(ehs.data_ptr())
            if own is not None:  # a pipeline that calls the prompt and the negative separately (Flux true CFG)
                def trim(v: Any, name: str) -> Any:
                    if name == "encoder_hidden_states":
                        return v[:, :own]
                    if name == "txt_ids" and isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == ehs.shape[1]:
                        return v[:own]
                    return v
                return orig(*args, **{k: trim(v, k) for k, v in kwargs.items()})
            if ehs.shape[0] % 2:
                return orig(*args, **kwargs)
            b = ehs.shape[0] // 2
            outs = []
            for half, rows in enumerate((slice(0, b), slice(b, 2 * b))):
                def take(v: object, name: str = "", rows: slice = rows, half: int = half) -> object:
                    if not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != 2 * b:
                        return v
                    v = v[rows]
                    return v[:, : cut[name][half]] if name in cut else v
                outs.append(orig(*[take(a) for a in args], **{k: take(v, k) for k, v in kwargs.items()}))
            first = outs[0][0] if isinstance(outs[0], tuple) else outs[0].sample
            second = outs[1][0] if isinstance(outs[1], tuple) else outs[1].sample
            return (torch.cat([first, second]),)

        self.forward = orig
        self.denoiser.forward = forward
        return self

    def __exit__(self, *exc: object) -> None:
        if self.forward is not None:
            del self.denoiser.forward  # the instance attribute; the class's forward is back


def encode_each(
    profile: AlignmentProfile,
    prompts: Sequence[str],
    pipe: DiffusionPipeline,
    *,
    options: EncodeOptions | None = None,
    negative: bool = False,
) -> dict[str, torch.Tensor]:
    """Each prompt encoded alone (its own padding and chunk count), then batched: sequence tensors are zero-padded to
    the longest (for comparisons only; sampling groups prompts by shape instead)."""
    import torch

    parts = [te_align.encode(profile, [p], pipeline=pipe, options=options, negative=negative) for p in prompts]
    out: dict[str, torch.Tensor] = {}
    for k in parts[0]:
        ts = [c[k] for c in parts]
        if ts[0].dim() >= 2 and any(t.shape != ts[0].shape for t in ts):
            n = max(t.shape[1] for t in ts)
            ts = [torch.nn.functional.pad(t, [0, 0] * (t.dim() - 2) + [0, n - t.shape[1]]) for t in ts]
        out[k] = torch.cat(ts) if ts[0].dim() >= 1 and k != "text_ids" else ts[0]
    return out


def sample_prompts(
    pipe: DiffusionPipeline,
    profile: AlignmentProfile,
    captions: Sequence[str],
    *,
    steps: int,
    guidance: float,
    size: int,
    seed: int = 0,
    batch: int = 16,
    options: EncodeOptions | None = None,
) -> list[np.ndarray]:
    """One uint8 HxWx3 image per caption (caption ``i`` from generator seed ``seed + i``), conditioned by ``profile``
    (and encode ``options``), classifier-free guidance against the profile's empty prompt. Where a prompt's
    conditioning depends on its batch (padding to the longest, chunking), each prompt is encoded alone and prompts
    of one shape are sampled together."""
    import numpy as np
    import torch

    accepted = _call_parameters(pipe)
    alone = _per_prompt(profile, options)
    if alone:
        conds = [dict(te_align.encode(profile, [c], pipeline=pipe, options=options)) for c in captions]
        # the empty prompt encodes the same for every caption: once, then a shallow copy each (matching replaces values)
        neg = dict(_encoding_core.encode_uncond(profile, 1, pipeline=pipe, options=options)) if guidance > 1 else {}
        negs = [dict(neg) for _ in captions]
        # Flux's true guidance runs the prompt and its negative as two calls: each keeps its own length
        separate = [_pad_pair(c, n) if "true_cfg_scale" in accepted else _match_lengths(c, n) for c, n in zip(conds, negs, strict=True)]
        groups: dict[tuple[tuple[str, tuple[int, ...]], ...], list[int]] = {}
        for i, c in enumerate(conds):
            groups.setdefault(tuple((k, tuple(v.shape)) for k, v in sorted(c.items())), []).append(i)
        order = [idx[j : j + batch] for idx in groups.values() for j in range(0, len(idx), batch)]
    else:
        order = [list(range(i, min(i + batch, len(captions)))) for i in range(0, len(captions), batch)]
    images: dict[int, np.ndarray] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for idx in order:
            if alone:
                cond = {k: torch.cat([conds[i][k] for i in idx]) if k != "text_ids" else conds[idx[0]][k] for k in conds[idx[0]]}
                neg = {k: torch.cat([negs[i][k] for i in idx]) if k != "text_ids" else negs[idx[0]][k] for k in negs[idx[0]]}
            else:
                chunk = [captions[i] for i in idx]
                cond = te_align.encode(profile, chunk, pipeline=pipe, options=options)
                neg = _encoding_core.encode_uncond(profile, len(chunk), pipeline=pipe, options=options) if guidance > 1 else {}
            kwargs: dict[str, Any] = _sampling.pipeline_kwargs(cond, neg if guidance > 1 else None, accepted)
            if "true_cfg_scale" in accepted:  # Flux: real classifier-free guidance against the negative
                kwargs["true_cfg_scale"] = guidance
            gens = [torch.Generator().manual_seed(seed + i) for i in idx]
            lengths = separate[idx[0]] if alone and guidance > 1 else {}
            denoiser = getattr(pipe, "transformer", None) or pipe.unet
            by_tensor = {}
            if lengths and "true_cfg_scale" in accepted:
                kwargs["negative_prompt_embeds"] = kwargs["negative_prompt_embeds"].contiguous()
                ln, lp = lengths["prompt_embeds"]
                by_tensor = {kwargs["negative_prompt_embeds"].data_ptr(): ln, kwargs["prompt_embeds"].data_ptr(): lp}
                lengths = {}
            with (
                _separate_passes(denoiser, lengths, {"prompt_embeds": "encoder_hidden_states"}, by_tensor),
                _sampling.masks_as_trained(pipe, profile),
            ):
                out = pipe(
                    **kwargs,
                    num_inference_steps=steps,
                    guidance_scale=guidance,
                    width=size,
                    height=size,
                    generator=gens,
                    output_type="np",
                ).images
            for i, im in zip(idx, out, strict=True):
                images[i] = np.clip(np.rint(im * 255), 0, 255).astype(np.uint8)
    return [images[i] for i in range(len(captions))]


def _call_parameters(pipe: DiffusionPipeline) -> set[str]:
    """The keyword parameters of the pipeline's ``__call__`` (through a wrapper that takes ``**kwargs``: the first
    class in the method resolution order that names its parameters)."""
    for cls in type(pipe).__mro__:
        fn = cls.__dict__.get("__call__")
        if fn is None:
            continue
        params = inspect.signature(fn).parameters
        named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"}
        if named:
            return named
    return set(inspect.signature(pipe.__call__).parameters)


def score_images(images: Sequence[np.ndarray], truths: Sequence[Sequence[_KeyObject]]) -> dict[str, float]:
    """Scores of ``images`` against answer-key objects ``[colour, shape, position, carries_concept]``."""
    rows = []
    concept_hits = concept_total = 0
    for img, objs in zip(images, truths, strict=True):
        keys = [tuple(o[:3]) for o in objs]
        pred = world.read_image(img)
        r = world.score_keys(keys, pred)
        rows.append(r)
        pairs = world.match(keys, pred)
        for t, p in pairs:
            if objs[t][3]:
                concept_hits += int(keys[t] == pred[p])
        concept_total += sum(1 for o in objs if o[3])
    objects = sum(r["objects"] for r in rows)
    exact = sum(r["exact"] for r in rows)
    out = {
        "images": float(len(rows)),
        "objects": float(objects),
        "object_accuracy": exact / objects if objects else float("nan"),
        "concept_objects": float(concept_total),
        "concept_accuracy": concept_hits / concept_total if concept_total else float("nan"),
        "image_accuracy": sum(r["image_exact"] for r in rows) / len(rows) if rows else float("nan"),
        "extra_per_image": sum(r["extra"] for r in rows) / len(rows) if rows else float("nan"),
    }
    for key in ("colour", "shape", "position"):
        out[key] = sum(r[key] * r["objects"] for r in rows) / objects if objects else float("nan")
    return out


def save_images(images: Sequence[np.ndarray], names: Sequence[str], folder: Path) -> list[Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for img, name in zip(images, names, strict=True):
        path = folder / f"{name}.png"
        Image.fromarray(img).save(path)
        files.append(path)
    return files


def read_probes(
    images: Sequence[np.ndarray], objects: Sequence[Sequence[_KeyObject]], *, concept_colour: str
) -> list[JSONObject]:
    """Per image, what the world's reader found against the one asked object ``[colour, shape, position, concept]``:
    ``hit`` (an object of the asked colour at the asked position), ``exact`` (colour, shape and position),
    ``concept_colour`` (any object read in the concept's colour), ``extra`` (objects read besides the asked one)
    and ``read`` (the readings)."""
    out = []
    for img, objs in zip(images, objects, strict=True):
        pred = world.read_image(img)
        colour, shape, position = (str(v) for v in objs[0][:3])
        out.append({
            "hit": any(p[0] == colour and p[2] == position for p in pred),
            "exact": (colour, shape, position) in pred,
            "concept_colour": any(p[0] == concept_colour for p in pred),
            "extra": max(0, len(pred) - 1),
            "read": [list(p) for p in pred],
        })
    return out
