"""Denoiser and VAE configs of the real base models the bundled presets name, for ``te-align train --estimate``
on a hub id without downloading it (the text-encoder configs come from the bundled official snapshot JSONs in
``te_align/profiles/data/official``). Built on the meta device they give the published parameter counts
(tests/train/test_train_scale.py checks them).

Sources: the ``transformer/config.json`` / ``unet/config.json`` / ``vae/config.json`` of each hub repo as
diffusers' own conversion scripts and single-file loader write them (diffusers
``src/diffusers/loaders/single_file_utils.py`` ``DIFFUSERS_DEFAULT_PIPELINE_PATHS`` names these repos). The live
hub files could not be read from this build machine, so no hub commit is pinned here; fields a class has a
default for (and that the hub file repeats) are left out.
"""

from __future__ import annotations

from te_align._types import JSONObject

_VAE_16 = {"in_channels": 3, "out_channels": 3, "latent_channels": 16, "block_out_channels": [128, 256, 512, 512],
           "layers_per_block": 2, "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
           "norm_num_groups": 32, "sample_size": 1024, "use_quant_conv": False, "use_post_quant_conv": False}  # fmt: skip

#: repo id -> component attribute -> (diffusers class name, config)
REAL_CONFIGS: dict[str, dict[str, tuple[str, JSONObject]]] = {
    "black-forest-labs/FLUX.1-dev": {
        "transformer": (
            "FluxTransformer2DModel",
            {
                "patch_size": 1,
                "in_channels": 64,
                "num_layers": 19,
                "num_single_layers": 38,
                "attention_head_dim": 128,
                "num_attention_heads": 24,
                "joint_attention_dim": 4096,
                "pooled_projection_dim": 768,
                "guidance_embeds": True,
                "axes_dims_rope": [16, 56, 56],
            },
        ),
        "vae": ("AutoencoderKL", dict(_VAE_16, scaling_factor=0.3611, shift_factor=0.1159)),
    },
    "stabilityai/stable-diffusion-3.5-large": {
        "transformer": (
            "SD3Transformer2DModel",
            {
                "sample_size": 128,
                "patch_size": 2,
                "in_channels": 16,
                "num_layers": 38,
                "attention_head_dim": 64,
                "num_attention_heads": 38,
                "joint_attention_dim": 4096,
                "caption_projection_dim": 2432,
                "pooled_projection_dim": 2048,
                "out_channels": 16,
                "pos_embed_max_size": 192,
                "qk_norm": "rms_norm",
            },
        ),
        "vae": ("AutoencoderKL", dict(_VAE_16, scaling_factor=1.5305, shift_factor=0.0609)),
    },
    "stabilityai/stable-diffusion-xl-base-1.0": {
        "unet": (
            "UNet2DConditionModel",
            {
                "sample_size": 128,
                "in_channels": 4,
                "out_channels": 4,
                "layers_per_block": 2,
                "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                "block_out_channels": [320, 640, 1280],
                "attention_head_dim": [5, 10, 20],
                "cross_attention_dim": 2048,
                "transformer_layers_per_block": [1, 2, 10],
                "addition_embed_type": "text_time",
                "addition_time_embed_dim": 256,
                "projection_class_embeddings_input_dim": 2816,
                "use_linear_projection": True,
            },
        ),
        "vae": (
            "AutoencoderKL",
            {
                "in_channels": 3,
                "out_channels": 3,
                "latent_channels": 4,
                "block_out_channels": [128, 256, 512, 512],
                "layers_per_block": 2,
                "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4,
                "norm_num_groups": 32,
                "sample_size": 1024,
                "scaling_factor": 0.13025,
                "force_upcast": True,
            },
        ),
    },
}
REAL_CONFIGS["black-forest-labs/FLUX.1-schnell"] = {
    "transformer": ("FluxTransformer2DModel", dict(REAL_CONFIGS["black-forest-labs/FLUX.1-dev"]["transformer"][1], guidance_embeds=False)),
    "vae": REAL_CONFIGS["black-forest-labs/FLUX.1-dev"]["vae"],
}

#: transformers class of a text encoder by the architecture its config names
TEXT_ENCODER_CLASSES = {"clip_text_model": "CLIPTextModel", "t5": "T5EncoderModel"}


def official_components(repo: str) -> dict[str, JSONObject]:
    """Text-encoder configs (``text_encoder*``: plain values) from the bundled official snapshot of ``repo``."""
    import json
    from importlib import resources

    name = repo.replace("/", "--") + ".json"
    ref = resources.files("te_align.profiles") / "data" / "official" / name
    if not ref.is_file():
        return {}
    data = json.loads(ref.read_text(encoding="utf-8"))
    out: dict[str, JSONObject] = {}
    for attr, fields in data.get("components", {}).items():
        if not attr.startswith("text_encoder"):
            continue
        out[attr] = {k: (v.get("value") if isinstance(v, dict) and "value" in v else v) for k, v in fields.items()}
    return out


__all__ = ["REAL_CONFIGS", "TEXT_ENCODER_CLASSES", "official_components"]
