"""``te-align swap``: replace a model's text encoder by a new one plus a trainable projection whose output
statistics are measured to match what the denoiser was trained on (:func:`swap`)."""

from te_align.swap.core import (
    DEFAULT_CAPTIONS,
    PROFILE_FILE,
    REPORT_FILE,
    SwapError,
    SwapReport,
    check_request,
    reset_layers,
    swap,
    swapped_profile,
)
from te_align.swap.families import FAMILIES, RESET_MODES, SwapFamily

__all__ = [
    "DEFAULT_CAPTIONS",
    "FAMILIES",
    "PROFILE_FILE",
    "REPORT_FILE",
    "RESET_MODES",
    "SwapError",
    "SwapFamily",
    "SwapReport",
    "check_request",
    "reset_layers",
    "swap",
    "swapped_profile",
]
