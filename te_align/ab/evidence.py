"""What the committed effects matrix measured about a ``te-align check`` finding: :mod:`te_align.audit.evidence`,
re-exported here where the effects matrix's readers have always found it."""

from __future__ import annotations

from te_align.audit.evidence import (
    DOCUMENT,
    MEASURES,
    SUMMARY,
    Measure,
    _load,
    combined_line,
    evidence_for,
    measured_direction,
    summary,
)

__all__ = ["DOCUMENT", "MEASURES", "SUMMARY", "Measure", "_load", "combined_line", "evidence_for",
           "measured_direction", "summary"]
