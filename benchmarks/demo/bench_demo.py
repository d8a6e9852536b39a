"""Wall time and peak memory of ``te-align demo`` (the README's main job), run as a user runs it.

    python benchmarks/demo/bench_demo.py [--rounds 1] [--busy] [--threads N] [--matrix]
    python benchmarks/demo/bench_demo.py --load [--keep DIR] [--record FILE]

Each round is a fresh ``te-align demo`` process in a fresh output folder (nothing reused), offline, with the
thread environment variables removed so that te-align picks its threads as it does for a user (``--threads N``
sets ``TE_ALIGN_THREADS`` instead). ``--busy`` also runs every round with one core held by a spinning process
(the situation in which the demo once took 16.7 min). Prints the load average at the start, each wall time, the
peak resident memory of the demo process (``ru_maxrss``) and the verdict line of its report.
``--matrix`` times ``te-align ab matrix`` the same way.

``--load`` is the README's time: one fresh ``te-align demo`` (te-align's thread choice) with the machine's load
recorded beside its wall time: the usable cores, the load average (1 and 5 minutes) at the start and the end, and the
1-minute load average sampled every 5 s while it runs, less the demo's own share (one busy thread), so that the
time can be said as "on a free N-core machine" or "loaded". ``--record FILE`` appends the measurement as one JSON
line; ``--keep DIR`` keeps the demo's output folder (its report, for ``tools/report_screenshot.sh``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TE_ALIGN_THREADS")


def run_te_align(
    args: list[str], threads: int, cwd: Path, extra: dict[str, str] | None = None
) -> tuple[float, float, str]:
    """One fresh te-align process, offline, with the thread variables removed (``threads``: TE_ALIGN_THREADS, 0
    for te-align's choice) and ``extra`` set: (wall seconds, the peak RSS of a child in MB, stdout)."""
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARS}
    env["HF_HUB_OFFLINE"] = "1"
    if threads:
        env["TE_ALIGN_THREADS"] = str(threads)
    env.update(extra or {})
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "te_align", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    # ru_maxrss of children is the largest of any child so far: a later, smaller run reports the earlier peak
    peak_mb = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    return wall, peak_mb, proc.stdout


def run_with_load(args: list[str], cwd: Path, every: float = 5.0) -> dict[str, object]:
    """One fresh te-align process (te-align's thread choice, offline) with the machine's load sampled while it runs:
    the measurement ``--load`` prints and records."""
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARS}
    env["HF_HUB_OFFLINE"] = "1"
    cores = len(os.sched_getaffinity(0))
    started = datetime.datetime.now(datetime.timezone.utc)
    start = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "te_align", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    samples: list[float] = []
    while True:
        try:
            out, err = proc.communicate(timeout=every)
            break
        except subprocess.TimeoutExpired:
            samples.append(os.getloadavg()[0])
    wall = time.perf_counter() - t0
    end = os.getloadavg()
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{out[-2000:]}\n{err[-2000:]}")
    mean_load = statistics.fmean(samples) if samples else end[0]
    others = max(0.0, mean_load - 1.0)  # the demo keeps about one thread busy itself
    return {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "te-align " + " ".join(args),
        "cores": cores,
        "cpu": platform.processor() or platform.machine(),
        "load_start": [round(v, 2) for v in start[:2]],
        "load_end": [round(v, 2) for v in end[:2]],
        "load_mean_1min": round(mean_load, 2),
        "load_of_others": round(others, 2),
        "condition": "free" if others < 0.5 else "loaded",
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024),
        "verdict": next((ln for ln in out.splitlines() if ln.startswith("verdict:")), "(no verdict line)"),
        "progress_lines": len(err.splitlines()),
        "stderr": err,
    }


def _load_main(keep: str | None, record: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(keep).resolve() if keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        m = run_with_load(["demo"], root)  # into root/te-align-demo, as the README runs it
        if keep:  # the progress lines as a user saw them (stderr, not a terminal)
            (root / "te-align-demo" / "progress.txt").write_text(str(m["stderr"]), encoding="utf-8")
        m.pop("stderr")
    print(f"te-align demo: {m['wall_s']} s ({float(m['wall_s']) / 60:.1f} min) on {m['cores']} core(s), "  # type: ignore[arg-type]
          f"{m['condition']}: load average {m['load_start'][0]} at the start, {m['load_end'][0]} at the end, "  # type: ignore[index]
          f"{m['load_mean_1min']} on average while it ran ({m['load_of_others']} from other processes); "
          f"peak RSS {m['peak_rss_mb']} MB; {m['progress_lines']} progress line(s) on stderr")  # fmt: skip
    print(m["verdict"])
    if record:
        with open(record, "a", encoding="utf-8") as f:
            f.write(json.dumps(m) + "\n")


def _verdict(report: Path) -> str:
    lines = report.read_text(encoding="utf-8").splitlines() if report.is_file() else []
    return next((line for line in lines if line.startswith("**Verdict")), "(no verdict line)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--busy", action="store_true", help="also run each round with one core held busy")
    ap.add_argument(
        "--threads", type=int, default=0, help="TE_ALIGN_THREADS for the demo (0: te-align's choice)"
    )
    ap.add_argument("--matrix", action="store_true", help="also time te-align ab matrix")
    ap.add_argument("--load", action="store_true", help="one demo with the machine's load recorded (the README's time)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="with --load: keep the demo's output in DIR")
    ap.add_argument("--record", default=None, metavar="FILE", help="with --load: append the measurement as a JSON line")
    args = ap.parse_args()
    if args.load:
        _load_main(args.keep, args.record)
        return
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} usable core(s); load average at start {os.getloadavg()[0]:.2f}; threads: "
          f"{args.threads or 'te-align choice'}")  # fmt: skip
    conditions = ["as the machine is", "one core busy"] if args.busy else ["as the machine is"]
    walls: dict[str, list[float]] = {}
    peak = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            for condition in conditions if r % 2 == 0 else list(reversed(conditions)):
                busy = (
                    subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    if condition != conditions[0]
                    else None
                )
                try:
                    out = root / f"demo-{r}-{len(walls.get(condition, []))}-{condition[:3]}"
                    wall, peak, _ = run_te_align(["demo", "--out", str(out)], args.threads, root)
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
                walls.setdefault(condition, []).append(wall)
                print(f"  round {r} {condition:<18} {wall:6.1f} s ({wall / 60:.1f} min), load now "
                      f"{os.getloadavg()[0]:.2f}; {_verdict(out / 'ab' / 'report.md')}", flush=True)  # fmt: skip
        print(f"\npeak RSS of a demo process: {peak:.0f} MB")
        for condition, ws in walls.items():
            print(f"te-align demo, {condition}: median {statistics.median(ws):.1f} s over {len(ws)} run(s)")
        if args.matrix:
            wall, mpeak, out = run_te_align(
                ["ab", "matrix", "--out", str(root / "matrix")], args.threads, root
            )
            print(f"te-align ab matrix: {wall / 60:.1f} min wall, peak RSS {mpeak:.0f} MB")
            print(out[-3000:])


if __name__ == "__main__":
    main()
