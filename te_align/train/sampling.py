"""Sample images during training with the run's profile and fixed seeds.

Prompts are encoded by ``te_align.encode`` (negatives by the profile's negative template, or the
profile's empty prompt when no negative prompt is set) and handed to the diffusers pipeline as
``prompt_embeds`` & co, so samples see exactly the conditioning the LoRA trains on.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING

import te_align
from te_align.encoding import encode_uncond
from te_align.train.config import SampleConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

    from te_align.profiles.model import AlignmentProfile


def sample_images(
    pipe: DiffusionPipeline,
    profile: AlignmentProfile,
    cfg: SampleConfig,
    out_dir: Path,
    step: int,
    *,
    size: tuple[int, int],
    device: torch.device,
    dtype: torch.dtype,
) -> list[Path]:
    """Render every (prompt, seed) pair into ``out_dir/step-NNNNNNNN/``; returns the files."""
    import torch

    if not cfg.prompts:
        return []
    accepted = set(inspect.signature(pipe.__call__).parameters)
    width = cfg.width or size[0]
    height = cfg.height or size[1]
    folder = out_dir / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]), torch.no_grad():
        for i, prompt in enumerate(cfg.prompts):
            cond = te_align.encode(profile, [prompt], pipeline=pipe, device=device, dtype=dtype)
            if cfg.negative_prompt:
                neg = te_align.encode(profile, [cfg.negative_prompt], pipeline=pipe, device=device, dtype=dtype, negative=True)
            else:
                neg = encode_uncond(profile, 1, pipeline=pipe, device=device, dtype=dtype)
            kwargs: dict[str, object] = {k: v for k, v in cond.items() if k in accepted}
            kwargs.update({f"negative_{k}": v for k, v in neg.items() if f"negative_{k}" in accepted and cfg.guidance_scale > 1})
            for seed in cfg.seeds:
                gen = torch.Generator(device="cpu").manual_seed(int(seed))
                image = pipe(
                    **kwargs,
                    num_inference_steps=cfg.steps,
                    guidance_scale=cfg.guidance_scale,
                    width=width,
                    height=height,
                    generator=gen,
                    output_type="pil",
                ).images[0]
                path = folder / f"{i:02d}-seed{seed}.png"
                image.save(path)
                files.append(path)
    (folder / "prompts.txt").write_text("\n".join(cfg.prompts) + "\n", encoding="utf-8")
    return files


__all__ = ["sample_images"]
