"""Pretraining a tiny SD3-shaped base model on the shapes world with exactly the sd35-large conditioning.

A base model that was trained with *one* conditioning recipe is what makes "alignment" measurable: a
LoRA trained with a deviating recipe can then be compared with one trained by the profile. This module
pretrains such a model from scratch, deterministically, on CPU:

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
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ConditioningTable",
    "PretrainConfig",
    "PretrainResult",
    "SlotDropout",
    "build_pipeline",
    "encode_captions",
    "evaluate_pipeline",
    "fitted_profile",
    "heldout_set",
    "model_sizes",
    "pretrain",
    "train_transformer",
    "train_vae",
    "vae_roundtrip_accuracy",
]

logger = logging.getLogger(__name__)

#: The bundled profile the SD3-shaped world model is pretrained with.
PROFILE = "sd35-large"
FAMILY = "sd3"


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that decides the pretrained weights (with the thread count and torch version).

    Defaults are the recipe chosen before the first run (see docs in the report): 32 px images, a VAE
    with one downsampling (16 x 16 x 4 latents) and a 4-block, 64-wide MMDiT with 2 x 2 patches (64 image
    tokens next to SD3's 77 + 256 text tokens).
    """

    seed: int = 0
    image_size: int = 32
    train_size: int = 10000
    # VAE
    vae_channels: tuple[int, ...] = (32, 64)
    latent_channels: int = 4
    vae_steps: int = 1500
    vae_batch: int = 32
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
        return d

    @property
    def latent_size(self) -> int:
        return self.image_size // 2 ** (len(self.vae_channels) - 1)


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


def fitted_profile() -> Any:
    """The bundled sd35-large profile with the tiny encoders' architecture numbers (behaviour unchanged)."""
    import te_align
    from te_align.tiny.fit import profile_overrides

    return te_align.profile(PROFILE).with_overrides(profile_overrides(FAMILY))


def model_sizes(pipe: Any) -> dict[str, dict[str, float]]:
    """Parameter count and fp16 megabytes (10^6 bytes) per component and in total."""
    out: dict[str, dict[str, float]] = {}
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
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
    """``(mean - shift) * scale`` of each image's posterior, as the denoiser is trained on."""
    import torch

    x_all = _images_to_tensor(images)
    with torch.no_grad():
        z = torch.cat(
            [vae.encode(x_all[i : i + batch]).latent_dist.mean for i in range(0, len(x_all), batch)]
        )
    return (z - vae.config.shift_factor) * vae.config.scaling_factor


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
    """The profile's conditioning of every caption (rows in caption order), computed once."""

    tensors: dict[str, Any]
    captions: list[str]

    def rows(self, idx: Any) -> dict[str, Any]:
        return {k: v[idx] for k, v in self.tensors.items()}


def _round_to_half(module: Any) -> None:
    """Round every parameter of ``module`` to the nearest float16 value, in place (dtype unchanged)."""
    import torch

    with torch.no_grad():
        for prm in module.parameters():
            prm.copy_(prm.half().to(prm.dtype))


def _components() -> dict[str, Any]:
    """The tiny frozen text encoders, their weights rounded to float16 values (kept in float32).

    A base model is shipped in float16; rounding before pretraining makes the shipped text encoders
    exactly the ones the denoiser was trained with, whatever ``transformers`` version initialises them.
    """
    import torch

    from te_align.tiny.encoders import family_components

    components = family_components(FAMILY)
    for module in components.values():
        if isinstance(module, torch.nn.Module):
            _round_to_half(module)
    return components


def encode_captions(
    profile: Any, components: dict[str, Any], captions: Sequence[str], batch: int = 64
) -> ConditioningTable:
    """Every caption encoded by ``te_align.encode`` (no dropout), batched; float32 as the pipeline encodes."""
    import torch

    import te_align

    parts: dict[str, list[Any]] = {}
    for i in range(0, len(captions), batch):
        cond = te_align.encode(
            profile, list(captions[i : i + batch]), tokenizers=components, text_encoders=components
        )
        for k, v in cond.items():
            parts.setdefault(k, []).append(v)
    return ConditioningTable({k: torch.cat(v) for k, v in parts.items()}, list(captions))


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
        if profile.empty_prompt != "encode":
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
        for k in full:
            overlap = sum(self.regions[s][k].int() for s in self.rates)
            if bool((overlap > 1).any()):
                raise ValueError(
                    f"SlotDropout: output {k} of profile {profile.name} mixes slots; cannot drop slots on cached rows"
                )
        empty = te_align.encode(profile, [""], tokenizers=components, text_encoders=components)
        self.empty = {k: v[0] for k, v in empty.items()}
        self._components = components
        self._torch = torch

    def sample(self, n: int, gen: Any) -> dict[str, Any]:
        """Independent per-slot flags (``n`` booleans per slot) drawn from ``gen``."""
        torch = self._torch
        return {slot: torch.rand(n, generator=gen) < rate for slot, rate in self.rates.items()}

    def apply(self, rows: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
        torch = self._torch
        out = {}
        for k, v in rows.items():
            v = v.clone()
            for slot, f in flags.items():
                if not bool(f.any()):
                    continue
                sel = f.view(-1, *([1] * (v.dim() - 1))) & self.regions[slot][k]
                v = torch.where(sel, self.empty[k].expand_as(v), v)
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


def new_transformer(cfg: PretrainConfig, joint_dim: int, pooled_dim: int) -> Any:
    import diffusers

    with _rng(cfg.seed * 1000 + 3):
        return diffusers.SD3Transformer2DModel(**_transformer_config(cfg, joint_dim, pooled_dim))


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
) -> dict[str, Any]:
    """Rectified-flow training of the SD3 transformer on ``latents`` with ``table``'s conditioning.

    Each step draws a batch (a fresh permutation per epoch), per-slot dropout flags, SD3's
    logit-normal ``t`` and Gaussian noise, all from generators seeded by ``cfg.seed`` and the step, so
    that training can be stopped at ``stop_step`` and resumed (``transformer``, ``ema``,
    ``optimizer_state``, ``start_step``) with the same result as one uninterrupted run.
    Returns ``{"transformer", "ema", "optimizer_state", "step"}``.
    """
    import torch

    pe = table.tensors["prompt_embeds"]
    pooled = table.tensors["pooled_prompt_embeds"]
    if transformer is None:
        transformer = new_transformer(cfg, pe.shape[-1], pooled.shape[-1])
    if ema is None:
        ema = copy.deepcopy(transformer).eval().requires_grad_(False)
    params = [p for p in transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state)
    n = latents.shape[0]
    stop = cfg.steps if stop_step is None else min(stop_step, cfg.steps)
    transformer.train()
    t0 = time.perf_counter()
    for step in range(start_step, stop):
        epoch, pos = divmod(step * cfg.batch, n)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 * step + 11)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 7 + epoch))
        idx = perm[torch.arange(pos, pos + cfg.batch) % n]
        x0 = latents[idx]
        rows = dropout.apply(table.rows(idx), dropout.sample(cfg.batch, gen))
        t = torch.sigmoid(cfg.logit_mean + cfg.logit_std * torch.randn(cfg.batch, generator=gen))
        noise = torch.randn(x0.shape, generator=gen)
        tt = t.view(-1, 1, 1, 1)
        xt = (1 - tt) * x0 + tt * noise
        pred = transformer(
            hidden_states=xt, encoder_hidden_states=rows["prompt_embeds"], pooled_projections=rows["pooled_prompt_embeds"],
            timestep=t * 1000, return_dict=False,
        )[0]  # fmt: skip
        loss = torch.nn.functional.mse_loss(pred, noise - x0)
        lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        decay = min(cfg.ema_decay, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe_, p in zip(ema.parameters(), transformer.parameters(), strict=True):
                pe_.lerp_(p, 1 - decay)
        if log is not None and (step + 1) % 50 == 0:
            log({"phase": "transformer", "step": step + 1, "loss": loss.item(), "grad_norm": float(gnorm), "lr": lr,
                 "seconds": time.perf_counter() - t0})  # fmt: skip
    transformer.eval()
    return {"transformer": transformer, "ema": ema, "optimizer_state": opt.state_dict(), "step": stop}


# --------------------------------------------------------------------------------------------------
# the pipeline
# --------------------------------------------------------------------------------------------------


def build_pipeline(
    transformer: Any, vae: Any, cfg: PretrainConfig, components: dict[str, Any] | None = None
) -> Any:
    """The ``StableDiffusion3Pipeline`` of the pretrained parts and the tiny frozen text encoders."""
    import diffusers

    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=cfg.scheduler_shift),
        **(components or _components()),
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------


def heldout_set(n: int, seed: int = 10_000, style: str | None = None, concept: Any = None) -> list[Any]:
    """``n`` world samples from a stream the training set never draws from (``seed`` differs), no empty captions.

    ``style`` (tags, short, long) fixes the caption style; default the world's mix. With ``concept``
    (a :class:`te_align.tiny.world.Concept`) the scenes never show it, as the base model's data.
    """
    from te_align.tiny import world

    mix = {style: 1.0} if style else None
    split = "base" if concept is not None else "all"
    return world.make_dataset(n, seed, image_size=None, style_mix=mix, split=split, concept=concept)


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

    Returns pooled object accuracy, per-attribute accuracy and image accuracy over all samples, per
    caption style, and over objects described inside T5's 256-token window (long captions can be cut).
    """
    import diffusers
    import torch

    from te_align.tiny import world

    if shift is not None:
        pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
            pipe.scheduler.config, shift=shift
        )
    images: list[np.ndarray] = []
    for i in range(0, len(samples), batch):
        chunk = samples[i : i + batch]
        gens = [torch.Generator().manual_seed(seed + i + j) for j in range(len(chunk))]
        out = pipe(
            prompt=[s.caption for s in chunk], num_inference_steps=steps, guidance_scale=guidance, generator=gens,
            output_type="np",
        ).images  # fmt: skip
        images += [np.clip(np.rint(im * 255), 0, 255).astype(np.uint8) for im in out]
    result: dict[str, Any] = {"all": world.evaluate(images, [s.scene for s in samples])}
    for style in sorted({s.style for s in samples}):
        sel = [k for k, s in enumerate(samples) if s.style == style]
        result[style] = world.evaluate([images[k] for k in sel], [samples[k].scene for k in sel])
    # objects whose description ends inside the 256 T5 positions (the eos takes one)
    window = fitted_profile().slot("t5").tokenizer.max_length - 1
    seen_truth = [
        [o for o, sp in zip(s.scene.objects, s.spans, strict=True) if sp.token_end <= window] for s in samples
    ]
    hits = 0
    total = 0
    for img, s, seen in zip(images, samples, seen_truth, strict=True):
        if len(seen) == len(s.scene.objects):
            r = world.score(img, s.scene)
            hits += int(r["exact"])
            total += len(seen)
    result["within_t5_window"] = {
        "objects": float(total),
        "object_accuracy": hits / total if total else float("nan"),
    }
    result["images"] = images
    return result


# --------------------------------------------------------------------------------------------------
# the whole recipe
# --------------------------------------------------------------------------------------------------


@dataclass
class PretrainResult:
    pipeline: Any
    log: list[dict[str, Any]]
    state: dict[str, Any]


def prepare(
    cfg: PretrainConfig,
    log: Callable[[dict[str, Any]], None],
    *,
    vae_callback: Callable[[int, Any], None] | None = None,
    vae_callback_every: int = 0,
    vae: Any = None,
) -> dict[str, Any]:
    """Data, VAE, latents, cached conditioning and the verified slot dropout for ``cfg``.

    ``vae_callback`` / ``vae_callback_every`` are passed to :func:`train_vae` (periodic evaluation).
    ``vae``: an autoencoder trained earlier by :func:`train_vae` (reused instead of training one). The
    autoencoder sees the whole world; the denoiser's data never shows ``cfg.held_out``.
    """
    from te_align.tiny import world

    t0 = time.perf_counter()
    concept = cfg.concept()
    train = world.make_dataset(
        cfg.train_size, cfg.seed, image_size=cfg.image_size, tokenizer=False, style_mix=cfg.style_mix,
        split="base" if concept is not None else "all", concept=concept,
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
    _round_to_half(vae)  # shipped in float16: the latents are those of the shipped autoencoder
    log({"phase": "vae_done", "seconds": time.perf_counter() - t0, "shift_factor": vae.config.shift_factor,
         "scaling_factor": vae.config.scaling_factor})  # fmt: skip
    latents = encode_latents(vae, [s.image for s in train])
    profile = fitted_profile()
    components = _components()
    for enc in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        components[enc].requires_grad_(False)
    t0 = time.perf_counter()
    table = encode_captions(profile, components, [s.caption for s in train], cfg.encode_batch)
    log({"phase": "encode", "captions": len(train), "seconds": time.perf_counter() - t0})
    dropout = SlotDropout(profile, components, [s.caption for s in train[:8]])
    dropout.verify([s.caption for s in train[8:12]] + [""])
    return {"train": train, "vae": vae, "latents": latents, "profile": profile, "components": components, "table": table,
            "dropout": dropout}  # fmt: skip


def pretrain(
    cfg: PretrainConfig,
    out_dir: str | Path | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> PretrainResult:
    """Pretrain the VAE and the transformer of ``cfg`` and (with ``out_dir``) save the pipeline there."""
    records: list[dict[str, Any]] = []

    def _log(r: dict[str, Any]) -> None:
        records.append(r)
        logger.info("%s", r)
        if log is not None:
            log(r)

    prep = prepare(cfg, _log)
    state = train_transformer(cfg, prep["latents"], prep["table"], prep["dropout"], log=_log)
    pipe = build_pipeline(state["ema"], prep["vae"], cfg, prep["components"])
    if out_dir is not None:
        pipe.save_pretrained(str(out_dir), safe_serialization=True)
    return PretrainResult(pipe, records, {**state, **prep})
