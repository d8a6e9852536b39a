"""Small helpers shared by CLI commands."""

from __future__ import annotations

import os

from te_align._atomic import atomic_file


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a whole text file or nothing."""
    with atomic_file(path, "w") as f:
        f.write(text)
