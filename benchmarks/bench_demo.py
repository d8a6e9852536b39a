"""Wall time and peak memory of ``te-align demo`` (the README's main job), and of the whole matrix.

    python benchmarks/bench_demo.py [--threads 2] [--matrix]

Runs ``te-align demo`` in a fresh process (a fresh output folder, so nothing is reused) with
``OMP_NUM_THREADS`` = ``--threads`` and prints its wall time, the peak resident memory of the process
(``ru_maxrss`` of the child) and the verdict line of its report. The target is 5 minutes on 2 CPU cores.
``--matrix`` times ``te-align ab matrix`` the same way.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(args: list[str], threads: int, cwd: Path) -> tuple[float, float, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "te_align", *args], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, peak_mb, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--matrix", action="store_true", help="also time te-align ab matrix")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        wall, peak, out = _run(["demo", "--out", str(root / "demo")], args.threads, root)
        verdict = next((line for line in (root / "demo" / "report.md").read_text(encoding="utf-8").splitlines()
                        if line.startswith("**Verdict")), "")  # fmt: skip
        print(f"te-align demo: {wall:.0f} s wall ({wall / 60:.1f} min; target 5 min), peak RSS {peak:.0f} MB, "
              f"{args.threads} thread(s)")  # fmt: skip
        print(f"  {verdict}")
        if args.matrix:
            wall, peak, out = _run(["ab", "matrix", "--out", str(root / "matrix")], args.threads, root)
            print(f"te-align ab matrix: {wall / 60:.1f} min wall, peak RSS {peak:.0f} MB, {args.threads} thread(s)")
            print(out[-3000:])


if __name__ == "__main__":
    main()
