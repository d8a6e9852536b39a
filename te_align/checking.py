"""``te-align check`` as a library: the trainer resolved once from the registry, its parts handed to the engine.

:func:`check_file` / :func:`check_files` / :func:`fix_file` take a path and a ``--trainer`` value (``auto``: the
file's shape decides) the way the command does; the engine (:mod:`te_align.audit`) is handed the
:class:`~te_align.trainers.api.CheckLanguages` of that value and never reads the registry. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from te_align import audit
from te_align.audit.check import exit_code
from te_align.trainers import registry

if TYPE_CHECKING:  # pragma: no cover
    from te_align.audit.findings import CheckResult
    from te_align.fixing.fix import FixReport
    from te_align.trainers.api import CheckLanguages


def languages(trainer: str = "auto") -> CheckLanguages:
    """What the engine is handed for ``--trainer TRAINER``."""
    return registry().check_languages(trainer)


def trainers() -> tuple[str, ...]:
    """Every ``--trainer`` value ``check`` reads (the config languages of the trainer registry)."""
    return tuple(d.name for d, _ in registry().dialects())


def check_file(path: str, *, trainer: str = "auto", **kw: Any) -> CheckResult:
    """Check one config file (options: :func:`te_align.audit.check.check_path`)."""
    return audit.check_path(path, languages(trainer), **kw)


def check_files(paths: Sequence[str], *, trainer: str = "auto", **kw: Any) -> list[CheckResult]:
    """Check each file; a file of several commands gives one result per command
    (:func:`te_align.audit.check.check_files`)."""
    return audit.check_files(paths, languages(trainer), **kw)


def fix_file(path: str, *, trainer: str = "auto", **kw: Any) -> FixReport:
    """``te-align check --fix`` on one config (options: :func:`te_align.fixing.fix.fix_file`)."""
    from te_align.fixing.fix import fix_file as fix

    return fix(path, languages(trainer), **kw)


__all__ = ["check_file", "check_files", "exit_code", "fix_file", "languages", "trainers"]
