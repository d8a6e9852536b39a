"""``te-align check --fix``: write the profile's values into the user's config, in the trainer's own terms.

For every error or warning finding whose fix is a key or flag the trainer reads (:attr:`Finding.edit`), the
trainer's writer (:class:`te_align.trainers.api.ConfigWriter`) says where it goes and
:mod:`te_align.audit.editing` edits the text, keeping every other byte. The fix is a transaction, as
``te-align patch`` makes them:

1. refuse, with one line and the file untouched: a symbolic link (``--fix`` writes regular files only: it
   names the file the link points to), a profile only assumed (``--profile`` settles it), a key the writer has
   no place for or that is given on the command line after ``--``, a file without write permission (its mode
   bits, so also for root) or in a folder that cannot be written;
2. check the new text (in memory, :func:`te_align.audit.readers.overlaid`) before anything is written: if a
   finding the fix was meant to remove is still there, nothing is written;
3. under the folder's lock (:func:`te_align.patching.transaction.lock`), compare the file's bytes with the
   ones the fix was made from (a file changed meanwhile is refused), keep a backup beside it
   (``NAME.te-align-original``, the name ``te-align unpatch --keep-changed`` uses; ``--no-backup`` skips it)
   and replace it atomically (:func:`te_align._atomic.atomic_file`, its permission bits kept).

Running it again changes nothing: the fixed findings are gone. No torch.
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from te_align import _plugins
from te_align._atomic import atomic_file, link_or_copy
from te_align.audit import editing, readers
from te_align.audit.check import check_file
from te_align.audit.editing import CannotFix, Change
from te_align.audit.findings import EXIT_UNREADABLE, CheckResult, Edit, Finding
from te_align.errors import TeAlignError
from te_align.patching.transaction import KEPT_ORIGINAL_SUFFIX, lock

#: The backup beside a fixed file: ``NAME`` + this suffix (the name ``te-align unpatch --keep-changed`` uses).
BACKUP_SUFFIX = KEPT_ORIGINAL_SUFFIX
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

    @property
    def exit_code(self) -> int:
        return EXIT_UNREADABLE if self.refused else self.result.exit_code

    @property
    def left(self) -> list[Finding]:
        """Error and warning findings still there, each with why ``--fix`` left it (:func:`why_left`)."""
        return [f for f in self.result.findings if f.severity in FIXED_SEVERITIES
                and f.kind not in ("syntax", "wrong-value")]


def needs_patch(f: Finding) -> bool:
    """A finding no key or flag of the trainer fixes (its fix is ``te-align patch``, the hooks, or none): a
    deviation without an edit, or a key users set in vain whose fix says so (a key the trainer reads but
    ignores for this model)."""
    return f.edit is None and (f.kind == "deviation" or "te-align patch" in f.fix)


def why_left(f: Finding) -> str:
    """Why ``--fix`` did not write a finding's fix: no key sets it (``te-align patch`` / the hooks), or its
    fix is a choice left to the user (a misspelled key, caption dropout, a cache to rebuild)."""
    if needs_patch(f):
        return f"no key sets it: {f.fix}"
    return f"left to you: {f.fix}" if f.fix else "left to you"


def _targets(result: CheckResult) -> list[Finding]:
    return [f for f in result.findings if f.edit is not None and f.severity in FIXED_SEVERITIES]


def _refuse(report: FixReport, message: str) -> FixReport:
    report.refused = message
    report.changes = []
    return report


def _edits(edit: Edit) -> list[Edit]:
    return [edit, *(Edit(k, v) for k, v in edit.also)]


def fix_file(
    path: str,
    *,
    trainer: str = "auto",
    profile: str | None = None,
    extra_args: Sequence[str] = (),
    cache_dir: str | None = None,
    dataset: Sequence[str] = (),
    overrides: Mapping[str, object] | None = None,
    write: bool = True,
    backup: bool = True,
    before_write: Callable[[], object] | None = None,
) -> FixReport:
    """Fix one config (``write=False``: only make the diff). ``before_write`` runs after the fix is made and
    checked, just before the files are locked, compared and replaced (tests change the file there)."""
    opts: dict[str, object] = {"trainer": trainer, "profile": profile, "extra_args": list(extra_args),
                               "cache_dir": cache_dir, "dataset": list(dataset),
                               "overrides": dict(overrides or {})}
    p = Path(path)
    if p.is_symlink():
        result = CheckResult(file=path, status="unreadable")
        return _refuse(FixReport(path, result), f"{path}: a symbolic link (to {os.path.realpath(p)}); --fix "
                                                "writes regular files only: run it on the file the link "
                                                "points to")
    try:
        original = {str(p): p.read_bytes()} if p.is_file() else {}
    except OSError as e:
        return _refuse(FixReport(path, CheckResult(file=path, status="unreadable")),
                       f"{path}: cannot read: {e.strerror}")
    result = check_file(path, **opts)  # type: ignore[arg-type]
    report = FixReport(path, result)
    if result.exit_code == EXIT_UNREADABLE:
        bad = next((f for f in result.findings if f.kind in ("syntax", "wrong-value")), None)
        return _refuse(report, bad.message if bad else f"{path}: unreadable")
    targets = _targets(result)
    if not targets:
        return report
    if result.assumed and profile is None:
        return _refuse(report, f"{path}: the model is assumed ({result.profile}: {result.assumed}); --fix "
                               "writes only against a profile the config settles: pass --profile NAME")
    try:
        changes = _place(path, result, targets, list(extra_args))
        texts = _edit_texts(changes, original)
    except CannotFix as e:
        return _refuse(report, str(e))
    except (TeAlignError, OSError) as e:
        return _refuse(report, f"{path}: {e}")
    new_texts = {f: t for f, (old, t) in texts.items() if t != old}
    with readers.overlaid({f: t.replace("\r\n", "\n") for f, t in new_texts.items()}):
        after = check_file(path, **opts)  # type: ignore[arg-type]
    meant = {(f.kind, f.setting) for f in targets}
    still = [f for f in after.findings if (f.kind, f.setting) in meant and f.severity in FIXED_SEVERITIES]
    if still:
        f = still[0]
        return _refuse(report, f"{path}: after the fix {f.setting} would still be {_plain(f.effective)} "
                               f"({f.message}); nothing written")
    if after.exit_code == EXIT_UNREADABLE:
        return _refuse(report, f"{path}: the fixed config would not read back; nothing written (please "
                               "report it)")
    report.changes = changes
    report.fixed = targets
    report.diff = "".join(_diff(f, old, t) for f, (old, t) in texts.items() if t != old)
    if not write or not new_texts:
        return report
    try:
        for f in new_texts:
            _writable(f)
        if before_write is not None:
            before_write()
        for f, t in new_texts.items():
            report.backups += _write(f, original[f], t.encode("utf-8"), backup)
    except CannotFix as e:
        return _refuse(FixReport(path, result), str(e))
    except TeAlignError as e:
        return _refuse(FixReport(path, result), f"{path}: {e}; nothing written")
    report.result = after
    report.written = True
    report.after = [f.fix for f in result.findings if f.kind == "stale-cache" and f.fix]
    return report


def _plain(v: object) -> str:
    return "unset" if v is None else repr(v)


def _place(path: str, result: CheckResult, targets: list[Finding], extra_args: list[str]) -> list[Change]:
    """The changes of every target finding, from the dialect's writer; one per place (agreeing fixes
    merged)."""
    name = result.trainer or ""
    _, spec = _plugins.registry().dialect(name)
    writer = spec.writer(name)
    if writer is None:
        raise CannotFix(f"te-align has no writer for {name} configs; fix by hand", file=path)
    raw = readers.load(path)
    out: dict[tuple[str, editing.Path_], Change] = {}
    for f in targets:
        assert f.edit is not None
        for e in _edits(f.edit):
            for c in writer.place(raw, e, extra_args):
                key = (str(Path(c.file).resolve()), c.path)
                if key in out and (out[key].value, out[key].remove) != (c.value, c.remove):
                    raise CannotFix(f"two fixes disagree on {c.key} ({out[key].describe()} / "
                                    f"{c.describe()}); fix by hand", file=c.file)
                out[key] = c
    return list(out.values())


def _edit_texts(changes: list[Change], original: dict[str, bytes]) -> dict[str, tuple[str, str]]:
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
        new = editing.apply(text, cs[0].fmt, cs, f) if cs else text
        if new != text:
            editing.verify(text, new, cs[0].fmt, cs, f)
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


def _write(file: str, old: bytes, new: bytes, backup: bool) -> list[str]:
    """Replace ``file`` by ``new`` under its folder's lock, if it still holds ``old``; the backup beside
    it."""
    p = Path(file)
    bak = p.with_name(p.name + BACKUP_SUFFIX)

    def unchanged_then_backup() -> None:
        if p.read_bytes() != old:
            raise CannotFix("changed while it was being fixed; nothing written: run --fix again", file=file)
        if backup:
            link_or_copy(p, bak)

    with lock(p.parent):
        if p.read_bytes() != old:
            raise CannotFix("changed while it was being fixed; nothing written: run --fix again", file=file)
        with atomic_file(p, "wb", error=CannotFix, mode_from=p, before_replace=unchanged_then_backup) as fh:
            fh.write(new)
    return [str(bak)] if backup else []
