"""What te-align's swap study measured, as ``te-align swap --report`` prints it. Imports no torch.

The study (issue 35; plan ``benchmarks/swap/bench_swap.md``, results ``docs/swap.md``) swapped the CLIP of te-align's SD 1.5
world base for the world's T5 with :func:`te_align.swap.swap` and fine-tuned the whole UNet plus the projection for
every reset mode, matched or unscaled output statistics and two learning rates, 3 seeds each. Its numbers and verdicts
ship as ``te_align/swap/data/study.json``, written by ``python benchmarks/swap/swap_study.py --dry-run`` from the committed
per-seed results once every unit is in; nothing here computes or rounds a number anew.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

__all__ = ["DOCUMENT", "SUMMARY", "report_lines", "summary"]

SUMMARY = Path(__file__).parent / "data" / "study.json"
DOCUMENT = "docs/swap.md"


@functools.cache
def summary() -> dict[str, Any] | None:
    """The shipped study summary, or None if this te-align ships none (the study not finished)."""
    if not SUMMARY.is_file():
        return None
    return json.loads(SUMMARY.read_text(encoding="utf-8"))


def _ci(values: list[float], digits: int = 2) -> str:
    mean, low, high = values
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _name(cell: dict[str, Any]) -> str:
    if cell["reset"] is None:
        return "baseline: CLIP, not swapped"
    scaling = {"std0.2": "std 0.2"}.get(cell["scaling"], cell["scaling"])
    return f"reset {cell['reset']}, {scaling}"


def report_lines(study: dict[str, Any] | None, *, base_std: float | None = None) -> list[str]:
    """The study part of ``te-align swap --report``: per learning rate the exact accuracy of every cell with its
    interval, the best measured setting and whether it is resolved from the next, and the claims' verdicts.
    ``base_std``: the user's base's measured conditioning std, set beside the study base's."""
    if study is None:
        return ["What the swap study measured: not shipped with this te-align (the study was not finished)."]
    out = [f"What te-align's swap study measured ({study['doc']}; plan {study['plan']}). Not your model: "
           f"{study['setup']}."]  # fmt: skip
    rates = sorted({c["lr"] for c in study["cells"]}, reverse=True)
    for lr in rates:
        out.append(f"  learning rate {lr:g}, exact accuracy at step {study['steps']}:")
        for cell in (c for c in study["cells"] if c["lr"] == lr):
            out.append(f"    {_name(cell):<30} {_ci(cell['exact'])}")
        best = study["best"].get(f"{lr:g}")
        if best:
            low, high = best["difference"][1:]
            verdict = "resolved" if best["resolved"] else "not resolved"
            nxt = next(c for c in study["cells"] if c["name"] == best["next"])
            out.append(f"    highest: reset {best['reset']}, {best['scaling']} ({_ci(best['exact'])}); against "
                       f"{_name(nxt)}: {best['difference'][0]:+.2f} [{low:+.2f}, {high:+.2f}], {verdict} "
                       f"at {study['seeds']} seeds")  # fmt: skip
    if study.get("caveats"):
        out.append("  bounds on these numbers:")
        out += [f"    {c}" for c in study["caveats"]]
    out.append("  the claims, read by rules fixed before the runs:")
    for key, claim in study["claims"].items():
        out.append(f"    {key} {claim['claim']}: {claim['verdict']}")
    std = f"  the study base's own conditioning std was {study['base_std']:.3f}"
    if base_std is not None:
        std += f"; yours (measured above) is {base_std:.3f}, and the output scale above matches it"
    out.append(std + ".")
    return out
