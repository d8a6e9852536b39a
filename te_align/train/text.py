"""The text conditioning of a training run: :class:`TextSource` processes captions, draws caption and per-encoder
dropout, and encodes with ``te_align.encode`` by the run's profile (cached per caption in a te-align
``EmbeddingCache`` when captions are static, with a bounded in-memory memo in front)."""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import te_align
from te_align._types import JSONObject
from te_align.encoding import Conditioning, EncodeOptions, sample_dropout
from te_align.encoding.cache.keys import hash_text_encoders
from te_align.encoding.cache.store import EmbeddingCache
from te_align.train.config import TrainConfig, TrainError
from te_align.train.data import process_caption
from te_align.train.record import active_draws

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

    from te_align.profiles.model import AlignmentProfile

logger = logging.getLogger("te_align.train")


#: In-memory budget of cached text conditioning (the rest is read from the disk cache when needed).
MEMO_BYTES = 512 * 2**20


def _nbytes(cond: Conditioning) -> int:
    return sum(t.numel() * t.element_size() for t in cond.values())


class TextSource:
    """Conditioning for a batch of raw captions: caption processing, dropout and te_align.encode."""

    def __init__(
        self,
        cfg: TrainConfig,
        profile: AlignmentProfile,
        pipe: DiffusionPipeline,
        device: torch.device,
        dtype: torch.dtype,
        *,
        trainable: bool,
        cache_dir: Path,
        writer: bool = True,
    ) -> None:
        self.cfg = cfg.data
        self.profile = profile
        self.pipe = pipe
        self.device = device
        self.dtype = dtype
        self.trainable = trainable
        self.options = EncodeOptions(
            long_prompt_chunks=cfg.data.long_prompt_chunks,
            dropout_policy=cfg.data.dropout_policy,
            chunk_padding=cfg.data.long_prompt_padding,
        )
        probs: dict[str, float] = {}
        for k, v in cfg.data.encoder_dropout.items():
            if k == "all":
                for s in profile.slots:
                    if s.train_dropout:
                        probs[s.name] = float(s.train_dropout)
            else:
                try:
                    profile.slot(k)
                except Exception as e:
                    raise TrainError(str(e), key=f"data.encoder_dropout.{k}") from None
                probs[k] = float(v)
        self.slot_probs = probs
        #: The slots whose dropout rate the profile publishes (its own order). Their uniforms are drawn from the step's
        #: stream for every run on this profile, whatever rate the run sets (0 when it drops none): a run's rates set
        #: only the thresholds, so two runs that differ in per-encoder dropout consume the same numbers and share every
        #: later draw (timesteps). A rate for a slot the profile publishes none for draws from a stream of its own.
        self.published = [s.name for s in profile.slots if s.train_dropout]
        #: The dropout draws of the last :meth:`batch` (whole global batch), kept while draws are recorded.
        self.last_draws: JSONObject = {}
        longest = cfg.data.long_prompt_padding == "longest"
        self.use_cache = cfg.data.cache_text and not trainable and not cfg.data.shuffle_tags and not longest
        if cfg.data.cache_text and not self.use_cache:
            if trainable or cfg.data.shuffle_tags:
                why = "text encoders are trained" if trainable else "tags are shuffled"
                why += ", so captions change every step"
            else:
                why = "each batch's chunks are padded to its longest caption (data.long_prompt_padding)"
            logger.info("text-embedding cache off: %s", why)
        self._caches: dict[str, EmbeddingCache] = {}
        #: Recently used conditionings in memory, least recently used first; the disk cache holds them all.
        self._memo: OrderedDict[tuple[str, str], Conditioning] = OrderedDict()
        self._memo_bytes = 0
        self.cache_dir = cache_dir
        #: Only this process writes cache files (rank 0 of a data-parallel run; the others read them).
        self.writer = writer
        self._te_hash: str | None = None

    def _cache(self, pattern: str, options: EncodeOptions | None = None) -> EmbeddingCache:
        options = options or self.options
        key = pattern if options is self.options else f"{pattern}|{options.as_dict()}"
        if key not in self._caches:
            if self._te_hash is None:
                self._te_hash = hash_text_encoders(
                    {s.name: getattr(self.pipe, s.encoder_subfolder) for s in self.profile.slots},
                    {s.name: getattr(self.pipe, s.tokenizer_subfolder) for s in self.profile.slots},
                )
            opts = dict(options.as_dict(), dropped=pattern)
            self._caches[key] = EmbeddingCache(self.cache_dir, self.profile, self._te_hash, opts)
        return self._caches[key]

    def _encode(
        self, captions: list[str], drop: list[bool], drop_slots: dict[str, list[bool]], options: EncodeOptions | None = None
    ) -> Conditioning:
        return te_align.encode(
            self.profile, captions, pipeline=self.pipe, options=options or self.options, drop=drop,
            drop_slots=drop_slots or None, requires_grad=self.trainable,
        )

    @property
    def chunk_positions(self) -> int:
        """Positions of one long-prompt chunk (the chunkable slot's max_length, 77 for CLIP)."""
        return next(s.tokenizer.max_length for s in self.profile.slots if s.tokenizer.chunkable)

    def chunks_of(self, cond: Conditioning) -> int:
        """How many long-prompt chunks a (chunked) conditioning holds."""
        return _seq_len(cond) // self.chunk_positions

    def padded_options(self, chunks: int) -> EncodeOptions:
        """The options that encode a caption padded to exactly ``chunks`` long-prompt chunks (a batch's chunk count)."""
        return dataclasses.replace(self.options, long_prompt_chunks=chunks, pad_chunks=True)

    def _cached(self, pattern: str, text: str, dropped: list[str], options: EncodeOptions | None = None) -> Conditioning:
        """One caption's conditioning from the memo or the disk cache (``pattern``: the dropped slots, ``*`` all)."""

        def fn(caps: list[str]) -> Conditioning:
            m = len(caps)
            return self._encode(caps, [pattern == "*"] * m, {s: [True] * m for s in dropped if pattern != "*"}, options)

        memo = (pattern, text) if options is None else (f"{pattern}|{options.as_dict()}", text)
        hit = self._memo.get(memo)
        if hit is None:
            hit = self._cache(pattern, options).get_or_encode([text], fn, store=self.writer)[0]
        self._remember(memo, hit)
        return hit

    def precache(self, captions: list[str], batch: int = 16) -> None:
        if not self.use_cache:
            return
        cache = self._cache("")
        if self.options.long_prompt_chunks:
            batch = 1  # a batch shares its longest caption's chunk count; each caption keeps its own
        for i in range(0, len(captions), batch):
            chunk = captions[i : i + batch]
            for text, cond in zip(chunk, cache.get_or_encode(chunk, lambda caps: self._encode(caps, [False] * len(caps), {}), store=self.writer), strict=True):
                self._remember(("", text), cond)

    def _remember(self, key: tuple[str, str], cond: Conditioning) -> None:
        """Keep ``cond`` in the in-memory memo, evicting the least recently used beyond ``MEMO_BYTES``
        (a large dataset's T5 conditioning would not fit in RAM: Flux, 512 x 4096 bf16 = 4 MiB per
        caption; evicted entries are read back from the disk cache)."""
        if key in self._memo:
            self._memo.move_to_end(key)
            return
        self._memo[key] = cond
        self._memo_bytes += _nbytes(cond)
        while self._memo_bytes > MEMO_BYTES and len(self._memo) > 1:
            _, old = self._memo.popitem(last=False)
            self._memo_bytes -= _nbytes(old)

    def slot_dropout(self, n: int, gen: torch.Generator, own: torch.Generator | None = None) -> dict[str, list[bool]]:
        """Per-encoder dropout flags of ``n`` captions for the slots this run drops: the profile's published slots from
        ``gen`` (always drawn, see :attr:`published`), any other slot from ``own`` (its own stream)."""
        shared = {s: self.slot_probs.get(s, 0.0) for s in self.published}
        flags = sample_dropout(self.profile, n, shared, gen) if shared else {}
        rest = {k: v for k, v in self.slot_probs.items() if k not in shared}
        if rest:
            flags.update(sample_dropout(self.profile, n, rest, own if own is not None else gen))
        return {k: flags[k] for k in self.slot_probs}

    def batch(
        self, captions: list[str], gen: torch.Generator, span: tuple[int, int] | None = None,
        dropout_gen: torch.Generator | None = None,
    ) -> Conditioning:
        """Conditioning for ``captions[lo:hi]`` (``span``; default all).

        Caption processing and dropout are drawn for the whole (global) batch, so every process
        consumes ``gen`` exactly as a single process training the whole batch would. ``dropout_gen`` is the stream of
        per-encoder dropout for slots the profile publishes no rate for (:meth:`slot_dropout`).
        """
        import torch

        n = len(captions)
        texts = [process_caption(c, self.cfg, gen) for c in captions]
        drop = [False] * n
        if self.cfg.caption_dropout > 0:
            draws = torch.rand(n, generator=gen).tolist()
            for i, x in enumerate(draws):
                if x < self.cfg.caption_dropout:
                    if self.cfg.dropout_caption:
                        texts[i] = self.cfg.dropout_caption
                    else:
                        drop[i] = True
        slot_flags = self.slot_dropout(n, gen, dropout_gen)
        if active_draws() is not None:
            self.last_draws = {"texts": list(texts), "drop": list(drop), "slots": {k: list(v) for k, v in slot_flags.items()}}
        if span is not None:
            lo, hi = span
            texts, drop = texts[lo:hi], drop[lo:hi]
            slot_flags = {k: v[lo:hi] for k, v in slot_flags.items()}
            n = len(texts)
        if not self.use_cache:
            cond = self._encode(texts, drop, slot_flags)
        else:
            parts = []
            for i in range(n):
                if drop[i]:
                    pattern, text = "*", ""
                else:
                    pattern = ",".join(s for s, f in slot_flags.items() if f[i])
                    text = texts[i]
                dropped = [s for s in self.slot_probs if pattern == "*" or s in pattern.split(",")]

                parts.append(self._cached(pattern, text, dropped))
            if self.options.long_prompt_chunks and len({_seq_len(c) for c in parts}) > 1:
                # each caption is cached with its own chunk count: pad the shorter ones to the batch's chunk count,
                # as the uncached path (one encode of the whole batch) does
                longest = max(_seq_len(c) for c in parts)
                for i in range(n):
                    if _seq_len(parts[i]) != longest:
                        pattern = "*" if drop[i] else ",".join(s for s, f in slot_flags.items() if f[i])
                        dropped = [s for s in self.slot_probs if pattern == "*" or s in pattern.split(",")]
                        opts = self.padded_options(longest // self.chunk_positions)
                        parts[i] = self._cached(pattern, "" if drop[i] else texts[i], dropped, opts)
            cond = Conditioning.cat(parts)
        return cond.to(self.device, dtype=self.dtype)


def _seq_len(cond: Conditioning) -> int:
    """The sequence length of a conditioning's (first) embeddings tensor."""
    t = cond.tensors.get("prompt_embeds") if hasattr(cond, "tensors") else None
    if t is None:
        t = next(v for v in cond.tensors.values() if v.dim() >= 3)
    return int(t.shape[-2])


__all__ = ["MEMO_BYTES", "TextSource"]
