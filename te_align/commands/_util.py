"""Small helpers shared by CLI commands."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from te_align.errors import TeAlignError


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a whole file or nothing: temp file in the same folder, fsync, rename."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise TeAlignError(f"cannot write: {e.strerror}", file=str(target)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
