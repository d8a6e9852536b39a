"""What the committed effects matrix measured about a ``te-align check`` finding. Imports no torch, and nothing of
:mod:`te_align.ab` (the severity policy, :mod:`te_align.audit.policy`, reads it for every trainer's findings;
``te_align.ab.evidence`` re-exports it).

Each measured row of ``docs/effects.md`` is one trainer deviation (or inference-tool default) A/B'd on a shipped
world base. :data:`MEASURES` says which check finding each row measures: the profile family (or profile) it was
measured on, the finding's setting and the trainer's value. :func:`evidence_for` returns, for one finding, the
row with its verdict, difference and interval read from the summary shipped with te-align
(``te_align/ab/data/effects.json``, written by ``te-align ab matrix --summary``), or "not measured".
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import SupportsFloat, SupportsInt

from te_align._types import JSONObject, JSONValue

__all__ = ["MEASURES", "Measure", "evidence_for", "measured_direction", "summary"]

SUMMARY = Path(__file__).resolve().parent.parent / "ab" / "data" / "effects.json"
DOCUMENT = "docs/effects.md"


@dataclass(frozen=True)
class Measure:
    """A finding a matrix row measures: ``scope`` is a profile family (``sd3``, ``sd1``) or a profile name
    (``flux-schnell``: the Flux base was pretrained with schnell's recipe, so a flux-dev finding is not measured);
    ``setting`` the finding's slot-relative path (``*`` matches any slot); ``value`` the trainer's effective value
    (None: any)."""

    row: str
    scope: str
    setting: str
    value: object = None
    #: ``check`` (a trainer finding) or an inference tool (``comfyui``: a ``check --for`` note).
    tool: str = "check"

    def matches(self, family: str, profile: str, setting: str, value: object, tool: str = "check") -> bool:
        if tool != self.tool or self.scope not in (family, profile):
            return False
        if self.setting.startswith("*."):
            if not setting.endswith(self.setting[1:]):
                return False
        elif setting != self.setting:
            return False
        # a finding's sequence value is a tuple (the effective value), a measure's a list: compared as sequences
        return self.value is None or _same(value, self.value)


def _same(a: object, b: object) -> bool:
    """Equal values, a list equal to the tuple of the same items (``[10, 20, 30]`` is ``(10, 20, 30)``)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


MEASURES: tuple[Measure, ...] = (
    Measure("world-sd3-t5-154", "sd3", "t5.tokenizer.max_length", 154),
    Measure("world-sd3-t5-77", "sd3", "t5.tokenizer.max_length", 77),
    Measure("world-sd3-no-encoder-dropout", "sd3", "*.train_dropout", 0.0),
    Measure("world-sd3-clip-g-bang", "sd3", "clip_g.tokenizer.pad_token", "<|endoftext|>"),
    Measure("world-sd3-clip-g-bang", "sd3", "clip_g.tokenizer.pad_token_in_prompt", "text"),
    Measure("world-flux-t5-512", "flux-schnell", "t5.tokenizer.max_length", 512),
    Measure("world-flux-t5-77", "flux-schnell", "t5.tokenizer.max_length", 77),
    # the sd15 profile, not the sd1 family: the world base was pretrained with sd15's recipe (the last layer, 77
    # tokens), which the NovelAI lineage (sd15-nai) does not share
    Measure("world-sd15-clip-skip-2", "sd15", "clip_l.encoder.layer", "penultimate"),
    Measure("world-sd15-max-token-225", "sd15", "clip_l.tokenizer.max_length", 227),
    Measure("world-sd15-dropout-zeros", "sd1", "empty_prompt", "zeros"),
    Measure("world-sdxl-clip-g-bang", "sdxl", "clip_g.tokenizer.pad_token", "<|endoftext|>"),
    Measure("world-sdxl-clip-g-bang", "sdxl", "clip_g.tokenizer.pad_token_in_prompt", "text"),
    Measure("world-sdxl-dropout-encoded", "sdxl", "empty_prompt", "encode"),
    Measure("world-sdxl-max-token-225", "sdxl", "*.tokenizer.max_length", 227),
    Measure("world-sdxl-pad-longest", "sdxl", "*.tokenizer.padding", "longest"),
    Measure("world-sdxl-pad-longest", "sdxl", "*.tokenizer.truncation", False),
    Measure("world-chroma-t5-no-mask", "chroma", "t5.masks.encoder", False),
    Measure("world-sd3-comfyui", "sd3", "t5.tokenizer.max_length", None, tool="comfyui"),
    Measure("world-flux-comfyui", "flux-schnell", "t5.tokenizer.max_length", None, tool="comfyui"),
    Measure("world-sd15-comfyui", "sd1", "prompt syntax", None, tool="comfyui"),
    # issue 49 (benchmarks/klein/bench_klein.md): the diffusers klein script's default taps; on the klein world base
    Measure("world-klein-layers-10-20-30", "flux2-klein", "qwen3.encoder.layer", [10, 20, 30]),
    # the two hypothetical klein rows (no trainer at the commits read does them): cited where a config or a trainer's
    # code does (thinking switched on; the caption tokenized without the chat template)
    Measure("world-klein-thinking-on", "flux2-klein", "qwen3.tokenizer.enable_thinking", True),
    Measure("world-klein-no-template", "flux2-klein", "qwen3.tokenizer.template", "{prompt}"),
)


@functools.lru_cache(maxsize=4)
def _load(path: str) -> JSONObject | None:
    p = Path(path)
    if not p.is_file():
        return None
    try:
        data: JSONValue = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == 1 and isinstance(data.get("rows"), list) else None


def summary(path: str | Path | None = None) -> JSONObject | None:
    """The shipped effects summary (or the one at ``path``), None when absent or unreadable."""
    return _load(str(path or SUMMARY))


# The summary is JSON: its fields are read through these, which give each use the type it needs.
def _num(v: object) -> float:
    """A number field as a float; nan where it is absent, null or not a number."""
    if not isinstance(v, (str, SupportsFloat)):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _count(v: object) -> int:
    """A count field (``seeds``, ``planned``) as an int; what ``int()`` cannot read raises, as ``int()`` does."""
    if isinstance(v, (str, SupportsInt)):
        return int(v)
    raise TypeError(f"not a count: {v!r}")


def _obj(v: JSONValue | None) -> JSONObject:
    """A table field (``primary``, ``overrides``…): the table, or an empty one where it is absent or null."""
    return v if isinstance(v, dict) else {}


def _interval(v: JSONValue | None) -> tuple[float, float]:
    """An interval field ``[low, high]`` as two floats (nan, nan where it is absent or null)."""
    if isinstance(v, list) and v:
        return _num(v[0]), _num(v[1])
    return math.nan, math.nan


def _rows(data: JSONObject) -> list[JSONObject]:
    """The summary's rows (:func:`_load` has checked that ``rows`` is a list)."""
    rows = data.get("rows")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _signed(v: float, spread: float) -> str:
    """``v`` with a sign and the decimals its interval's half-width supports (``round_to_spread``)."""
    if v == 0:
        return "0"
    if math.isnan(v):
        return "n/a"
    # two significant digits of the spread, as the effects document rounds (te_align.ab.stats.round_to_spread)
    text = f"{v:.3g}" if math.isnan(spread) or spread <= 0 else f"{v:.{max(0, 1 - math.floor(math.log10(spread)))}f}"
    return text if text.startswith("-") else "+" + text


def _changes(row: JSONObject) -> int:
    return len(_obj(row.get("overrides"))) + sum(len(t) for t in _obj(row.get("train")).values() if isinstance(t, dict))


def combined_line(trainer: str | None, row_name: str, *, path: str | Path | None = None) -> str:
    """Where the same trainer's defaults were also measured together (a row of that trainer, on the same base, that
    changes what ``row_name`` changes and more: a trainer's T5 length with its dropout default), that row's
    reading in one line ("" where there is none)."""
    data = summary(path)
    if data is None or not trainer:
        return ""
    rows = _rows(data)
    own = next((r for r in rows if r.get("preset") == row_name), None)
    if own is None:
        return ""
    for row in rows:
        prim = _obj(row.get("primary"))
        if (row is own or row.get("kind") != "deviation" or row.get("trainer") != trainer
                or row.get("base") != own.get("base") or not prim or str(row.get("verdict", "")).startswith("pending")
                or _changes(row) <= _changes(own)
                or any(_obj(row.get("overrides")).get(k) != v for k, v in _obj(own.get("overrides")).items())):
            continue
        lo, hi = _interval(row.get("adjusted_ci"))
        ci = f" [Holm-adjusted interval {lo:+.3f}, {hi:+.3f}]" if not math.isnan(lo) else ""
        return (f"{trainer}'s defaults together ({row.get('preset')}: {row.get('deviation') or 'its defaults'}): "
                f"{_num(prim.get('diff_mean')):+.3f}{ci}: {row.get('verdict')}")
    return ""


def evidence_for(
    family: str,
    profile: str,
    setting: str,
    value: object,
    *,
    tool: str = "check",
    path: str | Path | None = None,
    trainer: str | None = None,
) -> JSONObject:
    """The measured row for a finding: ``{"row", "verdict", "seeds", "planned", "difference", "ci", "document",
    "text"}``, or ``{"row": None, "verdict": "not measured", "text": ...}``."""
    m = next((x for x in MEASURES if x.matches(family, profile, setting or "", value, tool)), None)
    data = summary(path)
    if m is None or data is None:
        return {"row": None, "verdict": "not measured", "text": "not measured by te-align's effects matrix"}
    row = next((r for r in _rows(data) if r.get("preset") == m.row), None)
    if row is None:
        return {"row": m.row, "verdict": "not measured", "text": f"not measured ({m.row} is not in the shipped summary)"}
    prim = _obj(row.get("primary"))
    diff, lo, hi = _num(prim.get("diff_mean")), _num(prim.get("ci_low")), _num(prim.get("ci_high"))
    alo, ahi = _interval(row.get("adjusted_ci"))
    seeds, planned = _count(row.get("seeds", 0)), _count(row.get("planned", 0))
    verdict = str(row.get("verdict", ""))
    verdict_all = str(row.get("verdict_all") or verdict)
    complete = bool(prim) and not verdict.startswith("pending")
    lines: list[JSONValue] = []  # the measured lines shown under the finding (text)
    if not complete:  # no number before the row is complete: nothing to read into it
        text = f"{m.row} ({row.get('base')} world base): {verdict}; no verdict until all {planned} seeds are in"
    else:
        adjusted = str(row.get("kind")) in ("deviation", "inference")
        if not math.isnan(alo):
            terms = "Holm-adjusted interval" if adjusted else "95% CI"
            ci = f" [{terms} {alo:+.3f}, {ahi:+.3f}]"
        elif not math.isnan(lo):
            ci = f" [95% CI {lo:+.3f}, {hi:+.3f}]"
        else:
            ci = " (no interval: a degenerate difference)"
        holm_over = row.get("holm_family") or ""
        curve = f"{diff:+.3f}{ci} on concept accuracy: {verdict}" + (f" (Holm over {holm_over})" if holm_over and adjusted else "")
        text = f"{m.row} ({row.get('base')} world base, {seeds} of {planned} seeds): trainer's arm minus profile's {curve}"
        if row.get("family_differs"):
            lines.append(
                f"† the verdict rests on its family: among all deviation and inference rows in one Holm family it "
                f"reads {verdict_all} (Holm p {_num(row.get('p_holm_all')):.3f})"
            )
        if row.get("tests_disagree"):
            lines.append(
                f"‡ the paired t test (p {_num(prim.get('p_t')):.3f}) and the exact sign-flip test "
                f"(p {_num(prim.get('p_signflip')):.3f}) disagree at 0.05"
            )
        if not math.isnan(lo) and adjusted:
            lines.append(f"unadjusted 95% CI {lo:+.3f}, {hi:+.3f}; smallest effect this row could detect: "
                         f"{_num(row.get('mde')):.3f} (80% power, from the null controls' spread)")
        sec = _obj(row.get("secondary"))
        shown = []
        for key in ("forgetting (known colours)", "validation loss (profile conditioning)"):
            x = _obj(sec.get(key))
            if not x:
                continue
            d, slo, shi = _num(x.get("diff_mean")), _num(x.get("ci_low")), _num(x.get("ci_high"))
            better = "higher" if x.get("higher_better") else "lower"
            half = (shi - slo) / 2
            if math.isnan(slo):
                shown.append(f"{key} {_signed(d, math.nan)} (no spread: no interval) ({better} is better)")
            else:
                shown.append(f"{key} {_signed(d, half)} [{_signed(slo, half)}, {_signed(shi, half)}] ({better} is better)")
        second = _instrument_2_line(row)
        x2 = _obj(row.get("instrument_2"))
        if x2.get("primary") and second:
            # pre-registered on instrument 2 (the klein rows): it heads the finding; the curve mean follows as the
            # secondary it is (on the klein base it also read the null control as an effect)
            lo2, hi2 = _interval(x2.get("adjusted_ci"))
            ci2 = f" [Holm-adjusted interval {lo2:+.3f}, {hi2:+.3f}]" if not math.isnan(lo2) else ""
            text = (
                f"{m.row} ({row.get('base')} world base, {seeds} of {planned} seeds): trainer's arm minus profile's "
                f"{_num(x2.get('diff_mean')):+.3f}{ci2} on concept net accuracy at 300 steps (instrument 2, the row's "
                f"pre-registered primary): {x2.get('verdict')} (Holm over {x2.get('holm_family')})"
            )
            lines[:] = [
                f"unadjusted 95% CI {_num(x2.get('ci_low')):+.3f}, {_num(x2.get('ci_high')):+.3f}; smallest effect this "
                f"row could detect: {_num(x2.get('mde')):.3f} (80% power, from its base's null control)",
                f"secondary, not acted on: the learning-curve mean {curve}",
            ]
            if x2.get("tests_disagree"):
                lines.append(f"‡ the paired t test (p {_num(x2.get('p_t')):.3f}) and the exact sign-flip test "
                             f"(p {_num(x2.get('p_signflip')):.3f}) disagree at 0.05")
        elif second:
            lines.append(second)
        both = combined_line(trainer, m.row, path=path)
        if both:
            lines.append(both)
        if shown:
            lines.append("trade-off, trainer's arm minus profile's, unadjusted 95% CI (secondary metrics): " + "; ".join(shown))

    def j(v: float) -> float | None:
        return None if math.isnan(v) else v

    return {
        "row": m.row,
        "verdict": verdict,
        "verdict_all": verdict_all if complete else verdict,
        "family_differs": bool(row.get("family_differs")) and complete,
        "seeds": seeds,
        "planned": planned,
        "difference": j(diff),
        "ci": [j(lo), j(hi)],
        "adjusted_ci": [j(alo), j(ahi)],
        "secondary": row.get("secondary") or {},
        "instrument_2": row.get("instrument_2") if complete else None,
        "document": DOCUMENT,
        "text": text + f" (see {DOCUMENT})",
        "lines": lines,
    }


def _instrument_2_line(row: JSONObject) -> str:
    """The row's reading on instrument 2 (amendment 11: concept net accuracy at 300 steps, one Holm family of all
    rows), labelled confirmatory or post hoc; "" where the summary has none."""
    x = row.get("instrument_2")
    if not isinstance(x, dict) or str(row.get("kind")) not in ("deviation", "inference"):
        return ""
    adj = x.get("adjusted_ci")
    d = _num(x.get("diff_mean"))
    lo, hi = (_num(adj[0]), _num(adj[1])) if isinstance(adj, list) and len(adj) == 2 else (math.nan, math.nan)
    over = str(x.get("holm_family") or "all rows")
    ci = f" [Holm-adjusted interval, {over}, {lo:+.3f}, {hi:+.3f}]" if not math.isnan(lo) else ""
    how = "confirmatory" if x.get("confirmatory") else "post hoc: shown, not acted on"
    if x.get("primary"):
        how = "the row's pre-registered primary readout"
    return f"instrument 2 (concept net accuracy at 300 steps, amendment 11; {how}): {d:+.3f}{ci}: {x.get('verdict')}"


def measured_direction(ev: Mapping[str, object]) -> str:
    """What the evidence lets ``check``'s severity policy act on: the verdict when it names a winner in both Holm
    families (the pre-registered one and all rows), ``"null"`` for a measured null or a verdict that rests on its
    family, else ``""`` (not measured, pending, or uninformative: its gating positive control was not seen). Where
    the pre-registered verdict is uninformative, a confirmatory instrument-2 verdict (amendment 11) counts in its
    place; a post-hoc one never does. A row pre-registered with instrument 2 as its primary readout (the klein rows,
    benchmarks/klein/bench_klein.md) is read on instrument 2 alone."""
    v = str(ev.get("verdict", ""))
    second = ev.get("instrument_2")
    primary_2 = isinstance(second, dict) and bool(second.get("primary"))  # a row pre-registered on instrument 2
    if primary_2 or (v.startswith("uninformative") and isinstance(second, dict) and second.get("confirmatory")):
        v2 = str(second.get("verdict", "")) if isinstance(second, dict) else ""
        if v2 in ("profile better", "trainer default better"):
            return v2
        return "null" if v2 == "no measurable difference" else ""
    if ev.get("row") is None or v.startswith(("pending", "not measured", "uninformative")):
        return ""  # an uninformative verdict (its gating positive control not seen) is no measurement to act on
    if v in ("profile better", "trainer default better") and v == ev.get("verdict_all", v):
        return v
    return "null"
