"""Static audit of trainer configs against alignment profiles (``te-align check``).

Each trainer has one data table of :class:`~te_align.audit.rules.Rule` rows
(``te_align.audit.parsed.<trainer>.RULES``: key, default, meaning, profile path, fix, source
file:line) evaluated by one mechanism (:func:`~te_align.audit.rules.evaluate`). No torch.
Exit codes per file (:mod:`te_align.audit.findings`): 0 aligned (rules ran and passed), 1 deviations,
2 unreadable input, 3 not checked (no profile or no rules for the model, or not a training job).
"""

from te_align.audit import readers
from te_align.audit.check import check_file, check_files, exit_code
from te_align.audit.findings import CheckResult, Finding
from te_align.audit.rules import Rule

__all__ = ["TRAINERS", "CheckResult", "Finding", "Rule", "check_file", "check_files", "exit_code"]


def __getattr__(name: str) -> object:
    if name == "TRAINERS":  # the config languages check reads, from the trainer registry
        return readers.trainers()
    raise AttributeError(name)
