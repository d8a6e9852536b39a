"""Real diffusers pipelines around the tiny text encoders, with tiny denoisers and VAEs where needed.

Three kinds, all deterministic (fixed seeds, the caller's RNG untouched):

* :func:`build_pipeline_for_encoding` (``te-align probe``, the parity tests): the real pipeline class of a
  family with the tiny tokenizers and encoders of :func:`te_align.tiny.encoders.family_components`, ready
  for ``encode_prompt``. Non-text components are ``None`` (no pipeline's ``__init__`` or ``encode_prompt``
  needs them), except SD3, which gets a tiny real ``SD3Transformer2DModel`` (:func:`sd3_transformer`)
  because ``encode_prompt`` reads ``transformer.config.joint_attention_dim`` when ``text_encoder_3`` is
  dropped.
* :func:`build_pipeline` / :func:`build_model_folder` (``te-align train`` and A/B runs on tiny models):
  complete sd15, sdxl, sd3, flux, flux-schnell and chroma pipelines (tiny UNet or transformer, tiny VAE, a real
  scheduler) that can be trained and sampled; ``build_model_folder`` saves one with ``save_pretrained``
  so the trainer exercises the real loading path.
* :func:`build_tiny_sd3_pipeline` / :func:`build_tiny_sd3` (``te-align ab run tiny-demo``, the test suite): the
  tiny-demo preset's random SD3-shaped model, a little wider than the training one (``te-align demo`` runs the
  shipped Flux-shaped world base instead, :mod:`te_align.ab.demo`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import diffusers

from te_align.tiny import tokenizers as tok
from te_align.tiny._seed import finish, seed_for, seeded
from te_align.tiny.encoders import (
    CLIP_VARIANTS,
    FAMILIES,
    MODULAR_FAMILIES,
    PIPELINE_CLASSES,
    T5_D_MODEL,
    family_components,
)

if TYPE_CHECKING:  # pragma: no cover
    # the class itself: type checkers resolve diffusers' lazy top-level names to its dummy (torch-less) objects
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline

__all__ = [
    "PIPELINE_SINCE",
    "PipelineUnavailable",
    "build_model_folder",
    "build_pipeline",
    "build_pipeline_for_encoding",
    "build_tiny_sd3",
    "build_tiny_sd3_pipeline",
    "missing_pipeline",
    "sd3_transformer",
    "tiny_chroma_transformer",
    "tiny_flux_transformer",
    "tiny_sd3_transformer",
    "tiny_unet",
    "tiny_vae",
]


# --------------------------------------------------------------------------------------------------
# tiny denoisers and VAEs
# --------------------------------------------------------------------------------------------------


def _vae_config(latent_channels: int = 4, flow: bool = False) -> dict[str, Any]:
    """A two-level ``AutoencoderKL`` (8x downsampling halved to 4x), with the SD3/Flux scaling when ``flow``."""
    config: dict[str, Any] = {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ["DownEncoderBlock2D"] * 2,
        "up_block_types": ["UpDecoderBlock2D"] * 2,
        "block_out_channels": [8, 16],
        "layers_per_block": 1,
        "latent_channels": latent_channels,
        "norm_num_groups": 8,
        "sample_size": 32,
    }
    if flow:
        config.update(shift_factor=0.1159, scaling_factor=0.3611, use_quant_conv=False, use_post_quant_conv=False)
    return config


def _sd3_config(**changes: Any) -> dict[str, Any]:
    """A one-layer ``SD3Transformer2DModel`` reading the tiny T5 width and both tiny CLIP projections."""
    config: dict[str, Any] = {
        "sample_size": 16,
        "patch_size": 2,
        "in_channels": 4,
        "num_layers": 1,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": T5_D_MODEL,
        "caption_projection_dim": 16,
        "pooled_projection_dim": CLIP_VARIANTS["L"]["projection_dim"] + CLIP_VARIANTS["G"]["projection_dim"],
        "out_channels": 4,
        "pos_embed_max_size": 32,
    }
    config.update(changes)
    return config


def tiny_vae(latent_channels: int = 4, flow: bool = False) -> diffusers.AutoencoderKL:
    """Tiny ``AutoencoderKL`` in eval mode; ``flow`` gives it SD3/Flux's shift and scaling factors."""
    with seeded(seed_for(f"vae{latent_channels}{flow}")):
        return diffusers.AutoencoderKL(**_vae_config(latent_channels, flow)).eval()


def tiny_unet(xl: bool = False) -> diffusers.UNet2DConditionModel:
    """Tiny ``UNet2DConditionModel`` attending to CLIP-L (SD 1.5) or CLIP-L + CLIP-G with SDXL's time ids (``xl``)."""
    with seeded(seed_for(f"unet{xl}")):
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
            sample_size=16,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(16, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            attention_head_dim=4,
            norm_num_groups=8,
            **kw,
        )


def tiny_sd3_transformer() -> diffusers.SD3Transformer2DModel:
    """Tiny trainable ``SD3Transformer2DModel`` (one joint block)."""
    with seeded(seed_for("sd3")):
        return diffusers.SD3Transformer2DModel(**_sd3_config())


def sd3_transformer(joint_attention_dim: int = T5_D_MODEL, pooled_projection_dim: int | None = None) -> Any:
    """Tiny real ``SD3Transformer2DModel`` for :func:`build_pipeline_for_encoding`; ``encode_prompt`` reads
    only its ``joint_attention_dim``."""
    changes: dict[str, Any] = {"sample_size": 8, "pos_embed_max_size": 8, "joint_attention_dim": joint_attention_dim}
    if pooled_projection_dim is not None:
        changes["pooled_projection_dim"] = pooled_projection_dim
    with seeded(seed_for("sd3-transformer")):
        model = diffusers.SD3Transformer2DModel(**_sd3_config(**changes))
    return finish(model)


#: The shapes the tiny Flux and Chroma transformers share: one double and one single block, 2 heads of 8, T5 text;
#: in_channels 16 = 4 latent channels x 2x2 packing.
_TINY_FLUX_SHAPES: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": T5_D_MODEL,
    "axes_dims_rope": (2, 2, 4),
}


def tiny_flux_transformer(guidance: bool = True) -> diffusers.FluxTransformer2DModel:
    """Tiny ``FluxTransformer2DModel`` (one double and one single block); ``guidance`` as Flux-dev."""
    with seeded(seed_for(f"flux{guidance}")):
        return diffusers.FluxTransformer2DModel(
            **_TINY_FLUX_SHAPES, pooled_projection_dim=CLIP_VARIANTS["L"]["hidden_size"], guidance_embeds=guidance
        )


def tiny_chroma_transformer() -> diffusers.ChromaTransformer2DModel:
    """Tiny ``ChromaTransformer2DModel`` (one double and one single block, Flux's tiny shapes) with a one-layer
    approximator (``distilled_guidance_layer``); its 64 input channels are Chroma's fixed frequency embedding
    (16 timestep + 16 guidance + 32 modulation-index channels), independent of the width."""
    with seeded(seed_for("chroma")):
        return diffusers.ChromaTransformer2DModel(
            **_TINY_FLUX_SHAPES,
            approximator_num_channels=64,
            approximator_hidden_dim=16,
            approximator_layers=1,
        )


# --------------------------------------------------------------------------------------------------
# pipelines for encode_prompt
# --------------------------------------------------------------------------------------------------


# Non-text constructor arguments per pipeline (everything the __init__ requires besides the text side).
_NON_TEXT_KWARGS: dict[str, dict[str, Any]] = {
    "StableDiffusionPipeline": {
        "vae": None,
        "unet": None,
        "scheduler": None,
        "safety_checker": None,
        "feature_extractor": None,
        "requires_safety_checker": False,
    },
    "StableDiffusionXLPipeline": {"vae": None, "unet": None, "scheduler": None, "add_watermarker": False},
    "StableDiffusion3Pipeline": {"vae": None, "scheduler": None},
    "FluxPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "FluxKontextPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "ChromaPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "PixArtSigmaPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "AuraFlowPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "Lumina2Pipeline": {"vae": None, "scheduler": None, "transformer": None},
    "HiDreamImagePipeline": {"vae": None, "scheduler": None, "transformer": None},
    "SanaPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "QwenImagePipeline": {"vae": None, "scheduler": None, "transformer": None},
    "QwenImageEditPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "QwenImageEditPlusPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "HunyuanImagePipeline": {"vae": None, "scheduler": None, "transformer": None},
    "WanPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "Flux2Pipeline": {"vae": None, "scheduler": None, "transformer": None},
    "Flux2KleinPipeline": {"vae": None, "scheduler": None, "transformer": None},
    "ZImagePipeline": {"vae": None, "scheduler": None, "transformer": None},
    "Krea2Pipeline": {"vae": None, "scheduler": None, "transformer": None},
    "Ideogram4Pipeline": {"vae": None, "scheduler": None, "transformer": None, "unconditional_transformer": None},
    "LTX2Pipeline": {
        "vae": None, "audio_vae": None, "scheduler": None, "transformer": None, "connectors": None, "vocoder": None,
    },
}


#: The first diffusers release with each pipeline newer than 0.32 (the release sd-scripts 48d368f and musubi-tuner
#: 30c658c pin), read from huggingface/diffusers' release tags; anima is a modular pipeline (diffusers.modular_pipelines).
#: Checked in the diffusers git history: pipeline_flux_kontext.py was added by eea7689 "Flux Kontext (#11812)"
#: (0.35.0.dev0, two days after v0.34.0; first in v0.35.0), pipeline_qwenimage_edit.py by e682af2 (0.35.0.dev0,
#: first in v0.35.0), pipeline_qwenimage_edit_plus.py by df267ee (0.36.0.dev0, first in v0.36.0).
PIPELINE_SINCE: dict[str, str] = {
    "Lumina2Pipeline": "0.33.0",
    "WanPipeline": "0.33.0",
    "HiDreamImagePipeline": "0.34.0",
    "ChromaPipeline": "0.34.0",
    "FluxKontextPipeline": "0.35.0",
    "QwenImagePipeline": "0.35.0",
    "QwenImageEditPipeline": "0.35.0",
    "QwenImageEditPlusPipeline": "0.36.0",
    "HunyuanImagePipeline": "0.36.0",
    "AnimaModularPipeline": "0.39.0",
    "ZImagePipeline": "0.36.0",
    "Flux2KleinPipeline": "0.37.0",
    "Flux2Pipeline": "0.36.0",
}


class PipelineUnavailable(ImportError):
    """The installed diffusers has no pipeline class for a family (older than the release that added it)."""


def missing_pipeline(family: str) -> str | None:
    """Why the installed diffusers cannot build ``family``'s pipeline (one line naming both versions), or None."""
    import importlib

    cls_name = PIPELINE_CLASSES.get(family)
    if cls_name is None:
        return None
    try:
        module = importlib.import_module("diffusers.modular_pipelines") if family in MODULAR_FAMILIES else diffusers
        getattr(module, cls_name)
    except (ImportError, AttributeError):
        since = PIPELINE_SINCE.get(cls_name, "a newer release")
        return f"{family}: diffusers {diffusers.__version__} has no {cls_name}; it needs diffusers >= {since}"
    return None


def _fill_non_text(cls_name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with tiny real parts where a ``None`` vae, unet or scheduler is refused: diffusers 0.32's
    StableDiffusion, StableDiffusionXL and PixArtSigma pipelines read their configs in ``__init__`` (0.42's take None)."""
    filled = dict(kwargs)
    if "vae" in filled and filled["vae"] is None:
        filled["vae"] = tiny_vae()
    if "unet" in filled and filled["unet"] is None:
        filled["unet"] = tiny_unet(xl=cls_name == "StableDiffusionXLPipeline")
    if "scheduler" in filled and filled["scheduler"] is None:
        filled["scheduler"] = diffusers.DDPMScheduler(steps_offset=1, clip_sample=False)
    return filled


def build_pipeline_for_encoding(
    family: str, cache_dir: tok.PathLike | None = None, **overrides: Any
) -> DiffusionPipeline:
    """The real diffusers pipeline of ``family`` with tiny text components, ready for ``encode_prompt``.

    ``overrides`` replace components or constructor arguments (e.g. ``text_encoder_3=None,
    tokenizer_3=None`` for SD3 without T5). ``cache_dir`` is where tokenizer files are written (default
    :func:`te_align.tiny.tokenizers.default_cache_dir`). Every call builds fresh objects. Raises
    :class:`PipelineUnavailable` where the installed diffusers lacks the pipeline (:func:`missing_pipeline`).
    """
    cls_name = PIPELINE_CLASSES.get(family)
    if cls_name is None:
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    reason = missing_pipeline(family)
    if reason:
        raise PipelineUnavailable(reason)
    if family in MODULAR_FAMILIES:
        # a modular pipeline is built empty from its default blocks and given its components afterwards;
        # its text step's encode_prompt(components, ...) reads them as attributes
        import diffusers.modular_pipelines as modular

        pipe = getattr(modular, cls_name)()
        pipe.update_components(**{**family_components(family, cache_dir=cache_dir), **overrides})
        pipe.set_progress_bar_config(disable=True)
        return pipe
    kwargs: dict[str, Any] = dict(_NON_TEXT_KWARGS[cls_name])
    if family == "sd3":
        kwargs["transformer"] = sd3_transformer()
    kwargs.update(family_components(family, cache_dir=cache_dir))
    kwargs.update(overrides)
    pipeline_cls = getattr(diffusers, cls_name)
    try:
        pipe = pipeline_cls(**kwargs)
    except AttributeError as e:  # an older diffusers reads the config of a part given as None
        if "'NoneType'" not in str(e):
            raise
        pipe = pipeline_cls(**_fill_non_text(cls_name, kwargs))
    pipe.set_progress_bar_config(disable=True)
    return pipe


# --------------------------------------------------------------------------------------------------
# complete pipelines (training, sampling, A/B)
# --------------------------------------------------------------------------------------------------


def build_pipeline(family: str) -> Any:
    """A real diffusers pipeline of ``family`` (sd15, sdxl, sd3, flux, flux-schnell, chroma) with tiny components."""
    if family == "sd15":
        return diffusers.StableDiffusionPipeline(
            vae=tiny_vae(),
            unet=tiny_unet(),
            scheduler=diffusers.DDPMScheduler(steps_offset=1, clip_sample=False),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
            **family_components("sd15"),
        )
    if family == "sdxl":
        return diffusers.StableDiffusionXLPipeline(
            vae=tiny_vae(),
            unet=tiny_unet(xl=True),
            scheduler=diffusers.EulerDiscreteScheduler(),
            add_watermarker=False,
            **family_components("sdxl"),
        )
    if family == "sd3":
        return diffusers.StableDiffusion3Pipeline(
            transformer=tiny_sd3_transformer(),
            vae=tiny_vae(flow=True),
            scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0),
            **family_components("sd3"),
        )
    if family in ("flux", "flux-schnell"):
        dev = family == "flux"
        sched = diffusers.FlowMatchEulerDiscreteScheduler(
            shift=3.0,
            use_dynamic_shifting=dev,
            base_image_seq_len=16,
            max_image_seq_len=256,
            base_shift=0.5,
            max_shift=1.15,
        )
        return diffusers.FluxPipeline(
            transformer=tiny_flux_transformer(guidance=dev),
            vae=tiny_vae(flow=True),
            scheduler=sched,
            **family_components("flux"),
        )
    if family == "chroma":
        # the flux family's scheduler (shift 1, no dynamic shifting: the mu ChromaPipeline always computes is
        # then ignored), as tools/world_pretrain's chroma base
        return diffusers.ChromaPipeline(
            transformer=tiny_chroma_transformer(),
            vae=tiny_vae(flow=True),
            scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=1.0),
            **family_components("chroma"),
        )
    raise ValueError(family)


def build_model_folder(family: str, path: Path) -> Path:
    """Save the tiny pipeline of ``family`` as a diffusers folder at ``path``."""
    pipe = build_pipeline(family)
    pipe.save_pretrained(str(path), safe_serialization=True)
    return path


def build_tiny_sd3_pipeline() -> diffusers.StableDiffusion3Pipeline:
    """The demo's ``StableDiffusion3Pipeline``: tiny random weights (deterministic) and real-convention tokenizers.

    Two joint blocks of width 32 (the training one has one block of width 16) and the flow VAE, both drawn
    from one seed in that order, around :func:`te_align.tiny.encoders.family_components` ``("sd3")``.
    """
    with seeded(seed_for("te-align-demo-sd3")):
        transformer = diffusers.SD3Transformer2DModel(
            **_sd3_config(num_layers=2, attention_head_dim=16, caption_projection_dim=32)
        )
        vae = diffusers.AutoencoderKL(**_vae_config(flow=True)).eval()
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer,
        vae=vae,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0),
        **family_components("sd3"),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_sd3(path: str | Path) -> Path:
    """Save the tiny-demo preset's SD3 pipeline as a diffusers folder at ``path`` (skipped when a complete one is there)."""
    folder = Path(path)
    if (folder / "model_index.json").is_file() and (folder / "transformer").is_dir():
        return folder
    build_tiny_sd3_pipeline().save_pretrained(str(folder), safe_serialization=True)
    return folder
