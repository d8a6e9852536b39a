"""Cold-start time of CLI commands that need no model, next to ``python -c pass``.

Run: ``python benchmarks/bench_cli.py [--runs N]``. Prints the median whole-process wall time of each
command and its ratio to a bare interpreter start. Target: ``te-align profile show NAME`` < 0.5 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "te-align --help": [sys.executable, "-m", "te_align", "--help"],
    "te-align profile show sd35-large": [sys.executable, "-m", "te_align", "profile", "show", "sd35-large"],
    "te-align profile list": [sys.executable, "-m", "te_align", "profile", "list"],
}


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    results = {}
    for name, cmd in COMMANDS.items():
        wall(cmd)  # warm the OS file cache
        results[name] = statistics.median(wall(cmd) for _ in range(args.runs))
    base = results["python -c pass"]
    print(f"{'command':<36}{'median s':>10}{'x python':>10}")
    for name, t in results.items():
        print(f"{name:<36}{t:>10.3f}{t / base:>10.1f}")
    show = results["te-align profile show sd35-large"]
    print(f"\nprofile show target < 0.5 s: {'met' if show < 0.5 else 'MISSED'} ({show:.3f} s)")


if __name__ == "__main__":
    main()
