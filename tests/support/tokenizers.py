"""Offline real-convention tokenizers: the builders live in :mod:`te_align.probe.tokenizers`.

``te-align probe`` needs the same tokenizers at run time, so the one implementation is in the package;
this module re-exports it (private helpers included, via ``__getattr__``) for the tests.
"""

from __future__ import annotations

from typing import Any

from te_align.probe import tokenizers as _impl
from te_align.probe.tokenizers import *  # noqa: F403
from te_align.probe.tokenizers import PathLike  # noqa: F401
from te_align.probe.tokenizers import __all__ as __all__


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
