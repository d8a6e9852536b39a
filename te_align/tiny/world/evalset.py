"""Base-evaluation prompts a sceptic accepts: new in wording, one independent scene per prompt.

The held-out prompts a base was first scored on (``tools/ship_base.py``: 64 per caption style, dataset seed
20000) are held out by seed only: they are written by the same caption grammar as the training captions, many occur
word for word among them, and the three styles describe the same 64 scenes. The prompts here differ on all three
counts:

* **new wording**: every template below was written on 2026-11-28 for this purpose, before any base was scored
  with it, and none is a form the caption grammar (:func:`te_align.tiny.world.caption_scene`) writes. Tags use
  separators and orders the grammar never uses; sentences use frames it never uses; long prompts use sentences of
  their own (no grammar filler). :func:`novelty` checks this against any set of training captions: the words from
  the first attribute of the object to the last (its *object phrase*) and every sentence around it must occur in
  none of them.
* **independent scenes**: each prompt draws its own colour (pink excluded: the held-out concept), shape, position
  and size from its own random stream; no scene is shared between prompts or styles.
* **visible to every base**: a long prompt's object phrase ends before CLIP token 77 and T5 token 77, so no
  encoder window of any shipped base cuts it (a prompt a model cannot see measures nothing about the model).

The vocabulary stays the world's (colour, shape, size and position words plus common English), because the tiny
text encoders were trained on the world's captions only. :func:`eval_prompts` returns the prompts of one style;
:func:`eval_set` all three styles. Importing this module imports no torch; the long prompts' token positions are
measured with the world's tokenizers (loaded on first use).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from te_align.tiny.world.scenes import COLOURS, SIMPLE, SceneSpace

__all__ = [
    "LONG_AFTER",
    "LONG_BEFORE",
    "SENTENCE_FRAMES",
    "STYLES",
    "TAG_TEMPLATES",
    "EvalPrompt",
    "eval_prompts",
    "eval_set",
    "novelty",
]

#: The three prompt styles, as the training captions have three (tags, short sentences, long captions).
STYLES: tuple[str, ...] = ("tags", "short", "long")

#: Tag lists in separators and orders the grammar never writes (it writes ``desc, position, ... background``).
#: Fields: ``{desc}`` "[large] colour shape", ``{colour}``, ``{shape}``, ``{pos}``, ``{size}`` ("medium" / "large").
TAG_TEMPLATES: tuple[str, ...] = (
    "{desc} | {pos}",
    "{pos} / {desc}",
    "{shape}; {colour}; {pos}; {size}",
    "colour {colour}, shape {shape}, place {pos}, size {size}",
    "{colour} + {shape} + {pos}",
)
#: Sentence frames the grammar never writes (``{a}``: the article of ``{desc}``).
SENTENCE_FRAMES: tuple[str, ...] = (
    "one {desc}, and it is at the {pos}",
    "at the {pos} you can find {a} {desc}",
    "please draw {a} {desc}; put it at the {pos}",
    "{desc} alone, {pos}, nothing else",
    "the only thing in the picture is {a} {desc}; its place: {pos}",
    "{pos} of the image: one {desc}",
)
#: Sentences of the long prompts: one or two before the object's sentence, two or three after it.
LONG_BEFORE: tuple[str, ...] = (
    "Picture a clean sheet of white paper under a bright lamp.",
    "A designer made this small drawing for a children's game about colours.",
    "Imagine a tiny poster with almost nothing on it.",
    "This is a very simple image, made to test a drawing machine.",
)
LONG_AFTER: tuple[str, ...] = (
    "There is nothing else on the page, no words and no lines.",
    "The edges are sharp and the colour is flat and even.",
    "The rest of the picture stays empty and white.",
    "It could hang in a quiet hallway or sit on a desk.",
    "Everything about it is plain, clear and easy to read.",
)
#: A long prompt's object phrase ends before this token of CLIP and of T5 (every shipped base sees it).
_WINDOW = 77


@dataclass(frozen=True)
class EvalPrompt:
    """One prompt and what it asks for."""

    text: str
    style: str
    template: int  # index into TAG_TEMPLATES (tags) or SENTENCE_FRAMES (short, long)
    colour: str
    shape: str
    position: str
    size: str
    #: The object phrase: ``text[start:end]`` runs from the first attribute word to the last.
    start: int
    end: int

    @property
    def truth(self) -> tuple[tuple[str, str, str]]:
        """What the reader should read: ``((colour, shape, position),)``."""
        return ((self.colour, self.shape, self.position),)

    @property
    def phrase(self) -> str:
        return self.text[self.start : self.end]

    def to_dict(self) -> dict[str, str | int]:
        return {
            "text": self.text,
            "style": self.style,
            "template": self.template,
            "colour": self.colour,
            "shape": self.shape,
            "position": self.position,
            "size": self.size,
        }


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _phrase_bounds(text: str, words: Iterable[str]) -> tuple[int, int]:
    """``[start, end)`` from the first to the last occurrence of any of ``words`` (each taken at its first place)."""
    spans = []
    for w in words:
        m = re.search(rf"\b{re.escape(w)}\b", text)
        if m is None:
            raise AssertionError(f"{w!r} not in {text!r}")
        spans.append(m.span())
    return min(s for s, _ in spans), max(e for _, e in spans)


def _fill(template: str, colour: str, shape: str, position: str, size: str) -> tuple[str, tuple[int, int]]:
    desc = " ".join(([size] if size != "medium" else []) + [colour, shape])
    text = template.format(desc=desc, a=_article(desc), colour=colour, shape=shape, pos=position, size=size)
    named_size = "{size}" in template or ("{desc}" in template and size != "medium")
    words = [colour, shape, position] + ([size] if named_size else [])
    return text, _phrase_bounds(text, words)


def _stream(seed: int, style: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=(zlib.crc32(style.encode()),)))


def _n_tokens(tokenizer: Callable[..., Mapping[str, list[int]]], text: str) -> int:
    """Ids of ``text`` with the tokenizer's special tokens, the closing one not counted."""
    return len(tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"]) - 1


class _Tokenizers:
    """The world's CLIP and T5 tokenizers, loaded on first use."""

    def __init__(self) -> None:
        self._pair: tuple[Callable[..., Mapping[str, list[int]]], ...] | None = None

    def fits(self, prefix: str) -> bool:
        if self._pair is None:
            from te_align.tiny.tokenizers import clip_tokenizer
            from te_align.tiny.world.captions import default_tokenizer

            self._pair = (clip_tokenizer(), default_tokenizer())
        return all(_n_tokens(tok, prefix) < _WINDOW for tok in self._pair)


def eval_prompts(
    style: str, n: int, seed: int = 0, *, space: SceneSpace = SIMPLE, exclude_colour: str = "pink"
) -> list[EvalPrompt]:
    """``n`` prompts of ``style`` (``tags``, ``short`` or ``long``), reproducible from ``(seed, style)``.

    Each prompt draws its own colour (never ``exclude_colour``), shape, position and size from ``space`` and its
    own template. Long prompts: one or two :data:`LONG_BEFORE` sentences, the object's sentence (a sentence frame),
    two or three :data:`LONG_AFTER` sentences, fewer sentences before when the object phrase would end past token
    76 of CLIP or T5.
    """
    if style not in STYLES:
        raise ValueError(f"eval_prompts: style must be one of {', '.join(STYLES)}, got {style!r}")
    if n < 0:
        raise ValueError(f"eval_prompts: n must be >= 0, got {n}")
    colours = [c for c in COLOURS if c in space.colours and c != exclude_colour]
    rng = _stream(seed, style)
    tokens = _Tokenizers()
    out: list[EvalPrompt] = []
    for _ in range(n):
        colour = colours[int(rng.integers(len(colours)))]
        shape = space.shapes[int(rng.integers(len(space.shapes)))]
        position = space.positions[int(rng.integers(len(space.positions)))]
        size = space.sizes[int(rng.integers(len(space.sizes)))]
        templates = TAG_TEMPLATES if style == "tags" else SENTENCE_FRAMES
        k = int(rng.integers(len(templates)))
        text, (start, end) = _fill(templates[k], colour, shape, position, size)
        if style == "long":
            sentence = text[0].upper() + text[1:] + "."
            before = [LONG_BEFORE[int(i)] for i in rng.permutation(len(LONG_BEFORE))[: 1 + int(rng.integers(2))]]
            after = [LONG_AFTER[int(i)] for i in rng.permutation(len(LONG_AFTER))[: 2 + int(rng.integers(2))]]
            while before and not tokens.fits(" ".join([*before, sentence[:end]])):
                before.pop()
            lead = " ".join(before) + " " if before else ""
            if not tokens.fits(lead + sentence[:end]):
                raise AssertionError(f"eval_prompts: the object of {sentence!r} does not fit in {_WINDOW} tokens")
            text = lead + sentence + " " + " ".join(after)
            start, end = start + len(lead), end + len(lead)
        out.append(EvalPrompt(text, style, k, colour, shape, position, size, start, end))
    return out


def eval_set(
    n_per_style: int, seed: int = 0, *, space: SceneSpace = SIMPLE, exclude_colour: str = "pink"
) -> list[EvalPrompt]:
    """:func:`eval_prompts` of every style, ``n_per_style`` each, in :data:`STYLES` order."""
    return [
        p
        for style in STYLES
        for p in eval_prompts(style, n_per_style, seed, space=space, exclude_colour=exclude_colour)
    ]


def novelty(prompts: Sequence[EvalPrompt], captions: Iterable[str]) -> dict[str, int]:
    """How many ``prompts`` are *not* new in wording against ``captions`` (training captions): counts of prompts
    whose whole text, whose object phrase, or one of whose long-prompt sentences occurs in some caption
    (lower-cased). All three are 0 for a set new in wording."""
    texts = [p.text.lower() for p in prompts]
    phrases = [p.phrase.lower() for p in prompts]
    sentences = sorted({s.lower() for s in (*LONG_BEFORE, *LONG_AFTER)})
    whole = set(texts)
    hit_text: set[int] = set()
    hit_phrase: set[int] = set()
    hit_sentence: set[str] = set()
    for caption in captions:
        c = caption.lower()
        if c in whole:
            hit_text.update(i for i, t in enumerate(texts) if t == c)
        hit_phrase.update(i for i, ph in enumerate(phrases) if i not in hit_phrase and ph in c)
        hit_sentence.update(s for s in sentences if s not in hit_sentence and s in c)
    long_hits = sum(1 for p in prompts if p.style == "long" and any(s in p.text.lower() for s in hit_sentence))
    return {
        "prompts": len(prompts),
        "whole_text_in_training": len(hit_text),
        "object_phrase_in_training": len(hit_phrase),
        "long_sentence_in_training": long_hits,
    }
