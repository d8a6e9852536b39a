"""Prompt weights in the A1111 / kohya-ss sd-scripts syntax, aligned to a profile's tokens.

Prompt weighting is a user opt-in that no official pipeline has: ``a (red:1.3) [blurry] cat``
scales the text encoder's hidden states of the weighted tokens. This module keeps the two halves
apart. What the *profile* decides (the tokenizer call, special and pad tokens, truncation,
long-prompt chunks) stays exactly :func:`~te_align.encoding.core.tokenize_slot` of the prompt with
the weight syntax removed; only the per-token weights come from the syntax, and the weighting
itself is applied by :func:`weight_hidden_states` as the trainer defines it.

Syntax (sd-scripts 48d368f ``library/strategy_base.py:26-41`` regex and ``:89-172``
``parse_prompt_attention``, the same parser as AUTOMATIC1111's web UI and sd-scripts'
``library/lpw_stable_diffusion.py:63-146``):

* ``(text)`` multiplies the weight of ``text`` by 1.1, ``[text]`` by 1/1.1, ``(text:1.5)`` by 1.5
  (the number is ``[+-]?[.\\d]+`` directly followed by ``)``; ``(a: 1.5)`` with a space is a
  literal ``: 1.5`` inside a 1.1 bracket). Brackets nest and multiply.
* An unclosed ``(`` or ``[`` applies to the end of the prompt; a ``)`` or ``]`` without an opener
  and a ``:1.2)`` outside any ``(`` are literal text.
* ``\\(``, ``\\)``, ``\\[``, ``\\]`` and ``\\\\`` are the literal characters; any other backslash
  is dropped. ``BREAK`` has no meaning here (literal text), as in sd-scripts' training parser.

Token alignment: the prompt without syntax is tokenized once, as the profile says; each token takes
the weight of the piece its text starts in (the first non-space character of the token's span, read
from the tokenizer's offset mapping, so SentencePiece's leading "▁" does not count). Special,
template and pad positions get 1.0. Where piece boundaries fall between words this equals
sd-scripts' per-piece tokenization; inside a word (``(cat)s``) sd-scripts tokenizes the pieces
apart, here the word keeps the profile's tokenization and the weight of the piece it starts in.
A token of spaces only (SentencePiece's lone "▁") goes with the text after it. Tokenizers without
offsets (transformers 4 "slow" classes) get the same rule from the tokens each tail of the text
shares with the whole (it can differ inside words glued across pieces, ``(s)(cat:1.5)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from te_align.encoding.core import EncodeOptions, _chunked, prompt_tokenizer, tokenize_slot
from te_align.encoding.text import template_prefix, template_suffix
from te_align.errors import EncodingError
from te_align.profiles.model import SlotSpec

#: Multiplier of one ``( )`` and one ``[ ]`` level.
ROUND = 1.1
SQUARE = 1 / 1.1
_ESCAPABLE = "()[]\\"


def _explicit_weight(text: str, i: int) -> tuple[str, int] | None:
    """At ``text[i] == ":"``: the number of a ``:<number>)`` close and the index after ``)``."""
    j = i + 1
    if j < len(text) and text[j] in "+-":
        j += 1
    start = j
    while j < len(text) and (text[j] == "." or text[j].isdecimal()):  # regex [.\d]: \d is any Unicode digit
        j += 1
    if j == start or j >= len(text) or text[j] != ")":
        return None
    return text[i + 1 : j], j + 1


def parse_prompt_weights(text: str) -> list[tuple[str, float]]:
    """Split a prompt into ``(text, weight)`` pieces; neighbouring pieces of equal weight are merged.

    ``parse_prompt_weights("a (red:1.3) cat")`` is ``[("a ", 1.0), ("red", 1.3), (" cat", 1.0)]``;
    a prompt without weight syntax is one piece of weight 1.0 (``""`` gives ``[("", 1.0)]``). Weights
    are multiplied in the order sd-scripts multiplies them, so the floats are bit-identical.
    A malformed number such as ``(a:1.2.3)`` raises ``ValueError``, as sd-scripts' ``float()`` does.
    """
    pieces: list[list[Any]] = []  # [text, weight]
    rounds: list[int] = []
    squares: list[int] = []

    def scale(start: int, factor: float) -> None:
        for piece in pieces[start:]:
            piece[1] *= factor

    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            if i + 1 < n and text[i + 1] in _ESCAPABLE:
                pieces.append([text[i + 1], 1.0])
                i += 2
            else:  # a lone backslash is dropped
                pieces.append(["", 1.0])
                i += 1
        elif ch == "(":
            rounds.append(len(pieces))
            i += 1
        elif ch == "[":
            squares.append(len(pieces))
            i += 1
        elif ch == ":":
            found = _explicit_weight(text, i)
            if found is None:
                pieces.append([":", 1.0])
                i += 1
            elif rounds:
                try:
                    factor = float(found[0])
                except ValueError:
                    raise ValueError(f"prompt weight {found[0]!r} is not a number (in {text!r})") from None
                scale(rounds.pop(), factor)
                i = found[1]
            else:  # ":1.2)" with no open "(" is text
                pieces.append([text[i : found[1]], 1.0])
                i = found[1]
        elif ch == ")" and rounds:
            scale(rounds.pop(), ROUND)
            i += 1
        elif ch == "]" and squares:
            scale(squares.pop(), SQUARE)
            i += 1
        elif ch in ")]":
            pieces.append([ch, 1.0])
            i += 1
        else:
            j = i
            while j < n and text[j] not in "\\()[]:":
                j += 1
            pieces.append([text[i:j], 1.0])
            i = j
    for start in rounds:
        scale(start, ROUND)
    for start in squares:
        scale(start, SQUARE)
    merged: list[list[Any]] = []
    for piece in pieces:
        if merged and merged[-1][1] == piece[1]:
            merged[-1][0] += piece[0]
        else:
            merged.append(list(piece))
    return [(str(t), float(w)) for t, w in merged] or [("", 1.0)]


def strip_prompt_weights(text: str) -> str:
    """The prompt as it is tokenized: the weight syntax removed, escapes resolved."""
    return "".join(t for t, _ in parse_prompt_weights(text))


# -------------------------------------------------------------------------------- alignment
def _rendered_pieces(slot: SlotSpec, pieces: list[tuple[str, float]], negative: bool) -> list[tuple[str, float]]:
    """The slot's rendered text as pieces: template parts weigh 1.0."""
    spec = slot.tokenizer
    if spec.text_cleaning != "none" or spec.text_transform != "none":
        raise EncodingError(
            f"slot '{slot.name}': prompt weights cannot be aligned to a slot that rewrites the prompt "
            f"(text_cleaning={spec.text_cleaning!r}, text_transform={spec.text_transform!r})"
        )
    return [(template_prefix(spec, negative=negative), 1.0), *pieces, (template_suffix(spec, negative=negative), 1.0)]


def _first_visible(text: str, start: int) -> int:
    """The token's first non-space character; for a token of spaces only, the next one after it."""
    for k in range(start, len(text)):
        if not text[k].isspace():
            return k
    return start


def _content_weights_by_offsets(tokenizer: Any, pieces: list[tuple[str, float]]) -> tuple[list[int], list[float]]:
    text = "".join(t for t, _ in pieces)
    per_char = [w for t, w in pieces for _ in t]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, weights = list(enc["input_ids"]), []
    for start, end in enc["offset_mapping"]:
        weights.append(per_char[_first_visible(text, start)] if end > start else 1.0)
    return ids, weights


def _content_weights_by_suffixes(tokenizer: Any, pieces: list[tuple[str, float]]) -> tuple[list[int], list[float]]:
    """Without offsets: the tokens the text from a piece's start on (whitespace before it included)
    shares with the whole text's tail start in that piece or later; the others start before it."""
    text = "".join(t for t, _ in pieces)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    starts: list[tuple[int, float]] = []  # (first token index, weight) per piece, in order
    pos = 0
    for piece, w in pieces:
        begin, pos = pos, pos + len(piece)
        if not piece.strip():
            continue  # no visible character: no token starts here
        if not starts:
            starts.append((0, w))
            continue
        while begin > 0 and text[begin - 1].isspace():
            begin -= 1
        tail = list(tokenizer(text[begin:], add_special_tokens=False)["input_ids"])
        shared = 0
        while shared < min(len(tail), len(ids)) and tail[-1 - shared] == ids[-1 - shared]:
            shared += 1
        starts.append((len(ids) - shared, w))
    weights = [1.0] * len(ids)
    for first, w in starts:
        for k in range(first, len(ids)):
            weights[k] = w
    return ids, weights


def content_token_weights(
    slot: SlotSpec, tokenizer: Any, prompt: str, *, negative: bool = False, parse: bool = True
) -> tuple[list[int], list[float]]:
    """The slot's tokens of one prompt (template included, no special tokens) and their weights."""
    pieces = parse_prompt_weights(prompt) if parse else [(prompt, 1.0)]
    rendered = _rendered_pieces(slot, pieces, negative)
    tokenizer = prompt_tokenizer(slot, tokenizer)
    if getattr(tokenizer, "is_fast", False):
        return _content_weights_by_offsets(tokenizer, rendered)
    return _content_weights_by_suffixes(tokenizer, rendered)


def _place(row: list[int], content: list[int]) -> tuple[int, int]:
    """Start and length of the longest run of ``content`` (a prefix of it, when truncated) in ``row``."""
    best, best_len = 0, 0
    for s in range(len(row)):
        k = 0
        while k < len(content) and s + k < len(row) and row[s + k] == content[k]:
            k += 1
        if k > best_len:
            best, best_len = s, k
            if k == len(content):
                break
    return best, best_len


def tokenize_slot_weighted(
    slot: SlotSpec,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    negative: bool = False,
    options: EncodeOptions | None = None,
    parse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids, mask and per-token weights (float32) of prompts with weight syntax, for one slot.

    Ids and mask are exactly :func:`~te_align.encoding.core.tokenize_slot` of the prompts with the
    syntax removed (:func:`strip_prompt_weights`), long-prompt chunks included; ``weights`` has
    their shape, 1.0 wherever no prompt token is. ``parse=False`` takes prompts literally
    (weights all 1.0).
    """
    texts = [strip_prompt_weights(p) if parse else p for p in prompts]
    options = options or EncodeOptions()
    tokenizer = prompt_tokenizer(slot, tokenizer)
    ids, mask = tokenize_slot(slot, tokenizer, texts, negative=negative, options=options)
    weights = torch.ones(ids.shape, dtype=torch.float32)
    if not parse:
        return ids, mask, weights
    chunked = _chunked(slot, options)
    width = slot.tokenizer.max_length
    body = width - 2
    for b, prompt in enumerate(prompts):
        content, cw = content_token_weights(slot, tokenizer, prompt, negative=negative)
        row = ids[b].tolist()
        if chunked:
            n = -(-len(row) // width)  # the last chunk is narrower with chunk_padding = "longest"
            positions = [k * width + 1 + j for k in range(n) for j in range(body)][: len(content)]
        else:
            start, kept = _place(row, content)
            positions = list(range(start, start + kept))
        if any(row[pos] != content[k] for k, pos in enumerate(positions)):
            raise EncodingError(f"slot '{slot.name}': prompt weights could not be aligned to the tokens of {prompt!r}")
        for k, pos in enumerate(positions):
            weights[b, pos] = cw[k]
    return ids, mask, weights


# -------------------------------------------------------------------------------- weighting
def weight_hidden_states(hidden: torch.Tensor, weights: torch.Tensor, *, restore_mean: bool = False) -> torch.Tensor:
    """Scale hidden states ``(batch, seq, width)`` by per-token ``weights`` ``(batch, seq)``.

    ``restore_mean=False``: ``hidden * weights`` (sd-scripts' strategies,
    ``library/strategy_sd.py:117-128``, ``library/strategy_sdxl.py:204-217``); the product follows
    torch's type promotion of the two dtypes. ``restore_mean=True``: then rescaled per sample so the
    mean over sequence and width equals the unweighted one (sd-scripts'
    ``library/lpw_stable_diffusion.py:389-393``: the means are taken in float32 and cast back to
    ``hidden``'s dtype, as there); pass ``weights`` in ``hidden``'s dtype to match it.
    """
    w = weights.to(hidden.device).unsqueeze(-1)
    if not restore_mean:
        return hidden * w
    before = hidden.float().mean(dim=(-2, -1)).to(hidden.dtype)
    out = hidden * w
    after = out.float().mean(dim=(-2, -1)).to(out.dtype)
    return out * (before / after).unsqueeze(-1).unsqueeze(-1)


__all__ = [
    "content_token_weights",
    "parse_prompt_weights",
    "strip_prompt_weights",
    "tokenize_slot_weighted",
    "weight_hidden_states",
]
