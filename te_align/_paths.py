"""Input paths checked before they are read: one line for a missing path, a folder where a file is
expected (and the reverse), a symlink loop, or a named pipe / socket / device, and never a hang.

:func:`read_bytes` opens with ``O_NONBLOCK`` and checks the opened file with ``fstat`` (no window
between the check and the read): opening a FIFO without a writer would otherwise block forever.
:func:`describe` names what a path is, in words, for those messages. No torch.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from te_align.errors import TeAlignError


def describe(mode: int) -> str:
    """What a ``st_mode`` is, in words (``a folder``, ``a named pipe (FIFO)`` …)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISREG(mode):
        return "a file"
    return "not a regular file"


def _stat_error(e: OSError, name: str, error: type[TeAlignError], what: str) -> TeAlignError:
    if e.errno == errno.ENOENT:
        return error(f"no such {what}", file=name)
    if e.errno == errno.ELOOP:
        return error("symlink loop (the link points back at itself)", file=name)
    if e.errno == errno.ENOTDIR:
        return error(f"no such {what} (a part of the path is a file, not a folder)", file=name)
    if e.errno == errno.EACCES:
        return error("permission denied", file=name)
    return error(f"cannot read: {e.strerror or e}", file=name)


def check_file(path: str | os.PathLike[str], error: type[TeAlignError], *, what: str = "file") -> Path:
    """``path`` if it is a regular file (symlinks followed), else ``error`` as one line naming it."""
    name = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise _stat_error(e, name, error, what) from None
    except ValueError:  # a NUL byte in the path
        raise error("not a valid path (it holds a NUL character)", file=repr(name)) from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"is {describe(st.st_mode)}, expected a {what}", file=name)
    return Path(path)


def check_dir(path: str | os.PathLike[str], error: type[TeAlignError], *, what: str = "folder") -> Path:
    """``path`` if it is a folder (symlinks followed), else ``error`` as one line naming it."""
    name = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise _stat_error(e, name, error, what) from None
    except ValueError:
        raise error("not a valid path (it holds a NUL character)", file=repr(name)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"is {describe(st.st_mode)}, expected a {what}", file=name)
    return Path(path)


def read_bytes(path: str | os.PathLike[str], error: type[TeAlignError], *, what: str = "file",
               limit: int | None = None) -> bytes:
    """The bytes of a regular file (at most ``limit`` when given), never blocking on a FIFO."""
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if e.errno == errno.EISDIR:
            raise error(f"is a folder, expected a {what}", file=name) from None
        raise _stat_error(e, name, error, what) from None
    except ValueError:
        raise error("not a valid path (it holds a NUL character)", file=repr(name)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"is {describe(st.st_mode)}, expected a {what}", file=name)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit)
    except OSError as e:
        raise error(f"cannot read: {e.strerror or e}", file=name) from None
    finally:
        os.close(fd)


__all__ = ["check_dir", "check_file", "describe", "read_bytes"]
