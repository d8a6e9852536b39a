"""Dispatch of on-disk patching to the trainers' planners (the ``patch`` part of a trainer folder).

Each trainer's ``patch`` module (:mod:`te_align.trainers`) exposes::

    detect(path: Path) -> Detection | None    # is this an installation of mine? which layout/version?
    plan(detection: Detection, profile: str | None) -> Plan

``te-align patch PATH`` asks every trainer that has one (or the one named with ``--trainer``), in the
registry's order, and patches with the first that recognises PATH: the command resolves the patchers from the
registry (:mod:`te_align.parts`) and hands them down; this module looks nothing up.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from te_align._git import git_head
from te_align.patching.transaction import REMOVING, STATE_DIR, PatchError, Plan, lock, recover

if TYPE_CHECKING:  # the trainer contract, for annotations only
    from te_align.trainers.api import Patcher


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


def detect(path: str | Path, patchers: Mapping[str, Patcher]) -> Detection:
    """Find which trainer installation ``path`` is: each of ``patchers`` (trainer name -> its
    :class:`~te_align.trainers.api.Patcher`, handed down by the caller; in order) is asked, the first that
    recognises it wins. One-line errors name what was looked for."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PatchError(f"no such folder: {p}")
    if not p.is_dir():
        raise PatchError(f"not a folder: {p} (give the trainer's folder)")
    for patcher in patchers.values():
        found = patcher.detect(p)
        if found is not None:
            return found
    raise PatchError(
        f"{p} is not a trainer installation te-align can patch (looked for: {', '.join(patchers)})"
    )


def plan_for(detection: Detection, patcher: Patcher, profile: str | None) -> Plan:
    """The plan of ``patcher`` (the detected trainer's), made after recovering an interrupted earlier command
    (under the tree's lock: hold :func:`te_align.patching.transaction.lock` around this and ``apply`` to make
    both one step)."""
    with lock(detection.root):
        recover(detection.root)
        return patcher.plan(detection, profile)


def patched_root(path: str | Path, patchers: Mapping[str, Patcher]) -> Path:
    """The folder holding te-align's patch state for ``path`` (PATH itself or a sub-folder ``patchers`` detect)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PatchError(f"no such folder: {p}")
    if not p.is_dir():
        raise PatchError(f"not a folder: {p} (give the trainer's folder)")
    if any(os.path.lexists(p / name) for name in (STATE_DIR, REMOVING)):
        return p
    try:
        return detect(p, patchers).root
    except PatchError:
        return p
