"""User-facing errors.

Every mistake a user can make (a wrong profile name, a malformed file, a bad value) raises a
:class:`TeAlignError`. The CLI prints ``str(error)`` as one line and exits with ``exit_code``;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches


class TeAlignError(Exception):
    """A user mistake or bad input, reported as one line without a traceback."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        self.file = file
        self.key = key
        self.message = message
        parts = []
        if file:
            parts.append(str(file))
        if key:
            parts.append(f"key '{key}'")
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ProfileNotFound(TeAlignError):
    """An unknown profile name."""


class ProfileError(TeAlignError):
    """A malformed profile, override or profile source."""


class EncodingError(TeAlignError):
    """Tokenizers/encoders that do not fit a profile (missing slot, wrong size, dtype, device)."""


class CacheError(TeAlignError):
    """A cache directory that cannot be used."""


def closest(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``" (did you mean: a, b?)"`` for the closest choices, or ``""``."""
    matches = get_close_matches(word, list(choices), n=n, cutoff=0.5)
    if not matches:
        return ""
    return " (did you mean: " + ", ".join(matches) + "?)"
