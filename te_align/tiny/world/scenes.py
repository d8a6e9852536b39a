"""The shapes world's scenes: the attribute space, scene records, held-out concepts, rendering and sampling.

A scene holds one to three objects on a neutral background. Each object has a colour (8, saturated), a shape
(square, circle, triangle, cross), a position (a cell of a 3×3 grid), a size (small, medium, large) and a style
(fill or outline); objects sit in different cells and never overlap. The background is a neutral tone (white,
light gray, dark gray), plain or with a low-contrast neutral texture (noise, stripes, checker). :data:`SPACE` is
that whole world; :data:`SIMPLE` (one filled object, medium or large, on plain white) is the world the shipped
base models are pretrained on.

* :func:`render` draws a scene at any size (64 by default) with deterministic 4×4 supersampled antialiasing:
  every pixel is ``background * (1 - alpha) + colour * alpha``.
* :func:`sample_scene` draws a scene from a ``numpy`` ``Generator`` for the splits a held-out-concept experiment
  needs (``"base"`` without the concept, ``"concept"`` with it, ``"validation"`` with it in held-out combinations).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

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
