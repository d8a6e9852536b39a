"""The typed trainer parts, resolved once from the trainer registry for the commands and the public API.

The engine (:mod:`te_align.audit`, :mod:`te_align.patching`, :mod:`te_align.probe`) never reads the registry: it
is handed the parts. These functions take a trainer name (``auto``: every trainer that has the part) the way the
commands do, resolve it here and call the engine. ``te-align check``'s are in :mod:`te_align.checking`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align.trainers import registry

if TYPE_CHECKING:  # pragma: no cover
    from te_align.patching.trainers import Detection
    from te_align.patching.transaction import Plan
    from te_align.probe.adapter import Adapter
    from te_align.probe.core import ProbeResult
    from te_align.probe.matrix import Found, Matrix
    from te_align.trainers.api import Patcher, ProbePart


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


# ------------------------------------------------------------------------------------------------ probe, matrix
def probe_trainers() -> tuple[str, ...]:
    """The trainers ``te-align probe`` can run (the registry's trainers with a ``probe`` part)."""
    return registry().names("probe")


def probes(trainer: str | None = None) -> dict[str, ProbePart]:
    """Trainer name -> :class:`~te_align.trainers.api.ProbePart`: the one ``trainer`` names (by name or alias), or
    every trainer's that has one (None), in registry order."""
    if trainer is None:
        return {s.name: s.part("probe") for s in registry().specs() if s.probe}
    spec = registry().lookup(trainer, "probe")
    if spec is None:
        from te_align.errors import closest
        from te_align.probe.errors import ProbeError

        known = probe_trainers()
        raise ProbeError(f"unknown trainer '{trainer}'; known: {', '.join(known)}{closest(trainer, known)}")
    return {spec.name: spec.part("probe")}


def adapter_for(trainer: str, path: str | None) -> Adapter:
    """The probe adapter of a trainer (by name or alias) for the installation at ``path``."""
    from te_align.probe.adapter import adapter_for as _adapter_for

    (name, part), = probes(trainer).items()
    return _adapter_for(name, path, {name: part})


def probe(trainer: str, profile: str, path: str | None = None, *, hooks: bool = False) -> ProbeResult:
    """Probe one trainer (by name or alias) x profile (:func:`te_align.probe.run.probe`)."""
    from te_align.probe.run import probe as _probe

    (name, part), = probes(trainer).items()
    return _probe(name, profile, {name: part}, path, hooks=hooks)


def find_trainers(environ: Mapping[str, str] | None = None) -> tuple[list[Found], list[str]]:
    """(trainers to probe, lines for trainers that are not here) (:func:`te_align.probe.matrix.find_trainers`)."""
    from te_align.probe.matrix import find_trainers as _find

    return _find(probes(), environ)


def run_matrix(**kwargs: Any) -> Matrix:
    """Probe every trainer found x every family it supports (:func:`te_align.probe.matrix.run_matrix`)."""
    from te_align.probe.matrix import run_matrix as _run

    return _run(probes(), **kwargs)


__all__ = ["adapter_for", "available", "detect", "find_trainers", "patched_root", "patchers", "plan_for", "probe",
           "probe_trainers", "probes", "run_matrix"]
