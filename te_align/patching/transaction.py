"""On-disk patching of a trainer installation as a transaction.

A trainer integration builds a :class:`Plan` (which files get which new bytes, and the checksum
each file had when the plan was made). :func:`apply` then:

1. recovers an interrupted earlier operation (see below);
2. refuses a plan made against files that changed since, a tree patched by a newer te-align, a
   patched file someone changed afterwards (e.g. ``git pull``), or a read-only folder — each with
   the command that gets the user out;
3. writes a journal and a copy of every file it will touch, backs up originals (first patch only),
   writes each new file atomically, writes the manifest, and drops the journal.

Re-applying the same plan is a no-op. :func:`revert` restores byte-identical originals (content
and permission bits) and removes te-align's state folder. :func:`status` reports what is patched and
whether any patched file changed since. If a process dies mid-way, the journal is still there: the
next ``apply``, ``revert`` or ``status`` rolls every touched file back to its state before that
operation, so the tree is always either fully in the old state or fully in the new one.

State lives in ``<root>/.te-align/`` (with a ``.gitignore`` so git ignores it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from te_align import __version__
from te_align._atomic import atomic_file, fsync_dir
from te_align.errors import TeAlignError

STATE_DIR = ".te-align"
MANIFEST = "manifest.json"
JOURNAL = "journal.json"
FORMAT = 1


class PatchError(TeAlignError):
    """A patch, unpatch or status request that cannot go ahead."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes())
    except FileNotFoundError:
        return None


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


@dataclass(frozen=True)
class FileChange:
    """New bytes for one file. ``expect_sha256`` is the file's checksum when planned (None: absent)."""

    path: str
    content: bytes
    expect_sha256: str | None
    note: str = ""

    def __post_init__(self) -> None:
        p = PurePosixPath(self.path)
        if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] == STATE_DIR:
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


# ------------------------------------------------------------------------------- state files
def _state(root: Path) -> Path:
    return root / STATE_DIR


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise PatchError(f"te-align state file is unreadable ({e}); remove {path.parent} only after restoring the files by hand", file=str(path)) from None
    if not isinstance(data, dict):
        raise PatchError("te-align state file is not a JSON object", file=str(path))
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_file(path, "w", error=PatchError) as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def _write_bytes(path: Path, content: bytes, mode: int | None) -> None:
    with atomic_file(path, "wb", error=PatchError) as f:
        f.write(content)
    if mode is not None:
        os.chmod(path, mode)


def _ensure_state_dir(root: Path) -> Path:
    d = _state(root)
    d.mkdir(exist_ok=True)
    ignore = d / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n", encoding="utf-8")
    return d


def read_manifest(root: Path) -> dict[str, Any] | None:
    return _read_json(_state(root) / MANIFEST)


def _check_writable(root: Path, paths: Sequence[str]) -> None:
    """Probe by writing, not by permission bits: root passes ``os.access`` even on immutable or
    read-only-mounted folders."""
    import errno
    import tempfile

    folders = {root} | {(root / p).parent for p in paths if (root / p).parent.exists()}
    for d in sorted(folders):
        try:
            fd, probe = tempfile.mkstemp(prefix=".te-align-probe.", dir=d)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise PatchError(f"folder is read-only: {d} ({e.strerror}); run as a user who can write there, or copy the installation") from None
            raise PatchError(f"cannot write in {d}: {e.strerror}") from None
    for p in paths:
        f = root / p
        if f.exists():
            try:
                with open(f, "ab"):
                    pass
            except OSError as e:
                raise PatchError(f"file is read-only: {f} ({e.strerror}); make it writable and run again") from None


# ------------------------------------------------------------------------------- journal
def _begin(root: Path, op: str, paths: Sequence[str]) -> None:
    """Save every file's pre-operation bytes and the manifest, then write the journal."""
    state = _ensure_state_dir(root)
    data_dir = state / "journal-data"
    if data_dir.exists():
        shutil.rmtree(data_dir)
    entries = []
    for p in paths:
        f = root / p
        if f.exists():
            keep = data_dir / p
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, keep)
            entries.append({"path": p, "existed": True, "sha256": sha256_file(f), "mode": f.stat().st_mode & 0o7777})
        else:
            entries.append({"path": p, "existed": False})
    if data_dir.exists():
        fsync_dir(data_dir)
    _write_json(state / JOURNAL, {"op": op, "started": time.time(), "files": entries, "manifest": read_manifest(root)})


def _commit(root: Path) -> None:
    state = _state(root)
    (state / JOURNAL).unlink(missing_ok=True)
    shutil.rmtree(state / "journal-data", ignore_errors=True)


def recover(root: Path) -> str | None:
    """Roll an interrupted operation back to the state before it; returns what was done, or None."""
    state = _state(root)
    journal = _read_json(state / JOURNAL)
    if journal is None:
        return None
    restored = 0
    for e in journal.get("files", []):
        f = root / e["path"]
        if e.get("existed"):
            if sha256_file(f) != e["sha256"]:
                content = (state / "journal-data" / e["path"]).read_bytes()
                _write_bytes(f, content, e.get("mode"))
                restored += 1
        elif f.exists():
            f.unlink()
            restored += 1
    previous = journal.get("manifest")
    if previous is None:
        (state / MANIFEST).unlink(missing_ok=True)
    else:
        _write_json(state / MANIFEST, previous)
    # Backups made by the interrupted operation that the restored manifest does not reference.
    referenced = {e.get("backup") for e in (previous or {}).get("files", {}).values()}
    backup_root = state / "backup"
    if backup_root.exists():
        for f in sorted(backup_root.rglob("*"), reverse=True):
            rel = f.relative_to(state).as_posix()
            if f.is_file() and rel not in referenced:
                f.unlink()
            elif f.is_dir() and not any(f.iterdir()):
                f.rmdir()
    _commit(root)
    if previous is None:
        shutil.rmtree(state, ignore_errors=True)
    return f"recovered from an interrupted '{journal.get('op')}' ({restored} file(s) rolled back)"


# ------------------------------------------------------------------------------- operations
def status(root: str | Path) -> Status:
    root = Path(root)
    recovered = recover(root) if _state(root).exists() else None
    manifest = read_manifest(root)
    if manifest is None:
        return Status(root, False, recovered, None)
    files = []
    for p, entry in sorted(manifest["files"].items()):
        cur = sha256_file(root / p)
        if cur is None:
            files.append(FileState(p, "missing", "deleted since it was patched"))
        elif cur != entry["patched_sha256"]:
            files.append(FileState(p, "changed", "changed since it was patched (e.g. by git pull)"))
        else:
            files.append(FileState(p, "intact"))
    return Status(root, True, recovered, manifest, tuple(files))


def apply(plan: Plan, *, replan: bool = False, dry_run: bool = False) -> ApplyResult:
    """Apply a plan as a transaction (see the module docstring). ``replan`` accepts patched files
    that changed since (their current bytes become the new originals)."""
    root = plan.root
    if not root.is_dir():
        raise PatchError(f"no such folder: {root}")
    recovered = recover(root) if _state(root).exists() else None
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
        if not changed and set(manifest["files"]) == set(paths) and all(
            manifest["files"][c.path]["patched_sha256"] == sha256_bytes(c.content) for c in plan.changes
        ) and manifest.get("profile") == plan.profile:
            return ApplyResult(True, (), recovered)
    known = manifest["files"] if manifest else {}
    for c in plan.changes:
        entry = known.get(c.path)
        cur = sha256_file(root / c.path)
        if entry is not None and cur == entry["patched_sha256"]:
            continue  # ours, from an earlier patch: its original is already backed up
        if entry is not None and replan:
            continue  # changed since: the current bytes become the new original
        if cur != c.expect_sha256:
            raise PatchError(
                f"{c.path} changed since the plan was made (expected {str(c.expect_sha256)[:12]}, found {str(cur)[:12]}); run the command again"
            )
    if dry_run:
        return ApplyResult(False, tuple(paths), recovered)
    stale = [p for p in known if p not in paths]
    _check_writable(root, [*paths, *stale])
    _begin(root, "apply", [*paths, *stale])
    state = _state(root)
    files: dict[str, Any] = {}
    for p in stale:  # files a previous patch touched that this plan no longer changes: restore them
        _restore_one(root, p, known[p])
    for c in plan.changes:
        f = root / c.path
        entry = known.get(c.path)
        keep_original = entry is not None and (sha256_file(f) == entry["patched_sha256"])
        if keep_original:
            rec = {k: entry[k] for k in ("original_sha256", "original_mode", "backup", "created_dirs") if k in entry}
        else:
            if entry is not None and entry.get("backup"):
                (state / entry["backup"]).unlink(missing_ok=True)
            if f.exists():
                backup = f"backup/{c.path}"
                (state / backup).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, state / backup)
                rec = {"original_sha256": sha256_file(f), "original_mode": f.stat().st_mode & 0o7777, "backup": backup}
            else:
                rec = {"original_sha256": None, "original_mode": None, "backup": None}
                # folders this file creates, deepest first: revert removes them again when empty
                created, d = [], f.parent
                while d != root and not d.exists():
                    created.append(d.relative_to(root).as_posix())
                    d = d.parent
                if created:
                    rec["created_dirs"] = created
        mode = rec["original_mode"]
        _write_bytes(f, c.content, mode)
        rec["patched_sha256"] = sha256_bytes(c.content)
        files[c.path] = rec
    _write_json(
        state / MANIFEST,
        {
            "format": FORMAT,
            "te_align_version": __version__,
            "trainer": plan.trainer,
            "trainer_version": plan.trainer_version,
            "profile": plan.profile,
            "patched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "extra": plan.extra,
            "files": files,
        },
    )
    _commit(root)
    return ApplyResult(False, tuple(paths), recovered)


def _restore_one(root: Path, path: str, entry: dict[str, Any]) -> None:
    f = root / path
    if entry.get("backup"):
        _write_bytes(f, (_state(root) / entry["backup"]).read_bytes(), entry.get("original_mode"))
    else:
        f.unlink(missing_ok=True)
        for d in entry.get("created_dirs", ()):
            folder = root / d
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def revert(root: str | Path, *, keep_changed: bool = False) -> list[str]:
    """Restore every patched file byte for byte and remove te-align's state. Returns restored paths.

    A patched file that changed since is not overwritten: the call refuses, unless ``keep_changed``
    (then that file is left as it is now and only the others are restored).
    """
    root = Path(root)
    if _state(root).exists():
        recover(root)
    manifest = read_manifest(root)
    if manifest is None:
        raise PatchError(f"{root} is not patched by te-align (no {STATE_DIR}/{MANIFEST})")
    theirs = manifest.get("te_align_version", "0")
    if _version_tuple(theirs) > _version_tuple(__version__):
        raise PatchError(f"{root} was patched by te-align {theirs}, newer than this te-align {__version__}; unpatch with te-align {theirs}")
    changed = sorted(p for p, e in manifest["files"].items() if sha256_file(root / p) != e["patched_sha256"])
    if changed and not keep_changed:
        raise PatchError(
            f"patched file(s) changed since te-align patched them: {', '.join(changed)}; they would be overwritten. "
            f"To restore the others and keep these as they are now run: te-align unpatch {root} --keep-changed"
        )
    todo = [p for p in manifest["files"] if p not in changed]
    _check_writable(root, todo)
    _begin(root, "revert", todo)
    for p in todo:
        _restore_one(root, p, manifest["files"][p])
    (_state(root) / MANIFEST).unlink(missing_ok=True)
    _commit(root)
    shutil.rmtree(_state(root), ignore_errors=True)
    return sorted(todo)
