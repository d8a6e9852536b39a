"""Is a remade run the run that was logged? Compare two ``log.jsonl`` files of ``tools/world_build.py`` record by record.

    python benchmarks/klein/same_log.py benchmarks/klein/runs/encoders-klein/log.jsonl RUNS/encoders-klein/log.jsonl

Every record but the ``config`` one (it names the machine's folders) is compared on all its fields but wall-clock
ones (``time``, ``seconds``, ``train_seconds``): training losses, gradient norms and learning rates, the denoiser's
autoencoder statistics, gap and evaluation records, the final held-out reads. Records are matched by phase and step
(a record without a step by its phase; where a resumed run wrote one again, the last written stands, as the run
itself goes on from it); a record only one log has reached is counted, not compared, so a remade run still going can
be checked against the committed log. Prints how many records
were compared and the first that differ; exits 1 when any differs, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

CLOCK = frozenset({"time", "seconds", "train_seconds"})


def records(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """``(phase, step) -> record without its clock fields``; a record without a step has step -1."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"same_log.py: {path} line {n} is not JSON ({exc.msg})") from None
        phase = str(rec.get("phase", ""))
        if phase != "config":
            out[(phase, int(rec.get("step", -1)))] = {k: v for k, v in rec.items() if k not in CLOCK}
    return out


def compare(a: Path, b: Path) -> tuple[int, int, list[str]]:
    """(records compared, records only one log has, differences as lines)."""
    ra, rb = records(a), records(b)
    both = sorted(set(ra) & set(rb), key=lambda k: (k[1] < 0, k[1], k[0]))
    diffs = [f"{phase} step {step}: {ra[(phase, step)]} != {rb[(phase, step)]}"
             for phase, step in both if ra[(phase, step)] != rb[(phase, step)]]  # fmt: skip
    return len(both), len(set(ra) ^ set(rb)), diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logged", type=Path, help="the committed log")
    ap.add_argument("remade", type=Path, help="the remade run's log")
    args = ap.parse_args(argv)
    for p in (args.logged, args.remade):
        if not p.is_file():
            print(f"same_log.py: {p}: no such log", file=sys.stderr)
            return 2
    n, alone, diffs = compare(args.logged, args.remade)
    print(f"{n} records compared, {len(diffs)} differ; {alone} in one log only (not reached by the other)")
    for line in diffs[:5]:
        print(line[:400])
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
