"""Summarise ``tools/world_build.py base`` logs: conditioning gap and held-out accuracy against samples seen.

    python benchmarks/learnability/learnability_table.py RUN/log.jsonl [RUN2/log.jsonl ...] [--gaps]

One markdown row per evaluation (``phase: eval``): steps, samples seen, training seconds, the conditioning gap
logged at that step (t = 0.3 / 0.6 / 0.9), and colour / shape / position / objects exact on the visible held-out
prompts (every object described inside a conditioning window) with their count, objects exact over all prompts
and spurious objects per image. ``--gaps`` also prints every logged gap. Reads only the logs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def pct(x: object) -> str:
    return "" if x is None else f"{100 * float(x):.1f}%"  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--gaps", action="store_true")
    args = ap.parse_args()
    print("| run | step | samples | train s | gap t=0.3 | gap t=0.6 | gap t=0.9 | colour | shape | position | objects exact "
          "| visible prompts | objects exact (all) | spurious/img |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    gap_lines = []
    for log in args.logs:
        path = Path(log)
        rs = records(path)
        run = path.parent.name
        gaps = {r["step"]: r for r in rs if r.get("phase") == "gap"}
        for r in rs:
            if r.get("phase") != "eval":
                continue
            g = gaps.get(r["step"], {})
            v = r.get("visible") or {}
            a = r["all"]
            print(f"| {run} | {r['step']} | {r.get('samples', '')} | {r['train_seconds']:.0f} | "
                  f"{g.get('t0.3', '')} | {g.get('t0.6', '')} | {g.get('t0.9', '')} | {pct(v.get('colour'))} | "
                  f"{pct(v.get('shape'))} | {pct(v.get('position'))} | {pct(v.get('object_accuracy'))} | "
                  f"{int(v.get('prompts', 0))} | {pct(a['object_accuracy'])} | {a['extra_per_image']:.2f} |")  # fmt: skip
        if args.gaps:
            gap_lines.append(f"{run} gaps (step: t=0.3 / 0.6 / 0.9, %): " + "; ".join(
                f"{s}: {g['t0.3']:+.2f} / {g['t0.6']:+.2f} / {g['t0.9']:+.2f}" for s, g in sorted(gaps.items())))  # fmt: skip
    for line in gap_lines:
        print(f"\n{line}")


if __name__ == "__main__":
    main()
