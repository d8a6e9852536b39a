"""Fault campaign for te-align's on-disk patching: ``patch``, ``unpatch`` and ``status``.

What it does, on each trainer layout (fake trees in the shape of kohya sd-scripts, the kohya_ss GUI and
ai-toolkit; and copies of real checkouts given with ``--kohya DIR`` / ``--ai-toolkit DIR``):

* kill sweep: for each command (patch, re-patch with another profile, unpatch, and on kohya re-plan
  after an edited original) it counts the file operations (``TE_ALIGN_FAULT_LOG``), then for every
  N kills the command at its N-th operation (``TE_ALIGN_FAULT_AT=N``: SIGKILL) and recovers with
  ``te-align status`` (the tree must be byte-identical — every file's bytes and mode, every folder —
  to the tree before the command, or to the tree the command makes when the kill came after its
  commit point), separately by running the same command again (it must finish the job), and after
  a killed patch by ``te-align unpatch`` (it must give back the unpatched tree);
* double faults: the recovering ``status`` is killed at each of its own operations, then recovery
  runs again;
* full disk and read-only file system: ``TE_ALIGN_FAULT_MODE=enospc`` / ``erofs`` at every N (the
  error persists from N on); the command must exit 2 with one line naming the path, and the tree
  must come back byte-identical (in-process, or by a later ``status``);
* crafted and damaged state files, two commands at once (real processes), ``unpatch
  --keep-changed`` after an edited drop-in, a deleted state folder, missing paths;
* with ``--fake``, ``te-align check CONFIG --fix`` (:func:`fix_sweep`), which runs the same transaction: kill,
  double-fault, full-disk and read-only sweeps of a fix of a shipped example with an earlier fix's backup beside
  it (``--commands check-fix`` for it alone).

Every command runs in a forked child of this process (``te_align.cli.main``), so a kill is a real
SIGKILL of a real process. Counts: cases, tracebacks, data-loss cases (an original file's bytes
gone from the tree), byte-identical recoveries (to the tree before / after the command).

    python tools/fault_campaign.py --fake                      # fake trees only (about a minute)
    python tools/fault_campaign.py --kohya PATH --ai-toolkit PATH --work DIR --json out.json

The trees are copied into ``--work`` (a new temporary folder by default); the originals are never
touched. ``.git`` folders are not compared (``git status`` may refresh git's index).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from te_align import _atomic  # noqa: E402
from te_align.cli import main as cli_main  # noqa: E402

STATE = ".te-align"

# ------------------------------------------------------------------------------------- trees
def fake_kohya(root: Path, scripts: Iterable[str] = ("train_network.py", "sdxl_train_network.py", "flux_train_network.py")) -> Path:
    """An sd-scripts tree that passes te-align's static check: every hook target with its parameters."""
    from te_align.trainers.kohya.hooks import all_targets

    modules: dict[str, dict[str, list[str]]] = {}
    for t in all_targets():
        owner, _, name = t.qualname.rpartition(".")
        modules.setdefault(t.module, {}).setdefault(owner, []).append(f"def {name}({', '.join(t.params or ())}):\n    return None\n")
    for module, owners in modules.items():
        f = root.joinpath(*module.split(".")).with_suffix(".py")
        f.parent.mkdir(parents=True, exist_ok=True)
        src = ["import os\n"]
        for owner, funcs in owners.items():
            if owner:
                src.append(f"class {owner}:\n" + "".join("    " + line + "\n" for fn in funcs for line in fn.splitlines()))
            else:
                src.extend(funcs)
        f.write_text("\n".join(src))
    for pkg in ("library", "networks"):
        (root / pkg / "__init__.py").write_text("")
    (root / "library" / "strategy_base.py").write_text("class TokenizeStrategy:\n    pass\n")
    for i, s in enumerate(scripts):
        (root / s).write_bytes(f"# sd-scripts {s}\r\nimport sys\nprint('{s}', sys.argv[1:])\n".encode())
        if i == 1:
            os.chmod(root / s, 0o755)
    return root


def fake_kohya_gui(base: Path) -> Path:
    """The kohya_ss GUI: te-align patches its sd-scripts submodule (the command is given the GUI folder)."""
    (base / "kohya_gui").mkdir(parents=True)
    (base / "kohya_gui.py").write_text("print('gui')\n")
    fake_kohya(base / "sd-scripts", ("train_network.py", "sdxl_train.py"))
    return base


def fake_ai_toolkit(root: Path) -> Path:
    for d in ("toolkit", "extensions_built_in", "extensions/example"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "run.py").write_bytes(b"import os\r\nimport sys\nprint('ai-toolkit run', sys.argv[1:])\n")
    os.chmod(root / "run.py", 0o755)
    (root / "toolkit" / "train_tools.py").write_text("X = 1\n")
    (root / "toolkit" / "job.py").write_text("Y = 1\n")
    (root / "extensions" / "example" / "__init__.py").write_text("AI_TOOLKIT_EXTENSIONS = []\n")
    (root / "version.py").write_text('VERSION = "0.12.26"\n')
    return root


# ------------------------------------------------------------------------------------- snapshots
Snap = dict[str, tuple]
#: sha256 of files already read, keyed by their stat (device, inode, size, mtime, ctime): any write changes ctime
_HASHES: dict[str, tuple[tuple, tuple[str, str]]] = {}


def snapshot(root: Path) -> Snap:
    """Every folder (mode), file (mode, sha256) and symbolic link (target) under ``root``, without ``.git``.

    A te-align manifest also gets a digest without its ``patched_at`` time, for comparing with a
    reference run made seconds earlier."""
    out: Snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in [*dirnames, *filenames]:
            p = here / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode & 0o7777)
            else:
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                cached = _HASHES.get(str(p))
                if cached is not None and cached[0] == key:
                    out[rel] = ("file", st.st_mode & 0o7777, *cached[1])
                    continue
                data = p.read_bytes()
                norm = ""
                if name == "manifest.json" and STATE in p.relative_to(root).parts:
                    try:
                        m = json.loads(data)
                    except (ValueError, RecursionError):
                        m = None
                    if isinstance(m, dict):
                        m.pop("patched_at", None)
                        norm = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
                digest = hashlib.sha256(data).hexdigest()
                _HASHES[str(p)] = (key, (digest, norm))
                out[rel] = ("file", st.st_mode & 0o7777, digest, norm)
    return out


def _loose(v: tuple) -> tuple:
    return ("file", v[1], v[3]) if v[0] == "file" and v[3] else v


def same(a: Snap, b: Snap, *, loose: bool = False) -> bool:
    if not loose:
        return a == b
    return a.keys() == b.keys() and all(_loose(a[k]) == _loose(b[k]) for k in a)


def differences(a: Snap, b: Snap, limit: int = 4) -> str:
    out = [f"+{k}" for k in sorted(b.keys() - a.keys())] + [f"-{k}" for k in sorted(a.keys() - b.keys())]
    out += [f"~{k}" for k in sorted(a.keys() & b.keys()) if _loose(a[k]) != _loose(b[k])]
    return ", ".join(out[:limit]) + (f" (+{len(out) - limit} more)" if len(out) > limit else "")


def reset(work: Path, template: Path, want: Snap) -> None:
    """Make ``work`` equal to ``template`` (whose snapshot is ``want``), touching only what differs."""
    have = snapshot(work)
    for rel in sorted(have.keys() - want.keys(), key=lambda r: -r.count("/")):
        p = work / rel
        if have[rel][0] == "dir":
            shutil.rmtree(p)
        elif os.path.lexists(p):
            p.unlink()
    for rel in sorted(want, key=lambda r: r.count("/")):
        src, dst, kind = template / rel, work / rel, want[rel][0]
        if have.get(rel) == want[rel]:
            continue
        if os.path.lexists(dst) and (kind != "dir" or not dst.is_dir() or dst.is_symlink()):
            shutil.rmtree(dst) if dst.is_dir() and not dst.is_symlink() else dst.unlink()
        if kind == "dir":
            dst.mkdir(exist_ok=True)
            os.chmod(dst, want[rel][1])
        elif kind == "link":
            os.symlink(want[rel][1], dst)
        else:
            shutil.copyfile(src, dst)
            os.chmod(dst, want[rel][1])
    assert snapshot(work) == want, differences(want, snapshot(work))


def contents(root: Path) -> set[str]:
    """sha256 of every file under root (where an original's bytes may still be found)."""
    return {v[2] for v in snapshot(root).values() if v[0] == "file"}


# ------------------------------------------------------------------------------------- running
@dataclass
class Run:
    rc: int | None
    killed: bool
    output: str

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.output

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith("te-align: error:")]


def run_cli(argv: list[str], *, fault_at: int | None = None, mode: str = "kill", log: Path | None = None) -> Run:
    """``te-align ARGV`` in a forked child (a real process: a kill is a real SIGKILL)."""
    out = tempfile.NamedTemporaryFile(prefix="te-align-campaign.", suffix=".out", delete=False)
    out.close()
    pid = os.fork()
    if pid == 0:  # child
        rc = 98
        try:
            for key in ("TE_ALIGN_FAULT_AT", "TE_ALIGN_FAULT_MODE", "TE_ALIGN_FAULT_LOG"):
                os.environ.pop(key, None)
            if fault_at is not None:
                os.environ["TE_ALIGN_FAULT_AT"] = str(fault_at)
                os.environ["TE_ALIGN_FAULT_MODE"] = mode
            if log is not None:
                os.environ["TE_ALIGN_FAULT_LOG"] = str(log)
            _atomic.reset_fault_counter()
            f = open(out.name, "w", encoding="utf-8")
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            sys.stdout = sys.stderr = f
            try:
                rc = cli_main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
                rc = 99
            f.flush()
        finally:
            os._exit(rc if isinstance(rc, int) else 97)
    _, status = os.waitpid(pid, 0)
    text = Path(out.name).read_text(encoding="utf-8", errors="replace")
    os.unlink(out.name)
    if os.WIFSIGNALED(status):
        return Run(None, True, text)
    return Run(os.WEXITSTATUS(status), False, text)


def count_ops(argv: list[str]) -> tuple[int, Run]:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "ops"
        r = run_cli(argv, log=log)
        n = len(log.read_text().splitlines()) if log.exists() else 0
    return n, r


# ------------------------------------------------------------------------------------- campaign
@dataclass
class Tally:
    cases: int = 0
    tracebacks: int = 0
    data_loss: int = 0
    identical_before: int = 0
    identical_after: int = 0
    not_identical: int = 0
    failures: list[str] = field(default_factory=list)
    classes: dict[str, int] = field(default_factory=dict)

    def add(self, klass: str, problem: str | None, *, traceback: bool = False, lost: bool = False, identical: str | None = None) -> None:
        self.cases += 1
        self.classes[klass] = self.classes.get(klass, 0) + 1
        self.tracebacks += traceback
        self.data_loss += lost
        if identical == "before":
            self.identical_before += 1
        elif identical == "after":
            self.identical_after += 1
        elif identical == "neither":
            self.not_identical += 1
        if problem or traceback or lost:
            self.failures.append(f"{klass}: {problem or ''}{' [traceback]' if traceback else ''}{' [data loss]' if lost else ''}")

    def as_dict(self) -> dict:
        return {
            "cases": self.cases, "tracebacks": self.tracebacks, "data_loss": self.data_loss,
            "byte_identical_recoveries": self.identical_before + self.identical_after,
            "identical_to_before": self.identical_before, "identical_to_after": self.identical_after,
            "not_identical": self.not_identical, "failures": len(self.failures), "classes": self.classes,
        }  # fmt: skip


@dataclass
class Layout:
    """A tree (``work``) with the templates of its states: unpatched, patched, patched with a profile."""

    name: str
    work: Path  # what the commands are given
    templates: dict[str, tuple[Path, Snap]]
    originals: set[str]  # sha256 of every file of the unpatched tree
    kohya: bool

    def reset(self, state: str) -> None:
        tpl, snap = self.templates[state]
        reset(self.work, tpl, snap)


def prepare(name: str, source: Path, base: Path, *, kohya: bool, root_of: Callable[[Path], Path] = lambda p: p) -> Layout:
    """Copy ``source`` to ``base/name`` (the tree the commands see) and build the state templates."""
    work = base / name
    shutil.copytree(source, work, symlinks=True)
    templates: dict[str, tuple[Path, Snap]] = {}

    def keep(state: str) -> None:
        tpl = base / f"{name}.{state}"
        shutil.rmtree(tpl, ignore_errors=True)
        shutil.copytree(work, tpl, symlinks=True)
        templates[state] = (tpl, snapshot(tpl))

    keep("unpatched")
    warm = base / f"{name}.warm-up"  # run each command once in this process: forked children start warm
    shutil.copytree(work, warm, symlinks=True)
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        for argv in (["patch"], ["status"], ["patch", "--profile", "flux-dev"], ["unpatch"], ["status"]):
            cli_main([argv[0], str(warm), *argv[1:]])
    shutil.rmtree(warm)
    r = run_cli(["patch", str(work)])
    if r.rc != 0:
        raise SystemExit(f"{name}: te-align patch failed: {r.output}")
    keep("patched")
    r = run_cli(["patch", str(work), "--profile", "flux-dev"])
    if r.rc != 0:
        raise SystemExit(f"{name}: te-align patch --profile failed: {r.output}")
    keep("patched-flux-dev")
    root = root_of(work)
    lay = Layout(name, work, templates, contents(templates["unpatched"][0]), kohya)
    lay.reset("patched")
    if kohya:  # the user edits an original kept in te_align_originals/ (then re-plans)
        script = next(p for p in sorted((root / "te_align_originals").iterdir()) if p.suffix == ".py")
        script.write_bytes(script.read_bytes() + b"# edited by the user\n")
    else:
        orig = root / "te_align_original_run.py"
        orig.write_bytes(orig.read_bytes() + b"# edited by the user\n")
    keep("original-edited")
    lay.reset("unpatched")
    return lay


#: (name, state before, argv after the tree path) of the swept commands.
COMMANDS = (
    ("patch", "unpatched", ["patch"]),
    ("re-patch", "patched", ["patch", "--profile", "flux-dev"]),
    ("unpatch", "patched", ["unpatch"]),
    ("replan", "original-edited", ["patch", "--replan"]),
)


def _argv(lay: Layout, cmd: list[str]) -> list[str]:
    return [cmd[0], str(lay.work), *cmd[1:]]


def _judge(lay: Layout, before: Snap, after: Snap | None, *, allow_after: bool = True) -> tuple[str, str | None]:
    now = snapshot(lay.work)
    if same(now, before):
        return "before", None
    if allow_after and after is not None and same(now, after, loose=True):
        return "after", None
    return "neither", f"tree is neither the one before nor after: {differences(before, now)}"


def _lost(lay: Layout, keep: set[str] | None = None) -> bool:
    """An original's bytes are gone from the tree (``keep``: the originals the command's result still holds)."""
    return not (lay.originals if keep is None else keep) <= contents(lay.work)


def sweep(
    lay: Layout,
    tally: Tally,
    *,
    commands: Iterable[str] | None = None,
    every: int = 1,
    rerun_every: int = 1,
    double_every: int = 0,
    disk_every: int = 1,
    log: Callable[[str], None] = lambda s: None,
) -> None:
    """The kill / double-fault / full-disk / read-only sweeps over ``lay``'s commands."""
    for cname, pre, cmd in COMMANDS:
        if commands is not None and cname not in commands:
            continue
        if cname == "replan" and not lay.kohya and lay.templates.get("original-edited") is None:
            continue
        lay.reset(pre)
        before = lay.templates[pre][1]
        argv = _argv(lay, cmd)
        n_ops, ref = count_ops(argv)
        if ref.rc != 0:
            tally.add(f"{lay.name}/{cname}/reference", f"exit {ref.rc}: {ref.output[-300:]}", traceback=ref.traceback)
            continue
        after = snapshot(lay.work)
        keep = lay.originals & contents(lay.work)  # --replan drops an original the user replaced on purpose

        def _lost(lay: Layout, keep: set[str] = keep) -> bool:
            return not keep <= contents(lay.work)

        log(f"{lay.name} {cname}: {n_ops} file operations")
        for n in range(1, n_ops + 1):
            # kill at N, recover with status
            if (n - 1) % every == 0 or n == n_ops:
                lay.reset(pre)
                k = run_cli(argv, fault_at=n)
                s = run_cli(["status", str(lay.work)])
                ident, problem = _judge(lay, before, after)
                if problem is None and not k.killed:
                    problem = f"not killed at op {n} (exit {k.rc})"
                if problem is None and (s.rc not in (0, 1) or s.error_lines):
                    problem = f"status after the kill exited {s.rc}: {s.output.strip()[-200:]}"
                tally.add(f"kill+status/{cname}", problem and f"{lay.name} op {n}: {problem}", traceback=k.traceback or s.traceback,
                          lost=_lost(lay), identical=ident)  # fmt: skip
            # kill at N, the same command again finishes the job
            if rerun_every and ((n - 1) % rerun_every == 0 or n == n_ops):
                lay.reset(pre)
                run_cli(argv, fault_at=n)
                again = run_cli(argv)
                now = snapshot(lay.work)
                problem = None
                ok_rc = again.rc == 0 or (cname == "unpatch" and again.rc == 2 and "not patched" in again.output)
                if not ok_rc:
                    problem = f"{lay.name} op {n}: re-run exited {again.rc}: {again.output.strip()[-200:]}"
                elif not same(now, after, loose=True):
                    problem = f"{lay.name} op {n}: re-run did not end in the command's result: {differences(after, now)}"
                tally.add(f"kill+rerun/{cname}", problem, traceback=again.traceback, lost=_lost(lay),
                          identical="after" if problem is None else "neither")  # fmt: skip
            # kill at N, then unpatch: recovers, and gives back the unpatched tree byte for byte
            if rerun_every and cname in ("patch", "re-patch") and ((n - 1) % rerun_every == 0 or n == n_ops):
                lay.reset(pre)
                run_cli(argv, fault_at=n)
                u = run_cli(["unpatch", str(lay.work)])
                problem = None
                if not (u.rc == 0 or (u.rc == 2 and "not patched" in u.output)):
                    problem = f"{lay.name} op {n}: unpatch exited {u.rc}: {u.output.strip()[-200:]}"
                else:
                    ident, p2 = _judge(lay, lay.templates["unpatched"][1], None, allow_after=False)
                    problem = p2 and f"{lay.name} op {n}: {p2}"
                tally.add(f"kill+unpatch/{cname}", problem, traceback=u.traceback, lost=_lost(lay, lay.originals),
                          identical="before" if problem is None else "neither")  # fmt: skip
            # double fault: the recovering status is killed at each of its own operations
            if double_every and (n - 1) % double_every == 0:
                m = 1
                while True:
                    lay.reset(pre)
                    run_cli(argv, fault_at=n)
                    s1 = run_cli(["status", str(lay.work)], fault_at=m)
                    if not s1.killed:
                        break
                    s2 = run_cli(["status", str(lay.work)])
                    ident, problem = _judge(lay, before, after)
                    if problem is None and (s2.rc not in (0, 1) or s2.error_lines):
                        problem = f"second status exited {s2.rc}: {s2.output.strip()[-200:]}"
                    tally.add(f"double-fault/{cname}", problem and f"{lay.name} op {n}, recovery op {m}: {problem}",
                              traceback=s1.traceback or s2.traceback, lost=_lost(lay), identical=ident)  # fmt: skip
                    m += 1
            # full disk / read-only file system from op N on
            if disk_every and ((n - 1) % disk_every == 0 or n == n_ops):
                for mode, words in (("enospc", "no space left"), ("erofs", "read-only")):
                    lay.reset(pre)
                    r = run_cli(argv, fault_at=n, mode=mode)
                    problem = None
                    if r.rc == 2:
                        lines = r.error_lines
                        if len(lines) != 1 or words not in lines[0]:
                            problem = f"expected one line saying '{words}', got: {r.output.strip()[-300:]}"
                    elif r.rc != 0:
                        problem = f"exit {r.rc}: {r.output.strip()[-300:]}"
                    s = run_cli(["status", str(lay.work)])  # the disk has room again / is writable again
                    ident, p2 = _judge(lay, before, after)
                    if r.rc == 2 and ident == "after":
                        p2 = "the command failed but the tree is in its new state"
                    problem = problem or p2 or (f"status exited {s.rc}" if s.rc not in (0, 1) or s.error_lines else None)
                    tally.add(f"{mode}/{cname}", problem and f"{lay.name} op {n}: {problem}", traceback=r.traceback or s.traceback,
                              lost=_lost(lay), identical=ident)  # fmt: skip
                # killed, then the recovering status meets a read-only file system
                lay.reset(pre)
                run_cli(argv, fault_at=n)
                r = run_cli(["status", str(lay.work)], fault_at=1, mode="erofs")
                problem = None
                if r.rc not in (0, 1, 2) or (r.rc == 2 and len(r.error_lines) != 1):
                    problem = f"status on a read-only tree: exit {r.rc}: {r.output.strip()[-300:]}"
                s = run_cli(["status", str(lay.work)])
                ident, p2 = _judge(lay, before, after)
                tally.add(f"kill+read-only-status/{cname}", (problem or p2) and f"{lay.name} op {n}: {problem or p2}",
                          traceback=r.traceback or s.traceback, lost=_lost(lay), identical=ident)  # fmt: skip
    lay.reset("unpatched")


# ------------------------------------------------------------------------------------- other classes
def _one_line_refusal(r: Run, words: Iterable[str] = ()) -> str | None:
    if r.traceback:
        return None  # counted as a traceback
    if r.rc != 2 or len(r.error_lines) != 1:
        return f"expected exit 2 with one error line, got exit {r.rc}: {r.output.strip()[-300:]}"
    missing = [w for w in words if w not in r.error_lines[0]]
    return f"the line lacks {missing}: {r.error_lines[0]}" if missing else None


def _backups_to(path: str) -> Callable[[dict], None]:
    def go(data: dict) -> None:
        for e in data["files"].values():
            if e.get("backup"):
                e["backup"] = path

    return go


def crafted_state(lay: Layout, tally: Tally, root_of: Callable[[Path], Path], outside: Path) -> None:
    """Damaged and hostile state files: one line, nothing written (inside or outside the tree)."""
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "victim.py").write_text("do not touch\n")
    ext_before = snapshot(outside)

    def manifest_edit(fn: Callable[[dict], object]) -> Callable[[Path], None]:
        def go(root: Path) -> None:
            m = root / STATE / "manifest.json"
            data = json.loads(m.read_text())
            res = fn(data)
            m.write_text(json.dumps(data if res is None else res))

        return go

    def first_file(data: dict) -> str:
        return sorted(data["files"])[0]

    def backup_link(root: Path) -> None:
        shutil.rmtree(root / STATE / "backup")
        os.symlink(outside, root / STATE / "backup")

    def folder_link(root: Path) -> None:
        m = json.loads((root / STATE / "manifest.json").read_text())
        sub = next(p.split("/")[0] for p in m["files"] if "/" in p)
        shutil.rmtree(root / sub)
        os.symlink(outside, root / sub)

    def missing_backup(root: Path) -> None:
        m = json.loads((root / STATE / "manifest.json").read_text())
        b = next(e["backup"] for e in m["files"].values() if e.get("backup"))
        (root / STATE / b).unlink()

    def journal(body: object) -> Callable[[Path], None]:
        def go(root: Path) -> None:
            (root / STATE / "journal.json").write_text(body if isinstance(body, str) else json.dumps(body))

        return go

    def deep(root: Path) -> None:
        (root / STATE / "manifest.json").write_text("[" * 100000 + "]" * 100000)

    cases: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = [
        ("manifest {}", lambda r: (r / STATE / "manifest.json").write_text("{}"), ("unreadable",)),
        ("manifest []", lambda r: (r / STATE / "manifest.json").write_text("[]"), ("unreadable",)),
        ("manifest truncated", lambda r: (r / STATE / "manifest.json").write_bytes((r / STATE / "manifest.json").read_bytes()[:50]), ("unreadable",)),
        ("manifest not UTF-8", lambda r: (r / STATE / "manifest.json").write_bytes(b"\xff\xfe{\x00"), ("unreadable",)),
        ("manifest 100k deep", deep, ("unreadable",)),
        ("manifest files=[]", manifest_edit(lambda d: d.__setitem__("files", [])), ("unreadable",)),
        ("manifest entry=str", manifest_edit(lambda d: d["files"].__setitem__(first_file(d), "x")), ("unreadable",)),
        ("manifest sha=int", manifest_edit(lambda d: d["files"][first_file(d)].__setitem__("patched_sha256", 5)), ("unreadable",)),
        ("manifest mode=str", manifest_edit(lambda d: d["files"][first_file(d)].__setitem__("original_mode", "755")), ("unreadable",)),
        ("manifest version=list", manifest_edit(lambda d: d.__setitem__("te_align_version", [1])), ("unreadable",)),
        ("manifest path ../", manifest_edit(lambda d: d["files"].__setitem__("../outside/victim.py", d["files"][first_file(d)])), ("outside the tree",)),
        ("manifest absolute path", manifest_edit(lambda d: d["files"].__setitem__(str(outside / "victim.py"), d["files"][first_file(d)])), ("outside the tree",)),
        ("manifest backup ../", manifest_edit(_backups_to("../../outside/victim.py")), ("outside the tree",)),
        ("manifest created_dirs ../", manifest_edit(lambda d: d["files"][first_file(d)].__setitem__("created_dirs", [".."])), ("outside the tree",)),
        ("backup folder is a link outside", backup_link, ("symbolic link",)),
        ("patched folder is a link outside", folder_link, ("symbolic link",)),
        ("missing backup", missing_backup, ("unreadable", "missing")),
        ("journal {}", journal({}), ("unreadable",)),
        ("journal truncated", journal('{"op": "apply", "files": [{"pa'), ("unreadable",)),
        ("journal path ../", journal({"op": "apply", "state_existed": True, "dirs": [], "files": [{"path": "../outside/victim.py", "existed": False}]}),
         ("outside the tree",)),
        ("journal dirs absolute", journal({"op": "apply", "state_existed": True, "dirs": [str(outside)], "files": []}), ("outside the tree",)),
    ]  # fmt: skip
    for label, damage, words in cases:
        for command in (["status"], ["unpatch"], ["patch"]):
            lay.reset("patched")
            damage(root_of(lay.work))
            before = snapshot(lay.work)
            r = run_cli([command[0], str(lay.work), *command[1:]])
            problem = _one_line_refusal(r, words)
            if problem is None and not same(snapshot(lay.work), before):
                problem = f"the refusing command changed the tree: {differences(before, snapshot(lay.work))}"
            if snapshot(outside) != ext_before:
                problem = "a file outside the tree was changed"
                shutil.rmtree(outside)
                outside.mkdir()
                (outside / "victim.py").write_text("do not touch\n")
            tally.add("crafted-state", problem and f"{lay.name} {label} / {command[0]}: {problem}", traceback=r.traceback,
                      lost=problem == "a file outside the tree was changed")  # fmt: skip
    lay.reset("unpatched")


def user_cases(lay: Layout, tally: Tally, root_of: Callable[[Path], Path]) -> None:
    """keep-changed, a deleted state folder, an edited drop-in, missing paths."""
    root = root_of(lay.work)
    drop_in = "train_network.py" if lay.kohya else "run.py"
    # unpatch --keep-changed after the user edited te-align's drop-in: the original must survive
    lay.reset("patched")
    f = root / drop_in
    f.write_bytes(f.read_bytes() + b"# user edit\n")
    r = run_cli(["unpatch", str(lay.work), "--keep-changed"])
    problem = None if r.rc == 0 else f"exit {r.rc}: {r.output.strip()[-200:]}"
    orig = root / ("te_align_originals/train_network.py" if lay.kohya else "te_align_original_run.py")
    if problem is None and not orig.is_file():
        problem = f"{orig.name} was deleted although the kept drop-in runs it"
    if problem is None:  # the kept drop-in still runs the original
        env = {**os.environ, "PYTHONPATH": str(REPO), "TE_ALIGN": "off"}
        run = subprocess.run([sys.executable, drop_in, "x"], cwd=root, capture_output=True, text=True, env=env, timeout=120)
        # a real trainer may stop at one of its own dependencies that is not installed here: it still ran the original
        reached = orig.relative_to(root).as_posix() in run.stderr and "ModuleNotFoundError" in run.stderr
        if run.returncode != 0 and not reached:
            problem = f"the kept {drop_in} no longer runs: {run.stderr.strip()[-200:]}"
    tally.add("keep-changed", problem and f"{lay.name}: {problem}", traceback=r.traceback, lost=_lost(lay))
    # a drop-in edited by the user: patch says changed + --replan, no git checkout hint
    lay.reset("patched")
    f.write_bytes(f.read_bytes() + b"# user edit\n")
    r = run_cli(["patch", str(lay.work)])
    problem = _one_line_refusal(r, ("changed since", "--replan"))
    if problem is None and "git" in r.error_lines[0]:
        problem = f"mentions git: {r.error_lines[0]}"
    tally.add("edited-drop-in", problem and f"{lay.name}: {problem}", traceback=r.traceback, lost=_lost(lay))
    r = run_cli(["patch", str(lay.work), "--replan"])
    problem = None if r.rc == 0 else f"--replan exit {r.rc}: {r.output.strip()[-200:]}"
    u = run_cli(["unpatch", str(lay.work)])
    ident, p2 = _judge(lay, lay.templates["unpatched"][1], None, allow_after=False)
    tally.add("edited-drop-in-replan-unpatch", (problem or p2 or (None if u.rc == 0 else f"unpatch exit {u.rc}")) and f"{lay.name}: {problem or p2}",
              traceback=r.traceback or u.traceback, lost=_lost(lay), identical=ident)  # fmt: skip
    # re-plan after the user edited the original: unpatch gives the edit back
    lay.reset("original-edited")
    patched_snap = lay.templates["patched"][1]
    edited = {k: v for k, v in lay.templates["original-edited"][1].items() if v[0] == "file" and patched_snap.get(k) != v}
    r = run_cli(["patch", str(lay.work), "--replan"])
    u = run_cli(["unpatch", str(lay.work)])
    problem = None if r.rc == 0 and u.rc == 0 else f"exit {r.rc}/{u.rc}: {(r.output + u.output).strip()[-200:]}"
    if problem is None:
        now = contents(lay.work)
        if not all(v[2] in now for v in edited.values()):
            problem = "the user's edit of the original is gone after --replan and unpatch"
    unpatched = lay.templates["unpatched"][1]
    replaced = {unpatched[k.replace("te_align_originals/", "").replace("te_align_original_run.py", "run.py")][2] for k in edited}
    tally.add("replan-keeps-edit", problem and f"{lay.name}: {problem}", traceback=r.traceback or u.traceback,
              lost=_lost(lay, lay.originals - replaced))  # fmt: skip
    # the state folder deleted by hand: patch refuses, the shim is never recorded as the original
    lay.reset("patched")
    shutil.rmtree(root / STATE)
    before = snapshot(lay.work)
    r = run_cli(["patch", str(lay.work)])
    problem = _one_line_refusal(r, ("no manifest",))
    if problem is None and "git -C" in r.error_lines[0] and not (root / ".git").exists():
        problem = f"tells to git checkout a tree that is not a git repository: {r.error_lines[0]}"
    if problem is None and not same(snapshot(lay.work), before):
        problem = "the refusing patch changed the tree"
    tally.add("state-folder-deleted", problem and f"{lay.name}: {problem}", traceback=r.traceback, lost=_lost(lay))
    lay.reset("unpatched")
    for label, path in (("missing", lay.work.parent / "does-not-exist"), ("a file", root / drop_in)):
        for command in ("status", "unpatch", "patch"):
            r = run_cli([command, str(path)])
            problem = _one_line_refusal(r, ("no such folder",) if label == "missing" else ("not a folder",))
            tally.add("bad-path", problem and f"{lay.name} {command} on {label}: {problem}", traceback=r.traceback)


def concurrent(lay: Layout, tally: Tally, runs: int = 10) -> None:
    """Two real ``te-align patch`` processes at once, then unpatch: never a patched tree without state."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TE_ALIGN_LOCK_WAIT": "60"}
    for k in ("TE_ALIGN_FAULT_AT", "TE_ALIGN_FAULT_LOG"):
        env.pop(k, None)
    for i in range(runs):
        lay.reset("unpatched")
        profiles = (["--profile", "flux-dev"], []) if i % 2 else ([], [])
        procs = [subprocess.Popen([sys.executable, "-m", "te_align", "patch", str(lay.work), *p], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for p in profiles]  # fmt: skip
        outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        problem = None
        for rc, _, err in outs:
            if rc != 0 and "another te-align command" not in err:
                problem = f"patch exit {rc}: {err.strip()[-200:]}"
        st = run_cli(["status", str(lay.work)])
        if problem is None and (st.rc != 0 or "patched by te-align" not in st.output):
            problem = f"status after two patches: exit {st.rc}: {st.output.strip()[-200:]}"
        u = run_cli(["unpatch", str(lay.work)])
        ident, p2 = _judge(lay, lay.templates["unpatched"][1], None, allow_after=False)
        tally.add("two-patches-at-once", (problem or p2) and f"{lay.name} run {i}: {problem or p2}",
                  traceback=any("Traceback" in e for _, _, e in outs) or st.traceback or u.traceback, lost=_lost(lay), identical=ident)  # fmt: skip


# ------------------------------------------------------------------------------------- main
#: The config the ``check --fix`` sweep fixes (a shipped example), and the backup an earlier fix left beside it.
FIX_EXAMPLE = REPO / "examples" / "kohya" / "flux_schnell_lora.toml"
FIX_OLDER = b"# the backup an earlier fix left\n"


def fix_sweep(work: Path, tally: Tally, *, every: int = 1, double_every: int = 1, disk_every: int = 1,
              log: Callable[[str], None] = lambda s: None) -> None:
    """``te-align check CONFIG --fix``, the other command on the same transaction, swept the same way: killed at
    each file operation (the next ``--fix`` rolls back to the folder before, one line, exit 2, or finds only
    leftovers and fixes; the one after it ends in the clean result); the rollback killed at each of its own
    operations; a full disk / read-only file system from each operation on (one line, exit 2, the folder as
    before, or only leftovers the next ``--fix`` removes; or the fixed folder)."""
    tpl, root = work / "fix-kohya.before", work / "fix-kohya"
    shutil.rmtree(tpl, ignore_errors=True)
    tpl.mkdir(parents=True)
    shutil.copy2(FIX_EXAMPLE, tpl / FIX_EXAMPLE.name)
    (tpl / f"{FIX_EXAMPLE.name}.te-align-original").write_bytes(FIX_OLDER)
    before = snapshot(tpl)
    root.mkdir(exist_ok=True)
    argv = ["check", str(root / FIX_EXAMPLE.name), "--fix"]
    reset(root, tpl, before)
    n_ops, ref = count_ops(argv)
    after = snapshot(root)
    if ref.rc != 0 or same(after, before) or n_ops < 4:
        tally.add("fix/reference", f"exit {ref.rc}, {n_ops} operations: {ref.output[-300:]}", traceback=ref.traceback)
        return
    log(f"fix-kohya check --fix: {n_ops} file operations")

    def judge(klass: str, at: str, first: Run) -> None:
        """After a faulted --fix: the next one rolls back (or fixes), and the folder ends as a clean fix."""
        now = snapshot(root)
        problem = None
        if first.traceback or (first.rc == 2 and len(first.error_lines) != 1):
            problem = f"not one line: {first.output.strip()[-300:]}"
        nxt = run_cli(argv)
        if problem is None and nxt.rc == 2:
            if "an interrupted --fix was rolled back" not in nxt.output or not same(snapshot(root), before):
                problem = f"the next --fix: {nxt.output.strip()[-200:]} ({differences(before, snapshot(root))})"
            else:
                nxt = run_cli(argv)
        if problem is None and (nxt.rc != 0 or not same(snapshot(root), after)):
            problem = f"--fix after it: exit {nxt.rc}: {differences(after, snapshot(root))}"
        ident = "before" if same(now, before) else "after" if same(now, after) else "neither"
        tally.add(klass, problem and f"fix-kohya {at}: {problem}", traceback=first.traceback or nxt.traceback,
                  lost=before[FIX_EXAMPLE.name][2] not in contents(root),  # the config's original bytes
                  identical=ident if problem is None and ident != "neither" else None)

    for n in range(1, n_ops + 1):
        if (n - 1) % every == 0 or n == n_ops:
            reset(root, tpl, before)
            judge("kill+rerun/check --fix", f"op {n}", run_cli(argv, fault_at=n))
        if double_every and (n - 1) % double_every == 0:
            m = 1
            while True:
                reset(root, tpl, before)
                run_cli(argv, fault_at=n)
                r = run_cli(argv, fault_at=m)
                if not r.killed:
                    break
                judge("double-fault/check --fix", f"op {n}, recovery op {m}", Run(0, True, ""))
                m += 1
        if disk_every and ((n - 1) % disk_every == 0 or n == n_ops):
            for mode, words in (("enospc", "No space left"), ("erofs", "Read-only")):
                reset(root, tpl, before)
                r = run_cli(argv, fault_at=n, mode=mode)
                bad = r.rc == 2 and words not in (r.error_lines or [""])[0]
                judge(f"{mode}/check --fix", f"op {n}", Run(r.rc, r.killed, r.output + ("\nTraceback (most recent call last)"
                                                                                      if bad else "")))
    shutil.rmtree(root, ignore_errors=True)


def _kohya_root(p: Path) -> Path:
    return p / "sd-scripts" if (p / "kohya_gui").is_dir() else p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fake", action="store_true", help="sweep the fake trees (kohya sd-scripts, kohya_ss GUI, ai-toolkit)")
    ap.add_argument("--kohya", type=Path, help="a kohya sd-scripts checkout (copied, never changed)")
    ap.add_argument("--ai-toolkit", type=Path, help="an ostris ai-toolkit checkout (copied, never changed)")
    ap.add_argument("--work", type=Path, help="where the copies go (default: a new temporary folder)")
    ap.add_argument("--every", type=int, default=1, help="kill+status at every K-th operation (default 1: all)")
    ap.add_argument("--rerun-every", type=int, default=1)
    ap.add_argument("--double-every", type=int, default=1, help="double faults after every K-th operation (0: none)")
    ap.add_argument("--disk-every", type=int, default=1, help="full disk / read-only at every K-th operation (0: none)")
    ap.add_argument("--real-double-every", type=int, default=25, help="--double-every for real checkouts")
    ap.add_argument("--real-rerun-every", type=int, default=3)
    ap.add_argument("--real-disk-every", type=int, default=5)
    ap.add_argument("--commands", help="comma-separated subset of " + ", ".join(c for c, _, _ in COMMANDS)
                    + ", check-fix (the check --fix sweep, with --fake)")
    ap.add_argument("--layouts", help="comma-separated subset of the layout names (fake-sd-scripts, fake-kohya_ss-gui, ...)")
    ap.add_argument("--no-sweep", action="store_true", help="only the other classes (state files, users, two at once)")
    ap.add_argument("--no-extra", action="store_true", help="only the sweeps")
    ap.add_argument("--json", type=Path, help="write the counts here")
    ap.add_argument("--merge", type=Path, nargs="+", help="add up the counts of earlier --json files and print them")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.json)
    if not (args.fake or args.kohya or args.ai_toolkit):
        ap.error("give --fake and/or --kohya DIR / --ai-toolkit DIR")
    commands = args.commands.split(",") if args.commands else None
    _atomic.FSYNC = False  # processes are killed, not machines: the page cache survives
    os.environ.setdefault("TE_ALIGN_LOCK_WAIT", "30")
    os.environ.setdefault("TE_ALIGN_NO_INSTALL", "1")  # its trees have no venv: patch the files only
    work = args.work or Path(tempfile.mkdtemp(prefix="te-align-fault-campaign."))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    per: dict[str, dict] = {}
    total = Tally()

    def log(msg: str) -> None:
        print(f"[{time.time() - started:7.1f}s] {msg}", flush=True)

    jobs: list[tuple[str, Callable[[Path], Path], bool, dict[str, int]]] = []
    fake_opts = {"every": args.every, "rerun_every": args.rerun_every, "double_every": args.double_every, "disk_every": args.disk_every}
    real_opts = {"every": args.every, "rerun_every": args.real_rerun_every, "double_every": args.real_double_every,
                 "disk_every": args.real_disk_every}  # fmt: skip
    if args.fake:
        src = work / "sources"
        src.mkdir(exist_ok=True)
        jobs += [
            ("fake-sd-scripts", lambda: fake_kohya(src / "sd-scripts"), True, fake_opts),
            ("fake-kohya_ss-gui", lambda: fake_kohya_gui(src / "kohya_ss"), True, fake_opts),
            ("fake-ai-toolkit", lambda: fake_ai_toolkit(src / "ai-toolkit"), False, fake_opts),
        ]  # type: ignore[list-item]
    if args.kohya:
        jobs.append(("real-sd-scripts", lambda: args.kohya, True, real_opts))  # type: ignore[list-item]
    if args.ai_toolkit:
        jobs.append(("real-ai-toolkit", lambda: args.ai_toolkit, False, real_opts))  # type: ignore[list-item]
    if args.layouts:
        jobs = [j for j in jobs if j[0] in args.layouts.split(",")]

    class _Stop(Exception):
        pass

    def _stop(signum: int, frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, _stop)  # a time limit: write what was counted so far
    partial = False
    try:
        _run_jobs(jobs, work, args, commands, per, total, log)
        if args.fake and not args.no_sweep and (commands is None or "check-fix" in commands):
            tally = Tally()
            try:
                fix_sweep(work, tally, every=args.every, double_every=args.double_every, disk_every=args.disk_every,
                          log=log)
            finally:
                _add_up("fix-kohya", tally, per, total, log)
    except _Stop:
        partial = True
        log("stopped by SIGTERM: the counts below are partial")
    summary = {"total": total.as_dict(), "layouts": per, "seconds": round(time.time() - started, 1), "failures": total.failures[:200],
               "partial": partial}  # fmt: skip
    print(json.dumps(summary["total"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if not total.failures and not partial else 1


def _run_jobs(jobs: list, work: Path, args: argparse.Namespace, commands: list[str] | None, per: dict, total: Tally,
              log: Callable[[str], None]) -> None:  # fmt: skip
    for name, make, kohya, opts in jobs:
        source = make()
        root_of = _kohya_root if kohya else (lambda p: p)
        lay = prepare(name, Path(source), work, kohya=kohya, root_of=root_of)
        tally = Tally()
        log(f"{name}: sweeping")
        try:
            if not args.no_sweep:
                sweep(lay, tally, log=log, commands=commands, **opts)
            if not args.no_extra:
                log(f"{name}: crafted state files, user cases, two patches at once")
                crafted_state(lay, tally, root_of, work / "outside")
                user_cases(lay, tally, root_of)
                concurrent(lay, tally, runs=10)
        finally:  # also when stopped: count what was done
            _add_up(name, tally, per, total, log)


def _add_up(name: str, tally: Tally, per: dict, total: Tally, log: Callable[[str], None]) -> None:
    per[name] = tally.as_dict()
    log(f"{name}: {json.dumps(per[name])}")
    for f in tally.failures[:20]:
        log(f"  FAIL {f}")
    for k in ("cases", "tracebacks", "data_loss", "identical_before", "identical_after", "not_identical"):
        setattr(total, k, getattr(total, k) + getattr(tally, k))
    total.failures += tally.failures
    for k, v in tally.classes.items():
        total.classes[k] = total.classes.get(k, 0) + v


def merge(files: list[Path], out: Path | None) -> int:
    total: dict = {"cases": 0, "tracebacks": 0, "data_loss": 0, "byte_identical_recoveries": 0, "identical_to_before": 0,
                   "identical_to_after": 0, "not_identical": 0, "failures": 0, "classes": {}}  # fmt: skip
    layouts: dict[str, dict] = {}
    failures: list[str] = []
    for f in files:
        data = json.loads(f.read_text())
        for name, counts in data["layouts"].items():
            mine = layouts.setdefault(name, {k: 0 for k in total if k != "classes"} | {"classes": {}})
            for key in (total, mine):
                for k, v in counts.items():
                    if k == "classes":
                        for c, n in v.items():
                            key["classes"][c] = key["classes"].get(c, 0) + n
                    else:
                        key[k] += v
        failures += data.get("failures", [])
    print(json.dumps({"total": total, "layouts": layouts}, indent=2))
    if out:
        out.write_text(json.dumps({"total": total, "layouts": layouts, "failures": failures}, indent=2) + "\n")
    return 0 if not total["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
