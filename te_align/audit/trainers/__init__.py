"""Per-trainer tables and readers. Each module exposes ``RULES`` (the data table), ``CACHE`` and
``parse(raw, extra_args) -> Parsed``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from te_align.audit.findings import Finding
from te_align.audit.rules import Trainer


@dataclass(frozen=True)
class CacheSpec:
    """How a trainer caches text-encoder outputs and what its reuse check compares."""

    glob: tuple[str, ...]
    validates: str
    source: str
    #: How to force a rebuild, in the trainer's terms.
    rebuild: str


@dataclass
class Parsed:
    """A config read the way the trainer reads it."""

    trainer: Trainer
    values: dict[str, Any]
    profile_guess: str | None
    family_reason: str
    cached: bool
    cache: CacheSpec | None
    findings: list[Finding] = field(default_factory=list)
    #: Families this trainer can train (profile families); others are reported as unsupported.
    supported: tuple[str, ...] = ()
    #: The guess is only a default (no model named): ``--profile`` of another family is accepted.
    guess_is_default: bool = False
    #: Set when the config cannot be checked: the reason ("te-align has no profile for Z-Image …").
    not_checked: str = ""
    #: ``not-checked`` or ``not-training``.
    not_checked_status: str = "not-checked"
    #: Extra facts for converters (``Context.extra``), e.g. caption statistics.
    extra: dict[str, Any] = field(default_factory=dict)
    #: Trainer-specific findings computed once the profile is known: ``after(profile, ctx) -> [Finding]``.
    after: Any = None


MODULES = {
    "kohya": "te_align.audit.trainers.kohya",
    "kohya-gui": "te_align.audit.trainers.kohya_gui",
    "ai-toolkit": "te_align.audit.trainers.ai_toolkit",
    "simpletuner": "te_align.audit.trainers.simpletuner",
    "onetrainer": "te_align.audit.trainers.onetrainer",
}


def module(name: str) -> ModuleType:
    return importlib.import_module(MODULES[name])


def unknown_key_finding(key: str, valid: Any, *, trainer: str, line: int | None, severity: str = "warning",
                        behaviour: str, hint: str | None = None, section: str = "") -> Finding:
    """An unknown key with the closest valid key (or a trainer-specific hint)."""
    from difflib import get_close_matches

    where = f"{section}.{key}" if section else key
    close = get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    if hint:
        fix = hint
    elif close:
        fix = f"did you mean '{close[0]}'?"
    else:
        fix = "remove it"
    return Finding(
        kind="unknown-key",
        severity="error" if severity == "error" else "warning",
        setting=where,
        message=f"unknown key '{where}': {behaviour}",
        fix=fix,
        key=where,
        line=line,
        trainer_source=trainer,
    )
