"""The power table of benchmarks/klein/bench_klein.md section 3: the smallest detectable effect per unit of the null's
noise, by the effects study's own formula (te_align.ab.stats.smallest_detectable, 80% power, two-sided 0.05 divided
by the Holm family's size at its first step).

    python benchmarks/klein/klein_power.py [--sd 0.17]
    python benchmarks/klein/klein_power.py --null benchmarks/effects/results/world-klein-null

``--sd`` also prints the effect itself for a given standard deviation of one seed's paired difference. ``--null``
takes that spread from the null control's committed per-seed results: instrument 2 (concept net accuracy at the last
checkpoint, arm A minus arm B) of seeds 0-5, their sample standard deviation s, and amendment 12's rule on it (10
seeds when the Holm-3 smallest detectable effect at 6 seeds exceeds 0.20); it refuses fewer than the 6 planned seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from te_align.ab.stats import smallest_detectable

FAMILIES = {"unadjusted": 1, "Holm, 3 rows": 3, "Holm, all 21 rows": 21}
#: amendment 12: above this smallest detectable effect (Holm over the 3 klein rows, 6 seeds) every klein unit runs 10 seeds
RULE = 0.20
PLANNED = range(6)


def null_spread(folder: Path) -> tuple[list[float], float]:
    """The null control's per-seed instrument-2 differences (A - B, seeds 0-5, in seed order) and their sample sd."""
    diffs = []
    for seed in PLANNED:
        path = folder / f"seed-{seed}.json"
        if not path.is_file():
            raise SystemExit(f"klein_power.py --null: {path} is missing (the rule reads all 6 planned seeds)")
        arms = json.loads(path.read_text(encoding="utf-8"))["arms"]
        diffs.append(float(arms["A"]["curve"][-1][1]["net"]) - float(arms["B"]["curve"][-1][1]["net"]))
    return diffs, statistics.stdev(diffs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sd", type=float, default=None, help="a noise standard deviation to scale the table by")
    ap.add_argument("--null", type=Path, default=None, help="the null control's results folder: s from its 6 seeds")
    args = ap.parse_args()
    if args.null is not None:
        diffs, args.sd = null_spread(args.null)
        print(f"null control instrument 2, A - B by seed: {', '.join(f'{d:+.4f}' for d in diffs)}; s = {args.sd:.4f}")
    print("| seeds n | " + " | ".join(FAMILIES) + " |")
    print("| ---: |" + " ---: |" * len(FAMILIES))
    for n in (6, 10, 12):
        cells = []
        for k in FAMILIES.values():
            m = smallest_detectable(1.0, n, 0.05 / k)
            cells.append(f"{m:.3f} s" + (f" = {m * args.sd:.2f}" if args.sd is not None else ""))
        print(f"| {n} | " + " | ".join(cells) + " |")
    if args.null is not None:
        holm3 = smallest_detectable(1.0, 6, 0.05 / 3) * args.sd
        print(f"amendment 12's rule: Holm-3 smallest detectable effect at 6 seeds {holm3:.3f} "
              + (f"> {RULE:.2f}: every klein row and both controls run 10 seeds (seeds 6-9 added, controls first)"
                 if holm3 > RULE else f"<= {RULE:.2f}: 6 seeds"))  # fmt: skip


if __name__ == "__main__":
    main()
