"""Tiny diffusers model folders (denoiser + VAE + the tiny text encoders) and image datasets for trainer tests.

``build_model_folder(family, path)`` saves a real diffusers pipeline (``save_pretrained``) with tiny
random-weight components, so the trainer exercises the real loading path. ``profile_overrides``
gives the te-align overrides that fit a bundled profile to the tiny encoders (hidden sizes, token
ids), as a user would for a custom model.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import diffusers
import torch

from .adapt import architecture_overrides
from .encoders import CLIP_VARIANTS, T5_D_MODEL, family_components

#: Family -> bundled profile the tests train with.
PROFILES = {"sd15": "sd15", "sdxl": "sdxl", "sd3": "sd35-large", "flux": "flux-dev", "flux-schnell": "flux-schnell"}


def _seeded(name: str) -> Any:
    fork = torch.random.fork_rng(devices=[])
    fork.__enter__()
    torch.manual_seed(zlib.crc32(name.encode()))
    return fork


def tiny_vae(latent_channels: int = 4, flow: bool = False) -> diffusers.AutoencoderKL:
    fork = _seeded(f"vae{latent_channels}{flow}")
    try:
        extra: dict[str, Any] = {}
        if flow:
            extra = {"shift_factor": 0.1159, "scaling_factor": 0.3611, "use_quant_conv": False, "use_post_quant_conv": False}
        return diffusers.AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
            block_out_channels=[8, 16], layers_per_block=1, latent_channels=latent_channels, norm_num_groups=8, sample_size=32,
            **extra,
        ).eval()  # fmt: skip
    finally:
        fork.__exit__(None, None, None)


def tiny_unet(xl: bool = False) -> diffusers.UNet2DConditionModel:
    fork = _seeded(f"unet{xl}")
    try:
        kw: dict[str, Any] = {"cross_attention_dim": CLIP_VARIANTS["L"]["hidden_size"]}
        if xl:
            pooled = CLIP_VARIANTS["G"]["projection_dim"]
            kw = {
                "cross_attention_dim": CLIP_VARIANTS["L"]["hidden_size"] + CLIP_VARIANTS["G"]["hidden_size"],
                "addition_embed_type": "text_time",
                "addition_time_embed_dim": 8,
                "projection_class_embeddings_input_dim": 8 * 6 + pooled,
            }
        return diffusers.UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            attention_head_dim=4, norm_num_groups=8, **kw,
        )  # fmt: skip
    finally:
        fork.__exit__(None, None, None)


def tiny_sd3_transformer() -> diffusers.SD3Transformer2DModel:
    fork = _seeded("sd3")
    try:
        return diffusers.SD3Transformer2DModel(
            sample_size=16, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
            joint_attention_dim=T5_D_MODEL, caption_projection_dim=16,
            pooled_projection_dim=CLIP_VARIANTS["L"]["projection_dim"] + CLIP_VARIANTS["G"]["projection_dim"],
            out_channels=4, pos_embed_max_size=32,
        )  # fmt: skip
    finally:
        fork.__exit__(None, None, None)


def tiny_flux_transformer(guidance: bool = True) -> diffusers.FluxTransformer2DModel:
    fork = _seeded(f"flux{guidance}")
    try:
        return diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
            joint_attention_dim=T5_D_MODEL, pooled_projection_dim=CLIP_VARIANTS["L"]["hidden_size"], guidance_embeds=guidance,
            axes_dims_rope=(2, 2, 4),
        )  # fmt: skip
    finally:
        fork.__exit__(None, None, None)


def build_pipeline(family: str) -> Any:
    """A real diffusers pipeline of ``family`` (sd15, sdxl, sd3, flux, flux-schnell) with tiny components."""
    if family == "sd15":
        return diffusers.StableDiffusionPipeline(
            vae=tiny_vae(), unet=tiny_unet(), scheduler=diffusers.DDPMScheduler(steps_offset=1, clip_sample=False), safety_checker=None,
            feature_extractor=None, requires_safety_checker=False, **family_components("sd15"),
        )  # fmt: skip
    if family == "sdxl":
        return diffusers.StableDiffusionXLPipeline(
            vae=tiny_vae(), unet=tiny_unet(xl=True), scheduler=diffusers.EulerDiscreteScheduler(), add_watermarker=False,
            **family_components("sdxl"),
        )  # fmt: skip
    if family == "sd3":
        return diffusers.StableDiffusion3Pipeline(
            transformer=tiny_sd3_transformer(), vae=tiny_vae(flow=True), scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0),
            **family_components("sd3"),
        )  # fmt: skip
    if family in ("flux", "flux-schnell"):
        dev = family == "flux"
        sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=dev, base_image_seq_len=16,
                                                          max_image_seq_len=256, base_shift=0.5, max_shift=1.15)  # fmt: skip
        # in_channels 16 = 4 latent channels x 2x2 packing
        return diffusers.FluxPipeline(
            transformer=tiny_flux_transformer(guidance=dev), vae=tiny_vae(flow=True), scheduler=sched,
            **family_components("flux"),
        )  # fmt: skip
    raise ValueError(family)


def build_model_folder(family: str, path: Path) -> Path:
    """Save the tiny pipeline of ``family`` as a diffusers folder at ``path``."""
    pipe = build_pipeline(family)
    pipe.save_pretrained(str(path), safe_serialization=True)
    return path


def profile_overrides(family: str) -> dict[str, Any]:
    """Overrides that fit the bundled profile of ``family`` to the tiny encoders."""
    import te_align

    return architecture_overrides(te_align.profile(PROFILES[family]), family_components("flux" if family.startswith("flux") else family))


def make_dataset(path: Path, n: int = 6, sizes: tuple[tuple[int, int], ...] = ((32, 32), (48, 32), (32, 48)), seed: int = 0) -> Path:
    """Synthetic images with captions: a coloured square whose colour the caption names."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    colours = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
    path.mkdir(parents=True, exist_ok=True)
    names = list(colours)
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        c = names[i % len(names)]
        arr = np.full((h, w, 3), 235, dtype=np.uint8)
        arr[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4] = colours[c]
        arr = np.clip(arr.astype(int) + rng.integers(-8, 8, arr.shape), 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(path / f"img{i:02d}.png")
        (path / f"img{i:02d}.txt").write_text(f"a {c} square, simple, flat", encoding="utf-8")
    return path
