"""A tiny random klein world base written into a temporary world data root, as ``tools/ship_base.py`` lays bases out
(the shipped klein base does not exist yet): the tests of te-align's own FLUX.2 [klein] trainer and of the klein rows'
pairing train on it. Callers skip first on an old diffusers (``missing_pipeline("flux2-klein")``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: The tiny base's latent statistics: drawn from these random images, so that normalising is not the identity.
_STAT_IMAGES = 8


def write_klein_world(root: Path) -> tuple[Path, dict[str, Any]]:
    """A world data root at ``root`` holding a ``klein`` base (random weights, the shared world autoencoder's shape,
    BatchNorm statistics of random images); returns (root, its base.json). Needs torch and diffusers >= 0.37."""
    import diffusers
    import torch

    from te_align.tiny import bases, klein

    if (root / "klein" / bases.MANIFEST).is_file():
        return root, bases.base_info("klein", root)
    pipe = klein.build_klein_pipeline()
    shared = diffusers.AutoencoderKL(
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[16, 32],
        layers_per_block=1, latent_channels=8, norm_num_groups=8, sample_size=32, use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()
    shared.save_pretrained(str(root / "vae"))
    pipe.text_encoder.save_pretrained(str(root / "encoders" / "qwen3_klein"))
    pipe.transformer.save_pretrained(str(root / "klein" / "transformer"))
    pipe.scheduler.save_pretrained(str(root / "klein" / "scheduler"))
    vae = klein.klein_vae(shared)
    images = torch.rand(_STAT_IMAGES, 3, 32, 32, generator=torch.Generator().manual_seed(7)) * 2 - 1
    klein.set_latent_statistics(vae, images)
    files = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}
    overrides = {k: v for k, v in klein.klein_profile(pipe).behaviour().items()
                 if k.endswith(("hidden_size", "num_layers", "vocab_size", "max_position_embeddings"))}  # fmt: skip
    info = {"format": bases.FORMAT, "name": "klein", "profile": klein.KLEIN_PROFILE, "denoiser_class": "Flux2Transformer2DModel",
            "files": files, "pretrain": {"vae_bn": {"mean": vae.bn.running_mean.tolist(), "var": vae.bn.running_var.tolist()}},
            "profile_overrides": {**overrides, "slots.qwen3.encoder.dtype": "float32"},
            "sampling": {"num_inference_steps": 2, "guidance_scale": 4.0, "height": 32, "width": 32}}  # fmt: skip
    (root / "klein" / bases.MANIFEST).write_text(json.dumps(info), encoding="utf-8")
    return root, info
