"""``te-align ab matrix``: every known trainer deviation A/B-tested on the pretrained shapes-world bases.

Each bundled world preset (``presets/world/*.toml``) is one row: arm A conditions as a trainer does by
default, arm B by the profile the base was pretrained with; the null control's arms differ only in their
random draws. Rows run with :func:`te_align.ab.runner.run_ab` (``OUT/<preset>/``, resumable) and the table
is written to ``OUT/matrix.md`` and ``OUT/matrix.json`` (and, with ``doc=``, to a document the README links).
A row whose base is not shipped is listed as not run, with the reason.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_align._atomic import atomic_file
from te_align.ab.preset import ABError, Preset, load_preset, presets_root

__all__ = ["MatrixRow", "matrix_presets", "render_matrix", "run_matrix"]

logger = logging.getLogger("te_align.ab")


@dataclass
class MatrixRow:
    preset: str
    trainer: str
    deviation: str
    base: str
    seeds: int = 0
    verdict: str = "not run"
    reason: str = ""
    metrics: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    report: str = ""


def matrix_presets() -> list[Preset]:
    """The bundled world presets, null control last."""
    root = presets_root() / "world"
    found = [load_preset(p) for p in sorted(root.glob("*.toml"))] if root.is_dir() else []
    return sorted(found, key=lambda p: (p.baseline.null, p.name))


def _deviation(p: Preset) -> str:
    if p.baseline.null:
        return "null control (arm A = arm B, own random draws)"
    parts = [f"{k} = {v!r}" for k, v in p.baseline.overrides.items()]
    parts += [f"train.{s}.{k} = {v!r}" for s, t in p.baseline.train.items() for k, v in t.items()]
    return ", ".join(parts)


def run_matrix(
    out: str | Path = "te-align-matrix",
    *,
    only: Sequence[str] = (),
    seeds: int | None = None,
    max_steps: int | None = None,
    doc: str | Path | None = None,
    say: Callable[[str], None] = print,
) -> list[MatrixRow]:
    """Run every world preset (or those named in ``only``) and write the table."""
    from te_align.ab.runner import run_ab, verdict_of
    from te_align.tiny.bases import BaseError, base_info

    t0 = time.perf_counter()
    presets = matrix_presets()
    if only:
        names = {p.name for p in presets}
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ABError(f"no world preset {unknown[0]!r}; known: {', '.join(sorted(names))}", key="--only")
        presets = [p for p in presets if p.name in only]
    out_dir = Path(out).expanduser()
    rows: list[MatrixRow] = []
    for p in presets:
        assert p.world is not None
        row = MatrixRow(p.name, p.baseline.trainer, _deviation(p), p.world.base)
        try:
            info = base_info(p.world.base)
        except BaseError as e:
            row.reason = f"the {p.world.base} world base is not shipped yet"
            logger.info("%s: %s", p.name, e)
            rows.append(row)
            say(f"{p.name}: not run: {row.reason}")
            continue
        say(f"== {p.name}: {row.deviation}")
        t1 = time.perf_counter()
        result = run_ab(p, seeds=seeds, out=out_dir / p.name, max_steps=max_steps,
                        profile_overrides=info.get("profile_overrides") or None, say=say)  # fmt: skip
        row.seconds = time.perf_counter() - t1
        row.seeds = result.seeds
        row.verdict = verdict_of(result.summary)
        row.metrics = [{"metric": r.metric, "a_mean": r.a_mean, "b_mean": r.b_mean, "diff_mean": r.diff_mean,
                        "diff_sd": r.diff_sd, "ci_low": r.ci_low, "ci_high": r.ci_high, "verdict": r.verdict,
                        "higher_better": r.higher_better, "n": r.n} for r in result.summary]  # fmt: skip
        row.report = str(result.report_md.relative_to(out_dir)) if result.report_md else ""
        rows.append(row)
        say(f"   verdict: {row.verdict} ({row.seconds:.0f} s)")
    seconds = time.perf_counter() - t0
    command = "te-align ab matrix" + (f" --seeds {seeds}" if seeds else "") + (f" --max-steps {max_steps}" if max_steps else "")
    text = render_matrix(rows, seconds=seconds, command=command)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, data in ((out_dir / "matrix.md", text),
                       (out_dir / "matrix.json", json.dumps({"command": command, "seconds": seconds, "rows": [r.__dict__ for r in rows]},
                                                            indent=1, default=str))):  # fmt: skip
        with atomic_file(path, "w", error=ABError) as f:
            f.write(data)
    if doc is not None:
        with atomic_file(Path(doc), "w", error=ABError) as f:
            f.write(text)
    return rows


def _num(v: float, spread: float) -> str:
    from te_align.ab.stats import round_to_spread

    return round_to_spread(v, spread)


def _pct(v: float, spread: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "n/a"
    return _num(100 * v, 100 * spread) + "%"


def render_matrix(rows: Sequence[MatrixRow], *, seconds: float, command: str) -> str:
    """The matrix as markdown: one line per deviation and metric, mean A - B with its 95% interval."""
    lines = [
        "# Measured effects of trainer deviations (shapes world)",
        "",
        f"Regenerate: `{command}` ({seconds / 60:.1f} min on this machine: {platform.machine()}, "
        f"{platform.python_version()}).",
        "",
        "Each row: the same LoRA finetune of a pretrained world base on a concept it never saw, arm A conditioned as "
        "the trainer does by default, arm B by the profile the base was pretrained with; paired by seed; scored as at "
        "inference (profile conditioning). Difference = A - B; interval = 95% t interval of the mean across seeds. "
        "Validation loss: lower is better; prompt accuracy: higher is better.",
        "",
        "| deviation | trainer | base | seeds | verdict | validation loss A - B [95% CI] | objects exact A - B [95% CI] | concept exact A - B [95% CI] |",
        "|---|---|---|---:|---|---|---|---|",
    ]
    for r in rows:
        if r.verdict == "not run":
            lines.append(f"| {r.deviation} | {r.trainer} | {r.base} | 0 | not run: {r.reason} | | | |")
            continue
        cells = []
        for name, pct in (("validation loss, final (profile conditioning)", False),
                          ("prompt accuracy: objects exact (profile conditioning)", True),
                          ("prompt accuracy: concept objects exact", True)):  # fmt: skip
            m = next((m for m in r.metrics if m["metric"] == name), None)
            if m is None:
                cells.append("n/a")
                continue
            half = (m["ci_high"] - m["ci_low"]) / 2 if not math.isnan(m["ci_high"]) else float("nan")
            f = _pct if pct else _num
            cells.append(f"{f(m['diff_mean'], half)} [{f(m['ci_low'], half)}, {f(m['ci_high'], half)}]: {m['verdict']}")
        lines.append(f"| {r.deviation} | {r.trainer} | {r.base} | {r.seeds} | **{r.verdict}** | " + " | ".join(cells) + " |")
    lines.append("")
    reports = [f"`{r.report}`" for r in rows if r.report]
    if reports:
        lines.append("Per-row reports (curves, sample grids, accuracy tables) in the output folder: " + ", ".join(reports))
        lines.append("")
    lines += _METHOD.splitlines()
    return "\n".join(lines) + "\n"


_METHOD = """## Method

- **Bases.** Each world base (`te_align/tiny/data/bases/<name>/base.json` records its pretraining config, time and
  held-out accuracy) was pretrained from scratch on the shapes world with exactly its family's profile, using
  frozen tiny random-weight text encoders with real-convention tokenizers: they are that model's text encoders.
  The concept below never appears in a base's pretraining data.
- **Finetune.** The same LoRA finetune in every row: 64 images that always show the concept (pink), drawn from the
  world with the default caption mix (tags, short sentences, long captions; some with "!" or weight syntax), never
  showing a pink triangle; rank 8, learning rate 1e-3, batch 8, 300 steps; both arms of a seed share data order,
  noise and LoRA initialisation (the null control's arm A draws its own).
- **Scoring** as at inference, by the profile's conditioning: the SD3-paper validation loss on 24 held-out images
  (fixed timesteps and noise), and prompt accuracy: each of the 24 held-out captions (a pink triangle with other
  objects: a combination never trained on) sampled once with the official pipeline (16 Euler steps, CFG 4, fixed
  seeds) and read back by the world's reader (`te_align.tiny.world.read_image`, exact on clean renders).
- **Verdict** per metric from the 95% t interval of the mean paired difference across seeds; a row's verdict
  combines its validation loss and prompt accuracies ("mixed" when they disagree).

## How the settings were chosen

The world, the concept, the held-out combination, the finetune hyper-parameters, the number of images, prompts
and seeds were fixed before any world A/B was run, from the time budget (the demo must finish in about 5 minutes
on 2 CPU cores) and not changed after looking at results. Every deviation is listed whatever its outcome; null
results are reported as null.

## What a tiny world can and cannot tell

It can show, with the truth known, whether a trainer's deviation from the recipe a base model was pretrained with
costs a LoRA anything measurable, and in which direction. It cannot give the size of the effect on a real model:
the bases are millions of times smaller than SD3.5 or FLUX.1, their text encoders are random rather than trained
language models, the captions come from a small grammar, and a short CPU finetune is not a production LoRA run.
A "no measurable difference" here is not evidence that a deviation is harmless at scale, and a measured effect is
a reason to align, not a prediction of its size.
"""
