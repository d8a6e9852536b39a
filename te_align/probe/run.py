"""One probe: a trainer's real encoding path (its adapter, :mod:`te_align.probe.adapter`) against the profile
(:mod:`te_align.probe.core`). ``te-align probe`` and :func:`te_align.probe.probe` run it."""

from __future__ import annotations

from te_align.probe.adapter import adapter_for
from te_align.probe.core import ProbeResult, compare, quiet


def probe(trainer: str, profile: str, path: str | None = None, *, hooks: bool = False) -> ProbeResult:
    """Import ``trainer``'s real encoding path (from ``path``, or the installed package) and probe ``profile``."""
    adapter = adapter_for(trainer, path)
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
