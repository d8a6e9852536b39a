"""The power table of benchmarks/klein/bench_klein.md section 3: the smallest detectable effect per unit of the null's
noise, by the effects study's own formula (te_align.ab.stats.smallest_detectable, 80% power, two-sided 0.05 divided
by the Holm family's size at its first step).

    python benchmarks/klein/klein_power.py [--sd 0.17]

``--sd`` also prints the effect itself for a given standard deviation of one seed's paired difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from te_align.ab.stats import smallest_detectable

FAMILIES = {"unadjusted": 1, "Holm, 3 rows": 3, "Holm, all 21 rows": 21}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sd", type=float, default=None, help="a noise standard deviation to scale the table by")
    args = ap.parse_args()
    print("| seeds n | " + " | ".join(FAMILIES) + " |")
    print("| ---: |" + " ---: |" * len(FAMILIES))
    for n in (6, 10, 12):
        cells = []
        for k in FAMILIES.values():
            m = smallest_detectable(1.0, n, 0.05 / k)
            cells.append(f"{m:.3f} s" + (f" = {m * args.sd:.2f}" if args.sd is not None else ""))
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
