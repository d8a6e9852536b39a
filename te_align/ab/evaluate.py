"""A/B evaluation: deterministic validation loss and conditioning divergence.

Validation loss follows the SD3 paper's (Esser et al. 2024, §5.1 "validation loss") recipe: every
held-out image is noised at a fixed set of timesteps with noise drawn once from a fixed seed, so
the same checkpoint always gives the same number and the two arms are scored on identical inputs.
Flow models (SD3, Flux, Chroma, SDXL-flow) use ``x_t = (1 - t) x0 + t n`` with target ``n - x0``; eps / v
models use the scheduler's ``add_noise`` at ``round(t * (T - 1))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align.ab.preset import ABError
from te_align.train.models import (
    Family,
    denoise,
    has_latent_batchnorm,
    latent_norm,
    latent_transform,
    patchify_normalize,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

DEFAULT_TIMESTEPS = tuple((i + 0.5) / 8 for i in range(8))


# ----------------------------------------------------------------------------------- divergence
@dataclass
class Divergence:
    tensor: str
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    max_abs_diff: float
    cosine: float
    prompts_differing: int
    prompts: int


def conditioning_divergence(
    cond_a: Mapping[str, torch.Tensor], cond_b: Mapping[str, torch.Tensor]
) -> list[Divergence]:
    """Per output tensor: max abs difference and mean per-prompt cosine similarity.

    Tensors of different shapes (e.g. T5 154 vs 256 tokens) are zero-padded to the larger shape first,
    so the missing positions count as differences.
    """
    import torch

    out = []
    for name in sorted(set(cond_a) & set(cond_b)):
        a, b = cond_a[name].float().cpu(), cond_b[name].float().cpu()
        sa, sb = tuple(a.shape), tuple(b.shape)
        if a.dim() != b.dim():
            continue
        shape = [max(x, y) for x, y in zip(sa, sb, strict=True)]
        pa, pb = torch.zeros(shape), torch.zeros(shape)
        pa[tuple(slice(0, n) for n in sa)] = a
        pb[tuple(slice(0, n) for n in sb)] = b
        diff = (pa - pb).abs()
        batched = name != "text_ids" and pa.dim() >= 2
        if batched:
            fa, fb = pa.reshape(shape[0], -1), pb.reshape(shape[0], -1)
            cos = torch.nn.functional.cosine_similarity(fa, fb, dim=1, eps=1e-12)
            same = (fa == fb).all(dim=1) & (fa.norm(dim=1) == fb.norm(dim=1))
            cos = torch.where(same, torch.ones_like(cos), cos)
            differing = int((diff.reshape(shape[0], -1).amax(dim=1) > 0).sum())
            n = shape[0]
        else:
            fa, fb = pa.reshape(1, -1), pb.reshape(1, -1)
            cos = torch.ones(1) if torch.equal(fa, fb) else torch.nn.functional.cosine_similarity(fa, fb, dim=1, eps=1e-12)
            differing, n = int(diff.max() > 0), 1
        out.append(Divergence(name, sa, sb, float(diff.max()) if diff.numel() else 0.0, float(cos.mean()), differing, n))
    return out


# ----------------------------------------------------------------------------------- validation
def load_val_latents(pipe: DiffusionPipeline, files: Sequence[Path], resolution: int) -> torch.Tensor:
    """(N, C, h, w) scaled latents (distribution mean) of square centre crops of the validation images (FLUX.2:
    patchified and normalised, (N, 4C, h/2, w/2))."""
    import numpy as np
    import torch
    from PIL import Image

    xs = []
    for f in files:
        with Image.open(f) as im:
            im = im.convert("RGB")
            s = resolution / min(im.size)
            im = im.resize((max(resolution, round(im.size[0] * s)), max(resolution, round(im.size[1] * s))), Image.BICUBIC)
            left, top = (im.size[0] - resolution) // 2, (im.size[1] - resolution) // 2
            im = im.crop((left, top, left + resolution, top + resolution))
            xs.append(torch.from_numpy(np.asarray(im, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1))
    vae: Any = pipe.vae  # type: ignore[attr-defined]  # every diffusers pipeline the A/B trains has one
    shift, scaling = latent_transform(vae)
    with torch.no_grad():
        mean = vae.encode(torch.stack(xs).to(vae.dtype)).latent_dist.mean.float()
    if has_latent_batchnorm(vae):  # FLUX.2: patchified and normalised, as the training latents
        return patchify_normalize(latent_norm(vae), mean)[0]
    return (mean - shift) * scaling


def fixed_noise(latents: torch.Tensor, n_timesteps: int, seed: int) -> torch.Tensor:
    """(N, T, C, h, w) noise: validation image i always gets the draws of generator ``seed + i``."""
    import torch

    return torch.stack(
        [
            torch.randn((n_timesteps, *latents.shape[1:]), generator=torch.Generator().manual_seed(seed + i))
            for i in range(latents.shape[0])
        ]
    )


def resolve_objective(family: Family, pipe: DiffusionPipeline, configured: str) -> str:
    if family.flow_native:
        return "flow"
    if configured in ("eps", "v", "flow"):
        return configured
    pred = getattr(pipe.scheduler, "config", {}).get("prediction_type", "epsilon")
    return "v" if pred == "v_prediction" else "eps"


def validation_loss(
    *,
    family: Family,
    denoiser: torch.nn.Module,
    latents: torch.Tensor,
    noise: torch.Tensor,
    timesteps: Sequence[float],
    cond: Mapping[str, torch.Tensor] | list[Mapping[str, torch.Tensor]],
    objective: str,
    scheduler_config: Mapping[str, object] | None = None,
    guidance: float = 1.0,
    flow_shift_scale: float = 1000.0,
    pixel_size: int = 0,
    denoiser_mask: bool = True,
) -> float:
    """Mean MSE over validation images x fixed timesteps (deterministic; no gradients). ``cond``: the images'
    conditioning as one batch, or a list of one conditioning per image (prompts encoded one at a time).
    ``denoiser_mask``: the text attention mask goes to a denoiser that takes one (chroma), as in training
    with the conditioning's profile (:func:`te_align.train.models.denoiser_mask_on`)."""
    import torch

    tt = torch.tensor(list(timesteps), dtype=torch.float32)
    k = len(tt)
    n = latents.shape[0]
    sched = None
    if objective in ("eps", "v"):
        from diffusers import DDPMScheduler

        sched = DDPMScheduler.from_config(scheduler_config)
        steps = torch.round(tt * (sched.config.num_train_timesteps - 1)).long()
    total = 0.0
    with torch.no_grad():
        for i in range(n):
            x0 = latents[i : i + 1].expand(k, *latents.shape[1:])
            nz = noise[i]
            c = {}
            one = cond[i] if isinstance(cond, list) else cond  # a list: each image's own conditioning (batch of 1)
            rows = 1 if isinstance(cond, list) else n
            for name, v in one.items():
                batched = name != "text_ids" and v.dim() >= 1 and v.shape[0] == rows
                j = 0 if isinstance(cond, list) else i
                c[name] = v[j : j + 1].expand(k, *v.shape[1:]) if batched else v
            time_ids = None
            if family.name == "sdxl":
                px = pixel_size or latents.shape[-1] * 8
                time_ids = torch.tensor([[px, px, 0, 0, px, px]] * k, dtype=torch.float32)
            if objective == "flow":
                s = tt.view(k, 1, 1, 1)
                noisy = (1.0 - s) * x0 + s * nz
                target = nz - x0
                ts = tt * flow_shift_scale
            else:
                noisy = sched.add_noise(x0, nz, steps)
                target = nz if objective == "eps" else sched.get_velocity(x0, nz, steps)
                ts = steps
            pred = denoise(family, denoiser, noisy, ts, c, time_ids=time_ids, guidance=guidance, denoiser_mask=denoiser_mask)
            total += float(torch.nn.functional.mse_loss(pred.float(), target.float()))
    value = total / max(n, 1)
    if not math.isfinite(value):
        raise ABError(f"validation loss is {value}")
    return value


__all__ = [
    "DEFAULT_TIMESTEPS",
    "Divergence",
    "conditioning_divergence",
    "fixed_noise",
    "load_val_latents",
    "resolve_objective",
    "validation_loss",
]
