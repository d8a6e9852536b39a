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

The journal, its rollback and recovery, the lock and the file operations are the journal engine's
(:mod:`te_align.patching.journal`), which ``check --fix`` shares; this module is the patch on top of it
(plan, manifest, apply, revert, status). Every change to the disk goes through
:func:`te_align._atomic.fault_point`, which crash tests and ``tools/fault_campaign.py`` use to kill the
process (or fail with ENOSPC/EROFS) at the N-th one.

State lives in ``<root>/.te-align/`` (with a ``.gitignore`` so git ignores it).

The same transaction (journal format, rollback, recovery, fault points) writes ``te-align check --fix``
(:mod:`te_align.fixing.fix`): a :class:`Place` says where a transaction keeps its journal and whether the
paths it names are relative to a tree (``patch``) or absolute (``--fix``: a config and the dataset TOML it
names may sit in two folders, locked together by :func:`lock_all`). A journal entry carries ``new_sha256``,
the bytes the operation writes there (``patch`` and ``unpatch`` record it for every file and state file they
write, as ``--fix`` does): the rollback of a killed operation then refuses a file holding neither those nor
its bytes from before (someone else's edit), before it touches anything.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from te_align._version import __version__
from te_align.patching import environment
from te_align.patching.environment import ENV_JOURNAL
from te_align.patching.journal import (
    _SHA,
    JOURNAL,
    JOURNAL_DATA,
    KEPT_ORIGINAL_SUFFIX,
    LOCK_FILE,
    MANIFEST,
    REMOVING,
    STATE_DIR,
    TMP_SUFFIX,
    LockBusy,
    PatchError,
    Place,
    StepJournal,
    _begin,
    _check_root,
    _commit,
    _drop_state,
    _inside,
    _is_mode,
    _load_json,
    _makedirs,
    _os_message,
    _remove_empty_dirs,
    _state,
    _still_interrupted,
    _unlink,
    _unreadable,
    _write,
    lock,
    lock_all,
    recover_tree,
    sha256_bytes,
    sha256_file,
)

FORMAT = 1


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



def _recover_environment(root: Path) -> str | None:
    return environment.recover_environment(root, read_manifest(root))


#: The patch transaction's one more step: te-align installed into the trainer's Python (its own journal).
_STEPS = (StepJournal(ENV_JOURNAL, _recover_environment),)


def _recover(root: Path) -> str | None:
    """Roll an interrupted operation back, or finish one that passed its commit point (caller holds the lock):
    the files, then the environment step (:func:`te_align.patching.journal.recover_tree`)."""
    return recover_tree(root, _STEPS)


def recover(root: str | Path) -> str | None:
    """Roll an interrupted operation back to the state before it; returns what was done, or None."""
    root = _check_root(Path(root))
    with lock(root):
        try:
            return _recover(root)
        except OSError as e:
            raise PatchError(_os_message(e, root, 0) + _still_interrupted(root)) from None



def _abort(root: Path, e: OSError, need: int, what: str) -> PatchError:
    """An OSError half-way: roll back now (frees space first); say what happened in one line."""
    msg = _os_message(e, root, need)
    try:
        _recover(root)
    except (OSError, PatchError):
        return PatchError(f"{what} failed: {msg}{_still_interrupted(root)}")
    rest = _still_interrupted(root)
    return PatchError(f"{what} failed and was rolled back{', nothing changed' if not rest else ''}: {msg}{rest}")



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
    manifest_bytes = (json.dumps(new_manifest, indent=2, sort_keys=True) + "\n").encode()
    # The bytes this operation writes to each path: a rollback refuses a file that holds neither them nor its
    # bytes from before (someone edited it after the operation was killed), as it does for check --fix.
    new_sha: dict[str, str] = {c.path: files[c.path]["patched_sha256"] for c in plan.changes}
    new_sha.update({p: known[p]["original_sha256"] for p in stale if known[p].get("backup")})
    new_sha.update({(state_rel / b).as_posix(): sha256_bytes(content) for b, (content, _) in backups_new.items()})
    new_sha[(state_rel / MANIFEST).as_posix()] = sha256_bytes(manifest_bytes)
    need = sum(len(c.content) for c in plan.changes) * 2 + sum(len(b) for b, _ in backups_new.values()) * 2 + 65536
    state = _state(root)
    try:
        _begin(root, "apply", [*paths, *stale, *state_paths], new_sha)
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
        _write(state / MANIFEST, manifest_bytes, None)
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
            env_lines = environment.uninstall(manifest["environment"])
        try:
            new_sha = {p: files[p]["original_sha256"] for p in todo if files[p].get("backup")}
            new_sha.update({side: sha256_bytes(content) for side, (content, _) in extra.items()})
            _begin(root, "revert", [*todo, *extra], new_sha)
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
    "ENV_JOURNAL",
    "FORMAT",
    "JOURNAL",
    "JOURNAL_DATA",
    "KEPT_ORIGINAL_SUFFIX",
    "LOCK_FILE",
    "MANIFEST",
    "REMOVING",
    "STATE_DIR",
    "TMP_SUFFIX",
    "ApplyResult",
    "FileChange",
    "FileState",
    "LockBusy",
    "PatchError",
    "Place",
    "Plan",
    "RevertResult",
    "Status",
    "apply",
    "is_state_path",
    "lock",
    "lock_all",
    "read_manifest",
    "recover",
    "revert",
    "revert_report",
    "sha256_bytes",
    "sha256_file",
    "status",
]
