"""Tiny random-weight text encoders and diffusers pipelines: the builders live in :mod:`te_align.probe.tiny`.

``te-align probe`` needs the same models at run time, so the one implementation is in the package;
this module re-exports it (private helpers included, via ``__getattr__``) for the tests.
"""

from __future__ import annotations

from typing import Any

from te_align.probe import tiny as _impl
from te_align.probe.tiny import *  # noqa: F403
from te_align.probe.tiny import __all__ as __all__


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
