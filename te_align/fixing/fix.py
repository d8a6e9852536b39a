"""``te-align check --fix``: write the profile's values into the user's config, in the trainer's own terms.

For every error or warning finding whose fix is a key or flag the trainer reads (:attr:`Finding.edit`), the
trainer's writer (:class:`te_align.trainers.api.ConfigWriter`) says where it goes and
:mod:`te_align.fixing.editing` edits the text, keeping every other byte. The fix is a transaction, as
``te-align patch`` makes them:

1. refuse, with one line and the file untouched: a symbolic link (``--fix`` writes regular files only: it
   names the file the link points to), a profile only assumed (``--profile`` settles it), a key the writer has
   no place for or that is given on the command line after ``--``, a file without write permission (its mode
   bits, so also for root) or in a folder that cannot be written;
2. check the new text (in memory, :func:`te_align.audit.readers.overlaid`) before anything is written: if a
   finding the fix was meant to remove is still there, nothing is written;
3. under the lock of every folder it writes in (:func:`te_align.patching.transaction.lock`, taken in the order
   of their real paths), compare every file's bytes with the ones the fix was made from (one changed
   meanwhile: nothing written), write the journal, then per file keep a backup beside it
   (``NAME.te-align-original``, the name ``te-align unpatch --keep-changed`` uses; ``--no-backup`` skips it)
   and replace it atomically (:func:`te_align._atomic.atomic_file`, its permission bits kept): the config
   first, then the files it names (a dataset TOML the training config names). The commit point: the journal
   removed (or, when older backups are to be deleted, rewritten with ``"committed": true``, then removed after them).

The fix may write two files (a training TOML and the dataset TOML it names); they change together or not at
all. The journal, ``.NAME.te-align-fix-journal`` beside the config (:func:`journal_path`, mode 0600), is JSON::

    {"te_align": "check --fix journal", "version": 1, "committed": false, "config": "/abs/config.toml",
     "files": [{"path": "/abs/file", "original": "<base64 of its bytes before the fix>",
                "new_sha256": "<hex digest of the bytes the fix writes>",
                "backup": "/abs/file.te-align-original" or null (--no-backup),
                "older_backup": "/abs/.file.te-align-original.te-align-fix-older" or null}, ...]}

``older_backup``: a backup already beside the file (from an earlier fix) is linked there before this run's
backup replaces it, so that a rollback puts it back (after the commit it is deleted: a successful fix replaces
the old backup, as it always did). A write that fails half-way (the file changed under the lock, permission,
full disk, Ctrl-C) is rolled back in-process: every file already replaced gets its original bytes back (the
backup this run made is a hard link to the original file: renamed back, so a full disk does not stop it; else
written atomically, permission bits kept), the backups this run made are removed (an older backup is put
back), the journal is removed, and one line says nothing was written; a rollback that cannot write either
keeps the journal and says so. A killed process leaves the journal: the next ``--fix`` on that config rolls it
back under the same locks (each journalled file must hold its original bytes or the fixed ones; a file with
other bytes is refused in one line naming it, and nothing is touched), removes te-align's temp files beside
those files, says so in one line (exit 2) and stops: run ``--fix`` again to fix. A committed journal is
finished instead (the older backups' links and the journal removed), and the fix goes on. ``--diff`` refuses
while a journal is there (it writes nothing, not even a rollback).

Running it again changes nothing: the fixed findings are gone. No torch.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import difflib
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from te_align import _atomic
from te_align._atomic import atomic_file, fault_point, fsync_dir, link_or_copy
from te_align.audit import readers
from te_align.audit.check import (
    check_file,
    command_starts,
    failed,
    read_config,
    resolve_parts,
    several_commands,
)
from te_align.audit.cmdline import script_pattern
from te_align.audit.findings import EXIT_UNREADABLE, CheckResult, Edit, Finding
from te_align.errors import TeAlignError
from te_align.fixing import editing
from te_align.fixing.editing import CannotFix, Change
from te_align.patching.transaction import KEPT_ORIGINAL_SUFFIX, lock

if TYPE_CHECKING:  # pragma: no cover
    from te_align.trainers.api import CheckLanguages, CheckParts

#: The backup beside a fixed file: ``NAME`` + this suffix (the name ``te-align unpatch --keep-changed`` uses).
BACKUP_SUFFIX = KEPT_ORIGINAL_SUFFIX
#: The journal of a ``--fix`` being written: ``.NAME`` + this suffix beside the config (:func:`journal_path`).
JOURNAL_SUFFIX = ".te-align-fix-journal"
#: While a fix is written, a backup that was already beside a file is also linked at ``.BACKUP`` + this suffix.
OLDER_BACKUP_SUFFIX = ".te-align-fix-older"
_JOURNAL_TAG = "check --fix journal"
_CHANGED = "changed while it was being fixed; nothing written: run --fix again"
#: What ``--fix`` writes: findings of these severities (``info`` notes, such as a per-encoder dropout the
#: profile documents, stay notes).
FIXED_SEVERITIES = ("error", "warning")


@dataclass
class FixReport:
    """What ``--fix`` (or ``--diff``) did to one config."""

    file: str
    #: The check of the file as it now stands (after the fix; as it was when nothing was written).
    result: CheckResult
    #: The changes written (or shown by ``--diff``), per file.
    changes: list[Change] = field(default_factory=list)
    #: The findings the changes remove.
    fixed: list[Finding] = field(default_factory=list)
    #: One line: why nothing was written (exit code 2).
    refused: str = ""
    #: ``--diff``: the unified diff of every file the fix changes.
    diff: str = ""
    backups: list[str] = field(default_factory=list)
    written: bool = False
    #: What to do after the fix: the fixes of the stale-cache findings the config had (a cache made with the
    #: old settings is still there).
    after: list[str] = field(default_factory=list)
    #: The files the rollback of an interrupted ``--fix`` gave their bytes back (:func:`roll_back_interrupted`).
    rolled_back: list[str] = field(default_factory=list)
    #: ``--diff``: the check of the file as the fix would leave it (None: as ``result``).
    would_be: CheckResult | None = None
    #: A file of several commands: the check of each (``FILE:LINE``), as ``result`` is of the last; with
    #: ``--diff``, ``would_be_all`` as ``would_be``. Empty for any other file.
    results: list[CheckResult] = field(default_factory=list)
    would_be_all: list[CheckResult] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.refused:
            return EXIT_UNREADABLE
        if self.results:
            from te_align.audit.check import exit_code

            return exit_code(self.results)
        return self.result.exit_code

    @property
    def left(self) -> list[Finding]:
        """Error and warning findings still there (with ``--diff``: still there once the diff is written), each
        with why ``--fix`` left it (:func:`why_left`)."""
        checks = (self.would_be_all or self.results) or [self.would_be or self.result]
        return [f for r in checks for f in r.findings if f.severity in FIXED_SEVERITIES
                and f.kind not in ("syntax", "wrong-value")]


def needs_patch(f: Finding) -> bool:
    """A finding no key or flag of the trainer fixes: its fix says "not settable" (a hard-coded value, or a key
    the trainer reads but ignores for this model). A deviation whose fix is a key the user may set (caption
    dropout off, where the trainer cannot drop captions as zeros) is a choice left to the user, not this."""
    return f.edit is None and "not settable" in f.fix


def patch_fixes(f: Finding) -> bool:
    """A finding no key fixes whose fix is te-align's patch or hooks (not one that says they do not cover it)."""
    return needs_patch(f) and ("`te-align patch" in f.fix or "with te-align's hooks" in f.fix)


def why_left(f: Finding) -> str:
    """Why ``--fix`` did not write a finding's fix: no key sets it (``te-align patch`` / the hooks), or its
    fix is a choice left to the user (a misspelled key, caption dropout, a cache to rebuild)."""
    if needs_patch(f):
        return f"no key sets it: {f.fix}"
    bad = unsafe(f)
    if bad:
        from te_align.audit.policy import unsafe_why

        sets = ", ".join(f"{k} = true" for k in bad)
        return (f"not written: its fix ({f.fix}) also sets {sets}, which {unsafe_why(f)}; "
                "run `te-align check --fix --allow-unsafe-keys` to write it anyway")
    return f"left to you: {f.fix}" if f.fix else "left to you"


def unsafe(f: Finding) -> list[str]:
    """The keys a finding's fix would write that switch off the trainer's own safety checks
    (the trainer's rule names them): ``--fix`` writes them only with ``--allow-unsafe-keys``."""
    from te_align.audit.policy import unsafe_keys

    return unsafe_keys(f)


def _targets(result: CheckResult, allow_unsafe: bool = False) -> list[Finding]:
    return [f for f in result.findings if f.edit is not None and f.severity in FIXED_SEVERITIES
            and (allow_unsafe or not unsafe(f))]


def _refuse(report: FixReport, message: str) -> FixReport:
    report.refused = message
    report.changes = []
    return report


def _edits(edit: Edit) -> list[Edit]:
    return [edit, *(Edit(k, v) for k, v in edit.also)]


def fix_file(
    path: str,
    languages: CheckLanguages,
    *,
    profile: str | None = None,
    extra_args: Sequence[str] = (),
    cache_dir: str | None = None,
    dataset: Sequence[str] = (),
    overrides: Mapping[str, object] | None = None,
    write: bool = True,
    backup: bool = True,
    before_write: Callable[[], object] | None = None,
    allow_unsafe: bool = False,
) -> FixReport:
    """Fix one config (``write=False``: only make the diff). ``languages``: the config languages ``check`` reads
    (:class:`te_align.trainers.api.CheckLanguages`, handed down by the caller); each command's is resolved once,
    and the fixed text is checked again with the same parts. ``before_write`` runs after the fix is made and
    checked, just before the files are locked, compared and replaced (tests change the file there).
    ``allow_unsafe``: also write fixes that set a key switching off the trainer's own safety checks
    (``--allow-unsafe-keys``); without it they are left, each saying what it would take."""
    opts = _Opts(profile, list(extra_args), cache_dir, list(dataset), dict(overrides or {}))
    p = Path(path)
    if p.is_symlink():
        result = CheckResult(file=path, status="unreadable")
        return _refuse(FixReport(path, result), f"{path}: a symbolic link (to {os.path.realpath(p)}); --fix "
                                                "writes regular files only: run it on the file the link "
                                                "points to")
    backed_up = readers.backup_of(path)
    if backed_up is not None:
        return _refuse(FixReport(path, CheckResult(file=path, status="unreadable")),
                       f"{path}: te-align's backup of {backed_up}; --fix and --diff edit the file itself: run it on "
                       f"{backed_up} (te-align check reads the backup as it is)")
    journal = journal_path(path)
    if os.path.lexists(journal):
        unread = FixReport(path, CheckResult(file=path, status="unreadable"))
        if not write:
            return _refuse(unread, f"{path}: an interrupted --fix left its journal {journal}: run --fix to roll "
                                   "it back first (--diff writes nothing)")
        try:
            restored = roll_back_interrupted(path)
        except CannotFix as e:
            return _refuse(unread, str(e))
        except TeAlignError as e:
            return _refuse(unread, f"{path}: {e}; nothing rolled back")
        except OSError as e:
            return _refuse(unread, f"{path}: rolling back an interrupted --fix failed ({e.filename}: {e.strerror}); "
                                   f"its journal {journal} is kept: run --fix again")
        if restored is not None:
            report = FixReport(path, _checked(path, languages, None, opts)[0], rolled_back=restored)
            said = (f"{', '.join(restored)} restored to the bytes before it" if restored
                    else "every file it names already held its bytes from before it")
            return _refuse(report, f"{path}: an interrupted --fix was rolled back ({said}; its backups as "
                                   "before, its journal removed); nothing fixed yet: run --fix again")
    try:
        original = {str(p): p.read_bytes()} if p.is_file() else {}
    except OSError as e:
        return _refuse(FixReport(path, CheckResult(file=path, status="unreadable")),
                       f"{path}: cannot read: {e.strerror}")
    starts: list[int | None] = list(command_starts(path, languages.scripts))  # several commands: each is fixed
    if len(starts) < 2:
        starts = [None]
    checked = [_checked(path, languages, n, opts) for n in starts]
    results = several_commands([r for r, _ in checked])
    result = results[-1]
    report = FixReport(path, result, results=results if starts != [None] else [])
    for r in results:
        if r.exit_code == EXIT_UNREADABLE:
            bad = next((f for f in r.findings if f.kind in ("syntax", "wrong-value")), None)
            return _refuse(report, bad.message if bad else f"{r.file}: unreadable")
    each = [(n, r, _targets(r, allow_unsafe), parts) for n, r, (_, parts) in zip(starts, results, checked,
                                                                                   strict=True)]
    targets = [f for _, _, t, _ in each for f in t]
    if not targets:
        return report
    for _, r, t, _ in each:
        if t and r.assumed and profile is None:
            return _refuse(report, f"{r.file}: the model is assumed ({r.profile}: {r.assumed}); --fix "
                                   "writes only against a profile the config settles: pass --profile NAME")
    try:
        changes = [c for n, r, t, parts in each if t
                   for c in _place(path, parts, languages.scripts, r, t, list(extra_args), n)]
        texts = _edit_texts(changes, original, languages.scripts)
    except CannotFix as e:
        return _refuse(report, str(e))
    except (TeAlignError, OSError) as e:
        return _refuse(report, f"{path}: {e}")
    new_texts = {f: t for f, (old, t) in texts.items() if t != old}
    with readers.overlaid({f: t.replace("\r\n", "\n") for f, t in new_texts.items()}):
        new_starts: list[int | None] = list(command_starts(path, languages.scripts)) if starts != [None] else [None]
        if len(new_starts) != len(starts):
            return _refuse(report, f"{path}: the fix would change which commands the file runs; nothing written "
                                   "(please report it)")
        afters = several_commands([_checked(path, languages, n, opts, parts)[0]
                                   for n, (_, parts) in zip(new_starts, checked, strict=True)])
    for (_, _, t, _), after in zip(each, afters, strict=True):
        meant = {(f.kind, f.setting) for f in t}
        still = [f for f in after.findings if (f.kind, f.setting) in meant and f.severity in FIXED_SEVERITIES]
        if still:
            f = still[0]
            return _refuse(report, f"{after.file}: after the fix {f.setting} would still be {_plain(f.effective)} "
                                   f"({f.message}); nothing written")
        if after.exit_code == EXIT_UNREADABLE:
            return _refuse(report, f"{after.file}: the fixed config would not read back; nothing written (please "
                                   "report it)")
    after = afters[-1]
    report.changes = changes
    report.fixed = targets
    report.diff = "".join(_diff(f, old, t) for f, (old, t) in texts.items() if t != old)
    if not write or not new_texts:
        report.would_be = after
        report.would_be_all = afters if report.results else []
        return report
    main = os.path.realpath(path)
    order = sorted(new_texts, key=lambda f: os.path.realpath(f) != main)  # the config first
    try:
        for name in order:
            _writable(name)
        if not os.access(journal.parent, os.W_OK):
            raise CannotFix(f"its folder {journal.parent} is not writable (--fix keeps its journal there); "
                            "nothing written", file=path)
        if before_write is not None:
            before_write()
        report.backups += _write_all(path, [(n, original[n], new_texts[n].encode("utf-8")) for n in order],
                                     backup)
    except CannotFix as e:
        return _refuse(FixReport(path, result), str(e))
    except TeAlignError as e:
        return _refuse(FixReport(path, result), f"{path}: {e}; nothing written")
    report.result = after
    report.results = afters if report.results else []
    report.written = True
    report.after = [f.fix for r in results for f in r.findings if f.kind == "stale-cache" and f.fix]
    return report


def _plain(v: object) -> str:
    return "unset" if v is None else repr(v)


@dataclass(frozen=True)
class _Opts:
    """The options every check of a fix runs with."""

    profile: str | None
    extra_args: list[str]
    cache_dir: str | None
    dataset: list[str]
    overrides: dict[str, object]


def _checked(path: str, languages: CheckLanguages, at_line: int | None, opts: _Opts,
             parts: CheckParts | None = None) -> tuple[CheckResult, CheckParts | None]:
    """The check of one command of ``path`` (``at_line``; None: the file) and the parts it was checked with:
    ``parts`` when given (the fixed text is checked as the original was), else resolved from ``languages``
    (None: the config could not be read or resolved)."""
    label = path if at_line is None else f"{path}:{at_line}"
    try:
        raw = read_config(path, languages.scripts, at_line=at_line, extra_args=opts.extra_args)
        parts = parts or resolve_parts(raw, languages)
    except TeAlignError as e:
        return failed(CheckResult(file=label), e), None
    return check_file(raw, parts, opts.profile, extra_args=opts.extra_args, cache_dir=opts.cache_dir,
                      dataset=opts.dataset, overrides=opts.overrides, label=label), parts


def _place(path: str, parts: CheckParts | None, scripts: str, result: CheckResult, targets: list[Finding],
           extra_args: list[str], at_line: int | None = None) -> list[Change]:
    """The changes of every target finding, from the dialect's writer (``parts``: the ones it was checked with);
    one per place (agreeing fixes merged). ``at_line``: the command they edit in a file of several."""
    name = result.trainer or ""
    writer = parts.writer() if parts is not None else None
    if writer is None:
        raise CannotFix(f"te-align has no writer for {name} configs; fix by hand", file=result.file)
    raw = readers.load(path, at_line, script_pattern(scripts))
    out: dict[tuple[str, editing.Path_], Change] = {}
    for f in targets:
        assert f.edit is not None
        for e in _edits(f.edit):
            for c in writer.place(raw, e, extra_args):
                if c.fmt == "cmdline" and at_line is not None and c.file == path:
                    c = dataclasses.replace(c, at_line=at_line)
                key = (str(Path(c.file).resolve()), c.path)
                if key in out and (out[key].value, out[key].remove) != (c.value, c.remove):
                    raise CannotFix(f"two fixes disagree on {c.key} ({out[key].describe()} / "
                                    f"{c.describe()}); fix by hand", file=c.file)
                out[key] = c
    return list(out.values())


def _edit_texts(changes: list[Change], original: dict[str, bytes], scripts: str) -> dict[str, tuple[str, str]]:
    """file -> (text now, text after the changes), each edit verified by parsing it back."""
    by_file: dict[str, list[Change]] = {}
    for c in changes:
        by_file.setdefault(c.file, []).append(c)
    out: dict[str, tuple[str, str]] = {}
    for f, cs in by_file.items():
        p = Path(f)
        if p.is_symlink():
            raise CannotFix(f"a symbolic link (to {os.path.realpath(p)}); --fix writes regular files only",
                            file=f)
        if f not in original:
            original[f] = p.read_bytes()
        try:
            text = original[f].decode("utf-8")
        except UnicodeDecodeError as e:
            raise CannotFix(f"not UTF-8 text ({e.reason} at byte {e.start})", file=f) from None
        if cs[0].fmt != "cmdline":  # a change to the value the file already has is none
            data = editing.parse_text(text, cs[0].fmt, f)
            cs = [c for c in cs if editing.expected_data(data, [c]) != data]
            changes[:] = [c for c in changes if c.file != f or c in cs]
        new = editing.apply(text, cs[0].fmt, cs, f, script_pattern(scripts)) if cs else text
        if new != text:
            editing.verify(text, new, cs[0].fmt, cs, f, script_pattern(scripts))
        out[f] = (text, new)
    return out


def _diff(file: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{file}", tofile=f"b/{file}"))


def _writable(file: str) -> None:
    st = os.stat(file)
    if not st.st_mode & stat.S_IWUSR or not os.access(file, os.W_OK):
        raise CannotFix(f"not writable (mode {stat.filemode(st.st_mode)}); nothing written", file=file)
    folder = Path(file).parent
    if not os.access(folder, os.W_OK):
        raise CannotFix(f"its folder {folder} is not writable (--fix replaces the file atomically); nothing "
                        "written", file=file)


def journal_path(config: str | os.PathLike[str]) -> Path:
    """Where ``--fix`` keeps its journal while it writes the fix of ``config``: ``.NAME.te-align-fix-journal``
    beside it."""
    p = Path(config)
    return p.with_name(f".{p.name}{JOURNAL_SUFFIX}")


@dataclass(frozen=True)
class _Entry:
    """One file of a fix being written (or of a journal read back: ``new`` is then unknown)."""

    path: str
    old: bytes
    new_sha256: str
    backup: bool
    #: A backup was already beside the file: kept at :attr:`older_path` until the commit.
    older: bool
    new: bytes | None = None

    @property
    def bak(self) -> Path:
        p = Path(self.path)
        return p.with_name(p.name + BACKUP_SUFFIX)

    @property
    def older_path(self) -> Path:
        return self.bak.with_name(f".{self.bak.name}{OLDER_BACKUP_SUFFIX}")


@contextlib.contextmanager
def _locked(folders: Iterable[Path]) -> Iterator[None]:
    """The lock of every folder, each once, in the order of their real paths (two fixes never deadlock)."""
    with contextlib.ExitStack() as stack:
        for folder in sorted({os.path.realpath(f) for f in folders}):
            stack.enter_context(lock(folder))
        yield


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_all(config: str, files: list[tuple[str, bytes, bytes]], backup: bool) -> list[str]:
    """Replace every file by its new bytes, all or none: under the lock of every folder, if each still holds
    the bytes the fix was made from; journalled beside ``config`` (see the module docstring). The backups
    made."""
    journal = journal_path(config)
    with _locked([Path(f).parent for f, _, _ in files] + [journal.parent]):
        if os.path.lexists(journal):  # a --fix killed since this one looked
            raise CannotFix(f"an interrupted --fix left its journal {journal} meanwhile: run --fix again to "
                            "roll it back; nothing written", file=config)
        for f, old, _ in files:
            try:
                now = Path(f).read_bytes()
            except OSError as e:
                raise CannotFix(f"cannot read: {e.strerror}; nothing written", file=f) from None
            if now != old:
                raise CannotFix(_CHANGED, file=f)
        entries = []
        for f, old, new in files:
            bak = Path(f).with_name(Path(f).name + BACKUP_SUFFIX)
            entries.append(_Entry(f, old, _sha256(new), backup, backup and os.path.lexists(bak), new))
        _sweep(entries, journal, older=True)  # what a killed run left after its commit point
        _write_journal(journal, config, entries)
        current = entries[0]
        try:
            for current in entries:
                _replace(current)
            if any(e.older for e in entries):  # the commit point: the journal says so, then the cleanup
                _write_journal(journal, config, entries, committed=True)
            else:  # the commit point: no journal
                fault_point("unlink", journal)
                journal.unlink()
                fsync_dir(journal.parent)
        except BaseException as exc:
            _fail(exc, entries[:entries.index(current) + 1], journal, config, current)
        with contextlib.suppress(OSError):  # else the next --fix finishes it
            _finish(entries, journal)
    return [str(e.bak) for e in entries if e.backup]


def _finish(entries: list[_Entry], journal: Path) -> None:
    """The cleanup after the commit point: the older backups' extra links, then the journal."""
    for e in entries:
        if e.older and os.path.lexists(e.older_path):
            fault_point("unlink", e.older_path)
            e.older_path.unlink()
    for folder in {e.bak.parent for e in entries if e.older}:
        fsync_dir(folder)
    if os.path.lexists(journal):
        fault_point("unlink", journal)
        journal.unlink()
        fsync_dir(journal.parent)


def _write_journal(journal: Path, config: str, entries: list[_Entry], *, committed: bool = False) -> None:
    """The journal, atomically and durably (mode 0600: it holds the files' bytes): before the first replace,
    and (``committed``) after the last one when older backups are to be deleted."""
    body = {"te_align": _JOURNAL_TAG, "version": 1, "committed": committed, "config": os.path.abspath(config),
            "files": [
        {"path": os.path.abspath(e.path), "original": base64.b64encode(e.old).decode("ascii"),
         "new_sha256": e.new_sha256, "backup": os.path.abspath(e.bak) if e.backup else None,
         "older_backup": os.path.abspath(e.older_path) if e.older else None} for e in entries]}
    tmp = journal.with_name(f".{journal.name}.{os.getpid()}.tmp")
    try:
        fault_point("create", tmp)
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fault_point("write", tmp)
            fh.write(json.dumps(body, indent=1).encode("utf-8") + b"\n")
            fh.flush()
            if _atomic.FSYNC:
                os.fsync(fh.fileno())
        fault_point("rename", journal)
        os.replace(tmp, journal)
        fsync_dir(journal.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CannotFix(f"cannot write its --fix journal {journal}: {e.strerror}; nothing written",
                        file=config) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _replace(e: _Entry) -> None:
    """Replace one file atomically (permission bits kept), its backup made just before the rename."""
    p = Path(e.path)
    assert e.new is not None
    if e.older:
        fault_point("link", e.older_path)
        link_or_copy(e.bak, e.older_path)

    def unchanged_then_backup() -> None:
        if p.read_bytes() != e.old:
            raise CannotFix(_CHANGED, file=e.path)
        if e.backup:
            fault_point("link", e.bak)
            link_or_copy(p, e.bak)

    with atomic_file(p, "wb", error=CannotFix, mode_from=p, before_replace=unchanged_then_backup) as fh:
        fh.write(e.new)


def _fail(exc: BaseException, attempted: list[_Entry], journal: Path, config: str, current: _Entry) -> NoReturn:
    """Roll back a write that failed half-way (or was interrupted), then raise the one line (or re-raise a
    ``KeyboardInterrupt``/``SystemExit``). A rollback that cannot write keeps the journal for the next
    ``--fix``."""
    try:
        _undo(attempted, journal, strict=False)
    except Exception as again:
        if not isinstance(exc, Exception):
            raise exc from None
        first = exc.file if isinstance(exc, TeAlignError) and exc.file else current.path
        why = _why(exc).replace("; nothing written", "")
        raise CannotFix(f"{why}; rolling back failed too ({_why(again, named=True)}): its journal {journal} is "
                        "kept: run --fix again to roll it back", file=first) from None
    if not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, TeAlignError) and "nothing written" in exc.message:
        raise exc
    if isinstance(exc, TeAlignError):
        raise CannotFix(f"{exc.message}; nothing written", file=exc.file or current.path, key=exc.key) from None
    raise CannotFix(f"{_why(exc)}; nothing written", file=current.path) from None


def _why(e: BaseException, *, named: bool = False) -> str:
    if isinstance(e, TeAlignError):
        return str(e) if named else e.message
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: cannot write: {e.strerror}" if named and e.filename else f"cannot write: {e.strerror}"
    return str(e) or type(e).__name__


def _undo(entries: list[_Entry], journal: Path, *, strict: bool) -> list[str]:
    """Give every file holding its fixed bytes its original ones back (atomically, permission bits kept), put
    the backups back as they were, remove te-align's temp files and the journal. ``strict`` (a journal left
    by a killed run): a file holding other bytes than its original or fixed ones stops it before anything is
    touched. The files restored."""
    todo: list[_Entry] = []
    for e in entries:
        try:
            now: bytes | None = Path(e.path).read_bytes()
        except FileNotFoundError:
            now = None
        if now == e.old:
            continue
        if now is not None and _sha256(now) == e.new_sha256:
            todo.append(e)
        elif strict:
            raise CannotFix(f"holds neither its bytes from before the interrupted --fix nor the fixed ones; "
                            f"nothing rolled back: its original is in {journal} (base64), restore it or keep "
                            "the file as it is, then delete the journal", file=e.path)
    for e in todo:
        p = Path(e.path)
        if _backup_is_original(e):  # the original file itself (a hard link made just before the rename):
            fault_point("rename", p)  # a rename, so a full disk does not stop it
            os.replace(e.bak, p)
            continue
        with atomic_file(p, "wb", error=CannotFix, mode_from=p) as fh:
            fh.write(e.old)
    for e in entries:
        if not e.backup:
            continue
        if e.older:
            if not os.path.lexists(e.older_path):
                continue  # the older backup was never moved
            if os.path.lexists(e.bak) and os.path.samefile(e.older_path, e.bak):
                fault_point("unlink", e.older_path)  # rename() of two links to one file does nothing
                e.older_path.unlink()
            else:
                fault_point("rename", e.bak)
                os.replace(e.older_path, e.bak)
        elif os.path.lexists(e.bak):
            fault_point("unlink", e.bak)
            e.bak.unlink()
    for folder in {Path(e.path).parent for e in entries}:
        fsync_dir(folder)
    _sweep(entries, journal, older=False)
    fault_point("unlink", journal)
    journal.unlink(missing_ok=True)
    fsync_dir(journal.parent)
    return [e.path for e in todo]


def _backup_is_original(e: _Entry) -> bool:
    """The backup this run made holds the file's original bytes (and is not the older backup)."""
    if not e.backup or e.bak.is_symlink() or not e.bak.is_file():
        return False
    if e.older and (not os.path.lexists(e.older_path) or os.path.samefile(e.older_path, e.bak)):
        return False  # the backup there is still the older one
    try:
        return e.bak.read_bytes() == e.old
    except OSError:
        return False


#: The temp names :func:`atomic_file` (``mkstemp``: 8 characters), :func:`link_or_copy` and the journal
#: writer (the pid) give a file beside ``NAME``.
_TEMP = r"\.{name}\.(?:[a-z0-9_]{{8}}|[0-9]+)\.tmp"


def _sweep(entries: list[_Entry], journal: Path, *, older: bool) -> None:
    """Remove what a killed ``--fix`` can leave beside its files (under their locks): temp files, and with
    ``older`` (no journal: that fix was committed) an older backup not yet deleted."""
    names: dict[Path, set[str]] = {journal.parent: {journal.name}}
    for e in entries:
        p = Path(e.path)
        names.setdefault(p.parent, set()).update({p.name, e.bak.name, e.older_path.name})
    for folder, mine in names.items():
        pattern = re.compile("|".join(_TEMP.format(name=re.escape(n)) for n in sorted(mine)))
        try:
            listing = list(os.scandir(folder))
        except OSError:
            continue
        gone = False
        for d in listing:
            if d.is_file(follow_symlinks=False) and pattern.fullmatch(d.name):
                with contextlib.suppress(OSError):  # litter only: the next --fix tries again
                    fault_point("unlink", d.path)
                    Path(d.path).unlink(missing_ok=True)
                    gone = True
        if gone:
            fsync_dir(folder)
    if older:
        for e in entries:
            if e.older_path.is_file() and not e.older_path.is_symlink():
                with contextlib.suppress(OSError):
                    fault_point("unlink", e.older_path)
                    e.older_path.unlink(missing_ok=True)


def roll_back_interrupted(config: str) -> list[str] | None:
    """Roll back the ``--fix`` of ``config`` a killed process left half-written (its journal is there): under
    the lock of every folder it names, each journalled file holding its fixed bytes gets its original ones
    back, the backups are put back as they were and the journal is removed. The files restored. None when
    there is nothing to roll back: no journal (any more: another te-align finished it), or one past its
    commit point (the fix is whole: its cleanup is finished here). A file holding other bytes, or a journal
    that does not read, is refused (:class:`CannotFix`, one line) and nothing is touched."""
    journal = journal_path(config)
    for _ in range(3):
        if not os.path.lexists(journal):
            return None
        folders = {Path(e.path).parent for e in _read_journal(journal, config)[0]} | {journal.parent}
        with _locked(folders):
            if not os.path.lexists(journal):
                return None
            entries, committed = _read_journal(journal, config)
            if {Path(e.path).parent for e in entries} | {journal.parent} != folders:
                continue
            if committed:
                _sweep(entries, journal, older=False)
                _finish(entries, journal)
                return None
            return _undo(entries, journal, strict=True)
    raise CannotFix(f"its --fix journal {journal} keeps changing; nothing rolled back: run --fix again",
                    file=config)


def _read_journal(journal: Path, config: str) -> tuple[list[_Entry], bool]:
    """The entries of a journal, every field checked (the backup names must be the ones --fix gives)."""
    def bad(why: str) -> CannotFix:
        return CannotFix(f"its --fix journal {journal} is unreadable ({why}); nothing rolled back: check the "
                         "files it names (their originals are in it, base64), then delete it", file=config)

    if journal.is_symlink() or not journal.is_file():
        raise bad("not a regular file")
    try:
        data = json.loads(journal.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise bad(getattr(e, "strerror", None) or type(e).__name__) from None
    if not isinstance(data, dict) or data.get("te_align") != _JOURNAL_TAG or data.get("version") != 1:
        raise bad("not a te-align --fix journal of this version")
    committed = data.get("committed")
    if not isinstance(committed, bool):
        raise bad("committed: not true or false")
    files = data.get("files")
    if not isinstance(files, list) or not files:
        raise bad("no files")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("path"), str) or not os.path.isabs(f["path"]):
            raise bad("a file without an absolute path")
        path = f["path"]
        sha = f.get("new_sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise bad(f"{path}: no new_sha256")
        try:
            old = base64.b64decode(f.get("original"), validate=True)  # type: ignore[arg-type]
        except (TypeError, ValueError, binascii.Error):
            raise bad(f"{path}: no original") from None
        entry = _Entry(path, old, sha, f.get("backup") is not None, f.get("older_backup") is not None)
        if (entry.backup and f["backup"] != str(entry.bak)) or (
                entry.older and (not entry.backup or f["older_backup"] != str(entry.older_path))):
            raise bad(f"{path}: a backup name --fix does not give")
        out.append(entry)
    return out, committed
