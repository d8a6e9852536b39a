"""Sample grids: images upscaled (nearest neighbour) with a wrapped label under each (Pillow, imported lazily)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

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
    gap = 8
    cell_h = tile_h + 4 + label_lines * line_h
    canvas = Image.new("RGB", (cols * (tile_w + gap) + gap, rows * (cell_h + gap) + gap), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (arr, label) in enumerate(zip(arrays, labels, strict=True)):
        r, c = divmod(i, cols)
        x, y = gap + c * (tile_w + gap), gap + r * (cell_h + gap)
        tile = Image.fromarray(arr).resize((arr.shape[1] * k, arr.shape[0] * k), Image.Resampling.NEAREST)
        canvas.paste(tile, (x, y))
        lines = wrap(label, max(48, tile_w), font)[:label_lines]
        for j, line in enumerate(lines):
            draw_text(draw, (x, y + tile_h + 2 + j * line_h), line, font=font)
    return canvas


def word_gap(font: Any) -> float:
    """The space between two words: the font's own, at least half its size. Pillow's built-in default font draws a
    space 2 pixels wide at its size 10, so labels read as one word ("Aasked:", "crosscenter")."""
    return max(float(font.getlength(" ")), round(0.5 * float(getattr(font, "size", 10))))


def text_width(text: str, font: Any) -> float:
    """The width :func:`draw_text` gives ``text`` (one line)."""
    words = text.split(" ")
    return sum(float(font.getlength(w)) for w in words) + word_gap(font) * (len(words) - 1)


def draw_text(draw: Any, xy: tuple[float, float], text: str, *, fill: Any = "black", font: Any = None) -> float:
    """Draw one line of ``text`` word by word with :func:`word_gap` between the words; returns its width."""
    from PIL import ImageFont

    font = font if font is not None else ImageFont.load_default()
    x, y = xy
    gap = word_gap(font)
    for i, word in enumerate(text.split(" ")):
        if i:
            x += gap
        if word:
            draw.text((x, y), word, fill=fill, font=font)
            x += float(font.getlength(word))
    return x - xy[0]


def wrap(text: str, width: float, font: Any) -> list[str]:
    """``text`` in lines of at most ``width`` pixels as :func:`draw_text` draws them (a longer word stands alone);
    a newline starts a new line."""
    out: list[str] = []
    for para in text.split("\n"):
        line = ""
        for word in para.split():
            if line and text_width(f"{line} {word}", font) > width:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    return out
