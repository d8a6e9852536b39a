"""Compare the lent machine's lost run (amendment 6) with the reruns committed in benchmarks/effects/results.

The lost run's log keeps, per unit, both arms' primary metric to three decimals; each rerun's result file keeps the
same metric in full. Prints how many of the log's units the reruns reproduce exactly at the log's precision and the
largest difference of A - B.

    python benchmarks/effects/effects_rerun_check.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent
LINE = re.compile(r"\[\d+/\d+\] (\S+) seed (\d+): primary A ([+-][\d.]+), B ([+-][\d.]+)")


def main() -> None:
    units = same = 0
    worst = 0.0
    for line in (ROOT / "device-run-lost" / "log.txt").read_text(encoding="utf-8").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        row, seed, a, b = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4))
        arms = json.loads((ROOT / "results" / row / f"seed-{seed}.json").read_text(encoding="utf-8"))["arms"]
        ra, rb = round(arms["A"]["curve_mean"], 3), round(arms["B"]["curve_mean"], 3)
        units += 1
        same += ra == a and rb == b
        worst = max(worst, abs((ra - rb) - (a - b)))
    print(f"{units} units of the lost run; the rerun reproduces both arms' primary metric (3 decimals) in {same}; "
          f"largest |difference of A - B| {worst:.3f}")


if __name__ == "__main__":
    main()
