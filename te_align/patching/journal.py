"""The journal engine: one on-disk transaction over several files, for ``te-align patch`` and ``check --fix``.

What it knows: the journal's format and where it lives (a :class:`Place`: ``journal.json`` and the copies of
the files an operation replaces in ``journal-data/``), the file operations (each preceded by a fault point:
:func:`te_align._atomic.fault_point`, which crash tests and ``tools/fault_campaign.py`` use to kill the
process or fail with ENOSPC/EROFS at the N-th one), the lock of a folder, beginning and committing an
operation, rolling an interrupted one back, and the recovery of a trainer tree's state folder (``.te-align/``,
:func:`recover_tree`). What it does not know: what a patch or a fix writes, the manifest's content (only its
file name, the commit record of a tree), te-align's install into a trainer's Python. A tree's transaction may
have one more step with a journal of its own in the state folder (the environment step,
:mod:`te_align.patching.environment`): the caller hands :func:`recover_tree` a :class:`StepJournal` that
recovers it; the engine imports no step.

The operations on top: :mod:`te_align.patching.transaction` (``patch``, ``unpatch``, ``status``) and
:mod:`te_align.fixing.fix` (``check --fix``).

A journal entry (one per file the operation may touch): ``path``, ``existed``; when it existed, its ``sha256``
and ``mode`` before (and, for absolute paths, the number of its ``copy``); ``new_sha256`` when the operation
writes known bytes there: the rollback of a killed operation then refuses a file holding neither those nor its
bytes from before (someone else's edit), before it touches anything.

Nothing read from a state file is trusted: every path must stay inside the tree (no ``..``, no absolute path,
no symbolic link on the way) and every field must have its type, or the command stops with "te-align state
file is unreadable" and the way out.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from te_align import _atomic
from te_align._atomic import fault_point, fsync_dir
from te_align.errors import TeAlignError

STATE_DIR = ".te-align"
#: A state folder being deleted (revert's commit point, or the rollback of a first patch).
REMOVING = ".te-align.removing"
MANIFEST = "manifest.json"
JOURNAL = "journal.json"
JOURNAL_DATA = "journal-data"
TMP_SUFFIX = ".te-align-tmp"
#: Kept beside a file that ``unpatch --keep-changed`` leaves as it is, when no other file holds its original.
KEPT_ORIGINAL_SUFFIX = ".te-align-original"
LOCK_FILE = ".te-align.lock"
_SHA = re.compile(r"[0-9a-f]{64}")


class PatchError(TeAlignError):
    """A patch, unpatch or status request that cannot go ahead."""


class LockBusy(PatchError):
    """Another te-align command holds the tree's lock."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        return "<folder>"
    except OSError as e:
        raise PatchError(f"cannot read {path}: {e.strerror}") from None



# ------------------------------------------------------------------------------- file operations
# Every change to the disk is one of these, each preceded by a fault point.
def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


def _mkdir(d: Path) -> None:
    fault_point("mkdir", d)
    d.mkdir()


def _makedirs(d: Path, root: Path) -> None:
    missing = []
    while d != root and not d.is_dir():
        missing.append(d)
        d = d.parent
    for m in reversed(missing):
        _mkdir(m)


def _unlink(p: Path) -> None:
    if os.path.lexists(p):
        fault_point("unlink", p)
        p.unlink()


def _rmdir(d: Path) -> None:
    fault_point("rmdir", d)
    d.rmdir()


def _rename(a: Path, b: Path) -> None:
    fault_point("rename", b)
    os.replace(a, b)
    fsync_dir(b.parent)


def _chmod(p: Path, mode: int) -> None:
    fault_point("chmod", p)
    os.chmod(p, mode)


def _rmtree(d: Path) -> None:
    """Remove a folder bottom-up without following symbolic links, one fault point per entry."""
    if os.path.islink(d) or not d.exists():
        _unlink(d)
        return
    for dirpath, dirnames, filenames in os.walk(d, topdown=False):
        here = Path(dirpath)
        for name in sorted(filenames):
            _unlink(here / name)
        for name in sorted(dirnames):
            sub = here / name
            if os.path.islink(sub):
                _unlink(sub)
            else:
                _rmdir(sub)
    _rmdir(d)


def _write(path: Path, content: bytes, mode: int | None, before_rename: Callable[[], object] | None = None) -> None:
    """Whole file or nothing: ``.NAME.te-align-tmp`` beside it, fsync, mode, rename. ``before_rename`` runs just
    before the rename (``check --fix``: the file still holds the bytes the fix was made from; its backup)."""
    tmp = _tmp(path)
    _unlink(tmp)
    fault_point("create", tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            fault_point("write", tmp)
            f.write(content)
            f.flush()
            if _atomic.FSYNC:
                os.fsync(f.fileno())
        _chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        if before_rename is not None:
            before_rename()
        _rename(tmp, path)
    except BaseException:
        # the journal names this temp file, so recovery removes it if this cannot
        with contextlib.suppress(OSError):
            _unlink(tmp)
        raise


def _link(src: Path, dst: Path) -> None:
    """``dst`` holds ``src``'s bytes and mode: a hard link (no space needed; a copy where links cannot be made),
    made at ``.NAME.te-align-tmp`` and renamed over ``dst``."""
    tmp = _tmp(dst)
    _unlink(tmp)
    fault_point("link", dst)
    try:
        os.link(src, tmp)
    except OSError:
        import shutil

        shutil.copy2(src, tmp)
    try:
        _rename(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            _unlink(tmp)
        raise


# ------------------------------------------------------------------------------- lock
_HELD: dict[str, int] = {}


def _lock_wait() -> float:
    try:
        return max(0.0, float(os.environ.get("TE_ALIGN_LOCK_WAIT", "5")))
    except ValueError:
        return 5.0


def _busy(root: Path, who: str = "") -> LockBusy:
    return LockBusy(
        f"another te-align command (patch, unpatch or status{who}) is working on {root}; "
        f"wait for it to finish, then run this again"
    )


@contextlib.contextmanager
def lock(root: str | Path) -> Iterator[None]:
    """Exclusive lock on a trainer tree for a command that writes or recovers (re-entrant per process).

    ``flock`` on the tree's folder itself: nothing is written into the tree, and the lock goes with the
    process that holds it (a killed command leaves no stale lock). Where folders cannot be locked a
    ``.te-align.lock`` file holding the owner's pid is used; a lock of a dead pid is taken over.
    Waits ``TE_ALIGN_LOCK_WAIT`` seconds (default 5), then refuses with one line.
    """
    root = Path(root)
    key = os.path.realpath(root)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    deadline = time.monotonic() + _lock_wait()
    release = _flock(root, deadline)
    if release is None:
        release = _pid_lock(root, deadline)
    _HELD[key] = 1
    try:
        yield
    finally:
        del _HELD[key]
        release()


@contextlib.contextmanager
def lock_all(folders: Iterable[str | Path]) -> Iterator[None]:
    """The lock of every folder (:func:`lock`), each once, taken in the order of their real paths (two
    commands locking overlapping folders never deadlock)."""
    with contextlib.ExitStack() as stack:
        for folder in sorted({os.path.realpath(f) for f in folders}):
            stack.enter_context(lock(folder))
        yield


def _flock(root: Path, deadline: float) -> Any:
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        raise PatchError(f"cannot open {root}: {e.strerror}") from None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise _busy(root) from None
            time.sleep(0.05)
        except OSError:
            os.close(fd)
            return None  # this file system cannot lock folders: use the pid file

    def release() -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    return release


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill would terminate the process there: assume it is alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _pid_lock(root: Path, deadline: float) -> Any:
    path = root / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                pid = int(path.read_text(encoding="ascii").strip() or "0")
            except (OSError, ValueError):
                pid = 0
            if (pid and not _pid_alive(pid)) or (not pid and time.monotonic() >= deadline):
                path.unlink(missing_ok=True)  # stale: its owner is gone
                continue
            if time.monotonic() >= deadline:
                raise PatchError(
                    f"another te-align command (patch, unpatch or status, pid {pid}) is working on {root}; wait for it "
                    f"to finish, then run this again (if no te-align is running, delete {path})"
                ) from None
            time.sleep(0.05)
            continue
        except OSError as e:
            raise PatchError(f"cannot lock {root} ({path}: {e.strerror}); make it writable, then run again") from None
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
        break

    def release() -> None:
        path.unlink(missing_ok=True)

    return release


# ------------------------------------------------------------------------------- state files
def _state(root: Path) -> Path:
    return root / STATE_DIR


def _way_out(root: Path) -> str:
    state = _state(root)
    return (
        f"the originals are in {state}/backup/ under their own paths: copy them back (or restore the files from "
        f"the trainer's source), delete the files te-align created (its drop-ins and copies), then delete {state}"
    )


def _unreadable(path: Path, root: Path, why: str) -> PatchError:
    return PatchError(f"te-align state file is unreadable ({why}); {_way_out(root)}", file=str(path))


def _inside(root: Path, rel: Any, *, what: str, state_file: Path, base: Path | None = None) -> Path:
    """``base/rel`` (base defaults to the root) when ``rel`` is a plain relative path inside it that
    crosses no symbolic link; else refuse: a state file must never make te-align write elsewhere."""
    base = root if base is None else base
    if not isinstance(rel, str) or not rel:
        raise _unreadable(state_file, root, f"{what} must be a relative path, found {rel!r}")
    p = PurePosixPath(rel)
    if p.is_absolute() or "\\" in rel or rel != p.as_posix() or any(part in ("", ".", "..") for part in p.parts) or (
        len(rel) > 1 and rel[1] == ":"
    ):
        raise PatchError(
            f"te-align state file names a path outside the tree ({what} {rel!r}); refusing to touch it. "
            f"Restore the files by hand ({_way_out(root)})",
            file=str(state_file),
        )
    full = base.joinpath(*p.parts)
    d = base
    for part in p.parts:
        d = d / part
        if os.path.islink(d):
            raise PatchError(
                f"te-align state file names {rel!r} but {d} is a symbolic link; te-align writes only inside "
                f"{root} without following links. Replace the link by the file (or restore by hand), then run again",
                file=str(state_file),
            )
    return full


def _load_json(path: Path, root: Path, bad: Callable[[str], PatchError] | None = None) -> dict[str, Any] | None:
    def unreadable(why: str) -> PatchError:
        return bad(why) if bad is not None else _unreadable(path, root, why)

    try:
        if os.path.islink(path):
            raise unreadable("it is a symbolic link")
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise unreadable(e.strerror or str(e)) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise unreadable(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(data, dict):
        raise unreadable(f"expected a JSON object, found {type(data).__name__}")
    return data


def _is_mode(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0o7777



@dataclass(frozen=True)
class Place:
    """Where one transaction keeps its journal (``journal.json``, and the copies of the files it replaces in
    ``journal-data/``, inside ``state``) and how the paths the journal names read: relative to ``root`` (a
    trainer tree: ``patch``, ``unpatch``), or absolute when ``root`` is None (``check --fix``: a config and
    the dataset TOML it names may sit in two folders). ``removing``: ``state`` while it is deleted. ``way_out``:
    what a user does by hand when the journal does not read."""

    state: Path
    removing: Path
    root: Path | None
    way_out: str

    @property
    def journal(self) -> Path:
        return self.state / JOURNAL

    @property
    def data(self) -> Path:
        return self.state / JOURNAL_DATA

    def unreadable(self, why: str) -> PatchError:
        return PatchError(f"te-align state file is unreadable ({why}); {self.way_out}", file=str(self.journal))

    def file(self, name: Any, what: str) -> Path:
        """The path the journal names ``name``: checked (inside the tree, crossing no symbolic link; or an
        absolute, normalised path)."""
        if self.root is not None:
            return _inside(self.root, name, what=what, state_file=self.journal)
        if not isinstance(name, str) or not os.path.isabs(name) or os.path.normpath(name) != name or "\0" in name:
            raise self.unreadable(f"{what} must be an absolute path, found {name!r}")
        return Path(name)

    def name(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() if self.root is not None else str(path)


def _place(root: Path) -> Place:
    """A trainer tree's transaction: ``<root>/.te-align/journal.json``, paths relative to the tree."""
    return Place(_state(root), root / REMOVING, root, _way_out(root))


def _read_journal(root: Path) -> dict[str, Any] | None:
    return _read_journal_in(_place(root))


def _read_journal_in(place: Place) -> dict[str, Any] | None:
    """The journal of an interrupted transaction (every field checked), or None."""
    j = _load_json(place.journal, place.root or place.state, place.unreadable)
    if j is None:
        return None
    if not isinstance(j.get("op"), str) or not isinstance(j.get("state_existed"), bool):
        raise place.unreadable("no 'op' / 'state_existed'")
    entries, dirs = j.get("files"), j.get("dirs", [])
    if not isinstance(entries, list) or not isinstance(dirs, list):
        raise place.unreadable("'files' and 'dirs' must be lists")
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("existed"), bool):
            raise place.unreadable("a 'files' entry is not a table with 'existed'")
        place.file(e.get("path"), "file")
        if e["existed"]:
            if not isinstance(e.get("sha256"), str) or not _SHA.fullmatch(e["sha256"]) or not _is_mode(e.get("mode")):
                raise place.unreadable(f"entry {e['path']} has no sha256/mode")
            copy = e.get("copy")
            if place.root is None and not (isinstance(copy, str) and copy.isascii() and copy.isdigit()):
                raise place.unreadable(f"entry {e['path']} has no copy")
        new = e.get("new_sha256")
        if new is not None and not (isinstance(new, str) and _SHA.fullmatch(new)):
            raise place.unreadable(f"entry {e['path']}: 'new_sha256' is not a sha256")
    for d in dirs:
        place.file(d, "folder")
    return j


# ------------------------------------------------------------------------------- journal
def _begin(root: Path, op: str, paths: Sequence[str], new_sha256: Mapping[str, str] | None = None) -> None:
    _begin_in(_place(root), op, paths, new_sha256)


def _begin_in(place: Place, op: str, paths: Sequence[str], new_sha256: Mapping[str, str] | None = None) -> None:
    """Copy every file's pre-operation bytes into journal-data/, then write the journal (atomically).

    ``paths`` name files as ``place`` reads them: relative to the tree (they may name state files,
    ``.te-align/manifest.json``, ``.te-align/backup/...``), or absolute. Folders that do not exist yet are
    listed: recovery removes them again. ``new_sha256``: the checksum of the bytes the operation writes to a
    path; recovery refuses a file that holds neither those nor its bytes from before (someone else's edit).
    """
    state = place.state
    state_existed = state.is_dir()
    if not state_existed:
        _mkdir(state)
        if place.root is not None:
            _write(state / ".gitignore", b"*\n", None)
    data_dir = place.data
    if os.path.lexists(data_dir):
        _rmtree(data_dir)
    entries: list[dict[str, Any]] = []
    dirs: list[str] = []
    for i, name in enumerate(dict.fromkeys(paths)):
        f = place.root / name if place.root is not None else Path(name)
        entry: dict[str, Any] = {"path": name}
        if f.is_file():
            content = f.read_bytes()
            copy = name if place.root is not None else str(i)
            keep = data_dir / copy
            _makedirs(keep.parent, state)
            _write(keep, content, 0o600)
            entry.update(existed=True, sha256=sha256_bytes(content), mode=f.stat().st_mode & 0o7777)
            if place.root is None:
                entry["copy"] = copy
        else:
            entry["existed"] = False
        if new_sha256 is not None and name in new_sha256:
            entry["new_sha256"] = new_sha256[name]
        entries.append(entry)
        d = f.parent
        while d != place.root and d != d.parent and not d.is_dir():
            dirs.append(place.name(d))
            d = d.parent
    body = {"op": op, "started": time.time(), "state_existed": state_existed, "files": entries, "dirs": sorted(set(dirs))}
    _write(place.journal, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode(), None)


def _commit(root: Path) -> None:
    _commit_in(_place(root))


def _commit_in(place: Place) -> None:
    """The operation is complete once the journal is gone; its copies are then only leftovers (a
    failure to delete them is not a failure of the operation: the next command removes them)."""
    _unlink(place.journal)
    with contextlib.suppress(OSError):
        _cleanup_in(place)


def _cleanup_leftovers(root: Path) -> bool:
    return _cleanup_in(_place(root))


def _cleanup_in(place: Place) -> bool:
    """Remove the journal's copies and temp files of the state folder; True if there were any."""
    state = place.state
    found = False
    if os.path.lexists(place.data):
        _rmtree(place.data)
        found = True
    for f in sorted(state.iterdir()):
        if f.name.endswith(TMP_SUFFIX):
            _unlink(f)
            found = True
    return found


def _drop_state(root: Path) -> None:
    _drop_in(_place(root))


def _drop_in(place: Place) -> None:
    """Remove the whole state folder: one rename (the commit point), then the deletion (what a failure
    leaves of the ``removing`` folder the next command deletes)."""
    _rename(place.state, place.removing)
    with contextlib.suppress(OSError):
        _rmtree(place.removing)


def _depth_first(dirs: Sequence[str]) -> list[str]:
    return sorted(set(dirs), key=lambda d: (-d.count("/"), d))


def _remove_empty_dirs(root: Path, dirs: Sequence[str]) -> None:
    _remove_empty_dirs_in(_place(root), dirs)


def _remove_empty_dirs_in(place: Place, dirs: Sequence[str]) -> None:
    for d in _depth_first(dirs):
        folder = place.root / d if place.root is not None else Path(d)
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            _rmdir(folder)


def _rollback_in(place: Place, journal: dict[str, Any], *, strict: bool = True) -> list[str]:
    """Give every file the journal names its bytes and mode from before the operation (the journal's copy
    renamed into place: no free space needed), remove the files and folders it created and te-align's temp
    files, then drop the journal (the state folder too when the operation made it). The paths rolled back.

    A file with a ``new_sha256`` that holds neither its bytes from before nor those: ``strict`` (a journal a
    killed process left) refuses before anything is touched; else (the rollback of a failure in-process: someone
    else wrote it meanwhile) that file is left as it is.
    """
    entries = journal["files"]
    op = journal["op"]
    files = {e["path"]: place.file(e["path"], "file") for e in entries}
    left: set[str] = set()
    for e in entries:  # before anything is touched
        if "new_sha256" not in e:
            continue
        f = files[e["path"]]
        if sha256_file(f) in (e["sha256"] if e["existed"] else None, e["new_sha256"]):
            continue
        if strict:
            # a tree's journal keeps the copy under the file's own path, an absolute one's by its number
            before = f"its copy {place.data / e.get('copy', e['path'])}" if e["existed"] else "none: it did not exist"
            raise PatchError(
                f"holds neither its bytes from before the interrupted te-align {op} nor the ones it wrote; nothing "
                f"rolled back: restore its bytes from before ({before}) or keep the file as it is, then delete "
                f"{place.journal}", file=str(f))
        left.add(e["path"])
    data_dir = place.data
    rolled: list[str] = []
    for e in entries:
        _unlink(_tmp(files[e["path"]]))
    for e in entries:  # files the operation created: removing them first frees space for the restores
        f = files[e["path"]]
        if not e["existed"] and e["path"] not in left and os.path.lexists(f):
            if f.is_dir() and not f.is_symlink():
                raise PatchError(f"{f} is a folder now; it did not exist before the interrupted te-align '{op}'. Move it away, then run again")
            _unlink(f)
            rolled.append(e["path"])
    for e in entries:
        if not e["existed"] or e["path"] in left:
            continue
        f = files[e["path"]]
        if sha256_file(f) != e["sha256"] or f.is_symlink():
            if place.root is not None:
                keep = _inside(place.root, e["path"], what="journal copy", state_file=place.journal, base=data_dir)
            else:
                keep = data_dir / e["copy"]
            try:
                content = keep.read_bytes()
            except OSError:
                content = None
            if content is None or sha256_bytes(content) != e["sha256"]:
                raise place.unreadable(f"the journal copy of {e['path']} is missing or damaged")
            if f.is_dir() and not f.is_symlink():
                raise PatchError(f"{f} is a folder now; it was a file before the interrupted te-align '{op}'. Move it away, then run again")
            if f.is_symlink():
                _unlink(f)
            _makedirs(f.parent, place.root if place.root is not None else Path(f.anchor))
            # rename the journal's copy into place: a rollback needs no free space
            _chmod(keep, e["mode"])
            _rename(keep, f)
            rolled.append(e["path"])
        elif f.stat().st_mode & 0o7777 != e["mode"]:
            _chmod(f, e["mode"])
            rolled.append(e["path"])
    _remove_empty_dirs_in(place, journal["dirs"])
    if journal["state_existed"]:
        _commit_in(place)
    else:
        _drop_in(place)
    return rolled




@dataclass(frozen=True)
class StepJournal:
    """The journal of one more step of a tree's transaction, kept in its state folder beside the files'
    journal (the environment step's: ``environment-journal.json``). :func:`recover_tree` calls ``recover``
    with the tree's root after the files are rolled back, when the file ``name`` is there; ``recover`` rolls
    the step back unless it committed, removes the file and says what it did (or None)."""

    name: str
    recover: Callable[[Path], str | None]


def recover_tree(root: Path, steps: Sequence[StepJournal] = ()) -> str | None:
    """Roll an interrupted operation back, or finish one that passed its commit point (caller holds the lock).

    ``steps``: the journals of the transaction's other steps (:class:`StepJournal`), recovered after the
    files."""
    done: list[str] = []
    removing = root / REMOVING
    if os.path.lexists(removing):
        _rmtree(removing)
        done.append("finished removing te-align's old state folder")
    state = _state(root)
    if not os.path.lexists(state):
        return "; ".join(done) or None
    if state.is_symlink() or not state.is_dir():
        raise PatchError(f"{state} is not a folder (a symbolic link or a file); te-align keeps its state only in a real folder there. Remove it, then run again")
    journal = _read_journal(root)
    rolled_back = journal is not None or any(os.path.lexists(state / step.name) for step in steps)
    if journal is not None:
        done.append(_rollback_files(root, journal))
        if not os.path.lexists(state):
            return "; ".join(done)
    for step in steps:  # after the files: the manifest now says whether the step committed
        if os.path.lexists(state / step.name):
            step_done = step.recover(root)
            if step_done:
                done.append(step_done)
    if _cleanup_leftovers(root):
        done.append("removed the leftovers of an interrupted te-align command (no file had been changed yet, or it had finished)")
    if not (state / MANIFEST).exists():
        left = sorted(f.name for f in state.iterdir() if f.name != ".gitignore")
        if left:
            raise _unreadable(
                state / MANIFEST, root, f"{MANIFEST} is missing but {state} still holds {', '.join(left)}"
            )
        _drop_state(root)  # the folder of a first patch killed before its journal was written (or its install rolled back)
        if not rolled_back:
            done.append("removed the state folder of an interrupted patch (nothing else had been changed)")
    return "; ".join(done) or None


def _rollback_files(root: Path, journal: dict[str, Any]) -> str:
    rolled = _rollback_in(_place(root), journal)
    return f"recovered from an interrupted '{journal['op']}' ({len(rolled)} file(s) rolled back)"



# ------------------------------------------------------------------------------- errors
def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


def _os_message(e: OSError, root: Path, need: int) -> str:
    where = e.filename or root
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        amount = f"at least {_human(need)}" if need else "some space"
        return f"no space left on the device holding {where}: free {amount} there (te-align's backups and journal need it), then run again"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"folder is read-only: cannot write {where} ({e.strerror}); make {root} writable, run as a user who can "
            f"write there, or copy the installation, then run again"
        )
    return f"cannot write {where}: {e.strerror or e}"


def _still_interrupted(root: Path) -> str:
    state = _state(root)
    if (state / JOURNAL).exists():
        return f". The interrupted change is journalled: once that is fixed, run 'te-align status {root}' to finish rolling it back"
    leftovers = os.path.lexists(root / REMOVING) or (
        state.is_dir() and (
            os.path.lexists(state / JOURNAL_DATA) or not (state / MANIFEST).exists()
            or any(f.name.endswith(TMP_SUFFIX) for f in state.iterdir())
        )
    )
    if leftovers:
        return f". te-align could not remove its own leftovers in {state}: once that is fixed, run 'te-align status {root}' to remove them"
    return ""



def _check_root(root: Path) -> Path:
    if not os.path.lexists(root):
        raise PatchError(f"no such folder: {root}")
    if not root.is_dir():
        raise PatchError(f"not a folder: {root} (give the trainer's folder)")
    return root

