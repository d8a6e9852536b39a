"""Dispatch of on-disk patching to the trainers' planners (the ``patch`` part of a trainer folder).

Each trainer's ``patch`` module (:mod:`te_align.trainers`) exposes::

    detect(path: Path) -> Detection | None    # is this an installation of mine? which layout/version?
    plan(detection: Detection, profile: str | None) -> Plan

``te-align patch PATH`` asks every trainer that has one (or the one named with ``--trainer``), in the
registry's order, and patches with the first that recognises PATH.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from te_align import _plugins
from te_align._git import git_head
from te_align.patching.transaction import REMOVING, STATE_DIR, PatchError, Plan, lock, recover


@dataclass(frozen=True)
class Detection:
    """What a planner found at a path."""

    trainer: str
    #: The folder that is patched (may be a sub-folder of the path given, e.g. a submodule the trainer runs).
    root: Path
    layout: str
    version: str
    notes: tuple[str, ...] = field(default=())


def commit_version(root: Path, supported: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """A git checkout's version (its HEAD, short) and the notes a detection gives when it is not a commit the hooks
    were verified with (``supported``) or not a git checkout at all (the hook targets are then checked in the source)."""
    head = git_head(root)
    if head is None:
        return "unknown (no git)", ("not a git checkout: the hook targets are checked in the source instead",)
    supported = tuple(supported)
    if head in supported:
        return head[:7], ()
    verified = ", ".join(c[:7] for c in supported)
    return head[:7], (f"commit {head[:7]} is not one te-align was verified with ({verified}); hook targets are "
                      "checked in the source",)


def _module(name: str) -> ModuleType:
    return _plugins.registry().get(name).part("patch")


def available() -> list[str]:
    """The trainers ``te-align patch`` can patch (the registry's trainers with a ``patch`` part)."""
    return list(_plugins.registry().names("patch"))


def detect(path: str | Path, trainer: str = "auto") -> Detection:
    """Find which trainer installation ``path`` is; one-line errors name what was looked for."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PatchError(f"no such folder: {p}")
    if not p.is_dir():
        raise PatchError(f"not a folder: {p} (give the trainer's folder)")
    spec = None if trainer == "auto" else _plugins.registry().lookup(trainer, "patch")
    if trainer != "auto" and spec is None:
        raise PatchError(f"unknown trainer '{trainer}'; known: {', '.join(available())}")
    names = [spec.name] if spec is not None else available()
    for name in names:
        found: Detection | None = _module(name).detect(p)
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
        plan: Plan = _module(detection.trainer).plan(detection, profile)
        return plan


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
