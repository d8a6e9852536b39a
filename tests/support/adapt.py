"""Fit a bundled profile's architecture numbers to the tiny test encoders (see :mod:`te_align.probe.tiny`)."""

from __future__ import annotations

from te_align.probe.tiny import architecture_overrides, fit_profile

__all__ = ["architecture_overrides", "fit_profile"]
