"""Continuing a training run from a checkpoint: what a checkpoint records of the run's settings, which changes refuse
a resume and which are warned about, and loading the weights, optimizer, schedule, RNG states and data position."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._types import JSONObject
from te_align.train.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, set_rng_state
from te_align.train.config import TrainError
from te_align.train.data import Position

if TYPE_CHECKING:  # pragma: no cover
    from te_align.train.run import Run

logger = logging.getLogger("te_align.train")


def run_record(run: Run) -> JSONObject:
    """What a checkpoint records of the run's settings, for :func:`_check_resume_config`."""
    lo, t = run.cfg.lora, run.cfg.train
    return {
        "model": run.cfg.model.path, "model_id": run.model_id, "rank": lo.rank, "alpha": lo.alpha,
        "target_modules": sorted(lo.target_modules or run.family.default_targets) if lo.rank else [],
        "text_encoders": list(lo.text_encoders),
        "text_encoder_rank": lo.text_encoder_rank, "text_encoder_target_modules": sorted(lo.text_encoder_target_modules),
        "learning_rate": t.learning_rate, "text_encoder_lr": t.text_encoder_lr, "projection_lr": t.projection_lr,
        "full_modules": sorted(t.full_modules), "full_lr": t.full_lr, "batch_size": t.batch_size,
        "gradient_accumulation": t.gradient_accumulation, "seed": t.seed, "total": run.total,
        "lr_scheduler": t.lr_scheduler, "warmup_steps": t.warmup_steps,
    }


#: Settings a run cannot continue with when they change (the trained tensors would not fit or mean something else).
_FIXED = {
    "model_id": "the model",
    "rank": "lora.rank",
    "target_modules": "lora.target_modules",
    "text_encoders": "lora.text_encoders",
    "text_encoder_rank": "lora.text_encoder_rank",
    "text_encoder_target_modules": "lora.text_encoder_target_modules",
    "full_modules": "train.full_modules",
}
#: Settings that change the rest of the run when they change (warned about; the new value is used).
_CHANGES = {
    "learning_rate": "train.learning_rate",
    "text_encoder_lr": "train.text_encoder_lr",
    "projection_lr": "train.projection_lr",
    "full_lr": "train.full_lr",
    "alpha": "lora.alpha",
    "batch_size": "train.batch_size",
    "gradient_accumulation": "train.gradient_accumulation",
    "seed": "train.seed",
    "total": "total steps",
    "lr_scheduler": "train.lr_scheduler",
    "warmup_steps": "train.warmup_steps",
}


def _check_resume_config(run: Run, saved: JSONObject, path: Path) -> list[str]:
    """Refuse a resume whose model or LoRA layout changed; the list of warnings for other changed settings."""
    now = run_record(run)
    for key, label in _FIXED.items():
        if key in saved and saved[key] != now[key]:
            what = (f"was trained on a different model ({saved.get('model')!r}; model config or weights differ)"
                    if key == "model_id" else f"was trained with {label} = {saved[key]!r}, this config has {now[key]!r}")
            raise TrainError(f"cannot resume: the checkpoint {what}; restore the setting or train into a new output.dir",
                             file=str(path), key="--resume")
    notes = []
    for key, label in _CHANGES.items():
        if key in saved and saved[key] != now[key]:
            notes.append(f"{label} changed from {saved[key]!r} to {now[key]!r}")
    return notes


def _apply_learning_rates(run: Run, saved: JSONObject) -> None:
    """Use the config's learning rates from here on (a checkpoint stores the old ones in its schedule)."""
    t = run.cfg.train
    lora_te = any(c != run.family.denoiser_attr for c in run.lora_models)
    new = [t.learning_rate] if run.family.denoiser_attr in run.lora_models else []
    new += [t.text_encoder_lr or t.learning_rate] if lora_te else []
    new += [t.projection_lr or t.learning_rate] if run.projection_models else []
    new += [t.full_lr or t.learning_rate] if run.full_params else []
    sched = run.scheduler
    if [float(x) for x in sched.base_lrs] == [float(x) for x in new]:
        return
    for i, (group, base) in enumerate(zip(run.optimizer.param_groups, new, strict=True)):
        sched.base_lrs[i] = base
        group["initial_lr"] = base
        group["lr"] = base * sched.lr_lambdas[i](sched.last_epoch)


def _load_intact(run: Run, resume: bool | str | Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to resume from, loaded and verified; with ``resume=True`` a damaged newest one
    is reported (one line naming the file) and the previous intact one used instead."""
    if resume is not True:
        path = Path(resume)
        return path, load_checkpoint(path)
    found = [d for _, d in reversed(list_checkpoints(run.out_dir))]
    if not found:
        raise TrainError("no checkpoint to resume from in the output folder", file=str(run.out_dir / "checkpoints"), key="--resume")
    damaged: list[str] = []
    for path in found:
        try:
            state = load_checkpoint(path)
        except CheckpointError as e:
            damaged.append(str(path))
            if run.main:
                logger.warning("%s", e)
            continue
        if damaged and run.main:
            logger.warning("resuming from the previous intact checkpoint %s (step %d) instead of the damaged %s",
                           path, state["state"]["step"], damaged[0])
        return path, state
    raise TrainError(f"every checkpoint is damaged ({', '.join(damaged)}): nothing to resume from; "
                     "use --overwrite to start over", file=str(run.out_dir / "checkpoints"), key="--resume")


def restore(run: Run, resume: bool | str | Path) -> None:
    """Load trainable weights, optimizer, schedule, RNG states and data position from a checkpoint."""
    import torch

    path, state = _load_intact(run, resume)
    profile = run.profile
    if state["state"].get("fingerprint") != profile.fingerprint():
        raise TrainError(
            f"the checkpoint was trained with profile fingerprint {state['state'].get('fingerprint')} but this run's "
            f"profile '{profile.name}' has {profile.fingerprint()}", file=str(path), key="--resume",
        )
    saved = state["state"].get("run") or {}
    notes = _check_resume_config(run, saved, path) if isinstance(saved, dict) else []
    named_trainable = run.named_trainable
    missing = set(named_trainable) - set(state["params"])
    extra = set(state["params"]) - set(named_trainable)
    if missing or extra:
        raise TrainError(f"the checkpoint's trainable tensors do not match this run's ({len(missing)} missing, {len(extra)} "
                         "extra: different lora settings?)", file=str(path), key="--resume")
    shapes = [k for k, p in named_trainable.items() if tuple(state["params"][k].shape) != tuple(p.shape)]
    if shapes:
        raise TrainError(f"the checkpoint's tensor {shapes[0]} has shape {tuple(state['params'][shapes[0]].shape)}, this run's "
                         f"{tuple(named_trainable[shapes[0]].shape)} (a different lora.rank?)", file=str(path), key="--resume")
    try:
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
        rng = state["rng"]
        ranks = rng.get("ranks") if isinstance(rng, dict) else None
        accelerator = run.accelerator
        set_rng_state(ranks[accelerator.process_index] if ranks and len(ranks) == accelerator.num_processes else rng)
    except Exception as e:  # a state of another optimizer or a damaged RNG state
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainError(f"the checkpoint's optimizer, schedule or RNG state does not fit this run: {text}", file=str(path),
                         key="--resume") from None
    with torch.no_grad():
        for k, p in named_trainable.items():
            p.copy_(state["params"][k].to(p.dtype))
    run.step = int(state["state"]["step"])
    run.pos = Position(**state["state"]["position"])
    run.last_ckpt = path
    _apply_learning_rates(run, saved if isinstance(saved, dict) else {})
    if run.main:
        for note in notes:
            logger.warning("--resume: %s; the new value is used from step %d on", note, run.step + 1)
        if run.total <= run.step:
            logger.warning("--resume: the run has %d steps and the checkpoint is at step %d: nothing left to train "
                           "(raise train.max_steps to continue)", run.total, run.step)
        logger.info("resuming from %s (step %d)", path, run.step)


__all__ = ["restore", "run_record"]
