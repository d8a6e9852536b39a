"""The A/B report: ``report.md`` (plots as files next to it) and a self-contained ``report.html``
(the same content, PNG plots embedded as base64). Both are rendered from one list of blocks, so the
two never disagree; every number in the tables is the runner's measured value, formatted with
:func:`fmt`.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._atomic import atomic_file
from te_align._types import JSONObject, JSONValue
from te_align.ab.plots import Series, band_plot, image_grid
from te_align.ab.preset import ABError
from te_align.ab.stats import round_to_spread
from te_align.tiny import world

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from te_align.ab.runner import ABResult, SummaryRow

COLOURS = {"A": (214, 96, 40), "B": (40, 90, 200)}
Block = tuple[Any, ...]


def fmt(v: float) -> str:
    """Numbers in the report's detail tables (losses, divergences): four significant digits (parsed back by the
    tests)."""
    return "nan" if not math.isfinite(v) else f"{v:.4g}"


def _percent(metric: str) -> bool:
    """Whether a summary metric is a rate (shown in percent, its differences in points): all but the losses and the
    object counts."""
    return not any(k in metric for k in ("loss", "per image"))


def _signed(text: str) -> str:
    """A rounded difference with its sign: "+2", "-0.013", "0" (a value that rounds to zero has none)."""
    if text.startswith("-"):
        return "0" if not text.strip("-0.") else text
    return text if not text.strip("0.") or text == "n/a" else "+" + text


def metric_cells(r: SummaryRow) -> tuple[str, str, str, str]:
    """A summary row as a person reads it: (A, B, A - B, interval), each rounded to what the 95% interval's
    half-width supports (:func:`te_align.ab.stats.round_to_spread`); rates in percent, their differences in points,
    the interval in the same terms as the row's verdict (the 95% t interval the verdict is read from)."""
    pct = _percent(r.metric)
    scale = 100.0 if pct else 1.0
    finite = math.isfinite(r.ci_low) and math.isfinite(r.ci_high)
    half = (r.ci_high - r.ci_low) / 2 * scale if finite else float("nan")

    def f(v: float) -> str:
        return round_to_spread(v * scale, half)

    unit = "%" if pct else ""
    diff = _signed(f(r.diff_mean)) + (" points" if pct else "")
    if finite:
        interval = f"[{_signed(f(r.ci_low))}, {_signed(f(r.ci_high))}]"
    else:
        interval = "no interval (one seed)" if r.n < 2 else f"no interval (all {r.n} seeds differ alike)"
    return f"{f(r.a_mean)}{unit}", f"{f(r.b_mean)}{unit}", diff, interval


def summary_lines(result: ABResult) -> list[str]:
    """The summary, once, as the terminal shows it: one line per metric (its verdict last)."""
    out = []
    for r in result.summary:
        a, b, diff, interval = metric_cells(r)
        out.append(f"{r.metric}: A {a} vs B {b}; A - B {diff}{' ' if interval.startswith('[') else ', '}{interval}: {r.verdict}")
    return out


def object_text(o: Sequence[Any]) -> str:
    """One shapes-world object as a label reads it: "pink triangle, middle left"."""
    return f"{o[0]} {o[1]}, {o[2]}"


def probe_label(arm: str, probe: JSONObject, read: Sequence[Sequence[Any]]) -> str:
    """The label under a probe image: what the prompt asked, then (a line of its own) what the reader read."""
    found = "; ".join(object_text(o) for o in read) or "nothing"
    objects = probe["objects"]
    if not isinstance(objects, list) or not isinstance(objects[0], list):
        raise TypeError(f"a probe's objects are a list of [colour, shape, position, …] lists, not {objects!r}")
    return f"{arm} asked: {object_text(objects[0])}\nread: {found}"


def _number(v: JSONValue) -> float:
    """A rate of a probe summary (``net``, ``hit``, …: :func:`te_align.ab.runner._probe_summary`), as stored."""
    if not isinstance(v, (int, float)):
        raise TypeError(f"a probe summary's rate is a number, not {v!r}")
    return v


def _ema(values: list[float], alpha: float = 0.1) -> list[float]:
    out, e = [], values[0] if values else 0.0
    for v in values:
        e = (1 - alpha) * e + alpha * v
        out.append(e)
    return out


def _band(per_seed: list[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    steps = sorted(set.intersection(*(set(d) for d in per_seed))) if per_seed else []
    mean = [statistics.fmean(d[s] for d in per_seed) for s in steps]
    lo = [min(d[s] for d in per_seed) for s in steps]
    hi = [max(d[s] for d in per_seed) for s in steps]
    return steps, mean, lo, hi


def _write(path: Path, data: bytes | str) -> None:
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", error=ABError) as f:
        f.write(data)


def _plots(result: ABResult) -> dict[str, Path]:
    from PIL import Image

    plots = result.out_dir / "plots"
    names = {"A": f"A: {result.preset.baseline.trainer} default", "B": "B: profile"}
    train_series, val_series = [], []
    for arm in ("A", "B"):
        runs = [r for r in result.runs if r.arm == arm]
        smoothed = []
        for r in runs:
            steps = [s for s, _ in r.losses]
            smoothed.append(dict(zip(steps, _ema([v for _, v in r.losses]), strict=True)))
        x, m, lo, hi = _band(smoothed)
        train_series.append(Series(f"{names[arm]} (EMA, min-max of {len(runs)} seeds)", COLOURS[arm], x, m, lo, hi))
        x, m, lo, hi = _band([dict(r.val) for r in runs])
        val_series.append(Series(f"{names[arm]} (mean, min-max of {len(runs)} seeds)", COLOURS[arm], x, m, lo, hi, markers=True))
    out = {"train_loss": plots / "train_loss.png", "val_loss": plots / "val_loss.png", "samples": plots / "samples.png"}
    _write(out["train_loss"], band_plot(train_series, title="training loss (EMA 0.1), band = min-max across seeds"))
    _write(out["val_loss"], band_plot(val_series, title="validation loss per checkpoint (profile conditioning, fixed t and noise)"))
    columns, rows = [], []
    for r in result.runs:
        columns.append(f"seed {r.seed} {r.arm}")
    n = len(result.runs[0].samples) if result.runs else 0
    sample_seeds = result.preset.eval.sample_seeds
    for k in range(n):
        prompt = result.preset.eval.prompts[k // max(1, len(sample_seeds))]
        images = []
        for r in result.runs:
            images.append(Image.open(r.samples[k]) if k < len(r.samples) and Path(r.samples[k]).is_file() else None)
        rows.append((f"{prompt} [sample seed {sample_seeds[k % len(sample_seeds)]}]", images))
    _write(out["samples"], image_grid(rows, columns, title="final weights, identical prompts and seeds, profile conditioning"))
    if result.runs and all(r.curve for r in result.runs):
        series = []
        for arm in ("A", "B"):
            runs = [r for r in result.runs if r.arm == arm]
            x, m, lo, hi = _band([{s: 100 * _number(c["net"]) for s, c in r.curve} for r in runs])
            series.append(Series(f"{names[arm]} (mean, min-max of {len(runs)} seeds)", COLOURS[arm], x, m, lo, hi, markers=True))
        out["curve"] = plots / "concept_curve.png"
        _write(out["curve"], band_plot(series, title="concept net accuracy per checkpoint in points (hits minus false pinks, % of the probe prompts), as sampled"))
    if result.runs and all(r.probe_samples for r in result.runs):
        out["probes"] = plots / "probe_samples.png"
        _write(out["probes"], _probe_grid(result))
    if result.runs and all(r.accuracy_samples for r in result.runs) and result.val_dir is not None:
        out["accuracy"] = plots / "accuracy_samples.png"
        _write(out["accuracy"], _accuracy_grid(result))
    return out


#: Validation prompts shown in the accuracy grid.
GRID_PROMPTS = 6


def _reading(img: np.ndarray) -> str:
    return "; ".join(object_text(k) for k in world.read_image(img)) or "nothing"


def _accuracy_grid(result: ABResult) -> bytes:
    """Per validation prompt: the ground-truth render, then each run's sample (seeds 0 and 1), each labelled with
    what the reader read in it."""
    import numpy as np
    from PIL import Image

    runs = [r for r in result.runs if r.seed < 2]
    first = runs[0].accuracy_samples[:GRID_PROMPTS]
    images, labels = [], []
    for k, path in enumerate(first):
        stem = Path(path).stem
        truth_file = result.val_dir / f"{stem}.png"  # type: ignore[operator]
        caption_file = truth_file.with_suffix(".txt")
        caption = caption_file.read_text(encoding="utf-8").strip() if caption_file.is_file() else ""
        with Image.open(truth_file) as im:
            truth = np.asarray(im.convert("RGB"))
        images.append(truth)
        labels.append(f"truth: {caption[:150]}")
        for r in runs:
            with Image.open(r.accuracy_samples[k]) as im:
                arr = np.asarray(im.convert("RGB"))
            images.append(arr)
            labels.append(f"{r.arm} seed {r.seed}\nread: {_reading(arr)}")
    buf = io.BytesIO()
    world.grid(images, labels, columns=1 + len(runs), label_lines=6).save(buf, format="PNG")
    return buf.getvalue()


#: Probe prompts shown per arm in the report's sample grid.
GRID_PROBES = 8


def _probe_grid(result: ABResult) -> bytes:
    """Seed 0's final probe images: arm A's row above arm B's, each labelled with what its prompt asked and what the
    reader read."""
    import numpy as np
    from PIL import Image

    first = min(r.seed for r in result.runs)
    runs = [r for r in result.runs if r.seed == first]
    probes = runs[0].probes
    pick = [i for i, q in enumerate(probes) if q["length"] == "short"][:GRID_PROBES]
    images, labels = [], []
    for r in sorted(runs, key=lambda r: r.arm):
        for i in pick:
            with Image.open(r.probe_samples[i]) as im:
                arr = np.asarray(im.convert("RGB"))
            images.append(arr)
            # the reading the arm was scored with (a result from before it was kept: read again)
            read = r.probe_reads[i] if len(r.probe_reads) == len(probes) else world.read_image(arr)
            labels.append(probe_label(r.arm, probes[i], read))
    buf = io.BytesIO()
    world.grid(images, labels, columns=len(pick), label_lines=5).save(buf, format="PNG")
    return buf.getvalue()


def _probe_blocks(result: ABResult, plots: dict[str, Path]) -> list[Block]:
    out: list[Block] = []
    if "probes" in plots:
        out.append(("h2", "Samples: what each arm draws (seed " + str(min(r.seed for r in result.runs)) + ", last checkpoint)"))
        out.append(
            (
                "p",
                "Top row arm A, bottom row arm B; under each image the prompt's request and what the world's reader "
                "read in it. Pink triangles were never in the training images.",
            )
        )
        out.append(("img", "probe prompts: arm A above arm B", plots["probes"]))
    runs = result.runs
    out.append(("h2", "Prompt accuracy (probe prompts in new wording, sampled as each arm is sampled at inference)"))
    out.append(
        (
            "p",
            "Per checkpoint, in percent of the probe prompts: hit = pink drawn at the asked position when pink was "
            "asked; false = pink drawn when another colour was asked; net = hit - false, in points (the primary "
            "metric is its mean over the checkpoints); known = the other colours drawn as asked (forgetting); "
            "exact = colour, shape and position.",
        )
    )
    rows = []
    for r in runs:
        for step, c in r.curve:
            rows.append(
                [
                    str(r.seed),
                    r.arm,
                    str(step),
                    _signed(f"{100 * _number(c['net']):.1f}"),
                    f"{100 * _number(c['hit']):.1f}%",
                    f"{100 * _number(c['false']):.1f}%",
                    f"{100 * _number(c['known']):.1f}%",
                    f"{100 * _number(c['exact']):.1f}%",
                    f"{c['extra']:.2f}",
                ]
            )
    out.append(("table", ["seed", "arm", "step", "net (points)", "hit", "false", "known", "exact", "extra objects / image"], rows))
    if "curve" in plots:
        out.append(("img", "concept net accuracy per checkpoint", plots["curve"]))
    return out


def _headline(result: ABResult) -> list[Block]:
    """The verdict first, then the one summary: every metric's means, paired difference and 95% interval, rounded to
    the interval's spread (:func:`metric_cells`)."""
    out: list[Block] = [
        (
            "p",
            f"**Verdict: {result.verdict}** ({result.seeds} seed(s), paired by seed; scored as the "
            "official pipeline conditions at inference; each verdict reads its row's 95% t interval of A - B).",
        )
    ]
    rows = [[r.metric, *metric_cells(r), r.verdict] for r in result.summary]
    out.append(("table", ["metric", "A", "B", "A - B", "95% interval of A - B", "verdict"], rows))
    return out


def _blocks(result: ABResult, plots: dict[str, Path]) -> list[Block]:
    p, b = result.preset, result.preset.baseline
    blocks: list[Block] = [("h1", f"A/B: {p.name}")]
    blocks += _headline(result)
    if p.description:
        blocks.append(("p", p.description))
    arm_a = {
        "null": f"the profile, with its own random draws (a null control): {b.why}",
        "positive": (
            f"arm B's LoRA, sampled with each probe prompt cut before {', '.join(repr(w) for w in b.cut_before)}"
            if b.cut_before
            else "captions shuffled among the images"
            if b.shuffle_captions
            else f"captions without {', '.join(repr(w) for w in b.remove_words)}"
        )
        + f" (a positive control): {b.why}",
        "inference": f"arm B's LoRA, sampled as {b.inference_tool} does by default: {b.behaviour}",
    }.get(b.kind, f"{b.trainer} default ({b.version}): {b.behaviour}")
    blocks.append(
        (
            "table",
            ["arm", "conditioning", "source"],
            [
                ["A", arm_a, b.source],
                [
                    "B",
                    f"profile {p.profile}: {b.why}" if b.kind == "deviation" else f"profile {p.profile}",
                    "te-align bundled profile (te-align profile show " + p.profile + ")",
                ],
            ],
        )
    )
    if b.kind == "inference":
        over = ", ".join(f"{k} = {v!r}" for k, v in b.inference_overrides.items()) or "none"
        what = f"Arm A = arm B's LoRA sampled by the profile with {over}" + (f" and CLIP chunks (up to {b.inference_chunks})" if b.inference_chunks else "")
    else:
        over = ", ".join(f"{k} = {v!r}" for k, v in b.overrides.items()) or "none"
        what = f"Arm A = profile with overrides {over}" + (f", train settings {b.train}" if b.train else "")
        what += ", sampled as trained" if b.sample_as == "trained" else ""
    blocks.append(
        (
            "p",
            f"{what}. Identical data, seeds, steps and hyper-parameters; "
            f"{result.seeds} seed(s); {result.runs[0].steps if result.runs else 0} steps per arm; wall time {result.seconds:.1f} s.",
        )
    )
    probes = bool(result.runs) and all(r.curve for r in result.runs)
    if probes:
        blocks += _probe_blocks(result, plots)
        blocks.append(("h2", "Validation loss per checkpoint"))
        blocks.append(("img", "validation loss per checkpoint", plots["val_loss"]))
    if result.runs and all(r.accuracy for r in result.runs):
        blocks.append(("h2", "Prompt accuracy on held-out prompts"))
        blocks.append(
            (
                "p",
                "Every validation caption (the concept in combinations never trained on) sampled once per run with the "
                "official pipeline, profile conditioning, fixed seeds; read back by the shapes-world reader. Objects exact: "
                "colour, shape and position all right; concept: the same over objects carrying the new concept.",
            )
        )
        keys = [
            ("object_accuracy", "objects exact"),
            ("concept_accuracy", "concept objects exact"),
            ("colour", "colour"),
            ("shape", "shape"),
            ("position", "position"),
            ("image_accuracy", "images exact"),
        ]
        blocks.append(
            (
                "table",
                ["seed", "arm"] + [name for _, name in keys] + ["extra objects / image"],
                [
                    [str(r.seed), r.arm]
                    + [f"{100 * r.accuracy[k]:.1f}%" for k, _ in keys]
                    + [f"{r.accuracy['extra_per_image']:.2f}"]
                    for r in result.runs
                ],
            )
        )
        if "accuracy" in plots:
            blocks.append(("img", "held-out prompts: ground truth, then each run's sample with what the reader read", plots["accuracy"]))
    blocks.append(("h2", "Conditioning divergence between the arms"))
    blocks.append(
        (
            "p",
            "Every caption and sample prompt encoded by both arms; tensors of different shapes are zero-padded to the "
            "larger shape, so missing positions count. Cosine = mean over prompts of the flattened per-prompt cosine.",
        )
    )
    blocks.append(
        (
            "table",
            ["tensor", "shape A", "shape B", "max abs diff", "mean cosine", "prompts differing"],
            [
                [
                    d.tensor,
                    "x".join(map(str, d.shape_a)),
                    "x".join(map(str, d.shape_b)),
                    fmt(d.max_abs_diff),
                    fmt(d.cosine),
                    f"{d.prompts_differing}/{d.prompts}",
                ]
                for d in result.divergence
            ],
        )
    )
    blocks.append(("h2", "Training loss"))
    blocks.append(("img", "training loss A vs B", plots["train_loss"]))
    blocks.append(("h2", "Validation loss per checkpoint" + (" (values)" if probes else "")))
    blocks.append(
        (
            "p",
            "Held-out images, fixed timesteps and fixed noise per image (SD3 paper's validation loss), conditioned "
            "by the profile, i.e. as the official pipeline conditions at inference. Step 0 is the base model.",
        )
    )
    if not probes:
        blocks.append(("img", "validation loss per checkpoint", plots["val_loss"]))
    steps = sorted({s for r in result.runs for s, _ in r.val})
    header = ["step"] + [f"seed {r.seed} {r.arm}" for r in result.runs]
    rows = [[str(s)] + [fmt(dict(r.val).get(s, float("nan"))) for r in result.runs] for s in steps]
    blocks.append(("table", header, rows))
    blocks.append(("h2", "Runs"))
    blocks.append(
        (
            "table",
            [
                "seed",
                "arm",
                "steps",
                "seconds",
                "training loss (last 20%)",
                "val loss (profile)",
                "val loss (own)",
            ],
            [
                [
                    str(r.seed),
                    r.arm,
                    str(r.steps),
                    f"{r.seconds:.1f}",
                    fmt(r.final_train),
                    fmt(r.final_val),
                    fmt(r.final_val_own),
                ]
                for r in result.runs
            ],
        )
    )
    if plots.get("samples") is not None:
        blocks.append(("h2", "Samples"))
        blocks.append(("img", "sample grid", plots["samples"]))
    return blocks


def _md(blocks: list[Block], root: Path) -> str:
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind == "h1":
            out.append(f"# {blk[1]}\n")
        elif kind == "h2":
            out.append(f"## {blk[1]}\n")
        elif kind == "p":
            out.append(f"{blk[1]}\n")
        elif kind == "img":
            out.append(f"![{blk[1]}]({blk[2].relative_to(root).as_posix()})\n")
        elif kind == "table":
            header, rows = blk[1], blk[2]
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
            out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def _html(blocks: list[Block], title: str) -> str:
    e = html.escape
    body = []
    for blk in blocks:
        kind = blk[0]
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{e(blk[1])}</{kind}>")
        elif kind == "p":
            body.append("<p>" + re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", e(blk[1])) + "</p>")
        elif kind == "img":
            data = base64.b64encode(blk[2].read_bytes()).decode("ascii")
            body.append(f'<p><img alt="{e(blk[1])}" src="data:image/png;base64,{data}"></p>')
        elif kind == "table":
            head = "".join(f"<th>{e(c)}</th>" for c in blk[1])
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in blk[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}img{max-width:100%}"
    )
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{e(title)}</title><style>{style}</style></head>'
        f"<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_report(result: ABResult, appendix: list[Block] | None = None) -> tuple[Path, Path]:
    """Write plots, ``report.md`` and ``report.html`` into the A/B folder; returns (md, html). ``appendix``: more
    blocks at the end (the demo adds the committed effects table)."""
    plots = _plots(result)
    blocks = _blocks(result, plots) + list(appendix or [])
    md, page = result.out_dir / "report.md", result.out_dir / "report.html"
    _write(md, _md(blocks, result.out_dir))
    _write(page, _html(blocks, f"A/B: {result.preset.name}"))
    return md, page


__all__ = ["fmt", "write_report"]
