"""Apply amendment 13's gate (step 2, reapplied by the addendum's rule 2) to the encoder probes' diagnosis files.

    python benchmarks/klein/gate13.py klein-13a-remade klein-13b-remade

Reads each label's ``encoder-probe-seed2-LABEL-diagnosis.json`` in ``benchmarks/base_eval/diagnostic/`` (written by
``encoder_probe.py --klein ... --label LABEL --seed 2 --diagnose``). An encoder passes when the better probe (mean or
attention) of its **official taps** names the colour of at least 570 and the position of at least 480 of the 600
prompts. Of those that pass, the one with the larger sum of the two counts is chosen; on a tie the first label named
(13a, as the amendment says). Prints one line per encoder and the choice, and exits 0 with a choice, 1 when none
passes (then no denoiser runs), 2 on a missing or malformed file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIAGNOSTIC = ROOT / "benchmarks" / "base_eval" / "diagnostic"
TAPS = "official (9, 18, 27)"
BARS = {"colour": 570, "position": 480}
PROMPTS = 600


def read(label: str, folder: Path = DIAGNOSTIC) -> dict[str, int]:
    """The better probe's count of right prompts at the official taps, per attribute gated."""
    path = folder / f"encoder-probe-seed2-{label}-diagnosis.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("seed") != 2 or data.get("prompts") != PROMPTS:
        raise ValueError(f"{path}: expected seed 2 and {PROMPTS} prompts, found seed {data.get('seed')!r} "
                         f"and {data.get('prompts')!r} prompts")
    return {attr: max(int(probe["correct"]) for probe in data["read"][attr][TAPS].values()) for attr in BARS}


def passes(count: dict[str, int]) -> bool:
    return all(count[attr] >= bar for attr, bar in BARS.items())


def choose(counts: dict[str, dict[str, int]]) -> str | None:
    """The label chosen by the rule (insertion order breaks a tie), or None when no encoder passes."""
    passing = [label for label, c in counts.items() if passes(c)]
    if not passing:
        return None
    return max(passing, key=lambda label: (sum(counts[label].values()), -passing.index(label)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labels", nargs="+", help="the gate files' labels, in tie-break order")
    ap.add_argument("--folder", type=Path, default=DIAGNOSTIC, help="where the diagnosis files are")
    args = ap.parse_args(argv)
    counts: dict[str, dict[str, int]] = {}
    for label in args.labels:
        try:
            counts[label] = read(label, args.folder)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"gate13: {label}: cannot read its diagnosis file ({exc.__class__.__name__}: {exc})", file=sys.stderr)
            return 2
    for label, c in counts.items():
        verdict = "passes" if passes(c) else "misses"
        print(f"{label}: colour {c['colour']}/{PROMPTS} (>= {BARS['colour']}), position {c['position']}/{PROMPTS} "
              f"(>= {BARS['position']}), sum {sum(c.values())}: {verdict}")
    chosen = choose(counts)
    print(f"chosen: {chosen}" if chosen else "chosen: none (no denoiser runs; the base is not reached)")
    return 0 if chosen else 1


if __name__ == "__main__":
    sys.exit(main())
