"""sd-scripts' tokenizers and text encoders as profile slots: the steps every architecture shares.

An architecture (:mod:`te_align.trainers.kohya.hooks.archs`) names its tokenize-strategy attributes and the
profile slot each one is; these helpers tokenize and encode one slot by the profile
(:func:`~te_align.encoding.core.tokenize_slot` / :func:`~te_align.encoding.core.encode_slot_tokens`),
and :func:`tokenize` / :func:`encode` run an architecture's hooked ``tokenize`` / ``encode_tokens``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from te_align._lazy import lazy_module
from te_align.hooks.base import HookError
from te_align.trainers.kohya.hooks.run import ENV_OVERRIDES, RUN, chunk_options, profile_for

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedTokenizerBase

    from te_align.encoding import core as _core
    from te_align.encoding.core import SlotResult
    from te_align.profiles import AlignmentProfile
    from te_align.profiles.model import SlotSpec
    from te_align.trainers.kohya.hooks.archs import Arch, Models, Outputs, Tokens
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")


# -------------------------------------------------------------------------------- tokenization
def clip_g_tokenizer(strategy: object, attr: str) -> PreTrainedTokenizerBase:
    """sd-scripts' laion CLIP-G tokenizer made the hub ``tokenizer_2`` (a copy whose pad token "!" is special).

    The profile's ``clip_g.tokenizer.pad_token_in_prompt`` then decides how a literal "!" reads, as for
    any other tokenizer (``"text"``: plain BPE, exactly sd-scripts' own tokenization).
    """
    tok = getattr(strategy, attr)
    cached = strategy.__dict__.get("_te_align_clip_g")
    if cached is None or cached[0] is not tok:
        official = copy.deepcopy(tok)
        official.add_special_tokens({"pad_token": "!"})
        cached = (tok, official)
        strategy.__dict__["_te_align_clip_g"] = cached
    return cached[1]


def slot_name(arch: Arch, attr: str, p: AlignmentProfile) -> str:
    """The profile slot of the tokenizer in ``strategy.<attr>`` (None in the table: the profile's only slot)."""
    name = arch.slots[arch.tokenizers.index(attr)]
    return p.slots[0].name if name is None else name


def slot_tokenizers(
    arch: Arch, strategy: object, p: AlignmentProfile
) -> list[tuple[SlotSpec | None, PreTrainedTokenizerBase]]:
    """(slot spec or None, tokenizer) per sd-scripts tokenizer, in sd-scripts' order."""
    names = {s.name for s in p.slots}
    out = []
    for attr in arch.tokenizers:
        name = slot_name(arch, attr, p)
        tok = clip_g_tokenizer(strategy, attr) if name == "clip_g" else getattr(strategy, attr)
        out.append((p.slot(name) if name in names else None, tok))
    return out


def note_setting_differences(arch: Arch, strategy: object, p: AlignmentProfile) -> None:
    """Log once where sd-scripts' own settings ask for something the profile does differently."""
    chunks = chunk_options(arch.chunkable, strategy).long_prompt_chunks
    if chunks:
        RUN.once(
            f"ml:{arch.name}",
            "te-align: --max_token_length %s: %d CLIP chunks of 77 tokens each with BOS/EOS (NovelAI method; sd-scripts "
            "stitches them to %d tokens); the profile %s itself truncates at 77",
            chunks * 75, chunks, chunks * 75 + 2, p.name,
        )
    t5len = getattr(strategy, "t5xxl_max_length", None)
    if t5len is not None and any(s.name == "t5" for s in p.slots) and t5len != p.slot("t5").tokenizer.max_length:
        RUN.once(
            f"t5:{arch.name}",
            "te-align: sd-scripts' T5 length %s replaced by profile %s's %s (override with %s='{\"t5_max_length\": %s}')",
            t5len, p.name, p.slot("t5").tokenizer.max_length, ENV_OVERRIDES, t5len,
        )
    if arch.notes is not None:
        arch.notes(strategy, p)


def tokenize_slots(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, mask) per sd-scripts tokenizer by the profile (long-prompt chunks where sd-scripts asks for them)."""
    parts: list[tuple[torch.Tensor, torch.Tensor]] = []
    for slot, tok in slot_tokenizers(arch, strategy, p):
        if slot is None:  # e.g. Chroma has no CLIP-L: sd-scripts still tokenizes for its dummy encoder
            enc = tok(texts, max_length=77, padding="max_length", truncation=True, return_tensors="pt")
            parts.append((enc["input_ids"], enc["attention_mask"]))
        else:
            opts = chunk_options(arch.chunkable, strategy)
            parts.append(_core.tokenize_slot(slot, tok, texts, negative=negative, options=opts))
    return parts


def tokenize(arch: Arch, strategy: object, text: str | Sequence[str], negative: bool = False) -> Tokens:
    """The hooked ``tokenize``: sd-scripts' token layout of ``arch``, made by the profile."""
    texts = [text] if isinstance(text, str) else list(text)
    p = profile_for(arch.name, strategy)
    note_setting_differences(arch, strategy, p)
    return arch.tokenize(arch, p, strategy, texts, negative)


# ------------------------------------------------------------------------------------ encoding
def clip_mask(ids: torch.Tensor, eos: int | None) -> torch.Tensor:
    """Attention mask of CLIP ids without one: real tokens up to and including the first EOS
    (:func:`te_align.encoding.core.eos_mask`)."""
    return _core.eos_mask(ids, eos)


def one_chunk(t: torch.Tensor, arch: str) -> torch.Tensor:
    """sd-scripts' (B, chunks, L) CLIP tokens as (B, L); hooked tokenization makes exactly one chunk."""
    if t.dim() == 3:
        if t.shape[1] != 1:
            raise HookError(
                f"te-align kohya {arch}: got {t.shape[1]} token chunks per caption; hooked tokenization makes one "
                "(were these tokens made before the hooks were installed?)"
            )
        return t[:, 0]
    return t


def slot_encode(
    p: AlignmentProfile,
    slot_name: str,
    encoder: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor | None,
) -> SlotResult:
    """One slot's tokens through its encoder by the profile (CLIP ids without a mask: mask up to the first EOS)."""
    slot = p.slot(slot_name)
    if mask is None:
        mask = clip_mask(ids, slot.tokenizer.eos_token_id)
    return _core.encode_slot_tokens(p, slot, encoder, ids, mask)


def drop(rate: float, enable: bool, n: int) -> list[bool]:
    """sd-scripts' per-caption dropout draw (``random.random() < rate``), one per row."""
    return [enable and rate > 0.0 and random.random() < rate for _ in range(n)]


def zero_rows(t: torch.Tensor | None, rows: list[bool]) -> torch.Tensor | None:
    """``t`` with the marked batch rows set to zero."""
    import torch

    if t is None or not any(rows):
        return t
    sel = torch.tensor(rows, device=t.device).view(-1, *([1] * (t.dim() - 1)))
    return torch.where(sel, torch.zeros((), dtype=t.dtype, device=t.device), t)


def encode(
    arch: Arch, strategy: object, tokenize_strategy: object, models: Models, tokens: Tokens, **kw: object
) -> Outputs:
    """The hooked ``encode_tokens``: sd-scripts' output layout of ``arch``, encoded by the profile."""
    if arch.observe is not None:
        arch.observe(models)
    p = profile_for(arch.name, tokenize_strategy)
    return arch.encode(arch, p, strategy, tokenize_strategy, models, tokens, **kw)
