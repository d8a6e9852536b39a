"""Synthetic image datasets with captions, drawn offline from a seed (PNG + ``.txt`` caption per image).

* :func:`make_shapes_dataset` (``te-align demo``): a coloured square, circle or triangle at a random place,
  the caption naming colour, shape and position; ``train/`` holds every colour x shape combination,
  ``val/`` a seeded pick of them.
* :func:`make_squares_dataset` (tiny training runs): a coloured square in the middle, the caption naming
  its colour, in a few sizes (for aspect buckets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ANSWER_KEY", "COLOURS", "SHAPES", "SQUARE_COLOURS", "make_shapes_dataset", "make_squares_dataset",
           "read_answer_key", "write_world_split"]

#: Colours of :func:`make_shapes_dataset`.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 200, 40),
}
#: Shapes of :func:`make_shapes_dataset`.
SHAPES = ("square", "circle", "triangle")

#: Colours of :func:`make_squares_dataset`.
SQUARE_COLOURS: dict[str, tuple[int, int, int]] = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def _draw(shape: str, colour: tuple[int, int, int], size: int, rng: Any) -> Any:
    import numpy as np
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (245, 245, 240))
    d = ImageDraw.Draw(img)
    r = int(rng.integers(size // 5, size // 3))
    cx, cy = (int(v) for v in rng.integers(r, size - r, 2))
    box = [cx - r, cy - r, cx + r, cy + r]
    if shape == "square":
        d.rectangle(box, fill=colour)
    elif shape == "circle":
        d.ellipse(box, fill=colour)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    arr = np.asarray(img).astype(int) + rng.integers(-6, 7, (size, size, 3))
    where = ("top" if cy < size / 3 else "bottom" if cy > 2 * size / 3 else "middle") + (
        " left" if cx < size / 3 else " right" if cx > 2 * size / 3 else ""
    )
    return Image.fromarray(np.clip(arr, 0, 255).astype("uint8")), where


def make_shapes_dataset(root: str | Path, *, size: int = 32, train_per_combo: int = 1, val: int = 6, seed: int = 0) -> tuple[Path, Path]:
    """``root/train`` and ``root/val``: PNGs of a coloured shape with a ``.txt`` caption each; returns both folders."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = Path(root)
    train_dir, val_dir = out / "train", out / "val"
    combos = [(c, s) for c in COLOURS for s in SHAPES]
    jobs = [(train_dir, f"{c}-{s}-{k}", c, s) for k in range(train_per_combo) for c, s in combos]
    picks = rng.permutation(len(combos))[:val]
    jobs += [(val_dir, f"val-{i}-{combos[j][0]}-{combos[j][1]}", combos[j][0], combos[j][1]) for i, j in enumerate(picks)]
    for folder, name, colour, shape in jobs:
        folder.mkdir(parents=True, exist_ok=True)
        img, where = _draw(shape, COLOURS[colour], size, rng)
        img.save(folder / f"{name}.png")
        (folder / f"{name}.txt").write_text(f"a {colour} {shape} in the {where} of a plain white background", encoding="utf-8")
    return train_dir, val_dir


def make_squares_dataset(
    path: Path, n: int = 6, sizes: tuple[tuple[int, int], ...] = ((32, 32), (48, 32), (32, 48)), seed: int = 0
) -> Path:
    """``n`` images in ``path``: a coloured square whose colour the caption names, sizes cycling through ``sizes``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    names = list(SQUARE_COLOURS)
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        c = names[i % len(names)]
        arr = np.full((h, w, 3), 235, dtype=np.uint8)
        arr[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4] = SQUARE_COLOURS[c]
        arr = np.clip(arr.astype(int) + rng.integers(-8, 8, arr.shape), 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(path / f"img{i:02d}.png")
        (path / f"img{i:02d}.txt").write_text(f"a {c} square, simple, flat", encoding="utf-8")
    return path


#: File name of the answer key :func:`write_world_split` puts next to the images.
ANSWER_KEY = "world.json"


def write_world_split(folder: str | Path, samples: list[Any], concept: Any = None) -> Path:
    """Write shapes-world samples (:func:`te_align.tiny.world.make_dataset` with images) as ``NNNNN.png`` +
    ``NNNNN.txt`` into ``folder``, and the answer key ``world.json``: per file stem the scene's objects as
    ``[colour, shape, position, carries_concept]`` and the caption's style, for prompt-accuracy scoring."""
    from PIL import Image

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    items: dict[str, Any] = {}
    for s in samples:
        if s.image is None:
            raise ValueError("write_world_split: samples need images (make_dataset(image_size=...))")
        stem = f"{s.index:05d}"
        Image.fromarray(s.image).save(out / f"{stem}.png")
        (out / f"{stem}.txt").write_text(s.caption, encoding="utf-8")
        items[stem] = {
            "objects": [[o.colour, o.shape, o.position, bool(concept is not None and concept.carried_by(o))] for o in s.objects],
            "style": s.style,
        }
    concept_key = None
    if concept is not None:
        concept_key = {
            "attribute": concept.attribute,
            "value": concept.value,
            "holdout": [list(h) for h in concept.holdout],
        }
    key = {"format": 1, "concept": concept_key, "items": items}
    import json

    (out / ANSWER_KEY).write_text(json.dumps(key, indent=1, sort_keys=True), encoding="utf-8")
    return out


def read_answer_key(folder: str | Path) -> dict[str, Any] | None:
    """The answer key of a folder written by :func:`write_world_split`, or ``None`` when it has none."""
    import json

    path = Path(folder) / ANSWER_KEY
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("items"), dict):
        raise ValueError(f"{path}: not a shapes-world answer key (format 1)")
    return data
