"""Static audit of trainer configs against alignment profiles (``te-align check``).

Each trainer has one data table of :class:`~te_align.audit.rules.Rule` rows
(``te_align.audit.trainers.<trainer>.RULES``: key, default, meaning, profile path, fix, source
file:line) evaluated by one mechanism (:func:`~te_align.audit.rules.evaluate`). No torch.
"""

from te_align.audit.check import check_file, check_files, exit_code
from te_align.audit.findings import CheckResult, Finding
from te_align.audit.readers import TRAINERS
from te_align.audit.rules import Rule

__all__ = ["TRAINERS", "CheckResult", "Finding", "Rule", "check_file", "check_files", "exit_code"]
