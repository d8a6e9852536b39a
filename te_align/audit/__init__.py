"""Static audit of trainer configs against alignment profiles (``te-align check``): the torch-free, read-only
engine. It is handed a config language's parts (:class:`te_align.trainers.api.CheckParts`, or the
:class:`~te_align.trainers.api.CheckLanguages` to resolve them from), never looks one up: the commands and the
public API (:mod:`te_align.checking`) resolve the trainer once from the registry.

Each trainer has one data table of :class:`~te_align.audit.rules.Rule` rows (its reader's ``RULES``: key,
default, meaning, profile path, fix, source file:line) evaluated by one mechanism
(:func:`~te_align.audit.rules.evaluate`). No torch. Exit codes per file (:mod:`te_align.audit.findings`): 0 aligned
(rules ran and passed), 1 deviations, 2 unreadable input, 3 not checked (no profile or no rules for the model, or
not a training job).
"""

from te_align.audit.check import check_file, check_files, check_path, exit_code
from te_align.audit.findings import CheckResult, Finding
from te_align.audit.rules import Rule

__all__ = ["CheckResult", "Finding", "Rule", "check_file", "check_files", "check_path", "exit_code"]
