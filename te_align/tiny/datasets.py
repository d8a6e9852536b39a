"""The demo's tiny SD3-shaped model and its synthetic dataset (offline, CPU, seconds).

:func:`build_tiny_sd3` saves a real ``StableDiffusion3Pipeline`` folder (``save_pretrained``) whose
text side is te-align's tiny random-weight encoders with real-convention tokenizers
(:func:`te_align.probe.tiny.family_components`: CLIP-L, CLIP-G with the real CLIP BPE vocabulary and
pad "!", T5 with a SentencePiece vocabulary of the real layout), plus a tiny SD3 transformer and VAE.
:func:`tiny_profile_overrides` fits the bundled ``sd35-large`` profile to those encoders (hidden sizes,
layer counts, token ids) without touching a behaviour field. :func:`make_shapes_dataset` draws coloured
shapes with captions that name colour, shape and position.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

PROFILE = "sd35-large"

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (235, 200, 40),
}  # fmt: skip
SHAPES = ("square", "circle", "triangle")


def _seeded(name: str) -> Any:
    import torch

    fork = torch.random.fork_rng(devices=[])
    fork.__enter__()
    torch.manual_seed(zlib.crc32(name.encode()))
    return fork


def build_tiny_sd3_pipeline() -> Any:
    """A ``StableDiffusion3Pipeline`` with tiny random weights (deterministic) and real-convention tokenizers."""
    import diffusers

    from te_align.probe.tiny import CLIP_VARIANTS, T5_D_MODEL, family_components

    fork = _seeded("te-align-demo-sd3")
    try:
        transformer = diffusers.SD3Transformer2DModel(
            sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=T5_D_MODEL, caption_projection_dim=32,
            pooled_projection_dim=CLIP_VARIANTS["L"]["projection_dim"] + CLIP_VARIANTS["G"]["projection_dim"],
            out_channels=4, pos_embed_max_size=32,
        )  # fmt: skip
        vae = diffusers.AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
            block_out_channels=[8, 16], layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=32,
            shift_factor=0.1159, scaling_factor=0.3611, use_quant_conv=False, use_post_quant_conv=False,
        ).eval()  # fmt: skip
    finally:
        fork.__exit__(None, None, None)
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0), **family_components("sd3"),
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_sd3(path: str | Path) -> Path:
    """Save the tiny SD3 pipeline as a diffusers folder at ``path`` (skipped when a complete one is there)."""
    folder = Path(path)
    if (folder / "model_index.json").is_file() and (folder / "transformer").is_dir():
        return folder
    build_tiny_sd3_pipeline().save_pretrained(str(folder), safe_serialization=True)
    return folder


def tiny_profile_overrides(model: str | Path) -> dict[str, Any]:
    """Overrides that fit the bundled sd35-large profile to the tiny model's encoders (architecture numbers only)."""
    import diffusers

    import te_align
    from te_align.probe.tiny import architecture_overrides

    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(str(model), transformer=None, vae=None)
    return architecture_overrides(te_align.profile(PROFILE), pipe)


def _draw(shape: str, colour: tuple[int, int, int], size: int, rng: Any) -> Any:
    import numpy as np
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (245, 245, 240))
    d = ImageDraw.Draw(img)
    r = int(rng.integers(size // 5, size // 3))
    cx, cy = (int(v) for v in rng.integers(r, size - r, 2))
    box = [cx - r, cy - r, cx + r, cy + r]
    if shape == "square":
        d.rectangle(box, fill=colour)
    elif shape == "circle":
        d.ellipse(box, fill=colour)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    arr = np.asarray(img).astype(int) + rng.integers(-6, 7, (size, size, 3))
    where = ("top" if cy < size / 3 else "bottom" if cy > 2 * size / 3 else "middle") + (
        " left" if cx < size / 3 else " right" if cx > 2 * size / 3 else "")  # fmt: skip
    return Image.fromarray(np.clip(arr, 0, 255).astype("uint8")), where


def make_shapes_dataset(root: str | Path, *, size: int = 32, train_per_combo: int = 1, val: int = 6, seed: int = 0) -> tuple[Path, Path]:
    """``root/train`` and ``root/val``: PNGs of a coloured shape with a ``.txt`` caption each; returns both folders."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = Path(root)
    train_dir, val_dir = out / "train", out / "val"
    combos = [(c, s) for c in COLOURS for s in SHAPES]
    jobs = [(train_dir, f"{c}-{s}-{k}", c, s) for k in range(train_per_combo) for c, s in combos]
    picks = rng.permutation(len(combos))[:val]
    jobs += [(val_dir, f"val-{i}-{combos[j][0]}-{combos[j][1]}", combos[j][0], combos[j][1]) for i, j in enumerate(picks)]
    for folder, name, colour, shape in jobs:
        folder.mkdir(parents=True, exist_ok=True)
        img, where = _draw(shape, COLOURS[colour], size, rng)
        img.save(folder / f"{name}.png")
        (folder / f"{name}.txt").write_text(f"a {colour} {shape} in the {where} of a plain white background", encoding="utf-8")
    return train_dir, val_dir


__all__ = ["PROFILE", "build_tiny_sd3", "build_tiny_sd3_pipeline", "make_shapes_dataset", "tiny_profile_overrides"]
