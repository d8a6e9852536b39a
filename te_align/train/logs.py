"""Run logs: a CSV file, TensorBoard events (when ``tensorboard`` is installed) and a loss-curve PNG.

``<output>/logs/train_log.csv`` has one row per logged optimizer step: step, epoch, loss, lr,
steps/s, elapsed seconds. On resume the rows after the resumed step are dropped first, so the
file always describes one consistent run. The loss-curve PNG is drawn with Pillow (no plotting
library needed): the raw loss in grey and its exponential moving average in blue.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import logging
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from te_align.train._io import write_atomic, writing

if TYPE_CHECKING:  # pragma: no cover
    from torch.utils.tensorboard import SummaryWriter

logger = logging.getLogger("te_align.train")

FIELDS = ("step", "epoch", "loss", "lr", "steps_per_s", "elapsed_s")


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's event writer thread dies on a write error (full disk) and Python prints its traceback;
    the same error is raised again in the main thread, where :class:`RunLog` reports it as one line."""
    previous = threading.excepthook
    if getattr(previous, "_te_align", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError):
            logger.debug("TensorBoard writer thread: %s", args.exc_value)
            return
        previous(args)

    hook._te_align = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class RunLog:
    def __init__(self, output_dir: Path, *, resume_step: int = 0, tensorboard: bool = True, enabled: bool = True) -> None:
        self.enabled = enabled
        self.dir = output_dir / "logs"
        self.csv_path = self.dir / "train_log.csv"
        self.writer: SummaryWriter | None = None
        if not enabled:
            return
        with writing(self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        rows: list[dict[str, str]] = []
        if resume_step and self.csv_path.is_file():
            with open(self.csv_path, newline="", encoding="utf-8") as f:
                rows = [r for r in csv.DictReader(f) if r.get("step", "").isdigit() and int(r["step"]) <= resume_step]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
        write_atomic(self.csv_path, buf.getvalue())
        with writing(self.csv_path):
            self._file = open(self.csv_path, "a", newline="", encoding="utf-8")
        self._csv = csv.DictWriter(self._file, fieldnames=FIELDS)
        if tensorboard:
            if importlib.util.find_spec("tensorboard") is None:
                logger.info("tensorboard is not installed: no TensorBoard event files (pip install tensorboard)")
            else:
                from torch.utils.tensorboard import SummaryWriter

                _quiet_tensorboard_thread()
                with writing(self.dir / "tensorboard"):
                    self.writer = SummaryWriter(str(self.dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step: int, epoch: int, loss: float, lr: float, steps_per_s: float, elapsed: float) -> None:
        if not self.enabled:
            return
        row = {
            "step": step,
            "epoch": epoch,
            "loss": f"{loss:.8g}",
            "lr": f"{lr:.6g}",
            "steps_per_s": f"{steps_per_s:.4g}",
            "elapsed_s": f"{elapsed:.2f}",
        }
        with writing(self.csv_path):
            self._csv.writerow(row)
            self._file.flush()
        if self.writer is not None:  # its background thread's write errors surface here and at close()
            with writing(self.dir / "tensorboard"):
                self.writer.add_scalar("train/loss", loss, step)
                self.writer.add_scalar("train/lr", lr, step)

    def close(self) -> None:
        if not self.enabled:
            return
        with contextlib.suppress(OSError):  # a full disk was reported where the row was written
            self._file.close()
        if self.writer is not None:
            writer, self.writer = self.writer, None
            with writing(self.dir / "tensorboard"):
                writer.close()


def read_losses(csv_path: Path) -> list[tuple[int, float]]:
    if not csv_path.is_file():
        return []
    with open(csv_path, newline="", encoding="utf-8") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


def plot_losses(points: Sequence[tuple[int, float]], path: Path, *, size: tuple[int, int] = (800, 400)) -> Path | None:
    """Draw the loss curve as a PNG (whole file or nothing); None when there are no finite points."""
    from PIL import Image, ImageDraw

    pts = [(s, v) for s, v in points if math.isfinite(v)]
    if not pts:
        return None
    w, h = size
    left, right, top, bottom = 60, 20, 20, 40
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    s0, s1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1)
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5

    def xy(s: float, v: float) -> tuple[float, float]:
        x = left + (s - s0) / (s1 - s0) * (w - left - right)
        y = top + (hi - v) / (hi - lo) * (h - top - bottom)
        return x, y

    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for frac in (0.0, 0.5, 1.0):
        v = lo + frac * (hi - lo)
        _, y = xy(s0, v)
        d.text((4, y - 6), f"{v:.3g}", fill="black")
    d.text((left, h - bottom + 6), f"step {s0}", fill="black")
    d.text((w - right - 80, h - bottom + 6), f"step {pts[-1][0]}", fill="black")
    d.text((left + 8, top + 4), "loss (grey) / EMA (blue)", fill="black")
    if len(pts) > 1:
        d.line([xy(s, v) for s, v in pts], fill=(170, 170, 170), width=1)
        ema, smoothed = pts[0][1], []
        for s, v in pts:
            ema = 0.9 * ema + 0.1 * v
            smoothed.append(xy(s, ema))
        d.line(smoothed, fill=(30, 80, 200), width=2)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    write_atomic(path, buf.getvalue())
    return path


__all__ = ["RunLog", "plot_losses", "read_losses"]
