"""``te-align demo``: one row of the pre-registered effects matrix, live, on a shipped world base (CPU, minutes).

The row is ``world-flux-t5-512`` (chosen in ``benchmarks/effects/bench_effects.md`` before the matrix ran): T5 at 512 tokens
for FLUX.1 schnell, as ai-toolkit, diffusion-pipe and the diffusers Flux examples train it, against the 256 the
schnell recipe (the profile) uses, on the shipped Flux-shaped base that never saw pink. Two seeds of 100 steps run in
one single-thread worker process (:func:`te_align.ab.matrix.run_matrix`, resumable in ``OUT/matrix``); the
report (``OUT/ab/report.md`` and ``report.html``) leads with the verdict, then both arms' samples, the accuracy
table and curves, the validation loss, and the committed matrix of every measured row. ``TE_ALIGN_DEMO_STEPS`` and
``TE_ALIGN_DEMO_SEEDS`` (or ``steps=`` / ``seeds=``) shorten it, for tests.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from te_align._atomic import atomic_file
from te_align.ab.evidence import summary
from te_align.ab.matrix import matrix_presets, row_result, run_matrix
from te_align.ab.preset import ABError, Preset
from te_align.ab.report import Block, summary_lines, write_report
from te_align.ab.runner import ABResult
from te_align.tiny.bases import base_info, data_root, materialize

if TYPE_CHECKING:  # pragma: no cover
    from te_align.ab.progress import Progress

#: The matrix row the demo runs, its seeds and steps: the row's own 6 seeds x 300 steps need about 1,000 CPU-seconds;
#: 2 seeds x 100 steps (learning curve at 50 and 100) in one process fit 5 minutes and 1 GB on 2 cores (each process
#: holds about 500 MB of torch, diffusers and transformers, so two would not fit 1 GB; 3 seeds took 6.7 minutes;
#: benchmarks/effects/bench_effects.md, amendments 4 and 5).
DEMO_ROW = "world-flux-t5-512"
DEMO_SEEDS = 2
DEMO_STEPS = 100
DEMO_WORKERS = 1


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ABError(f"expected an integer, got {value!r}", key=name) from None


def run_demo(
    out: str | Path = "te-align-demo",
    *,
    steps: int | None = None,
    seeds: int | None = None,
    workers: int | None = None,
    say: Callable[[str], None] = print,
    progress: Progress | None = None,
) -> ABResult:
    """Run the demo row; returns the :class:`te_align.ab.runner.ABResult` of all its seeds (report written). Says
    what runs, one line per finished seed, then the summary once (:func:`verdict_line` and
    :func:`te_align.ab.report.summary_lines`). ``progress`` shows each phase with an ETA (``te-align demo``)."""
    steps = steps if steps is not None else (_env_int("TE_ALIGN_DEMO_STEPS") or DEMO_STEPS)
    seeds = seeds if seeds is not None else (_env_int("TE_ALIGN_DEMO_SEEDS") or DEMO_SEEDS)
    if seeds < 1:
        raise ABError(f"must be >= 1, got {seeds}", key="--seeds")
    if progress is not None:
        progress.stage("finding the world data and the shipped base")
    data_root()  # the world data (te-align-world) is there, before the first line is said
    root = Path(out).expanduser()
    p = next(x for x in matrix_presets() if x.name == DEMO_ROW)
    say(f"te-align demo: {p.description}")
    say(f"{seeds} seed(s) x {steps} steps, two arms each, on the shipped Flux-shaped world base; output in {root}")
    t0 = time.perf_counter()
    run_matrix(root / "matrix", only=[DEMO_ROW], seeds=seeds, max_steps=steps, workers=workers or DEMO_WORKERS, say=say,
               progress=progress)  # fmt: skip
    if progress is not None:
        progress.stage("writing the report")
    result = row_result(p, root / "matrix", list(range(seeds)), out_dir=root / "ab")
    result.seconds = time.perf_counter() - t0  # the report's wall time: this run's training and evaluation
    result.report_md, result.report_html = write_report(result, appendix=committed_blocks())
    train_toml = write_train_example(root, p)
    say("")
    say(verdict_line(result))
    for line in summary_lines(result):
        say(f"  {line}")
    say(f"report: {result.report_html}")
    say(f"train your own LoRA on the demo's base (denoiser + CLIP-L): te-align train {train_toml}")
    return result


def verdict_line(result: ABResult) -> str:
    """The demo's verdict (read from the primary metric, the first summary line) with what A and B are."""
    return (
        f"verdict: {result.verdict} ({result.seeds} seed(s) x {result.runs[0].steps if result.runs else 0} steps, "
        f"paired by seed; A = T5 at 512 tokens, B = the profile's 256; each A - B with its 95% interval; "
        f"{result.seconds:.0f} s)"
    )


def committed_blocks() -> list[Block]:
    """Report blocks with the committed matrix (every measured row), so the demo's one row is seen among all."""
    data = summary()
    blocks: list[Block] = [("h2", "The committed effects matrix (docs/effects.md)")]
    if data is None:
        return [*blocks, ("p", "This installation ships no effects summary.")]
    blocks.append(
        (
            "p",
            f"Plan {data['plan']}, pre-registered in benchmarks/effects/bench_effects.md; every row a LoRA finetune of a shipped "
            "world base, arm A as the trainer or tool does, arm B by the profile; primary metric as in this report; "
            "verdicts Holm-adjusted across the deviation rows, given once all planned seeds are in. A - B is a "
            "fraction of the probe prompts here (-0.013 is -1.3 points in this report's summary).",
        )
    )
    rows = []
    for r in data["rows"]:
        m = r.get("primary")
        if m is None or str(r["verdict"]).startswith("pending"):  # no number before a row is complete
            rows.append([r["preset"], r["kind"], r["trainer"], r["base"], f"{r['seeds']}/{r['planned']}", "", r["verdict"]])
            continue
        # the interval in its verdict's terms: Holm-adjusted for deviation and inference rows (effects.json
        # "adjusted_ci"), the plain 95% one for controls and for a summary written before it carried one
        lo, hi = (r.get("adjusted_ci") or [m["ci_low"], m["ci_high"]])[:2]
        ci = "" if lo is None or hi is None or math.isnan(lo) else f" [{lo:+.3f}, {hi:+.3f}]"
        flag = " †" if r.get("family_differs") and r["kind"] in ("deviation", "inference") else ""
        rows.append([r["preset"], r["kind"], r["trainer"], r["base"], f"{r['seeds']}/{r['planned']}", f"{m['diff_mean']:+.3f}{ci}",
                     f"{r['verdict']}{flag}"])
    blocks.append(("table", ["row", "kind", "trainer / tool", "base", "seeds",
                             "A - B [interval in its verdict's terms: Holm-adjusted; controls 95%]", "verdict († differs "
                             "when all rows are one Holm family)"], rows))
    return blocks


#: The training config the demo leaves beside its output (``te-align train te-align-demo/train.toml``).
TRAIN_EXAMPLE = "train.toml"


def write_train_example(root: Path, preset: Preset) -> Path:
    """A ``te-align train`` config for the demo's base and seed-0 data: a LoRA on the denoiser and on CLIP-L, with the
    flux-schnell profile fitted to the base's tiny encoders."""
    import toml

    info = base_info(preset.world.base)
    data = root / "matrix" / preset.name / "seed-0" / "data" / "seed-0" / "train"
    config = {
        "model": {
            "path": str(materialize(preset.world.base)),
            "profile": preset.profile,
            "profile_overrides": dict(info.get("profile_overrides") or {}),
        },
        "data": {
            "path": os.path.relpath(data, root),
            "resolution": 32,
            "bucket_step": 16,
            "min_bucket": 16,
            "max_bucket": 64,
        },
        "lora": {"rank": 8, "alpha": 8.0, "text_encoders": ["clip_l"]},
        "train": {"max_steps": 60, "batch_size": 4, "learning_rate": 3e-4, "checkpoint_every": 0},
        "output": {"dir": "train-output"},
    }
    head = (
        "# A LoRA on te-align demo's Flux-shaped world base (denoiser + CLIP-L text encoder), conditioned by the\n"
        "# flux-schnell profile fitted to the base's tiny encoders. Run: te-align train <this file>\n"
    )
    path = root / TRAIN_EXAMPLE
    with atomic_file(path, "w") as f:
        f.write(head + toml.dumps(config))
    return path


__all__ = ["DEMO_ROW", "DEMO_SEEDS", "DEMO_STEPS", "TRAIN_EXAMPLE", "committed_blocks", "run_demo", "verdict_line", "write_train_example"]
