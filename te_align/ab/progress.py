"""Progress of ``te-align demo`` and ``te-align ab matrix``: the unit (row x seed) that runs, its phase, and an ETA.

Nothing here runs inside a unit. A monitor thread in the parent process reads what every running unit already writes
(:func:`unit_phase`): its world data, each arm's training log (``runs/seed-<s>/<arm>/logs/train_log.csv``, one row
per step, with the step rate) and its ``ab_state.json`` (which arms are trained and scored). So the same display
follows one in-process unit (``--workers 1``, the demo) and several worker processes.

On a terminal (stderr a TTY) one status line is redrawn in place; otherwise a plain line is written at every change
of phase and every ``interval`` seconds. The ETA comes from measured unit times (:func:`eta`): until the first unit
has finished it says it is calibrating and gives the current arm's own remaining time from its step rate.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

#: The unit folder's A/B state (``te_align.ab.runner.STATE_FILE``; not imported: the runner loads torch).
STATE_FILE = "ab_state.json"
#: The world data's answer key (``te_align.tiny.datasets.ANSWER_KEY``): present once a split is written.
ANSWER_KEY = "world.json"


def duration(seconds: float) -> str:
    """``m:ss`` under an hour, ``h:mm:ss`` above (whole seconds, rounded)."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


@dataclass(frozen=True)
class Phase:
    """What a unit is doing: ``name`` (e.g. "training arm A"), the step and steps of a training phase, and the
    seconds that phase still needs at its measured step rate (None when not training or not yet measured)."""

    name: str
    step: int | None = None
    total: int | None = None
    left: float | None = None

    def text(self) -> str:
        return self.name + (f", step {self.step}/{self.total}" if self.step is not None and self.total else "")


def _last_log_row(path: Path) -> dict[str, str] | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, io.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read().decode("utf-8", "replace")
            f.seek(0)
            head = f.readline().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line for line in tail.splitlines() if line.strip()]
    if not lines or not head.startswith("step,"):
        return None
    rows = list(csv.DictReader([head, lines[-1]]))
    row = rows[0] if rows else None
    return row if row and (row.get("step") or "").isdigit() else None


def unit_phase(unit: Path, seed: int, steps: int, arms: Sequence[str] = ("A", "B")) -> Phase:
    """The phase of the unit in folder ``unit`` (one seed of one row, ``steps`` training steps per arm), read from
    the files it writes."""
    if not (unit / "profiles").is_dir():
        return Phase("starting")
    try:
        state = json.loads((unit / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    runs = state.get("runs") or {}
    if not any((d / "val" / ANSWER_KEY).is_file() for d in (unit / "data", unit / "data" / f"seed-{seed}")):
        return Phase("building the world data")
    for arm in arms:
        if runs.get(f"{seed}/{arm}", {}).get("trained"):
            continue
        row = _last_log_row(unit / "runs" / f"seed-{seed}" / arm / "logs" / "train_log.csv")
        if row is None:
            return Phase(f"loading the base, encoding arm {arm}'s captions")
        step = int(row["step"])
        try:
            rate = float(row.get("steps_per_s") or "nan")
        except ValueError:
            rate = float("nan")
        left = (steps - step) / rate if rate > 0 else None
        return Phase(f"training arm {arm}", step, steps, left)
    if "divergence" not in state:
        return Phase("loading the base for scoring")
    for arm in arms:
        if not runs.get(f"{seed}/{arm}", {}).get("evaluated"):
            return Phase(f"sampling and scoring arm {arm}")
    return Phase("writing the result")


def eta(unit_seconds: Sequence[float], not_started: int, running_elapsed: Sequence[float], workers: int) -> float | None:
    """Seconds left: every unit not started takes the mean measured unit time, every running unit that time less
    what it has run (at least nothing), shared by the workers. None before a unit has finished (nothing measured)."""
    if not unit_seconds:
        return None
    per_unit = statistics.fmean(unit_seconds)
    work = per_unit * not_started + sum(max(0.0, per_unit - e) for e in running_elapsed)
    busy = max(1, min(workers, not_started + len(running_elapsed)))
    return work / busy


def status_line(
    *,
    label: str,
    done: int,
    total: int,
    running: Sequence[tuple[str, Phase]],
    stage: str,
    elapsed: float,
    left: float | None,
) -> str:
    """The progress line: ``label: [unit/total] what runs | elapsed | ETA``. ``running``: (unit name, phase) of each
    running unit; ``stage`` when none runs; ``left`` from :func:`eta` (None: still calibrating)."""
    if running:
        what = "; ".join(f"{name}: {phase.text()}" for name, phase in running)
        n = min(total, done + 1) if len(running) == 1 else done
        head = f"[{n}/{total}]" if len(running) == 1 else f"[{done}/{total} done, {len(running)} running]"
        what = f"{head} {what}"
    else:
        what = stage
    if left is not None:
        tail = f"about {duration(left)} left"
    elif running and done < total:
        arm_left = [p.left for _, p in running if p.left is not None]
        tail = "ETA after the first unit" + (f" (this arm: {duration(max(arm_left))} left)" if arm_left else "")
    else:
        tail = ""
    return f"{label}: {what} | {duration(elapsed)} elapsed" + (f" | {tail}" if tail else "")


@dataclass
class _Unit:
    name: str
    folder: Path
    seed: int
    steps: int
    arms: tuple[str, ...]
    started: float | None = None


class Progress:
    """The status of a run of units, shown on ``stream`` (stderr) inside ``with progress:``; :meth:`say` prints the
    command's own lines (stdout) without breaking the status line. Units run in plan order, ``workers`` at a time
    (as a process pool takes them), so the first unfinished ones are the running ones."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        out: Callable[[str], None] | None = None,
        tty: bool | None = None,
        interval: float = 30.0,
        refresh: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        stage: str = "starting",
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.out = out or (lambda line: print(line, flush=True))
        self.tty = self.stream.isatty() if tty is None else tty
        # how often the units' files are read: twice a second for the TTY line, every 2 s for plain lines
        self.interval, self.clock = interval, clock
        self.refresh = refresh if refresh is not None else (0.5 if self.tty else 2.0)
        self.t0 = clock()
        self.units: dict[str, _Unit] = {}
        self.finished: dict[str, float] = {}
        self.workers = 1
        self.stage_name = stage
        self._in_units = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = ""  # the status line on screen (TTY)
        self._last_key: tuple[object, ...] = ()
        self._last_emit = -1e9

    # -- what the command tells it
    def plan(self, units: Sequence[tuple[str, Path, int, int, Sequence[str]]], workers: int = 1) -> None:
        """The units about to run, in the order they start: (name, folder, seed, steps per arm, arms in training
        order)."""
        with self._lock:
            self.units = {n: _Unit(n, f, s, st, tuple(a)) for n, f, s, st, a in units}
            self.finished, self.workers, self._in_units = {}, max(1, workers), bool(units)
        self.update(force=True)

    def unit_done(self, name: str) -> None:
        """Unit ``name`` has finished: its wall time (since it started running) calibrates the ETA."""
        with self._lock:
            u = self.units[name]
            now = self.clock()
            self.finished[name] = now - (u.started if u.started is not None else now)
        self.update(force=True)

    def stage(self, name: str) -> None:
        """A step of the command itself (shown while no unit runs), e.g. "writing the report"."""
        with self._lock:
            self.stage_name, self._in_units = name, False
        self.update(force=True)

    def say(self, line: str) -> None:
        """One of the command's own lines (to ``out``), the status line redrawn after it."""
        with self._lock:
            if self.tty and self._shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
            self.out(line)
            if self.tty and self._shown:
                self.stream.write(self._shown)
                self.stream.flush()

    # -- the display
    def _running(self, now: float) -> list[tuple[str, Phase, float]]:
        out: list[tuple[str, Phase, float]] = []
        for u in self.units.values():
            if u.name in self.finished:
                continue
            if len(out) == self.workers:
                break
            if u.started is None:
                u.started = now
            out.append((u.name, unit_phase(u.folder, u.seed, u.steps, u.arms), now - u.started))
        return out

    def status(self) -> tuple[str, tuple[object, ...]]:
        """(the status line, its key: what changes it other than the clock and the step)."""
        now = self.clock()
        with self._lock:
            running = self._running(now) if self._in_units else []
            done, total = len(self.finished), len(self.units)
            not_started = total - done - len(running)
            left = eta(list(self.finished.values()), not_started, [e for *_, e in running], self.workers) if running else None
            if left is not None:  # never less than the running arms still need at their own rate
                left = max([left] + [p.left for _, p, _ in running if p.left is not None])
            text = status_line(label=self.label, done=done, total=total, running=[(n, p) for n, p, _ in running],
                               stage=self.stage_name, elapsed=now - self.t0, left=left)  # fmt: skip
            key = (self._in_units, self.stage_name, done, tuple((n, p.name) for n, p, _ in running))
        return text, key

    def update(self, *, force: bool = False) -> None:
        text, key = self.status()
        now = self.clock()
        with self._lock:
            if self.tty:
                shown = text[: shutil.get_terminal_size((100, 20)).columns - 1]
                self.stream.write("\r\033[K" + shown)
                self.stream.flush()
                self._shown = shown
            elif force or key != self._last_key or now - self._last_emit >= self.interval:
                self.stream.write(text + "\n")
                self.stream.flush()
                self._last_key, self._last_emit = key, now

    def _watch(self) -> None:
        while not self._stop.wait(self.refresh):
            self.update()

    def __enter__(self) -> Progress:
        self.update(force=True)
        self._thread = threading.Thread(target=self._watch, name="te-align-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.tty and self._shown:
                self.stream.write("\r\033[K")
                self._shown = ""
            if exc[0] is None:  # a failure says its own line
                self.stream.write(f"{self.label}: done in {duration(self.clock() - self.t0)}\n")
            self.stream.flush()


__all__ = ["Phase", "Progress", "duration", "eta", "status_line", "unit_phase"]
