"""Threads vs a busy machine: the demo's wall time with te-align's thread choice and with torch's default.

    python benchmarks/demo/bench_threads.py [--steps 30] [--rounds 3]

Each run is a fresh ``te-align demo`` process (``TE_ALIGN_DEMO_STEPS`` steps, one seed, a fresh output folder).
Two conditions: the machine as it is ("free"), and with one core held by a busy process this script starts
("one core busy"; the situation in which the demo once took 16.7 min instead of 25 s). Two arms, run alternately in
each round so that drift in the machine's load hits both: te-align's choice (``train.threads = 0``: one thread for
the tiny model) and two threads (``TE_ALIGN_THREADS=2``, torch's default on 2 cores). Prints the median wall time
per condition and arm and the ratio two threads / te-align's choice measured side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_demo import run_te_align  # benchmarks/ is this script's folder

ARMS = {"te-align's choice (1 thread)": {}, "2 threads (torch default)": {"TE_ALIGN_THREADS": "2"}}


def _demo(steps: int, env_extra: dict[str, str], out: Path) -> float:
    extra = {"TE_ALIGN_DEMO_STEPS": str(steps), "TE_ALIGN_DEMO_SEEDS": "1", **env_extra}
    return run_te_align(["demo", "--out", str(out)], 0, out.parent, extra)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} usable core(s); load average at start {os.getloadavg()[0]:.2f}; demo with {args.steps} steps, "
          f"1 seed; {args.rounds} rounds")  # fmt: skip
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for condition in ("free", "one core busy"):
            busy = None
            if condition == "one core busy":
                busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(2)
            try:
                for r in range(args.rounds):
                    order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
                    for arm in order:
                        out = Path(tmp) / f"{condition}-{arm[:4]}-{r}"
                        wall = _demo(args.steps, ARMS[arm], out)
                        results.setdefault((condition, arm), []).append(wall)
                        print(f"  {condition:<14} {arm:<30} round {r}: {wall:6.1f} s", flush=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    print(f"\n| condition | {' | '.join(ARMS)} | 2 threads / te-align's choice |")
    print("|---|---|---|---|")
    for condition in ("free", "one core busy"):
        med = [statistics.median(results[(condition, arm)]) for arm in ARMS]
        print(f"| {condition} | {med[0]:.1f} s | {med[1]:.1f} s | {med[1] / med[0]:.2f}x |")


if __name__ == "__main__":
    main()
