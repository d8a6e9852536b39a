"""The A/B runner: train both arms per seed with te_align.train, evaluate them, write the report.

Output folder layout::

    OUT/ab_state.json                 progress (written atomically after every finished arm / evaluation)
    OUT/profiles/A.toml, B.toml       the arms' profiles (A: baseline overrides; B: the profile)
    OUT/data/train, OUT/data/val      the split when --data has no train/ + val/ folders
    OUT/runs/seed-S/{A,B}/            te_align.train output (LoRA, checkpoints, logs)
    OUT/samples/seed-S/{A,B}/         sample images (identical prompts and seeds for both arms)
    OUT/report.md, OUT/report.html, OUT/plots/*.png

An interrupted A/B resumes where it stopped: finished arms and evaluations are read back from the
state file, an unfinished arm continues from its newest checkpoint (``te_align.train`` resume).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import te_align
from te_align._atomic import atomic_file
from te_align._lazy import lazy_module
from te_align._types import JSONObject
from te_align.ab import accuracy, evaluate
from te_align.ab.evaluate import Divergence
from te_align.ab.preset import ABError, Preset, _merge, load_preset, train_config_dict
from te_align.ab.report import write_report
from te_align.ab.stats import NO_DIFFERENCE, NO_VERDICT, Metric, paired
from te_align.profiles.overrides import resolve
from te_align.tiny import world
from te_align.tiny.bases import BaseError, base_info, materialize
from te_align.tiny.datasets import ANSWER_KEY, read_answer_key, write_world_split
from te_align.tiny.fit import _folder_components, architecture_overrides
from te_align.tiny.world.phrasings import ProbePrompt, probe_prompts
from te_align.train.checkpoint import latest_checkpoint, list_checkpoints
from te_align.train.config import SampleConfig, config_from_dict
from te_align.train.data import IMAGE_EXTENSIONS
from te_align.train.models import (
    add_lora,
    check_model,
    denoiser_mask_on,
    family_of,
    flow_timestep_scale,
    load_pipeline,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from te_align.encoding import Conditioning
    from te_align.profiles.model import AlignmentProfile

#: Deferred: they import torch, which this module leaves to the functions that train and sample.
_encoding_core = lazy_module("te_align.encoding.core")
_loop = lazy_module("te_align.train.loop")
_sampling = lazy_module("te_align.train.sampling")

logger = logging.getLogger("te_align.ab")

STATE_FILE = "ab_state.json"
STATE_FORMAT = 1
ARMS = ("A", "B")


@dataclass
class ArmRun:
    seed: int
    arm: str
    steps: int = 0
    seconds: float = 0.0
    losses: list[tuple[int, float]] = field(default_factory=list)
    #: Validation loss per checkpoint step, conditioning by the profile (what inference uses).
    val: list[tuple[int, float]] = field(default_factory=list)
    #: Validation loss per checkpoint step, conditioning as the arm was trained.
    val_own: list[tuple[int, float]] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)
    #: Prompt accuracy of the final weights (validation folders with a shapes-world answer key).
    accuracy: dict[str, float] = field(default_factory=dict)
    #: The accuracy samples (one image per validation caption).
    accuracy_samples: list[str] = field(default_factory=list)
    #: Probe-prompt rates per curve checkpoint (:func:`_probe_summary`), sampled as the arm is sampled at inference.
    curve: list[tuple[int, JSONObject]] = field(default_factory=list)
    #: The probe prompts (text, asked object, length) and the final checkpoint's images and readings.
    probes: list[JSONObject] = field(default_factory=list)
    probe_samples: list[str] = field(default_factory=list)
    probe_reads: list[list[list[str]]] = field(default_factory=list)
    cpu_seconds: float = 0.0
    #: "B" when this arm is arm B's LoRA (an inference-side row).
    shares: str = ""

    @property
    def curve_mean(self) -> float:
        """The primary metric: concept net accuracy (asked-concept hits minus concept readings where another colour
        was asked) averaged over the learning-curve checkpoints."""
        return statistics.fmean(c["net"] for _, c in self.curve) if self.curve else float("nan")

    def final(self, key: str) -> float:
        return float(self.curve[-1][1][key]) if self.curve else float("nan")

    @property
    def final_val(self) -> float:
        return self.val[-1][1]

    @property
    def final_val_own(self) -> float:
        return self.val_own[-1][1]

    @property
    def final_train(self) -> float:
        """Mean training loss over the last 20% of the steps."""
        vals = [v for _, v in self.losses]
        k = max(1, len(vals) // 5)
        return sum(vals[-k:]) / k


@dataclass
class SummaryRow:
    metric: str
    a_mean: float
    a_sd: float
    b_mean: float
    b_sd: float
    diff_mean: float
    diff_sd: float
    n: int
    #: 95% interval of the mean difference A - B across seeds (t interval; NaN with one seed).
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    verdict: str = ""
    higher_better: bool = False
    #: Two-sided p-values of the mean difference: paired t test, and the exact sign-flip (permutation) test.
    p_t: float = float("nan")
    p_signflip: float = float("nan")
    #: Per-seed values of each arm, in seed order.
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)


@dataclass
class ABResult:
    out_dir: Path
    preset: Preset
    seeds: int
    runs: list[ArmRun]
    divergence: list[Divergence]
    summary: list[SummaryRow]
    report_md: Path | None = None
    report_html: Path | None = None
    seconds: float = 0.0
    profiles: dict[str, str] = field(default_factory=dict)
    #: The validation folder (its images are the ground truth of the accuracy grid).
    val_dir: Path | None = None

    @property
    def verdict(self) -> str:
        return verdict_of(self.summary)

    def run(self, seed: int, arm: str) -> ArmRun:
        return next(r for r in self.runs if r.seed == seed and r.arm == arm)


# ------------------------------------------------------------------------------------------ state
def _read_state(path: Path) -> JSONObject:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ABError(f"unreadable A/B state ({e}); delete it to start over", file=str(path)) from None
    return data if isinstance(data, dict) else {}


def _write_state(path: Path, state: JSONObject) -> None:
    with atomic_file(path, "w", error=ABError) as f:
        f.write(json.dumps(state, indent=1, sort_keys=True))


def _run_from(d: JSONObject) -> ArmRun:
    r = ArmRun(seed=int(d["seed"]), arm=str(d["arm"]), steps=int(d.get("steps", 0)), seconds=float(d.get("seconds", 0.0)))
    r.losses = [(int(s), float(v)) for s, v in d.get("losses", [])]
    r.val = [(int(s), float(v)) for s, v in d.get("val", [])]
    r.val_own = [(int(s), float(v)) for s, v in d.get("val_own", [])]
    r.samples = list(d.get("samples", []))
    r.accuracy = {str(k): float(v) for k, v in d.get("accuracy", {}).items()}
    r.accuracy_samples = list(d.get("accuracy_samples", []))
    r.curve = [(int(st), dict(c)) for st, c in d.get("curve", [])]
    r.probes = list(d.get("probes", []))
    r.probe_samples = list(d.get("probe_samples", []))
    r.probe_reads = list(d.get("probe_reads", []))
    r.cpu_seconds = float(d.get("cpu_seconds", 0.0))
    r.shares = str(d.get("shares", ""))
    return r


# ------------------------------------------------------------------------------------------- data
def split_data(data: Path, out: Path, holdout: float) -> tuple[Path, Path]:
    """(train, val) folders: ``data/train`` + ``data/val`` when present, else a deterministic hold-out copy."""
    if (data / "train").is_dir() and (data / "val").is_dir():
        return data / "train", data / "val"
    images = sorted(p for p in data.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))
    if len(images) < 2:
        raise ABError("needs at least 2 images (one is held out for validation)", file=str(data), key="--data")
    n_val = max(1, round(len(images) * holdout))
    stride = len(images) / n_val
    val_idx = {int(i * stride + stride / 2) for i in range(n_val)}
    train_dir, val_dir = out / "data" / "train", out / "data" / "val"
    for i, img in enumerate(images):
        rel = img.relative_to(data)
        dst = (val_dir / img.name) if i in val_idx else (train_dir / rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        for src in (img, img.with_suffix(".txt")):
            target = dst.with_suffix(src.suffix)
            if src.is_file() and not target.exists():
                shutil.copy2(src, target)
    return train_dir, val_dir


def _val_items(val_dir: Path) -> list[tuple[Path, str]]:
    files = sorted(p for p in val_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))
    if not files:
        raise ABError("no validation images", file=str(val_dir))
    out = []
    for f in files:
        cap = f.with_suffix(".txt")
        out.append((f, cap.read_text(encoding="utf-8").strip() if cap.is_file() else ""))
    return out


def _captions(folder: Path) -> list[str]:
    return sorted({p.read_text(encoding="utf-8").strip() for p in folder.rglob("*.txt")})


# ------------------------------------------------------------------------------------------- main
def _stats(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(runs: list[ArmRun], seeds: int | list[int]) -> list[SummaryRow]:
    """Per metric: both arms' means and sds, the paired difference A - B, its 95% interval and verdict."""
    metrics: list[tuple[Metric, Callable[[ArmRun], float]]] = []
    if runs and all(r.curve for r in runs):
        metrics += [
            (Metric(PRIMARY, True), lambda r: r.curve_mean),
            (Metric(FINAL_NET, True), lambda r: r.final("net")),
            (Metric("concept hit rate, final (asked pink at the asked position)", True), lambda r: r.final("hit")),
            (Metric("concept exact, final (colour, shape and position)", True), lambda r: r.final("exact")),
            (Metric("known colours, final (forgetting: asked colour at the asked position)", True), lambda r: r.final("known")),
            (Metric("false concept readings, final (pink where another colour was asked)", False), lambda r: r.final("false")),
            (Metric("spurious objects per image, final", False), lambda r: r.final("extra")),
        ]
    metrics += [
        (Metric("validation loss, final (profile conditioning)", False), lambda r: r.final_val),
        (Metric("validation loss, final (arm's own conditioning)", False), lambda r: r.final_val_own),
        (Metric("training loss, last 20% of steps", False), lambda r: r.final_train),
    ]
    if runs and all(r.accuracy for r in runs):
        metrics += [
            (Metric("prompt accuracy: objects exact (profile conditioning)", True), lambda r: r.accuracy["object_accuracy"]),
            (Metric("prompt accuracy: concept objects exact", True), lambda r: r.accuracy["concept_accuracy"]),
        ]
    rows = []
    order = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    for metric, fn in metrics:
        a = [fn(r) for s in order for r in runs if r.seed == s and r.arm == "A"]
        b = [fn(r) for s in order for r in runs if r.seed == s and r.arm == "B"]
        ps = paired(metric, a, b)
        (am, asd), (bm, bsd), (dm, dsd) = _stats(a), _stats(b), _stats(list(ps.diffs))
        lo, hi = ps.interval
        rows.append(
            SummaryRow(
                metric=metric.name,
                a_mean=am,
                a_sd=asd,
                b_mean=bm,
                b_sd=bsd,
                diff_mean=dm,
                diff_sd=dsd,
                n=ps.n,
                ci_low=lo,
                ci_high=hi,
                verdict=ps.verdict,
                higher_better=metric.higher_better,
                p_t=ps.p_t,
                p_signflip=ps.p_signflip,
                a=list(a),
                b=list(b),
            )
        )
    return rows


#: The pre-registered primary metric of the shapes-world A/Bs with probe prompts (benchmarks/effects/bench_effects.md).
PRIMARY = "concept net accuracy, learning-curve mean (as sampled at inference)"
#: Instrument 2 of the effects matrix (amendment 11): the primary's terms at the last checkpoint only.
FINAL_NET = "concept net accuracy, final (hit minus false pink at the last checkpoint)"


def verdict_of(summary: list[SummaryRow]) -> str:
    """The A/B's verdict over what inference sees: the profile-conditioned validation loss and, when
    measured, the prompt accuracies (:func:`te_align.ab.stats.overall_verdict`)."""
    primary = next((r for r in summary if r.metric == PRIMARY), None)
    if primary is not None:  # the pre-registered verdict reads the primary metric alone
        return primary.verdict or NO_DIFFERENCE
    keys = [r for r in summary if "own conditioning" not in r.metric and not r.metric.startswith("training")]
    found = {r.verdict for r in keys} - {NO_DIFFERENCE, NO_VERDICT, ""}
    if not found:
        return NO_DIFFERENCE
    if len(found) == 1:
        return found.pop()
    return "mixed (" + "; ".join(f"{r.metric}: {r.verdict}" for r in keys if r.verdict not in (NO_DIFFERENCE, NO_VERDICT, "")) + ")"


def _world_data(p: Preset, out_dir: Path, say: Callable[[str], None], *, data_seed: int | None = None) -> Path:
    """``OUT/data/{train,val}`` drawn from the shapes world by the preset's [world] settings (once); ``data_seed``
    overrides the preset's (one draw per seed), and then ``out_dir`` is that seed's folder itself."""
    w = p.world
    assert w is not None
    root = out_dir / "data" if data_seed is None else out_dir
    seed = w.data_seed if data_seed is None else data_seed
    if (root / "val" / ANSWER_KEY).is_file() and (root / "train" / ANSWER_KEY).is_file():
        return root
    concept = w.concept_object()
    mix = dict(w.style_mix) or None
    say(
        f"drawing the finetuning data from the shapes world (seed {seed}): {w.train_images} training images with {w.concept}, "
        f"{w.val_images} validation images in held-out combinations ({', '.join(w.holdout) or 'any'})"
    )
    space = world.SPACES[w.space]
    draw = {"concept": concept, "image_size": w.image_size, "style_mix": mix, "tokenizer": False, "space": space}
    train = world.make_dataset(w.train_images, seed, split="concept", **draw)
    val = world.make_dataset(w.val_images, seed, split="validation", **draw)
    for folder, samples in (("train", train), ("val", val)):
        tmp = root / f".{folder}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        write_world_split(tmp, samples, concept)
        shutil.rmtree(root / folder, ignore_errors=True)
        tmp.rename(root / folder)
    return root


def _world_overrides(p: Preset, model: str | Path | None, model_path: str) -> JSONObject:
    """A world preset's profile fitted to its tiny encoders: from the shipped base's manifest, or read from the
    folder given with ``--model``."""
    if model is None and model_path.startswith("world:"):
        try:
            return dict(base_info(model_path.split(":", 1)[1]).get("profile_overrides") or {})
        except BaseError as e:
            raise ABError(str(e), key="--model") from None
    prof = te_align.profile(p.profile)
    return architecture_overrides(prof, _folder_components(Path(model_path), prof))


def resolve_model(model: str) -> str:
    """``world:NAME`` is a shipped shapes-world base (materialized into the cache); anything else is as given."""
    if model.startswith("world:"):
        try:
            return str(materialize(model.split(":", 1)[1]))
        except BaseError as e:
            raise ABError(str(e), key="--model") from None
    return model


def _arm_data(p: Preset, train_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """Arm A's training folder of a positive control: the same images, captions without the removed words, or the
    captions shuffled among the images (a fixed permutation per seed)."""
    import random
    import re

    dst = out_dir / "data_a" / train_dir.name
    if (dst / ".complete").is_file():
        return dst
    words = [w for w in p.baseline.remove_words if w]
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b", re.IGNORECASE) if words else None
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(train_dir, tmp)
    caps = sorted(tmp.rglob("*.txt"))
    if p.baseline.shuffle_captions:
        texts = [c.read_text(encoding="utf-8") for c in caps]
        order = list(range(len(caps)))
        random.Random(1_000_003 + seed).shuffle(order)
        for c, i in zip(caps, order, strict=True):
            c.write_text(texts[i], encoding="utf-8")
    for cap in caps if pattern is not None else []:
        text = pattern.sub("", cap.read_text(encoding="utf-8"))
        text = re.sub(r"\(\s+", "(", re.sub(r"\s+([,.!:])", r"\1", text))
        cap.write_text(re.sub(r"\s+", " ", text).strip(), encoding="utf-8")
    (tmp / ".complete").write_text("", encoding="utf-8")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


def run_ab(
    preset: Preset | str | Path,
    *,
    model: str | Path | None = None,
    data: str | Path | None = None,
    seeds: int | None = None,
    out: str | Path = "ab-out",
    max_steps: int | None = None,
    profile_overrides: JSONObject | None = None,
    report: bool = True,
    plan: str = "",
    first_seed: int = 0,
    on_seed: Callable[[ABResult], None] | None = None,
    say: Callable[[str], None] = print,
    done: Mapping[str, JSONObject] | None = None,
) -> ABResult:
    """Train arm A (trainer default) and arm B (profile) over ``seeds`` seeds, evaluate, write the report.

    Seeds run one after the other, each trained and evaluated before the next starts (``on_seed`` is called with
    the results so far after each), so an interrupted A/B keeps every finished seed. ``profile_overrides`` fit the
    profile to a custom model's architecture (applied to both arms before the baseline overrides; the demo's tiny
    model needs them). ``max_steps`` shortens training (tests). ``plan`` (a hash) is recorded with the state: a
    folder holding results of another plan is refused, never mixed. ``first_seed`` numbers the seeds from there
    (one seed of a matrix row per folder: ``seeds=1, first_seed=s``). ``done``: runs (by ``"seed/arm"``) taken as
    trained and evaluated, from a committed result whose draws a changed trainer reproduces (the matrix's arm B of a
    re-drawn row, amendment 9 of the plan).
    """

    t0 = time.perf_counter()
    p = preset if isinstance(preset, Preset) else load_preset(preset)
    model_path = str(model or p.model or (f"world:{p.world.base}" if p.world is not None else ""))
    if not model_path:
        raise ABError(f"preset '{p.name}' names no model: pass --model PATH_OR_REPO", key="--model")
    if data is None and p.world is None:
        raise ABError("needs a dataset folder (images with .txt captions)", key="--data")
    n_seeds = seeds if seeds is not None else p.eval.seeds
    if n_seeds < 1:
        raise ABError(f"must be >= 1, got {n_seeds}", key="--seeds")
    seed_list = list(range(first_seed, first_seed + n_seeds))
    out_dir = Path(out).expanduser()
    per_seed = data is None and p.world is not None and p.world.per_seed_data
    if data is not None:
        data_dir = Path(data).expanduser()
        if not data_dir.is_dir():
            raise ABError("dataset folder does not exist", file=str(data_dir), key="--data")
    if p.world is not None and profile_overrides is None:
        profile_overrides = _world_overrides(p, model, model_path)
    model_path = resolve_model(model_path)

    base = resolve(p.profile, ("model.profile_overrides", profile_overrides or None))
    prof_a, prof_b = p.arm_profiles(base)
    # the inputs are valid: only now the output folder (a failed start leaves no empty folder behind)
    if out_dir.exists() and not out_dir.is_dir():
        raise ABError("is not a folder: choose another --out", file=str(out_dir), key="--out")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ABError(f"cannot create the output folder: {e.strerror or e}", file=str(out_dir), key="--out") from None
    prof_paths = {}
    for arm, prof in (("A", prof_a), ("B", prof_b)):
        path = out_dir / "profiles" / f"{arm}.toml"
        text = prof.to_toml()
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            with atomic_file(path, "w", error=ABError) as f:
                f.write(text)
        prof_paths[arm] = path

    data_key = "per-seed world draws" if per_seed else str((data_dir if data is not None else out_dir / "data").resolve())
    key_src = json.dumps(
        {
            "preset": p.to_dict(),
            "model": model_path,
            "data": data_key,
            "max_steps": max_steps,
            "a": prof_a.fingerprint(),
            "b": prof_b.fingerprint(),
            "plan": plan,
        },
        sort_keys=True,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    state_path = out_dir / STATE_FILE
    state = _read_state(state_path)
    if state and state.get("key") != key:
        other = f" (plan {state.get('plan')})" if state.get("plan") != plan else ""
        raise ABError(
            f"this folder holds an A/B with a different preset, model, data, step count or plan{other}: use "
            f"another --out (or delete {STATE_FILE} to start over)",
            file=str(out_dir),
        )
    state = state or {"format": STATE_FORMAT, "key": key, "preset": p.name, "plan": plan, "runs": {}}
    runs_state: JSONObject = state.setdefault("runs", {})
    for tag, run in (done or {}).items():
        runs_state.setdefault(tag, dict(run))
    save = lambda: _write_state(state_path, state)  # noqa: E731

    if data is None and not per_seed:
        data_dir = _world_data(p, out_dir, say)
    evaluator: _Evaluator | None = None
    val_dirs: dict[int, Path] = {}
    inference_row = p.baseline.kind == "inference" or bool(p.baseline.cut_before)  # arm A samples arm B's LoRA
    for s in seed_list:
        if per_seed:
            assert p.world is not None
            seed_data = _world_data(p, out_dir / "data" / f"seed-{s}", say, data_seed=p.world.data_seed + s)
            train_dir, val_dir = split_data(seed_data, out_dir / "data" / f"seed-{s}", p.eval.holdout)
        else:
            train_dir, val_dir = split_data(data_dir, out_dir, p.eval.holdout)
        val_dirs[s] = val_dir
        for arm in ("B", "A") if inference_row else ARMS:
            tag = f"{s}/{arm}"
            if runs_state.get(tag, {}).get("trained"):
                continue
            if arm == "A" and inference_row:  # the very LoRA arm B trained, sampled as the inference tool does
                b = runs_state[f"{s}/B"]
                runs_state[tag] = {
                    **{k: b[k] for k in ("steps", "losses", "dir")},
                    "seed": s,
                    "arm": "A",
                    "trained": True,
                    "seconds": 0.0,
                    "shares": "B",
                }
                save()
                continue
            arm_dir = out_dir / "runs" / f"seed-{s}" / arm
            arm_train = _arm_data(p, train_dir, out_dir / "data" / f"seed-{s}", s) if arm == "A" and p.baseline.kind == "positive" else train_dir
            cfg = config_from_dict(
                train_config_dict(
                    p,
                    model=model_path,
                    data=str(arm_train),
                    out=str(arm_dir),
                    profile=str(prof_paths[arm]),
                    seed=s,
                    max_steps=max_steps,
                    arm=arm,
                )
            )
            resume = latest_checkpoint(arm_dir) is not None
            say(f"seed {s} arm {arm} ({_arm_label(p, arm, prof_b.name)}){': resuming' if resume else ''} ...")
            t1, c1 = time.perf_counter(), time.process_time()
            result = _loop.train(cfg, resume=True if resume else None)
            runs_state[tag] = {
                "seed": s,
                "arm": arm,
                "trained": True,
                "steps": result.steps,
                "seconds": time.perf_counter() - t1,
                "cpu_seconds": time.process_time() - c1,
                "losses": result.losses,
                "dir": str(arm_dir),
            }
            save()
        todo = [f"{s}/{arm}" for arm in ARMS if not runs_state[f"{s}/{arm}"].get("evaluated")]
        if todo or "divergence" not in state:
            if evaluator is None:
                evaluator = _Evaluator(
                    p,
                    model_path=model_path,
                    prof_a=prof_a,
                    prof_b=prof_b,
                    train_dir=train_dir,
                    out_dir=out_dir,
                    max_steps=max_steps,
                    say=say,
                )
            evaluator.run(state, todo, seed=s, train_dir=train_dir, val_dir=val_dir, save=save)
        if on_seed is not None:
            on_seed(_result(p, out_dir, seed_list[: seed_list.index(s) + 1], runs_state, state, prof_paths, val_dirs[s], t0))
    result = _result(p, out_dir, seed_list, runs_state, state, prof_paths, val_dirs[seed_list[-1]], t0)
    if report:
        result.report_md, result.report_html = write_report(result)
    return result


def _arm_label(p: Preset, arm: str, profile: str) -> str:
    kind = p.baseline.kind
    if arm == "B":
        return f"profile {profile}"
    if kind == "null":
        return f"profile {profile}, own random draws"
    if kind == "positive":
        if p.baseline.cut_before:
            return "arm B's LoRA, probe prompts cut before " + ", ".join(repr(w) for w in p.baseline.cut_before)
        if p.baseline.shuffle_captions:
            return "captions shuffled among the images"
        return "captions without " + ", ".join(repr(w) for w in p.baseline.remove_words)
    if kind == "inference":
        return f"arm B's LoRA, sampled as {p.baseline.inference_tool} does"
    return f"trainer default: {p.baseline.trainer}"


def _result(
    p: Preset,
    out_dir: Path,
    seeds: list[int],
    runs_state: JSONObject,
    state: JSONObject,
    prof_paths: dict[str, Path],
    val_dir: Path,
    t0: float,
) -> ABResult:
    runs = [_run_from(runs_state[f"{s}/{arm}"]) for s in seeds for arm in ARMS]
    divergence = [Divergence(**{**d, "shape_a": tuple(d["shape_a"]), "shape_b": tuple(d["shape_b"])}) for d in state.get("divergence", [])]
    result = ABResult(
        out_dir,
        p,
        len(seeds),
        runs,
        divergence,
        summarize(runs, seeds),
        profiles={"A": str(prof_paths["A"]), "B": str(prof_paths["B"])},
        val_dir=val_dir,
    )
    result.seconds = time.perf_counter() - t0
    return result


class _Evaluator:
    """The evaluation pipeline of one A/B, loaded once: validation loss per checkpoint, samples, probe prompts."""

    def __init__(
        self,
        p: Preset,
        *,
        model_path: str,
        prof_a: AlignmentProfile,
        prof_b: AlignmentProfile,
        train_dir: Path,
        out_dir: Path,
        max_steps: int | None,
        say: Callable[[str], None],
    ) -> None:
        import torch

        self.p, self.say, self.out_dir, self.max_steps = p, say, out_dir, max_steps
        self.prof_a, self.prof_b = prof_a, prof_b
        #: What each arm is sampled and scored with at inference: the profile, or an inference tool's conditioning.
        self.inf_a, self.opts_a = prof_b, None
        if p.baseline.kind == "inference":
            self.inf_a = p.baseline.inference_profile(prof_b)
            self.opts_a = _encoding_core.EncodeOptions(long_prompt_chunks=p.baseline.inference_chunks) if p.baseline.inference_chunks else None
        elif p.baseline.sample_as == "trained":
            self.inf_a = prof_a
            data = _merge(p.train, p.baseline.train).get("data", {})
            chunks = int(data.get("long_prompt_chunks", 0) or 0)
            padding = data.get("long_prompt_padding", "max_length")  # EncodeOptions refuses other values
            if chunks:
                self.opts_a = _encoding_core.EncodeOptions(long_prompt_chunks=chunks, chunk_padding=padding)
        cfg = config_from_dict(
            train_config_dict(
                p,
                model=model_path,
                data=str(train_dir),
                out=str(out_dir),
                profile=p.profile,
                seed=0,
                max_steps=max_steps,
            )
        )
        self.cfg = cfg
        self.family = family_of(prof_b)
        pipe = load_pipeline(cfg.model, prof_b)
        pipe.set_progress_bar_config(disable=True)
        check_model(prof_b, pipe, model_path)
        for m in [pipe.vae, getattr(pipe, self.family.denoiser_attr)] + [getattr(pipe, s.encoder_subfolder) for s in prof_b.slots]:
            m.requires_grad_(False)
            m.eval()
        self.pipe = pipe
        self.denoiser = getattr(pipe, self.family.denoiser_attr)
        lo = cfg.lora
        add_lora(
            self.denoiser,
            rank=lo.rank,
            alpha=lo.alpha,
            dropout=lo.dropout,
            targets=lo.target_modules or self.family.default_targets,
            seed=0,
        )
        self.denoiser.eval()
        self.named = {f"{self.family.denoiser_attr}.{n}": prm for n, prm in self.denoiser.named_parameters() if "lora_" in n}
        for prm in self.named.values():
            prm.requires_grad_(False)
        self.zero = {k: torch.zeros_like(v) if ".lora_B." in k else v.detach().clone() for k, v in self.named.items()}

    def load(self, params: Mapping[str, torch.Tensor]) -> None:
        import torch

        missing = set(self.named) - set(params)
        if missing:
            raise ABError(f"checkpoint lacks {len(missing)} LoRA tensors (different LoRA settings?)")
        with torch.no_grad():
            for k, prm in self.named.items():
                prm.copy_(params[k].to(prm.dtype))

    def run(
        self,
        state: JSONObject,
        todo: list[str],
        *,
        seed: int,
        train_dir: Path,
        val_dir: Path,
        save: Callable[[], None],
    ) -> None:
        import torch
        from safetensors.torch import load_file

        p, pipe, cfg, family = self.p, self.pipe, self.cfg, self.family
        self.say(f"evaluating seed {seed}: validation loss per checkpoint, samples, prompt accuracy ...")
        items = _val_items(val_dir)
        captions = [c for _, c in items]
        try:
            key = read_answer_key(val_dir)
        except (OSError, ValueError) as e:
            raise ABError(f"unreadable answer key: {e}", file=str(val_dir)) from None
        if key is not None:
            missing = [f.name for f, _ in items if f.stem not in key["items"]]
            if missing:
                raise ABError(f"the answer key has no entry for {missing[0]} (and {len(missing) - 1} more)", file=str(val_dir))
        cond_a = te_align.encode(self.prof_a, captions, pipeline=pipe)
        cond_b = te_align.encode(self.prof_b, captions, pipeline=pipe)
        cond_inf: Conditioning | list[Conditioning] = cond_b
        if self.inf_a is not self.prof_b or self.opts_a is not None:
            if accuracy._per_prompt(self.inf_a, self.opts_a):  # each prompt alone, as the inference tool encodes it
                cond_inf = [te_align.encode(self.inf_a, [c], pipeline=pipe, options=self.opts_a) for c in captions]
            else:
                cond_inf = te_align.encode(self.inf_a, captions, pipeline=pipe, options=self.opts_a)
        sampled_a = cond_inf if (p.baseline.kind == "inference" or p.baseline.sample_as == "trained") else cond_a
        #: the profile each conditioning was encoded with: the denoiser is called as training with it calls it
        prof_sampled_a = self.inf_a if sampled_a is cond_inf else self.prof_a

        if "divergence" not in state:
            prompts = sorted(set(_captions(train_dir)) | set(captions) | set(p.eval.prompts))
            if p.baseline.kind == "inference" or self.opts_a is not None:
                da = accuracy.encode_each(self.inf_a, prompts, pipe, options=self.opts_a)
            else:
                da = te_align.encode(self.prof_a, prompts, pipeline=pipe)
            db = te_align.encode(self.prof_b, prompts, pipeline=pipe)
            state["divergence"] = [asdict(d) for d in evaluate.conditioning_divergence(da, db)]
            state["divergence_prompts"] = len(prompts)
            save()
        if not todo:
            return

        res = p.eval.resolution or cfg.data.resolution
        latents = evaluate.load_val_latents(pipe, [f for f, _ in items], res)
        timesteps = list(p.eval.timesteps) or list(evaluate.DEFAULT_TIMESTEPS)
        noise = evaluate.fixed_noise(latents, len(timesteps), p.eval.noise_seed)
        objective = evaluate.resolve_objective(family, pipe, cfg.train.objective)

        def vloss(cond: Conditioning | list[Conditioning], profile: AlignmentProfile) -> float:
            """Validation loss with ``cond``, the denoiser called as training with ``profile`` calls it."""
            return evaluate.validation_loss(
                family=family,
                denoiser=self.denoiser,
                latents=latents,
                noise=noise,
                timesteps=timesteps,
                cond=cond,
                objective=objective,
                scheduler_config=pipe.scheduler.config,
                guidance=cfg.train.guidance,
                flow_shift_scale=flow_timestep_scale(family),
                pixel_size=res,
                denoiser_mask=denoiser_mask_on(profile),
            )

        probes = _probes(p, seed)
        curve_steps = _curve_steps(p, self.max_steps)
        self.load(self.zero)
        base_b = vloss(cond_b, self.prof_b)
        base_own = {"A": vloss(sampled_a, prof_sampled_a), "B": base_b}
        sample_size = p.eval.sample_size or res
        scfg = SampleConfig(
            prompts=list(p.eval.prompts),
            seeds=list(p.eval.sample_seeds),
            steps=p.eval.sample_steps,
            guidance_scale=p.eval.guidance_scale,
            width=sample_size,
            height=sample_size,
        )
        runs_state = state["runs"]
        for tag in todo:
            r = runs_state[tag]
            arm = r["arm"]
            inf, opts = (self.inf_a, self.opts_a) if arm == "A" else (self.prof_b, None)
            own, own_profile = {"A": (sampled_a, prof_sampled_a), "B": (cond_b, self.prof_b)}[arm]
            val, val_own = [(0, base_b)], [(0, base_own[arm])]
            ckpts = list_checkpoints(r["dir"])
            if not ckpts:
                raise ABError("the arm left no checkpoint to evaluate", file=r["dir"])
            curve = []
            sample_dir = self.out_dir / "samples" / f"seed-{r['seed']}" / arm
            for step, folder in ckpts:
                self.load(load_file(str(Path(folder) / "trainable.safetensors")))
                val.append((step, vloss(cond_b, self.prof_b)))
                val_own.append((step, vloss(own, own_profile) if own is not cond_b else val[-1][1]))
                if probes and (step in curve_steps or (step == ckpts[-1][0] and not curve_steps)):
                    texts = [cut_before(q.text, p.baseline.cut_before) if arm == "A" else q.text for q in probes]
                    images = accuracy.sample_prompts(
                        pipe, inf, texts, steps=p.eval.accuracy_steps,
                        guidance=p.eval.accuracy_guidance, size=sample_size, seed=0, options=opts,
                    )
                    reads = accuracy.read_probes(images, [q.objects for q in probes], concept_colour=_concept_colour(p))
                    curve.append((step, _probe_summary(probes, reads)))
                    if step == ckpts[-1][0]:
                        files = accuracy.save_images(images, [f"probe-{i:02d}" for i in range(len(images))], sample_dir / "probes")
                        r["probe_samples"] = [str(f) for f in files]
                        r["probe_reads"] = [q["read"] for q in reads]
            missing_steps = [s for s in curve_steps if s not in {c[0] for c in curve}]
            if probes and missing_steps:
                raise ABError(f"no checkpoint at step(s) {missing_steps} (eval.curve_steps) to read the learning curve", file=r["dir"])
            # samples of the final weights, conditioned as the arm is sampled at inference
            files = (
                _sampling.sample_images(
                    pipe,
                    self.prof_b,
                    scfg,
                    sample_dir,
                    ckpts[-1][0],
                    size=(sample_size, sample_size),
                    device=torch.device("cpu"),
                    dtype=torch.float32,
                )
                if inf is self.prof_b and (arm == "B" or self.opts_a is None)
                else []
            )
            r.update({"val": val, "val_own": val_own, "samples": [str(f) for f in files], "curve": curve})
            if probes:
                r["probes"] = [q.to_dict() for q in probes]
            elif key is not None:
                images = accuracy.sample_prompts(
                    pipe, inf, captions, steps=p.eval.accuracy_steps, guidance=p.eval.accuracy_guidance,
                    size=sample_size, seed=0, options=opts,
                )
                truths = [key["items"][f.stem]["objects"] for f, _ in items]
                r["accuracy"] = accuracy.score_images(images, truths)
                acc_files = accuracy.save_images(images, [f.stem for f, _ in items], sample_dir / "accuracy")
                r["accuracy_samples"] = [str(f) for f in acc_files]
            r["evaluated"] = True
            save()
            acc = ""
            if curve:
                acc = f", concept net accuracy {curve[-1][1]['net']:+.2f} (curve mean {statistics.fmean(c[1]['net'] for c in curve):+.3f})"
            elif r.get("accuracy"):
                acc = f", prompt accuracy {r['accuracy']['object_accuracy']:.1%}"
            self.say(f"seed {r['seed']} arm {arm}: validation loss {val[-1][1]:.5f} (profile conditioning), {val_own[-1][1]:.5f} (own){acc}")
        self.load(self.zero)


def cut_before(text: str, words: Sequence[str]) -> str:
    """``text`` cut just before the first whole-word occurrence (any case) of any of ``words``, trailing spaces
    dropped: what a length cut right before the word leaves. Unchanged without such a word (or ``words``)."""
    import re

    if not words:
        return text
    m = re.search(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b", text, re.IGNORECASE)
    return text if m is None else text[: m.start()].rstrip()


def _curve_steps(p: Preset, max_steps: int | None) -> list[int]:
    """The learning-curve checkpoints; a run shortened by ``max_steps`` (tests, a quick look) keeps those it
    reaches, and its last step."""
    steps = list(p.eval.curve_steps)
    if max_steps is None or not steps:
        return steps
    kept = [s for s in steps if s < max_steps and s % max(1, p.eval.every) == 0]
    return [*kept, max_steps]


def _concept_colour(p: Preset) -> str:
    assert p.world is not None
    c = p.world.concept_object()
    if c.attribute != "colour":
        raise ABError("probe prompts score a colour concept", file=p.source, key="world.concept")
    return c.value


def _probes(p: Preset, seed: int) -> list[ProbePrompt]:
    """The probe prompts of one seed (the same for both arms): concept prompts, then control prompts."""
    if p.world is None or not (p.eval.probe_concept or p.eval.probe_control):
        return []
    c = p.world.concept_object()
    held = [v for a, v in c.holdout if a == "shape"] or list(world.SHAPES)
    colour = _concept_colour(p)
    concept = probe_prompts(1000 + seed, colour=colour, shapes=held, lengths=list(p.eval.probe_concept.items()), stream="concept")
    control = probe_prompts(1000 + seed, colour="*", shapes=world.SHAPES, lengths=list(p.eval.probe_control.items()), stream="control")
    return concept + control


def _probe_summary(probes: list[ProbePrompt], reads: list[JSONObject]) -> JSONObject:
    """Rates over one checkpoint's probe images (see :func:`summarize` for what each means)."""
    concept = [r for q, r in zip(probes, reads, strict=True) if q.objects[0][3]]
    control = [r for q, r in zip(probes, reads, strict=True) if not q.objects[0][3]]

    def rate(rows: list[JSONObject], key: str) -> float:
        return sum(float(r[key]) for r in rows) / len(rows) if rows else float("nan")

    hit, false = rate(concept, "hit"), rate(control, "concept_colour") if control else 0.0
    return {
        "hit": hit,
        "false": false,
        "net": hit - false,
        "exact": rate(concept, "exact"),
        "known": rate(control, "hit"),
        "extra": rate(concept + control, "extra"),
        "hits": [bool(r["hit"]) for r in concept],
        "false_reads": [bool(r["concept_colour"]) for r in control],
        "known_hits": [bool(r["hit"]) for r in control],
    }


__all__ = ["ARMS", "STATE_FILE", "ABResult", "ArmRun", "SummaryRow", "run_ab", "split_data", "summarize"]
