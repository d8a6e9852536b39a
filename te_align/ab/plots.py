"""Pillow-drawn PNG plots for the A/B report (no plotting library needed).

:func:`band_plot` draws lines with a shaded band (e.g. the mean over seeds and its min-max range);
:func:`image_grid` lays out labelled images side by side.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image


@dataclass
class Series:
    label: str
    colour: tuple[int, int, int]
    x: Sequence[float]
    y: Sequence[float]
    lo: Sequence[float] | None = None
    hi: Sequence[float] | None = None
    markers: bool = False


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _nice(v: float) -> str:
    return f"{v:.4g}"


def band_plot(series: Sequence[Series], *, title: str, xlabel: str = "step", size: tuple[int, int] = (860, 420)) -> bytes:
    """Lines with optional min-max bands, axes with 5 ticks each and a legend; PNG bytes."""
    from PIL import Image, ImageDraw

    w, h = size
    left, right, top, bottom = 70, 20, 34, 46
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img, "RGBA")
    xs = [x for s in series for x in s.x]
    ys = [y for s in series for y in [*s.y, *(s.lo or []), *(s.hi or [])] if math.isfinite(y)]
    if not xs or not ys:
        d.text((left, top), f"{title}: no data", fill="black")
        return _png(img)
    x0, x1 = min(xs), max(xs)
    if x1 - x0 < 1e-12:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.05 or abs(y0) * 0.05 or 0.5
    y0, y1 = y0 - pad, y1 + pad

    def px(x: float, y: float) -> tuple[float, float]:
        return left + (x - x0) / (x1 - x0) * (w - left - right), top + (y1 - y) / (y1 - y0) * (h - top - bottom)

    d.text((left, 10), title, fill="black")
    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for i in range(5):
        fy = y0 + (y1 - y0) * i / 4
        _, py = px(x0, fy)
        d.line([(left - 4, py), (left, py)], fill="black")
        d.line([(left, py), (w - right, py)], fill=(0, 0, 0, 25))
        d.text((4, py - 6), _nice(fy), fill="black")
        fx = x0 + (x1 - x0) * i / 4
        qx, _ = px(fx, y0)
        d.line([(qx, h - bottom), (qx, h - bottom + 4)], fill="black")
        d.text((qx - 10, h - bottom + 8), _nice(fx), fill="black")
    d.text(((w - left) // 2 + left - 20, h - 18), xlabel, fill="black")
    for s in series:
        if s.lo is not None and s.hi is not None and len(s.x) > 1:
            poly = [px(x, y) for x, y in zip(s.x, s.hi, strict=True)] + [px(x, y) for x, y in reversed(list(zip(s.x, s.lo, strict=True)))]
            d.polygon(poly, fill=(*s.colour, 60))
        pts = [px(x, y) for x, y in zip(s.x, s.y, strict=True) if math.isfinite(y)]
        if len(pts) > 1:
            d.line(pts, fill=s.colour, width=2)
        if s.markers or len(pts) == 1:
            for cx, cy in pts:
                d.ellipse([cx - 3, cy - 3, cx + 3, cy + 3], fill=s.colour)
    ly = top + 6
    for s in series:
        d.rectangle([w - right - 250, ly + 3, w - right - 238, ly + 11], fill=s.colour)
        d.text((w - right - 232, ly), s.label, fill="black")
        ly += 16
    return _png(img)


def image_grid(rows: Sequence[tuple[str, Sequence[Image.Image]]], columns: Sequence[str], *, cell: int = 128, title: str = "") -> bytes:
    """A grid of PIL images: one labelled row per (label, images), one labelled column per ``columns``."""
    from PIL import Image, ImageDraw

    label_w, head_h, gap = 260, 40 if title else 22, 6
    w = label_w + len(columns) * (cell + gap) + gap
    h = head_h + len(rows) * (cell + gap) + gap
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    if title:
        d.text((6, 4), title, fill="black")
    for j, name in enumerate(columns):
        d.text((label_w + gap + j * (cell + gap), head_h - 16), name, fill="black")
    for i, (label, images) in enumerate(rows):
        y = head_h + gap + i * (cell + gap)
        words, line, lines = label.split(), "", []
        for word in words:
            if len(line) + len(word) + 1 > 38:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        lines.append(line)
        for k, text in enumerate(lines[: cell // 14]):
            d.text((6, y + k * 14), text, fill="black")
        for j, im in enumerate(images):
            if im is None:
                continue
            tile = im.convert("RGB").resize((cell, cell), Image.NEAREST)
            img.paste(tile, (label_w + gap + j * (cell + gap), y))
    return _png(img)


__all__ = ["Series", "band_plot", "image_grid"]
