"""The training run: :func:`train` and the step loop.

:func:`train` is the whole run; everything it needs is in the config. It reads as four phases over
one :class:`te_align.train.run.Run` (what the phases share):

- :func:`te_align.train.run.setup`: validate the config, scan the dataset (fails fast before any model is loaded),
  resolve the profile, load the model with diffusers and check it against the profile, bucket the
  images, fill the latent and text caches, add LoRA, build the optimizer and schedule;
- :func:`te_align.train.resume.restore`: load a checkpoint's weights, optimizer, schedule, RNG states and data position;
- :func:`_loop`: the optimizer steps, with logs, checkpoints and samples;
- :func:`_finish`: the LoRA files, the last checkpoint, the loss plot and samples.

Conditioning always comes from ``te_align.encode`` with the run's profile (:mod:`te_align.train.text`; cached per
caption in a te-align ``EmbeddingCache`` when captions are static). The other parts of a run live by what they do:
:mod:`~te_align.train.latents` (the VAE latent store), :mod:`~te_align.train.optim` (optimizer, schedule, step),
:mod:`~te_align.train.resume` (checkpoint state restored) and :mod:`~te_align.train.record` (``train_config.json`` and
the recorded random draws).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from te_align._lazy import lazy_module
from te_align._types import JSONObject
from te_align.errors import CacheError
from te_align.train._io import WriteError, writing
from te_align.train.checkpoint import latest_checkpoint
from te_align.train.config import TrainConfig, TrainError, as_config
from te_align.train.data import Position, crop_for, step_generator
from te_align.train.export import save_diffusers_lora, save_kohya_lora
from te_align.train.logs import RunLog, plot_losses
from te_align.train.models import denoise, flow_timestep_scale, logit_normal, sdxl_time_ids, weight_dtype_name
from te_align.train.optim import direct_step
from te_align.train.preflight import check_device, check_output, set_aside_previous_run
from te_align.train.record import active_draws, params_digest, write_run_record
from te_align.train.resume import restore
from te_align.train.run import Run, TrainResult, setup

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

#: te_align.train.swap loads transformers: imported on first use.
_swap = lazy_module("te_align.train.swap")

logger = logging.getLogger("te_align.train")


# ------------------------------------------------------------------------------------------ train
def train(
    config: TrainConfig | JSONObject | str | Path,
    *,
    resume: bool | str | Path | None = None,
    stop_after: int | None = None,
    pipeline: DiffusionPipeline | None = None,
    overwrite: bool = False,
) -> TrainResult:
    """Run a LoRA training as configured: set up, resume, loop, finish.

    ``resume``: True continues from the newest intact checkpoint in the output folder, a path from
    that checkpoint. An output folder that holds a previous run (checkpoints or LoRA files) is
    refused unless ``resume`` or ``overwrite`` is given; ``overwrite`` moves the previous run's
    files into ``<output>/replaced-<UTC time>/`` first (nothing is deleted). ``stop_after`` ends the
    run after that many optimizer steps as if interrupted (a checkpoint is written there; used by
    tests and for time-boxed jobs). ``pipeline``: an already loaded diffusers pipeline to train
    instead of loading ``model.path`` (it is still checked against the profile; ``model.path`` is
    then only recorded).

    A full disk or read-only folder while writing stops the run with one line naming the file and
    the checkpoint to resume from; the checkpoints already written are never touched.
    """
    cfg = as_config(config)
    check_output(cfg, resume=resume, overwrite=overwrite)
    check_device(cfg)
    run: Run | None = None
    try:
        if overwrite:
            moved = set_aside_previous_run(cfg)
            if moved is not None:
                logger.info("--overwrite: the previous run's files are now in %s", moved)
        run = setup(cfg, pipeline)
        if resume:
            restore(run, resume)
        _loop(run, stop_after)
        return _finish(run)
    except (WriteError, CacheError) as e:
        last = latest_checkpoint(cfg.output.dir)
        hint = (f"the run can continue from its last checkpoint {last} with --resume" if last is not None
                else "no checkpoint was written yet")
        raise TrainError(f"{e.message}; {hint}", file=e.file) from None


# ----------------------------------------------------------------------------------------- loop
def _loop(run: Run, stop_after: int | None) -> None:
    """Optimizer steps until ``run.total`` (or ``stop_after`` more), with logs, checkpoints, samples."""
    from tqdm.auto import tqdm

    cfg, t = run.cfg, run.cfg.train
    if run.main:
        write_run_record(run)
    run.log = RunLog(run.out_dir, resume_step=run.step, tensorboard=cfg.logging.tensorboard, enabled=run.main)
    bar = tqdm(total=run.total, initial=run.step, disable=not (run.main and cfg.logging.progress), desc="train",
               unit="step", dynamic_ncols=True)
    stream = run.order.stream(run.pos)
    optimizer_step, clip_gradients = direct_step(run.accelerator, run.optimizer, run.trainable)
    t_start = time.perf_counter()
    steps_done = 0
    try:
        while run.step < run.total:
            if stop_after is not None and steps_done >= stop_after:
                break
            loss_value = _accumulate_gradients(run, stream)
            if run.text_encoder_params and run.accelerator.num_processes > 1:
                for p in run.text_encoder_params:
                    if p.grad is not None:
                        p.grad = run.accelerator.reduce(p.grad, reduction="mean")
            if t.max_grad_norm > 0:
                clip_gradients(t.max_grad_norm)
            optimizer_step()
            run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
            run.step += 1
            steps_done += 1
            elapsed = time.perf_counter() - t_start
            run.steps_per_s = steps_done / elapsed if elapsed > 0 else 0.0
            lr = run.scheduler.get_last_lr()[0]
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")
            if run.step % cfg.logging.every == 0 or run.step == run.total:
                run.log.log(run.step, run.pos.epoch, loss_value, lr, run.steps_per_s, elapsed)
            if t.checkpoint_every and run.step % t.checkpoint_every == 0 and run.step < run.total:
                run.save_checkpoint()
            if cfg.sample.every and run.step % cfg.sample.every == 0 and run.step < run.total:
                with writing(run.out_dir / "samples"):
                    run.sample()
    finally:
        bar.close()
        run.log.close()


def _accumulate_gradients(run: Run, stream: Iterator[tuple[Position, list[int]]]) -> float:
    """The micro-batches of one optimizer step, back-propagated; returns their mean loss."""
    t, accelerator = run.cfg.train, run.accelerator
    micro_losses = []
    for micro in range(t.gradient_accumulation):
        run.pos, batch = next(stream)  # the global batch; this process trains batch[lo:hi]
        gen = step_generator(t.seed, run.step, micro)
        # per-encoder dropout of slots the profile publishes no rate for: a stream of its own (TextSource.slot_dropout)
        dropout_gen = step_generator(t.seed, run.step, f"{micro}:encoder-dropout")
        lo, hi = run.order.shard(len(batch))
        # the loss of this shard, weighted so that the all-reduce *mean* of the gradients over
        # processes is the gradient of the mean loss over the whole global batch
        weight = (hi - lo) * accelerator.num_processes / len(batch)
        if hi <= lo:  # more processes than images left in this bucket: a zero-weight step keeps DDP in sync
            lo, hi, weight = 0, 1, 0.0
        sync = micro == t.gradient_accumulation - 1
        ctx = contextlib.nullcontext() if sync or accelerator.num_processes == 1 else accelerator.no_sync(run.model)
        with ctx:
            loss = _micro_step(run, batch=batch, gen=gen, span=(lo, hi), dropout_gen=dropout_gen)
            if accelerator.num_processes > 1:
                loss = loss * weight
                # sum over processes of weight x shard mean / N = mean loss over the global batch
                value = float(accelerator.gather(loss.detach()[None]).sum()) / accelerator.num_processes
            else:
                value = float(loss.detach())
            if not math.isfinite(value):
                where = str(run.last_ckpt) if run.last_ckpt else "none (no checkpoint was saved before this step)"
                raise TrainError(
                    f"loss is {value} at step {run.step + 1}: training stopped. Last good checkpoint: {where}. "
                    "Lower train.learning_rate, use mixed_precision = \"bf16\" instead of fp16, or check the data"
                )
            accelerator.backward(loss / t.gradient_accumulation if t.gradient_accumulation > 1 else loss)
            micro_losses.append(value)
    return sum(micro_losses) / len(micro_losses)


# --------------------------------------------------------------------------------------- finish
def _finish(run: Run) -> TrainResult:
    """An interrupted run (``stop_after``) ends with a checkpoint; a complete one writes the LoRA
    files (diffusers and, when asked, kohya format), the final checkpoint, loss plot and samples."""
    if run.step < run.total:
        run.save_checkpoint()
        return run.result()
    cfg, profile = run.cfg, run.profile
    lora_path = kohya_path = None
    if cfg.train.checkpoint_every:  # first: a full disk while writing the LoRA files leaves a run to --resume
        run.save_checkpoint()
    if run.main:
        extra = _lora_metadata(run)
        if run.lora_models:  # none with lora.rank = 0 and no text-encoder LoRA: no empty LoRA file is written
            lora_path = save_diffusers_lora(type(run.pipe), run.lora_models, run.out_dir / f"{cfg.output.name}.safetensors",
                                            profile=profile, extra=extra)
        if run.projection_models:
            _swap.save_projection(run.projection_models, run.out_dir / f"{cfg.output.name}_projection.safetensors",
                            profile=profile, extra=extra)
        if run.full_params:
            _swap.save_tensors({f"{run.family.denoiser_attr}.{k}": p for k, p in run.full_params.items()},
                         run.out_dir / f"{cfg.output.name}_full.safetensors", profile=profile, extra=extra)
        if cfg.output.kohya and run.lora_models:
            kohya_path = save_kohya_lora(run.lora_models, run.out_dir / f"{cfg.output.name}_kohya.safetensors",
                                         n_text_encoders=len(profile.slots), profile=profile, extra=extra,
                                         base_model=cfg.model.path, family=run.family.name)
    run.accelerator.wait_for_everyone()  # the main process has closed the CSV log
    result = run.result(lora_path, kohya_path)
    if run.main and cfg.logging.loss_plot:
        plot_losses(result.losses, run.out_dir / "loss.png")
    with writing(run.out_dir / "samples"):
        run.sample()
    run.accelerator.wait_for_everyone()
    return result


def _lora_metadata(run: Run) -> JSONObject:
    """Training facts stamped into the saved LoRA files."""
    cfg = run.cfg
    return {
        "base_model": cfg.model.path, "objective": run.objective, "steps": run.total, "rank": cfg.lora.rank,
        "alpha": cfg.lora.alpha, "profile_overrides": cfg.model.profile_overrides,
        "learning_rate": cfg.train.learning_rate, "seed": cfg.train.seed,
        "weight_dtype": weight_dtype_name(cfg.model, cfg.train.mixed_precision), "quantize": cfg.model.quantize,
    }


def _micro_step(
    run: Run, *, batch: list[int], gen: torch.Generator, span: tuple[int, int] | None = None,
    dropout_gen: torch.Generator | None = None,
) -> torch.Tensor:
    """One micro-batch: latents, noise, conditioning, denoiser, loss (float32 scalar).

    ``batch`` is the global batch; only ``batch[lo:hi]`` (``span``, default all) is computed, the
    loss is the mean over that slice. Every random draw is made for the whole global batch and then
    sliced, so the processes of a data-parallel run together draw exactly what one process training
    the whole batch draws (same flips, noise, timesteps and caption dropout per image).
    """
    import torch

    cfg, family, items, device = run.cfg, run.family, run.items, run.device
    n = len(batch)
    lo, hi = span if span is not None else (0, n)
    local = batch[lo:hi]
    b = len(local)
    flips = torch.rand(n, generator=gen).lt(0.5).tolist() if cfg.data.random_flip else [False] * n
    means, stds = zip(*(run.latents.get(i, items[i], f) for i, f in zip(local, flips[lo:hi], strict=True)), strict=True)
    mean, std = torch.stack(means), torch.stack(stds)
    full = (n, *mean.shape[1:])
    if cfg.data.latent_sample == "sample":
        x0 = mean + std * torch.randn(full, generator=gen)[lo:hi]
    else:
        x0 = mean
    x0 = ((x0 - run.shift) * run.scaling).to(device)
    noise = torch.randn(full, generator=gen)[lo:hi]
    if cfg.train.noise_offset:
        noise = noise + cfg.train.noise_offset * torch.randn((n, x0.shape[1], 1, 1), generator=gen)[lo:hi]
    noise = noise.to(device)
    cond = run.text.batch([items[i].caption for i in batch], gen, span=(lo, hi), dropout_gen=dropout_gen)
    time_ids = None
    if family.name == "sdxl":
        rows = []
        for i in local:
            it = items[i]
            rows.append(sdxl_time_ids((it.size[1], it.size[0]), crop_for(it), (it.bucket[1], it.bucket[0])))
        time_ids = torch.tensor(rows, device=device, dtype=run.compute_dtype)
    if run.objective == "flow":
        tt = logit_normal(n, run.flow_shift, gen)[lo:hi].to(device)
        s = tt.view(b, 1, 1, 1)
        noisy = (1.0 - s) * x0 + s * noise
        timesteps = tt * flow_timestep_scale(family)
        target = noise - x0
    else:
        noise_sched = run.noise_sched
        timesteps = torch.randint(0, noise_sched.config.num_train_timesteps, (n,), generator=gen)[lo:hi].to(device)
        noisy = noise_sched.add_noise(x0, noise, timesteps)
        target = noise if run.objective == "eps" else noise_sched.get_velocity(x0, noise, timesteps)
    recorded = active_draws()
    if recorded is not None:
        recorded.append({
            "step": run.step, "batch": list(batch), "flips": list(flips), "noise": noise.detach().cpu().clone(),
            "timesteps": timesteps.detach().cpu().clone(), **run.text.last_draws,
            "lora": params_digest(run) if run.step == 0 else "",
        })
    with run.accelerator.autocast():
        pred = denoise(family, run.model, noisy.to(run.compute_dtype), timesteps, cond, time_ids=time_ids,
                       guidance=cfg.train.guidance, config=run.denoiser.config, denoiser_mask=run.denoiser_mask)
    return torch.nn.functional.mse_loss(pred.float(), target.float())


__all__ = ["train"]
