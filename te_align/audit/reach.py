"""What ``check`` covers: for each trainer and model family, whether te-align has rules for it, and why not.

Read from each check dialect's own tables (torch-free): ``SUPPORTED`` (the families its reader accepts), ``RULES``
(a rule counts for a family when it names that family or one of its profiles; a rule for every family, ``"*"``, does
not make a family checked) and ``NOT_CHECKED`` (family -> why te-align has no rules for a family the trainer trains).
``te-align profile list`` prints it, and the README's trainer × family table is :func:`markdown_table`'s output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pragma: no cover
    from te_align.trainers.api import CheckDialect

Status = Literal["rules", "not-checked", "not-trained"]


@dataclass(frozen=True)
class Cell:
    """One trainer × family pair."""

    trainer: str
    family: str
    status: Status
    #: Family-specific rules (``rules``), else 0.
    rules: int = 0
    #: Why a family the trainer trains is not checked.
    why: str = ""


def family_cells(trainer: str, module: CheckDialect, families: Mapping[str, Iterable[str]]) -> list[Cell]:
    """The cells of one dialect module; ``families``: family -> its bundled profile names."""
    supported = set(getattr(module, "SUPPORTED", ()))
    not_checked: Mapping[str, str] = getattr(module, "NOT_CHECKED", {})
    rules = tuple(getattr(module, "RULES", ()))
    out = []
    for family, names in families.items():
        named = {family, *names}
        count = sum(1 for r in rules if named & set(r.families))
        if family in supported and count and family not in not_checked:
            out.append(Cell(trainer, family, "rules", count))
        elif family in not_checked or family in supported:
            out.append(Cell(trainer, family, "not-checked", 0, not_checked.get(family, "no rules yet")))
        else:
            out.append(Cell(trainer, family, "not-trained"))
    return out


def reach(dialects: Iterable[tuple[str, CheckDialect]], families: Mapping[str, Iterable[str]]) -> list[Cell]:
    """Every trainer × family cell, trainers merged over their dialects (the best status of any dialect wins)."""
    rank = {"rules": 2, "not-checked": 1, "not-trained": 0}
    best: dict[tuple[str, str], Cell] = {}
    for trainer, module in dialects:
        for cell in family_cells(trainer, module, families):
            key = (trainer, cell.family)
            old = best.get(key)
            if old is None or (rank[cell.status], cell.rules) > (rank[old.status], old.rules):
                best[key] = cell
    return list(best.values())


def markdown_table(cells: list[Cell], labels: Mapping[str, str]) -> str:
    """Families as rows, trainers as columns (``labels``: family -> how the README names it): ``✓ N`` rules,
    ``not checked¹`` with its reason in a numbered note, ``—`` not trained."""
    trainers = list(dict.fromkeys(c.trainer for c in cells))
    by = {(c.trainer, c.family): c for c in cells}
    notes: list[str] = []
    lines = ["| family | " + " | ".join(trainers) + " |", "| --- |" + " --- |" * len(trainers)]
    for family, label in labels.items():
        row = []
        for t in trainers:
            c = by[(t, family)]
            if c.status == "rules":
                row.append(f"✓ {c.rules}")
            elif c.status == "not-checked":
                text = f"{t}: {c.why}"
                if text not in notes:
                    notes.append(text)
                row.append(f"not checked ({notes.index(text) + 1})")
            else:
                row.append("—")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    if notes:
        lines.append("")
        lines += [f"({i}) {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"


__all__ = ["Cell", "family_cells", "markdown_table", "reach"]
