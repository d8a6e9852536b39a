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
3. under the lock of every folder it writes in (:func:`te_align.patching.journal.lock_all`, taken in the
   order of their real paths), compare every file's bytes with the ones the fix was made from (one changed
   meanwhile: nothing written), then run one transaction of :mod:`te_align.patching.journal`, the one
   ``te-align patch`` runs: its journal names every file the fix replaces, each backup included, then per file
   a backup is linked beside it (``NAME.te-align-original``, the name ``te-align unpatch --keep-changed`` uses;
   ``--no-backup`` skips it) just before the file is replaced atomically (``.NAME.te-align-tmp``, then a rename;
   its permission bits kept): the config first, then the files it names (a dataset TOML the training config
   names). The commit point: the journal removed.

The fix may write two files (a training TOML and the dataset TOML it names); they change together or not at
all. The transaction lives in ``.NAME.te-align-fix/`` beside the config (:func:`journal_path`): ``journal.json``
in ``patch``'s format with absolute paths (each file's sha256 and mode before, its bytes copied into
``journal-data/`` by number, mode 0600; the sha256 of the bytes the fix writes), removed with the folder after
the commit point. A backup already beside a file (from an earlier fix) is one more file the transaction replaces:
a rollback gives it back its bytes and mode.

A write that fails half-way (the file changed under the lock, permission, full disk, Ctrl-C) is rolled back
in-process by the transaction's rollback: every file gets its bytes and mode from before (the journal's copy
renamed into place, so a full disk does not stop it), a backup this run made is removed, a file someone else
wrote meanwhile is left as it is, the folder is removed, and one line says nothing was written; a rollback that
cannot write either keeps the journal and says so. A killed process leaves the journal: the next ``--fix`` on that
config rolls it back under the same locks (each journalled file must hold its bytes from before or the ones the
fix wrote; a file with other bytes is refused in one line naming it, and nothing is touched), says so in one line
(exit 2) and stops: run ``--fix`` again to fix. What a fix killed before its journal was written or after its
commit point leaves (the folder, copies, temp files) is removed by the next ``--fix``, which then goes on.
``--diff`` refuses while a journal is there (it writes nothing, not even a rollback). The journal file of te-align
before this (``.NAME.te-align-fix-journal``, originals in base64) is refused in one line saying what to do.

Running it again changes nothing: the fixed findings are gone. No torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

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
from te_align.patching import journal as engine
from te_align.patching.journal import JOURNAL_DATA, KEPT_ORIGINAL_SUFFIX, PatchError, Place, lock_all

if TYPE_CHECKING:  # pragma: no cover
    from te_align.trainers.api import CheckLanguages, CheckParts

#: The backup beside a fixed file: ``NAME`` + this suffix (the name ``te-align unpatch --keep-changed`` uses).
BACKUP_SUFFIX = KEPT_ORIGINAL_SUFFIX
#: The folder of a ``--fix`` being written (its journal and copies): ``.NAME`` + this suffix beside the config.
STATE_SUFFIX = ".te-align-fix"
#: The journal file ``.NAME`` + this suffix of te-align before ``--fix`` shared ``patch``'s transaction: refused
#: in one line (:func:`_legacy_line`).
LEGACY_JOURNAL_SUFFIX = ".te-align-fix-journal"
#: Where te-align before the shared transaction kept an older backup while it wrote a fix (named in
#: :func:`_legacy_line`).
OLDER_BACKUP_SUFFIX = ".te-align-fix-older"
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
    legacy = _legacy_journal(path)
    if os.path.lexists(legacy):
        return _refuse(FixReport(path, CheckResult(file=path, status="unreadable")), _legacy_line(path, legacy))
    if os.path.lexists(journal) and not write:
        return _refuse(FixReport(path, CheckResult(file=path, status="unreadable")),
                       f"{path}: an interrupted --fix left its journal {journal}: run --fix to roll it back first "
                       "(--diff writes nothing)")
    place = _txn_place(path)
    if write and (os.path.lexists(place.state) or os.path.lexists(place.removing)):
        unread = FixReport(path, CheckResult(file=path, status="unreadable"))
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
        if not os.access(place.state.parent, os.W_OK):
            raise CannotFix(f"its folder {place.state.parent} is not writable (--fix keeps its journal there); "
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
    """Where ``--fix`` keeps its journal while it writes the fix of ``config``: ``journal.json`` in the folder
    ``.NAME.te-align-fix`` beside it (:func:`_place`)."""
    return _txn_place(config).journal


def _txn_place(config: str | os.PathLike[str]) -> Place:
    """The transaction of a fix of ``config``: journal and copies in ``.NAME.te-align-fix/`` beside it, every
    path in it absolute (the files may sit in two folders)."""
    p = Path(os.path.abspath(config))
    state = p.with_name(f".{p.name}{STATE_SUFFIX}")
    return Place(state, state.with_name(state.name + ".removing"), None,
                 f"check the files it names (each one's bytes from before the fix are in {state / JOURNAL_DATA}, "
                 f"named by its 'copy'), then delete {state}")


def _legacy_journal(config: str | os.PathLike[str]) -> Path:
    p = Path(config)
    return p.with_name(f".{p.name}{LEGACY_JOURNAL_SUFFIX}")


def _legacy_line(config: str, legacy: Path) -> str:
    """The one line for the journal an interrupted ``--fix`` of te-align before the shared transaction left."""
    return (f"{config}: an interrupted --fix of an older te-align left its journal {legacy}, which this te-align "
            f"does not roll back: run --fix with the te-align that wrote it to roll it back; or by hand: each file "
            f"it names ('path') holds its bytes from before that --fix (its 'original', base64) or the fixed ones, "
            f"and an older backup may wait at .NAME{BACKUP_SUFFIX}{OLDER_BACKUP_SUFFIX} beside it: restore what "
            "you keep, delete the journal, then run --fix again")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_all(config: str, files: list[tuple[str, bytes, bytes]], backup: bool) -> list[str]:
    """Replace every file by its new bytes, all or none: under the lock of every folder, if each still holds
    the bytes the fix was made from; one transaction of :mod:`te_align.patching.journal` journalled
    beside ``config`` (see the module docstring). The backups made."""
    place = _txn_place(config)
    todo = [(os.path.abspath(f), old, new) for f, old, new in files]
    baks = {f: f + BACKUP_SUFFIX for f, _, _ in todo}
    with lock_all([Path(f).parent for f, _, _ in todo] + [place.state.parent]):
        if any(os.path.lexists(q) for q in (place.state, place.removing, _legacy_journal(config))):
            # a --fix killed since this one looked
            raise CannotFix(f"an interrupted --fix left its journal {place.journal} meanwhile: run --fix again to "
                            "roll it back; nothing written", file=config)
        for (f, old, _), (name, _, _) in zip(todo, files, strict=True):
            try:
                now = Path(f).read_bytes()
            except OSError as e:
                raise CannotFix(f"cannot read: {e.strerror}; nothing written", file=name) from None
            if now != old:
                raise CannotFix(_CHANGED, file=name)
        paths: list[str] = []
        new_sha: dict[str, str] = {}
        for f, old, new in todo:
            paths.append(f)
            new_sha[f] = _sha256(new)
            if backup:  # an older backup there is a file this fix replaces: journalled like the others
                paths.append(baks[f])
                new_sha[baks[f]] = _sha256(old)
        current = files[0][0]
        try:
            engine._begin_in(place, "check --fix", paths, new_sha)
            for (f, old, new), (current, _, _) in zip(todo, files, strict=True):
                _replace(Path(f), old, new, Path(baks[f]) if backup else None, current)
            engine._unlink(place.journal)  # the commit point
        except BaseException as exc:
            _fail(exc, place, current)
        with contextlib.suppress(OSError):  # leftovers only: the next --fix removes them
            engine._drop_in(place)
    return [files[i][0] + BACKUP_SUFFIX for i in range(len(files))] if backup else []


def _replace(p: Path, old: bytes, new: bytes, bak: Path | None, name: str) -> None:
    """Replace one file atomically (permission bits kept); just before the rename, check it still holds its
    bytes from before and link its backup."""
    def unchanged_then_backup() -> None:
        if p.read_bytes() != old:
            raise CannotFix(_CHANGED, file=name)
        if bak is not None:
            engine._link(p, bak)

    engine._write(p, new, p.stat().st_mode & 0o7777, before_rename=unchanged_then_backup)


def _fail(exc: BaseException, place: Place, current: str) -> NoReturn:
    """Roll back a write that failed half-way (or was interrupted), then raise the one line (or re-raise a
    ``KeyboardInterrupt``/``SystemExit``). A rollback that cannot write keeps the journal for the next
    ``--fix``."""
    try:
        _recover(place, strict=False)
    except Exception as again:
        if not isinstance(exc, Exception):
            raise exc from None
        first = exc.file if isinstance(exc, TeAlignError) and exc.file else current
        why = _why(exc).replace("; nothing written", "")
        if os.path.lexists(place.journal):
            raise CannotFix(f"{why}; rolling back failed too ({_why(again, named=True)}): its journal "
                            f"{place.journal} is kept: run --fix again to roll it back", file=first) from None
        raise CannotFix(f"{why}; nothing written (te-align's leftovers in {place.state} could not be removed: "
                        f"{_why(again, named=True)}; the next --fix removes them)", file=first) from None
    if not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, TeAlignError) and "nothing written" in exc.message:
        raise exc
    if isinstance(exc, TeAlignError):
        raise CannotFix(f"{exc.message}; nothing written", file=exc.file or current, key=exc.key) from None
    raise CannotFix(f"{_why(exc)}; nothing written", file=current) from None


def _why(e: BaseException, *, named: bool = False) -> str:
    if isinstance(e, TeAlignError):
        return str(e) if named else e.message
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: cannot write: {e.strerror}" if named and e.filename else f"cannot write: {e.strerror}"
    return str(e) or type(e).__name__


def _recover(place: Place, *, strict: bool) -> list[str] | None:
    """The shared recovery (caller holds the locks): roll an interrupted fix back (the paths it gave their
    bytes back), or remove the leftovers of one killed before its journal was written or after its commit
    point (None)."""
    if os.path.lexists(place.removing):
        engine._rmtree(place.removing)
    if not os.path.lexists(place.state):
        return None
    if place.state.is_symlink() or not place.state.is_dir():
        raise CannotFix(f"{place.state} is not a folder (a symbolic link or a file); --fix keeps its journal only "
                        "in a real folder there: remove it, then run again")
    journal = engine._read_journal_in(place)
    if journal is None:
        engine._cleanup_in(place)
        engine._drop_in(place)
        return None
    return engine._rollback_in(place, journal, strict=strict)


def roll_back_interrupted(config: str) -> list[str] | None:
    """Roll back the ``--fix`` of ``config`` a killed process left half-written (its journal is there): under
    the lock of every folder it names, each journalled file gets its bytes and mode from before back (the
    backups too: one this fix made is removed, an older one put back) and the journal is removed. The files
    restored (backups not named). None when there is nothing to roll back: no journal (any more: another
    te-align finished it; the leftovers of a fix killed before its journal or after its commit point are
    removed here). A file holding other bytes than its original or fixed ones, or a journal that does not
    read, is refused (:class:`CannotFix`, one line) and nothing is touched."""
    place = _txn_place(config)
    for _ in range(3):
        if not os.path.lexists(place.state) and not os.path.lexists(place.removing):
            return None
        folders = _folders(place)
        with lock_all(folders):
            if _folders(place) != folders:
                continue
            try:
                rolled = _recover(place, strict=True)
            except PatchError as e:
                raise CannotFix(e.message, file=e.file or config) from None
            if rolled is None:
                return None
            return [p for p in rolled if not p.endswith(BACKUP_SUFFIX)]
    raise CannotFix(f"its --fix journal {place.journal} keeps changing; nothing rolled back: run --fix again",
                    file=config)


def _folders(place: Place) -> set[Path]:
    """The folders a fix's transaction touches: its own, and those of the files its journal names."""
    try:
        journal = engine._read_journal_in(place) if place.state.is_dir() else None
    except PatchError as e:
        raise CannotFix(e.message, file=e.file) from None
    names = [e["path"] for e in journal["files"]] if journal else []
    return {place.state.parent, *(Path(n).parent for n in names)}
