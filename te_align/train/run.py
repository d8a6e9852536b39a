"""The :class:`Run` (what the phases of one training run share) and :func:`setup`, which builds it: accelerator and
seed, the dataset, profile and model, buckets, latent and text caches, LoRA, batch order, optimizer and schedule."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._compat import require_peft
from te_align._dtypes import dtype_name, torch_dtype
from te_align._lazy import lazy_module
from te_align._threads import fit
from te_align.encoding.cache.keys import tensors_digest
from te_align.train.checkpoint import rng_state, save_checkpoint
from te_align.train.config import TrainConfig, TrainError
from te_align.train.data import BatchOrder, Item, Position, ScanReport, assign_bucket, make_buckets, scan
from te_align.train.estimate import steady_cpu_heap
from te_align.train.latents import LatentStore
from te_align.train.logs import RunLog, read_losses
from te_align.train.models import (
    CLIP_TARGETS,
    Family,
    add_lora,
    check_model,
    check_quantize,
    default_flow_shift,
    denoiser_mask_on,
    enable_gradient_checkpointing,
    family_of,
    latent_transform,
    load_pipeline,
    place_denoiser,
    prepare_frozen,
    resolve_profile,
    vae_scale_factor,
    weight_dtype_name,
)
from te_align.train.optim import lr_lambda, make_optimizer
from te_align.train.preflight import check_sizes
from te_align.train.residency import Residency, for_sampling, precache_variants, release
from te_align.train.resume import run_record
from te_align.train.sampling import sample_images
from te_align.train.text import TextSource

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from accelerate import Accelerator
    from diffusers import DiffusionPipeline
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

    from te_align.encoding.projected import ProjectedTextEncoder
    from te_align.profiles.model import AlignmentProfile

#: te_align.train.swap loads transformers: imported on first use.
_swap = lazy_module("te_align.train.swap")

logger = logging.getLogger("te_align.train")


@dataclass
class TrainResult:
    output_dir: Path
    lora_path: Path | None
    kohya_path: Path | None
    steps: int
    losses: list[tuple[int, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    profile_name: str = ""
    fingerprint: str = ""
    steps_per_s: float = 0.0


@dataclass(eq=False)
class Run:
    """What the phases of one training run share: set up by :func:`setup`, then advanced by
    :func:`te_align.train.resume.restore` and the step loop (``step``, ``pos``, ``last_ckpt``, ``log``) and read by
    the run's finish (:mod:`te_align.train.loop`)."""

    cfg: TrainConfig
    accelerator: Accelerator
    device: torch.device
    #: This process writes the outputs (rank 0 of a data-parallel run).
    main: bool
    out_dir: Path
    report: ScanReport
    profile: AlignmentProfile
    family: Family
    pipe: DiffusionPipeline
    objective: str
    #: Autocast dtype of the denoiser call; ``cond_dtype``: dtype of the conditioning and the samples.
    compute_dtype: torch.dtype
    cond_dtype: torch.dtype
    latents: LatentStore
    #: VAE latent shift and scaling factor.
    shift: float
    scaling: float
    text: TextSource
    #: Component attribute -> model with LoRA (the denoiser, text encoders with LoRA).
    lora_models: dict[str, torch.nn.Module]
    denoiser_params: list[torch.nn.Parameter]
    text_encoder_params: list[torch.nn.Parameter]
    order: BatchOrder
    #: Optimizer steps of the whole run.
    total: int
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    #: The denoiser as ``accelerator.prepare`` returned it (``denoiser`` is the unwrapped one).
    model: torch.nn.Module
    noise_sched: SchedulerMixin | None
    flow_shift: float
    #: The profile hands the denoiser its text attention mask (chroma; ``models.denoiser_mask_on``).
    denoiser_mask: bool = True
    #: sha256 of the denoiser's config and a few of its weights: a resumed run must train the same model.
    model_id: str = ""
    step: int = 0
    pos: Position = field(default_factory=Position)
    last_ckpt: Path | None = None
    log: RunLog | None = None
    steps_per_s: float = 0.0
    #: Text encoders / VAE freed or moved to CPU once the caches were full (te_align.train.residency).
    residency: Residency | None = None
    #: A swapped model's projected text encoders by component; their projections train (te_align.train.swap).
    projection_models: dict[str, ProjectedTextEncoder] = field(default_factory=dict)
    #: Denoiser weights trained in full (``train.full_modules``), by diffusers parameter name.
    full_params: dict[str, torch.nn.Parameter] = field(default_factory=dict)

    @property
    def items(self) -> list[Item]:
        return self.report.items

    @property
    def denoiser(self) -> torch.nn.Module:
        return getattr(self.pipe, self.family.denoiser_attr)

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return self.denoiser_params + self.text_encoder_params

    @property
    def named_trainable(self) -> dict[str, torch.nn.Parameter]:
        named = {f"{comp}.{n}": p for comp, m in self.lora_models.items() for n, p in m.named_parameters() if p.requires_grad}
        if self.family.denoiser_attr not in self.lora_models:  # lora.rank = 0: the full-module weights by their own names
            named.update({f"{self.family.denoiser_attr}.{k}": p for k, p in self.full_params.items()})
        if self.projection_models:
            named.update(_swap.named_projection_params(self.projection_models))
        return named

    def save_checkpoint(self) -> Path:
        """Checkpoint at the current step (collective: every process calls it); returns its folder."""
        rng = None
        if self.accelerator.num_processes > 1:  # every process's RNG state, so each resumes its own stream
            from accelerate.utils import gather_object

            rng = dict(rng_state(), ranks=gather_object([rng_state()]))
        if self.main:
            self.last_ckpt = save_checkpoint(
                self.out_dir, self.step, params=self.named_trainable, optimizer=self.optimizer, scheduler=self.scheduler,
                keep=self.cfg.train.checkpoints_keep, rng=rng,
                state={"position": dataclasses.asdict(self.pos), "fingerprint": self.profile.fingerprint(),
                       "profile": self.profile.name, "run": run_record(self)},
            )
        self.accelerator.wait_for_everyone()
        assert self.last_ckpt is not None or not self.main
        return self.last_ckpt  # type: ignore[return-value]

    def sample(self) -> None:
        """Sample images at the current step (main process, when prompts are configured)."""
        cfg = self.cfg
        if not (self.main and cfg.sample.prompts):
            return
        self.denoiser.eval()
        try:
            side = max(cfg.data.bucket_step, cfg.data.resolution // cfg.data.bucket_step * cfg.data.bucket_step)
            with for_sampling(self.pipe, self.residency, self.device):
                sample_images(self.pipe, self.profile, cfg.sample, self.out_dir / "samples", self.step, size=(side, side),
                              device=self.device, dtype=self.cond_dtype)
        finally:
            self.denoiser.train()

    def result(self, lora_path: Path | None = None, kohya_path: Path | None = None) -> TrainResult:
        assert self.log is not None
        return TrainResult(self.out_dir, lora_path, kohya_path, self.step, read_losses(self.log.csv_path), self.last_ckpt,
                           self.profile.name, self.profile.fingerprint(), self.steps_per_s)


# ---------------------------------------------------------------------------------------- setup
def setup(cfg: TrainConfig, pipeline: DiffusionPipeline | None) -> Run:
    """Everything the loop needs, in this order: accelerator and seed, the dataset (a bad one fails
    before any model is loaded), profile and model, buckets, latent cache, LoRA, text conditioning,
    batch order, optimizer and schedule."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    t = cfg.train
    cpu = t.device == "cpu" or (t.device == "auto" and not torch.cuda.is_available())
    if cpu:  # freed tensors go back to the OS, so the resident set follows what --estimate counts
        steady_cpu_heap()
    _fresh_accelerator_state()
    accelerator = Accelerator(mixed_precision=t.mixed_precision, cpu=cpu)
    device = accelerator.device if t.device in ("auto", "cpu") else torch.device(t.device)
    set_seed((t.seed + accelerator.process_index) % 2**32)  # global RNGs (LoRA dropout); per-step draws use step_generator

    report = scan(cfg.data)
    require_peft("diffusers", *(["transformers"] if cfg.lora.text_encoders else []))  # before any model is loaded
    weight_dtype = torch_dtype(weight_dtype_name(cfg.model, t.mixed_precision))
    check_quantize(cfg.model.quantize, device)
    profile, family, pipe, objective = _load_model(cfg, pipeline, device, weight_dtype)
    if device.type == "cpu":  # threads that fit the machine: two threads on a shared 2-core box collapse (_threads)
        fit(sum(p.numel() for p in getattr(pipe, family.denoiser_attr).parameters()), t.threads)
    model_id = _model_id(getattr(pipe, family.denoiser_attr))
    compute_dtype = weight_dtype if t.mixed_precision == "no" else torch_dtype(t.mixed_precision)
    cond_dtype = compute_dtype if weight_dtype == torch.float32 else weight_dtype

    out_dir = Path(cfg.output.dir)
    cache_dir = Path(cfg.data.cache_dir) if cfg.data.cache_dir else out_dir / "cache"
    latents = _bucket_and_cache_latents(cfg, report.items, family, pipe, device, accelerator, cache_dir)
    shift, scaling = latent_transform(pipe.vae)

    lora_models, denoiser_params, text_encoder_params = _add_lora(cfg, profile, family, pipe)
    full = _swap.full_params(getattr(pipe, family.denoiser_attr), t.full_modules)
    projections = _swap.projection_models(profile, pipe)
    projection_params = [p for m in projections.values() for p in m.projection.parameters()]
    if projections:  # a swapped model: the projection trains on the (cached) inner encoder output
        text = _swap.text_source(cfg, profile, pipe, projections, device, cond_dtype, cache_dir=cache_dir / "text",
                           writer=accelerator.is_main_process, base=TextSource)
    else:
        text = TextSource(cfg, profile, pipe, device, cond_dtype, trainable=bool(cfg.lora.text_encoders),
                          cache_dir=cache_dir / "text", writer=accelerator.is_main_process)
    with accelerator.main_process_first():
        text.precache(sorted({it.caption for it in report.items}))
        if cfg.model.free_encoders:  # every dropout variant too, so that the text encoders can be freed
            precache_variants(text, sorted({it.caption for it in report.items}))
    residency = release(cfg, profile, pipe, text, latents, device)
    place_denoiser(pipe, profile, device)

    order = BatchOrder(report.items, t.batch_size, t.seed, accelerator.process_index, accelerator.num_processes)
    per_epoch = max(1, math.ceil(order.batches_per_epoch() / t.gradient_accumulation))
    total = t.max_steps if t.max_steps > 0 else t.epochs * per_epoch
    groups = [{"params": denoiser_params, "lr": t.learning_rate}] if denoiser_params else []
    if text_encoder_params:
        groups.append({"params": text_encoder_params, "lr": t.text_encoder_lr or t.learning_rate})
    if projection_params:
        groups.append({"params": projection_params, "lr": t.projection_lr or t.learning_rate})
    if full:
        groups.append({"params": list(full.values()), "lr": t.full_lr or t.learning_rate})
    optimizer = make_optimizer(cfg, groups, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.lr_scheduler, t.warmup_steps, total))
    model, optimizer = accelerator.prepare(getattr(pipe, family.denoiser_attr), optimizer)

    return Run(
        cfg=cfg, accelerator=accelerator, device=device, main=accelerator.is_main_process, out_dir=out_dir,
        report=report, profile=profile, family=family, pipe=pipe, objective=objective, compute_dtype=compute_dtype,
        cond_dtype=cond_dtype, latents=latents, shift=shift, scaling=scaling, text=text, lora_models=lora_models,
        denoiser_params=denoiser_params + list(full.values()), text_encoder_params=text_encoder_params + projection_params,
        order=order, total=total,
        optimizer=optimizer, scheduler=scheduler, model=model, noise_sched=_noise_scheduler(objective, pipe),
        flow_shift=t.flow_shift or default_flow_shift(family), model_id=model_id, residency=residency,
        projection_models=projections, full_params=full, denoiser_mask=_denoiser_mask(profile, family, accelerator),
    )


def _denoiser_mask(profile: AlignmentProfile, family: Family, accelerator: Accelerator) -> bool:
    """Whether the denoiser gets the profile's text attention mask (a family whose denoiser takes one)."""
    if family.mask_arg is None:
        return False
    on = denoiser_mask_on(profile)
    if accelerator.is_main_process:
        logger.info("%s: the text attention mask %s the %s (profile '%s'%s)", family.name,
                    "goes to" if on else "is NOT given to", family.denoiser_attr, profile.name,
                    "" if on else ": masks.denoiser is off or it has no denoiser_mask output")
    return on


def _load_model(
    cfg: TrainConfig, pipeline: DiffusionPipeline | None, device: torch.device, dtype: torch.dtype
) -> tuple[AlignmentProfile, Family, DiffusionPipeline, str]:
    """(profile, family, pipeline, objective): the model loaded (or ``pipeline``), checked against the
    profile, frozen, in ``dtype`` (or quantized) and on ``device``."""
    profile = resolve_profile(cfg.model)
    family = family_of(profile)
    pipe = pipeline if pipeline is not None else load_pipeline(cfg.model, profile, dtype_name=dtype_name(dtype))
    check_model(profile, pipe, cfg.model.path)
    objective = _pick_objective(cfg.train.objective, family, pipe.scheduler.config if pipe.scheduler is not None else {})
    prepare_frozen(cfg.model, profile, pipe, device, dtype)
    return profile, family, pipe, objective


def _bucket_and_cache_latents(
    cfg: TrainConfig,
    items: list[Item],
    family: Family,
    pipe: DiffusionPipeline,
    device: torch.device,
    accelerator: Accelerator,
    cache_dir: Path,
) -> LatentStore:
    """Assign every image its bucket, then fill the latent cache when it is on."""
    vae = pipe.vae
    check_sizes(cfg, vae_scale_factor(vae) * family.patch)
    buckets = make_buckets(cfg.data, vae_scale_factor(vae) * family.patch)
    for it in items:
        it.bucket = assign_bucket(it.size, buckets)
    latents = LatentStore(vae, cache_dir / "latents" if cfg.data.cache_latents else None, device, vae.dtype)
    if cfg.data.cache_latents:
        with accelerator.main_process_first():  # the main process writes the disk cache, the others read it
            for i, it in enumerate(items):
                for flip in (False, True) if cfg.data.random_flip else (False,):
                    latents.get(i, it, flip)
    return latents


def _add_lora(
    cfg: TrainConfig, profile: AlignmentProfile, family: Family, pipe: DiffusionPipeline
) -> tuple[dict[str, torch.nn.Module], list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(LoRA models by component, denoiser LoRA parameters, text-encoder LoRA parameters)."""
    te_slots = list(cfg.lora.text_encoders)
    for name in te_slots:
        slot = profile.slot(name) if name in profile.slot_names else None
        if slot is None:
            raise TrainError(f"no slot '{name}' in profile '{profile.name}' (slots: {', '.join(profile.slot_names)})", key="lora.text_encoders")
        swapped = slot.encoder.cls == "ProjectedTextEncoder"  # te-align swap: LoRA on its inner encoder
        if not slot.tokenizer.cls.startswith("CLIP") and not swapped:
            raise TrainError(f"text-encoder LoRA is supported on CLIP slots only (diffusers loads no {slot.name} LoRA)", key="lora.text_encoders")
    lo, t = cfg.lora, cfg.train
    denoiser = getattr(pipe, family.denoiser_attr)
    lora_models: dict[str, torch.nn.Module] = {}
    denoiser_params: list[torch.nn.Parameter] = []
    if lo.rank > 0:  # lora.rank = 0: a full fine-tune of train.full_modules, no denoiser LoRA
        denoiser_params = add_lora(denoiser, rank=lo.rank, alpha=lo.alpha, dropout=lo.dropout,
                                   targets=lo.target_modules or family.default_targets, seed=t.seed)
        lora_models[family.denoiser_attr] = denoiser
    text_encoder_params: list[torch.nn.Parameter] = []
    for k, name in enumerate(te_slots):
        slot = profile.slot(name)
        enc = getattr(pipe, slot.encoder_subfolder)
        targets = lo.text_encoder_target_modules or CLIP_TARGETS
        if not lo.text_encoder_target_modules and slot.encoder.cls == "ProjectedTextEncoder":
            targets = _swap.encoder_lora_targets(enc)
        text_encoder_params += add_lora(enc, rank=lo.text_encoder_rank or lo.rank, alpha=lo.alpha, dropout=lo.dropout,
                                        targets=targets, seed=t.seed + 1 + k)
        lora_models[slot.encoder_subfolder] = enc
        enc.train()
    if t.gradient_checkpointing:
        enable_gradient_checkpointing(family, denoiser)
        for name in te_slots:
            getattr(pipe, profile.slot(name).encoder_subfolder).gradient_checkpointing_enable()
    denoiser.train()
    return lora_models, denoiser_params, text_encoder_params


def _noise_scheduler(objective: str, pipe: DiffusionPipeline) -> SchedulerMixin | None:
    """The DDPM noise schedule of an eps / v run (None for rectified flow)."""
    if objective not in ("eps", "v"):
        return None
    from diffusers import DDPMScheduler

    noise_sched = DDPMScheduler.from_config(pipe.scheduler.config)
    if objective == "v":
        noise_sched.register_to_config(prediction_type="v_prediction")
    return noise_sched


def _pick_objective(name: str, family: Family, scheduler_config: Any) -> str:
    if family.flow_native:
        if name not in ("auto", "flow"):
            raise TrainError(f"{family.name} models train with rectified flow only; got {name!r}", key="train.objective")
        return "flow"
    if name == "flow" and family.name != "sdxl":
        raise TrainError("the flow-matching objective is available for SDXL, SD3 and Flux", key="train.objective")
    if name == "auto":
        pred = getattr(scheduler_config, "prediction_type", None) or (scheduler_config or {}).get("prediction_type", "epsilon")
        return "v" if pred == "v_prediction" else "eps"
    return name


def _fresh_accelerator_state() -> None:
    """accelerate keeps one process-wide state and refuses a second ``Accelerator`` with other settings (e.g. a
    bf16 run after a float32 one in the same process): in a single process each run starts from a clean state.
    A distributed run keeps it (its process group lives there)."""
    from accelerate.state import AcceleratorState, PartialState

    if AcceleratorState._shared_state and not PartialState().use_distributed:
        AcceleratorState._reset_state()


def _model_id(denoiser: torch.nn.Module) -> str:
    """sha256 of the denoiser's config and its first and last weights (before LoRA is added)."""
    import hashlib

    config = dict(getattr(denoiser, "config", {}) or {})
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode("utf-8"))
    named = list(denoiser.named_parameters())
    if named:
        h.update(tensors_digest({n: p for n, p in (named[0], named[-1])}).encode("utf-8"))
    return h.hexdigest()


__all__ = ["Run", "TrainResult", "setup"]
