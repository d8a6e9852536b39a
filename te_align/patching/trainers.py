"""Registry of trainer planners for on-disk patching.

Each trainer module (``te_align.patching.<name>``) exposes::

    detect(path: Path) -> Detection | None    # is this an installation of mine? which layout/version?
    plan(detection: Detection, profile: str | None) -> Plan

``te-align patch PATH`` asks every registered module (or the one named with ``--trainer``) and
patches with the first that recognises PATH.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from te_align.patching.transaction import REMOVING, STATE_DIR, PatchError, Plan, lock, recover

#: trainer name -> module implementing detect()/plan()
PLANNERS: dict[str, str] = {
    "kohya": "te_align.patching.kohya",
    "ai-toolkit": "te_align.patching.ai_toolkit",
    "onetrainer": "te_align.patching.onetrainer",
    "simpletuner": "te_align.patching.simpletuner",
}


@dataclass(frozen=True)
class Detection:
    """What a planner found at a path."""

    trainer: str
    #: The folder that is patched (e.g. the sd-scripts submodule inside a kohya_ss GUI folder).
    root: Path
    layout: str
    version: str
    notes: tuple[str, ...] = field(default=())


def _module(name: str) -> ModuleType:
    return importlib.import_module(PLANNERS[name])


def available() -> list[str]:
    """The trainers ``te-align patch`` can patch."""
    return list(PLANNERS)


def detect(path: str | Path, trainer: str = "auto") -> Detection:
    """Find which trainer installation ``path`` is; one-line errors name what was looked for."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PatchError(f"no such folder: {p}")
    if not p.is_dir():
        raise PatchError(f"not a folder: {p} (give the trainer's folder)")
    names = available() if trainer == "auto" else [trainer]
    if trainer != "auto" and trainer not in PLANNERS:
        raise PatchError(f"unknown trainer '{trainer}'; known: {', '.join(PLANNERS)}")
    for name in names:
        found = _module(name).detect(p)
        if found is not None:
            return found
    raise PatchError(
        f"{p} is not a trainer installation te-align can patch (looked for: {', '.join(names)})"
    )


def plan_for(detection: Detection, profile: str | None) -> Plan:
    """The trainer's plan, made after recovering an interrupted earlier command (under the tree's lock:
    hold :func:`te_align.patching.transaction.lock` around this and ``apply`` to make both one step)."""
    with lock(detection.root):
        recover(detection.root)
        return _module(detection.trainer).plan(detection, profile)


def patched_root(path: str | Path) -> Path:
    """The folder holding te-align's patch state for ``path`` (PATH itself or a detected sub-folder)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PatchError(f"no such folder: {p}")
    if not p.is_dir():
        raise PatchError(f"not a folder: {p} (give the trainer's folder)")
    if any(os.path.lexists(p / name) for name in (STATE_DIR, REMOVING)):
        return p
    try:
        return detect(p).root
    except PatchError:
        return p
