"""On-disk patching of a trainer installation as a transaction.

A trainer integration builds a :class:`Plan` (which files get which new bytes, and the checksum
each file had when the plan was made). :func:`apply` then, holding an exclusive lock on the tree:

1. recovers an interrupted earlier operation (see below);
2. refuses a plan made against files that changed since, a tree patched by a newer te-align, or a
   patched file someone changed afterwards (e.g. ``git pull``) — each with the command that gets the
   user out;
3. copies every file it will touch into ``journal-data/`` and writes the journal (the list of those
   files with their checksums and modes, and the folders that do not exist yet), backs up originals
   (first patch only), writes each new file atomically (a temp file named ``.NAME.te-align-tmp``
   beside it, then a rename), writes the manifest and drops the journal (the commit point).

Re-applying the same plan is a no-op. :func:`revert` restores byte-identical originals (content
and permission bits) and removes te-align's state folder (renamed to ``.te-align.removing`` first:
that rename is its commit point). :func:`status` reports what is patched and whether any patched
file changed since.

Recovery. If a process dies at any file operation, the next ``apply``, ``revert`` or ``status``
(each takes the lock, then recovers) either rolls the tree back to exactly its bytes before the
interrupted command (the journal is still there) or finishes the cleanup of a command that had
passed its commit point: no temp file, copy, new folder or orphan state folder is left. Recovery is
itself journalled by the same journal, so it can be interrupted and re-run. A full disk or a
read-only file system met half-way is rolled back in-process and reported as one line naming the
path and what to free; if even the rollback cannot write, the journal stays for the next command.

Nothing read from a state file is trusted: every path must stay inside the tree (no ``..``, no
absolute path, no symbolic link on the way) and every field must have its type, or the command
stops with "te-align state file is unreadable" and the way out.

The environment step (te-align installed into the trainer's own Python, :mod:`te_align.patching.environment`) is
part of the same transaction: ``apply(..., prepare_environment=...)`` runs it after every check and before the first
file is written; it writes ``environment-journal.json`` (python, package list before) before pip runs, and the
manifest's ``environment`` entry carrying the journal's id is its commit point. Recovery rolls the files back first,
then an install the manifest does not name (uninstall te-align and every package not in the list before);
``revert`` uninstalls what the manifest names before it restores the files.

Every change to the disk goes through :func:`te_align._atomic.fault_point`, which crash tests and
``tools/fault_campaign.py`` use to kill the process (or fail with ENOSPC/EROFS) at the N-th one.

State lives in ``<root>/.te-align/`` (with a ``.gitignore`` so git ignores it).

The same transaction (journal format, rollback, recovery, fault points) writes ``te-align check --fix``
(:mod:`te_align.fixing.fix`): a :class:`Place` says where a transaction keeps its journal and whether the paths
it names are relative to a tree (``patch``) or absolute (``--fix``: a config and the dataset TOML it names may
sit in two folders, locked together by :func:`lock_all`). A journal entry may carry ``new_sha256``, the bytes
the operation writes: the rollback of a killed operation then refuses a file holding neither those nor its
bytes from before (someone else's edit), before it touches anything.
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
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from te_align import _atomic
from te_align._atomic import fault_point, fsync_dir
from te_align._version import __version__
from te_align.errors import TeAlignError

STATE_DIR = ".te-align"
#: A state folder being deleted (revert's commit point, or the rollback of a first patch).
REMOVING = ".te-align.removing"
MANIFEST = "manifest.json"
JOURNAL = "journal.json"
JOURNAL_DATA = "journal-data"
#: The journal of the environment step (te-align installed into the trainer's Python): see
#: :mod:`te_align.patching.environment`. Its id in the manifest's ``environment`` entry is its commit point.
ENV_JOURNAL = "environment-journal.json"
TMP_SUFFIX = ".te-align-tmp"
#: Kept beside a file that ``unpatch --keep-changed`` leaves as it is, when no other file holds its original.
KEPT_ORIGINAL_SUFFIX = ".te-align-original"
LOCK_FILE = ".te-align.lock"
FORMAT = 1
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


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in str(v).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


@dataclass(frozen=True)
class FileChange:
    """New bytes for one file. ``expect_sha256`` is the file's checksum when planned (None: absent).

    ``original_of``: this file holds the original of that path (``unpatch --keep-changed`` keeps it
    when it keeps that path). ``restore_to``: on a tree patched before, the bytes ``unpatch`` must
    restore for this path (replaces the backup when they differ), e.g. an original the user edited
    and re-planned; None keeps the usual rule (the backup stays, or the current bytes with ``replan``).
    """

    path: str
    content: bytes
    expect_sha256: str | None
    note: str = ""
    original_of: str | None = None
    restore_to: bytes | None = None

    def __post_init__(self) -> None:
        p = PurePosixPath(self.path)
        if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] in (STATE_DIR, REMOVING):
            raise ValueError(f"FileChange path must be relative inside the root: {self.path!r}")


@dataclass(frozen=True)
class Plan:
    root: Path
    trainer: str
    trainer_version: str
    changes: tuple[FileChange, ...]
    profile: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> list[str]:
        lines = [f"patch plan for {self.trainer} {self.trainer_version} at {self.root}"]
        if self.profile:
            lines.append(f"  profile: {self.profile}")
        for c in self.changes:
            verb = "create " if c.expect_sha256 is None else "replace"
            lines.append(f"  {verb} {c.path}" + (f"  ({c.note})" if c.note else ""))
        return lines


@dataclass(frozen=True)
class FileState:
    path: str
    state: str  # "intact" | "changed" | "missing"
    detail: str = ""


@dataclass(frozen=True)
class Status:
    root: Path
    patched: bool
    recovered: str | None
    manifest: dict[str, Any] | None
    files: tuple[FileState, ...] = ()

    @property
    def changed(self) -> list[FileState]:
        return [f for f in self.files if f.state != "intact"]


@dataclass(frozen=True)
class ApplyResult:
    noop: bool
    written: tuple[str, ...]
    recovered: str | None


@dataclass(frozen=True)
class RevertResult:
    restored: tuple[str, ...]
    #: (path, why) for files ``keep_changed`` left in the tree.
    kept: tuple[tuple[str, str], ...]
    recovered: str | None
    #: What removing te-align from the trainer's environment did (empty: the patch installed nothing there).
    environment: tuple[str, ...] = ()


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


def _check_manifest(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    path = _state(root) / MANIFEST
    files = data.get("files")
    if not isinstance(files, dict):
        raise _unreadable(path, root, "no 'files' table")
    for key in ("te_align_version", "trainer", "trainer_version"):
        if key in data and not isinstance(data[key], str):
            raise _unreadable(path, root, f"'{key}' must be a string")
    if data.get("profile") is not None and not isinstance(data["profile"], str):
        raise _unreadable(path, root, "'profile' must be a string or null")
    if "extra" in data and not isinstance(data["extra"], dict):
        raise _unreadable(path, root, "'extra' must be a table")
    env = data.get("environment")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(env.get(k), str) for k in ("id", "python", "te_align_version"))
        and isinstance(env.get("installed"), bool)
        and all(isinstance(env.get(k), dict) and all(isinstance(v, str) for v in env[k].values()) for k in ("added", "before"))
    ):
        raise _unreadable(path, root, "'environment' must be a table with id, python, te_align_version, installed, added, before")
    for rel, e in files.items():
        _inside(root, rel, what="file", state_file=path)
        if PurePosixPath(rel).parts[0] in (STATE_DIR, REMOVING):
            raise PatchError(f"te-align state file names its own folder as a patched file ({rel!r}); refusing", file=str(path))
        if not isinstance(e, dict):
            raise _unreadable(path, root, f"entry for {rel} is not a table")
        if not isinstance(e.get("patched_sha256"), str) or not _SHA.fullmatch(e["patched_sha256"]):
            raise _unreadable(path, root, f"{rel}: 'patched_sha256' is not a sha256")
        orig = e.get("original_sha256")
        if orig is not None and not (isinstance(orig, str) and _SHA.fullmatch(orig)):
            raise _unreadable(path, root, f"{rel}: 'original_sha256' is not a sha256")
        if e.get("original_mode") is not None and not _is_mode(e["original_mode"]):
            raise _unreadable(path, root, f"{rel}: 'original_mode' is not a permission mode")
        backup = e.get("backup")
        if (orig is None) != (backup is None):
            raise _unreadable(path, root, f"{rel}: 'backup' and 'original_sha256' disagree")
        if backup is not None:
            f = _inside(root, backup, what="backup", state_file=path, base=_state(root))
            if PurePosixPath(backup).parts[0] != "backup":
                raise _unreadable(path, root, f"{rel}: backup {backup!r} is not under backup/")
            if not f.is_file():
                raise _unreadable(path, root, f"the backup of {rel} ({f}) is missing")
        dirs = e.get("created_dirs", [])
        if not isinstance(dirs, list):
            raise _unreadable(path, root, f"{rel}: 'created_dirs' must be a list")
        for d in dirs:
            _inside(root, d, what="folder", state_file=path)
            if not rel.startswith(d + "/"):
                raise _unreadable(path, root, f"{rel}: created folder {d!r} does not contain it")
        if e.get("original_of") is not None and not isinstance(e["original_of"], str):
            raise _unreadable(path, root, f"{rel}: 'original_of' must be a path")
    return data


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    """The manifest of a patched tree (checked: types, and every path inside the tree), or None."""
    root = Path(root)
    data = _load_json(_state(root) / MANIFEST, root)
    return None if data is None else _check_manifest(root, data)


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
def _begin(root: Path, op: str, paths: Sequence[str]) -> None:
    _begin_in(_place(root), op, paths)


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
            before = f"its copy {place.data / e['copy']}" if e["existed"] and "copy" in e else "none: it did not exist"
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


def _recover(root: Path) -> str | None:
    """Roll an interrupted operation back, or finish one that passed its commit point (caller holds the lock)."""
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
    rolled_back = journal is not None or os.path.lexists(state / ENV_JOURNAL)
    if journal is not None:
        done.append(_rollback_files(root, journal))
        if not os.path.lexists(state):
            return "; ".join(done)
    if os.path.lexists(state / ENV_JOURNAL):  # after the files: the manifest now says whether the install committed
        from te_align.patching.environment import recover_environment

        env_done = recover_environment(root, read_manifest(root))
        if env_done:
            done.append(env_done)
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


def recover(root: str | Path) -> str | None:
    """Roll an interrupted operation back to the state before it; returns what was done, or None."""
    root = _check_root(Path(root))
    with lock(root):
        try:
            return _recover(root)
        except OSError as e:
            raise PatchError(_os_message(e, root, 0) + _still_interrupted(root)) from None


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


def _abort(root: Path, e: OSError, need: int, what: str) -> PatchError:
    """An OSError half-way: roll back now (frees space first); say what happened in one line."""
    msg = _os_message(e, root, need)
    try:
        _recover(root)
    except (OSError, PatchError):
        return PatchError(f"{what} failed: {msg}{_still_interrupted(root)}")
    rest = _still_interrupted(root)
    return PatchError(f"{what} failed and was rolled back{', nothing changed' if not rest else ''}: {msg}{rest}")


def _check_root(root: Path) -> Path:
    if not os.path.lexists(root):
        raise PatchError(f"no such folder: {root}")
    if not root.is_dir():
        raise PatchError(f"not a folder: {root} (give the trainer's folder)")
    return root


# ------------------------------------------------------------------------------- operations
def status(root: str | Path) -> Status:
    root = _check_root(Path(root))
    with lock(root):
        try:
            recovered = _recover(root)
        except OSError as e:
            raise PatchError(
                f"{root} holds an interrupted te-align operation that cannot be rolled back now: {_os_message(e, root, 0)}"
                f"{_still_interrupted(root)}"
            ) from None
        manifest = read_manifest(root)
        if manifest is None:
            return Status(root, False, recovered, None)
        files = []
        for p, entry in sorted(manifest["files"].items()):
            cur = sha256_file(root / p)
            if cur is None:
                files.append(FileState(p, "missing", "deleted since it was patched"))
            elif cur != entry["patched_sha256"]:
                files.append(FileState(p, "changed", "changed since it was patched (e.g. by git pull or an edit)"))
            else:
                files.append(FileState(p, "intact"))
        return Status(root, True, recovered, manifest, tuple(files))


def _check_plan_paths(plan: Plan) -> None:
    root = plan.root
    for c in plan.changes:
        d = root
        for part in PurePosixPath(c.path).parts[:-1]:
            d = d / part
            if os.path.islink(d):
                raise PatchError(f"{d} is a symbolic link; te-align writes only inside {root} without following links ({c.path})")
            if os.path.lexists(d) and not d.is_dir():
                raise PatchError(f"{d} is a file where te-align needs a folder for {c.path}; move it away, then run again")
        if (root / c.path).is_dir():
            raise PatchError(f"{root / c.path} is a folder where te-align writes a file; move it away, then run again")


def apply(plan: Plan, *, replan: bool = False, dry_run: bool = False,
          prepare_environment: Callable[[], dict[str, Any]] | None = None) -> ApplyResult:
    """Apply a plan as a transaction (see the module docstring). ``replan`` accepts patched files
    that changed since (their current bytes, or the plan's ``restore_to``, become the new originals).

    ``prepare_environment``: the environment step (:func:`te_align.patching.environment.install`), run after every
    check and before the first file is written; it journals itself and returns the manifest's ``environment``
    entry. Without it an earlier patch's entry is kept."""
    root = _check_root(plan.root)
    _check_plan_paths(plan)
    with lock(root):
        try:
            recovered = _recover(root)
        except OSError as e:
            raise PatchError(f"cannot finish an interrupted te-align operation: {_os_message(e, root, 0)}{_still_interrupted(root)}") from None
        return _apply_locked(plan, replan, dry_run, recovered, prepare_environment)


def _apply_locked(plan: Plan, replan: bool, dry_run: bool, recovered: str | None,
                  prepare_environment: Callable[[], dict[str, Any]] | None = None) -> ApplyResult:
    root = plan.root
    manifest = read_manifest(root)
    paths = [c.path for c in plan.changes]
    if manifest is not None:
        theirs = manifest.get("te_align_version", "0")
        if _version_tuple(theirs) > _version_tuple(__version__):
            raise PatchError(
                f"{root} was patched by te-align {theirs}, newer than this te-align {__version__}; "
                f"upgrade te-align, or run 'te-align unpatch {root}' with te-align {theirs}"
            )
        changed = [p for p, e in manifest["files"].items() if sha256_file(root / p) != e["patched_sha256"]]
        if changed and not replan:
            raise PatchError(
                f"patched file(s) changed since te-align patched them: {', '.join(sorted(changed))}; "
                f"to keep the new files as the originals and patch again run: te-align patch {root} --replan"
            )
        files_noop = not changed and set(manifest["files"]) == set(paths) and all(
            manifest["files"][c.path]["patched_sha256"] == sha256_bytes(c.content)
            and manifest["files"][c.path].get("original_of") == c.original_of
            and (c.restore_to is None or manifest["files"][c.path]["original_sha256"] == sha256_bytes(c.restore_to))
            for c in plan.changes
        ) and manifest.get("profile") == plan.profile
        if files_noop and (dry_run or prepare_environment is None):
            return ApplyResult(True, (), recovered)
    else:
        files_noop = False
    known: dict[str, Any] = manifest["files"] if manifest else {}
    for c in plan.changes:
        if files_noop:
            break
        entry = known.get(c.path)
        cur = sha256_file(root / c.path)
        if entry is not None and cur == entry["patched_sha256"]:
            continue  # ours, from an earlier patch: its original is already backed up
        if entry is not None and replan:
            continue  # changed since: the current bytes (or restore_to) become the new original
        if cur != c.expect_sha256:
            raise PatchError(
                f"{c.path} changed since the plan was made (expected {str(c.expect_sha256)[:12]}, found {str(cur)[:12]}); run the command again"
            )
    if dry_run:
        return ApplyResult(False, tuple(paths), recovered)
    environment = manifest.get("environment") if manifest else None
    if prepare_environment is not None:
        try:
            environment = prepare_environment()
        except OSError as e:
            raise _abort(root, e, 65536, f"installing te-align for {root}") from None
        if files_noop and manifest is not None and manifest.get("environment") == environment:
            return ApplyResult(True, (), recovered)
    state_rel = PurePosixPath(STATE_DIR)
    stale = [p for p in known if p not in paths]
    # Work out every record and backup first, so the journal can name each file this operation touches.
    files: dict[str, Any] = {}
    backups_new: dict[str, tuple[bytes, int | None]] = {}
    backups_gone: list[str] = []
    for c in plan.changes:
        f = root / c.path
        entry = known.get(c.path)
        cur = sha256_file(f)
        intact = entry is not None and cur == entry["patched_sha256"]
        if entry is not None and entry["original_sha256"] is None:
            # te-align created this file: it stays one that unpatch deletes, whatever it holds now
            rec = {k: entry[k] for k in ("original_sha256", "original_mode", "backup", "created_dirs") if k in entry}
        elif entry is not None and c.restore_to is not None and entry.get("backup"):
            rec = {k: entry[k] for k in ("original_mode", "created_dirs") if k in entry}
            if sha256_bytes(c.restore_to) == entry["original_sha256"]:
                rec.update(original_sha256=entry["original_sha256"], backup=entry["backup"])
            else:
                rec.update(original_sha256=sha256_bytes(c.restore_to), backup=entry["backup"])
                backups_new[entry["backup"]] = (c.restore_to, 0o600)
        elif entry is not None and intact:
            rec = {k: entry[k] for k in ("original_sha256", "original_mode", "backup", "created_dirs") if k in entry}
        else:
            if entry is not None and entry.get("backup"):
                backups_gone.append(entry["backup"])
            if cur is not None:
                backup = f"backup/{c.path}"
                backups_new[backup] = (f.read_bytes(), 0o600)
                rec = {"original_sha256": cur, "original_mode": f.stat().st_mode & 0o7777, "backup": backup}
            else:
                rec = {"original_sha256": None, "original_mode": None, "backup": None}
                created, d = [], f.parent
                while d != root and not d.exists():
                    created.append(d.relative_to(root).as_posix())
                    d = d.parent
                if created:
                    rec["created_dirs"] = created
        if c.original_of is not None:
            rec["original_of"] = c.original_of
        rec["patched_sha256"] = sha256_bytes(c.content)
        files[c.path] = rec
    backups_gone = [b for b in backups_gone if b not in backups_new]
    state_paths = [(state_rel / b).as_posix() for b in (*backups_new, *backups_gone)] + [(state_rel / MANIFEST).as_posix()]
    new_manifest = {
        "format": FORMAT,
        "te_align_version": __version__,
        "trainer": plan.trainer,
        "trainer_version": plan.trainer_version,
        "profile": plan.profile,
        "patched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "extra": plan.extra,
        "files": files,
    }
    if environment is not None:
        new_manifest["environment"] = environment
    need = sum(len(c.content) for c in plan.changes) * 2 + sum(len(b) for b, _ in backups_new.values()) * 2 + 65536
    state = _state(root)
    try:
        _begin(root, "apply", [*paths, *stale, *state_paths])
        for p in stale:  # files a previous patch touched that this plan no longer changes: restore them
            _restore_one(root, p, known[p])
        _remove_empty_dirs(root, [d for p in stale for d in known[p].get("created_dirs", ())])
        for b in backups_gone:
            _unlink(state / b)
        for b, (content, mode) in backups_new.items():
            _makedirs((state / b).parent, state)
            _write(state / b, content, mode)
        for c in plan.changes:
            f = root / c.path
            _makedirs(f.parent, root)
            _write(f, c.content, files[c.path]["original_mode"])
        _write(state / MANIFEST, (json.dumps(new_manifest, indent=2, sort_keys=True) + "\n").encode(), None)
        _commit(root)
        _unlink(state / ENV_JOURNAL)  # the manifest names the install: it is committed
    except OSError as e:
        raise _abort(root, e, need, f"patching {root}") from None
    return ApplyResult(False, tuple(paths), recovered)


def _restore_one(root: Path, path: str, entry: dict[str, Any]) -> None:
    f = root / path
    if entry.get("backup"):
        content = (_state(root) / entry["backup"]).read_bytes()
        if sha256_bytes(content) != entry["original_sha256"]:
            raise _unreadable(_state(root) / MANIFEST, root, f"the backup of {path} ({_state(root) / entry['backup']}) is damaged")
        _makedirs(f.parent, root)
        _write(f, content, entry.get("original_mode"))
    else:
        _unlink(f)


def revert(root: str | Path, *, keep_changed: bool = False) -> list[str]:
    """Restore every patched file byte for byte and remove te-align's state. Returns restored paths.

    A patched file that changed since is not overwritten: the call refuses, unless ``keep_changed``
    (then that file is left as it is now and only the others are restored). ``keep_changed`` never
    deletes the only copy of an original: a file holding the original a kept file runs (a drop-in's
    ``te_align_originals/<script>``, a shim's ``te_align_original_run.py``) is kept too, and an
    original no kept file holds is written beside it as ``<file>.te-align-original``.
    See :func:`revert_report` for what was kept.
    """
    return list(revert_report(root, keep_changed=keep_changed).restored)


def revert_report(root: str | Path, *, keep_changed: bool = False) -> RevertResult:
    root = _check_root(Path(root))
    with lock(root):
        try:
            recovered = _recover(root)
        except OSError as e:
            raise PatchError(f"cannot finish an interrupted te-align operation: {_os_message(e, root, 0)}{_still_interrupted(root)}") from None
        manifest = read_manifest(root)
        if manifest is None:
            done = f"{recovered}; " if recovered else ""
            raise PatchError(f"{done}{root} is not patched by te-align (no {STATE_DIR}/{MANIFEST})")
        theirs = manifest.get("te_align_version", "0")
        if _version_tuple(theirs) > _version_tuple(__version__):
            raise PatchError(f"{root} was patched by te-align {theirs}, newer than this te-align {__version__}; unpatch with te-align {theirs}")
        files: dict[str, Any] = manifest["files"]
        changed = sorted(p for p, e in files.items() if sha256_file(root / p) != e["patched_sha256"])
        if changed and not keep_changed:
            raise PatchError(
                f"patched file(s) changed since te-align patched them: {', '.join(changed)}; they would be overwritten. "
                f"To restore the others and keep these as they are now run: te-align unpatch {root} --keep-changed"
            )
        kept: dict[str, str] = {p: "changed since te-align patched it" for p in changed}
        extra: dict[str, tuple[bytes, int | None]] = {}
        for p in changed:
            entry = files[p]
            for q, qe in files.items():
                if q in kept or not (root / q).is_file():
                    continue
                # declared by the planner, or (manifests of older te-align) a file te-align created that holds p's original
                if qe.get("original_of") == p or (
                    entry.get("original_sha256") and qe.get("original_sha256") is None and sha256_file(root / q) == entry["original_sha256"]
                ):
                    kept[q] = f"the original that {p} runs"
            if entry.get("backup") is None:
                continue
            if any(sha256_file(root / q) == entry["original_sha256"] for q in kept if q != p):
                continue
            side = f"{p}{KEPT_ORIGINAL_SUFFIX}"
            if os.path.lexists(root / side):
                raise PatchError(f"unpatch --keep-changed would keep the original of {p} as {root / side}, which exists; move it away, then run again")
            extra[side] = ((_state(root) / entry["backup"]).read_bytes(), entry.get("original_mode"))
            kept[side] = f"the original of {p}, which no other file holds"
        todo = [p for p in files if p not in kept]
        dirs = [d for p in todo for d in files[p].get("created_dirs", ())]
        env_lines: tuple[str, ...] = ()
        if manifest.get("environment") is not None:  # first, while the manifest still names what to remove
            from te_align.patching.environment import uninstall

            env_lines = uninstall(manifest["environment"])
        try:
            _begin(root, "revert", [*todo, *extra])
            for p in todo:
                _restore_one(root, p, files[p])
            for side, (content, mode) in extra.items():
                _write(root / side, content, mode)
            _remove_empty_dirs(root, dirs)
            _drop_state(root)  # its rename is the commit point
        except OSError as e:
            raise _abort(root, e, sum(len(b) for b, _ in extra.values()) + 65536, f"unpatching {root}") from None
        return RevertResult(tuple(sorted(todo)), tuple(sorted(kept.items())), recovered, env_lines)


def is_state_path(rel: str) -> bool:
    """True for a path (relative to a tree) inside te-align's state folders."""
    return PurePosixPath(rel).parts[:1] in ((STATE_DIR,), (REMOVING,))


__all__ = [
    "ApplyResult",
    "FileChange",
    "FileState",
    "LockBusy",
    "PatchError",
    "Plan",
    "RevertResult",
    "Status",
    "apply",
    "lock",
    "read_manifest",
    "recover",
    "revert",
    "revert_report",
    "sha256_bytes",
    "sha256_file",
    "status",
]
