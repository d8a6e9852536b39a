"""The dependency jobs: the lock the README's test command installs from, the newest-versions run, the lowest run.

    python tools/deps.py lock     # newest releases within pyproject's ranges; if the suite passes, write the lock
    python tools/deps.py newest   # the same suite on the newest releases pip resolves without the lock (no write)
    python tools/deps.py lowest   # every direct dependency at the lowest release its declared range allows
    python tools/deps.py product  # `pip install ./world ".[train]"` (no lock), then the product's commands
    python tools/deps.py core --python 3.10   # the core alone on a Python: size, time, commands, its tests

Each job builds a fresh virtual environment in a temporary folder (``--venv DIR`` keeps it), installs te-align from
this checkout with the ``test`` and ``kohya-test`` extras plus ai-toolkit's PyPI package (``--no-deps``, as the
README does), runs ``ruff check .`` and the whole test suite (``--pytest-args`` narrows it), and prints one report:
the installed version of every direct dependency beside the lock's, the suite's summary line and, for ``newest``,
each dependency whose newest release pyproject's upper bound leaves out. Exit status: 0 when ruff and the suite
pass.

``product`` is a new user's first minutes: ``pip install ./world ".[train]"`` (newest releases within the ranges), then,
from an empty folder, ``te-align --help``, ``profile show``, ``check`` on a shipped example, the full ``te-align
demo`` and ``te-align train`` of the demo's own config (a LoRA on the denoiser and CLIP-L). Each must exit as
expected and write nothing to stderr but te-align's own lines and progress bars: any other line is third-party
noise and fails the job.

``lock`` writes ``lock/constraints.txt`` (``pip freeze`` of that environment, without te-align) only when the
suite passed; ``tests/support/lock.py`` reads it. torch is pinned by ``--torch`` (default ``torch==2.13.0``, the
CPU build the README installs); ``newest`` leaves torch to pip too unless ``--torch`` is given. Run ``newest``
before every submission; ``.ci/run`` runs it after the locked suite and prints its report.

``core`` is te-align where only the core is installed, as inside a trainer's environment: a fresh venv on
``--python`` (default: this one), a wheel of this checkout installed with ``pip install`` (the core's dependencies
only, from the warm pip cache; ``--lowest`` pins each to the lowest release its range allows), and it prints the
install's size (what site-packages grew by, bytecode included) and time, checks that no extra's library came with
it, runs ``--help``, ``profile show``, ``check``, ``patch``/``status``/``unpatch`` of a trainer-shaped tree and
``demo`` (which must say in one line which extra it needs), and then ``CORE_TESTS``, the test files of the code
that runs where only the core is installed.

``lowest`` pins each direct dependency to the lowest release the package index offers inside its declared range
(``pip index versions``; the bound itself when that release exists, else the first one after it: ``setuptools>=77``
is 77.0.1, as no 77.0.0 was released), and prints each pin that differs from the literal bound. ``.ci/run`` runs it
on every run, after ``newest``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "lock" / "constraints.txt"
EXTRAS = "test,kohya-test"
#: installed with --no-deps, exactly as the README's test command does (ai-toolkit's own pins would replace torch)
NO_DEPS = ("ostris-ai-toolkit==0.2.7", "oyaml==1.0")
DEFAULT_TORCH = "torch==2.13.0"
#: never written into the lock: the installer itself and the project
NOT_LOCKED = {"pip", "te-align", "te_align", "te-align-world", "te_align_world"}
#: the world bases' data, a distribution of its own (world/), installed beside te-align wherever the suite runs
WORLD = ROOT / "world"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct_requirements(extras: bool = True, core: bool = True,
                        python: tuple[int, int] = sys.version_info[:2]) -> dict[str, str]:
    """``{name: specifier}`` of pyproject's dependencies (``core``) and the test extras, with te-align's own extras
    that an extra names (``te-align[train]``) expanded."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = meta.get("optional-dependencies", {})
    reqs = list(meta["dependencies"]) if core else []
    todo = EXTRAS.split(",") if extras else []
    seen: set[str] = set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for r in optional.get(extra, []):
            own = re.match(r"\s*te-align\[([^\]]+)\]", r)
            if own:
                todo += [e.strip() for e in own.group(1).split(",")]
            else:
                reqs.append(r)
    out: dict[str, str] = {}
    for r in reqs:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*([^;]*)(;.*)?", r)
        if m:
            marker = (m.group(3) or "").replace(" ", "")
            if "python_version<'3.11'" in marker.replace('"', "'") and python >= (3, 11):
                continue  # a backport this Python does not install (tomli)
            name = _norm(m.group(1))
            spec = m.group(2).strip()
            out[name] = ",".join(s for s in (out.get(name, ""), spec) if s)
    return out


def lower_bound(spec: str) -> str | None:
    """The effective lower bound of ``spec``: the highest of its ``>=`` bounds (the core's ``packaging>=22`` and the
    test extra's ``packaging>=24.2`` make 24.2), or None."""
    bounds = re.findall(r">=\s*([0-9][^,\s]*)", spec)
    return max(bounds, key=_key) if bounds else None


def upper_bound(spec: str) -> str | None:
    m = re.search(r"<\s*([0-9][^,\s]*)", spec)
    return m.group(1) if m else None


def read_lock(path: Path = LOCK) -> dict[str, str]:
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[_norm(name)] = version.strip()
    return out


def _run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT, capture: bool = False) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=capture)


def _freeze(python: Path) -> dict[str, str]:
    out = _run([str(python), "-m", "pip", "freeze", "--all", "--exclude-editable"], capture=True).stdout
    versions = {}
    for line in out.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            versions[_norm(name)] = version.strip()
    return versions


def _index_newest(python: Path, name: str) -> str | None:
    """The newest release of ``name`` the package index offers (``pip index versions``), or None offline."""
    p = subprocess.run([str(python), "-m", "pip", "index", "versions", name], capture_output=True, text=True)
    m = re.search(r"\(([^)]+)\)", p.stdout.splitlines()[0]) if p.returncode == 0 and p.stdout else None
    return m.group(1) if m else None


def _index_versions(python: Path, name: str) -> list[str]:
    """Every release of ``name`` the package index offers this interpreter (``pip index versions``), or []."""
    p = subprocess.run([str(python), "-m", "pip", "index", "versions", name], capture_output=True, text=True)
    m = re.search(r"^Available versions:\s*(.+)$", p.stdout, re.M) if p.returncode == 0 else None
    return [v.strip() for v in m.group(1).split(",") if v.strip()] if m else []


def _packaging() -> tuple[type, type, type]:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pip's own copy, always beside pip
        from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
        from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]
    return SpecifierSet, Version, InvalidVersion


def lowest_release(spec: str, versions: list[str]) -> str | None:
    """The lowest final release in ``versions`` that ``spec`` (a PEP 440 specifier set) allows, or None."""
    SpecifierSet, Version, InvalidVersion = _packaging()
    allowed = SpecifierSet(spec)
    found = []
    for v in versions:
        try:
            ver = Version(v)
        except InvalidVersion:
            continue
        if not ver.is_prerelease and ver in allowed:
            found.append(ver)
    return str(min(found)) if found else None


def lowest_pins(python: Path, log: list[str], reqs: dict[str, str] | None = None) -> dict[str, str]:
    """``{name: version}``: each direct dependency (default: the suite's, ``direct_requirements()``) with a lower
    bound at the lowest release its range allows."""
    pins: dict[str, str] = {}
    for name, spec in (direct_requirements() if reqs is None else reqs).items():
        bound = lower_bound(spec)
        if bound is None:
            log.append(f"no lower bound declared for {name} (left to pip)")
            continue
        versions = _index_versions(python, name)
        low = lowest_release(spec, versions)
        if low is None:
            log.append(f"{name}: the index lists no release in '{spec}'" + ("" if versions else " (index unreachable?)")
                       + f"; pinned to the bound {bound}")
            low = bound
        elif _packaging()[1](low) != _packaging()[1](bound):
            log.append(f"{name}: '{spec}' starts at release {low} ({bound} itself is not released)")
        pins[name] = low
    return pins


def _key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in re.split(r"[.+]", v.split("+")[0]))


def _install(job: str, python: Path, torch: str | None, log: list[str]) -> int:
    pip = [str(python), "-m", "pip", "install", "-q"]
    _run([*pip, "--upgrade", "pip"])
    args: list[str] = []
    if job == "lowest":
        pins = lowest_pins(python, log)
        cons = Path(tempfile.mkstemp(prefix="te-align-lowest-", suffix=".txt")[1])
        cons.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()), encoding="utf-8")
        args += ["-c", str(cons)]
    if torch:
        args.append(torch)
    rc = _run([*pip, *args, "-e", f".[{EXTRAS}]", "-e", str(WORLD)]).returncode
    if rc:
        return rc
    return _run([*pip, "--no-deps", *NO_DEPS]).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job", choices=("lock", "newest", "lowest", "product", "core"))
    ap.add_argument("--python", help="core: the interpreter (or a version, 3.10) to build the venv with "
                                     "(default: this one)")
    ap.add_argument("--lowest", action="store_true", help="core: the core's dependencies at their lowest releases")
    ap.add_argument("--venv", type=Path, help="build (or reuse) the environment here and keep it")
    ap.add_argument("--torch", help=f"torch requirement (default {DEFAULT_TORCH}; newest: pip's choice)")
    ap.add_argument("--pytest-args", default="", help="instead of the whole suite (e.g. 'tests/train/test_train.py -x')")
    ap.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = ap.parse_args(argv)
    torch = args.torch or (DEFAULT_TORCH if args.job == "lock" else None)  # lowest: the lower bound pins it

    tmp = None
    venv = args.venv
    if venv is None:
        tmp = tempfile.mkdtemp(prefix=f"te-align-{args.job}-")
        venv = Path(tmp) / "venv"
    python = venv / "bin" / "python"
    t0 = time.monotonic()
    log: list[str] = []
    try:
        if not python.exists():
            base = args.python or sys.executable
            if re.fullmatch(r"\d+\.\d+", base):  # a version: python3.X on PATH, else pyenv's
                from trainer_envs import find_python

                base = find_python(base)
            _run([base, "-m", "venv", str(venv)])
        if args.job == "core":
            return _core(python, venv, args.lowest)
        if args.job == "product":
            return _product(python, venv, torch)
        rc = _install(args.job, python, torch, log)
        if rc:
            print(f"\n{args.job}: the install failed (exit {rc}); see pip's output above")
            return rc
        installed = _freeze(python)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        ruff = _run([str(python), "-m", "ruff", "check", "."], env=env).returncode
        t1 = time.monotonic()
        extra = args.pytest_args.split() if args.pytest_args else []
        tests = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra], env=env, capture=True)
        sys.stdout.write(tests.stdout[-20000:])
        sys.stdout.write(tests.stderr[-5000:])
        lines = [s for s in tests.stdout.splitlines() if s.strip()]
        summary = lines[-1].strip("= ") if lines else "(no pytest output)"
        failed = [s for s in tests.stdout.splitlines() if s.startswith(("FAILED ", "ERROR "))]
        ok = ruff == 0 and tests.returncode == 0

        lock = read_lock()
        direct = direct_requirements()
        report: dict = {"job": args.job, "ok": ok, "summary": summary, "failed": failed, "ruff": ruff == 0,
                        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                        "python": platform.python_version(), "platform": f"{sys.platform}-{platform.machine()}",
                        "install_and_test_s": round(time.monotonic() - t0), "test_s": round(time.monotonic() - t1),
                        "direct": {}, "excluded_by_upper_bound": {}, "notes": log}  # fmt: skip
        for name, spec in sorted(direct.items()):
            report["direct"][name] = {"range": spec or "(any)", "installed": installed.get(name), "lock": lock.get(name)}
        if args.job == "newest":
            for name, spec in sorted(direct.items()):
                ub = upper_bound(spec)
                if ub:
                    newest = _index_newest(python, name)
                    if newest and _key(newest) >= _key(ub):
                        report["excluded_by_upper_bound"][name] = {"range": spec, "newest_release": newest}
        print(f"\n=== te-align dependency job: {args.job} ({report['date']}, Python {report['python']}, "
              f"{report['platform']}) ===")
        print(f"{'package':<20}{'range':<22}{'installed':<16}{'lock':<16}")
        for name, row in report["direct"].items():
            mark = "" if row["lock"] in (None, row["installed"]) else "  (differs from the lock)"
            print(f"{name:<20}{row['range']:<22}{row['installed'] or '-':<16}{row['lock'] or '-':<16}{mark}")
        for name, row in report["excluded_by_upper_bound"].items():
            print(f"upper bound: {name} {row['newest_release']} is released and excluded by '{row['range']}'")
        for note in log:
            print(f"note: {note}")
        print(f"ruff: {'clean' if ruff == 0 else 'FAILED'}")
        print(f"suite: {summary}")
        for f in failed:
            print(f"  {f}")
        print(f"result: {'PASS' if ok else 'FAIL'} in {report['install_and_test_s']} s "
              f"(suite {report['test_s']} s)")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
        if args.job == "lock":
            if not ok:
                print(f"lock: not written ({LOCK.relative_to(ROOT)} unchanged): the suite did not pass")
                return 1
            _write_lock(installed, report)
        return 0 if ok else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


#: stderr lines that are not noise: te-align's own (errors, log lines) and tqdm progress bars
_OWN_LINE = re.compile(r"^(te-align[: ]|\S.*\d+/\d+ \[[\d:<?]+.*\]\s*$|.*\|[ #▏▎▍▌▋▊▉█]*\| )")


def _product(python: Path, venv: Path, torch: str | None) -> int:
    """The product job (see the module docstring)."""
    pip = [str(python), "-m", "pip", "install", "-q"]
    _run([*pip, "--upgrade", "pip"])
    rc = _run([*pip, *([torch] if torch else []), f"{ROOT}[train]", str(WORLD)]).returncode
    if rc:
        print(f"\nproduct: `pip install ./world \".[train]\"` failed (exit {rc})")
        return rc
    te = str(venv / "bin" / "te-align")
    example = ROOT / "examples" / "kohya" / "flux_schnell_lora.toml"
    work = Path(tempfile.mkdtemp(prefix="te-align-product-"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    steps = [  # (command, exit codes that are right)
        ([te, "--help"], {0}),
        ([te, "profile", "show", "sd35-large"], {0}),
        ([te, "check", str(example)], {0, 1}),
        ([te, "demo", "--out", "demo"], {0}),
        ([te, "train", "demo/train.toml"], {0}),
    ]
    ok = True
    rows = []
    try:
        for cmd, good in steps:
            t0 = time.monotonic()
            p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            wall = time.monotonic() - t0
            lines = [ln for ln in re.split(r"[\r\n]+", p.stderr) if ln.strip()]
            noise = [ln for ln in lines if not _OWN_LINE.match(ln.strip())]
            good_exit = p.returncode in good
            ok &= good_exit and not noise
            shown = " ".join(["te-align", *cmd[1:]])
            rows.append((shown, p.returncode, wall, noise))
            if not good_exit:
                print(f"{shown}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    versions = _freeze(python)
    print("\n=== te-align dependency job: product (pip install ./world \".[train]\", no lock) ===")
    print("versions: " + ", ".join(f"{n} {versions.get(n, '-')}" for n in ("torch", "transformers", "diffusers",
                                                                           "peft", "accelerate", "bitsandbytes")))
    for shown, code, wall, noise in rows:
        print(f"{'ok  ' if not noise else 'NOISE'} exit {code}  {wall:6.1f} s  {shown}")
        for ln in noise[:10]:
            print(f"        third-party line: {ln[:200]}")
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


#: the test files of the code that runs where only the core is installed (inside a trainer's environment, before
#: its extras): check, patch, profiles, the hooks' lifecycle and the trainers' parts that need no model
CORE_TESTS = (
    "tests/audit/test_check.py", "tests/audit/test_check_corpus.py", "tests/audit/test_check_fix.py",
    "tests/audit/test_check_shipped.py", "tests/audit/test_detection.py",
    "tests/trainers/diffusers_examples/test_diffusers_examples_check.py", "tests/hooks/test_hooks_base.py",
    "tests/repo/test_imports.py", "tests/integrations/test_inference_targets.py", "tests/repo/test_lazy.py",
    "tests/profiles/test_overrides.py", "tests/patching/test_patch_faults.py",
    "tests/patching/test_patch_safety.py", "tests/patching/test_patching.py",
    "tests/profiles/test_profile_faults.py", "tests/trainers/test_trainer_api.py",
)


def _site_size(python: Path) -> int:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", code], capture=True).stdout.strip())
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file())


def _core(python: Path, venv: Path, lowest: bool) -> int:
    """The core job (see the module docstring)."""
    pip = [str(python), "-m", "pip", "install", "-q"]
    _run([*pip, "--upgrade", "pip"])
    version = _run([str(python), "-c", "import platform; print(platform.python_version())"], capture=True).stdout
    wheels = Path(tempfile.mkdtemp(prefix="te-align-core-wheel-"))
    rc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)]).returncode
    (wheel,) = wheels.glob("te_align-*.whl")
    args: list[str] = []
    log: list[str] = []
    if lowest:
        target = tuple(int(x) for x in version.split(".")[:2])
        pins = lowest_pins(python, log, direct_requirements(extras=False, python=target))  # type: ignore[arg-type]
        cons = wheels / "lowest.txt"
        cons.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()), encoding="utf-8")
        args += ["-c", str(cons)]
    # the cache is warmed first (a user's second install; the first one downloads), then the install is timed
    _run([*pip, "--dry-run", *args, str(wheel)], capture=True)
    size0 = _site_size(python)
    t0 = time.monotonic()
    rc = _run([*pip, *args, str(wheel)]).returncode
    install_s = time.monotonic() - t0
    if rc:
        print(f"\ncore: `pip install` of the wheel failed (exit {rc})")
        return rc
    grown = (_site_size(python) - size0) / 1e6
    installed = _freeze(python)
    heavy = sorted(n for n in installed if n in {"torch", "transformers", "diffusers", "numpy", "safetensors",
                                                   "huggingface-hub", "tokenizers", "accelerate", "peft"})
    te = str(venv / "bin" / "te-align")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    work = Path(tempfile.mkdtemp(prefix="te-align-core-"))
    campaign = _load_campaign()
    tree = campaign.fake_kohya(work / "sd-scripts")
    steps = [  # (command, exit codes that are right, text stderr must hold)
        ([te, "--help"], {0}, ""),
        ([te, "profile", "show", "flux-schnell"], {0}, ""),
        ([te, "check", str(ROOT / "examples" / "kohya" / "flux_schnell_lora.toml")], {0, 1}, ""),
        ([te, "patch", str(tree), "--no-install"], {0}, ""),
        ([te, "status", str(tree)], {0}, ""),
        ([te, "unpatch", str(tree)], {0}, ""),
        ([te, "demo", "--out", "demo"], {2}, "pip install"),
    ]
    ok = not heavy
    rows = []
    try:
        for cmd, good, needle in steps:
            t1 = time.monotonic()
            p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            wall = time.monotonic() - t1
            lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
            right = p.returncode in good and "Traceback" not in p.stderr and (not needle or (
                len(lines) == 1 and needle in lines[0]))
            ok &= right
            rows.append((" ".join(["te-align", *cmd[1:]]).replace(str(work), ".").replace(f"{ROOT}/", ""), p.returncode, wall, right,
                         lines[-1] if lines else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(wheels, ignore_errors=True)
    _run([*pip, "pytest>=8"])
    tenv = dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1")
    tests = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *CORE_TESTS], env=tenv, capture=True)
    sys.stdout.write(tests.stdout[-6000:])
    out_lines = [ln for ln in tests.stdout.splitlines() if ln.strip()]
    summary = out_lines[-1].strip("= ") if out_lines else "(no pytest output)"
    ok &= tests.returncode == 0
    print(f"\n=== te-align dependency job: core{' (lowest)' if lowest else ''} (Python {version.strip()}) ===")
    print("installed: " + ", ".join(f"{n} {v}" for n, v in sorted(installed.items())
                                    if n not in ("pip", "setuptools", "pytest")))
    for note in log:
        print(f"note: {note}")
    print(f"install: {grown:.1f} MB added to site-packages in {install_s:.1f} s (warm pip cache); "
          f"extras' libraries installed: {', '.join(heavy) or 'none'}")
    for shown, code, wall, right, last in rows:
        print(f"{'ok  ' if right else 'FAIL'} exit {code}  {wall:5.2f} s  {shown}" + (f"  [{last[:110]}]" if last else ""))
    print(f"core tests: {summary}")
    for line in [ln for ln in tests.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))][:20]:
        print(f"  {line[:200]}")
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _load_campaign():  # tools/ is not a package: the fault campaign's trainer-shaped trees
    import importlib.util

    spec = importlib.util.spec_from_file_location("te_align_fault_campaign", ROOT / "tools" / "fault_campaign.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  (its dataclasses look their module up)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _write_lock(installed: dict[str, str], report: dict) -> None:
    old = read_lock()
    header = (
        "# The exact versions te-align's whole test suite passed with: the README's test command and .ci/run\n"
        "# install from this file (pip install -c lock/constraints.txt ...). Regenerate: python tools/deps.py lock\n"
        f"# Made {report['date']} on Python {report['python']} ({report['platform']}); suite: {report['summary']}\n"
        "# torch is the CPU build where one is on the machine's disk (torch==2.13.0 also matches 2.13.0+cpu).\n"
    )
    body = "".join(f"{n}=={v.split('+')[0]}\n" for n, v in sorted(installed.items()) if n not in NOT_LOCKED)
    LOCK.parent.mkdir(exist_ok=True)
    tmp = LOCK.with_suffix(".tmp")
    tmp.write_text(header + body, encoding="utf-8")
    tmp.replace(LOCK)
    new = read_lock()
    changed = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
    moves = ", ".join(f"{n} {old.get(n, '-')} -> {new.get(n, '-')}" for n in changed) or "none"
    print(f"lock: wrote {LOCK.relative_to(ROOT)} ({len(new)} packages; changed: {moves})")


if __name__ == "__main__":
    sys.exit(main())
