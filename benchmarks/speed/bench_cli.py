"""Cold-start time of CLI commands that need no model, next to ``python -c pass``.

Run: ``python benchmarks/speed/bench_cli.py [--runs N]``. Prints the median whole-process wall time of each
command and its ratio to a bare interpreter start. Target: ``te-align profile show NAME`` < 0.5 s.

``--baseline-ref REV`` compares this checkout with revision ``REV`` side by side in one run: REV is
checked out into a temporary ``git worktree`` (removed afterwards), and every timed run alternates
between the two checkouts (each run starting with the other side than the run before), so drift in
machine load hits both equally. It prints both medians per command and the ratio after/before
(this checkout / REV; below 1 is faster). Each side runs its own ``te_align`` via ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK_EXAMPLE = str(Path("examples") / "kohya" / "sdxl_typo.toml")

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "te-align --help": ["-m", "te_align", "--help"],
    "te-align profile show sd35-large": ["-m", "te_align", "profile", "show", "sd35-large"],
    "te-align profile list": ["-m", "te_align", "profile", "list"],
    "te-align check kohya/sdxl_typo.toml": ["-m", "te_align", "check", CHECK_EXAMPLE],
}
#: The commands compared against a baseline revision (the cold paths the re-layout must not slow down).
COMPARED = ("python -c pass", "te-align --help", "te-align profile show sd35-large",
            "te-align check kohya/sdxl_typo.toml")


def wall(args: list[str], checkout: Path) -> float:
    """Whole-process wall time of ``python ARGS`` run in ``checkout`` with its own te_align first on the path."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, *args], cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    if out.returncode not in (0, 1):  # `check` exits 1 when the config deviates from the profile
        raise SystemExit(f"{' '.join(args)} failed in {checkout} (exit {out.returncode}):\n{out.stderr.decode()[-2000:]}")
    return elapsed


def run_alone(runs: int) -> None:
    results = {}
    for name, args in COMMANDS.items():
        wall(args, ROOT)  # warm the OS file cache and the bytecode cache
        results[name] = statistics.median(wall(args, ROOT) for _ in range(runs))
    base = results["python -c pass"]
    print(f"{'command':<40}{'median s':>10}{'x python':>10}")
    for name, t in results.items():
        print(f"{name:<40}{t:>10.3f}{t / base:>10.1f}")
    show = results["te-align profile show sd35-large"]
    print(f"\nprofile show target < 0.5 s: {'met' if show < 0.5 else 'MISSED'} ({show:.3f} s)")


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def run_against(ref: str, runs: int) -> None:
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    here = _git("rev-parse", "--short", "HEAD")
    tmp = Path(tempfile.mkdtemp(prefix="te-align-bench-"))
    baseline = tmp / "baseline"
    _git("worktree", "add", "--detach", str(baseline), commit)
    try:
        sides = {"before": baseline, "after": ROOT}
        times: dict[str, dict[str, list[float]]] = {name: {"before": [], "after": []} for name in COMPARED}
        for name in COMPARED:
            for checkout in sides.values():
                wall(COMMANDS[name], checkout)  # warm both sides first
        for i in range(runs):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for name in COMPARED:
                for side in order:
                    times[name][side].append(wall(COMMANDS[name], sides[side]))
    finally:
        _git("worktree", "remove", "--force", str(baseline))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"before = {ref} ({commit[:9]}), after = this checkout (HEAD {here}, working tree); {runs} alternating runs each")
    print(f"{'command':<40}{'before s':>10}{'after s':>10}{'after/before':>14}")
    for name in COMPARED:
        before, after = (statistics.median(times[name][s]) for s in ("before", "after"))
        print(f"{name:<40}{before:>10.3f}{after:>10.3f}{after / before:>14.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline-ref", metavar="REV", help="compare with this git revision (e.g. a commit before a change)")
    args = ap.parse_args()
    if args.baseline_ref:
        run_against(args.baseline_ref, args.runs)
    else:
        run_alone(args.runs)


if __name__ == "__main__":
    main()
