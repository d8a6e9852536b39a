"""Where the engine finds the trainer registry without importing it.

The engine (:mod:`te_align.audit`, :mod:`te_align.hooks`, :mod:`te_align.patching`, :mod:`te_align.probe`)
never imports :mod:`te_align.trainers`: the trainers import the engine, so an arrow back up would be an import
loop. The public API (``te_align/__init__``, which Python runs before any of te-align's modules) installs the
registry here; commands and callers that found a part in the registry pass it down to the engine directly, and
the engine reads :func:`registry` only where no caller handed it one. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the contract's types, for annotations only
    from te_align.trainers.api import Registry

_provider: list[Callable[[], Registry]] = []


def install(provider: Callable[[], Registry]) -> None:
    """Make ``provider`` (called on first use, cached by it) the registry the engine reads."""
    _provider[:] = [provider]


def registry() -> Registry:
    """The trainer registry the public API installed."""
    if not _provider:
        raise RuntimeError("te_align's trainer registry is not installed (import te_align first)")
    return _provider[0]()
