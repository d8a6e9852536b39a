"""The text-encoder swap, measured (issue 35; the pre-registered plan is ``benchmarks/swap/bench_swap.md``).

Swap the SD 1.5 world base's CLIP for the world's T5 with ``te_align.swap.swap`` (every reset mode, output statistics
matched or unscaled), fine-tune the whole UNet plus the projection with ``te_align.train.train`` (``lora.rank = 0``,
``train.full_modules = [""]``) at two learning rates, and read back at fixed checkpoints what the images show for
prompts new in wording. One unit is one (cell, seed)::

    OMP_NUM_THREADS=1 python benchmarks/swap/swap_study.py --workers 2 --out swap-study   # the grid (resumable)
    python benchmarks/swap/swap_study.py --dry-run        # docs/swap.md's results section from the committed results
    python benchmarks/swap/swap_study.py --unit cross-matched-lr1e-4:0 --out swap-study   # one unit in this process

A finished unit writes ``<results>/<cell>/seed-<s>.json`` (and ``seed-<s>.png``, its sample row) and is never run
again; an interrupted one continues from its newest checkpoint (``OUT/<cell>/seed-<s>/``), and the checkpoints it has
already evaluated are not evaluated again. Every result carries the hash of the settings it ran under: results of
other settings (a test's tiny size, a changed plan) are refused by ``--dry-run``, never mixed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "swap" / "results"
#: What ``te-align swap --report`` cites: the study's numbers and verdicts, written by --dry-run once every unit is in.
SUMMARY = ROOT / "te_align" / "swap" / "data" / "study.json"
DOC = ROOT / "docs" / "swap.md"
FIGURES = ROOT / "docs" / "swap"
BEGIN = "<!-- swap-study results: written by benchmarks/swap/swap_study.py --dry-run from benchmarks/swap/results; do not edit -->"
END = "<!-- end of the swap-study results -->"

RESETS = ("none", "cross", "qk", "all")
SCALINGS = ("matched", "unscaled")
SIDE_STD = 0.2


@dataclass(frozen=True)
class Settings:
    """What the plan fixes (``benchmarks/swap/bench_swap.md``); the hash of these is every result's ``plan``."""

    base: str = "sd15"
    data_seed: int = 3500
    train_images: int = 2048
    val_seed: int = 3501
    val_images: int = 64
    probe_seed: int = 3500
    probes: int = 32
    grid_prompts: int = 8
    swap_captions: int = 256
    steps: int = 1000
    checkpoints: tuple[int, ...] = (0, 125, 250, 500, 1000)
    batch: int = 16
    rates: tuple[float, ...] = (1e-3, 1e-4)
    seeds: tuple[int, ...] = (0, 1, 2)
    sample_steps: int = 16
    guidance: float = 4.0
    size: int = 32
    noise_seed: int = 0

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cell:
    """One setting: ``reset`` None is the unswapped baseline; ``scaling`` matched, unscaled or std0.2 (the side cell)."""

    name: str
    lr: float
    reset: str | None = None
    scaling: str | None = None

    @property
    def label(self) -> str:
        if self.reset is None:
            return f"baseline (CLIP, not swapped), lr {self.lr:g}"
        return f"reset {self.reset}, {self.scaling}, lr {self.lr:g}"


def rate_tag(lr: float) -> str:
    return f"lr{lr:.0e}".replace("e-0", "e-")


def cells(settings: Settings) -> list[Cell]:
    """Baseline rows first, then the grid by rate, then the side cell (the plan's order of seed 0)."""
    out = [Cell(f"baseline-{rate_tag(r)}", r) for r in settings.rates]
    for r in settings.rates:
        out += [Cell(f"{reset}-{sc}-{rate_tag(r)}", r, reset, sc) for reset in RESETS for sc in SCALINGS]
    low = min(settings.rates)
    out.append(Cell(f"cross-std0.2-{rate_tag(low)}", low, "cross", "std0.2"))
    return out


# ------------------------------------------------------------------------------------------ data
def prepare_data(settings: Settings, out: Path) -> tuple[Path, Path]:
    """``OUT/data/{train,val}``: simple-world images, pink never shown (drawn once; a finished folder is kept)."""
    from te_align.tiny import world
    from te_align.tiny.datasets import write_world_split

    concept = world.Concept("colour", "pink")
    folders = []
    for name, n, seed in (("train", settings.train_images, settings.data_seed), ("val", settings.val_images, settings.val_seed)):
        dest = out / "data" / name
        if not (dest / ".complete").is_file():
            tmp = out / "data" / f".{name}.partial-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            samples = world.make_dataset(n, seed, split="base", concept=concept, space=world.SIMPLE, image_size=settings.size,
                                         tokenizer=False)  # fmt: skip
            write_world_split(tmp, samples, concept)
            (tmp / ".complete").write_text("", encoding="utf-8")
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        folders.append(dest)
    return folders[0], folders[1]


def probes(settings: Settings) -> list[Any]:
    from te_align.tiny.world import SHAPES
    from te_align.tiny.world.phrasings import probe_prompts

    return probe_prompts(settings.probe_seed, colour="*", shapes=SHAPES, lengths=[("short", settings.probes)], stream="swap")


def _captions(folder: Path) -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt"))]


# ------------------------------------------------------------------------------------------ one unit
def _machine() -> dict[str, Any]:
    import torch
    import transformers

    return {"processor": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads()}  # fmt: skip


def _load(settings: Settings, cell: Cell, seed: int, train_dir: Path) -> tuple[Any, Any, dict[str, Any] | None]:
    """(pipeline, profile, swap record): the base, swapped as the cell says (in memory, deterministic per seed)."""
    import diffusers
    import torch
    import transformers

    from te_align.tiny import bases
    from te_align.tiny.tokenizers import t5_tokenizer

    folder = bases.materialize(settings.base)
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(folder), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    profile = bases.base_profile(settings.base)
    if cell.reset is None:
        return pipe, profile, None
    from te_align.swap import swap

    enc = transformers.T5EncoderModel.from_pretrained(str(bases.data_root() / "encoders" / "t5"), dtype=torch.float32).eval()
    captions = _captions(train_dir)[: settings.swap_captions]
    report, pipe = swap(None, enc, None, tokenizer=t5_tokenizer(), pipeline=pipe, profile=profile, captions=captions,
                        reset=cell.reset, seed=seed)  # fmt: skip
    scale = report.scale[0]
    if cell.scaling == "unscaled":
        scale = 1.0
    elif cell.scaling == "std0.2":
        scale = SIDE_STD / report.before.summary()["std"]
    with torch.no_grad():
        pipe.text_encoder.output_scale.fill_(scale)
        pipe.text_encoder.output_shift.zero_()
    record = {"target": report.target.summary(), "before": report.before.summary(), "measured_scale": report.scale[0],
              "used_scale": scale, "reset_layers": len(report.reset_layers)}  # fmt: skip
    return pipe, report.profile, record


def _train_config(settings: Settings, cell: Cell, seed: int, unit: Path, train_dir: Path, cache: Path, profile_file: Path,
                  model: str) -> Any:  # fmt: skip
    from te_align.train import config_from_dict

    side = settings.size
    return config_from_dict({
        "model": {"path": model, "profile": str(profile_file), "dtype": "float32", "free_encoders": False},
        "data": {"path": str(train_dir), "resolution": side, "bucket_step": side, "min_bucket": side, "max_bucket": side,
                 "enable_bucketing": False, "random_flip": False, "cache_dir": str(cache), "encoder_dropout": {"all": "profile"}},
        "lora": {"rank": 0},
        "train": {"seed": seed, "batch_size": settings.batch, "max_steps": settings.steps, "learning_rate": cell.lr,
                  "full_modules": [""], "weight_decay": 0.0, "max_grad_norm": 1.0, "lr_scheduler": "constant",
                  "warmup_steps": 0, "checkpoint_every": 0, "checkpoints_keep": 1, "device": "cpu", "threads": 1},
        "output": {"dir": str(unit / "run"), "name": "swap", "kohya": False},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False, "every": 10},
    })  # fmt: skip


class Evaluator:
    """Probe-prompt accuracy and validation loss of a pipeline's current weights."""

    def __init__(self, settings: Settings, val_dir: Path) -> None:
        self.settings = settings
        self.probes = probes(settings)
        self.val_files = sorted(val_dir.glob("*.png"))
        self.val_captions = [f.with_suffix(".txt").read_text(encoding="utf-8") for f in self.val_files]

    def __call__(self, pipe: Any, profile: Any) -> tuple[dict[str, Any], list[Any]]:
        import torch

        import te_align
        from te_align.ab import accuracy, evaluate
        from te_align.tiny import world
        from te_align.train.models import family_of

        s = self.settings
        pipe.unet.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            images = accuracy.sample_prompts(pipe, profile, [q.text for q in self.probes], steps=s.sample_steps,
                                             guidance=s.guidance, size=s.size, seed=0)  # fmt: skip
        reads = [world.read_image(im) for im in images]
        rows = [world.score_keys([tuple(o[:3]) for o in q.objects], r) for q, r in zip(self.probes, reads, strict=True)]
        n = sum(r["objects"] for r in rows)
        out: dict[str, Any] = {key: sum(r[key] * r["objects"] for r in rows) / n for key in ("colour", "shape", "position")}
        out["exact"] = sum(r["exact"] for r in rows) / n
        out["drawn"] = sum(1 for r in reads if r) / len(reads)
        out["extra"] = sum(r["extra"] for r in rows) / len(rows)
        out["reads"] = [[list(k) for k in r] for r in reads]
        latents = evaluate.load_val_latents(pipe, self.val_files, s.size)
        timesteps = list(evaluate.DEFAULT_TIMESTEPS)
        noise = evaluate.fixed_noise(latents, len(timesteps), s.noise_seed)
        with torch.no_grad():
            cond = te_align.encode(profile, self.val_captions, pipeline=pipe)
        out["val_loss"] = evaluate.validation_loss(family=family_of(profile), denoiser=pipe.unet, latents=latents, noise=noise,
                                                   timesteps=timesteps, cond=cond, objective="eps",
                                                   scheduler_config=pipe.scheduler.config)  # fmt: skip
        out["eval_seconds"] = time.perf_counter() - t0
        return out, images


def _write_json(path: Path, data: Any) -> None:
    from te_align._atomic import atomic_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as f:
        f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")


def result_path(results: Path, cell: Cell | str, seed: int) -> Path:
    return results / (cell if isinstance(cell, str) else cell.name) / f"seed-{seed}.json"


def _row(metrics: dict[str, Any], step: int, *, last: bool) -> dict[str, Any]:
    """A checkpoint's metrics as the result keeps them: the reader's readings of the last checkpoint only."""
    return {k: v for k, v in metrics.items() if k != "reads" or last} | {"step": step}


def run_unit(settings: Settings, cell: Cell, seed: int, out: Path, results: Path, say: Any = print) -> dict[str, Any]:
    """Train and evaluate one (cell, seed), resuming where it stopped; returns its result (also written)."""
    import numpy as np
    from PIL import Image

    from te_align.train import train
    from te_align.train.checkpoint import list_checkpoints

    target = result_path(results, cell, seed)
    plan = settings.hash()
    if target.is_file():
        done = json.loads(target.read_text(encoding="utf-8"))
        if done.get("plan") == plan:
            return done
        raise SystemExit(f"{target}: a result of another plan ({done.get('plan')}, this one is {plan}); move it away first")
    t_start, c_start = time.perf_counter(), time.process_time()
    train_dir, val_dir = prepare_data(settings, out)
    unit = out / cell.name / f"seed-{seed}"
    unit.mkdir(parents=True, exist_ok=True)
    progress_file = unit / "progress.json"
    progress: dict[str, Any] = json.loads(progress_file.read_text(encoding="utf-8")) if progress_file.is_file() else {}
    if progress and progress.get("plan") != plan:
        raise SystemExit(f"{unit}: a unit of another plan ({progress.get('plan')}); use another --out")
    progress.setdefault("plan", plan)
    evaluated: dict[int, dict[str, Any]] = {int(k): v for k, v in progress.get("checkpoints", {}).items()}
    pipe, profile, swap_record = _load(settings, cell, seed, train_dir)
    profile_file = unit / "profile.toml"
    profile_file.write_text(profile.to_toml(), encoding="utf-8")
    evaluator = Evaluator(settings, val_dir)
    train_seconds = float(progress.get("train_seconds", 0.0))

    def record(step: int) -> None:
        metrics, images = evaluator(pipe, profile)
        if step == settings.checkpoints[-1]:  # the sample row of the last checkpoint, kept with the unit
            Image.fromarray(np.concatenate(images[: settings.grid_prompts], axis=1)).save(unit / "samples.png")
        evaluated[step] = metrics
        progress.update(checkpoints={str(k): v for k, v in sorted(evaluated.items())}, train_seconds=train_seconds)
        _write_json(progress_file, progress)
        say(f"{cell.name} seed {seed} step {step}: exact {metrics['exact']:.3f} colour {metrics['colour']:.3f} "
            f"shape {metrics['shape']:.3f} position {metrics['position']:.3f} drawn {metrics['drawn']:.3f} "
            f"val loss {metrics['val_loss']:.4f}")  # fmt: skip

    if 0 not in evaluated:
        record(0)
    from te_align.tiny import bases

    cfg = _train_config(settings, cell, seed, unit, train_dir, out / "cache", profile_file, str(bases.materialize(settings.base)))
    # each segment starts from the weights as swapped (a resumed run must see the model it started from) and loads
    # the newest checkpoint on disk, which holds every trained weight (the whole UNet and the projection)
    initial = {name: {k: v.detach().clone() for k, v in getattr(pipe, name).state_dict().items()} for name in ("unet", "text_encoder")}
    for step in settings.checkpoints[1:]:
        if step in evaluated:
            continue
        found = list_checkpoints(unit / "run")
        current = found[-1][0] if found else 0
        for name, state in initial.items():
            getattr(pipe, name).load_state_dict(state)
        t0 = time.perf_counter()
        result = train(cfg, pipeline=pipe, resume=True if found else None, stop_after=max(0, step - current))
        train_seconds += time.perf_counter() - t0
        progress["losses"] = [list(x) for x in result.losses]
        record(step)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(unit / "samples.png", target.with_suffix(".png"))
    data = {
        "plan": plan, "settings": asdict(settings), "cell": asdict(cell), "seed": seed, "swap": swap_record,
        "checkpoints": [_row(evaluated[s], s, last=s == settings.checkpoints[-1]) for s in settings.checkpoints], "losses": progress.get("losses", []),
        "train_seconds": train_seconds, "wall_seconds": time.perf_counter() - t_start,
        "cpu_seconds": time.process_time() - c_start, "machine": _machine(),
    }  # fmt: skip
    _write_json(target, data)
    shutil.rmtree(unit / "run" / "checkpoints", ignore_errors=True)  # the result is what is kept
    return data


# ------------------------------------------------------------------------------------------ workers
def run_grid(settings: Settings, chosen: list[Cell], out: Path, results: Path, workers: int, extra: list[str]) -> int:
    """Every unit not yet in ``results``, seed by seed, in ``workers`` single-thread processes; returns failures."""
    todo = [(c, s) for s in settings.seeds for c in chosen if not result_path(results, c, s).is_file()]
    print(f"{len(todo)} units to run ({len(chosen) * len(settings.seeds) - len(todo)} already done), {workers} workers",
          flush=True)  # fmt: skip
    if not todo:
        return 0
    prepare_data(settings, out)  # once, before the workers start
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TE_ALIGN_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen[bytes], str, float, Any]] = []
    failures = 0
    while todo or running:
        while todo and len(running) < workers:
            cell, seed = todo.pop(0)
            tag = f"{cell.name}:{seed}"
            log = open(logs / f"{cell.name}-seed-{seed}.log", "ab")  # closed when the process ends
            cmd = [sys.executable, str(Path(__file__).resolve()), "--unit", tag, "--out", str(out), "--results", str(results),
                   *extra]  # fmt: skip
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), tag, time.perf_counter(), log))
        time.sleep(1.0)
        for item in list(running):
            proc, tag, t0, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            if proc.returncode:
                failures += 1
                print(f"{tag}: FAILED (exit {proc.returncode}; log {logs})", flush=True)
            else:
                print(f"{tag}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return failures


# ------------------------------------------------------------------------------------------ reading
@dataclass
class CellStats:
    cell: Cell
    runs: dict[int, dict[str, Any]]

    def values(self, metric: str, step: int | None = None) -> list[float]:
        out = []
        for seed in sorted(self.runs):
            rows = self.runs[seed]["checkpoints"]
            row = rows[-1] if step is None else next(r for r in rows if r["step"] == step)
            out.append(float(row[metric]))
        return out


def interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student t interval of the mean (NaN bounds with fewer than 2 values)."""
    from te_align.ab.stats import t_quantile

    if not values:
        return math.nan, math.nan, math.nan
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan, math.nan
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return m, m - half, m + half


def fmt(values: Sequence[float], digits: int = 2) -> str:
    m, lo, hi = interval(values)
    if math.isnan(m):
        return "—"
    if math.isnan(lo):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def load_results(results: Path, settings: Settings) -> tuple[dict[str, CellStats], list[str]]:
    """The committed results of this plan by cell, and one line per refused file (another plan)."""
    plan = settings.hash()
    by_name = {c.name: CellStats(c, {}) for c in cells(settings)}
    refused = []
    for path in sorted(results.glob("*/seed-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("plan") != plan or path.parent.name not in by_name:
            refused.append(f"{path.relative_to(results)}: plan {data.get('plan')} (this plan is {plan})")
            continue
        by_name[path.parent.name].runs[int(data["seed"])] = data
    return by_name, refused


def _paired(a: CellStats, b: CellStats, metric: str = "exact") -> Any:
    from te_align.ab.stats import Metric, paired

    seeds = sorted(set(a.runs) & set(b.runs))
    va = [a.values(metric)[sorted(a.runs).index(s)] for s in seeds]
    vb = [b.values(metric)[sorted(b.runs).index(s)] for s in seeds]
    return paired(Metric(metric, higher_better=metric != "val_loss"), va, vb)


def readings(stats: dict[str, CellStats], settings: Settings, verdicts: dict[str, str] | None = None) -> list[str]:
    """The plain readings C1-C5 of the plan, each with its interval (Holm over the 14 claim tests); ``verdicts``, if
    given, receives each claim's verdict word (``C1`` ... ``C5``) once every cell is complete."""
    verdicts = {} if verdicts is None else verdicts
    from te_align.ab.stats import holm

    n_seeds = len(settings.seeds)
    hi, lo = max(settings.rates), min(settings.rates)

    def c(reset: str, scaling: str, lr: float) -> CellStats:
        return stats[f"{reset}-{scaling}-{rate_tag(lr)}"]

    tests: list[tuple[str, CellStats, CellStats]] = [
        *[(f"C1 cross − {x} (matched, lr {lo:g})", c("cross", "matched", lo), c(x, "matched", lo)) for x in ("none", "qk", "all")],
        (f"C2 qk lr {hi:g} − qk lr {lo:g} (matched)", c("qk", "matched", hi), c("qk", "matched", lo)),
        *[(f"C3 all − none (matched, lr {r:g})", c("all", "matched", r), c("none", "matched", r)) for r in (hi, lo)],
        *[(f"C4 matched − unscaled ({x}, lr {r:g})", c(x, "matched", r), c(x, "unscaled", r)) for r in (hi, lo) for x in RESETS],
    ]  # fmt: skip
    complete = all(len(a.runs) == n_seeds and len(b.runs) == n_seeds for _, a, b in tests)
    if not complete:
        have = sum(len(s.runs) for s in stats.values())
        return [f"Readings pending: {have} of {len(stats) * n_seeds} cell-seeds are in; the claims are read once every "
                "cell they compare has all its seeds (plan: benchmarks/swap/bench_swap.md)."]  # fmt: skip
    summaries = [_paired(a, b) for _, a, b in tests]
    adjusted = holm([s.p_t for s in summaries])

    def word(k: int) -> str:
        s, p = summaries[k], adjusted[k]
        if math.isnan(p) or p >= 0.05:
            return "null"
        return "above zero" if s.diff_mean > 0 else "below zero"

    def show(k: int) -> str:
        s = summaries[k]
        low, high = s.interval
        return f"{tests[k][0]}: {s.diff_mean:+.3f} [{low:+.3f}, {high:+.3f}], Holm p {adjusted[k]:.3f} ({word(k)})"

    lines = []
    c1 = [word(k) for k in range(3)]
    verdict = ("supported" if all(w == "above zero" for w in c1) else "contradicted" if "below zero" in c1 else "null")
    verdicts["C1"] = verdict
    lines.append(f"**C1, the cross-attention reset recovers best at the low rate: {verdict}.** "
                 + "; ".join(show(k) for k in range(3)) + ".")  # fmt: skip
    c2 = word(3)
    verdict = {"above zero": "supported", "below zero": "contradicted"}.get(c2, "null")
    gain_qk, gain_cross = _paired(c("qk", "matched", hi), c("qk", "matched", lo)), _paired(c("cross", "matched", hi), c("cross", "matched", lo))
    verdicts["C2"] = verdict
    lines.append(f"**C2, a Q/K reset needs the higher rate: {verdict}.** {show(3)}. Beside it (not read): cross gains "
                 f"{gain_cross.diff_mean:+.3f} from the higher rate, qk {gain_qk.diff_mean:+.3f}.")  # fmt: skip
    drawn = {r: interval(c("all", "matched", r).values("drawn")) for r in (hi, lo)}
    extra = {r: interval(c("all", "matched", r).values("extra")) for r in (hi, lo)}

    def collapse(r: float) -> str:
        """Amendment 1: collapse = most images show no object, or heavy noise = more than one spurious object per image."""
        (_, d_low, d_high), (_, e_low, e_high) = drawn[r], extra[r]
        if d_high < 0.5 or e_low > 1.0:
            return "collapses"
        return "does not collapse" if d_low > 0.5 and e_high < 1.0 else "not resolved"

    state = {r: collapse(r) for r in (hi, lo)}
    verdict = ("supported" if state[lo] == "collapses" and state[hi] == "does not collapse"
               else "contradicted" if state[lo] == "does not collapse" else "null")  # fmt: skip
    verdicts["C3"] = verdict
    lines.append(f"**C3, a full reset collapses unless the rate is raised: {verdict}.** Reset all, matched: "
                 + "; ".join(f"at lr {r:g} images with an object {drawn[r][0]:.2f} [{drawn[r][1]:.2f}, {drawn[r][2]:.2f}], "
                             f"spurious objects per image {extra[r][0]:.2f} [{extra[r][1]:.2f}, {extra[r][2]:.2f}] ({state[r]})"
                             for r in (hi, lo))
                 + f". Exact accuracy against no reset: {show(4)}; {show(5)}.")  # fmt: skip
    c4 = [word(k) for k in range(6, 14)]
    helps, hurts = c4.count("above zero"), c4.count("below zero")
    verdict = ("supported" if helps and not hurts else "contradicted" if hurts and not helps else "mixed" if helps and hurts
               else "null")  # fmt: skip
    verdicts["C4"] = verdict
    lines.append(f"**C4, matching the std matters: {verdict}** ({helps} of 8 pairs: matching helps; {hurts}: it hurts). "
                 + "; ".join(show(k) for k in range(6, 14)) + ".")  # fmt: skip
    side = stats[f"cross-std0.2-{rate_tag(lo)}"]
    target = [r["swap"]["target"]["std"] for r in c("cross", "matched", lo).runs.values()]
    if len(side.runs) == n_seeds:
        s = _paired(c("cross", "matched", lo), side)
        low, high = s.interval
        verdicts["C5"] = "own std better" if low > 0 else "0.2 better" if high < 0 else "not distinguished"
        if low > 0:
            read = ("what helps is the base's own statistic; 0.2 is a number for one base, to be measured (`te-align swap` "
                    "measures it), not a constant")  # fmt: skip
        elif high < 0:
            read = "0.2 recovers better than the base's own std on this base"
        else:
            read = "0.2 and the base's own std are not distinguished on this base"
        lines.append(f"**C5, is 0.2 special?** The SD 1.5 world base's CLIP conditioning std is {statistics.fmean(target):.3f} "
                     f"(measured by every swap). Matched − std 0.2 (cross, lr {lo:g}): {s.diff_mean:+.3f} [{low:+.3f}, "
                     f"{high:+.3f}] (paired, not in the Holm family): {read}. The real SD 1.5 CLIP-L's std is not "
                     "measured here (no real weights in this repository).")  # fmt: skip
    else:
        lines.append(f"**C5, is 0.2 special?** Pending (side cell: {len(side.runs)} of {n_seeds} seeds).")
    return lines


CLAIMS = {
    "C1": "the cross-attention reset recovers best at the low rate",
    "C2": "a Q/K reset needs the higher rate",
    "C3": "a full reset collapses unless the rate is raised",
    "C4": "matching the std matters",
    "C5": "is 0.2 special, or the base's own std",
}


#: The diagnosis after the study (benchmarks/swap/swap_cfg_check.py), when committed: cited as a caveat, never a verdict.
CFG_CHECK = ROOT / "benchmarks" / "swap" / "cfg-check.json"


def caveats(settings: Settings, cfg_check: Path = CFG_CHECK) -> list[str]:
    """What bounds the readings, for ``te-align swap --report``: the guidance every checkpoint was sampled at and,
    if the post-study check is committed, what the unswapped baseline reads at other guidance scales."""
    out = [f"every checkpoint was sampled at the base's guidance scale {settings.guidance:g}"]
    if not cfg_check.is_file():
        return out
    data = json.loads(cfg_check.read_text(encoding="utf-8"))
    for key, sweep in sorted(data["runs"].items()):
        name, _, seed = key.partition(":")
        at = sweep[f"{settings.guidance:g}"]["exact"]
        best = max(sweep, key=lambda g: (sweep[g]["exact"], -float(g)))
        out.append(f"a check after the study (benchmarks/swap/swap_cfg_check.py, seed {seed}): the unswapped {name} reads "
                   f"exact {at:.2f} at guidance {settings.guidance:g} and {sweep[best]['exact']:.2f} at {best}")  # fmt: skip
    return out


def study_summary(stats: dict[str, CellStats], settings: Settings,
                  verdicts: dict[str, str] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """What ``te-align swap --report`` prints from the study (None until every cell has every seed): each cell's
    last-checkpoint numbers with their intervals, the claims' verdicts, and per rate the swapped cell with the highest
    mean exact accuracy, paired against the next one (is it resolved?). ``verdicts``: the claims' verdicts as
    :func:`readings` filled them (computed here when not given)."""
    n_seeds = len(settings.seeds)
    if any(len(s.runs) != n_seeds for s in stats.values()):
        return None
    if verdicts is None:
        verdicts = {}
        readings(stats, settings, verdicts)

    def three(values: Sequence[float], digits: int) -> list[float]:
        return [round(x, digits) for x in interval(values)]

    out_cells = []
    for s in stats.values():
        out_cells.append({"name": s.cell.name, "reset": s.cell.reset, "scaling": s.cell.scaling, "lr": s.cell.lr,
                          **{m: three(s.values(m), 4) for m in ("exact", "colour", "position", "shape", "drawn")},
                          "val_loss": three(s.values("val_loss"), 5)})  # fmt: skip
    best: dict[str, Any] = {}
    for lr in settings.rates:
        grid = sorted((s for s in stats.values() if s.cell.reset is not None and s.cell.lr == lr
                       and s.cell.scaling in SCALINGS), key=lambda s: -statistics.fmean(s.values("exact")))  # fmt: skip
        first, second = grid[0], grid[1]
        d = _paired(first, second)
        best[f"{lr:g}"] = {"cell": first.cell.name, "reset": first.cell.reset, "scaling": first.cell.scaling,
                           "exact": three(first.values("exact"), 4), "next": second.cell.name,
                           "difference": [round(d.diff_mean, 4), round(d.interval[0], 4), round(d.interval[1], 4)],
                           "resolved": bool(d.interval[0] > 0)}  # fmt: skip
    any_run = next(iter(next(s for s in stats.values() if s.cell.scaling == "matched").runs.values()))
    return {
        "study": "te-align's text-encoder swap study (issue 35)",
        "plan": "benchmarks/swap/bench_swap.md",
        "plan_hash": settings.hash(),
        "doc": "docs/swap.md",
        "setup": (f"te-align's SD 1.5 world base (tiny UNet, CLIP-L width 32) with the world's T5 (width 96) swapped in "
                  f"by te_align.swap.swap; the whole UNet and the projection fine-tuned for {settings.steps} steps "
                  f"(batch {settings.batch}, {settings.train_images} world images); exact = share of {settings.probes} "
                  f"prompts new in wording drawn exactly as asked; {n_seeds} seeds, 95% t intervals"),
        "steps": settings.steps,
        "seeds": n_seeds,
        "guidance": settings.guidance,
        "caveats": caveats(settings),
        "base_std": round(statistics.fmean(r["swap"]["target"]["std"] for s in stats.values()
                                           if s.cell.scaling == "matched" for r in s.runs.values()), 4),
        "new_std_before_scaling": round(float(any_run["swap"]["before"]["std"]), 4),
        "cells": out_cells,
        "claims": {k: {"claim": CLAIMS[k], "verdict": verdicts.get(k, "pending")} for k in CLAIMS},
        "best": best,
    }


def write_summary(stats: dict[str, CellStats], settings: Settings, path: Path,
                  verdicts: dict[str, str] | None = None) -> bool:  # fmt: skip
    """Write :func:`study_summary` to ``path`` when the study is complete; False (nothing written) otherwise."""
    summary = study_summary(stats, settings, verdicts)
    if summary is None:
        return False
    _write_json(path, summary)
    return True


def write_doc(settings: Settings, results: Path, doc: Path, figures: Path, *,
              loaded: tuple[dict[str, CellStats], list[str]] | None = None,
              verdicts: dict[str, str] | None = None) -> str:  # fmt: skip
    """The results section of ``doc`` (and its figures) from ``results``; returns the section. ``loaded``: what
    :func:`load_results` gave for ``results`` (read here when not given); ``verdicts`` is filled by the readings."""
    from PIL import Image

    from te_align.ab.plots import Series, band_plot, image_grid

    stats, refused = loaded if loaded is not None else load_results(results, settings)
    n_seeds = len(settings.seeds)
    figures.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(figures, doc.parent)
    have = sum(len(s.runs) for s in stats.values())
    lines = [BEGIN, "", "## The study: results", "",
             f"Plan: `benchmarks/swap/bench_swap.md` (settings hash `{settings.hash()}`); {have} of {len(stats) * n_seeds} "
             f"cell-seeds in. Every number is the mean over seeds with its 95% t interval, at the last checkpoint "
             f"(step {settings.checkpoints[-1]}); *exact* is the share of the {settings.probes} held-out prompts drawn "
             "exactly as asked (colour, shape, position). Chance levels: colour 1/7, shape 1/4, position 1/9, exact 1/252 "
             "(each times *drawn*).", ""]  # fmt: skip
    runs = [r for s in stats.values() for r in s.runs.values()]
    if runs:
        walls = [r["wall_seconds"] for r in runs]
        cpus = [r["cpu_seconds"] for r in runs]
        free = [r["cpu_seconds"] for r in runs if r["wall_seconds"] <= 1.05 * r["cpu_seconds"]]
        med, units = statistics.median(cpus), len(stats) * n_seeds
        text = (f"Measured (each unit's seconds are those of its last segment: a unit resumed after an interruption "
                f"counts only the part after it): {len(runs)} units, CPU median {med:.0f} s ({min(cpus):.0f}-"
                f"{max(cpus):.0f}); wall {min(walls):.0f}-{max(walls):.0f} s, median {statistics.median(walls):.0f} s, "
                "on a machine shared with other studies and sessions.")  # fmt: skip
        if free:
            text += (f" {len(free)} units ran on a free core (wall within 5% of CPU): median {statistics.median(free):.0f} s. "
                     f"The grid on two free cores: {units} units x {med:.0f} s / 2 workers = {units * med / 2 / 3600:.2f} "
                     "hours (the budget: 3).")  # fmt: skip
        lines += [text, ""]
    palette = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
               (227, 119, 194), (127, 127, 127), (23, 190, 207), (188, 189, 34)]  # fmt: skip
    for lr in settings.rates:
        tag = rate_tag(lr)
        base = stats[f"baseline-{tag}"]
        lines += [f"### Learning rate {lr:g}", "", "Exact accuracy (reset x output statistics):", "",
                  "| reset | matched | unscaled |", "|---|---|---|"]  # fmt: skip
        for reset in RESETS:
            row = [stats[f"{reset}-{sc}-{tag}"] for sc in SCALINGS]
            lines.append(f"| {reset} | " + " | ".join(_cell_text(s, "exact", n_seeds) for s in row) + " |")
        lines.append(f"| baseline: CLIP, not swapped | {_cell_text(base, 'exact', n_seeds)} | |")
        lines += ["", "Every metric:", "",
                  "| cell | exact | colour | position | shape (chance 0.25 x drawn) | drawn | validation loss | seeds |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        row_cells = [base] + [stats[f"{reset}-{sc}-{tag}"] for reset in RESETS for sc in SCALINGS]
        if f"cross-std0.2-{tag}" in stats:
            row_cells.append(stats[f"cross-std0.2-{tag}"])
        for s in row_cells:
            if not s.runs:
                lines.append(f"| {s.cell.label} | pending (0 of {n_seeds} seeds) | | | | | | 0 |")
                continue
            shape_chance = 0.25 * statistics.fmean(s.values("drawn"))
            lines.append(f"| {s.cell.label} | {fmt(s.values('exact'))} | {fmt(s.values('colour'))} | {fmt(s.values('position'))} "
                         f"| {fmt(s.values('shape'))} ({shape_chance:.2f}) | {fmt(s.values('drawn'))} | "
                         f"{fmt(s.values('val_loss'), 4)} | {len(s.runs)} |")  # fmt: skip
        series = []
        for k, s in enumerate(row_cells):
            if not s.runs:
                continue
            steps = list(settings.checkpoints)
            means = [interval(s.values("exact", st)) for st in steps]
            series.append(Series(s.cell.name.removesuffix(f"-{tag}"), palette[k % len(palette)], steps,
                                 [m[0] for m in means], markers=True))  # fmt: skip
        (figures / f"curves-{tag}.png").write_bytes(band_plot(series, title=f"exact accuracy by step, lr {lr:g} "
                                                              "(mean over seeds)"))  # fmt: skip
        grid_rows = []
        for s in row_cells:
            png = result_path(results, s.cell, min(s.runs)).with_suffix(".png") if s.runs else None
            if png is None or not png.is_file():
                continue
            with Image.open(png) as im:
                strip = im.convert("RGB")
            side = strip.height
            grid_rows.append((f"{s.cell.label} (seed {min(s.runs)})",
                              [strip.crop((j * side, 0, (j + 1) * side, side)) for j in range(strip.width // side)]))  # fmt: skip
        columns = [f"{j + 1}" for j in range(settings.grid_prompts)]
        (figures / f"samples-{tag}.png").write_bytes(image_grid(grid_rows, columns, cell=64,
                                                                title=f"last checkpoint, lr {lr:g}: the first "
                                                                f"{settings.grid_prompts} prompts"))  # fmt: skip
        lines += ["", f"![exact accuracy by step, lr {lr:g}]({rel}/curves-{tag}.png)", "",
                  f"![samples, lr {lr:g}]({rel}/samples-{tag}.png)", ""]  # fmt: skip
    prompts = probes(settings)[: settings.grid_prompts]
    lines += ["Sample-grid prompts (columns): " + "; ".join(f"{j + 1}. \"{q.text}\"" for j, q in enumerate(prompts)) + ".", "",
              "### Readings (rules fixed in the plan)", ""]  # fmt: skip
    lines += [f"- {x}" for x in readings(stats, settings, verdicts)]
    if refused:
        lines += ["", f"Refused (another plan): {len(refused)} files, e.g. {refused[0]}."]
    lines += ["", END]
    section = "\n".join(lines) + "\n"
    text = doc.read_text(encoding="utf-8") if doc.is_file() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + (("\n" + tail) if tail else "")
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    doc.write_text(text, encoding="utf-8")
    return section


def _cell_text(s: CellStats, metric: str, n_seeds: int) -> str:
    if not s.runs:
        return f"pending (0 of {n_seeds})"
    text = fmt(s.values(metric))
    return text if len(s.runs) == n_seeds else f"{text} ({len(s.runs)} of {n_seeds} seeds)"


# ------------------------------------------------------------------------------------------ command line
#: Options that change the plan's size (tests and the timing run; any of them gives results another plan hash).
SIZE_OPTIONS = ("steps", "train_images", "val_images", "probes", "grid_prompts", "swap_captions", "batch", "seeds")


def _settings(args: argparse.Namespace) -> Settings:
    s = Settings()
    changes: dict[str, Any] = {}
    for key in ("steps", "train_images", "val_images", "probes", "grid_prompts", "swap_captions", "batch"):
        v = getattr(args, key)
        if v is not None:
            changes[key] = v
    if args.checkpoints:
        changes["checkpoints"] = tuple(int(x) for x in args.checkpoints.split(","))
    if args.seeds is not None:
        changes["seeds"] = tuple(range(args.seeds))
    s = replace(s, **changes)
    if s.checkpoints[0] != 0 or s.checkpoints[-1] != s.steps or list(s.checkpoints) != sorted(set(s.checkpoints)):
        raise SystemExit(f"--checkpoints: expected increasing steps from 0 to --steps ({s.steps}), got {list(s.checkpoints)}")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="swap-study", help="working folder (data, caches, unit folders, logs)")
    ap.add_argument("--results", default=str(RESULTS), help="per-seed result files (default: the committed ones)")
    ap.add_argument("--doc", default=str(DOC), help="the document whose results section --dry-run (re)writes")
    ap.add_argument("--figures", default=str(FIGURES), help="folder of the document's PNG figures")
    ap.add_argument("--summary", default=str(SUMMARY),
                    help="where --dry-run writes the study's summary for te-align swap --report (once complete)")
    ap.add_argument("--workers", type=int, default=2, help="single-thread worker processes (default 2)")
    ap.add_argument("--cells", default="", help="comma-separated cell names (default: every cell of the plan)")
    ap.add_argument("--unit", default="", help="CELL:SEED: run one unit in this process")
    ap.add_argument("--dry-run", action="store_true", help="only regenerate the document from the results")
    for key in SIZE_OPTIONS:
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=None, help="(tests and timing) override the plan")
    ap.add_argument("--checkpoints", default="", help="(tests and timing) comma-separated steps, 0 first, --steps last")
    args = ap.parse_args(argv)
    settings = _settings(args)
    out, results = Path(args.out).expanduser(), Path(args.results).expanduser()
    known = {c.name: c for c in cells(settings)}
    if args.unit:
        name, _, seed = args.unit.rpartition(":")
        if name not in known or not seed.isdigit():
            raise SystemExit(f"--unit: expected CELL:SEED with CELL one of {', '.join(known)}, got {args.unit!r}")
        import torch

        torch.set_num_threads(1)
        run_unit(settings, known[name], int(seed), out, results, say=lambda m: print(m, flush=True))
        return 0
    if args.dry_run:
        loaded = load_results(results, settings)
        verdicts: dict[str, str] = {}
        section = write_doc(settings, results, Path(args.doc), Path(args.figures), loaded=loaded, verdicts=verdicts)
        print(section)
        # only the plan's own size is cited by te-align swap --report (a test's tiny run never writes it)
        if settings == Settings() and write_summary(loaded[0], settings, Path(args.summary).expanduser(), verdicts):
            print(f"summary for te-align swap --report: {args.summary}")
        return 0
    chosen = list(known.values())
    if args.cells:
        names = [x for x in args.cells.split(",") if x]
        bad = [x for x in names if x not in known]
        if bad:
            raise SystemExit(f"--cells: unknown cell {bad[0]!r}; cells: {', '.join(known)}")
        chosen = [known[x] for x in names]
    extra = [x for key in SIZE_OPTIONS if getattr(args, key) is not None for x in (f"--{key.replace('_', '-')}", str(getattr(args, key)))]
    extra += ["--checkpoints", args.checkpoints] if args.checkpoints else []
    failures = run_grid(settings, chosen, out, results, max(1, args.workers), extra)
    write_doc(settings, results, Path(args.doc), Path(args.figures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
