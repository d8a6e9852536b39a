"""The probe's error: the leaf every probe module imports (the package re-exports it)."""

from __future__ import annotations

from te_align.errors import TeAlignError


class ProbeError(TeAlignError):
    """A probe that cannot run: unknown trainer, a path that is not that trainer, an unsupported profile."""


__all__ = ["ProbeError"]
