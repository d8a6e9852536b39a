"""te-align in the trainer's own Python environment: the environment step of ``te-align patch``.

te-align's hooks and drop-ins run inside the trainer's Python, so ``te-align patch`` installs te-align there, as
part of the tree's one transaction (:mod:`te_align.patching.transaction`):

1. **find** the trainer's Python: ``venv/`` or ``.venv/`` in the trainer's folder, or ``--python PATH`` (an
   executable or an environment folder); refuse when there is none or two, when it is older than te-align's
   ``Requires-Python``, when it has no pip, or when its site-packages is not writable;
2. **plan**: its package list (``pip list``), te-align's core requirements (from te-align's own metadata, markers
   evaluated for the target Python) it lacks, and any it has at a version te-align cannot use (a refusal: te-align
   never changes a package the trainer has);
3. **install**: write the environment journal (python, package list before), install te-align ``--no-deps`` from
   a wheel of the running te-align (:mod:`te_align.patching.wheel`), then the missing requirements with a
   constraints file pinning every package already there; list again: only te-align and the added packages may
   differ, and ``import te_align, te_align.hooks`` must work with that Python; otherwise roll back. The manifest
   records what was installed (its ``environment`` entry carries the journal's id: that is the commit point);
4. **recover** an interrupted install (the journal's id is not in the manifest): uninstall te-align and every
   package not in the list before; **uninstall** at ``unpatch``: te-align and the added packages, then check the
   package list is the one before patching.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from te_align._atomic import fault_point
from te_align._version import __version__
from te_align.patching.journal import (
    STATE_DIR,
    PatchError,
    StepJournal,
    _load_json,
    _mkdir,
    _still_interrupted,
    _unlink,
    _unreadable,
    _write,
    recover_tree,
)

#: The environment folders looked for in a trainer's folder, in this order.
CANDIDATES = ("venv", ".venv")
#: ``TE_ALIGN_NO_INSTALL=1``: the same as ``te-align patch --no-install`` (file-only patching).
NO_INSTALL_ENV = "TE_ALIGN_NO_INSTALL"
#: te-align's core needs this Python at least (when its metadata has no Requires-Python).
MIN_PYTHON = ">=3.10"
DIST = "te-align"
#: The environment step's journal in the tree's state folder; its id in the manifest's ``environment``
#: entry is its commit point.
ENV_JOURNAL = "environment-journal.json"

# Runs in the TARGET Python (any version: no f-strings): what te-align needs to know about it.
_PROBE = r"""
import json, os, platform, sys, sysconfig
paths = sysconfig.get_paths()
impl = getattr(sys, "implementation", None)
iv = impl.version if impl is not None else sys.version_info
ver = "%d.%d.%d" % (iv[0], iv[1], iv[2])
if iv[3] != "final":
    ver += iv[3][0] + str(iv[4])
lib = paths["purelib"]
probe = lib
while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
    probe = os.path.dirname(probe)
print(json.dumps({
    "version": list(sys.version_info[:3]),
    "executable": sys.executable, "prefix": sys.prefix, "base_prefix": getattr(sys, "base_prefix", sys.prefix),
    "purelib": lib, "scripts": paths["scripts"], "writable": os.access(probe, os.W_OK),
    "markers": {
        "implementation_name": impl.name if impl is not None else "cpython", "implementation_version": ver,
        "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
        "platform_system": platform.system(), "platform_version": platform.version(),
        "python_full_version": platform.python_version(), "platform_python_implementation":
        platform.python_implementation(), "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    },
}))
"""
_IMPORT_CHECK = "import json, te_align, te_align.hooks; print(json.dumps([te_align.__version__, te_align.__file__]))"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PipOptions:
    """What ``te-align patch`` passes through to pip (offline installs)."""

    find_links: tuple[str, ...] = ()
    no_index: bool = False

    def args(self) -> list[str]:
        out = [f"--find-links={os.path.abspath(d)}" for d in self.find_links]
        return [*out, "--no-index"] if self.no_index else out


@dataclass(frozen=True)
class Python:
    """A trainer's Python, as it describes itself."""

    executable: Path
    version: tuple[int, int, int]
    prefix: str
    purelib: str
    scripts: str
    markers: dict[str, str]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


@dataclass(frozen=True)
class EnvPlan:
    """What the environment step will do (``describe`` prints it; :func:`install` does it)."""

    python: Python
    #: te-align's version in the environment now (its own site-packages), or None.
    installed: str | None
    #: Install te-align from a wheel of this te-align.
    install: bool
    #: te-align's requirements the environment lacks (requirement strings), installed with every package pinned.
    add: tuple[str, ...]
    before: dict[str, str]
    before_all: dict[str, str]
    #: The manifest's environment entry of an earlier patch (its ``before`` and ``added`` carry over).
    previous: dict[str, Any] | None = None
    options: PipOptions = field(default_factory=PipOptions)

    @property
    def noop(self) -> bool:
        return not self.install and not self.add

    def one_line(self) -> str:
        """``describe`` in one line (for a plan with nothing to do: where, and that nothing is to do)."""
        first, *rest = self.describe()
        return f"{first}: " + "; ".join(line.strip() for line in rest)

    def describe(self) -> list[str]:
        py = self.python
        lines = [f"environment: {py.executable} (Python {py.version_text}, {py.prefix})"]
        if self.noop:
            lines.append(f"  te-align {self.installed} is already installed there with its requirements: nothing to do")
            return lines
        if self.install:
            was = f" (replaces te-align {self.installed})" if self.installed else ""
            lines.append(f"  install te-align {__version__} --no-deps from a wheel of this te-align{was}")
        if self.add:
            lines.append(f"  add te-align's missing requirements: {', '.join(self.add)} (every package already there "
                         "pinned: pip may add, never change)")
        else:
            lines.append("  te-align's requirements: all there already; no package the trainer has changes")
        return lines


@dataclass(frozen=True)
class EnvResult:
    record: dict[str, Any]
    lines: tuple[str, ...]


# ------------------------------------------------------------------------------ running the target Python
def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("TE_ALIGN_FAULT")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONIOENCODING="utf-8")
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: pip goes when te-align is killed, so a recovery never races an orphaned pip."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL


def _run(argv: Sequence[str | os.PathLike[str]]) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="te-align-env.") as cwd:  # never the trainer's or te-align's folder
        try:
            return subprocess.run(
                [os.fspath(a) for a in argv], cwd=cwd, env=_child_env(), capture_output=True, text=True,
                encoding="utf-8", errors="replace", preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except OSError as e:
            raise PatchError(f"cannot run {argv[0]}: {e.strerror or e}") from None


def _last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (proc.stderr + "\n" + proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:") or "Error" in line]
    return (errors or lines or [f"exit status {proc.returncode}"])[-1]


def _env_folder(exe: Path) -> Path:
    return exe.parent.parent if exe.parent.name in ("bin", "Scripts") else exe.parent


def _python_in(folder: Path) -> Path:
    for rel in ("bin/python", "bin/python3", "Scripts/python.exe"):
        if os.path.lexists(folder / rel):
            return folder / rel
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


# ------------------------------------------------------------------------------ 1: find
def find_python(folders: Iterable[str | Path], python: str | os.PathLike[str] | None = None) -> Path:
    """The trainer's Python: ``python`` (an executable or an environment folder), else the one ``venv``/``.venv``
    environment in ``folders``. One-line refusals name what was looked at and that ``--python`` picks one."""
    if python is not None:
        p = Path(os.path.abspath(os.path.expanduser(os.fspath(python))))  # not resolved: a venv's python is a link
        if p.is_dir():
            exe = _python_in(p)
            if not os.path.exists(exe):
                raise PatchError(f"--python {p}: that folder is not a Python environment (no bin/python or "
                                 "Scripts/python.exe in it); give the environment folder or its python executable")
            return exe
        if not p.is_file() or not os.access(p, os.X_OK):
            raise PatchError(f"--python {p}: no such Python executable; give the trainer's python or its environment folder")
        return p
    looked: list[str] = []
    found: list[Path] = []
    for folder in dict.fromkeys(Path(os.path.abspath(os.path.expanduser(os.fspath(f)))) for f in folders):
        for name in CANDIDATES:
            env = folder / name
            looked.append(str(env))
            if env.is_dir() and (os.path.lexists(_python_in(env)) or (env / "pyvenv.cfg").is_file()):
                found.append(env)
    if not found:
        raise PatchError(
            f"no Python environment of the trainer found (looked for {', '.join(looked)}); te-align must be installed "
            "where the trainer runs: pick its Python with --python PATH, or patch the files only with --no-install"
        )
    if len(found) > 1:
        raise PatchError(f"two Python environments found: {found[0]} and {found[1]}; pick the trainer's with --python PATH")
    exe = _python_in(found[0])
    if not os.path.exists(exe):
        raise PatchError(f"{found[0]} has no python (looked for {exe}): a broken environment? Recreate it, or pick "
                         "the trainer's Python with --python PATH")
    return exe


def _packaging() -> Any:
    """packaging's requirements/markers/specifiers (the library, else pip's copy of it)."""
    try:
        import packaging.markers
        import packaging.requirements
        import packaging.specifiers
        import packaging.version

        return packaging
    except ImportError:
        try:
            import pip._vendor.packaging.markers
            import pip._vendor.packaging.requirements
            import pip._vendor.packaging.specifiers
            import pip._vendor.packaging.version

            return pip._vendor.packaging
        except ImportError:
            raise PatchError("te-align needs the 'packaging' library to read its requirements: pip install packaging") from None


def _own_metadata() -> tuple[str, list[str]]:
    import importlib.metadata as md

    try:
        meta = md.metadata(DIST)
        requires_python = meta["Requires-Python"] if "Requires-Python" in meta else None
        return requires_python or MIN_PYTHON, list(md.requires(DIST) or [])
    except md.PackageNotFoundError:
        return MIN_PYTHON, []


def inspect(exe: str | Path) -> Python:
    """Run ``exe`` to learn its version, prefix and site-packages; refuse a Python te-align cannot run on or
    install into (too old, no pip, site-packages not writable)."""
    exe = Path(exe)
    proc, info = _run_json(exe, _PROBE)
    if info is None:
        raise PatchError(f"{exe} does not run as a Python ({_last_error(proc)}); pick the trainer's Python with --python PATH")
    py = Python(exe, tuple(info["version"]), info["prefix"], info["purelib"], info["scripts"], dict(info["markers"]))
    requires_python, _ = _own_metadata()
    spec = _packaging().specifiers.SpecifierSet(requires_python)
    if not spec.contains(py.markers["python_full_version"], prereleases=True):
        raise PatchError(f"{exe} is Python {py.version_text}; te-align needs Python {requires_python}, so the trainer's "
                         "hooks cannot run there: pick another Python with --python PATH")
    pip = _run([exe, "-m", "pip", "--version"])
    if pip.returncode != 0:
        raise PatchError(f"{exe} has no pip ({_last_error(pip)}); add it with '{exe} -m ensurepip', or patch the files "
                         "only with --no-install")
    if not info["writable"]:
        raise PatchError(f"{py.purelib} (site-packages of {exe}) is not writable for this user; run as the user who owns "
                         "the environment, or patch the files only with --no-install")
    return py


# Runs in the TARGET Python: its distributions as pip list sees them (first on sys.path wins; "local": inside the
# environment's own prefix when it is a venv, like pip list --local), without pip's start-up time.
_LIST = r"""
import importlib.metadata as md, json, os, re, sys
prefix = os.path.realpath(sys.prefix)
venv = prefix != os.path.realpath(getattr(sys, "base_prefix", sys.prefix))
every, local = {}, {}
for d in md.distributions():
    name, version = d.metadata["Name"], d.version
    if not name or version is None:
        continue
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in every:
        continue
    every[key] = version
    where = os.path.realpath(str(d.locate_file("")))
    if not venv or where == prefix or where.startswith(prefix + os.sep):
        local[key] = version
print(json.dumps({"all": every, "local": local}))
"""


def _run_json(exe: str | Path, code: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """Run ``code`` with ``exe``; its last stdout line as a JSON object (None when it failed or printed none)."""
    proc = _run([exe, "-c", code])
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (ValueError, IndexError):
        data = None
    return proc, data if isinstance(data, dict) else None


def packages(exe: str | Path) -> tuple[dict[str, str], dict[str, str]]:
    """``({name: version} of every package ``exe`` sees, {name: version} of the environment's own})`` (canonical
    names; what ``pip list`` and ``pip list --local`` show, read with importlib.metadata in ``exe``)."""
    proc, data = _run_json(exe, _LIST)
    if data is None:
        raise PatchError(f"cannot list the packages of {exe}: {_last_error(proc)}")
    return dict(data["all"]), dict(data["local"])


def pip_list(exe: str | Path, *, local: bool) -> dict[str, str]:
    """``{canonical name: version}`` of what ``exe`` sees (``local``: the environment's own packages only)."""
    every, own = packages(exe)
    return own if local else every


def requirements(py: Python) -> list[Any]:
    """te-align's core requirements that apply to ``py`` (extras left out; markers evaluated for ``py``)."""
    pk = _packaging()
    env = {**py.markers, "extra": ""}
    out = []
    for text in _own_metadata()[1]:
        req = pk.requirements.Requirement(text)
        if req.marker is not None and ("extra" in str(req.marker) or not req.marker.evaluate(env)):
            continue
        out.append(req)
    return out


# ------------------------------------------------------------------------------ 2: plan
def plan_environment(exe: str | Path, previous: dict[str, Any] | None = None, options: PipOptions | None = None,
                     extra_requirements: Sequence[str] = ()) -> EnvPlan:
    """What installing te-align into ``exe``'s environment takes; refuses what would change a package it has.

    ``previous``: the manifest's environment entry of an earlier patch. ``extra_requirements``: more requirement
    strings to add with te-align's own (for tests and for trainers' integrations that need one more package)."""
    options = options or PipOptions()
    py = inspect(exe)
    if previous is not None and os.path.abspath(previous["python"]) != os.path.abspath(py.executable):
        raise PatchError(f"this tree was patched with te-align installed for {previous['python']}; to use {py.executable} "
                         f"unpatch first (te-align unpatch), then patch with --python {py.executable}")
    before_all, before = packages(py.executable)
    installed = before.get(DIST)
    ours = previous is not None and previous.get("installed") is True
    if installed is not None and installed != __version__ and not ours:
        raise PatchError(f"{py.prefix} has te-align {installed}, which te-align patch did not install; te-align does not "
                         f"change packages it did not install: install te-align {__version__} there yourself, then patch "
                         "with --no-install")
    pk = _packaging()
    add, clash = [], []
    reqs = [*requirements(py), *(pk.requirements.Requirement(r) for r in extra_requirements)]
    for req in reqs:
        name = canonical(req.name)
        have = before_all.get(name)
        if have is None:
            add.append(str(req))
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            clash.append(f"{req} (it has {have})")
    if clash:
        raise PatchError(f"te-align needs {'; '.join(clash)} in {py.prefix}; te-align never changes a package the "
                         "trainer has: update it there yourself if the trainer allows it, or patch the files only "
                         "with --no-install")
    return EnvPlan(py, installed, installed != __version__, tuple(add), before, before_all, previous, options)


# ------------------------------------------------------------------------------ 3: install
def _constraints(before_all: dict[str, str]) -> str:
    version = _packaging().version
    lines = []
    for name, v in sorted(before_all.items()):
        if name == DIST:
            continue
        try:
            version.Version(v)
        except version.InvalidVersion:
            continue
        lines.append(f"{name}=={v}\n")
    return "".join(lines)


def _write_journal(root: Path, body: dict[str, Any]) -> None:
    state = root / STATE_DIR
    if not state.is_dir():
        _mkdir(state)
        _write(state / ".gitignore", b"*\n", None)
    _write(state / ENV_JOURNAL, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode(), None)


def _diff(before: dict[str, str], after: dict[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, str | None]]]:
    """(new: name -> version, gone: name -> version, changed: name -> (before, after))."""
    new = {n: v for n, v in after.items() if n not in before}
    gone = {n: v for n, v in before.items() if n not in after}
    changed: dict[str, tuple[str, str | None]] = {n: (v, after[n]) for n, v in before.items() if n in after and after[n] != v}
    return new, gone, changed


def _fmt(pkgs: dict[str, str]) -> str:
    return ", ".join(f"{n} {v}" for n, v in sorted(pkgs.items())) or "none"


def install(root: str | Path, plan: EnvPlan) -> EnvResult:
    """Do ``plan`` as the environment step of ``root``'s transaction (the caller holds the tree's lock); the
    returned record goes into the manifest. Any failure rolls the environment back and raises one line."""
    root = Path(root)
    py, prev = plan.python, plan.previous
    base_record: dict[str, Any] = {
        "python": str(py.executable), "prefix": py.prefix, "te_align_version": plan.installed or __version__,
        "installed": bool(prev and prev.get("installed")), "added": dict(prev["added"]) if prev else {},
        "before": dict(prev["before"]) if prev else dict(plan.before),
    }
    if plan.noop:
        record = dict(prev) if prev else {**base_record, "id": uuid.uuid4().hex}
        return EnvResult(record, ())  # describe() said "nothing to do"
    journal_id = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="te-align-wheel.") as tmp:
        from te_align.patching.wheel import build_wheel

        wheel = build_wheel(tmp)
        purelib = Path(py.purelib)
        _write_journal(root, {
            "id": journal_id, "python": str(py.executable), "before": plan.before, "files": list(wheel.files),
            "purelib": py.purelib, "scripts": py.scripts,
            "te_align_dir_existed": os.path.lexists(purelib / "te_align"),
        })
        fault_point("pip", py.executable)
        proc = _run([py.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-warn-script-location",
                     *plan.options.args(), wheel.path])
        if proc.returncode != 0:
            _fail(root, f"installing te-align into {py.prefix} failed: {_last_error(proc)}")
        if plan.add:
            fault_point("pip", py.executable)
            cfile = Path(tmp) / "constraints.txt"
            cfile.write_text(_constraints(plan.before_all), encoding="utf-8")
            proc = _run([py.executable, "-m", "pip", "install", "--no-warn-script-location", "-c", cfile,
                         *plan.options.args(), *plan.add])
            if proc.returncode != 0:
                _fail(root, f"adding te-align's requirements {', '.join(plan.add)} to {py.prefix} would need a change to "
                      f"a package the trainer has, or failed ({_last_error(proc)})")
    fault_point("verify", py.executable)  # installed, not yet committed: crash tests stop here
    after_all, after = packages(py.executable)
    new, _, _ = _diff(plan.before, after)
    _, gone, changed = _diff(plan.before_all, after_all)
    changed.pop(DIST, None)
    new.pop(DIST, None)
    if gone or changed:
        what = [f"{n} {a} -> {b}" for n, (a, b) in sorted(changed.items())] + [f"{n} {v} removed" for n, v in sorted(gone.items())]
        _fail(root, f"installing te-align changed packages the trainer had ({', '.join(what)}); rolled back")
    check = _run([py.executable, "-c", _IMPORT_CHECK])
    try:
        got, where = json.loads(check.stdout.strip().splitlines()[-1]) if check.returncode == 0 else (None, None)
    except (ValueError, IndexError):
        got, where = None, None
    if got != __version__:
        why = _last_error(check) if check.returncode != 0 else f"it imports te-align {got} from {where}"
        _fail(root, f"te-align was installed into {py.prefix} but 'import te_align' fails there ({why})")
    record = {**base_record, "id": journal_id, "te_align_version": __version__, "installed": True,
              "added": {**base_record["added"], **new}}
    lines = (
        f"environment: installed te-align {__version__} into {py.prefix}; added: te-align {__version__}"
        + (f", {_fmt(new)}" if new else "") + "; no package the trainer had changed",
        f"  import te_align, te_align.hooks with {py.executable}: ok ({where})",
    )
    return EnvResult(record, lines)


def _fail(root: Path, message: str) -> None:
    """Roll the interrupted environment step back (through the tree's recovery) and refuse in one line."""
    try:
        done = recover_tree(root, (_UNCOMMITTED,))
    except (OSError, PatchError) as e:
        raise PatchError(f"{message}; rolling back failed too ({e}){_still_interrupted(root)}") from None
    tail = "" if done and "as before" in done else f" ({done})" if done else ""
    raise PatchError(f"{message}; rolled back, nothing changed{tail}")


# ------------------------------------------------------------------------------ 4: recover, uninstall, status
def _remove_leftovers(journal: dict[str, Any]) -> None:
    """Files of a te-align install pip was killed in the middle of (pip uninstall cannot see them)."""
    if journal.get("te_align_dir_existed"):
        return
    purelib = Path(journal["purelib"])
    for rel in journal.get("files", []):
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts or not p.parts:
            continue
        top = purelib / p.parts[0]
        if p.parts[0] == "te_align" or p.parts[0].startswith("te_align-"):
            if top.is_dir() and not top.is_symlink():
                shutil.rmtree(top)
    script = Path(journal.get("scripts", "")) / "te-align"
    if journal.get("scripts") and script.is_file() and DIST not in journal["before"]:
        script.unlink()


def _uninstall(exe: str, names: Sequence[str]) -> None:
    if not names:
        return
    proc = _run([exe, "-m", "pip", "uninstall", "-y", *names])
    if proc.returncode != 0:
        raise PatchError(f"'{exe} -m pip uninstall {' '.join(names)}' failed: {_last_error(proc)}")


def _compare(before: dict[str, str], after: dict[str, str]) -> str:
    new, gone, changed = _diff(before, after)
    if not (new or gone or changed):
        return "its package list is as before"
    parts = ([f"still there: {_fmt(new)}"] if new else []) + ([f"missing: {_fmt(gone)}"] if gone else []) + (
        [f"changed: {', '.join(f'{n} {a} -> {b}' for n, (a, b) in sorted(changed.items()))}"] if changed else [])
    return f"its package list differs from before ({'; '.join(parts)})"


def rollback(journal: dict[str, Any]) -> str:
    """Undo an interrupted environment step: uninstall te-align and every package not in the list before."""
    exe = journal["python"]
    if not os.path.exists(exe):
        return f"the environment of an interrupted te-align install ({exe}) no longer exists: nothing to roll back there"
    before: dict[str, str] = journal["before"]
    now = pip_list(exe, local=True)
    remove = sorted(n for n in now if n not in before or (n == DIST and now[n] != before.get(n)))
    _uninstall(exe, remove)
    _remove_leftovers(journal)
    after = pip_list(exe, local=True)
    return f"rolled back an interrupted te-align install in {Path(exe).parent.parent}: removed {', '.join(remove) or 'nothing'}; {_compare(before, after)}"


def _read_env_journal(path: Path, root: Path) -> dict[str, Any]:
    j = _load_json(path, root)
    if j is None or not isinstance(j.get("id"), str) or not isinstance(j.get("python"), str) or not isinstance(
        j.get("before"), dict
    ) or not isinstance(j.get("purelib"), str) or not isinstance(j.get("files", []), list):
        raise _unreadable(path, root, "no 'id' / 'python' / 'before' / 'purelib'")
    return j


def recover_environment(root: Path, manifest: dict[str, Any] | None) -> str | None:
    """The environment part of :func:`te_align.patching.transaction.recover` (the caller holds the lock)."""
    path = root / STATE_DIR / ENV_JOURNAL
    if not os.path.lexists(path):
        return None
    journal = _read_env_journal(path, root)
    committed = manifest is not None and isinstance(manifest.get("environment"), dict) and (
        manifest["environment"].get("id") == journal["id"]
    )
    done = None if committed else rollback(journal)
    _unlink(path)
    return done


#: The tree's recovery of a step that failed in-process (:func:`_fail`): its journal, just written, is named
#: by no manifest, so it is rolled back (``te-align patch``'s recovery hands the manifest it reads instead).
_UNCOMMITTED = StepJournal(ENV_JOURNAL, lambda root: recover_environment(root, None))


def uninstall(record: dict[str, Any]) -> tuple[str, ...]:
    """``unpatch``'s environment step: remove te-align (when te-align patch installed it) and the packages it added,
    then compare the package list with the one before patching."""
    exe = record["python"]
    if not os.path.exists(exe):
        return (f"environment: {exe} no longer exists: nothing to remove there",)
    names = ([DIST] if record.get("installed") else []) + sorted(record.get("added", {}))
    _uninstall(exe, names)
    after = pip_list(exe, local=True)
    removed = ", ".join(names) or "nothing (te-align was installed there before patching)"
    return (f"environment: removed {removed} from {record.get('prefix', exe)}; {_compare(record['before'], after).replace('before', 'before patching')}",)


def env_status(record: dict[str, Any]) -> dict[str, Any]:
    """The environment part of ``te-align status``: python, te-align's version in the environment itself (and one
    it sees from outside, e.g. a base Python's), whether it is this te-align, the packages patch added."""
    exe = record["python"]
    exists = os.path.exists(exe)
    every, own = packages(exe) if exists else ({}, {})
    version = own.get(DIST)
    return {
        "python": exe, "prefix": record.get("prefix"), "exists": exists, "te_align_installed": version,
        "te_align_visible": every.get(DIST), "matches": version == __version__,
        "installed_by_patch": bool(record.get("installed")), "added": dict(record.get("added", {})),
    }


def no_install_default() -> bool:
    return os.environ.get(NO_INSTALL_ENV, "").strip().lower() in ("1", "true", "yes", "on")
