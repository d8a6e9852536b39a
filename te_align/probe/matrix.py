"""``te-align matrix``: every trainer found x every family it supports, with and without te-align's hooks.

Trainers are found by their probe's ``find`` (:mod:`te_align.trainers`: a checkout named by the trainer's
environment variable, or its installed package), the way the test suite finds them. Each trainer's modules are
imported once and every profile is probed in that session. A cell whose hooks cannot be installed says why
("hooks unavailable: ...") instead of failing the matrix; a cell whose trainer code does not import in this
environment says "not importable here: <import error>".
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._atomic import atomic_file
from te_align._version import __version__
from te_align.probe.adapter import HooksUnavailable, NotImportable, adapter_for
from te_align.probe.core import ProbeResult, compare, quiet
from te_align.probe.errors import ProbeError
from te_align.profiles import profile as load

if TYPE_CHECKING:  # the trainer contract, for annotations only
    from te_align.trainers.api import ProbePart


@dataclass
class Found:
    """A trainer installation to probe (``path`` None: the installed package)."""

    trainer: str
    path: str | None
    how: str


@dataclass
class Cell:
    result: ProbeResult | None = None
    unavailable: str | None = None

    def text(self) -> str:
        if self.result is None:
            return str(self.unavailable)
        r = self.result
        return ("identical" if r.aligned else "**differs**") + " — " + r.summary().split(": ", 1)[1]


@dataclass
class Row:
    trainer: str
    profile: str
    plain: Cell
    hooked: Cell


@dataclass
class Matrix:
    rows: list[Row] = field(default_factory=list)
    #: One line per trainer that was not probed, with the reason.
    absent: list[str] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)
    prompts: int = 0

    def markdown(self) -> str:
        import diffusers
        import torch
        import transformers

        lines = [
            "# te-align trainer matrix",
            "",
            f"Measured by `te-align matrix` (te-align {__version__}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, diffusers {diffusers.__version__}): each trainer's real prompt-encoding code "
            "and `te_align.encode` run on the same tiny random-weight encoders with real-convention tokenizers over "
            f"the standard prompt suite (up to {self.prompts} prompts per profile, in groups encoded as one batch each). "
            "\"identical\" means bit-identical for every prompt and tensor; otherwise, per tensor: per-prompt shape "
            "(trainer vs profile), max |Δ| and mean cosine similarity (over the overlapping region when shapes "
            "differ) and how many prompts differ.",
            "",
            "| trainer | profile | trainer as installed | with te-align hooks |",
            "|---|---|---|---|",
        ]
        for r in self.rows:
            cells = [r.trainer, r.profile, r.plain.text(), r.hooked.text()]
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        if self.absent:
            lines += ["", "Not probed:", ""] + [f"- {a}" for a in self.absent]
        if self.notes:
            lines += ["", "How each trainer was called:", ""]
            for key, notes in self.notes.items():
                for n in notes:
                    lines.append(f"- {key}: {n}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        def cell(c: Cell) -> dict[str, Any]:
            return {"result": c.result.to_dict() if c.result else None, "unavailable": c.unavailable}

        return {
            "rows": [
                {"trainer": r.trainer, "profile": r.profile, "plain": cell(r.plain), "hooked": cell(r.hooked)}
                for r in self.rows
            ],
            "absent": self.absent,
            "notes": self.notes,
        }


def find_trainers(probes: Mapping[str, ProbePart],
                  environ: Mapping[str, str] | None = None) -> tuple[list[Found], list[str]]:
    """(trainers to probe, lines for trainers that are not here): each probe part's ``find`` (``probes``: trainer
    name -> :class:`~te_align.trainers.api.ProbePart`, handed down by the caller), in their order."""
    env = os.environ if environ is None else environ
    found: list[Found] = []
    absent: list[str] = []
    for part in probes.values():
        here, missing = part.find(env)
        found += here
        absent += missing
    return found, absent


def run_matrix(
    probes: Mapping[str, ProbePart],
    *,
    trainers: Sequence[Found] | None = None,
    profiles: Sequence[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Matrix:
    """Probe every trainer found (``trainers``, else each of ``probes`` finds its own) x profile (optionally only
    ``profiles``); write markdown to ``out``. ``probes``: trainer name -> its
    :class:`~te_align.trainers.api.ProbePart`, handed down by the caller."""
    wanted = None if profiles is None else {load(p).name for p in profiles}
    matrix = Matrix()
    if trainers is None:
        trainers, matrix.absent = find_trainers(probes, environ)
    for f in trainers:
        try:
            adapter = adapter_for(f.trainer, f.path, probes)
        except ProbeError as e:
            matrix.absent.append(f"{f.trainer} ({f.how}): {e}")
            continue
        label = adapter.label(f.path)
        names = [p for p in adapter.profiles if wanted is None or p in wanted]
        if not names:
            continue
        try:
            with quiet(), adapter.session():
                for name in names:
                    matrix.rows.append(_row(adapter, label, name, compare, HooksUnavailable, matrix))
        except ProbeError as e:
            matrix.absent.append(f"{label} ({f.how}): {e}")
    if out is not None:
        text = matrix.markdown()
        with atomic_file(Path(out), "w", error=ProbeError) as fh:
            fh.write(text)
    return matrix


def _row(adapter: Any, label: str, name: str, compare_fn: Any, unavailable_exc: type[Exception], matrix: Matrix) -> Row:
    try:
        case = adapter.case(name)
        tensors, labels = compare_fn(case)
    except NotImportable as e:  # a fact about this environment, not a failure
        msg = f"not importable here: {e.reason}"
        return Row(label, name, Cell(unavailable=msg), Cell(unavailable=msg))
    except Exception as e:  # one broken cell must not hide the others
        msg = f"probe failed: {type(e).__name__}: {e}"
        return Row(label, name, Cell(unavailable=msg), Cell(unavailable=msg))
    matrix.prompts = max(matrix.prompts, len(labels))
    matrix.notes[f"{label} {name}"] = list(case.notes)
    plain = Cell(ProbeResult(adapter.name, adapter.version, adapter.location, name, False, tensors, labels, list(case.notes)))
    try:
        with adapter.hooked(case.profile) as hook_notes:
            h_tensors, _ = compare_fn(case)
        hooked = Cell(ProbeResult(adapter.name, adapter.version, adapter.location, name, True, h_tensors, labels,
                                  [*case.notes, *hook_notes]))
    except unavailable_exc as e:
        hooked = Cell(unavailable=f"hooks unavailable: {e}")
    except Exception as e:
        hooked = Cell(unavailable=f"hooks unavailable: probe with hooks failed ({type(e).__name__}: {e})")
    return Row(label, name, plain, hooked)
