"""The dataset: kohya-style image folders, aspect-ratio buckets, caption processing and batch order.

Layout: ``DATA/*.png`` with ``DATA/*.txt`` captions, or repeat folders ``DATA/10_cat/*.png`` (each
image seen 10 times per epoch). Images without a caption are trained with an empty caption and
listed in a warning; unreadable images are skipped and listed.

The batch order is a pure function of ``(seed, epoch)``: images are shuffled within their bucket
(aspect ratio, and chunk count when long-prompt chunking is on), cut into batches, and the batches
shuffled. A run resumed at ``(epoch, batch)`` therefore sees exactly the batches an uninterrupted
run would have seen. Under data parallelism the batches are *global* (``batch_size x processes``
images, identical on every process) and each process trains its :meth:`BatchOrder.shard` of each
one, so N processes with batch b see the same data as one process with batch N x b. Per-step randomness (tag shuffle, dropout, noise) comes from a generator
seeded by ``(seed, step)``, so it needs no saved state either.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from te_align._paths import check_dir, read_bytes
from te_align.train.config import IMAGE_EXTENSIONS, DataConfig, TrainError

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger("te_align.train")

_REPEAT_DIR = re.compile(r"^(\d+)_(.*)$")


@dataclass
class Item:
    """One training image."""

    path: Path
    caption: str
    repeats: int
    size: tuple[int, int]  # original (width, height)
    bucket: tuple[int, int] = (0, 0)  # (width, height) in pixels


@dataclass
class ScanReport:
    items: list[Item]
    missing_captions: list[Path] = field(default_factory=list)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)


def _folder_repeats(path: Path, root: Path) -> int:
    for part in reversed(path.relative_to(root).parts[:-1]):
        m = _REPEAT_DIR.match(part)
        if m:
            return max(1, int(m.group(1)))
    return 1


def _listing(paths: Sequence[object], limit: int = 10) -> str:
    shown = [str(p) for p in paths[:limit]]
    more = f" … and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(shown) + more


#: Byte-order marks of the caption encodings that are detected (UTF-8's is optional).
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def read_caption(path: Path) -> str:
    """A caption file as text: UTF-8 (with or without a BOM) or UTF-16 with a BOM.

    Anything else (Latin-1, UTF-16 without a BOM, binary) raises ``ValueError`` saying what was
    found: guessing an encoding would train on mojibake, which no later step could notice.
    """
    raw = read_bytes(path, TrainError, what="caption file")
    encoding = "utf-8"
    for bom, enc in _BOMS:
        if raw.startswith(bom):
            raw, encoding = raw[len(bom) :], enc
            break
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    bad = next((c for c in text if (ord(c) < 32 and c not in "\t\n\r") or c == "\x7f"), None)
    if bad is not None:
        raise ValueError(f"holds control character U+{ord(bad):04X} (a binary file?)")
    return text.strip()


def _open_image(f: Path) -> tuple[int, int]:
    """(width, height) of an image that decodes completely (a truncated JPEG fails here, not mid-run)."""
    from PIL import Image

    with Image.open(f) as im:
        im.verify()
    with Image.open(f) as im:
        im.load()
        return int(im.width), int(im.height)


def scan(cfg: DataConfig) -> ScanReport:
    """Find images and captions; raise :class:`TrainError` for a missing or empty folder.

    Every image is decoded completely; one that does not decode (truncated, corrupt, not an image)
    is skipped and listed in a warning. Caption files must be UTF-8 (a BOM is allowed) or UTF-16
    with a BOM; any other caption file stops the scan with one line listing them all (see
    :func:`read_caption`). Images without a caption file are trained with an empty caption and listed.
    """
    root = Path(cfg.path).expanduser()
    if not os.path.lexists(root):
        raise TrainError("dataset folder does not exist", file=str(root), key="data.path")
    try:
        check_dir(root, TrainError, what="dataset folder")
    except TrainError as e:
        raise TrainError(e.message, file=e.file, key="data.path") from None
    files = sorted(p for p in _walk(root) if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))
    if not files:
        raise TrainError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in the dataset folder", file=str(root), key="data.path")
    report = ScanReport(items=[])
    bad_captions: list[str] = []
    for f in files:
        try:
            size = _open_image(f)
        except Exception as e:  # PIL raises many types for broken files
            report.unreadable.append((f, f"{type(e).__name__}: {e}".splitlines()[0]))
            continue
        cap_path = f.with_suffix(cfg.caption_extension)
        if os.path.lexists(cap_path):
            try:
                caption = read_caption(cap_path)
            except (ValueError, TrainError) as e:
                bad_captions.append(f"{cap_path} ({e.message if isinstance(e, TrainError) else e})")
                continue
        else:
            caption = ""
            report.missing_captions.append(f)
        report.items.append(Item(f, caption, _folder_repeats(f, root) * cfg.repeats, size))
    if bad_captions:
        raise TrainError(
            f"{len(bad_captions)} caption file(s) cannot be read as UTF-8 (with or without a BOM) or UTF-16 with a BOM: "
            f"{_listing(bad_captions)}; save them as UTF-8",
            file=str(root), key="data.path",
        )
    if report.unreadable:
        logger.warning(
            "skipping %d unreadable image(s): %s",
            len(report.unreadable),
            _listing([f"{p} ({why})" for p, why in report.unreadable]),
        )
    if report.missing_captions:
        logger.warning(
            "%d image(s) have no %s caption and are trained with an empty caption: %s",
            len(report.missing_captions),
            cfg.caption_extension,
            _listing(report.missing_captions),
        )
    if not report.items:
        raise TrainError("no readable images in the dataset folder", file=str(root), key="data.path")
    return report


def _walk(root: Path) -> list[Path]:
    """Regular files under ``root``; symlinked folders are followed once each (a symlink loop ends the walk there)."""
    out = []
    seen: set[tuple[int, int]] = set()
    for folder, dirs, names in os.walk(root, followlinks=True):
        try:
            st = os.stat(folder)
        except OSError:
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        for n in names:
            p = Path(folder) / n
            try:
                if p.is_file():
                    out.append(p)
            except OSError:  # a symlink loop or an unreadable entry is not an image
                continue
    return out


# ------------------------------------------------------------------------------------------ buckets
def make_buckets(cfg: DataConfig, multiple: int) -> list[tuple[int, int]]:
    """(width, height) buckets of about ``resolution²`` pixels, sides multiples of ``bucket_step``."""
    step = cfg.bucket_step
    if step % multiple:
        raise TrainError(
            f"must be a multiple of {multiple} for this model (VAE scale x patch size), got {step}", key="data.bucket_step"
        )
    side = max(step, cfg.resolution // step * step)
    if not cfg.enable_bucketing:
        return [(side, side)]
    area = cfg.resolution * cfg.resolution
    out = {(side, side)}
    w = max(step, cfg.min_bucket // step * step)
    while w <= cfg.max_bucket:
        h = min(cfg.max_bucket, area // w // step * step)
        if h >= max(step, cfg.min_bucket):
            out.add((w, h))
            out.add((h, w))
        w += step
    return sorted(out)


def assign_bucket(size: tuple[int, int], buckets: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The bucket whose aspect ratio is closest to the image's (ties: the larger area)."""
    ratio = math.log(size[0] / size[1])
    return min(buckets, key=lambda b: (abs(math.log(b[0] / b[1]) - ratio), -b[0] * b[1]))


def _resized(size: tuple[int, int], bucket: tuple[int, int]) -> tuple[int, int]:
    w, h = size
    bw, bh = bucket
    scale = max(bw / w, bh / h)
    return max(bw, round(w * scale)), max(bh, round(h * scale))


def crop_for(item: Item) -> tuple[int, int]:
    """(top, left) of the centre crop that :func:`load_pixels` takes (SDXL crop conditioning)."""
    nw, nh = _resized(item.size, item.bucket)
    return (nh - item.bucket[1]) // 2, (nw - item.bucket[0]) // 2


def load_pixels(item: Item, flip: bool = False) -> tuple[torch.Tensor, tuple[int, int]]:
    """The image resized to cover its bucket and centre-cropped, as (3, H, W) in [-1, 1], and the crop (top, left)."""
    import numpy as np
    import torch
    from PIL import Image

    bw, bh = item.bucket
    with Image.open(item.path) as im:
        im = im.convert("RGB")
        nw, nh = _resized(im.size, item.bucket)
        im = im.resize((nw, nh), Image.Resampling.BICUBIC)
        top, left = (nh - bh) // 2, (nw - bw) // 2
        im = im.crop((left, top, left + bw, top + bh))
        if flip:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = np.asarray(im, dtype=np.float32).copy()
    t = torch.from_numpy(arr).permute(2, 0, 1) / 127.5 - 1.0
    return t, (top, left)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------- captions
def process_caption(caption: str, cfg: DataConfig, gen: torch.Generator) -> str:
    """Tag shuffle with the first ``keep_tokens`` tags kept in place."""
    import torch

    if not cfg.shuffle_tags or not caption:
        return caption
    sep = cfg.tag_separator
    tags = [t.strip() for t in caption.split(sep)]
    tags = [t for t in tags if t]
    keep, rest = tags[: cfg.keep_tokens], tags[cfg.keep_tokens :]
    if len(rest) > 1:
        order = torch.randperm(len(rest), generator=gen).tolist()
        rest = [rest[i] for i in order]
    joiner = sep + " " if sep.strip() else sep
    return joiner.join(keep + rest)


def step_generator(seed: int, step: int, stream: int | str = 0) -> torch.Generator:
    """A generator whose state depends only on (seed, step, stream): resumed runs draw the same numbers. ``stream``
    names a purpose (the micro-batch index for the step's main stream; a string for a stream of its own)."""
    import torch

    mixed = int.from_bytes(hashlib.sha256(f"{seed}:{step}:{stream}".encode()).digest()[:8], "little") & ((1 << 63) - 1)
    return torch.Generator().manual_seed(mixed)


# ------------------------------------------------------------------------------------------- order
@dataclass(frozen=True)
class Position:
    """Where the batch stream is: the next batch to read is ``batches(epoch)[index]``."""

    epoch: int = 0
    index: int = 0


class BatchOrder:
    """Deterministic per-epoch global batches of item indices, bucketed by image bucket.

    Captions of different long-prompt chunk counts share a batch (the text source pads each to the batch's chunk
    count, as kohya pads every caption to ``max_token_length``), so a run's batches never depend on how its captions
    are encoded: two runs that differ only in text conditioning train on the same batches.

    A global batch holds ``batch_size * world`` indices and is the same on every process; process
    ``rank`` trains the slice :meth:`shard` gives it. With ``world = 1`` this is the plain batch order.
    """

    def __init__(self, items: Sequence[Item], batch_size: int, seed: int, rank: int = 0, world: int = 1) -> None:
        self.items = list(items)
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world = max(1, world)
        self._cache: dict[int, list[list[int]]] = {}

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The global batches of ``epoch`` (identical on every process)."""
        if epoch in self._cache:
            return self._cache[epoch]
        import torch

        size = self.global_batch_size
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, it in enumerate(self.items):
            groups.setdefault((it.bucket[0], it.bucket[1]), []).extend([i] * it.repeats)
        batches: list[list[int]] = []
        for key in sorted(groups):
            idx = groups[key]
            perm = torch.randperm(len(idx), generator=gen).tolist()
            shuffled = [idx[j] for j in perm]
            batches.extend(shuffled[k : k + size] for k in range(0, len(shuffled), size))
        order = torch.randperm(len(batches), generator=gen).tolist()
        batches = [batches[j] for j in order]
        self._cache = {epoch: batches}
        return batches

    def shard(self, n: int) -> tuple[int, int]:
        """This process's ``[lo, hi)`` slice of a global batch of ``n`` indices.

        A full batch gives every process exactly ``batch_size``; a short last batch of a bucket is
        split as evenly as possible, so a slice may be empty when ``n < world`` (the caller then
        runs a zero-weight step to keep the gradient all-reduce in step).
        """
        return self.rank * n // self.world, (self.rank + 1) * n // self.world

    def stream(self, start: Position) -> Iterator[tuple[Position, list[int]]]:
        """Batches from ``start`` on, forever; yields (position after this batch, batch)."""
        epoch, index = start.epoch, start.index
        while True:
            batches = self.epoch_batches(epoch)
            while index < len(batches):
                batch = batches[index]
                index += 1
                nxt = Position(epoch, index) if index < len(batches) else Position(epoch + 1, 0)
                yield nxt, batch
            epoch, index = epoch + 1, 0

    def batches_per_epoch(self) -> int:
        return len(self.epoch_batches(0))


__all__ = [
    "IMAGE_EXTENSIONS",
    "BatchOrder",
    "Item",
    "Position",
    "ScanReport",
    "assign_bucket",
    "crop_for",
    "load_pixels",
    "make_buckets",
    "process_caption",
    "scan",
    "step_generator",
]
