"""What ``te-align check`` reports: findings per config file, and the exit code they add up to."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
Kind = Literal["deviation", "unknown-key", "unused-value", "stale-cache", "syntax", "note"]

#: Exit codes: 0 aligned, 1 deviations (any error or warning finding), 2 unreadable input.
EXIT_ALIGNED, EXIT_DEVIATIONS, EXIT_UNREADABLE = 0, 1, 2

NOT_SETTABLE = "not settable: use `te-align patch`"


@dataclass(frozen=True)
class Finding:
    """One line of the report.

    ``setting`` is a slot-relative profile path (``t5.tokenizer.max_length``) for deviations and a
    config key for the other kinds. ``source`` is where the profile value comes from
    (``profile.provenance_of``); ``trainer_source`` is where the trainer's behaviour was read.
    """

    kind: Kind
    severity: Severity
    setting: str
    effective: Any = None
    profile: Any = None
    source: str = ""
    fix: str = ""
    message: str = ""
    key: str | None = None
    trainer_source: str = ""
    line: int | None = None
    column: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckResult:
    """Findings for one config file."""

    file: str
    trainer: str | None = None
    profile: str | None = None
    family_reason: str = ""
    cached: bool = False
    findings: list[Finding] = field(default_factory=list)
    effective: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if any(f.kind == "syntax" for f in self.findings):
            return EXIT_UNREADABLE
        if any(f.severity in ("error", "warning") for f in self.findings):
            return EXIT_DEVIATIONS
        return EXIT_ALIGNED

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "trainer": self.trainer,
            "profile": self.profile,
            "family_reason": self.family_reason,
            "text_encoder_outputs_cached": self.cached,
            "exit_code": self.exit_code,
            "effective": self.effective,
            "findings": [f.to_dict() for f in self.findings],
        }
