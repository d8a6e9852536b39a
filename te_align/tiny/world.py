"""The shapes world: a procedural text-to-image world whose truth is known.

A scene holds one to three objects on a neutral background. Each object has a colour (8, saturated), a
shape (square, circle, triangle, cross), a position (a cell of a 3×3 grid), a size (small, medium,
large) and a style (fill or outline); objects sit in different cells and never overlap. The
background is a neutral tone (white, light gray, dark gray), plain or with a low-contrast neutral
texture (noise, stripes, checker).

* :func:`render` draws a scene at any size (64 by default) with deterministic 4×4 supersampled
  antialiasing: every pixel is ``background * (1 - alpha) + colour * alpha``.
* :func:`sample_scene` draws a scene from a ``numpy`` ``Generator``; :func:`make_dataset` /
  :func:`iter_dataset` give per-sample records (image, caption, caption style, objects and where in the
  T5 token sequence each object is described) from a seed, for the splits a held-out-concept
  experiment needs (``"base"`` without the concept, ``"concept"`` with it, ``"validation"`` with it in
  held-out combinations).
* :func:`caption_scene` writes one caption in the styles trainers use: tag lists, short sentences,
  long natural-language captions (many over 77 T5 tokens, some over 154 and 256, with the objects at
  the start, middle or end), "!" and A1111/kohya ``(text:1.2)`` emphasis, and empty captions.
* :func:`read_image` reads an image back into ``(colour, shape, position)`` per object; :func:`score`
  and :func:`evaluate` compare readings with the truth. The reader is classical: the background is
  neutral, so an object pixel is ``alpha * colour`` in the opponent-colour plane whatever the
  background brightness; pixels are labelled with the nearest palette hue where the chroma is above
  a noise-dependent threshold, grouped into connected components (merged per grid cell), and each
  object's coverage map is fitted by least squares with the exact templates of every shape x style x
  size (sharp or blurred); the position is the cell of its centroid. :func:`degrade` makes the noisy,
  blurred or JPEG-compressed test images the reader is also measured on (benchmarks/bench_world.py).
* :func:`grid` lays images out with a label under each (nearest-neighbour upscaling).

Only ``numpy`` and Pillow are needed; the T5 tokenizer used for token positions is imported lazily
inside :func:`default_tokenizer`, so importing this module imports no torch.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = [
    "ATTRIBUTES",
    "BACKGROUND_KINDS",
    "BACKGROUND_TONES",
    "CAPTION_STYLES",
    "COLOURS",
    "DEFAULT_STYLE_MIX",
    "POSITIONS",
    "SHAPES",
    "SIMPLE",
    "SIZES",
    "SPACE",
    "SPACES",
    "SPLITS",
    "STYLES",
    "Background",
    "Caption",
    "Concept",
    "ObjectSpan",
    "ReadObject",
    "Sample",
    "Scene",
    "SceneObject",
    "SceneSpace",
    "caption_scene",
    "default_tokenizer",
    "degrade",
    "evaluate",
    "grid",
    "iter_dataset",
    "make_dataset",
    "read_image",
    "read_objects",
    "render",
    "sample_scene",
    "score",
    "token_spans",
]

# --------------------------------------------------------------------------------------------------
# attribute space
# --------------------------------------------------------------------------------------------------

# Saturated colours, spread round the hue circle (opponent-plane angles about 0, 29, 57, 133, 188,
# 229, 277, 322 degrees: the closest pair, orange and yellow, is 28 degrees apart) and all with chroma
# >= 118, so that a blend with any neutral background keeps its hue. Names a person uses.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 35, 45),
    "orange": (250, 125, 20),
    "yellow": (240, 225, 30),
    "green": (40, 170, 60),
    "cyan": (30, 195, 215),
    "blue": (40, 80, 225),
    "purple": (145, 55, 200),
    "pink": (245, 110, 195),
}
SHAPES: tuple[str, ...] = ("square", "circle", "triangle", "cross")
# Row-major 3x3 grid; index // 3 is the row, index % 3 the column.
POSITIONS: tuple[str, ...] = (
    "top left",
    "top center",
    "top right",
    "middle left",
    "center",
    "middle right",
    "bottom left",
    "bottom center",
    "bottom right",
)
# Side of the object's bounding box as a fraction of the grid cell.
SIZES: dict[str, float] = {"small": 0.42, "medium": 0.6, "large": 0.78}
STYLES: tuple[str, ...] = ("fill", "outline")
BACKGROUND_TONES: dict[str, int] = {"white": 242, "light gray": 196, "dark gray": 72}
BACKGROUND_KINDS: tuple[str, ...] = ("plain", "noise", "stripes", "checker")
ATTRIBUTES: tuple[str, ...] = ("colour", "shape", "position", "size", "style")
CAPTION_STYLES: tuple[str, ...] = ("tags", "short", "long")
DEFAULT_STYLE_MIX: dict[str, float] = {"tags": 0.3, "short": 0.3, "long": 0.4}
SPLITS: tuple[str, ...] = ("all", "base", "concept", "validation")

_SUPERSAMPLE = 4
_JITTER = 0.4  # an object's centre moves by at most this fraction of its free space in the cell
_TEXTURE_AMPLITUDE = {"noise": 14.0, "stripes": 10.0, "checker": 9.0}


@dataclass(frozen=True)
class SceneObject:
    """One object. ``offset`` (each in -1..1) moves the centre within the free space of its cell."""

    colour: str
    shape: str
    position: str
    size: str = "medium"
    style: str = "fill"
    offset: tuple[float, float] = (0.0, 0.0)

    def get(self, attribute: str) -> str:
        return str(getattr(self, attribute))

    @property
    def key(self) -> tuple[str, str, str]:
        """What the reader reads: ``(colour, shape, position)``."""
        return (self.colour, self.shape, self.position)


@dataclass(frozen=True)
class Background:
    """``kind`` is plain or a texture; ``tone`` a key of :data:`BACKGROUND_TONES`; ``seed`` drives the noise."""

    kind: str = "plain"
    tone: str = "white"
    seed: int = 0


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    background: Background = field(default_factory=Background)

    def keys(self) -> list[tuple[str, str, str]]:
        return [o.key for o in self.objects]


@dataclass(frozen=True)
class SceneSpace:
    """The values a sampler may draw from (defaults: the whole world)."""

    colours: tuple[str, ...] = tuple(COLOURS)
    shapes: tuple[str, ...] = SHAPES
    positions: tuple[str, ...] = POSITIONS
    sizes: tuple[str, ...] = tuple(SIZES)
    styles: tuple[str, ...] = STYLES
    background_kinds: tuple[str, ...] = BACKGROUND_KINDS
    background_tones: tuple[str, ...] = tuple(BACKGROUND_TONES)
    min_objects: int = 1
    max_objects: int = 3

    def values(self, attribute: str) -> tuple[str, ...]:
        return {
            "colour": self.colours,
            "shape": self.shapes,
            "position": self.positions,
            "size": self.sizes,
            "style": self.styles,
        }[attribute]

    def without(self, attribute: str, value: str) -> SceneSpace:
        """This space with one attribute value removed."""
        field_name = {
            "colour": "colours",
            "shape": "shapes",
            "position": "positions",
            "size": "sizes",
            "style": "styles",
        }[attribute]
        kept = tuple(v for v in self.values(attribute) if v != value)
        if not kept:
            raise ValueError(f"removing {attribute}={value!r} leaves no {attribute}")
        return replace(self, **{field_name: kept})


SPACE = SceneSpace()
#: The world the shipped base models are pretrained on: one filled object, medium or large, per scene on a plain
#: white background (every colour, shape and position of :data:`SPACE`; the captions keep all their styles).
SIMPLE = SceneSpace(
    sizes=("medium", "large"),
    styles=("fill",),
    background_kinds=("plain",),
    background_tones=("white",),
    max_objects=1,
)
#: Scene spaces by name (``PretrainConfig.world``, a base's ``base.json``).
SPACES: dict[str, SceneSpace] = {"full": SPACE, "simple": SIMPLE}


@dataclass(frozen=True)
class Concept:
    """A concept held out of base pretraining: one attribute value (``Concept("colour", "pink")``).

    ``holdout`` lists ``(attribute, value)`` pairs: an object that carries the concept *and* any of these
    is a held-out combination, never in the ``"concept"`` split and always in the ``"validation"`` split
    (e.g. ``(("shape", "triangle"),)``: a pink triangle is only ever seen at validation).
    """

    attribute: str
    value: str
    holdout: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.attribute not in ("colour", "shape", "size", "style"):
            raise ValueError(
                f"Concept.attribute: expected one of colour, shape, size, style, got {self.attribute!r}"
            )
        if self.value not in SPACE.values(self.attribute):
            raise ValueError(f"Concept.value: {self.value!r} is not a {self.attribute} of the world")
        for attr, val in self.holdout:
            if attr not in ATTRIBUTES or attr == self.attribute or val not in SPACE.values(attr):
                raise ValueError(f"Concept.holdout: ({attr!r}, {val!r}) is not another attribute's value")

    def carried_by(self, obj: SceneObject) -> bool:
        return obj.get(self.attribute) == self.value

    def held_out(self, obj: SceneObject) -> bool:
        """True when ``obj`` carries the concept in a held-out combination."""
        return self.carried_by(obj) and any(obj.get(a) == v for a, v in self.holdout)


# --------------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------------


def _half_planes(shape: str) -> np.ndarray:
    """Convex shapes as rows ``(nx, ny, c)``: inside where ``nx*u + ny*v <= c`` (unit box coords)."""
    if shape == "square":
        return np.array([[1, 0, 0.45], [-1, 0, 0.45], [0, 1, 0.45], [0, -1, 0.45]], dtype=np.float64)
    if shape == "triangle":
        # apex (0, -0.45), base corners (+-0.5, 0.45): width 1, height 0.9, the box centre at the origin
        rows = [[0.0, 1.0, 0.45]]
        for sx in (1.0, -1.0):
            nx, ny = sx * 0.9, -0.5  # outward normal of the side from the apex to (sx * 0.5, 0.45)
            norm = math.hypot(nx, ny)
            rows.append([nx / norm, ny / norm, 0.225 / norm])
        return np.array(rows, dtype=np.float64)
    raise ValueError(shape)


_HALF_PLANES = {"square": _half_planes("square"), "triangle": _half_planes("triangle")}


def _inside(shape: str, u: np.ndarray, v: np.ndarray, inset: float) -> np.ndarray:
    """Points (unit coordinates: the shape's box is [-0.5, 0.5]^2) inside ``shape`` shrunk by ``inset``."""
    if shape == "circle":
        r = 0.5 - inset
        return (
            (u * u + v * v <= r * r) if r > 0 else np.zeros(np.broadcast_shapes(u.shape, v.shape), dtype=bool)
        )
    if shape == "cross":
        w, half = 0.2 - inset, 0.5 - inset
        if w <= 0:
            return np.zeros(np.broadcast_shapes(u.shape, v.shape), dtype=bool)
        au, av = np.abs(u), np.abs(v)
        return ((au <= w) & (av <= half)) | ((av <= w) & (au <= half))
    inside = np.ones(np.broadcast_shapes(u.shape, v.shape), dtype=bool)
    for nx, ny, c in _HALF_PLANES[shape]:
        inside &= nx * u + ny * v <= c - inset
    return inside


def _stroke(side: float, image_size: int) -> float:
    """Outline width in pixels: 12% of the object's side, at least 1.5 px at 64 px."""
    return max(0.12 * side, 1.5 * image_size / 64.0)


def _geometry(obj: SceneObject, size: int) -> tuple[float, float, float]:
    """Centre (x, y) in pixels and side of the object's box."""
    cell = size / 3.0
    idx = POSITIONS.index(obj.position)
    row, col = divmod(idx, 3)
    side = SIZES[obj.size] * cell
    slack = (cell - side) / 2.0
    cx = (col + 0.5) * cell + _JITTER * slack * float(obj.offset[0])
    cy = (row + 0.5) * cell + _JITTER * slack * float(obj.offset[1])
    return cx, cy, side


def _window(cx: float, cy: float, side: float, height: int, width: int) -> tuple[int, int, int, int]:
    y0 = max(0, math.floor(cy - side / 2) - 1)
    y1 = min(height, math.ceil(cy + side / 2) + 1)
    x0 = max(0, math.floor(cx - side / 2) - 1)
    x1 = min(width, math.ceil(cx + side / 2) + 1)
    return y0, max(y0, y1), x0, max(x0, x1)


def _coverages(
    shape: str, cx: float, cy: float, side: float, window: tuple[int, int, int, int], image_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased coverage (0..1) of the filled and the outlined shape over the pixel ``window``."""
    y0, y1, x0, x1 = window
    ss = _SUPERSAMPLE
    sub = (np.arange(ss) + 0.5) / ss
    u = (((np.arange(x0, x1)[:, None] + sub[None, :]).ravel() - cx) / side)[None, :]
    v = (((np.arange(y0, y1)[:, None] + sub[None, :]).ravel() - cy) / side)[:, None]
    outer = _inside(shape, u, v, 0.0)
    inner = _inside(shape, u, v, _stroke(side, image_size) / side)
    shape4 = (y1 - y0, ss, x1 - x0, ss)
    scale = 1.0 / (ss * ss)
    fill = outer.reshape(shape4).sum(axis=(1, 3)) * scale
    outline = (outer & ~inner).reshape(shape4).sum(axis=(1, 3)) * scale
    return fill, outline


def _background(bg: Background, size: int) -> np.ndarray:
    base = float(BACKGROUND_TONES[bg.tone])
    if bg.kind == "plain":
        return np.full((size, size), base, dtype=np.float64)
    amp = _TEXTURE_AMPLITUDE[bg.kind]
    # the texture is defined on the unit square, so it looks the same at every image size
    t = (np.arange(size) + 0.5) / size
    if bg.kind == "noise":
        rng = np.random.default_rng(bg.seed)
        coarse = rng.uniform(-1.0, 1.0, size=(9, 9))
        g = t * 8.0
        i = np.minimum(g.astype(int), 7)
        f = g - i
        rows = coarse[i] * (1 - f)[:, None] + coarse[i + 1] * f[:, None]  # (size, 9)
        tex = rows[:, i] * (1 - f)[None, :] + rows[:, i + 1] * f[None, :]
    elif bg.kind == "stripes":
        phase = (bg.seed % 97) / 97.0
        tex = np.sin(2 * math.pi * ((t[:, None] + t[None, :]) * 7.0 + phase))
    elif bg.kind == "checker":
        n = 8 + 2 * (bg.seed % 3)
        tex = ((np.floor(t[:, None] * n) + np.floor(t[None, :] * n)) % 2) * 2.0 - 1.0
    else:
        raise ValueError(f"Background.kind: expected one of {', '.join(BACKGROUND_KINDS)}, got {bg.kind!r}")
    return base + amp * tex


def render(scene: Scene, size: int = 64) -> np.ndarray:
    """The scene as a ``size`` x ``size`` x 3 ``uint8`` RGB array (deterministic)."""
    if size < 16:
        raise ValueError(f"render: size must be at least 16, got {size}")
    bg = _background(scene.background, size)
    img = np.repeat(bg[:, :, None], 3, axis=2)
    for obj in scene.objects:
        cx, cy, side = _geometry(obj, size)
        y0, y1, x0, x1 = window = _window(cx, cy, side, size, size)
        fill, outline = _coverages(obj.shape, cx, cy, side, window, size)
        cover = outline if obj.style == "outline" else fill
        colour = np.asarray(COLOURS[obj.colour], dtype=np.float64)
        a = cover[:, :, None]
        img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * (1.0 - a) + colour * a
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------------


def _pick(rng: np.random.Generator, values: Sequence[str]) -> str:
    return values[int(rng.integers(len(values)))]


def _sample_object(
    rng: np.random.Generator, space: SceneSpace, position: str, fixed: Mapping[str, str]
) -> SceneObject:
    attrs = {a: fixed.get(a) or _pick(rng, space.values(a)) for a in ("colour", "shape", "size", "style")}
    offset = rng.uniform(-1.0, 1.0, size=2)
    return SceneObject(position=position, offset=(float(offset[0]), float(offset[1])), **attrs)


def sample_scene(
    rng: np.random.Generator,
    space: SceneSpace = SPACE,
    *,
    concept: Concept | None = None,
    mode: str = "all",
) -> Scene:
    """One random scene.

    ``mode`` (with ``concept``): ``"all"`` draws from ``space``; ``"base"`` never uses the concept's
    value; ``"concept"`` gives one object the concept (never in a held-out combination) and draws the
    others without it; ``"validation"`` gives one object the concept in a held-out combination (or in
    any combination when the concept has no ``holdout``) and draws the others without it.
    """
    if mode not in SPLITS:
        raise ValueError(f"mode: expected one of {', '.join(SPLITS)}, got {mode!r}")
    if mode != "all" and concept is None:
        raise ValueError(f"mode {mode!r} needs a concept")
    base = space.without(concept.attribute, concept.value) if concept is not None and mode != "all" else space
    n = int(rng.integers(space.min_objects, space.max_objects + 1))
    bg = Background(
        kind=_pick(rng, space.background_kinds),
        tone=_pick(rng, space.background_tones),
        seed=int(rng.integers(2**31)),
    )
    positions = list(space.positions)
    objects: list[SceneObject] = []
    if mode in ("concept", "validation"):
        assert concept is not None
        n = max(n, 1)
        fixed = {concept.attribute: concept.value}
        if mode == "validation" and concept.holdout:
            attr, val = concept.holdout[int(rng.integers(len(concept.holdout)))]
            fixed[attr] = val
        fixed_position = fixed.pop("position", None)
        for _ in range(1000):
            obj = _sample_object(rng, space, fixed_position or _pick(rng, positions), fixed)
            if mode == "validation" or not concept.held_out(obj):
                break
        else:  # pragma: no cover - only for a holdout that covers every combination
            raise ValueError(f"concept {concept}: every combination is held out")
        objects.append(obj)
        positions.remove(obj.position)
    chosen = rng.permutation(len(positions))[: n - len(objects)]
    for k in sorted(int(c) for c in chosen):
        objects.append(_sample_object(rng, base, positions[k], {}))
    order = rng.permutation(len(objects))
    return Scene(objects=tuple(objects[int(i)] for i in order), background=bg)


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


# --------------------------------------------------------------------------------------------------
# the reader
# --------------------------------------------------------------------------------------------------

_SQ3 = math.sqrt(3.0) / 2.0


def _opponent(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Opponent-colour plane: zero for every neutral grey, linear in RGB."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return r - 0.5 * (g + b), _SQ3 * (g - b)


_PALETTE_NAMES = tuple(COLOURS)
_PALETTE_AB = np.array([_opponent(np.asarray(c, dtype=np.float64)) for c in COLOURS.values()])  # (8, 2)
_PALETTE_ANGLE = np.arctan2(_PALETTE_AB[:, 1], _PALETTE_AB[:, 0])


@dataclass(frozen=True)
class ReadObject:
    """One object the reader found; ``fit`` is ``1 - residual / |coverage|^2`` of the best template (1 = exact)."""

    colour: str
    shape: str
    position: str
    size: str
    style: str
    centroid: tuple[float, float]  # (x, y) in pixels
    area: int
    fit: float

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.colour, self.shape, self.position)


def _gauss_kernel(sigma: float) -> np.ndarray:
    r = max(1, math.ceil(3 * sigma))
    x = np.arange(-r, r + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _blur(a: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of a 2-D array with edge padding."""
    k = _gauss_kernel(sigma)
    r = len(k) // 2
    p = np.pad(a, ((r, r), (0, 0)), mode="edge")
    a = sum(k[i] * p[i : i + a.shape[0]] for i in range(len(k)))
    p = np.pad(a, ((0, 0), (r, r)), mode="edge")
    return sum(k[i] * p[:, i : i + a.shape[1]] for i in range(len(k)))


def _noise_sigma(a: np.ndarray, b: np.ndarray) -> float:
    """Robust per-pixel noise of the opponent channels (median absolute neighbour difference)."""
    diffs = np.concatenate(
        [
            np.abs(np.diff(a, axis=1)).ravel(),
            np.abs(np.diff(b, axis=1)).ravel(),
            np.abs(np.diff(a, axis=0)).ravel(),
            np.abs(np.diff(b, axis=0)).ravel(),
        ]
    )
    return float(np.median(diffs) / (0.6745 * math.sqrt(2.0)))


def _components(label: np.ndarray) -> np.ndarray:
    """8-connected components of equal non-negative labels: an id per pixel (-1 where label < 0)."""
    h, w = label.shape
    ids = np.where(label >= 0, np.arange(h * w).reshape(h, w), h * w).astype(np.int64)
    big = h * w
    shifts = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]
    padl = np.pad(label, 1, constant_values=-1)
    same = []
    for dy, dx in shifts:
        nb = padl[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
        same.append((nb == label) & (label >= 0))
    while True:
        padi = np.pad(ids, 1, constant_values=big)
        new = ids.copy()
        for (dy, dx), ok in zip(shifts, same, strict=True):
            nb = padi[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
            np.minimum(new, np.where(ok, nb, big), out=new)
        # pointer jumping: follow each root id once more
        flat = new.ravel()
        valid = flat < big
        flat[valid] = np.minimum(flat[valid], flat[flat[valid]])
        if np.array_equal(new, ids):
            break
        ids = new
    return np.where(ids < big, ids, -1)


_PHASES = 8  # template centres are snapped to 1/8 pixel
# template blurs tried (pixels at 64 px): sharp renders, blurred samples, JPEG's subsampled chroma
_FIT_BLURS = (0.0, 0.8, 1.4)


@functools.lru_cache(maxsize=16384)
def _template(
    shape: str, style: str, side: float, px: int, py: int, blur: float, image_size: int
) -> np.ndarray:
    """Coverage of a shape centred at ``(r + px/8, r + py/8)`` in a ``(2r+1)^2`` window, optionally blurred."""
    r = math.ceil(side / 2 + 2 + 3 * blur)
    cx, cy = r + px / _PHASES, r + py / _PHASES
    n = 2 * r + 1
    fill, outline = _coverages(shape, cx, cy, side, _window(cx, cy, side, n, n), image_size)
    y0, y1, x0, x1 = _window(cx, cy, side, n, n)
    out = np.zeros((n, n))
    out[y0:y1, x0:x1] = outline if style == "outline" else fill
    if blur > 0:
        out = _blur(out, blur)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=16384)
def _energy(shape: str, style: str, side: float, px: int, py: int, blur: float, image_size: int) -> float:
    t = _template(shape, style, side, px, py, blur, image_size)
    return float((t * t).sum())


@functools.lru_cache(maxsize=64)
def _centroid_offset(shape: str, style: str) -> float:
    """Vertical offset of a shape's centroid from its box centre, in units of its side (triangle only)."""
    if shape != "triangle":
        return 0.0
    t = _template(shape, style, 40.0, 0, 0, 0.0, 192)
    ys = np.arange(t.shape[0]) + 0.5
    r = (t.shape[0] - 1) // 2
    return float(((t.sum(axis=1) * ys).sum() / t.sum() - r) / 40.0)


def _fit(
    alpha: np.ndarray, cx: float, cy: float, cell: float, image_size: int
) -> tuple[str, str, str, float]:
    """Best ``(shape, style, size, fit)`` for the soft mask ``alpha`` whose weighted centroid is ``(cx, cy)``.

    Every shape x style x size template (centred so that its centroid falls on ``(cx, cy)``, sharp or
    blurred) is fitted by least squares ``alpha ~ k * template``; the smallest residual wins. ``fit``
    is ``1 - residual / |alpha|^2`` (1.0 for a perfect match).
    """
    h, w = alpha.shape
    total = float((alpha * alpha).sum()) or 1e-9
    best: tuple[float, str, str, str] = (math.inf, "circle", "fill", "medium")
    scale = image_size / 64.0
    for size, frac in SIZES.items():
        side = frac * cell
        for shape in SHAPES:
            for style in STYLES:
                ccy = cy - _centroid_offset(shape, style) * side
                fx, fy = math.floor(cx * _PHASES + 0.5), math.floor(ccy * _PHASES + 0.5)
                ix, px = divmod(fx, _PHASES)
                iy, py = divmod(fy, _PHASES)
                for blur in _FIT_BLURS:
                    t = _template(shape, style, round(side, 3), px, py, blur * scale, image_size)
                    r = (t.shape[0] - 1) // 2
                    # paste the template (its centre pixel at (ix - r, iy - r)) into the window
                    ty0, tx0 = iy - r, ix - r
                    sy0, sx0 = max(0, -ty0), max(0, -tx0)
                    sy1, sx1 = min(t.shape[0], h - ty0), min(t.shape[1], w - tx0)
                    if sy1 <= sy0 or sx1 <= sx0:
                        continue
                    tt = t[sy0:sy1, sx0:sx1]
                    ab = float((alpha[ty0 + sy0 : ty0 + sy1, tx0 + sx0 : tx0 + sx1] * tt).sum())
                    tt2 = _energy(shape, style, round(side, 3), px, py, blur * scale, image_size)
                    k = min(1.5, max(0.4, ab / tt2)) if tt2 > 0 else 0.0
                    resid = total - 2 * k * ab + k * k * tt2
                    if resid < best[0]:
                        best = (resid, shape, style, size)
    return best[1], best[2], best[3], 1.0 - best[0] / total


def degrade(
    img: np.ndarray, *, noise: float = 0.0, blur: float = 0.0, jpeg: int | None = None, seed: int = 0
) -> np.ndarray:
    """``img`` degraded like a generated sample: Gaussian blur (``blur``: sigma in pixels), additive
    Gaussian noise (``noise``: sigma on 0-255, from ``seed``) and JPEG quantisation (``jpeg``: Pillow
    quality, 4:2:0 chroma subsampling), in that order. Deterministic."""
    x = np.asarray(img)[:, :, :3].astype(np.float64)
    if blur > 0:
        x = np.stack([_blur(x[:, :, c], blur) for c in range(3)], axis=2)
    if noise > 0:
        x = x + np.random.default_rng(seed).normal(0.0, noise, size=x.shape)
    out = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    if jpeg is not None:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(out).save(buf, format="JPEG", quality=int(jpeg))
        buf.seek(0)
        out = np.asarray(Image.open(buf).convert("RGB"))
    return out


_SMOOTH_MAX, _SMOOTH_DIV, _THR_K, _MIN_FIT = 1.5, 40.0, 5.0, 0.2


def read_objects(img: np.ndarray | Any, *, chroma_threshold: float = 30.0) -> list[ReadObject]:
    """Every object the reader finds in an RGB image (array or PIL image), in reading order."""
    x = np.asarray(img)
    if x.ndim != 3 or x.shape[2] < 3:
        raise ValueError(f"read_objects: expected an H x W x 3 RGB image, got shape {x.shape}")
    x = x[:, :, :3].astype(np.float64)
    h, w = x.shape[:2]
    a, b = _opponent(x)
    # the background is neutral: its chroma is the median (objects cover less than half the image)
    a0 = a - np.median(a)
    b0 = b - np.median(b)
    a, b = a0, b0
    sigma = _noise_sigma(a, b)
    if sigma > 2.0:
        # smooth for segmentation only; white noise of std sigma keeps std sigma / (2 sqrt(pi) s)
        s = min(_SMOOTH_MAX, 0.5 + sigma / _SMOOTH_DIV)
        a, b = _blur(a, s), _blur(b, s)
        sigma = sigma / (2.0 * math.sqrt(math.pi) * s)
    chroma = np.hypot(a, b)
    thr = max(chroma_threshold, _THR_K * sigma)
    angle = np.arctan2(b, a)
    diff = np.abs((angle[:, :, None] - _PALETTE_ANGLE[None, None, :] + np.pi) % (2 * np.pi) - np.pi)
    label = np.where(chroma > thr, diff.argmin(axis=2), -1)
    comp = _components(label)
    cell = min(h, w) / 3.0
    min_area = max(3.0, 0.12 * (SIZES["small"] * cell) ** 2)
    # group components by the cell of their centroid (one object per cell): an outline broken by noise,
    # or split into neighbouring hues, is still one object
    group = np.full((h, w), -1)
    for cid in np.unique(comp[comp >= 0]):
        m = comp == cid
        ys, xs = np.nonzero(m)
        cellx = min(2, int((xs.mean() + 0.5) * 3 // w))
        celly = min(2, int((ys.mean() + 0.5) * 3 // h))
        group[m] = celly * 3 + cellx
    n_col = len(_PALETTE_NAMES)
    found: list[ReadObject] = []
    for k in np.unique(group[group >= 0]):
        m = group == k
        if m.sum() < min_area:
            continue
        # colour: the chroma-weighted mean of the dominant hue and its two neighbours (the palette is in
        # hue order), so that a few pixels of another colour do not count
        labs = label[m]
        mass = np.bincount(labs, weights=chroma[m], minlength=n_col)
        dom = int(mass.argmax())
        near_hue = np.minimum((labs - dom) % n_col, (dom - labs) % n_col) <= 1
        ang = math.atan2(float(b[m][near_hue].sum()), float(a[m][near_hue].sum()))
        c = int(np.abs((ang - _PALETTE_ANGLE + np.pi) % (2 * np.pi) - np.pi).argmin())
        m = m.copy()
        m[m] = near_hue
        area = int(m.sum())
        if area < min_area:
            continue
        ys, xs = np.nonzero(m)
        pad = max(3, int(0.15 * cell))
        y0, y1 = max(0, ys.min() - pad), min(h, ys.max() + pad + 1)
        x0, x1 = max(0, xs.min() - pad), min(w, xs.max() + pad + 1)
        pa, pb = _PALETTE_AB[c]
        norm = pa * pa + pb * pb
        # pixels of other objects or far from this one do not count
        lab = label[y0:y1, x0:x1]
        keep = _dilate(m[y0:y1, x0:x1], 2) & ~((lab >= 0) & ~m[y0:y1, x0:x1])
        # alpha from all three channels: pixel = alpha * colour + (1 - alpha) * background grey, where
        # the grey level is the median of the window's background pixels
        patch = x[y0:y1, x0:x1]
        bg_px = patch[~_dilate(m[y0:y1, x0:x1], 2) & (lab < 0)]
        grey = float(np.median(bg_px.mean(axis=1))) if len(bg_px) else float(np.median(x.mean(axis=2)))
        d = np.asarray(COLOURS[_PALETTE_NAMES[c]], dtype=np.float64) - grey
        alpha = np.where(keep, ((patch - grey) @ d) / float(d @ d), 0.0)
        smooth = np.where(keep, (a[y0:y1, x0:x1] * pa + b[y0:y1, x0:x1] * pb) / norm, 0.0)
        weights = np.clip(smooth, 0.0, 1.5) * m[y0:y1, x0:x1]
        gy, gx = np.mgrid[y0:y1, x0:x1]
        wsum = float(weights.sum()) or 1e-9
        cx = float((weights * (gx + 0.5)).sum() / wsum)
        cy = float((weights * (gy + 0.5)).sum() / wsum)
        shape, style, size, fit = _fit(alpha, cx - x0, cy - y0, cell, min(h, w))
        if fit < _MIN_FIT:  # no shape explains it: colour fringes (JPEG ringing) or stray noise
            continue
        col = min(2, int(cx * 3 // w))
        row = min(2, int(cy * 3 // h))
        found.append(
            ReadObject(_PALETTE_NAMES[c], shape, POSITIONS[row * 3 + col], size, style, (cx, cy), area, fit)
        )
    return sorted(found, key=lambda o: (POSITIONS.index(o.position), o.colour))


def _dilate(m: np.ndarray, r: int) -> np.ndarray:
    out = m.copy()
    h, w = m.shape
    p = np.pad(m, r)
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            out |= p[r + dy : r + dy + h, r + dx : r + dx + w]
    return out


def read_image(img: np.ndarray | Any) -> list[tuple[str, str, str]]:
    """``(colour, shape, position)`` of every object found in ``img``, in reading order."""
    return [o.key for o in read_objects(img)]


def _truth_keys(truth: Scene | Sequence[Any]) -> list[tuple[str, str, str]]:
    items = truth.objects if isinstance(truth, Scene) else truth
    keys = []
    for o in items:
        keys.append(o.key if isinstance(o, SceneObject | ReadObject) else tuple(o))
    return keys


def _match(truth: list[tuple[str, ...]], pred: list[tuple[str, ...]]) -> list[tuple[int, int]]:
    """Truth/prediction pairs maximising exact matches, then matching attributes."""
    best: tuple[tuple[int, int], list[tuple[int, int]]] = ((-1, -1), [])
    k = min(len(truth), len(pred))
    for perm in itertools.permutations(range(len(pred)), k):
        for ti in itertools.combinations(range(len(truth)), k):
            pairs = list(zip(ti, perm, strict=True))
            exact = sum(truth[t] == pred[p] for t, p in pairs)
            attrs = sum(x == y for t, p in pairs for x, y in zip(truth[t], pred[p], strict=True))
            if (exact, attrs) > best[0]:
                best = ((exact, attrs), pairs)
    return best[1]


def score(img: np.ndarray | Any, truth: Scene | Sequence[Any]) -> dict[str, float]:
    """Read ``img`` and compare with ``truth`` (a scene, its objects, or ``(colour, shape, position)`` tuples).

    Keys: ``objects`` (true objects), ``read`` (objects found), ``exact`` (true objects read exactly),
    ``object_accuracy`` (exact / objects; 1.0 for an empty scene read as empty), ``image_exact`` (1.0
    when every object is exact and nothing extra was read), ``colour`` / ``shape`` / ``position``
    (fraction of true objects whose matched reading has that attribute right), ``attribute_accuracy``
    (their mean) and ``extra`` (readings matched to no true object).
    """
    truth_keys = _truth_keys(truth)
    pred = read_image(img)
    return _score_keys(truth_keys, pred)


def _score_keys(truth: list[tuple[str, str, str]], pred: list[tuple[str, str, str]]) -> dict[str, float]:
    pairs = _match(truth, pred)
    n = len(truth)
    exact = sum(truth[t] == pred[p] for t, p in pairs)
    per = [sum(truth[t][j] == pred[p][j] for t, p in pairs) for j in range(3)]
    denom = max(n, 1)
    empty_ok = float(n == 0 and not pred)
    out = {
        "objects": float(n),
        "read": float(len(pred)),
        "exact": float(exact),
        "object_accuracy": exact / n if n else empty_ok,
        "image_exact": float(exact == n and len(pred) == n),
        "colour": per[0] / denom if n else empty_ok,
        "shape": per[1] / denom if n else empty_ok,
        "position": per[2] / denom if n else empty_ok,
        "extra": float(len(pred) - len(pairs)),
    }
    out["attribute_accuracy"] = (out["colour"] + out["shape"] + out["position"]) / 3
    return out


def evaluate(images: Sequence[Any], truths: Sequence[Scene | Sequence[Any]]) -> dict[str, float]:
    """:func:`score` over many images: object accuracy pools objects, the others average over images."""
    if len(images) != len(truths):
        raise ValueError(f"evaluate: {len(images)} images but {len(truths)} truths")
    rows = [score(img, t) for img, t in zip(images, truths, strict=True)]
    objects = sum(r["objects"] for r in rows)
    exact = sum(r["exact"] for r in rows)
    out = {
        "images": float(len(rows)),
        "objects": objects,
        "object_accuracy": exact / objects if objects else float("nan"),
        "image_accuracy": float(np.mean([r["image_exact"] for r in rows])) if rows else float("nan"),
    }
    for key in ("colour", "shape", "position", "attribute_accuracy"):
        out[key] = (sum(r[key] * r["objects"] for r in rows) / objects) if objects else float("nan")
    out["extra_per_image"] = float(np.mean([r["extra"] for r in rows])) if rows else float("nan")
    return out


# --------------------------------------------------------------------------------------------------
# sample grids
# --------------------------------------------------------------------------------------------------


def grid(
    images: Sequence[Any],
    labels: Sequence[str] | None = None,
    *,
    columns: int | None = None,
    scale: int | None = None,
    label_lines: int = 4,
) -> PILImage.Image:
    """Images in a grid, each upscaled (nearest neighbour) with its wrapped label underneath."""
    from PIL import Image, ImageDraw, ImageFont

    if not images:
        raise ValueError("grid: no images")
    labels = list(labels) if labels is not None else [""] * len(images)
    if len(labels) != len(images):
        raise ValueError(f"grid: {len(images)} images but {len(labels)} labels")
    arrays = [np.asarray(im)[:, :, :3].astype(np.uint8) for im in images]
    h = max(a.shape[0] for a in arrays)
    w = max(a.shape[1] for a in arrays)
    k = scale or max(1, math.ceil(192 / max(h, w)))
    cols = columns or min(len(arrays), 6)
    rows = math.ceil(len(arrays) / cols)
    font = ImageFont.load_default()
    line_h = 12
    tile_w, tile_h = w * k, h * k
    chars = max(8, tile_w // 6)
    gap = 8
    cell_h = tile_h + 4 + label_lines * line_h
    canvas = Image.new("RGB", (cols * (tile_w + gap) + gap, rows * (cell_h + gap) + gap), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (arr, label) in enumerate(zip(arrays, labels, strict=True)):
        r, c = divmod(i, cols)
        x, y = gap + c * (tile_w + gap), gap + r * (cell_h + gap)
        tile = Image.fromarray(arr).resize((arr.shape[1] * k, arr.shape[0] * k), Image.Resampling.NEAREST)
        canvas.paste(tile, (x, y))
        lines = _wrap(label, chars)[:label_lines]
        for j, line in enumerate(lines):
            draw.text((x, y + tile_h + 2 + j * line_h), line, fill="black", font=font)
    return canvas


def _wrap(text: str, width: int) -> list[str]:
    out: list[str] = []
    for para in text.split("\n"):
        line = ""
        for word in para.split():
            if line and len(line) + 1 + len(word) > width:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    return out
