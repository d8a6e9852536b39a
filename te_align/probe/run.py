"""One probe: a trainer's real encoding path (its adapter, :mod:`te_align.probe.adapter`) against the profile
(:mod:`te_align.probe.core`). ``te-align probe`` and :func:`te_align.parts.probe` run it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from te_align.probe.adapter import adapter_for
from te_align.probe.core import ProbeResult, compare, quiet

if TYPE_CHECKING:  # the trainer contract, for annotations only
    from te_align.trainers.api import ProbePart


def probe(trainer: str, profile: str, probes: Mapping[str, ProbePart], path: str | None = None, *,
          hooks: bool = False) -> ProbeResult:
    """Import ``trainer``'s real encoding path (from ``path``, or the installed package) and probe ``profile``
    (``probes``: trainer name -> its :class:`~te_align.trainers.api.ProbePart`, handed down by the caller)."""
    adapter = adapter_for(trainer, path, probes)
    name = adapter.profile_name(profile)
    with quiet(), adapter.session():
        case = adapter.case(name)
        if hooks:
            with adapter.hooked(case.profile) as hook_notes:
                tensors, labels = compare(case)
            notes = [*case.notes, *hook_notes]
        else:
            tensors, labels = compare(case)
            notes = list(case.notes)
    return ProbeResult(adapter.name, adapter.version, adapter.location, name, hooks, tensors, labels, notes)


__all__ = ["probe"]
