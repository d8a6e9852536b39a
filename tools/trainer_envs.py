"""te-align in each trainer's own environment: a venv from the trainer's pinned requirements, te-align installed as
the README tells users, and the te-align tests of the code that runs inside that trainer.

    python tools/trainer_envs.py list                    # the trainers, their Python and pins
    python tools/trainer_envs.py run sd-scripts          # build, install, test one (a temporary venv)
    python tools/trainer_envs.py run all                 # every trainer, one after the other
    python tools/trainer_envs.py run --rotate            # the one this commit's turn names (what .ci/run runs)
    python tools/trainer_envs.py run musubi --venv DIR --checkout /path/to/musubi-tuner

Each ``tools/trainer_envs/<trainer>.txt`` holds one trainer's pins, read from its own requirements at the commit
te-align cites, minus GPU-only builds; its ``# key: value`` header names the Python (``python``), the torch
requirement (``torch``), the environment variable the checkout tests read (``checkout``) and the test files
(``tests``), and optionally packages the tests need installed ``--no-deps`` (``no-deps``: their own pins clash
with the trainer's, as ai-toolkit's PyPI packaging does) and a variable that gets the venv's Python
(``python-var``: OneTrainer's launch tests run the trainer with it). The job:

1. builds a venv on that Python (found on PATH as ``python3.X`` or under ``pyenv root``) and installs torch and the
   pins, as a user of that trainer has them;
2. installs te-align from a wheel of this checkout with every package already there pinned to its version
   (``-c`` of ``pip freeze``), so pip can add te-align's small core dependencies but change nothing the trainer
   pinned, and proves it: the package lists before and after differ by te-align and the added packages only;
3. imports te-align and its hooks from outside the checkout with that Python;
4. runs the test files with pytest (``--checkout DIR`` sets the checkout variable; without it the checkout tests
   skip, naming the variable, as in CI).

Exit status 0 when every step passed. ``--rotate`` picks ``TRAINERS[commit count % len]`` so that successive CI runs
cover every trainer; the report names which one ran.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tools" / "trainer_envs"
#: the order --rotate walks (the trainers whose environments te-align's hooks must live in first)
ORDER = ("sd-scripts", "musubi", "onetrainer", "ai-toolkit")
#: what the job installs beside the pins to run the tests (constrained like te-align: nothing pinned changes)
TEST_TOOLS = ("pytest>=8",)


@dataclass(frozen=True)
class TrainerEnv:
    name: str
    python: str
    torch: str
    checkout: str
    tests: tuple[str, ...]
    pins: tuple[str, ...]
    source: str
    no_deps: tuple[str, ...] = ()
    python_var: str = ""


def load(name: str) -> TrainerEnv:
    path = PINS / f"{name}.txt"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PINS.glob("*.txt")))
        raise SystemExit(f"trainer_envs: no pins file {path.relative_to(ROOT)} (known: {known})")
    head: dict[str, str] = {}
    pins: list[str] = []
    source = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        m = re.match(r"#\s*([a-z_-]+):\s*(.*)$", line)
        if m and m.group(1) in ("python", "torch", "checkout", "tests", "no-deps", "python-var"):
            head[m.group(1)] = m.group(2).strip()
        elif line.startswith("#"):
            source = source or line.lstrip("# ")
        elif line:
            pins.append(line)
    missing = [k for k in ("python", "torch", "tests") if k not in head]
    if missing:
        raise SystemExit(f"trainer_envs: {path.relative_to(ROOT)}: header line(s) missing: "
                         + ", ".join(f"'# {k}: ...'" for k in missing))
    return TrainerEnv(name, head["python"], head["torch"], head.get("checkout", ""), tuple(head["tests"].split()),
                      tuple(pins), source, tuple(head.get("no-deps", "").split()), head.get("python-var", ""))


def trainers() -> list[str]:
    found = {p.stem for p in PINS.glob("*.txt")}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def find_python(version: str) -> str:
    """An interpreter of ``version`` (``3.10``) that runs: ``python3.10`` on PATH, else the newest pyenv one (a
    pyenv shim on PATH for a version pyenv has not activated fails, and is passed over)."""
    candidates = [exe] if (exe := shutil.which(f"python{version}")) else []
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = ""
    if root:
        candidates += [str(p) for p in sorted(
            Path(root, "versions").glob(f"{version}.*/bin/python"),
            key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)], reverse=True)]
    for exe in candidates:
        ran = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)
        if ran.returncode == 0 and ran.stdout.strip() == version:
            return exe
    raise SystemExit(f"trainer_envs: no Python {version} on PATH (python{version}) or under pyenv")


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, **kw)  # type: ignore[call-overload]


def _freeze(python: Path) -> dict[str, str]:
    out = _run([str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
               capture_output=True, text=True).stdout
    pkgs = {}
    for line in out.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            pkgs[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pkgs


def build_wheel(dest: Path) -> Path:
    """A wheel of this checkout (``pip wheel --no-deps``), as a user installing from a clone gets."""
    rc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(ROOT)]).returncode
    wheels = sorted(dest.glob("te_align-*.whl"))
    if rc or not wheels:
        raise SystemExit(f"trainer_envs: building te-align's wheel failed (exit {rc})")
    return wheels[-1]


def run_one(env: TrainerEnv, wheel: Path, venv: Path | None, checkout: Path | None) -> bool:
    t0 = time.monotonic()
    tmp = None
    if venv is None:
        tmp = Path(tempfile.mkdtemp(prefix=f"te-align-{env.name}-"))
        venv = tmp / "venv"
    python = venv / "bin" / "python"
    lines: list[str] = []
    ok = True
    try:
        base = find_python(env.python)
        if not python.exists():
            _run([base, "-m", "venv", str(venv)], check=True)
            _run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        reqs = Path(venv / "trainer-pins.txt")
        reqs.write_text("\n".join(env.pins) + "\n", encoding="utf-8")
        t_pins = time.monotonic()
        rc = _run([str(python), "-m", "pip", "install", "-q", env.torch, "-r", str(reqs)]).returncode
        if rc:
            print(f"{env.name}: installing the trainer's pins failed (exit {rc})")
            return False
        lines.append(f"trainer pins installed in {time.monotonic() - t_pins:.0f} s")
        before = _freeze(python)
        frozen = venv / "trainer-frozen.txt"
        frozen.write_text("".join(f"{n}=={v}\n" for n, v in sorted(before.items())
                                  if n not in ("pip", "setuptools", "wheel")), encoding="utf-8")
        t_te = time.monotonic()
        rc = _run([str(python), "-m", "pip", "install", "-q", "-c", str(frozen), str(wheel)]).returncode
        if rc:
            print(f"{env.name}: installing te-align without changing a pinned package failed (exit {rc})")
            return False
        lines.append(f"te-align installed in {time.monotonic() - t_te:.1f} s")
        after = _freeze(python)
        changed = sorted(n for n in before if n in after and after[n] != before[n])
        removed = sorted(n for n in before if n not in after)
        added = sorted(f"{n} {after[n]}" for n in after if n not in before)
        if changed or removed:
            ok = False
            lines.append("CHANGED trainer packages: " + ", ".join(
                [f"{n} {before[n]} -> {after.get(n, 'removed')}" for n in changed + removed]))
        else:
            lines.append("no package the trainer had changed; added: " + ", ".join(added))
        probe = _run([str(python), "-c", "import te_align, te_align.hooks, te_align.profiles; "
                      "print(te_align.__version__, te_align.__file__)"],
                     capture_output=True, text=True, cwd=tempfile.gettempdir())
        if probe.returncode:
            ok = False
            lines.append(f"import te_align FAILED: {probe.stderr.strip().splitlines()[-1:]}")
        else:
            lines.append(f"import te_align: {probe.stdout.strip()}")
        _run([str(python), "-m", "pip", "install", "-q", "-c", str(frozen), *TEST_TOOLS], check=True)
        if env.no_deps:
            _run([str(python), "-m", "pip", "install", "-q", "--no-deps", *env.no_deps], check=True)
        run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        run_env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                       PATH=f"{venv / 'bin'}{os.pathsep}{run_env.get('PATH', '')}")
        if env.checkout:
            run_env.pop(env.checkout, None)
            if checkout is not None:
                run_env[env.checkout] = str(checkout)
                if env.python_var:
                    run_env[env.python_var] = str(python)
        t_tests = time.monotonic()
        tests = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *env.tests], cwd=ROOT,
                     env=run_env, capture_output=True, text=True)
        sys.stdout.write(tests.stdout[-8000:])
        out_lines = [s for s in tests.stdout.splitlines() if s.strip()]
        summary = out_lines[-1].strip("= ") if out_lines else "(no pytest output)"
        ok &= tests.returncode == 0
        lines.append(f"tests ({time.monotonic() - t_tests:.0f} s, checkout "
                     f"{'set' if checkout and env.checkout else 'not set: its tests skip'}): {summary}")
        versions = ", ".join(f"{n} {after.get(n, '-')}" for n in ("torch", "transformers", "diffusers",
                                                                  "huggingface-hub", "accelerate", "peft"))
        print(f"\n=== te-align in {env.name}'s environment (Python {env.python}: {versions}) ===")
        print(f"pins: {env.source}")
        for line in lines:
            print(f"  {line}")
        print(f"result: {'PASS' if ok else 'FAIL'} in {time.monotonic() - t0:.0f} s")
        return ok
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    r = sub.add_parser("run")
    r.add_argument("trainer", nargs="?", help="a trainer (tools/trainer_envs/<trainer>.txt) or 'all'")
    r.add_argument("--rotate", action="store_true", help="the trainer this commit's turn names (CI)")
    r.add_argument("--venv", type=Path, help="build (or reuse) the environment here and keep it")
    r.add_argument("--checkout", type=Path, help="the trainer's checkout, for its checkout tests")
    args = ap.parse_args(argv)
    names = trainers()
    if args.cmd == "list":
        for n in names:
            e = load(n)
            print(f"{n:<12} Python {e.python:<5} {e.torch:<16} {len(e.pins)} pins; tests: {' '.join(e.tests)}")
        return 0
    if args.rotate:
        count = _run(["git", "rev-list", "--count", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        chosen = [names[int(count or 0) % len(names)]]
        print(f"trainer_envs: this run's turn (commit {count}, {len(names)} trainers in rotation): {chosen[0]}; "
              f"the others: python tools/trainer_envs.py run all")
    elif args.trainer == "all":
        chosen = names
    elif args.trainer:
        chosen = [args.trainer]
    else:
        ap.error("name a trainer, 'all' or --rotate")
    if (args.venv or args.checkout) and len(chosen) > 1:
        ap.error("--venv and --checkout go with one trainer")
    envs = [load(n) for n in chosen]
    with tempfile.TemporaryDirectory(prefix="te-align-wheel-") as d:
        wheel = build_wheel(Path(d))
        results = {e.name: run_one(e, wheel, args.venv, args.checkout) for e in envs}
    print("\ntrainer environments: " + ", ".join(f"{n} {'PASS' if ok else 'FAIL'}" for n, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
