"""Measured divergence: run a trainer's real prompt-encoding code next to :func:`te_align.encode`.

``te-align probe`` imports the encoding functions of an installed trainer (its ``probe`` adapter in
``te_align/trainers/<trainer>/``),
runs them on tiny random-weight encoders with real-convention tokenizers (:mod:`te_align.tiny`) over
the standard prompt suite, and compares every output tensor with what the alignment profile prescribes:
shape, max abs difference, mean cosine similarity and which prompts differ. ``te-align matrix`` does that for every trainer found x every family it
supports, with and without te-align's hooks.

This module is light; torch and the trainers are imported only when a probe runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from te_align.probe.core import ProbeResult, TensorComparison
    from te_align.probe.matrix import Found
    from te_align.trainers.api import ProbePart

# Function-local te_align imports in this module: keep the probe's submodules (and torch) off this package's import.

__all__ = ["ProbeError", "ProbeResult", "TensorComparison", "find_trainers", "probe", "run_matrix"]

from te_align.probe.errors import ProbeError


def probe(trainer: str, profile: str, probes: Mapping[str, ProbePart], path: str | None = None, *,
          hooks: bool = False) -> ProbeResult:
    """Probe one trainer x profile (see :func:`te_align.probe.run.probe`; :func:`te_align.parts.probe` resolves
    the trainer's probe part from the registry)."""
    from te_align.probe.run import probe as _probe

    return _probe(trainer, profile, probes, path, hooks=hooks)


def find_trainers(probes: Mapping[str, ProbePart]) -> tuple[list[Found], list[str]]:
    """(trainers present here, one line per trainer that is not) (see :func:`te_align.probe.matrix.find_trainers`)."""
    from te_align.probe.matrix import find_trainers as _find

    return _find(probes)


def run_matrix(probes: Mapping[str, ProbePart], **kwargs: Any) -> Any:
    """Probe every trainer found x every family it supports (see :func:`te_align.probe.matrix.run_matrix`)."""
    from te_align.probe.matrix import run_matrix as _run

    return _run(probes, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("ProbeResult", "TensorComparison"):
        from te_align.probe import core

        return getattr(core, name)
    raise AttributeError(name)
