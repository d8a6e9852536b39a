"""What ``te-align check`` reports: findings per config file, and the exit code they add up to."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Severity = Literal["error", "warning", "info"]
Kind = Literal["deviation", "missing-key", "unknown-key", "unused-value", "stale-cache", "syntax", "wrong-value",
               "not-checked", "note", "effect"]
#: ``effect``: a key the trainer reads whose effect on the text side is not what its name suggests (a trainer's own
#: semantics: every caption dropped, a cache that ignores it); its severity says how much it costs.
Status = Literal["checked", "not-checked", "not-training", "unreadable"]

#: Exit codes of one file:
#:   0 aligned: at least one rule for this trainer and model family ran and every rule passed;
#:   1 deviations: any error or warning finding;
#:   2 unreadable input: missing file, syntax error, empty config, a value of the wrong type (file, key, line);
#:   3 not checked: te-align has no profile for the model the config trains, no rules for this trainer and
#:     family, the config is not a training job (a job that extracts a LoRA, generates images or caches latents
#:     only), or it is a dataset config given alone (it names no model; every trainer's reader says so alike).
#: Several files: the most serious, in the order 2 > 1 > 3 > 0.
EXIT_ALIGNED, EXIT_DEVIATIONS, EXIT_UNREADABLE, EXIT_NOT_CHECKED = 0, 1, 2, 3
_SERIOUSNESS = {EXIT_ALIGNED: 0, EXIT_NOT_CHECKED: 1, EXIT_DEVIATIONS: 2, EXIT_UNREADABLE: 3}


def combine_exit_codes(codes: list[int]) -> int:
    """The exit code of several files: the most serious one (2 > 1 > 3 > 0)."""
    return max(codes, key=lambda c: _SERIOUSNESS.get(c, 0), default=EXIT_ALIGNED)

NOT_SETTABLE = "not settable: use `te-align patch`"


@dataclass(frozen=True)
class Edit:
    """A finding's fix as data, for ``te-align check --fix``: set the trainer's config ``key`` (as the reader
    names it: ``model.t5_max_length``, ``text_encoder_2.sequence_length``) to ``value``, or remove it
    (``remove``; the trainer's default then holds), together with the keys in ``also`` that the trainer needs
    with it (e.g. a trainer's confirmation switch for a setting it warns about). Where the key lives in the file is the trainer's
    writer's business (:class:`te_align.trainers.api.ConfigWriter`)."""

    key: str
    value: object = None
    remove: bool = False
    also: tuple[tuple[str, object], ...] = ()
    #: Keys of ``also`` that switch off the trainer's own safety checks, with what they do (said by the trainer's
    #: rule): ``check --fix`` writes such a fix only with ``--allow-unsafe-keys`` (:mod:`te_align.audit.policy`).
    unsafe: tuple[tuple[str, str], ...] = ()


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
    effective: object = None
    profile: object = None
    source: str = ""
    fix: str = ""
    message: str = ""
    key: str | None = None
    trainer_source: str = ""
    line: int | None = None
    column: int | None = None
    #: The fix as data where a key or flag the trainer reads makes it (None: words only, or not settable).
    edit: Edit | None = None

    def to_dict(self) -> dict[str, object]:
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
    effective: dict[str, object] = field(default_factory=dict)
    #: ``checked`` (rules ran), ``not-checked`` (no profile / no rules), ``not-training``, ``unreadable``.
    status: Status = "checked"
    #: Why the file was not checked (``status`` not-checked / not-training).
    reason: str = ""
    #: The rules that compared a profile value (``path`` of each, with its config key when it has one).
    rules_ran: list[str] = field(default_factory=list)
    #: Profile overrides the file was checked with (``check --set``).
    overrides: dict[str, object] = field(default_factory=dict)
    #: The profile was assumed (no signal decided between it and another profile of its family): what and why.
    assumed: str = ""
    #: False for a command of a several-command file that was not checked while another command of it was: it does
    #: not count in the file's exit code (:func:`te_align.audit.check.exit_code`).
    in_exit: bool = True
    #: ``check --dataset``: the captions' token lengths per encoder slot (:func:`te_align.audit.dataset.report`).
    dataset: dict[str, object] | None = None

    @property
    def exit_code(self) -> int:
        if self.status == "unreadable" or any(f.kind in ("syntax", "wrong-value") for f in self.findings):
            return EXIT_UNREADABLE
        if any(f.severity in ("error", "warning") for f in self.findings):
            return EXIT_DEVIATIONS
        if self.status != "checked" or not self.rules_ran:
            return EXIT_NOT_CHECKED
        return EXIT_ALIGNED

    def to_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "trainer": self.trainer,
            "profile": self.profile,
            "family_reason": self.family_reason,
            "text_encoder_outputs_cached": self.cached,
            "exit_code": self.exit_code,
            "status": self.status,
            "reason": self.reason,
            "rules_ran": list(self.rules_ran),
            "overrides": dict(self.overrides),
            "assumed": self.assumed,
            "effective": self.effective,
            "findings": [f.to_dict() for f in self.findings],
            **({"dataset": self.dataset} if self.dataset is not None else {}),
        }
