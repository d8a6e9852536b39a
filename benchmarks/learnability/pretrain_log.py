"""Summarise a ``tools/world_build.py base`` run's ``log.jsonl``: conditioning gap and held-out accuracy against steps.

    python benchmarks/learnability/pretrain_log.py RUN/log.jsonl [--markdown]

One row per logged step that has a conditioning gap (``phase: gap``) or an evaluation (``phase: eval``):
training seconds so far, the last logged loss, the gap at each noise level, and the evaluation's objects
exact and per-attribute accuracy. Reads only the log; nothing is recomputed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(path: Path) -> list[dict]:
    by_step: dict[int, dict] = {}
    loss: dict[int, float] = {}
    seconds = 0.0
    # each training call (between gap / evaluation points) restarts its clock: sum the finished calls
    # (a resumed run starts from the checkpoint's total); eval records carry the run's own total
    offset = 0.0
    last = 0.0
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        phase, step = r.get("phase"), r.get("step")
        if phase == "resume":
            offset, last = float(r.get("train_seconds", 0.0)), 0.0
        elif phase == "transformer":
            if r["seconds"] < last:
                offset += last
            last = r["seconds"]
            loss[step] = r["loss"]
            seconds = offset + last
        elif phase == "gap":
            row = by_step.setdefault(step, {"step": step})
            row.update({k: v for k, v in r.items() if k.startswith("t") and k != "time"})
            row.setdefault("seconds", seconds)
        elif phase == "eval":
            row = by_step.setdefault(step, {"step": step})
            a = r["all"]
            row.update(seconds=r["train_seconds"], objects=a["object_accuracy"], colour=a["colour"], shape=a["shape"],
                       position=a["position"])  # fmt: skip
    out = []
    for step in sorted(by_step):
        row = by_step[step]
        near = [s for s in loss if s <= step]
        row["loss"] = loss[max(near)] if near else float("nan")
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", type=Path)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    data = rows(args.log)
    gaps = sorted({k for r in data for k in r if k.startswith("t")}, key=lambda k: float(k[1:]))
    head = [
        "step",
        "train s",
        "loss",
        *[f"gap % {k[0]}={k[1:]}" for k in gaps],
        "objects",
        "colour",
        "shape",
        "position",
    ]
    lines = []
    for r in data:
        cells = [f"{r['step']}", f"{r.get('seconds', float('nan')):.0f}", f"{r['loss']:.3f}"]
        cells += [f"{r[k]:+.2f}" if k in r else "" for k in gaps]
        cells += [f"{100 * r[k]:.1f}%" if k in r else "" for k in ("objects", "colour", "shape", "position")]
        lines.append(cells)
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(" ---: " for _ in head) + "|")
        for c in lines:
            print("| " + " | ".join(c) + " |")
    else:
        print("  ".join(f"{h:>12}" for h in head))
        for c in lines:
            print("  ".join(f"{x:>12}" for x in c))


if __name__ == "__main__":
    main()
