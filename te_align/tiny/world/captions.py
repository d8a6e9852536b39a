"""The shapes world's captions and datasets.

* :func:`caption_scene` writes one caption in the styles trainers use: tag lists, short sentences, long
  natural-language captions (many over 77 T5 tokens, some over 154 and 256, with the objects at the start,
  middle or end), "!" and A1111/kohya ``(text:1.2)`` emphasis, and empty captions.
* :func:`make_dataset` / :func:`iter_dataset` give per-sample records (image, caption, caption style, objects and
  where in the T5 token sequence each object is described) from a seed; :func:`token_spans` measures where a
  caption's objects fall under any tokenizer.

The T5 tokenizer used for token positions is imported lazily inside :func:`default_tokenizer`, so importing
this module imports no torch.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from te_align.tiny.world.scenes import (
    CAPTION_STYLES,
    DEFAULT_STYLE_MIX,
    SPACE,
    SPLITS,
    Concept,
    Scene,
    SceneObject,
    SceneSpace,
    _pick,
    render,
    sample_scene,
)

# --------------------------------------------------------------------------------------------------
# captions
# --------------------------------------------------------------------------------------------------

_S, _E = "\x02", "\x03"  # object span markers while a caption is assembled


@dataclass(frozen=True)
class ObjectSpan:
    """Where one object is described: characters ``[char_start, char_end)`` of the caption and tokens
    ``[token_start, token_end)`` of its T5 ids (``</s>`` not counted in ``token_end``)."""

    char_start: int
    char_end: int
    token_start: int
    token_end: int


@dataclass(frozen=True)
class Caption:
    text: str
    style: str  # "tags" | "short" | "long" | "empty"
    emphasis: str  # "none" | "bang" | "weight"
    placement: str  # long captions: "start" | "middle" | "end" | "spread"; others: "start"
    char_spans: tuple[tuple[int, int], ...]  # per scene object, in scene order


@dataclass(frozen=True)
class Sample:
    """One record of a dataset; ``spans`` follow ``scene.objects`` (empty for an empty caption)."""

    index: int
    scene: Scene
    caption: str
    style: str
    emphasis: str
    placement: str
    spans: tuple[ObjectSpan, ...]
    n_tokens: int  # T5 ids including the closing </s>
    image: np.ndarray | None

    @property
    def objects(self) -> tuple[SceneObject, ...]:
        return self.scene.objects


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _desc(obj: SceneObject) -> str:
    """``[small|large] [outlined] colour shape`` (medium and fill are unmarked)."""
    words = []
    if obj.size != "medium":
        words.append(obj.size)
    if obj.style == "outline":
        words.append("outlined")
    words += [obj.colour, obj.shape]
    return " ".join(words)


_TONE_WORD = {"white": "white", "light gray": "light gray", "dark gray": "dark gray"}
_TEXTURE_TAG = {"plain": "plain", "noise": "grainy", "stripes": "striped", "checker": "checkered"}
_TEXTURE_LONG = {
    "plain": "plain {tone}",
    "noise": "{tone} with a faint grainy noise",
    "stripes": "{tone} with faint diagonal stripes",
    "checker": "a faint {tone} checkerboard",
}
_COUNT = {1: "one", 2: "two", 3: "three"}

_MOOD = ("calm", "quiet", "playful", "cheerful", "serene", "orderly", "peaceful", "gentle", "tidy", "still")
_FEEL = ("timeless", "abstract", "friendly", "nostalgic", "dreamlike", "modern", "precise", "clinical")
_LIGHT = ("soft", "diffuse", "even", "muted", "warm", "cool", "studio", "natural")
_ART = (
    "flat vector",
    "paper cut-out",
    "children's book",
    "Bauhaus poster",
    "minimalist",
    "Swiss design",
    "screen print",
    "gouache",
    "clean digital art",
)
_REFERENCE = (
    "a page from an old geometry textbook",
    "a sticker sheet for a school notebook",
    "a test card that a television station might show at night",
    "a puzzle from a preschool workbook",
    "a slide from a lecture on graphic design",
    "a magnet board in a classroom",
    "the cover of a modest record sleeve",
)
_QUALITY = ("high quality", "sharp focus", "detailed", "masterpiece", "best quality", "clean edges", "crisp")
_FILLER = (
    "The mood is {mood} and {mood2}, with a sense of balance that makes the picture feel {feel}.",
    "The lighting is {light} and {light2}, with no harsh shadows and only a gentle glow around the edges.",
    "It is drawn in a {art} style, with clean strokes and no gradients, textures or decoration.",
    "The image looks like {reference}.",
    "Nothing else happens in the frame; the scene is {mood}, almost {feel}, as if time had stopped for a moment.",
    "Seen straight on, with a flat perspective and no depth, the composition feels deliberate and {mood}.",
    "There are no people, no text, no animals and no landscape, only simple geometry arranged with care.",
    "The overall palette is limited, and the contrast between the forms and the ground is strong and clear.",
    "A viewer might read it as a small {feel} puzzle, or simply as a {mood} study of form and space.",
    "The picture has the feeling of {reference}, made by someone who enjoys order.",
    "Every form has crisp, clean edges, as if it were cut from thick paper with a sharp blade and glued down.",
    "{quality}, {quality2}, {art} illustration, {light} lighting, simple composition.",
)
_OPENERS = (
    "This {art} image shows {count} simple geometric {noun}.",
    "A picture of {count} simple geometric {noun}, {mood} and {feel}.",
    "An illustration with {count} geometric {noun} arranged on an invisible grid.",
)
# An object's span runs from the first of {desc} / {pos} to the end of the other.
_OBJECT_SENTENCES = (
    "{A} {desc} sits in the {pos} of the frame.",
    "In the {pos} there is {a} {desc}.",
    "{A} {desc} has been placed in the {pos}.",
    "{A} {desc} can be seen in the {pos}, its edges clean and sharp.",
    "Toward the {pos}, the artist drew {a} {desc}.",
)


def _object_sentence(template: str, i: int, desc: str, position: str) -> str:
    art = _article(desc.lstrip("("))
    first, second = (
        ("{desc}", "{pos}") if template.index("{desc}") < template.index("{pos}") else ("{pos}", "{desc}")
    )
    t = template.replace("{A}", art.capitalize()).replace("{a}", art)
    t = t.replace(first, f"{_S}{i}{_E}{first}", 1).replace(second, f"{second}{_S}{_E}", 1)
    return t.format(desc=desc, pos=position)


def _mark(i: int, text: str) -> str:
    return f"{_S}{i}{_E}{text}{_S}{_E}"


def _strip_marks(marked: str, n: int) -> tuple[str, tuple[tuple[int, int], ...]]:
    out: list[str] = []
    spans: dict[int, tuple[int, int]] = {}
    pos = 0
    length = 0
    open_idx: int | None = None
    start = 0
    for m in re.finditer(f"{_S}(\\d*){_E}", marked):
        chunk = marked[pos : m.start()]
        out.append(chunk)
        length += len(chunk)
        if m.group(1):
            open_idx, start = int(m.group(1)), length
        else:
            assert open_idx is not None
            spans[open_idx] = (start, length)
            open_idx = None
        pos = m.end()
    out.append(marked[pos:])
    return "".join(out), tuple(spans[i] for i in range(n))


def _emphasised(desc: str, emphasis: str, chosen: bool, rng: np.random.Generator, style: str) -> str:
    if not chosen:
        return desc
    if emphasis == "weight":
        return f"({desc}:{_pick(rng, ('1.1', '1.2', '1.3', '1.4', '0.8'))})"
    if emphasis == "bang" and style == "tags":
        return desc + "!"
    return desc


def _fill(template: str, rng: np.random.Generator, count: int) -> str:
    words = {
        "mood": _pick(rng, _MOOD),
        "mood2": _pick(rng, _MOOD),
        "feel": _pick(rng, _FEEL),
        "light": _pick(rng, _LIGHT),
        "light2": _pick(rng, _LIGHT),
        "art": _pick(rng, _ART),
        "reference": _pick(rng, _REFERENCE),
        "quality": _pick(rng, _QUALITY),
        "quality2": _pick(rng, _QUALITY),
        "count": _COUNT[count],
        "noun": "form" if count == 1 else "forms",
    }
    text = template.format(**words)
    return text[0].upper() + text[1:]


def caption_scene(
    scene: Scene,
    rng: np.random.Generator,
    style: str,
    *,
    emphasis: str = "none",
) -> Caption:
    """One caption of ``scene`` in ``style`` (``tags``, ``short``, ``long`` or ``empty``).

    ``emphasis``: ``"bang"`` adds "!" (after an object's name in tags, at the end of a short caption,
    ending the object sentences of a long one); ``"weight"`` wraps object names as ``(name:1.2)``.
    """
    if style not in (*CAPTION_STYLES, "empty"):
        raise ValueError(f"caption style: expected one of tags, short, long, empty, got {style!r}")
    if emphasis not in ("none", "bang", "weight"):
        raise ValueError(f"emphasis: expected none, bang or weight, got {emphasis!r}")
    objs = scene.objects
    n = len(objs)
    if style == "empty" or n == 0:
        return Caption(
            "", "empty" if style == "empty" else style, "none", "start", tuple((0, 0) for _ in objs)
        )
    chosen = set(range(n)) if emphasis != "none" and rng.random() < 0.5 else {int(rng.integers(n))}
    descs = [_emphasised(_desc(o), emphasis, i in chosen, rng, style) for i, o in enumerate(objs)]
    bg = scene.background
    tone = _TONE_WORD[bg.tone]
    placement = "start"
    if style == "tags":
        parts = [_mark(i, f"{d}, {o.position}") for i, (o, d) in enumerate(zip(objs, descs, strict=True))]
        bg_tags = [f"{_TEXTURE_TAG[bg.kind]} background", f"{tone} background"]
        lead = ["masterpiece", "best quality"] if rng.random() < 0.3 else []
        marked = ", ".join([*lead, *parts, *bg_tags])
    elif style == "short":
        clauses = []
        for i, (o, d) in enumerate(zip(objs, descs, strict=True)):
            prep = _pick(rng, ("in", "at"))
            clauses.append(f"{_article(d.lstrip('('))} " + _mark(i, f"{d} {prep} the {o.position}"))
        body = clauses[0] if n == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]
        lead = _pick(rng, ("", "", "a picture of ", "an image of ", "a drawing of "))
        tail = ""
        if rng.random() < 0.5:
            tail = f" on a {_TEXTURE_TAG[bg.kind]} {tone} background"
        marked = lead + body + tail + ("!" if emphasis == "bang" else "")
    else:
        end = "!" if emphasis == "bang" else "."
        obj_sentences = []
        for i, (o, d) in enumerate(zip(objs, descs, strict=True)):
            template = _OBJECT_SENTENCES[int(rng.integers(len(_OBJECT_SENTENCES)))]
            s = _object_sentence(template, i, d, o.position)
            obj_sentences.append(s[:-1] + end)
        n_fill = _filler_count(rng)
        fillers = [_fill(_FILLER[int(k)], rng, n) for k in rng.permutation(len(_FILLER))[:n_fill]]
        opener = [_fill(_OPENERS[int(rng.integers(len(_OPENERS)))], rng, n)] if rng.random() < 0.5 else []
        # stay within T5's 512 tokens (the tiny T5 uses at most ~0.73 tokens per character here)
        while fillers and sum(len(t) + 1 for t in (*obj_sentences, *opener, *fillers)) > _MAX_LONG_CHARS:
            fillers.pop()
        bg_sentence = "The background is " + _TEXTURE_LONG[bg.kind].format(tone=tone) + "."
        fillers.insert(int(rng.integers(len(fillers) + 1)), bg_sentence)
        placement = _pick(rng, ("start", "middle", "end", "spread"))
        if placement == "start":
            sentences = [*obj_sentences, *opener, *fillers]
        elif placement == "end":
            sentences = [*opener, *fillers, *obj_sentences]
        elif placement == "middle":
            half = (len(fillers) + 1) // 2
            sentences = [*opener, *fillers[:half], *obj_sentences, *fillers[half:]]
        else:
            sentences = [*opener, *fillers]
            for s in obj_sentences:
                sentences.insert(int(rng.integers(len(opener), len(sentences) + 1)), s)
        marked = " ".join(sentences)
    text, spans = _strip_marks(marked, n)
    return Caption(text, style, emphasis, placement, spans)


_MAX_LONG_CHARS = 660
_FILLER_COUNT_P = (0.4, 0.28, 0.14, 0.08, 0.06, 0.04)


def _filler_count(rng: np.random.Generator) -> int:
    """Number of filler sentences in a long caption (0 to 5, fewer more often; at most ~450 T5 tokens)."""
    return int(rng.choice(len(_FILLER_COUNT_P), p=_FILLER_COUNT_P))


@functools.lru_cache(maxsize=1)
def default_tokenizer() -> Any:
    """The tiny T5 tokenizer that token positions are measured with (imported here, lazily)."""
    from te_align.tiny.tokenizers import t5_tokenizer

    return t5_tokenizer()


def token_spans(
    tokenizer: Any, text: str, char_spans: Sequence[tuple[int, int]]
) -> tuple[int, tuple[ObjectSpan, ...]]:
    """``(number of ids, spans)`` of ``text`` under ``tokenizer`` (special tokens added): each character span
    ``[start, end)`` as the token range ``[token_start, token_end)`` that covers it (empty spans stay empty)."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True, verbose=False)
    offsets = [(s, e) for s, e in enc["offset_mapping"]]
    ids = enc["input_ids"]
    real = [i for i, (s, e) in enumerate(offsets) if e > s]
    spans = []
    for cs, ce in char_spans:
        if ce <= cs:
            spans.append(ObjectSpan(cs, ce, 0, 0))
            continue
        t0 = next(i for i in real if offsets[i][1] > cs)
        t1 = max(i for i in real if offsets[i][0] < ce) + 1
        spans.append(ObjectSpan(cs, ce, t0, t1))
    return len(ids), tuple(spans)


# --------------------------------------------------------------------------------------------------
# datasets
# --------------------------------------------------------------------------------------------------


def _stream(seed: int, split: str, index: int, part: int) -> np.random.Generator:
    """Independent generator per (seed, split, sample, part): a sample never depends on ``n`` or on
    the other options, and scenes do not depend on the caption options."""
    code = zlib.crc32(split.encode())
    return np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=(code, index, part)))


def iter_dataset(
    n: int,
    seed: int,
    *,
    split: str = "all",
    concept: Concept | None = None,
    space: SceneSpace = SPACE,
    style_mix: Mapping[str, float] | None = None,
    emphasis_rate: float = 0.15,
    caption_dropout: float = 0.0,
    image_size: int | None = 64,
    tokenizer: Any = None,
    start: int = 0,
) -> Iterator[Sample]:
    """Samples ``start .. start+n-1`` of the stream named by ``(seed, split)``.

    ``split`` picks the scenes (see :func:`sample_scene`; ``"base"``, ``"concept"`` and ``"validation"``
    need ``concept``). Per sample: the caption is empty with probability ``caption_dropout`` (the
    profile's caption dropout), else its style is drawn from ``style_mix`` (default
    :data:`DEFAULT_STYLE_MIX`) and it gets "!" or weight emphasis with probability ``emphasis_rate``.
    ``image_size=None`` skips rendering. ``tokenizer`` (default :func:`default_tokenizer`) measures the
    token positions; pass ``False`` to skip them (spans then hold ``token_* = -1``, ``n_tokens`` -1).
    """
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    if not 0.0 <= caption_dropout <= 1.0:
        raise ValueError(f"caption_dropout: expected a rate in [0, 1], got {caption_dropout}")
    mix = dict(DEFAULT_STYLE_MIX if style_mix is None else style_mix)
    bad = sorted(set(mix) - set(CAPTION_STYLES))
    if bad or not mix or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(
            f"style_mix: expected non-negative weights for {', '.join(CAPTION_STYLES)}, got {mix}"
        )
    styles = list(mix)
    weights = np.array([mix[s] for s in styles], dtype=np.float64)
    cum = np.cumsum(weights / weights.sum())
    tok = default_tokenizer() if tokenizer is None else tokenizer
    stream = split if concept is None else f"{split}|{concept.attribute}={concept.value}|{concept.holdout}"
    for index in range(start, start + n):
        scene = sample_scene(_stream(seed, stream, index, 0), space, concept=concept, mode=split)
        crng = _stream(seed, stream, index, 1)
        u_drop, u_style, u_emph, u_kind = crng.random(4)
        if u_drop < caption_dropout:
            style, emphasis = "empty", "none"
        else:
            style = styles[min(int(np.searchsorted(cum, u_style, side="right")), len(styles) - 1)]
            emphasis = "none" if u_emph >= emphasis_rate else ("bang" if u_kind < 0.5 else "weight")
        cap = caption_scene(scene, crng, style, emphasis=emphasis)
        if tok is False:
            n_tokens = -1
            spans = tuple(ObjectSpan(cs, ce, -1, -1) for cs, ce in cap.char_spans)
        else:
            n_tokens, spans = token_spans(tok, cap.text, cap.char_spans)
        image = render(scene, image_size) if image_size else None
        yield Sample(index, scene, cap.text, cap.style, cap.emphasis, cap.placement, spans, n_tokens, image)


def make_dataset(n: int, seed: int, **options: Any) -> list[Sample]:
    """``list(iter_dataset(n, seed, **options))``; see :func:`iter_dataset`.

    For a held-out concept X: ``make_dataset(n, s, split="base", concept=X)`` never shows X,
    ``split="concept"`` always shows X (never in ``X.holdout`` combinations) and ``split="validation"``
    always shows X in a held-out combination with known attributes.
    """
    return list(iter_dataset(n, seed, **options))
