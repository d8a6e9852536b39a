"""Whole-file-or-nothing writes: a temp file beside the target, fsync, rename, fsync the folder.

Every file te-align writes for a user (profiles, cache entries, stamped LoRAs) goes through
:func:`atomic_file`, so an interrupted run never leaves a half-written file under the real name.

Fault injection (for crash tests and ``tools/fault_campaign.py``): every file operation that changes
the disk calls :func:`fault_point` first. With ``TE_ALIGN_FAULT_AT=N`` in the environment the N-th
such operation of the process fails as ``TE_ALIGN_FAULT_MODE`` says: ``kill`` (default: the process
SIGKILLs itself), ``enospc`` (that operation and every later one that needs space raise
``OSError(ENOSPC)``: a full disk), ``erofs`` (that one and every later change raise
``OSError(EROFS)``: a read-only file system). ``TE_ALIGN_FAULT_LOG=FILE`` appends one line per
operation (``N op path``). Without ``TE_ALIGN_FAULT_AT`` it costs one dictionary lookup.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from te_align.errors import TeAlignError

_UMASK: int | None = None
#: fsync written files and their folders. Crash campaigns that kill processes (not machines) may turn it
#: off in-process to run faster: the page cache survives a killed process.
FSYNC = True
_FAULT_COUNT = 0
#: Operations that need free space (the others only remove or rename).
_ALLOCATING = frozenset({"create", "write", "mkdir", "copy"})


def reset_fault_counter() -> None:
    """Start counting file operations from zero again (tests that inject faults in-process)."""
    global _FAULT_COUNT
    _FAULT_COUNT = 0


def fault_point(op: str, path: str | os.PathLike[str]) -> None:
    """Called before every file operation that changes the disk (see the module docstring)."""
    global _FAULT_COUNT
    at = os.environ.get("TE_ALIGN_FAULT_AT")
    log = os.environ.get("TE_ALIGN_FAULT_LOG")
    if not at and not log:
        return
    _FAULT_COUNT += 1
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{_FAULT_COUNT} {op} {os.fspath(path)}\n")
    if not at:
        return
    try:
        n = int(at)
    except ValueError:
        return
    if n <= 0 or _FAULT_COUNT < n:
        return
    mode = os.environ.get("TE_ALIGN_FAULT_MODE", "kill")
    if mode == "kill" and _FAULT_COUNT == n:
        import signal

        if hasattr(signal, "SIGKILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)
    elif mode == "enospc" and (op in _ALLOCATING or _FAULT_COUNT == n):
        import errno

        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
    elif mode == "erofs":
        import errno

        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))


def _umask() -> int:
    global _UMASK
    if _UMASK is None:
        current = os.umask(0o022)
        os.umask(current)
        _UMASK = current
    return _UMASK


def link_or_copy(src: Path, bak: Path) -> None:
    """Make ``bak`` hold the current ``src`` (a hard link when possible: no copy, no window)."""
    tmp = bak.with_name(f".{bak.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, bak)


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every platform can open folders)."""
    if not FSYNC:
        return
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
    before_replace: Callable[[], object] | None = None,
) -> Iterator[IO[Any]]:
    """Yield a file object whose contents replace ``path`` only when the block ends without error.

    The new file gets the permissions of ``mode_from`` when given (a file being rewritten keeps its
    mode), else the usual ``0o666 & ~umask``. ``before_replace`` runs after the data is on disk and
    just before the rename (e.g. to make a backup of the file being replaced).
    """
    target = Path(path)
    encoding = None if "b" in mode else "utf-8"
    try:
        if not target.parent.is_dir():
            fault_point("mkdir", target.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        fault_point("create", target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise error(f"cannot write: {e.strerror}", file=str(target)) from None
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            fault_point("write", tmp)
            f.flush()
            if FSYNC:
                os.fsync(f.fileno())
        fault_point("chmod", tmp)
        if mode_from is not None:
            os.chmod(tmp, os.stat(mode_from).st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        if before_replace is not None:
            before_replace()
        fault_point("rename", target)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
