"""Whole-file-or-nothing writes: a temp file beside the target, fsync, rename, fsync the folder.

Every file te-align writes for a user (profiles, cache entries, stamped LoRAs) goes through
:func:`atomic_file`, so an interrupted run never leaves a half-written file under the real name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from te_align.errors import TeAlignError

_UMASK: int | None = None


def _umask() -> int:
    global _UMASK
    if _UMASK is None:
        current = os.umask(0o022)
        os.umask(current)
        _UMASK = current
    return _UMASK


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every platform can open folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str],
    mode: str = "wb",
    *,
    error: type[TeAlignError] = TeAlignError,
    mode_from: Path | None = None,
    before_replace: Callable[[], Any] | None = None,
) -> Iterator[IO[Any]]:
    """Yield a file object whose contents replace ``path`` only when the block ends without error.

    The new file gets the permissions of ``mode_from`` when given (a file being rewritten keeps its
    mode), else the usual ``0o666 & ~umask``. ``before_replace`` runs after the data is on disk and
    just before the rename (e.g. to make a backup of the file being replaced).
    """
    target = Path(path)
    encoding = None if "b" in mode else "utf-8"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise error(f"cannot write: {e.strerror}", file=str(target)) from None
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode_from is not None:
            os.chmod(tmp, os.stat(mode_from).st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
