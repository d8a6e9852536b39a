"""Sample images during training with the run's profile and fixed seeds.

Prompts are encoded by ``te_align.encode`` (negatives by the profile's negative template, or the
profile's empty prompt when no negative prompt is set) and handed to the diffusers pipeline as
``prompt_embeds`` & co, so samples see exactly the conditioning the LoRA trains on. A profile that
gives the denoiser no text mask (chroma with ``t5.masks.denoiser = false``) is sampled without one
too (:func:`masks_as_trained`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import te_align
from te_align.encoding import encode_uncond
from te_align.train.config import SampleConfig
from te_align.train.models import FAMILIES, denoiser_mask_on

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

    from te_align.profiles.model import AlignmentProfile


@contextlib.contextmanager
def masks_as_trained(pipe: DiffusionPipeline, profile: AlignmentProfile) -> Iterator[None]:
    """While active, the pipeline's denoiser is called without a text attention mask when the profile gives
    it none (:func:`te_align.train.models.denoiser_mask_on`), as training calls it.

    ``ChromaPipeline`` refuses ``prompt_embeds`` without ``prompt_attention_mask`` (diffusers 0.42.1
    pipelines/chroma/pipeline_chroma.py:460-465) and always hands the transformer the mask it was given
    (:787-798, 858-881), so the mask is passed to the pipeline (:func:`pipeline_kwargs`) and dropped at the
    transformer's call by a forward pre-hook. Nothing changes for a profile that gives the mask, or for a
    family whose denoiser takes none.
    """
    fam = FAMILIES.get(profile.family)
    model = getattr(pipe, fam.denoiser_attr, None) if fam is not None else None
    if fam is None or fam.mask_arg is None or model is None or denoiser_mask_on(profile):
        yield
        return
    arg = fam.mask_arg

    def drop(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, {**kwargs, arg: None}

    # first among the pre-hooks: every other hook and the model itself see the call without the mask
    handle = model.register_forward_pre_hook(drop, with_kwargs=True, prepend=True)
    try:
        yield
    finally:
        handle.remove()


def pipeline_kwargs(
    cond: Mapping[str, torch.Tensor], neg: Mapping[str, torch.Tensor] | None, accepted: set[str]
) -> dict[str, Any]:
    """The pipeline keywords of a conditioning and its negative (``neg``; None: no guidance) that ``accepted``
    names. A pipeline that requires a prompt mask with ``prompt_embeds`` (``ChromaPipeline``) gets an all-ones
    one where the profile has no mask output: :func:`masks_as_trained` keeps it from the denoiser."""
    import torch

    kwargs: dict[str, Any] = {k: v for k, v in cond.items() if k in accepted}
    if neg is not None:
        kwargs.update({f"negative_{k}": v for k, v in neg.items() if f"negative_{k}" in accepted})
    for prefix in ("", "negative_"):
        emb, mask = f"{prefix}prompt_embeds", f"{prefix}prompt_attention_mask"
        if emb in kwargs and mask in accepted and mask not in kwargs:
            kwargs[mask] = torch.ones(kwargs[emb].shape[:2], dtype=kwargs[emb].dtype, device=kwargs[emb].device)
    return kwargs


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
            kwargs = pipeline_kwargs(cond, neg if cfg.guidance_scale > 1 else None, accepted)
            for seed in cfg.seeds:
                gen = torch.Generator(device="cpu").manual_seed(int(seed))
                with masks_as_trained(pipe, profile):
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


__all__ = ["masks_as_trained", "pipeline_kwargs", "sample_images"]
