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

from te_align.tiny.world.grid import draw_text, text_width, wrap

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


def ticks(lo: float, hi: float, n: int = 5) -> list[tuple[float, str]]:
    """Round tick values across [lo, hi] (a step of 1, 2, 2.5 or 5 times a power of ten, the one nearest ``n`` steps), each
    with a label of as many decimals as the step needs: 0.10, 0.12, 0.14 rather than 0.09688, 0.1125."""
    span = hi - lo
    if not span > 0:
        return [(lo, f"{lo:.3g}")]
    mag = 10.0 ** math.floor(math.log10(span / n))
    mult = min((1.0, 2.0, 2.5, 5.0, 10.0), key=lambda m: abs(span / (m * mag) - n))
    step = mult * mag
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if mult == 2.5 else 0))
    out, k = [], math.ceil(lo / step - 1e-9)
    while k * step <= hi + step * 1e-9:
        v = k * step
        out.append((v, f"{v:.{decimals}f}".replace("-0.00", "0.00") if v else f"{0:.{decimals}f}"))
        k += 1
    return out


def band_plot(series: Sequence[Series], *, title: str, xlabel: str = "step", size: tuple[int, int] = (860, 420)) -> bytes:
    """Lines with optional min-max bands, axes with 5 ticks each and a legend; PNG bytes."""
    from PIL import Image, ImageDraw, ImageFont

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

    draw_text(d, (left, 10), title)
    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for fy, label in ticks(y0, y1):
        _, py = px(x0, fy)
        d.line([(left - 4, py), (left, py)], fill="black")
        d.line([(left, py), (w - right, py)], fill=(0, 0, 0, 25))
        d.text((4, py - 6), label, fill="black")
    for fx, label in ticks(x0, x1):
        qx, _ = px(fx, y0)
        d.line([(qx, h - bottom), (qx, h - bottom + 4)], fill="black")
        d.text((qx - 10, h - bottom + 8), label, fill="black")
    draw_text(d, ((w - left) // 2 + left - 20, h - 18), xlabel)
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
    font = ImageFont.load_default()
    lx = w - right - 8 - max((text_width(s.label, font) for s in series), default=0) - 18  # inside the frame
    for s in series:
        d.rectangle([lx, ly + 3, lx + 12, ly + 11], fill=s.colour)
        draw_text(d, (lx + 18, ly), s.label, font=font)
        ly += 16
    return _png(img)


def image_grid(rows: Sequence[tuple[str, Sequence[Image.Image | None]]], columns: Sequence[str], *, cell: int = 128,
               title: str = "") -> bytes:
    """A grid of PIL images: one labelled row per (label, images), one labelled column per ``columns`` (None: an
    empty cell)."""
    from PIL import Image, ImageDraw, ImageFont

    label_w, head_h, gap = 260, 40 if title else 22, 6
    w = label_w + len(columns) * (cell + gap) + gap
    h = head_h + len(rows) * (cell + gap) + gap
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    if title:
        draw_text(d, (6, 4), title, font=font)
    for j, name in enumerate(columns):
        draw_text(d, (label_w + gap + j * (cell + gap), head_h - 16), name, font=font)
    for i, (label, images) in enumerate(rows):
        y = head_h + gap + i * (cell + gap)
        for k, text in enumerate(wrap(label, label_w - 12, font)[: cell // 14]):
            draw_text(d, (6, y + k * 14), text, font=font)
        for j, im in enumerate(images):
            if im is None:
                continue
            tile = im.convert("RGB").resize((cell, cell), Image.NEAREST)
            img.paste(tile, (label_w + gap + j * (cell + gap), y))
    return _png(img)


__all__ = ["Series", "band_plot", "image_grid"]
