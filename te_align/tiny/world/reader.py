"""The shapes world's reader: an image back into ``(colour, shape, position)`` per object, and scores.

The reader is classical: the background is neutral, so an object pixel is ``alpha * colour`` in the
opponent-colour plane whatever the background brightness; pixels are labelled with the nearest palette hue
where the chroma is above a noise-dependent threshold, grouped into connected components (merged per grid
cell), and each object's coverage map is fitted by least squares with the exact templates of every shape x
style x size (sharp or blurred); the position is the cell of its centroid. :func:`score` and :func:`evaluate`
compare readings with the truth. Only ``numpy`` is needed.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from te_align.tiny.world.scenes import (
    COLOURS,
    POSITIONS,
    SHAPES,
    SIZES,
    STYLES,
    Scene,
    SceneObject,
    _coverages,
    _window,
)

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


def match(truth: list[tuple[str, ...]], pred: list[tuple[str, ...]]) -> list[tuple[int, int]]:
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
    return score_keys(truth_keys, pred)


def score_keys(truth: list[tuple[str, str, str]], pred: list[tuple[str, str, str]]) -> dict[str, float]:
    """:func:`score` of readings ``pred`` against ``truth`` keys (both ``(colour, shape, position)`` tuples)."""
    pairs = match(truth, pred)
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
