"""The typed trainer parts, resolved once from the trainer registry for the commands and the public API.

The engine (:mod:`te_align.audit`, :mod:`te_align.patching`, :mod:`te_align.probe`) never reads the registry: it
is handed the parts. These functions take a trainer name (``auto``: every trainer that has the part) the way the
commands do, resolve it here and call the engine. ``te-align check``'s are in :mod:`te_align.checking`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from te_align.trainers import registry

if TYPE_CHECKING:  # pragma: no cover
    from te_align.patching.trainers import Detection
    from te_align.patching.transaction import Plan
    from te_align.trainers.api import Patcher


def available() -> list[str]:
    """The trainers ``te-align patch`` can patch (the registry's trainers with a ``patch`` part)."""
    return list(registry().names("patch"))


def patchers(trainer: str = "auto") -> dict[str, Patcher]:
    """Trainer name -> :class:`~te_align.trainers.api.Patcher`: the one ``trainer`` names (by name or alias), or
    every trainer's that has one (``auto``), in registry order."""
    from te_align.patching.transaction import PatchError

    if trainer == "auto":
        return {s.name: s.part("patch") for s in registry().specs() if s.patch}
    spec = registry().lookup(trainer, "patch")
    if spec is None:
        raise PatchError(f"unknown trainer '{trainer}'; known: {', '.join(available())}")
    return {spec.name: spec.part("patch")}


def detect(path: str | Path, trainer: str = "auto") -> Detection:
    """Which trainer installation ``path`` is (:func:`te_align.patching.trainers.detect`)."""
    from te_align.patching import trainers

    return trainers.detect(path, patchers(trainer))


def plan_for(detection: Detection, profile: str | None) -> Plan:
    """The detected trainer's plan (:func:`te_align.patching.trainers.plan_for`)."""
    from te_align.patching import trainers

    return trainers.plan_for(detection, registry().get(detection.trainer).part("patch"), profile)


def patched_root(path: str | Path) -> Path:
    """The folder holding te-align's patch state for ``path`` (:func:`te_align.patching.trainers.patched_root`)."""
    from te_align.patching import trainers

    return trainers.patched_root(path, patchers())


__all__ = ["available", "detect", "patched_root", "patchers", "plan_for"]
