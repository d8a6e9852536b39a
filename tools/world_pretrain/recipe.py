"""Pretraining tiny base models (SD3-, Flux-, Chroma-, SDXL- and SD 1.5-shaped) on the shapes world with
exactly their profile.

A base model that was trained with *one* conditioning recipe is what makes "alignment" measurable: a
LoRA trained with a deviating recipe can then be compared with one trained by the profile. This module
pretrains such a model from scratch, deterministically, on CPU. :attr:`PretrainConfig.family` picks the
model (:data:`FAMILIES`); :meth:`PretrainConfig.for_family` gives each family's chosen sizes:

* ``sd3``: ``SD3Transformer2DModel`` + ``StableDiffusion3Pipeline``, profile sd35-large (CLIP-L + CLIP-G +
  T5 256), rectified flow, SD3's 46.4% per-encoder dropout. The steps below describe this family.
* ``flux``: ``FluxTransformer2DModel`` (double- and single-stream blocks, no guidance embedding) +
  ``FluxPipeline``, profile flux-schnell (T5 256 sequence, CLIP-L pooled, zero text ids). Rectified flow as
  SD3 (``x_t = (1 - t) x_0 + t e``, target ``e - x_0``, logit-normal ``t``), the latents normalised with
  the VAE's shift and scale and packed into 2 x 2 patches with the pipeline's own ``_pack_latents`` /
  ``_prepare_latent_image_ids``, the transformer fed ``t`` in [0, 1] (as diffusers'
  examples/dreambooth/train_dreambooth_lora_flux.py:1748-1820 at huggingface/diffusers@58eb52c and
  ``FluxPipeline.__call__``'s ``timestep / 1000``). As schnell, no guidance embedding
  (black-forest-labs/flux@802fb47 src/flux/util.py:378 ``guidance_embed=False``) and an unshifted sampling
  schedule (src/flux/cli.py:255 ``shift=(name != "flux-schnell")``): the saved scheduler has shift 1 and no
  dynamic shifting. No per-encoder dropout (flux-schnell publishes none); the caption is dropped to the
  encoded empty prompt (the profile's ``empty_prompt = "encode"``) at :attr:`PretrainConfig.caption_dropout`,
  so that sampling can use true classifier-free guidance (``true_cfg_scale`` with ``negative_prompt=""``).
* ``chroma``: ``ChromaTransformer2DModel`` + ``ChromaPipeline``, profile chroma (T5 only: no CLIP, no pooled
  vector). Flux's double- and single-stream blocks, but every block's modulation comes from one "distilled
  guidance layer" (``ChromaApproximator``) fed the timestep and each modulation row's index instead of a
  pooled projection (diffusers 0.42.1 src/diffusers/models/transformers/transformer_chroma.py:151-200,
  420-431, 519-520). T5 is run with the tokenizer's attention mask, and the transformer is given the mask
  with one padding token visible (the profile's ``prompt_attention_mask``, ``masks.denoiser_extra_pad_tokens
  = 1``; pipelines/chroma/pipeline_chroma.py:240-251) extended with ones for the image tokens by the
  pipeline's own ``_prepare_attention_mask`` (pipeline_chroma.py:545-561, 787-798), in training as at
  sampling (pipeline_chroma.py:858-866). That mask is in the embeddings' dtype (float), which
  ``scaled_dot_product_attention`` adds to the attention logits instead of masking (diffusers issues 12116
  and 13619); training feeds the very tensor the pipeline feeds, so the base matches its official pipeline.
  Flow matching as Flux (packed 2 x 2 latents, ``t`` in [0, 1] as the pipeline's ``timestep / 1000``,
  pipeline_chroma.py:856-861; zero ``text_ids``, pipeline_chroma.py:323), the saved scheduler as the flux
  family's (shift 1, no dynamic shifting, so the ``mu`` the pipeline always computes is ignored:
  schedulers/scheduling_flow_match_euler_discrete.py:309,354). Caption dropout to the encoded empty prompt
  (``empty_prompt = "encode"``) at 10%, sampled with true classifier-free guidance (``guidance_scale``
  against ``negative_prompt=""``, pipeline_chroma.py:328,869-882). The T5 window is 256 tokens, not the
  profile's 512 (:data:`PROFILE_CHANGES`).
* ``sdxl``: ``UNet2DConditionModel`` (cross-attention to CLIP-L + CLIP-G hidden states, ``text_time``
  add-embedding of the pooled CLIP-G projection and six time ids) + ``StableDiffusionXLPipeline``, profile
  sdxl. Epsilon prediction on SDXL's scaled-linear schedule (betas 0.00085 .. 0.012, 1000 steps; uniform
  timesteps, ``add_noise`` and the time ids as diffusers'
  examples/text_to_image/train_text_to_image_sdxl.py:1091-1119 at huggingface/diffusers@58eb52c); the
  latents only scaled (the SDXL pipeline ignores a VAE ``shift_factor``, so the family's VAE carries none);
  time ids (original size, crop (0, 0), target size) at the tiny resolution, as the pipeline computes them
  by default. No per-encoder dropout (sdxl publishes none); the dropped caption becomes zeros
  (``empty_prompt = "zeros"``, ``force_zeros_for_empty_prompt``), which is what the pipeline's
  classifier-free guidance feeds for a missing negative prompt.

The caption-dropout rate of flux, chroma and sdxl (10%) is a choice: none of the three models' rates was
published; 10% is the "10% dropping of the text-conditioning" of the Stable Diffusion v1 model cards
(CompVis/stable-diffusion-v1-4, runwayml/stable-diffusion-v1-5 on the Hugging Face Hub) and the
``ucg_rate: 0.1`` of Stability-AI/generative-models@0ad7de9 configs/example_training/txt2img-clipl.yaml:53.

The recipe, for the SD3-shaped model:

1. :func:`train_vae`: a small ``AutoencoderKL`` (32 px RGB -> 16 x 16 x 4 latents, one downsampling)
   trained on world renders; its ``shift_factor`` / ``scaling_factor`` are set from the latent
   statistics, as SD3's VAE config carries them.
2. :class:`ConditioningTable`: every training caption encoded once by :func:`te_align.encode` with the
   profile fitted to the tiny frozen encoders (:func:`te_align.tiny.fit.profile_overrides`).
   :class:`SlotDropout` applies the profile's per-encoder dropout (``slots.*.train_dropout``: SD3's
   46.4% each) to cached rows: the profile's outputs place each slot's result in its own elements
   (concatenation and zero padding), so a dropped slot's elements are replaced by the same elements of
   the encoded empty prompt (``empty_prompt = "encode"``). The element map is measured once with
   ``te_align.encode`` and every pattern is checked against ``te_align.encode(drop_slots=...)``
   exactly before training starts; a profile whose outputs mix slots is refused.
3. :func:`train_transformer`: a real ``SD3Transformer2DModel`` with rectified flow
   (``x_t = (1 - t) x_0 + t e``, target ``e - x_0``), SD3's logit-normal timestep density, AdamW and an
   EMA of the weights (the EMA is what is saved).
4. :func:`build_pipeline` / :func:`pretrain`: the ``StableDiffusion3Pipeline`` around them, saved with
   ``save_pretrained`` and loadable by ``StableDiffusion3Pipeline.from_pretrained``.
5. :func:`evaluate_pipeline`: held-out scenes sampled with the official pipeline (fixed seeds, a few
   Euler steps, classifier-free guidance with the encoded empty prompt) and read back by
   :func:`te_align.tiny.world.read_image`: object accuracy and per-attribute accuracy, per caption style.

Everything is seeded; two runs with the same :class:`PretrainConfig` and thread count give identical
weights.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FAMILIES",
    "FAMILY_DEFAULTS",
    "PACKED_FAMILIES",
    "PROFILE_CHANGES",
    "CaptionDropout",
    "ConditioningTable",
    "FamilySpec",
    "PretrainConfig",
    "PretrainResult",
    "SlotDropout",
    "build_pipeline",
    "complete_config",
    "encode_captions",
    "evaluate_pipeline",
    "family_spec",
    "family_vae",
    "fitted_overrides",
    "fitted_profile",
    "heldout_set",
    "model_sizes",
    "new_denoiser",
    "pipeline_family",
    "pretrain",
    "sdxl_scheduler",
    "sdxl_time_ids",
    "train_transformer",
    "train_vae",
    "training_loss",
    "vae_roundtrip_accuracy",
]

logger = logging.getLogger(__name__)

#: Families trained with epsilon prediction on the scaled-linear DDPM schedule (UNets); the others are flows.
EPS_FAMILIES = ("sdxl", "sd15")

#: The bundled profile the SD3-shaped world model is pretrained with.
PROFILE = "sd35-large"
FAMILY = "sd3"


@dataclass(frozen=True)
class FamilySpec:
    """What differs between the pretrainable families."""

    name: str
    profile: str  # the bundled profile
    fit: str  # key of te_align.tiny.fit.profile_overrides
    components: str  # key of te_align.tiny.encoders.family_components
    pipeline: str  # diffusers pipeline class
    denoiser: str  # component name of the denoiser
    caption_dropout: float  # default PretrainConfig.caption_dropout


#: The pretrainable families (``PretrainConfig.family``).
FAMILIES: dict[str, FamilySpec] = {
    "sd3": FamilySpec("sd3", "sd35-large", "sd3", "sd3", "StableDiffusion3Pipeline", "transformer", 0.0),
    "flux": FamilySpec("flux", "flux-schnell", "flux-schnell", "flux", "FluxPipeline", "transformer", 0.1),
    "sdxl": FamilySpec("sdxl", "sdxl", "sdxl", "sdxl", "StableDiffusionXLPipeline", "unet", 0.1),
    # sd15 publishes its caption dropout as the profile's per-encoder dropout of its one encoder (10%)
    "sd15": FamilySpec("sd15", "sd15", "sd15", "sd15", "StableDiffusionPipeline", "unet", 0.0),
    # chroma publishes no caption dropout (the profile's train_dropout is unconfirmed): 10% as flux and sdxl
    "chroma": FamilySpec("chroma", "chroma", "chroma", "chroma", "ChromaPipeline", "transformer", 0.1),
    # FLUX.2 klein at tiny size (te_align.tiny.klein, issue 49): no caption dropout published; 10% as flux and chroma
    "klein": FamilySpec("klein", "flux2-klein-4b", "klein", "klein", "Flux2KleinPipeline", "transformer", 0.1),
}

#: The klein family: FLUX.2 klein's recipe (Flux2KleinPipeline, Qwen3 encoder, AutoencoderKLFlux2 latents).
KLEIN = "klein"

#: Families whose denoiser reads 2 x 2 packed latents (the Flux layout) and returns them packed.
PACKED_FAMILIES = ("flux", "chroma")

#: Per family, behaviour changes of its profile besides the tiny encoders' architecture numbers
#: (:func:`te_align.tiny.fit.profile_overrides`); written into a shipped base's
#: ``base.json["profile_overrides"]``. chroma: T5 256 tokens instead of the profile's 512 (ChromaPipeline's
#: max_sequence_length default, pipeline_chroma.py:614), the window of the shipped SD3 and Flux bases
#: (flux-schnell's own 256). The world encoders' T5 was pretrained at 256, 154 and 77 tokens
#: (world_pretrain.encoders.EncoderConfig.t5_lengths); with the encoder mask the real tokens' states do not
#: depend on the padding, but the denoiser's float mask does not hide padding (see the chroma notes above), so
#: 256 keeps the padding it sees to what the other bases see, halves the text tokens of every step, and holds
#: every world caption the other bases' T5 windows hold.
PROFILE_CHANGES: dict[str, dict[str, Any]] = {
    "chroma": {"slots.t5.tokenizer.max_length": 256},
}

#: Per family, the :class:`PretrainConfig` fields :meth:`PretrainConfig.for_family` changes from the defaults.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "sd3": {},
    # 2 double-stream + 2 single-stream blocks of the SD3 model's width 64 (2 heads x 32): four blocks as the
    # SD3 model's four joint blocks, about its step time (bench_pretrain.py --family flux, retired in
    # issue 25: its record is benchmarks/learnability/bench_pretrain.md)
    "flux": {"layers": 2, "single_layers": 2},
    # 3 levels (16, 8, 4 latent px), cross-attention on the two lower ones as SDXL (none at full size);
    # (32, 64, 64) rather than SDXL's 1:2:4 widths: at most the SD3 model's step time and 1.7 M parameters
    # (the class defaults: unet_channels, single_layers, time_embed_dim are used by their family only)
    "sdxl": {},
    "sd15": {},
    # the flux base's 2 double-stream + 2 single-stream blocks of width 64 (2 heads x 32). The approximator
    # (which replaces Flux's per-block modulation linears) maps only (timestep, modulation row index) to the
    # 32 modulation vectors of four blocks, once per sample whatever the token count: 2 residual layers
    # instead of Chroma's 5, of the model's width 64 (Chroma's 5120 is wider than its 3072, so no narrower
    # layer squeezes the modulation): 25 k of the 334 k parameters (7.5%; Chroma's 5 x 5120 are 3% of
    # 8.9 B), little time next to the blocks (benchmarks/world/bench_world_steps.py --only chroma)
    "chroma": {"layers": 2, "single_layers": 2, "approximator_hidden_dim": 64, "approximator_layers": 2},
    # te_align.tiny.klein.KLEIN_TRANSFORMER's blocks (2 double- + 2 single-stream, 2 heads of 32: width and head_dim
    # are the class defaults): new_transformer builds klein_transformer() and changes only what a config changes
    # (tests/tiny/test_klein_recipe.py checks that this configuration gives KLEIN_TRANSFORMER exactly)
    "klein": {"layers": 2, "single_layers": 2},
}


def family_spec(family: str) -> FamilySpec:
    spec = FAMILIES.get(family)
    if spec is None:
        raise ValueError(f"PretrainConfig.family: expected one of {', '.join(FAMILIES)}, got {family!r}")
    return spec


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that decides the pretrained weights (with the thread count and torch version).

    ``family`` picks the model (:data:`FAMILIES`); build a family's chosen configuration with
    :meth:`for_family` (the flux one has ``layers=2``: two double-stream blocks before ``single_layers``).

    Defaults are the recipe chosen before the first run (see docs in the report): 32 px images, a VAE
    with one downsampling (16 x 16 x 4 latents) and a 4-block, 64-wide MMDiT with 2 x 2 patches (64 image
    tokens next to SD3's 77 + 256 text tokens).
    """

    seed: int = 0
    image_size: int = 32
    train_size: int = 10000
    # VAE
    # VAE: benchmarks/learnability/bench_pretrain.md run3 (97.3% of objects survive the round trip on the full world)
    vae_channels: tuple[int, ...] = (16, 32)
    latent_channels: int = 8
    vae_steps: int = 3000
    vae_batch: int = 16
    vae_lr: float = 2e-3
    vae_kl_weight: float = 1e-6
    # transformer
    width: int = 64
    head_dim: int = 32
    layers: int = 4
    patch_size: int = 2
    steps: int = 3000
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 200
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ema_decay: float = 0.999
    logit_mean: float = 0.0
    logit_std: float = 1.0
    # sampling defaults written into the saved scheduler
    scheduler_shift: float = 1.0
    encode_batch: int = 64
    style_mix: dict[str, float] | None = field(default=None, hash=False)
    # the concept the denoiser never sees (the LoRA finetunes teach it): "attribute=value", "" for none.
    # The autoencoder is trained on the whole world, as a real VAE is trained on all images.
    held_out: str = "colour=pink"
    # the model family (FAMILIES): sd3, flux, sdxl, sd15 or chroma
    family: str = "sd3"
    # whole-caption dropout to the profile's empty prompt (None: the family's default, FAMILIES)
    caption_dropout: float | None = None
    # flux, chroma: single-stream blocks after the `layers` double-stream ones (for_family sets layers 2)
    single_layers: int = 2
    # chroma: the approximator ("distilled_guidance_layer") that computes every block's modulation
    approximator_hidden_dim: int = 64
    approximator_layers: int = 2
    # sdxl: UNet block widths (attention heads of head_dim), time-id embedding width per id
    unet_channels: tuple[int, ...] = (32, 64, 64)
    unet_layers_per_block: int = 1
    time_embed_dim: int = 16
    # sdxl: where text enters the UNet: "family" (SDXL's layout: cross-attention at every level but the full
    # resolution) or "all" (cross-attention at every level, as SD 1.5 has at the full resolution; the layout
    # bench_learnability.md amendment 7 tests, the conditioning recipe unchanged)
    unet_cross_attention: str = "family"
    # the scene space (te_align.tiny.world.SPACES): "full" (1-3 objects, every size, style and background) or
    # "simple" (one filled object, medium or large, plain white background)
    world: str = "full"
    # the text encoders: "" for the tiny random ones of te_align.tiny.encoders.family_components, else a folder
    # written by world_pretrain.encoders (pretrained on world captions, shared by every family)
    encoders: str = ""
    # curriculum: for the first N denoiser steps draw only captions of the "tags" style (0: no curriculum)
    curriculum_tags_steps: int = 0
    # klein: the autoencoder's BatchNorm statistics (what Flux2KleinPipeline normalises latents with) are those of
    # the patchified posterior means of this many full-world renders drawn with this dataset seed
    vae_bn_renders: int = 10000
    vae_bn_seed: int = 30_000

    def __post_init__(self) -> None:
        family_spec(self.family)
        from te_align.tiny import world

        if self.world not in world.SPACES:
            raise ValueError(f"PretrainConfig.world: expected one of {', '.join(world.SPACES)}, got {self.world!r}")
        if self.unet_cross_attention not in ("family", "all"):
            raise ValueError(
                f"PretrainConfig.unet_cross_attention: expected family or all, got {self.unet_cross_attention!r}"
            )

    @property
    def space(self) -> Any:
        """The :class:`te_align.tiny.world.SceneSpace` of :attr:`world`."""
        from te_align.tiny import world

        return world.SPACES[self.world]

    @classmethod
    def for_family(cls, family: str, **changes: Any) -> PretrainConfig:
        """The chosen configuration of ``family`` (:data:`FAMILY_DEFAULTS`), with ``changes`` applied."""
        family_spec(family)
        return cls(**{**FAMILY_DEFAULTS[family], "family": family, **changes})

    @property
    def spec(self) -> FamilySpec:
        return family_spec(self.family)

    @property
    def caption_dropout_rate(self) -> float:
        return self.spec.caption_dropout if self.caption_dropout is None else float(self.caption_dropout)

    def concept(self) -> Any:
        """The held-out :class:`te_align.tiny.world.Concept` (``None`` when ``held_out`` is empty)."""
        from te_align.tiny import world

        if not self.held_out:
            return None
        attribute, _, value = self.held_out.partition("=")
        return world.Concept(attribute, value)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["vae_channels"] = list(self.vae_channels)
        d["unet_channels"] = list(self.unet_channels)
        return d

    @property
    def latent_size(self) -> int:
        return self.image_size // 2 ** (len(self.vae_channels) - 1)


def complete_config(recorded: dict[str, Any]) -> dict[str, Any]:
    """A config recorded by an earlier version (a checkpoint's, a shipped base's) with every field added since
    at its default, which is the behaviour the run had (e.g. chroma's approximator sizes, used by no earlier
    family)."""
    return {**PretrainConfig().as_dict(), **recorded}


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _rng(seed: int) -> Iterator[Any]:
    """A block run with the global torch RNG at ``seed`` (the caller's state restored afterwards)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _images_to_tensor(images: Sequence[np.ndarray]) -> Any:
    import torch

    x = torch.from_numpy(np.stack([np.asarray(im)[:, :, :3] for im in images])).permute(0, 3, 1, 2)
    return x.float().div(127.5).sub(1.0).contiguous()


def _tensor_to_images(x: Any) -> list[np.ndarray]:
    arr = ((x.clamp(-1, 1) + 1) * 127.5).round().to(dtype=__import__("torch").uint8)
    return [a for a in arr.permute(0, 2, 3, 1).cpu().numpy()]


def fitted_overrides(family: str = FAMILY) -> dict[str, Any]:
    """The overrides of ``family``'s bundled profile: the tiny encoders' architecture numbers
    (:func:`te_align.tiny.fit.profile_overrides`) and the family's :data:`PROFILE_CHANGES` (chroma's T5
    256)."""
    from te_align.tiny.fit import profile_overrides

    if family == KLEIN:
        return {**_klein_overrides(), **PROFILE_CHANGES.get(family, {})}
    return {**profile_overrides(family_spec(family).fit), **PROFILE_CHANGES.get(family, {})}


@functools.cache
def _klein_overrides_cached() -> tuple[tuple[str, Any], ...]:
    from te_align.profiles import profile
    from te_align.tiny.fit import architecture_overrides
    from te_align.tiny.klein import klein_text_encoder
    from te_align.tiny.tokenizers import qwen3_instruct_tokenizer

    tok = qwen3_instruct_tokenizer()
    comps = {"tokenizer": tok, "text_encoder": klein_text_encoder(tok)}
    return tuple(architecture_overrides(profile(family_spec(KLEIN).profile), comps).items())


def _klein_overrides() -> dict[str, Any]:
    """flux2-klein-4b fitted to the tiny klein text encoder of :func:`te_align.tiny.klein.klein_text_encoder` (31
    layers, width 32, the tiny Qwen3 tokenizer's vocabulary and ids); a trained encoder set has the same shape
    (:func:`prepare` checks it)."""
    return dict(_klein_overrides_cached())


def load_klein_encoder(folder: str | Path) -> Any:
    """The Qwen3 text encoder of a klein encoder set ``folder`` (written by ``world_build.py klein-encoder``:
    :mod:`world_pretrain.klein_encoder`), float32, eval, frozen."""
    from world_pretrain.klein_encoder import load_klein_encoder as load

    return load(folder)


def fitted_profile(family: str = FAMILY) -> Any:
    """The bundled profile of ``family`` with :func:`fitted_overrides` (the tiny encoders' numbers, chroma's
    T5 256)."""
    import te_align

    return te_align.profile(family_spec(family).profile).with_overrides(fitted_overrides(family))


def model_sizes(pipe: Any) -> dict[str, dict[str, float]]:
    """Parameter count and fp16 megabytes (10^6 bytes) per component and in total."""
    out: dict[str, dict[str, float]] = {}
    for name in ("transformer", "unet", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
        module = getattr(pipe, name, None)
        if module is None:
            continue
        n = sum(p.numel() for p in module.parameters())
        out[name] = {"params": float(n), "fp16_mb": round(2 * n / 1e6, 3)}
    n_all = sum(v["params"] for v in out.values())
    out["total"] = {"params": n_all, "fp16_mb": round(2 * n_all / 1e6, 3)}
    return out


# --------------------------------------------------------------------------------------------------
# the autoencoder
# --------------------------------------------------------------------------------------------------


def _vae_config(cfg: PretrainConfig) -> dict[str, Any]:
    n = len(cfg.vae_channels)
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ["DownEncoderBlock2D"] * n,
        "up_block_types": ["UpDecoderBlock2D"] * n,
        "block_out_channels": list(cfg.vae_channels),
        "layers_per_block": 1,
        "latent_channels": cfg.latent_channels,
        "norm_num_groups": 8,
        "sample_size": cfg.image_size,
        "use_quant_conv": False,
        "use_post_quant_conv": False,
        "shift_factor": 0.0,
        "scaling_factor": 1.0,
    }


def train_vae(
    cfg: PretrainConfig,
    images: Sequence[np.ndarray],
    log: Callable[[dict[str, Any]], None] | None = None,
    *,
    callback: Callable[[int, Any], None] | None = None,
    callback_every: int = 0,
) -> Any:
    """A small ``AutoencoderKL`` trained on ``images`` (reconstruction MSE + a tiny KL term).

    ``callback(step, vae)`` runs every ``callback_every`` steps (e.g. a round-trip evaluation), without
    gradients and with the global RNG state restored afterwards, so it does not change the weights.
    Afterwards ``shift_factor`` and ``scaling_factor`` are set so that ``(z - shift) * scale`` of the
    training latents (posterior means) has mean 0 and standard deviation 1, as SD3's VAE config does.
    """
    import diffusers
    import torch

    x_all = _images_to_tensor(images)
    with _rng(cfg.seed * 1000 + 1):
        vae = diffusers.AutoencoderKL(**_vae_config(cfg))
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + 2)
        opt = torch.optim.AdamW(vae.parameters(), lr=cfg.vae_lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt,
            lambda s: (
                min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, cfg.vae_steps))))
            ),
        )
        vae.train()
        t0 = time.perf_counter()
        for step in range(cfg.vae_steps):
            idx = torch.randint(0, len(x_all), (cfg.vae_batch,), generator=gen)
            x = x_all[idx]
            post = vae.encode(x).latent_dist
            z = post.mean + post.std * torch.randn(post.mean.shape, generator=gen)
            rec = vae.decode(z).sample
            mse = torch.nn.functional.mse_loss(rec, x)
            kl = post.kl().mean() / x[0].numel()
            loss = mse + cfg.vae_kl_weight * kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
            opt.step()
            sched.step()
            if log is not None and (step + 1) % max(1, cfg.vae_steps // 10) == 0:
                log(
                    {
                        "phase": "vae",
                        "step": step + 1,
                        "mse": mse.item(),
                        "kl": kl.item(),
                        "seconds": time.perf_counter() - t0,
                    }
                )
            if callback is not None and callback_every > 0 and (step + 1) % callback_every == 0:
                vae.eval()
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    callback(step + 1, vae)
                vae.train()
    vae.eval()
    with torch.no_grad():
        z = torch.cat([vae.encode(x_all[i : i + 256]).latent_dist.mean for i in range(0, len(x_all), 256)])
    shift = float(z.mean())
    scale = float(1.0 / z.std())
    vae.register_to_config(shift_factor=round(shift, 6), scaling_factor=round(scale, 6))
    return vae


def encode_latents(vae: Any, images: Sequence[np.ndarray], batch: int = 256) -> Any:
    """``(mean - shift) * scale`` of each image's posterior, as the denoiser is trained on.

    A VAE without ``shift_factor`` (the SDXL family's) gives ``mean * scale``, as the SDXL pipeline decodes. The
    klein family's ``AutoencoderKLFlux2`` gives what ``Flux2KleinPipeline._encode_vae_image`` gives (diffusers 0.42.1
    pipelines/flux2/pipeline_flux2_klein.py:464-477): the posterior mean (its ``argmax``) patchified 2 x 2 by
    ``_patchify_latents`` and normalised with the BatchNorm's running statistics, ``(x - mean) / sqrt(var + eps)``
    (the pipeline inverts it before decoding, :911-916): (N, 4 C, H / 2, W / 2).
    """
    import torch

    x_all = _images_to_tensor(images)
    with torch.no_grad():
        z = torch.cat(
            [vae.encode(x_all[i : i + batch]).latent_dist.mean for i in range(0, len(x_all), batch)]
        )
    if getattr(vae, "bn", None) is not None:
        import diffusers

        z = diffusers.Flux2KleinPipeline._patchify_latents(z)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(z.device, z.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(z.device, z.dtype)
        return (z - mean) / std
    if vae.config.shift_factor is None:
        return z * vae.config.scaling_factor
    return (z - vae.config.shift_factor) * vae.config.scaling_factor


def family_vae(cfg: PretrainConfig, vae: Any) -> Any:
    """The autoencoder as ``cfg.family``'s pipeline uses it: the SDXL family's is a copy without ``shift_factor``.

    ``StableDiffusionXLPipeline`` decodes ``latents / scaling_factor`` and ignores a shift (and te-align
    train applies one when the config has it), so the SDXL model is trained and saved without it, as
    SDXL's own VAE config. The flow families use the VAE as trained (SD3 / Flux normalise with both). The klein
    family's is :func:`klein_family_vae`.
    """
    if cfg.family == KLEIN:
        return klein_family_vae(cfg, vae)
    if cfg.family not in EPS_FAMILIES or vae.config.shift_factor is None:
        return vae
    vae = copy.deepcopy(vae)
    vae.register_to_config(shift_factor=None)
    return vae


def klein_family_vae(cfg: PretrainConfig, vae: Any, log: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """The shared autoencoder as an ``AutoencoderKLFlux2`` (:func:`te_align.tiny.klein.klein_vae`; the same weights,
    rounded to float16 values as shipped) whose BatchNorm statistics :func:`te_align.tiny.klein.set_latent_statistics`
    sets from ``cfg.vae_bn_renders`` full-world renders of dataset seed ``cfg.vae_bn_seed`` (every concept, as the
    autoencoder sees the whole world). An ``AutoencoderKLFlux2`` is returned as it is. ``log`` gets the statistics
    (``phase`` ``vae_bn``)."""
    from te_align.tiny import world
    from te_align.tiny.klein import klein_vae, set_latent_statistics

    if getattr(vae, "bn", None) is not None:
        return vae
    out = klein_vae(vae)
    _round_to_half(out)
    renders = world.make_dataset(cfg.vae_bn_renders, cfg.vae_bn_seed, image_size=cfg.image_size, tokenizer=False)
    t0 = time.perf_counter()
    set_latent_statistics(out, _images_to_tensor([s.image for s in renders]))
    if log is not None:
        log({"phase": "vae_bn", "renders": cfg.vae_bn_renders, "seed": cfg.vae_bn_seed, "seconds": time.perf_counter() - t0,
             **vae_bn_record(out)})  # fmt: skip
    return out


def vae_bn_record(vae: Any) -> dict[str, list[float]]:
    """An ``AutoencoderKLFlux2``'s BatchNorm statistics as lists (float32 values; exact through JSON)."""
    return {"mean": [float(v) for v in vae.bn.running_mean], "var": [float(v) for v in vae.bn.running_var]}


def vae_roundtrip_accuracy(vae: Any, samples: Sequence[Any]) -> dict[str, float]:
    """Reader accuracy (:func:`te_align.tiny.world.evaluate`) on VAE round trips (posterior mean) of ``samples``."""
    import torch

    from te_align.tiny import world

    x = _images_to_tensor([s.image for s in samples])
    with torch.no_grad():
        rec = torch.cat(
            [vae.decode(vae.encode(x[i : i + 128]).latent_dist.mean).sample for i in range(0, len(x), 128)]
        )
    out = world.evaluate(_tensor_to_images(rec), [s.scene for s in samples])
    out["mse"] = float(torch.nn.functional.mse_loss(rec.clamp(-1, 1), x))
    return out


# --------------------------------------------------------------------------------------------------
# conditioning
# --------------------------------------------------------------------------------------------------


@dataclass
class ConditioningTable:
    """The profile's conditioning of every caption (rows in caption order), computed once.

    ``shared``: outputs without a batch dimension (Flux's ``text_ids``), the same for every caption.
    """

    tensors: dict[str, Any]
    captions: list[str]
    shared: dict[str, Any] = field(default_factory=dict)

    def rows(self, idx: Any) -> dict[str, Any]:
        return {k: v[idx] for k, v in self.tensors.items()}


def _round_to_half(module: Any) -> None:
    """Round every parameter of ``module`` to the nearest float16 value, in place (dtype unchanged)."""
    import torch

    with torch.no_grad():
        for prm in module.parameters():
            prm.copy_(prm.half().to(prm.dtype))


def _components(family: str = FAMILY, encoders: str | Path = "") -> dict[str, Any]:
    """The frozen text encoders of ``family``, their weights rounded to float16 values (kept in float32).

    ``encoders``: a folder written by :func:`world_pretrain.encoders.save_encoders` (the encoders pretrained on
    world captions, arranged for the family by :func:`world_pretrain.encoders.components_for`); empty for the
    tiny random encoders of :func:`te_align.tiny.encoders.family_components`. A base model is shipped in
    float16; rounding before pretraining makes the shipped text encoders exactly the ones the denoiser was
    trained with, whatever ``transformers`` version initialises them.
    """
    import torch

    if family == KLEIN:  # the tiny Qwen3 instruct tokenizer and a klein encoder set's Qwen3 (or the random one)
        from te_align.tiny.klein import klein_text_encoder
        from te_align.tiny.tokenizers import qwen3_instruct_tokenizer

        tok = qwen3_instruct_tokenizer()
        components = {"tokenizer": tok, "text_encoder": load_klein_encoder(encoders) if encoders else klein_text_encoder(tok)}
    elif encoders:
        from world_pretrain.encoders import components_for, load_encoders

        components = components_for(family_spec(family).components, load_encoders(encoders))
    else:
        from te_align.tiny.encoders import family_components

        components = family_components(family_spec(family).components)
    for module in components.values():
        if isinstance(module, torch.nn.Module):
            _round_to_half(module)
    return components


def encode_captions(
    profile: Any, components: dict[str, Any], captions: Sequence[str], batch: int = 64
) -> ConditioningTable:
    """Every caption encoded by ``te_align.encode`` (no dropout), batched; float32 as the pipeline encodes.

    The rows are written into one tensor per output (no second copy: klein's table is 20,000 x 512 x 96). FLUX.2's
    ``text_ids`` (batched, (B, L, 4), but the same (0, 0, 0, position) rows for every prompt; the transformer reads
    the first, diffusers 0.42.1 models/transformers/transformer_flux2.py:1324-1325) are checked to be equal and kept
    once, as a shared (1, L, 4)."""
    import torch

    import te_align

    out: dict[str, Any] = {}
    shared: dict[str, Any] = {}
    for i in range(0, len(captions), batch):
        cond = te_align.encode(
            profile, list(captions[i : i + batch]), tokenizers=components, text_encoders=components
        )
        for k, v in cond.items():
            if k == "text_ids" and k not in cond.shared and v.dim() == 3:
                if not bool((v == v[:1]).all()):
                    raise AssertionError("encode_captions: text_ids differ between prompts")
                k, v = "text_ids", v[:1]
            if k in cond.shared or k == "text_ids":
                if k in shared and not torch.equal(shared[k], v):
                    raise AssertionError(f"encode_captions: shared output {k} differs between batches")
                shared[k] = v
            else:
                if k not in out:
                    out[k] = torch.empty((len(captions), *v.shape[1:]), dtype=v.dtype, device=v.device)
                out[k][i : i + len(v)] = v
    return ConditioningTable(out, list(captions), shared)


def _on(t: Any, device: Any) -> Any:
    """``t`` on ``device`` (the same tensor when it is there already)."""
    return t if t.device == device else t.to(device, non_blocking=True)


class SlotDropout:
    """The profile's per-encoder dropout applied to cached conditioning rows, exactly.

    ``regions[slot][output]`` marks the elements of each output that come from ``slot`` (measured by
    encoding probe prompts with the slot zeroed); a dropped slot's elements take the encoded empty
    prompt's values. :meth:`verify` compares every drop pattern with ``te_align.encode(drop_slots=...)``.
    """

    def __init__(self, profile: Any, components: dict[str, Any], probes: Sequence[str]) -> None:
        import torch

        import te_align
        from te_align.encoding import EncodeOptions

        self.profile = profile
        self.rates = {s.name: float(s.train_dropout) for s in profile.slots if s.train_dropout}
        if self.rates and profile.empty_prompt != "encode":
            raise ValueError(
                f"SlotDropout: profile {profile.name} empties prompts as {profile.empty_prompt!r}; only 'encode' is handled"
            )
        n = len(probes)
        full = te_align.encode(profile, list(probes), tokenizers=components, text_encoders=components)
        self.regions: dict[str, dict[str, Any]] = {}
        for slot in self.rates:
            zeroed = te_align.encode(
                profile, list(probes), tokenizers=components, text_encoders=components,
                drop_slots={slot: [True] * n}, options=EncodeOptions(dropout_policy="zeros"),
            )  # fmt: skip
            self.regions[slot] = {k: (full[k] != zeroed[k]).any(dim=0) for k in full}
        for k in full if self.rates else ():
            overlap = sum(self.regions[s][k].int() for s in self.rates)
            if bool((overlap > 1).any()):
                raise ValueError(
                    f"SlotDropout: output {k} of profile {profile.name} mixes slots; cannot drop slots on cached rows"
                )
        empty = te_align.encode(profile, [""], tokenizers=components, text_encoders=components)
        self.empty = {k: v[0] for k, v in empty.items()}
        self._components = components
        self._torch = torch

    def to(self, device: Any) -> SlotDropout:
        """Keep the empty prompt's rows and the slot regions on ``device`` (where the training rows are)."""
        self.empty = {k: v.to(device) for k, v in self.empty.items()}
        self.regions = {s: {k: v.to(device) for k, v in r.items()} for s, r in self.regions.items()}
        return self

    def sample(self, n: int, gen: Any) -> dict[str, Any]:
        """Independent per-slot flags (``n`` booleans per slot) drawn from ``gen``."""
        torch = self._torch
        return {slot: torch.rand(n, generator=gen) < rate for slot, rate in self.rates.items()}

    def apply(self, rows: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
        torch = self._torch
        out = {}
        for k, v in rows.items():
            empty = _on(self.empty[k], v.device)
            for slot, f in flags.items():
                sel = f.view(-1, *([1] * (v.dim() - 1))) & _on(self.regions[slot][k], v.device)
                v = torch.where(sel, empty.expand_as(v), v)
            out[k] = v
        return out

    def verify(self, captions: Sequence[str]) -> None:
        """Every drop pattern on ``captions`` equals ``te_align.encode(drop_slots=...)`` bit for bit."""
        import itertools

        import te_align

        torch = self._torch
        base = te_align.encode(
            self.profile, list(captions), tokenizers=self._components, text_encoders=self._components
        )
        n = len(captions)
        for pattern in itertools.product((False, True), repeat=len(self.rates)):
            flags = {s: torch.tensor([p] * n) for s, p in zip(self.rates, pattern, strict=True)}
            ref = te_align.encode(
                self.profile, list(captions), tokenizers=self._components, text_encoders=self._components,
                drop_slots={s: [p] * n for s, p in zip(self.rates, pattern, strict=True)},
            )  # fmt: skip
            got = self.apply(dict(base.items()), flags)
            for k in ref:
                if not torch.equal(got[k], ref[k]):
                    raise AssertionError(
                        f"SlotDropout: pattern {dict(zip(self.rates, pattern, strict=True))} differs from te_align.encode on {k}"
                    )


class CaptionDropout:
    """Whole-caption dropout on cached rows: a dropped row becomes the profile's dropped caption.

    That is ``te_align.encode`` with every slot dropped: the encoded empty prompt under ``empty_prompt =
    "encode"`` (Flux), zeros under ``"zeros"`` (SDXL, as the pipeline's ``force_zeros_for_empty_prompt``).
    The empty prompt is encoded alone (batch of one), as ``drop_slots`` does; ``te_align.encode(drop=...)``
    encodes it inside the batch, which differs only by float32 rounding. Outputs without a batch dimension
    (``text_ids``) are the same for every caption and are left alone. :meth:`verify` checks both.
    """

    def __init__(self, profile: Any, components: dict[str, Any], rate: float) -> None:
        import torch

        import te_align

        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"PretrainConfig.caption_dropout: expected a rate in [0, 1], got {rate}")
        self.profile = profile
        self.rate = float(rate)
        dropped = te_align.encode(
            profile, [""], tokenizers=components, text_encoders=components, drop_slots=self._all_slots(1)
        )
        self.empty = {k: v[0] for k, v in dropped.items() if k not in dropped.shared}
        self._components = components
        self._torch = torch

    def _all_slots(self, flags: int | list[bool]) -> dict[str, list[bool]]:
        flags = [True] * flags if isinstance(flags, int) else flags
        return {s.name: list(flags) for s in self.profile.slots}

    def to(self, device: Any) -> CaptionDropout:
        """Keep the dropped caption's rows on ``device`` (where the training rows are)."""
        self.empty = {k: v.to(device) for k, v in self.empty.items()}
        return self

    def sample(self, n: int, gen: Any) -> Any:
        """``n`` flags drawn from ``gen`` (nothing is drawn when the rate is 0)."""
        torch = self._torch
        if self.rate <= 0.0:
            return torch.zeros(n, dtype=torch.bool)
        return torch.rand(n, generator=gen) < self.rate

    def apply(self, rows: dict[str, Any], flags: Any) -> dict[str, Any]:
        torch = self._torch
        out = {}
        for k, v in rows.items():
            sel = flags.view(-1, *([1] * (v.dim() - 1)))
            out[k] = torch.where(sel, _on(self.empty[k], v.device).expand_as(v), v)
        return out

    def verify(self, captions: Sequence[str]) -> None:
        """Alternate rows of ``captions`` dropped equal ``te_align.encode`` with every slot dropped, bit for bit,
        and ``te_align.encode(drop=...)`` (the empty prompt encoded inside the batch) to float32 rounding."""
        import te_align

        torch = self._torch
        flags = [i % 2 == 0 for i in range(len(captions))]
        kw = {"tokenizers": self._components, "text_encoders": self._components}
        base = te_align.encode(self.profile, list(captions), **kw)
        exact = te_align.encode(self.profile, list(captions), drop_slots=self._all_slots(flags), **kw)
        whole = te_align.encode(self.profile, list(captions), drop=flags, **kw)
        got = self.apply({k: v for k, v in base.items() if k not in base.shared}, torch.tensor(flags))
        for k in got:
            if not torch.equal(got[k], exact[k]):
                raise AssertionError(f"CaptionDropout: dropped captions differ from te_align.encode on {k}")
            if not torch.allclose(got[k], whole[k], rtol=1e-5, atol=1e-5):
                raise AssertionError(
                    f"CaptionDropout: dropped captions differ from te_align.encode(drop=...) on {k}"
                )


# --------------------------------------------------------------------------------------------------
# the transformer
# --------------------------------------------------------------------------------------------------


def _transformer_config(cfg: PretrainConfig, joint_dim: int, pooled_dim: int) -> dict[str, Any]:
    if cfg.width % cfg.head_dim:
        raise ValueError(f"PretrainConfig.width: {cfg.width} is not a multiple of head_dim {cfg.head_dim}")
    return {
        "sample_size": cfg.latent_size,
        "patch_size": cfg.patch_size,
        "in_channels": cfg.latent_channels,
        "out_channels": cfg.latent_channels,
        "num_layers": cfg.layers,
        "attention_head_dim": cfg.head_dim,
        "num_attention_heads": cfg.width // cfg.head_dim,
        "joint_attention_dim": joint_dim,
        "caption_projection_dim": cfg.width,
        "pooled_projection_dim": pooled_dim,
        "pos_embed_max_size": cfg.latent_size // cfg.patch_size,
    }


def _rope_axes(head_dim: int) -> tuple[int, int, int]:
    """Flux's rotary axes (index, row, column) scaled from (16, 56, 56) of 128 to ``head_dim``; each even."""
    first = max(2, 2 * round(head_dim / 16))
    second = (head_dim - first) // 4 * 2
    return (first, second, head_dim - first - second)


def _packed_blocks(cfg: PretrainConfig, joint_dim: int, name: str) -> dict[str, Any]:
    """The double- and single-stream blocks Flux and Chroma share, on 2 x 2 packed latents."""
    if cfg.width % cfg.head_dim:
        raise ValueError(f"PretrainConfig.width: {cfg.width} is not a multiple of head_dim {cfg.head_dim}")
    if cfg.latent_size % 2:
        raise ValueError(
            f"PretrainConfig: {name} packs 2 x 2 latent patches; latent size {cfg.latent_size} is odd"
        )
    return {
        "patch_size": 1,
        "in_channels": 4 * cfg.latent_channels,  # 2 x 2 packed latents
        "num_layers": cfg.layers,
        "num_single_layers": cfg.single_layers,
        "attention_head_dim": cfg.head_dim,
        "num_attention_heads": cfg.width // cfg.head_dim,
        "joint_attention_dim": joint_dim,
        "axes_dims_rope": _rope_axes(cfg.head_dim),
    }


def _flux_config(cfg: PretrainConfig, joint_dim: int, pooled_dim: int) -> dict[str, Any]:
    return {
        **_packed_blocks(cfg, joint_dim, "Flux"),
        "pooled_projection_dim": pooled_dim,
        "guidance_embeds": False,  # flux-schnell: no guidance distillation to learn from scratch
    }


def _chroma_config(cfg: PretrainConfig, joint_dim: int) -> dict[str, Any]:
    """``ChromaTransformer2DModel``'s arguments: Flux's blocks (:func:`_packed_blocks`, no pooled vector or
    guidance embedding: Chroma has neither) and the approximator that computes every block's modulation
    (diffusers 0.42.1 models/transformers/transformer_chroma.py:401-431)."""
    return {
        **_packed_blocks(cfg, joint_dim, "Chroma"),
        # Chroma's 64 input channels: 16 timestep + 16 (zero) guidance + 32 row-index frequencies
        # (transformer_chroma.py:151-180); a frequency embedding, independent of the model's width
        "approximator_num_channels": 64,
        "approximator_hidden_dim": cfg.approximator_hidden_dim,
        "approximator_layers": cfg.approximator_layers,
    }


def _unet_config(cfg: PretrainConfig, joint_dim: int, pooled_dim: int) -> dict[str, Any]:
    n = len(cfg.unet_channels)
    bad = [c for c in cfg.unet_channels if c % cfg.head_dim]
    if bad or n < 2:
        raise ValueError(
            f"PretrainConfig.unet_channels: expected 2 or more multiples of head_dim {cfg.head_dim}, got {cfg.unet_channels}"
        )
    if cfg.family == "sd15":
        # SD 1.5's layout: cross-attention at every resolution but the lowest, no added embedding
        return {
            "sample_size": cfg.latent_size, "in_channels": cfg.latent_channels, "out_channels": cfg.latent_channels,
            "layers_per_block": cfg.unet_layers_per_block, "block_out_channels": list(cfg.unet_channels),
            "down_block_types": ["CrossAttnDownBlock2D"] * (n - 1) + ["DownBlock2D"],
            "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * (n - 1),
            "attention_head_dim": [c // cfg.head_dim for c in cfg.unet_channels], "cross_attention_dim": joint_dim,
            "norm_num_groups": 8,
        }  # fmt: skip
    every = cfg.unet_cross_attention == "all"
    return {
        "sample_size": cfg.latent_size,
        "in_channels": cfg.latent_channels,
        "out_channels": cfg.latent_channels,
        "layers_per_block": cfg.unet_layers_per_block,
        "block_out_channels": list(cfg.unet_channels),
        # SDXL's layout: no attention at full resolution, cross-attention below ("all": at full resolution too)
        "down_block_types": ["DownBlock2D" if k == 0 and not every else "CrossAttnDownBlock2D" for k in range(n)],
        "up_block_types": ["UpBlock2D" if k == n - 1 and not every else "CrossAttnUpBlock2D" for k in range(n)],
        # diffusers' UNet reads attention_head_dim as the number of heads
        "attention_head_dim": [c // cfg.head_dim for c in cfg.unet_channels],
        "cross_attention_dim": joint_dim,  # CLIP-L hidden + CLIP-G hidden
        "use_linear_projection": True,
        "norm_num_groups": 8,
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": cfg.time_embed_dim,
        "projection_class_embeddings_input_dim": 6 * cfg.time_embed_dim + pooled_dim,
    }


def new_transformer(cfg: PretrainConfig, joint_dim: int, pooled_dim: int) -> Any:
    """A fresh denoiser of ``cfg.family`` (SD3 / Flux / Chroma transformer, SDXL / SD 1.5 UNet) reading the
    given text widths (``pooled_dim`` is ignored by chroma, which has no pooled vector)."""
    import diffusers

    family_spec(cfg.family)
    with _rng(cfg.seed * 1000 + 3):
        if cfg.family == "flux":
            return diffusers.FluxTransformer2DModel(**_flux_config(cfg, joint_dim, pooled_dim))
        if cfg.family == "chroma":
            return diffusers.ChromaTransformer2DModel(**_chroma_config(cfg, joint_dim))
        if cfg.family == KLEIN:
            from te_align.tiny.klein import klein_transformer

            return klein_transformer(seed=cfg.seed * 1000 + 3, **_klein_changes(cfg, joint_dim))
        if cfg.family in EPS_FAMILIES:
            return diffusers.UNet2DConditionModel(**_unet_config(cfg, joint_dim, pooled_dim))
        return diffusers.SD3Transformer2DModel(**_transformer_config(cfg, joint_dim, pooled_dim))


new_denoiser = new_transformer


def _klein_changes(cfg: PretrainConfig, joint_dim: int) -> dict[str, Any]:
    """What ``cfg`` changes in :data:`te_align.tiny.klein.KLEIN_TRANSFORMER` (nothing for klein's own configuration
    and the tiny encoder's 3 x 32 text width): the blocks, the heads, the 2 x 2 patchified latent channels, the
    text width; the four RoPE axes (t, h, w, l) stay equal and sum to the head width."""
    from te_align.tiny.klein import KLEIN_TRANSFORMER

    if cfg.width % cfg.head_dim or cfg.head_dim % 8:
        raise ValueError(f"PretrainConfig: klein needs width a multiple of head_dim and head_dim of 8 ({cfg.width}, {cfg.head_dim})")
    wanted = {
        "in_channels": 4 * cfg.latent_channels,  # _patchify_latents: 2 x 2 patches into channels
        "num_layers": cfg.layers,
        "num_single_layers": cfg.single_layers,
        "attention_head_dim": cfg.head_dim,
        "num_attention_heads": cfg.width // cfg.head_dim,
        "joint_attention_dim": joint_dim,
        "axes_dims_rope": (cfg.head_dim // 4,) * 4,
    }
    return {k: v for k, v in wanted.items() if v != KLEIN_TRANSFORMER[k]}


def sdxl_time_ids(cfg: PretrainConfig) -> tuple[int, ...]:
    """SDXL's six time ids at the tiny resolution: original size, crop top-left (0, 0), target size.

    What ``StableDiffusionXLPipeline`` computes by default at ``cfg.image_size`` (``original_size`` and
    ``target_size`` default to the output size, ``crops_coords_top_left`` to (0, 0)).
    """
    size = cfg.image_size
    return (size, size, 0, 0, size, size)


@functools.cache
def _ddpm_schedule() -> Any:
    """SDXL's training noise schedule (scaled-linear betas 0.00085 .. 0.012 over 1000 steps)."""
    import diffusers

    return diffusers.DDPMScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        prediction_type="epsilon", clip_sample=False,
    )  # fmt: skip


def training_loss(
    cfg: PretrainConfig, model: Any, x0: Any, rows: dict[str, Any], shared: dict[str, Any], gen: Any
) -> Any:
    """One batch's loss for ``cfg.family``; ``t`` / timesteps and noise are drawn from ``gen`` in that order.

    * sd3: rectified flow, ``x_t = (1 - t) x_0 + t e``, logit-normal ``t``, the transformer fed ``1000 t``,
      MSE to ``e - x_0``.
    * flux: the same flow on 2 x 2 packed latents (``FluxPipeline._pack_latents``) with the pipeline's image
      ids and the profile's text ids, the transformer fed ``t``; MSE to the packed ``e - x_0``.
    * chroma: as flux (``ChromaPipeline``'s packing and image ids), no pooled vector, and the profile's
      ``prompt_attention_mask`` extended to the image tokens as the pipeline extends it (:func:`_denoise`).
    * klein: the same flow on the patchified, BatchNorm-normalised latents (:func:`encode_latents`), packed by
      ``Flux2KleinPipeline._pack_latents`` into tokens; MSE to the packed ``e - x_0``.
    * sdxl: epsilon prediction, ``x_t = sqrt(a_t) x_0 + sqrt(1 - a_t) e`` on SDXL's scaled-linear schedule,
      uniform integer timesteps in [0, 1000), time ids :func:`sdxl_time_ids`; MSE to ``e``.
    * sd15: the same epsilon prediction on the same schedule (SD 1.5's), no time ids or pooled vector.

    The random numbers are drawn on the CPU (``gen``) and moved to ``x0``'s device, so a CUDA run draws the
    same ``t`` and noise as a CPU run.
    """
    import torch

    n = x0.shape[0]
    dev = x0.device
    if cfg.family in EPS_FAMILIES:
        sched = _ddpm_schedule()
        timesteps = torch.randint(0, sched.config.num_train_timesteps, (n,), generator=gen).to(dev, non_blocking=True)
        noise = torch.randn(x0.shape, generator=gen).to(dev, non_blocking=True)
        abar = sched.alphas_cumprod.to(dev)[timesteps].view(-1, 1, 1, 1)
        xt = abar**0.5 * x0 + (1 - abar) ** 0.5 * noise  # DDPMScheduler.add_noise's arithmetic
        return torch.nn.functional.mse_loss(_denoise(cfg, model, xt, timesteps, rows, shared).float(), noise)
    t = torch.sigmoid(cfg.logit_mean + cfg.logit_std * torch.randn(n, generator=gen)).to(dev, non_blocking=True)
    noise = torch.randn(x0.shape, generator=gen).to(dev, non_blocking=True)
    tt = t.view(-1, 1, 1, 1)
    xt = (1 - tt) * x0 + tt * noise
    pred = _denoise(cfg, model, xt, t, rows, shared)
    if cfg.family == KLEIN:  # x0 is patchified (N, 4 C, H / 2, W / 2); the transformer reads and returns it packed
        import diffusers

        return torch.nn.functional.mse_loss(pred.float(), diffusers.Flux2KleinPipeline._pack_latents(noise - x0))
    if cfg.family in PACKED_FAMILIES:
        import diffusers

        b, c, h, w = x0.shape
        pipe_cls = getattr(diffusers, family_spec(cfg.family).pipeline)
        return torch.nn.functional.mse_loss(pred.float(), pipe_cls._pack_latents(noise - x0, b, c, h, w))
    return torch.nn.functional.mse_loss(pred.float(), noise - x0)


def _denoise(cfg: PretrainConfig, model: Any, xt: Any, t: Any, rows: dict[str, Any], shared: dict[str, Any]) -> Any:
    """``cfg.family``'s denoiser output for the noised latents ``xt``, called as the pipeline calls it.

    ``t``: sdxl integer timesteps (the output is epsilon, time ids :func:`sdxl_time_ids`); sd3 flow time in
    [0, 1], fed as ``1000 t`` (velocity); flux flow time fed as it is, on 2 x 2 packed latents with the
    pipeline's image ids and the profile's text ids (packed velocity); chroma as flux, without a pooled vector
    and with ``attention_mask``: the profile's ``prompt_attention_mask`` (every real token and one padding
    token, in the embeddings' dtype) followed by ones for the image tokens, made by
    ``ChromaPipeline._prepare_attention_mask`` as ``ChromaPipeline.__call__`` makes it (diffusers 0.42.1
    pipelines/chroma/pipeline_chroma.py:545-561, 787-792, 858-866).
    """
    import torch

    n = xt.shape[0]
    if cfg.family == "sd15":
        return model(xt, t, encoder_hidden_states=rows["prompt_embeds"], return_dict=False)[0]
    if cfg.family == "sdxl":
        time_ids = torch.tensor([sdxl_time_ids(cfg)], dtype=xt.dtype, device=xt.device).expand(n, 6)
        return model(
            xt, t, encoder_hidden_states=rows["prompt_embeds"],
            added_cond_kwargs={"text_embeds": rows["pooled_prompt_embeds"], "time_ids": time_ids}, return_dict=False,
        )[0]  # fmt: skip
    if cfg.family == "chroma":
        import diffusers

        chroma = diffusers.ChromaPipeline
        b, c, h, w = xt.shape
        # _prepare_attention_mask reads nothing from the pipeline instance (pipeline_chroma.py:545-561)
        mask = chroma._prepare_attention_mask(
            None,
            batch_size=b,
            sequence_length=(h // 2) * (w // 2),
            dtype=xt.dtype,
            attention_mask=rows["prompt_attention_mask"],
        )
        return model(
            hidden_states=chroma._pack_latents(xt, b, c, h, w),
            timestep=t,
            encoder_hidden_states=rows["prompt_embeds"],
            txt_ids=shared["text_ids"],
            img_ids=chroma._prepare_latent_image_ids(b, h // 2, w // 2, xt.device, xt.dtype),
            attention_mask=mask,
            return_dict=False,
        )[0]
    if cfg.family == KLEIN:
        import diffusers

        klein = diffusers.Flux2KleinPipeline
        # Flux2KleinPipeline.__call__ (diffusers 0.42.1 pipeline_flux2_klein.py:841-856): packed latents, the
        # timestep / 1000 (= t), no guidance, _prepare_latent_ids' image ids, the prompt's text ids
        return model(
            hidden_states=klein._pack_latents(xt), timestep=t, guidance=None, encoder_hidden_states=rows["prompt_embeds"],
            txt_ids=shared["text_ids"], img_ids=klein._prepare_latent_ids(xt).to(xt.device), return_dict=False,
        )[0]  # fmt: skip
    if cfg.family == "flux":
        import diffusers

        pipe_cls = diffusers.FluxPipeline
        b, c, h, w = xt.shape
        return model(
            hidden_states=pipe_cls._pack_latents(xt, b, c, h, w), timestep=t, guidance=None,
            pooled_projections=rows["pooled_prompt_embeds"], encoder_hidden_states=rows["prompt_embeds"],
            txt_ids=shared["text_ids"], img_ids=pipe_cls._prepare_latent_image_ids(b, h // 2, w // 2, xt.device, xt.dtype),
            return_dict=False,
        )[0]  # fmt: skip
    return model(
        hidden_states=xt, encoder_hidden_states=rows["prompt_embeds"], pooled_projections=rows["pooled_prompt_embeds"],
        timestep=t * 1000, return_dict=False,
    )[0]  # fmt: skip


def _batch_indices(cfg: PretrainConfig, step: int, n: int, pool: Any) -> Any:
    """The training rows of ``step``: a fresh permutation of ``pool`` (all rows, or the curriculum's) per epoch."""
    import torch

    m = len(pool)
    epoch, pos = divmod(step * cfg.batch, m)
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(cfg.seed * 7 + epoch))
    idx = perm[torch.arange(pos, pos + cfg.batch) % m]
    return idx if m == n else pool[idx]


def train_transformer(
    cfg: PretrainConfig,
    latents: Any,
    table: ConditioningTable,
    dropout: SlotDropout,
    *,
    transformer: Any = None,
    start_step: int = 0,
    stop_step: int | None = None,
    ema: Any = None,
    optimizer_state: dict[str, Any] | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
    captions: CaptionDropout | None = None,
    styles: Sequence[str] | None = None,
    device: Any = None,
) -> dict[str, Any]:
    """Training of ``cfg.family``'s denoiser (``transformer``: also a UNet) on ``latents`` with ``table``.

    Each step draws a batch (a fresh permutation per epoch), per-slot dropout flags, whole-caption
    dropout flags (``captions``; only when its rate is above 0), then :func:`training_loss`'s ``t`` /
    timesteps and Gaussian noise, all from CPU generators seeded by ``cfg.seed`` and the step, so
    that training can be stopped at ``stop_step`` and resumed (``transformer``, ``ema``,
    ``optimizer_state``, ``start_step``) with the same result as one uninterrupted run.
    ``styles`` (each row's caption style) is needed by ``cfg.curriculum_tags_steps``: the steps before it
    draw only rows with tag captions. ``device`` (default CPU): where the denoiser, ``latents`` and
    ``table`` live; on CUDA the forward and backward run under bf16 autocast and a step waits on the GPU
    only at the logging interval. Returns ``{"transformer", "ema", "optimizer_state", "step"}``.
    """
    import torch

    if captions is None and cfg.caption_dropout_rate > 0:
        raise ValueError(
            f"train_transformer: family {cfg.family} drops {cfg.caption_dropout_rate:.0%} of captions; pass "
            "captions=CaptionDropout(...) (prepare() builds it)"
        )
    dev = torch.device(device) if device is not None else latents.device
    pe = table.tensors["prompt_embeds"]
    pooled = table.tensors.get("pooled_prompt_embeds")
    if transformer is None:
        transformer = new_transformer(cfg, pe.shape[-1], 0 if pooled is None else pooled.shape[-1])
    transformer.to(dev)
    if ema is None:
        ema = copy.deepcopy(transformer).eval().requires_grad_(False)
    ema.to(dev)
    params = [p for p in transformer.parameters() if p.requires_grad]
    ema_params = list(ema.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state)
    n = latents.shape[0]
    everything = torch.arange(n)
    tags = everything
    if cfg.curriculum_tags_steps > 0:
        if styles is None or len(styles) != n:
            raise ValueError("train_transformer: curriculum_tags_steps needs the caption style of every row (styles=)")
        tags = torch.tensor([i for i, st in enumerate(styles) if st == "tags"], dtype=torch.long)
    stop = cfg.steps if stop_step is None else min(stop_step, cfg.steps)
    autocast = (
        torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()
    )
    dropout.to(dev)
    if captions is not None:
        captions.to(dev)
    transformer.train()
    t0 = time.perf_counter()
    for step in range(start_step, stop):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 * step + 11)
        idx = _batch_indices(cfg, step, n, tags if step < cfg.curriculum_tags_steps else everything)
        didx = idx.to(latents.device, non_blocking=True)
        x0 = latents[didx].to(dev, non_blocking=True)
        rows = {k: v.to(dev, non_blocking=True) for k, v in table.rows(didx).items()}
        shared = {k: v.to(dev, non_blocking=True) for k, v in table.shared.items()}
        rows = dropout.apply(rows, {k: f.to(dev, non_blocking=True) for k, f in dropout.sample(cfg.batch, gen).items()})
        if captions is not None and captions.rate > 0:
            rows = captions.apply(rows, captions.sample(cfg.batch, gen).to(dev, non_blocking=True))
        with autocast:
            loss = training_loss(cfg, transformer, x0, rows, shared, gen)
        lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        decay = min(cfg.ema_decay, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, [p.detach() for p in transformer.parameters()], 1 - decay)
        if log is not None and (step + 1) % 50 == 0:
            log({"phase": "transformer", "step": step + 1, "loss": loss.item(), "grad_norm": float(gnorm), "lr": lr,
                 "seconds": time.perf_counter() - t0})  # fmt: skip
    transformer.eval()
    return {"transformer": transformer, "ema": ema, "optimizer_state": opt.state_dict(), "step": stop}


# --------------------------------------------------------------------------------------------------
# the pipeline
# --------------------------------------------------------------------------------------------------


def sdxl_scheduler() -> Any:
    """SDXL base's sampling scheduler (stabilityai/stable-diffusion-xl-base-1.0 scheduler/scheduler_config.json)."""
    import diffusers

    return diffusers.EulerDiscreteScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        prediction_type="epsilon", interpolation_type="linear", use_karras_sigmas=False, steps_offset=1,
        timestep_spacing="leading",
    )  # fmt: skip


def sd15_scheduler() -> Any:
    """SD 1.5's sampling scheduler (runwayml/stable-diffusion-v1-5 scheduler/scheduler_config.json: PNDM)."""
    import diffusers

    return diffusers.PNDMScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        skip_prk_steps=True, set_alpha_to_one=False, steps_offset=1, prediction_type="epsilon",
    )  # fmt: skip


def build_pipeline(
    transformer: Any, vae: Any, cfg: PretrainConfig, components: dict[str, Any] | None = None
) -> Any:
    """The official pipeline of ``cfg.family`` around the pretrained parts and the tiny frozen text encoders.

    ``transformer`` is the denoiser (the SDXL and SD 1.5 families' UNet). Schedulers: SD3 flow matching with
    ``cfg.scheduler_shift``; Flux-schnell's (shift ``cfg.scheduler_shift``, no dynamic shifting), the same for
    Chroma; SDXL's Euler (:func:`sdxl_scheduler`); SD 1.5's PNDM (:func:`sd15_scheduler`).
    """
    import diffusers

    components = components or _components(cfg.family, cfg.encoders)
    if cfg.family == KLEIN:  # Flux2KleinPipeline(is_distilled=False): true CFG against the encoded empty prompt
        from te_align.tiny.klein import build_klein_pipeline

        return build_klein_pipeline(
            text_encoder=components["text_encoder"], transformer=transformer, vae=vae, tokenizer=components["tokenizer"]
        )
    if cfg.family in PACKED_FAMILIES:
        scheduler = diffusers.FlowMatchEulerDiscreteScheduler(
            shift=cfg.scheduler_shift, use_dynamic_shifting=False, base_image_seq_len=256, max_image_seq_len=4096,
            base_shift=0.5, max_shift=1.15,
        )  # fmt: skip
        pipe_cls = getattr(diffusers, family_spec(cfg.family).pipeline)
        pipe = pipe_cls(transformer=transformer, vae=vae, scheduler=scheduler, **components)
    elif cfg.family == "sdxl":
        pipe = diffusers.StableDiffusionXLPipeline(
            unet=transformer, vae=family_vae(cfg, vae), scheduler=sdxl_scheduler(), add_watermarker=False,
            force_zeros_for_empty_prompt=True, **components,
        )  # fmt: skip
    elif cfg.family == "sd15":
        pipe = diffusers.StableDiffusionPipeline(
            unet=transformer, vae=family_vae(cfg, vae), scheduler=sd15_scheduler(), safety_checker=None,
            feature_extractor=None, requires_safety_checker=False, **components,
        )  # fmt: skip
    else:
        family_spec(cfg.family)
        pipe = diffusers.StableDiffusion3Pipeline(
            transformer=transformer, vae=vae, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=cfg.scheduler_shift),
            **components,
        )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_family(pipe: Any) -> str:
    """The :data:`FAMILIES` key of a pipeline (by its class)."""
    name = type(pipe).__name__
    for spec in FAMILIES.values():
        if spec.pipeline == name:
            return spec.name
    raise ValueError(
        f"evaluate_pipeline: a {name} is none of {', '.join(s.pipeline for s in FAMILIES.values())}"
    )


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------


def heldout_set(
    n: int, seed: int = 10_000, style: str | None = None, concept: Any = None, space: Any = None
) -> list[Any]:
    """``n`` world samples from a stream the training set never draws from (``seed`` differs), no empty captions.

    ``style`` (tags, short, long) fixes the caption style; default the world's mix. With ``concept``
    (a :class:`te_align.tiny.world.Concept`) the scenes never show it, as the base model's data.
    """
    from te_align.tiny import world

    mix = {style: 1.0} if style else None
    split = "base" if concept is not None else "all"
    return world.make_dataset(
        n, seed, image_size=None, style_mix=mix, split=split, concept=concept, space=space or world.SPACE
    )


def evaluate_pipeline(
    pipe: Any,
    samples: Sequence[Any],
    *,
    steps: int = 16,
    guidance: float = 4.0,
    seed: int = 0,
    batch: int = 16,
    shift: float | None = None,
) -> dict[str, Any]:
    """Sample each caption once with ``pipe`` (seed ``seed + i``) and read the images back.

    The call per family (its official pipeline, at the VAE's ``sample_size``):

    * StableDiffusion3Pipeline: classifier-free guidance ``guidance`` with the encoded empty negative prompt.
    * FluxPipeline: true classifier-free guidance (``true_cfg_scale=guidance``, ``negative_prompt=""``) and
      ``max_sequence_length`` = the profile's T5 length (flux-schnell: 256; the pipeline's default is 512).
    * ChromaPipeline: true classifier-free guidance, which it calls ``guidance_scale`` (against
      ``negative_prompt=""``), and ``max_sequence_length`` = the fitted profile's T5 length (256).
    * Flux2KleinPipeline (``is_distilled=False``): true classifier-free guidance ``guidance_scale`` against the
      encoded empty prompt (the pipeline's fixed negative), ``max_sequence_length`` = the profile's Qwen3 window (512).
    * StableDiffusionXLPipeline: classifier-free guidance ``guidance`` with zeros as the negative
      (``force_zeros_for_empty_prompt``, no negative prompt passed); ``shift`` does not apply.

    Returns pooled object accuracy, per-attribute accuracy and image accuracy over all samples, per
    caption style, and (families with a T5) over objects described inside T5's window (long captions
    can be cut).
    """
    import diffusers
    import torch

    from te_align.tiny import world

    family = pipeline_family(pipe)
    profile = fitted_profile(family)
    if shift is not None:
        if family in EPS_FAMILIES:
            raise ValueError(f"evaluate_pipeline: shift applies to the flow-matching families, not {family}")
        pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
            pipe.scheduler.config, shift=shift
        )
    t5 = next((s for s in profile.slots if s.name == "t5"), None)
    images: list[np.ndarray] = []
    for i in range(0, len(samples), batch):
        chunk = samples[i : i + batch]
        gens = [torch.Generator().manual_seed(seed + i + j) for j in range(len(chunk))]
        prompts = [s.caption for s in chunk]
        if family == "flux":
            size = pipe.vae.config.sample_size
            assert t5 is not None
            out = pipe(
                prompt=prompts, negative_prompt=[""] * len(chunk), true_cfg_scale=guidance, height=size, width=size,
                max_sequence_length=t5.tokenizer.max_length, num_inference_steps=steps, generator=gens, output_type="np",
            ).images  # fmt: skip
        elif family == KLEIN:
            # guidance_scale is true CFG against "" (is_distilled=False); the first positional argument is `image`
            size = pipe.vae.config.sample_size
            out = pipe(
                prompt=prompts, guidance_scale=guidance, height=size, width=size,
                max_sequence_length=profile.slots[0].tokenizer.max_length, num_inference_steps=steps, generator=gens,
                output_type="np",
            ).images  # fmt: skip
        elif family == "chroma":
            size = pipe.vae.config.sample_size
            assert t5 is not None
            out = pipe(
                prompt=prompts,
                negative_prompt=[""] * len(chunk),
                guidance_scale=guidance,
                height=size,
                width=size,
                max_sequence_length=t5.tokenizer.max_length,
                num_inference_steps=steps,
                generator=gens,
                output_type="np",
            ).images
        else:
            out = pipe(
                prompt=prompts, num_inference_steps=steps, guidance_scale=guidance, generator=gens, output_type="np",
            ).images  # fmt: skip
        images += [np.clip(np.rint(im * 255), 0, 255).astype(np.uint8) for im in out]
    result: dict[str, Any] = {"all": world.evaluate(images, [s.scene for s in samples])}
    for style in sorted({s.style for s in samples}):
        sel = [k for k, s in enumerate(samples) if s.style == style]
        result[style] = world.evaluate([images[k] for k in sel], [samples[k].scene for k in sel])
    vis = visible(profile, samples)
    sel = [k for k, v in enumerate(vis) if v]
    result["visible"] = world.evaluate([images[k] for k in sel], [samples[k].scene for k in sel]) if sel else {}
    result["visible"]["prompts"] = float(len(sel))
    result["images"] = images
    return result


def visible(profile: Any, samples: Sequence[Any]) -> list[bool]:
    """Per sample: is every object described inside the conditioning window of some slot of ``profile``?

    A slot sees the tokens its tokenizer keeps (``max_length``, the end-of-text token taking the last place);
    an object whose description ends after that is cut from that slot's conditioning. Objects cut from every
    slot cannot be drawn by any model of the family (SDXL's and SD 1.5's CLIP windows are 77 tokens, SD3's,
    Flux's and Chroma's T5 window 256 tiny-T5 tokens).
    """
    from te_align.tiny import tokenizers, world

    def tokenizer(cls: str) -> Any:
        if cls == "CLIPTokenizer":
            return tokenizers.clip_tokenizer()
        return tokenizers.qwen3_instruct_tokenizer() if cls == "Qwen2TokenizerFast" else tokenizers.t5_tokenizer()

    toks = {slot.name: tokenizer(slot.tokenizer.cls) for slot in profile.slots}
    # a chat template (klein's Qwen3) puts tokens before the prompt and ends with the generation prompt, which
    # truncation cuts first: the prompt's tokens see max_length minus the prefix
    prefix = {slot.name: _template_prefix(toks[slot.name]) if slot.tokenizer.cls == "Qwen2TokenizerFast" else 0
              for slot in profile.slots}  # fmt: skip
    out = []
    for s in samples:
        spans = [(sp.char_start, sp.char_end) for sp in s.spans]
        ok = [False] * len(spans)
        for slot in profile.slots:
            tok = toks[slot.name]
            _, got = world.token_spans(tok, s.caption, spans)
            limit = slot.tokenizer.max_length - 1 if not prefix[slot.name] else slot.tokenizer.max_length - prefix[slot.name]
            ok = [o or (g.token_end <= limit) for o, g in zip(ok, got, strict=True)]
        out.append(all(ok))
    return out


def _template_prefix(tok: Any) -> int:
    """How many tokens a chat template puts before the user's prompt (Qwen3's ``<|im_start|>user\\n``: 3)."""
    text = tok.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)  # fmt: skip
    return len(tok(text[: text.index("\x00")], add_special_tokens=False)["input_ids"])


def profile_family(profile: Any) -> str:
    """The :data:`FAMILIES` key whose bundled profile ``profile`` is (fitted or not)."""
    for spec in FAMILIES.values():
        if spec.profile == profile.name:
            return spec.name
    raise ValueError(f"no world family is pretrained with profile {profile.name}")


# --------------------------------------------------------------------------------------------------
# the whole recipe
# --------------------------------------------------------------------------------------------------


@dataclass
class PretrainResult:
    pipeline: Any
    log: list[dict[str, Any]]
    state: dict[str, Any]


def _table_key(cfg: PretrainConfig, components: dict[str, Any], captions: Sequence[str]) -> str:
    """What decides the encoded captions: the family (its profile), every text encoder's weights, the captions."""
    import hashlib

    import torch

    h = hashlib.sha256(cfg.family.encode())
    for name in sorted(components):
        module = components[name]
        if isinstance(module, torch.nn.Module):
            for k, v in sorted(module.state_dict().items()):
                h.update(f"{name}.{k}".encode())
                h.update(v.detach().contiguous().numpy().tobytes())
    for c in captions:
        h.update(c.encode() + b"\x00")
    return h.hexdigest()[:24]


def prepare(
    cfg: PretrainConfig,
    log: Callable[[dict[str, Any]], None],
    *,
    vae_callback: Callable[[int, Any], None] | None = None,
    vae_callback_every: int = 0,
    vae: Any = None,
    cond_cache: str | Path | None = None,
) -> dict[str, Any]:
    """Data, VAE, latents, cached conditioning and the verified slot and caption dropout for ``cfg``.

    ``cond_cache``: a folder where the encoded captions are kept between runs (keyed by the family, the encoders'
    weights and every caption; a hit is the same tensors, so it changes nothing but time).
    ``vae_callback`` / ``vae_callback_every`` are passed to :func:`train_vae` (periodic evaluation).
    ``vae``: an autoencoder trained earlier by :func:`train_vae` (reused instead of training one; any
    family's: the recipe is the same, :func:`family_vae` adapts it). The autoencoder sees the whole
    world; the denoiser's data never shows ``cfg.held_out``.
    """
    from te_align.tiny import world

    t0 = time.perf_counter()
    concept = cfg.concept()
    train = world.make_dataset(
        cfg.train_size, cfg.seed, image_size=cfg.image_size, tokenizer=False, style_mix=cfg.style_mix,
        split="base" if concept is not None else "all", concept=concept, space=cfg.space,
    )  # fmt: skip
    log({"phase": "data", "samples": len(train), "seconds": time.perf_counter() - t0})
    t0 = time.perf_counter()
    if vae is None:
        vae_data = train if concept is None else world.make_dataset(
            cfg.train_size, cfg.seed, image_size=cfg.image_size, tokenizer=False, style_mix=cfg.style_mix
        )  # fmt: skip
        vae = train_vae(
            cfg, [s.image for s in vae_data], log, callback=vae_callback, callback_every=vae_callback_every
        )
    vae = klein_family_vae(cfg, vae, log) if cfg.family == KLEIN else family_vae(cfg, vae)
    _round_to_half(vae)  # shipped in float16: the latents are those of the shipped autoencoder
    log({"phase": "vae_done", "seconds": time.perf_counter() - t0, "shift_factor": vae.config.get("shift_factor"),
         "scaling_factor": vae.config.get("scaling_factor")})  # fmt: skip
    latents = encode_latents(vae, [s.image for s in train])
    profile = fitted_profile(cfg.family)
    components = _components(cfg.family, cfg.encoders)
    for enc in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        if enc in components:
            components[enc].requires_grad_(False)
    if cfg.family == KLEIN:  # a klein encoder set must have the tiny klein encoder's shape (the fitted profile's)
        import te_align
        from te_align.tiny.fit import architecture_overrides

        got = architecture_overrides(te_align.profile(cfg.spec.profile), components)
        if got != _klein_overrides():
            raise ValueError(f"prepare: the klein text encoder of {cfg.encoders or 'the tiny random set'} does not have "
                             f"the tiny klein encoder's shape: {got} != {_klein_overrides()}")  # fmt: skip
    t0 = time.perf_counter()
    captions_ = [s.caption for s in train]
    key = _table_key(cfg, components, captions_) if cond_cache else ""
    path = Path(cond_cache) / f"{key}.pt" if cond_cache else None
    if path is not None and path.is_file():
        import torch

        saved = torch.load(path, weights_only=True)
        table = ConditioningTable(saved["tensors"], captions_, saved["shared"])
        log({"phase": "encode", "captions": len(train), "seconds": time.perf_counter() - t0, "cached": str(path)})
    else:
        table = encode_captions(profile, components, captions_, cfg.encode_batch)
        log({"phase": "encode", "captions": len(train), "seconds": time.perf_counter() - t0})
        if path is not None:
            import torch

            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            torch.save({"tensors": table.tensors, "shared": table.shared}, tmp)
            tmp.replace(path)
    dropout = SlotDropout(profile, components, [s.caption for s in train[:8]])
    dropout.verify([s.caption for s in train[8:12]] + [""])
    captions = CaptionDropout(profile, components, cfg.caption_dropout_rate)
    captions.verify([s.caption for s in train[8:12]] + [""])
    return {"train": train, "vae": vae, "latents": latents, "profile": profile, "components": components, "table": table,
            "dropout": dropout, "captions": captions}  # fmt: skip


def pretrain(
    cfg: PretrainConfig,
    out_dir: str | Path | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> PretrainResult:
    """Pretrain the VAE and the denoiser of ``cfg`` and (with ``out_dir``) save ``cfg.family``'s pipeline there."""
    records: list[dict[str, Any]] = []

    def _log(r: dict[str, Any]) -> None:
        records.append(r)
        logger.info("%s", r)
        if log is not None:
            log(r)

    prep = prepare(cfg, _log)
    state = train_transformer(
        cfg, prep["latents"], prep["table"], prep["dropout"], log=_log, captions=prep["captions"]
    )
    pipe = build_pipeline(state["ema"], prep["vae"], cfg, prep["components"])
    if out_dir is not None:
        pipe.save_pretrained(str(out_dir), safe_serialization=True)
    return PretrainResult(pipe, records, {**state, **prep})
