"""Writing a run's files: whole-file-or-nothing writes whose failures are one line naming the path and what to do.

A full disk, a file-size limit, a read-only file system or a permission problem while the trainer
writes a checkpoint, a LoRA, a log or a cache entry raises :class:`WriteError` (a
:class:`~te_align.train.config.TrainError`): ``PATH: cannot write: no space left on the device (12.3 MB
free there): free space on that disk …``. :func:`te_align.train.loop.train` adds where the run can be
resumed from. The file being replaced is never touched until the new one is complete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from te_align._atomic import _umask, fsync_dir
from te_align.train.config import TrainError


class WriteError(TrainError):
    """A file of the run could not be written (full disk, read-only file system, permissions)."""


def _free(path: Path) -> str:
    for p in (path, *path.parents):
        try:
            free = shutil.disk_usage(p).free
        except OSError:
            continue
        return f"{free / 1e6:.1f} MB free there"
    return "free space unknown"


def reason(e: OSError, path: Path) -> str:
    """What went wrong and what to do, in words."""
    code = e.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device ({_free(path.parent)}): free space on that disk"
    if code == errno.EFBIG:
        return "file too large (a file-size limit, ulimit -f, or the file system's limit): raise the limit or free space"
    if code == errno.EROFS:
        return "read-only file system: choose a writable output.dir (or data.cache_dir)"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied: make the folder writable or choose another output.dir"
    return f"{e.strerror or e}"


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an ``OSError`` raised inside the block into a one-line :class:`WriteError` naming ``path``."""
    try:
        yield
    except OSError as e:
        target = Path(e.filename) if isinstance(e.filename, str) else Path(path)
        raise WriteError(f"cannot write: {reason(e, target)}", file=str(target)) from None


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None) -> Path:
    """Write ``data`` to a temp file beside ``path``, fsync, then rename it over ``path``.

    The new file gets ``mode`` (default ``0o666 & ~umask``, what ``open()`` gives). On any failure
    the temp file is removed, ``path`` is unchanged and :class:`WriteError` names it.
    """
    target = Path(path)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    tmp: str | None = None
    with writing(target):
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
            os.replace(tmp, target)
            tmp = None
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
    fsync_dir(target.parent)
    return target


__all__ = ["WriteError", "reason", "write_atomic", "writing"]
