"""Which frozen components stay in memory once the caches are full.

After the latent cache and the text cache hold every latent and every caption the run can draw
(each caption, its caption-dropout form and each per-encoder dropout pattern), the text encoders and
the VAE are no longer needed by the loop: :func:`release` frees them (T5-XXL alone is ~9.5 GB in
bf16). Where the loop still encodes live (shuffled tags, trained text encoders, ``cache_text`` or
``cache_latents`` off, ``model.free_encoders = false``) they stay, and the log says why. Sampling
needs them again: on CUDA they are moved to CPU RAM and brought back for each sampling round
(:func:`for_sampling`); on CPU they stay where they are. Every decision is one log line.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

    from te_align.encoding import Conditioning
    from te_align.profiles.model import AlignmentProfile
    from te_align.train.config import TrainConfig
    from te_align.train.latents import LatentStore
    from te_align.train.text import TextSource

logger = logging.getLogger("te_align.train")


def variants(text: TextSource, captions: list[str]) -> list[tuple[str, list[str]]]:
    """(dropout pattern, texts) for every conditioning :meth:`TextSource.batch` can ask the cache for.

    Patterns are as ``TextSource.batch`` names them: ``""`` (nothing dropped), ``"*"`` (the whole
    caption dropped: the profile's empty prompt), or the dropped slots joined by commas in the order of
    ``data.encoder_dropout``.
    """
    cfg = text.cfg
    texts = list(captions)
    if cfg.caption_dropout > 0 and cfg.dropout_caption and cfg.dropout_caption not in texts:
        texts.append(cfg.dropout_caption)
    out: list[tuple[str, list[str]]] = [("", texts)]
    slots = list(text.slot_probs)
    for k in range(1, len(slots) + 1):
        for combo in itertools.combinations(slots, k):
            out.append((",".join(combo), texts))
    if cfg.caption_dropout > 0 and not cfg.dropout_caption:
        out.append(("*", [""]))
    return out


def precache_variants(text: TextSource, captions: list[str], batch: int = 1) -> int:
    """Fill the text cache with every dropout variant of ``captions`` (the plain ones are
    :meth:`TextSource.precache`'s); returns how many conditionings were looked up.

    One caption per encoder call by default: that is how :meth:`TextSource.batch` encodes a variant
    on first use, so a run with freed encoders trains on bit-identical conditioning (a batched
    encoder call can differ in the last bits)."""
    if not text.use_cache:
        return 0
    n = 0
    for pattern, texts in variants(text, captions):
        if pattern == "" and texts == captions:
            continue
        dropped = [s for s in text.slot_probs if pattern == "*" or s in pattern.split(",")]

        def fn(caps: list[str], pattern: str = pattern, dropped: list[str] = dropped) -> Conditioning:
            m = len(caps)
            return text._encode(caps, [pattern == "*"] * m, {s: [True] * m for s in dropped if pattern != "*"})

        cache = text._cache(pattern)
        for i in range(0, len(texts), batch):
            chunk = texts[i : i + batch]
            for caption, cond in zip(chunk, cache.get_or_encode(chunk, fn, store=text.writer), strict=True):
                text._remember((pattern, caption), cond)
                n += 1
    return n + _precache_padded(text, captions)


def _precache_padded(text: TextSource, captions: list[str]) -> int:
    """With long-prompt chunks padded to ``max_length``, a batch pads each caption to its longest caption's chunk count:
    cache every variant at every chunk count above its own (one caption per encoder call, as
    :meth:`TextSource.batch` encodes one on first use), so that the encoders can be freed."""
    top = text.options.long_prompt_chunks
    if not top or text.options.chunk_padding != "max_length":
        return 0
    n = 0
    for pattern, texts in variants(text, captions):
        dropped = [s for s in text.slot_probs if pattern == "*" or s in pattern.split(",")]
        for caption in texts:
            own = text.chunks_of(text._cached(pattern, caption, dropped))
            for chunks in range(own + 1, top + 1):
                text._cached(pattern, caption, dropped, text.padded_options(chunks))
                n += 1
    return n


@dataclass
class Residency:
    """What :func:`release` did: component attributes freed, and those moved to CPU for sampling."""

    freed: list[str] = field(default_factory=list)
    offloaded: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)


def _encoders(profile: AlignmentProfile) -> list[str]:
    return list(dict.fromkeys(s.encoder_subfolder for s in profile.slots))


def release(
    cfg: TrainConfig,
    profile: AlignmentProfile,
    pipe: DiffusionPipeline,
    text: TextSource,
    latents: LatentStore,
    device: torch.device,
) -> Residency:
    """Free (or, when sampling needs them on CUDA, offload to CPU) the text encoders and the VAE the
    loop no longer uses; log what was freed, moved or kept and why."""
    import torch

    res = Residency()
    sampling = bool(cfg.sample.prompts)
    cuda = getattr(device, "type", "") == "cuda"
    te_why = ""
    if not cfg.model.free_encoders:
        te_why = "model.free_encoders = false"
    elif text.trainable:
        te_why = ("text encoders are trained (LoRA on " + ", ".join(cfg.lora.text_encoders) + ")" if cfg.lora.text_encoders
                  else "a swapped model's text projection is trained (te-align swap)")
    elif not text.use_cache:
        te_why = ("captions are encoded live every step: " + ("tags are shuffled (data.shuffle_tags) and shuffled "
                  "captions have no cached variants" if cfg.data.shuffle_tags else "data.cache_text = false"))
    vae_why = ""
    if not cfg.model.free_encoders:
        vae_why = "model.free_encoders = false"
    elif not cfg.data.cache_latents:
        vae_why = "latents are encoded live every step (data.cache_latents = false)"
    groups = [(_encoders(profile), te_why, "text encoders"), (["vae"], vae_why, "VAE")]
    for names, why, label in groups:
        names = [a for a in names if getattr(pipe, a, None) is not None]
        if not names:
            continue
        if why:
            res.kept.update(dict.fromkeys(names, why))
            logger.info("%s kept in memory: %s", label, why)
        elif sampling and not cuda:
            res.kept.update(dict.fromkeys(names, "sampling"))
            logger.info("%s kept in memory after caching: sampling (sample.prompts) uses them on %s", label,
                        getattr(device, "type", device))
        elif sampling:
            for a in names:
                getattr(pipe, a).to("cpu")
            res.offloaded += names
            logger.info("%s moved to CPU RAM after caching (every caption and latent is cached); sampling brings "
                        "them back to %s for each round", label, device)
        else:
            for a in names:
                setattr(pipe, a, None)
            res.freed += names
            logger.info("%s freed after caching: every caption (with its dropout variants) and latent is cached", label)
    if "vae" in res.freed:
        latents.vae = None
    if res.freed or res.offloaded:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return res


@contextlib.contextmanager
def for_sampling(pipe: DiffusionPipeline, res: Residency | None, device: torch.device) -> Iterator[None]:
    """The offloaded components back on ``device`` for a sampling round, then back to CPU."""
    names = list(res.offloaded) if res is not None else []
    for a in names:
        getattr(pipe, a).to(device)
    try:
        yield
    finally:
        for a in names:
            getattr(pipe, a).to("cpu")
        if names and getattr(device, "type", "") == "cuda":
            import torch

            torch.cuda.empty_cache()


__all__ = ["Residency", "for_sampling", "precache_variants", "release", "variants"]
