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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from te_align._atomic import atomic_file
from te_align.ab.preset import ABError, Preset, load_preset, train_config_dict

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


@dataclass
class ABResult:
    out_dir: Path
    preset: Preset
    seeds: int
    runs: list[ArmRun]
    divergence: list[Any]
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
def _read_state(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ABError(f"unreadable A/B state ({e}); delete it to start over", file=str(path)) from None
    return data if isinstance(data, dict) else {}


def _write_state(path: Path, state: dict[str, Any]) -> None:
    with atomic_file(path, "w", error=ABError) as f:
        f.write(json.dumps(state, indent=1, sort_keys=True))


def _run_from(d: dict[str, Any]) -> ArmRun:
    r = ArmRun(seed=int(d["seed"]), arm=str(d["arm"]), steps=int(d.get("steps", 0)), seconds=float(d.get("seconds", 0.0)))
    r.losses = [(int(s), float(v)) for s, v in d.get("losses", [])]
    r.val = [(int(s), float(v)) for s, v in d.get("val", [])]
    r.val_own = [(int(s), float(v)) for s, v in d.get("val_own", [])]
    r.samples = list(d.get("samples", []))
    r.accuracy = {str(k): float(v) for k, v in d.get("accuracy", {}).items()}
    r.accuracy_samples = list(d.get("accuracy_samples", []))
    return r


# ------------------------------------------------------------------------------------------- data
def split_data(data: Path, out: Path, holdout: float) -> tuple[Path, Path]:
    """(train, val) folders: ``data/train`` + ``data/val`` when present, else a deterministic hold-out copy."""
    from te_align.train.data import IMAGE_EXTENSIONS

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
    from te_align.train.data import IMAGE_EXTENSIONS

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


def summarize(runs: list[ArmRun], seeds: int) -> list[SummaryRow]:
    """Per metric: both arms' means and sds, the paired difference A - B, its 95% interval and verdict."""
    from te_align.ab.stats import Metric, paired

    metrics: list[tuple[Metric, Callable[[ArmRun], float]]] = [
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
    for metric, fn in metrics:
        a = [fn(r) for s in range(seeds) for r in runs if r.seed == s and r.arm == "A"]
        b = [fn(r) for s in range(seeds) for r in runs if r.seed == s and r.arm == "B"]
        ps = paired(metric, a, b)
        (am, asd), (bm, bsd), (dm, dsd) = _stats(a), _stats(b), _stats(list(ps.diffs))
        lo, hi = ps.interval
        rows.append(SummaryRow(metric.name, am, asd, bm, bsd, dm, dsd, ps.n, lo, hi, ps.verdict, metric.higher_better))
    return rows


def verdict_of(summary: list[SummaryRow]) -> str:
    """The A/B's verdict over what inference sees: the profile-conditioned validation loss and, when
    measured, the prompt accuracies (:func:`te_align.ab.stats.overall_verdict`)."""
    from te_align.ab.stats import NO_DIFFERENCE

    keys = [r for r in summary if "own conditioning" not in r.metric and not r.metric.startswith("training")]
    found = {r.verdict for r in keys} - {NO_DIFFERENCE, ""}
    if not found:
        return NO_DIFFERENCE
    if len(found) == 1:
        return found.pop()
    return "mixed (" + "; ".join(f"{r.metric}: {r.verdict}" for r in keys if r.verdict not in (NO_DIFFERENCE, "")) + ")"


def _world_data(p: Preset, out_dir: Path, say: Callable[[str], None]) -> Path:
    """``OUT/data/{train,val}`` drawn from the shapes world by the preset's [world] settings (once)."""
    from te_align.tiny import world
    from te_align.tiny.datasets import ANSWER_KEY, write_world_split

    w = p.world
    assert w is not None
    root = out_dir / "data"
    if (root / "val" / ANSWER_KEY).is_file() and (root / "train" / ANSWER_KEY).is_file():
        return root
    concept = w.concept_object()
    mix = dict(w.style_mix) or None
    say(f"drawing the finetuning data from the shapes world: {w.train_images} training images with {w.concept}, "
        f"{w.val_images} validation images in held-out combinations ({', '.join(w.holdout) or 'any'})")  # fmt: skip
    space = world.SPACES[w.space]
    train = world.make_dataset(w.train_images, w.data_seed, split="concept", concept=concept, image_size=w.image_size,
                               style_mix=mix, tokenizer=False, space=space)  # fmt: skip
    val = world.make_dataset(w.val_images, w.data_seed, split="validation", concept=concept, image_size=w.image_size,
                             style_mix=mix, tokenizer=False, space=space)  # fmt: skip
    for folder, samples in (("train", train), ("val", val)):
        tmp = root / f".{folder}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        write_world_split(tmp, samples, concept)
        shutil.rmtree(root / folder, ignore_errors=True)
        tmp.rename(root / folder)
    return root


def _world_overrides(p: Preset, model: str | Path | None, model_path: str) -> dict[str, Any]:
    """A world preset's profile fitted to its tiny encoders: from the shipped base's manifest, or read from the
    folder given with ``--model``."""
    from te_align.tiny.bases import BaseError, base_info

    if model is None and model_path.startswith("world:"):
        try:
            return dict(base_info(model_path.split(":", 1)[1]).get("profile_overrides") or {})
        except BaseError as e:
            raise ABError(str(e), key="--model") from None
    import te_align
    from te_align.tiny.fit import _folder_components, architecture_overrides

    prof = te_align.profile(p.profile)
    return architecture_overrides(prof, _folder_components(Path(model_path), prof))


def resolve_model(model: str) -> str:
    """``world:NAME`` is a shipped shapes-world base (materialized into the cache); anything else is as given."""
    if model.startswith("world:"):
        from te_align.tiny.bases import BaseError, materialize

        try:
            return str(materialize(model.split(":", 1)[1]))
        except BaseError as e:
            raise ABError(str(e), key="--model") from None
    return model


def run_ab(
    preset: Preset | str | Path,
    *,
    model: str | Path | None = None,
    data: str | Path | None = None,
    seeds: int | None = None,
    out: str | Path = "ab-out",
    max_steps: int | None = None,
    profile_overrides: dict[str, Any] | None = None,
    report: bool = True,
    say: Callable[[str], None] = print,
) -> ABResult:
    """Train arm A (trainer default) and arm B (profile) over ``seeds`` seeds, evaluate, write the report.

    ``profile_overrides`` fit the profile to a custom model's architecture (applied to both arms before
    the baseline overrides; the demo's tiny model needs them). ``max_steps`` shortens training (tests).
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
    out_dir = Path(out).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    if data is None:
        data_dir = _world_data(p, out_dir, say)
    else:
        data_dir = Path(data).expanduser()
        if not data_dir.is_dir():
            raise ABError("dataset folder does not exist", file=str(data_dir), key="--data")
    if p.world is not None and profile_overrides is None:
        profile_overrides = _world_overrides(p, model, model_path)
    model_path = resolve_model(model_path)
    train_dir, val_dir = split_data(data_dir, out_dir, p.eval.holdout)

    from te_align.profiles.overrides import resolve

    base = resolve(p.profile, ("model.profile_overrides", profile_overrides or None))
    prof_a, prof_b = p.arm_profiles(base)
    prof_paths = {}
    for arm, prof in (("A", prof_a), ("B", prof_b)):
        path = out_dir / "profiles" / f"{arm}.toml"
        text = prof.to_toml()
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            with atomic_file(path, "w", error=ABError) as f:
                f.write(text)
        prof_paths[arm] = path

    key_src = json.dumps({"preset": p.to_dict(), "model": model_path, "train": str(train_dir.resolve()), "val": str(val_dir.resolve()),
                          "max_steps": max_steps, "a": prof_a.fingerprint(), "b": prof_b.fingerprint()}, sort_keys=True)  # fmt: skip
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    state_path = out_dir / STATE_FILE
    state = _read_state(state_path)
    if state and state.get("key") != key:
        raise ABError("this folder holds an A/B with a different preset, model, data or step count: use another --out "
                      f"(or delete {STATE_FILE} to start over)", file=str(out_dir))  # fmt: skip
    state = state or {"format": STATE_FORMAT, "key": key, "preset": p.name, "runs": {}}
    runs_state: dict[str, Any] = state.setdefault("runs", {})

    from te_align.train import config_from_dict
    from te_align.train.checkpoint import latest_checkpoint
    from te_align.train.loop import train

    # ---- training
    for s in range(n_seeds):
        for arm in ARMS:
            tag = f"{s}/{arm}"
            if runs_state.get(tag, {}).get("trained"):
                continue
            arm_dir = out_dir / "runs" / f"seed-{s}" / arm
            cfg = config_from_dict(train_config_dict(p, model=model_path, data=str(train_dir), out=str(arm_dir),
                                                     profile=str(prof_paths[arm]), seed=s, max_steps=max_steps, arm=arm))  # fmt: skip
            resume = latest_checkpoint(arm_dir) is not None
            say(f"seed {s} arm {arm} ({'trainer default: ' + p.baseline.trainer if arm == 'A' else 'profile ' + prof_b.name})"
                f"{': resuming' if resume else ''} ...")  # fmt: skip
            t1 = time.perf_counter()
            result = train(cfg, resume=True if resume else None)
            runs_state[tag] = {"seed": s, "arm": arm, "trained": True, "steps": result.steps, "seconds": time.perf_counter() - t1,
                               "losses": result.losses, "dir": str(arm_dir)}  # fmt: skip
            _write_state(state_path, state)

    # ---- evaluation
    todo = [f"{s}/{arm}" for s in range(n_seeds) for arm in ARMS if not runs_state[f"{s}/{arm}"].get("evaluated")]
    if todo or "divergence" not in state:
        _evaluate(p, state, todo, model_path=model_path, prof_a=prof_a, prof_b=prof_b, train_dir=train_dir, val_dir=val_dir,
                  out_dir=out_dir, max_steps=max_steps, save=lambda: _write_state(state_path, state), say=say)  # fmt: skip

    from te_align.ab.evaluate import Divergence

    runs = [_run_from(runs_state[f"{s}/{arm}"]) for s in range(n_seeds) for arm in ARMS]
    divergence = [Divergence(**{**d, "shape_a": tuple(d["shape_a"]), "shape_b": tuple(d["shape_b"])}) for d in state["divergence"]]
    result = ABResult(out_dir, p, n_seeds, runs, divergence, summarize(runs, n_seeds),
                      profiles={"A": str(prof_paths["A"]), "B": str(prof_paths["B"])}, val_dir=val_dir)  # fmt: skip
    result.seconds = time.perf_counter() - t0
    if report:
        from te_align.ab.report import write_report

        result.report_md, result.report_html = write_report(result)
    return result


def _evaluate(
    p: Preset, state: dict[str, Any], todo: list[str], *, model_path: str, prof_a: Any, prof_b: Any, train_dir: Path, val_dir: Path,
    out_dir: Path, max_steps: int | None, save: Callable[[], None], say: Callable[[str], None],
) -> None:
    import torch
    from safetensors.torch import load_file

    import te_align
    from te_align.ab import evaluate
    from te_align.train import config_from_dict
    from te_align.train.checkpoint import list_checkpoints
    from te_align.train.config import SampleConfig
    from te_align.train.models import add_lora, check_model, family_of, flow_timestep_scale, load_pipeline
    from te_align.train.sampling import sample_images

    say("evaluating: validation loss per checkpoint, conditioning divergence, samples ...")
    cfg = config_from_dict(train_config_dict(p, model=model_path, data=str(train_dir), out=str(out_dir), profile=p.profile, seed=0,
                                             max_steps=max_steps))  # fmt: skip
    family = family_of(prof_b)
    pipe = load_pipeline(cfg.model, prof_b)
    pipe.set_progress_bar_config(disable=True)
    check_model(prof_b, pipe, model_path)
    for m in [pipe.vae, getattr(pipe, family.denoiser_attr)] + [getattr(pipe, s.encoder_subfolder) for s in prof_b.slots]:
        m.requires_grad_(False)
        m.eval()

    items = _val_items(val_dir)
    captions = [c for _, c in items]
    from te_align.ab import accuracy
    from te_align.tiny.datasets import read_answer_key

    try:
        key = read_answer_key(val_dir)
    except (OSError, ValueError) as e:
        raise ABError(f"unreadable answer key: {e}", file=str(val_dir)) from None
    if key is not None:
        missing = [f.name for f, _ in items if f.stem not in key["items"]]
        if missing:
            raise ABError(f"the answer key has no entry for {missing[0]} (and {len(missing) - 1} more)", file=str(val_dir))
    cond_a = te_align.encode(prof_a, captions, pipeline=pipe)
    cond_b = te_align.encode(prof_b, captions, pipeline=pipe)

    if "divergence" not in state:
        prompts = sorted(set(_captions(train_dir)) | set(captions) | set(p.eval.prompts))
        da = te_align.encode(prof_a, prompts, pipeline=pipe)
        db = te_align.encode(prof_b, prompts, pipeline=pipe)
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
    denoiser = getattr(pipe, family.denoiser_attr)
    lo = cfg.lora
    add_lora(denoiser, rank=lo.rank, alpha=lo.alpha, dropout=lo.dropout, targets=lo.target_modules or family.default_targets, seed=0)
    denoiser.eval()
    named = {f"{family.denoiser_attr}.{n}": prm for n, prm in denoiser.named_parameters() if "lora_" in n}
    for prm in named.values():
        prm.requires_grad_(False)
    zero = {k: torch.zeros_like(v) if ".lora_B." in k else v.detach().clone() for k, v in named.items()}

    def load(params: dict[str, Any]) -> None:
        missing = set(named) - set(params)
        if missing:
            raise ABError(f"checkpoint lacks {len(missing)} LoRA tensors (different LoRA settings?)")
        with torch.no_grad():
            for k, prm in named.items():
                prm.copy_(params[k].to(prm.dtype))

    def vloss(cond: Any) -> float:
        return evaluate.validation_loss(family=family, denoiser=denoiser, latents=latents, noise=noise, timesteps=timesteps, cond=cond,
                                 objective=objective, scheduler_config=pipe.scheduler.config, guidance=cfg.train.guidance,
                                 flow_shift_scale=flow_timestep_scale(family), pixel_size=res)  # fmt: skip

    load(zero)
    base_b, base_a = vloss(cond_b), vloss(cond_a)
    sample_size = p.eval.sample_size or res
    scfg = SampleConfig(prompts=list(p.eval.prompts), seeds=list(p.eval.sample_seeds), steps=p.eval.sample_steps,
                        guidance_scale=p.eval.guidance_scale, width=sample_size, height=sample_size)  # fmt: skip
    runs_state = state["runs"]
    for tag in todo:
        r = runs_state[tag]
        own = cond_a if r["arm"] == "A" else cond_b
        val, val_own = [(0, base_b)], [(0, base_a if r["arm"] == "A" else base_b)]
        ckpts = list_checkpoints(r["dir"])
        for step, folder in ckpts:
            load(load_file(str(Path(folder) / "trainable.safetensors")))
            val.append((step, vloss(cond_b)))
            val_own.append((step, vloss(own) if r["arm"] == "A" else val[-1][1]))
        if not ckpts:
            raise ABError("the arm left no checkpoint to evaluate", file=r["dir"])
        # samples of the final weights, conditioned by the profile (what the official pipeline does at inference)
        sample_dir = out_dir / "samples" / f"seed-{r['seed']}" / r["arm"]
        files = sample_images(pipe, prof_b, scfg, sample_dir, ckpts[-1][0], size=(sample_size, sample_size), device=torch.device("cpu"),
                              dtype=torch.float32)  # fmt: skip
        r.update({"val": val, "val_own": val_own, "samples": [str(f) for f in files]})
        if key is not None:
            images = accuracy.sample_prompts(pipe, prof_b, captions, steps=p.eval.accuracy_steps, guidance=p.eval.accuracy_guidance,
                                             size=sample_size, seed=0)  # fmt: skip
            truths = [key["items"][f.stem]["objects"] for f, _ in items]
            r["accuracy"] = accuracy.score_images(images, truths)
            acc_files = accuracy.save_images(images, [f.stem for f, _ in items], sample_dir / "accuracy")
            r["accuracy_samples"] = [str(f) for f in acc_files]
        r["evaluated"] = True
        save()
        acc = f", prompt accuracy {r['accuracy']['object_accuracy']:.1%}" if r.get("accuracy") else ""
        say(f"seed {r['seed']} arm {r['arm']}: validation loss {val[-1][1]:.5f} (profile conditioning), {val_own[-1][1]:.5f} (own){acc}")
    load(zero)


__all__ = ["ARMS", "STATE_FILE", "ABResult", "ArmRun", "SummaryRow", "run_ab", "split_data", "summarize"]
