"""Cold-start time of ``te-align check`` on one config (and of ``check --fix``, which writes a fixed copy each
run), next to ``python -c pass``.

Run: ``python benchmarks/speed/bench_check.py [--runs N]``. Prints the median whole-process wall time of each
command and its ratio to a bare interpreter start. Target: ``te-align check CONFIG`` < 1 s (no torch).
The in-process time per file over every config the trainers ship (target: median < 0.5 s on one core) is
measured by ``taskset -c 0 python tools/check_corpus.py`` with trainer checkouts.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EX = Path(__file__).resolve().parents[2] / "examples"
CHECK = [sys.executable, "-m", "te_align", "check"]
COMMANDS = {
    "python -c pass": ([sys.executable, "-c", "pass"], 0),
    "check kohya/flux_schnell_lora.toml": ([*CHECK, str(EX / "kohya" / "flux_schnell_lora.toml")], 1),
    "check ai-toolkit/flux_schnell_lora.yaml": ([*CHECK, str(EX / "ai-toolkit" / "flux_schnell_lora.yaml")], 1),
    "check simpletuner/sd3_config.json": ([*CHECK, str(EX / "simpletuner" / "sd3_config.json")], 1),
    "check onetrainer/flux_lora.json --json": ([*CHECK, str(EX / "onetrainer" / "flux_lora.json"), "--json"], 1),
    "check 2 files (kohya + kohya-gui)": (
        [*CHECK, str(EX / "kohya" / "flux_dev_aligned.toml"), str(EX / "kohya-gui" / "sdxl_lora.json")], 1),
}


#: ``check --fix`` on a fresh copy of a config each run (the copy is made outside the timed part): it writes.
FIX_COPY = Path(tempfile.mkdtemp(prefix="bench-check-fix-")) / "flux_schnell_lora.toml"
FIXES = {
    "check --fix kohya/flux_schnell_lora.toml": ([*CHECK, str(FIX_COPY), "--fix", "--no-backup"], 0,
                                                 EX / "kohya" / "flux_schnell_lora.toml"),
}


def wall(cmd: list[str], expect: int, fresh: Path | None = None) -> float:
    if fresh is not None:
        shutil.copy(fresh, FIX_COPY)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    t = time.perf_counter() - t0
    if rc != expect:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}, expected {expect}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    results = {}
    for name, (cmd, expect) in COMMANDS.items():
        wall(cmd, expect)  # warm the OS file cache
        results[name] = statistics.median(wall(cmd, expect) for _ in range(args.runs))
    for name, (cmd, expect, fresh) in FIXES.items():
        wall(cmd, expect, fresh)
        results[name] = statistics.median(wall(cmd, expect, fresh) for _ in range(args.runs))
    base = results["python -c pass"]
    print(f"{'command':<42}{'median s':>10}{'x python':>10}")
    for name, t in results.items():
        print(f"{name:<42}{t:>10.3f}{t / base:>10.1f}")
    worst = max(t for n, t in results.items() if n.startswith("check"))
    print(f"\ncheck target < 1 s: {'met' if worst < 1.0 else 'MISSED'} (slowest {worst:.3f} s)")


if __name__ == "__main__":
    main()
