"""Per seed and curve checkpoint, both arms' concept readings of an effects-matrix row, from its committed results.

    python benchmarks/effects/effects_curve.py ROW [--results benchmarks/effects/results]

Prints hit (pink at the asked position, of the concept prompts), false (pink where another colour was asked) and net
(hit - false) of arm A and arm B at each checkpoint, the primary metric (the curve mean of net) and A - B of net at
each checkpoint with its mean over the seeds. The numbers amendment 11 of benchmarks/effects/bench_effects.md cites.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("row")
    ap.add_argument("--results", type=Path, default=ROOT)
    a = ap.parse_args(argv)
    diffs: dict[int, list[float]] = {}
    for f in sorted((a.results / a.row).glob("seed-*.json"), key=lambda f: int(f.stem.split("-")[1])):
        rec = json.loads(f.read_text(encoding="utf-8"))
        arms = rec["arms"]
        for arm in ("A", "B"):
            cells = " ".join(f"{s}: {m['hit']:.3f}/{m['false']:.3f}/{m['net']:+.3f}" for s, m in arms[arm]["curve"])
            print(f"seed {rec['seed']} arm {arm} (step: hit/false/net) {cells}  curve mean {arms[arm]['curve_mean']:+.4f}")
        for (s, ma), (_, mb) in zip(arms["A"]["curve"], arms["B"]["curve"], strict=True):
            diffs.setdefault(int(s), []).append(ma["net"] - mb["net"])
    for s, d in sorted(diffs.items()):
        per = ", ".join(f"{x:+.3f}" for x in d)
        print(f"A - B of net at step {s}: {per}; mean {statistics.fmean(d):+.4f}, A < B in {sum(x < 0 for x in d)} of {len(d)}")


if __name__ == "__main__":
    main()
