"""The training run: set-up, the optimisation loop, checkpoints, outputs.

:func:`train` is the whole run; everything it needs is in the config. It reads as four phases over
one :class:`Run` (what the phases share):

- :func:`_setup`: validate the config, scan the dataset (fails fast before any model is loaded),
  resolve the profile, load the model with diffusers and check it against the profile, bucket the
  images, fill the latent and text caches, add LoRA, build the optimizer and schedule;
- :func:`_resume`: load a checkpoint's weights, optimizer, schedule, RNG states and data position;
- :func:`_loop`: the optimizer steps, with logs, checkpoints and samples;
- :func:`_finish`: the LoRA files, the last checkpoint, the loss plot and samples.

Conditioning always comes from ``te_align.encode`` with the run's profile (cached per caption in a
te-align ``EmbeddingCache`` when captions are static).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import te_align
from te_align import _safetensors
from te_align._compat import _key, require_peft
from te_align._dtypes import dtype_name, torch_dtype
from te_align._lazy import lazy_module
from te_align._paths import read_bytes
from te_align._threads import fit
from te_align._types import JSONObject
from te_align.encoding import Conditioning, EncodeOptions, sample_dropout
from te_align.encoding.cache.keys import hash_text_encoders, tensors_digest
from te_align.encoding.cache.store import EmbeddingCache
from te_align.errors import CacheError
from te_align.train._io import WriteError, write_atomic, writing
from te_align.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from te_align.train.config import TrainConfig, TrainError, as_config
from te_align.train.data import (
    BatchOrder,
    Item,
    Position,
    ScanReport,
    assign_bucket,
    crop_for,
    file_digest,
    load_pixels,
    make_buckets,
    process_caption,
    scan,
    step_generator,
)
from te_align.train.estimate import steady_cpu_heap
from te_align.train.export import save_diffusers_lora, save_kohya_lora
from te_align.train.logs import RunLog, plot_losses, read_losses
from te_align.train.models import (
    CLIP_TARGETS,
    QUANTIZE_BACKENDS,
    Family,
    add_lora,
    check_model,
    check_quantize,
    default_flow_shift,
    denoise,
    denoiser_mask_on,
    enable_gradient_checkpointing,
    family_of,
    flow_timestep_scale,
    latent_transform,
    load_pipeline,
    logit_normal,
    place_denoiser,
    prepare_frozen,
    resolve_profile,
    sdxl_time_ids,
    vae_scale_factor,
    weight_dtype_name,
)
from te_align.train.preflight import check_device, check_output, check_sizes, set_aside_previous_run
from te_align.train.residency import Residency, for_sampling, precache_variants, release
from te_align.train.sampling import sample_images

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


# ------------------------------------------------------------------------------------------ latents
class LatentStore:
    """VAE latent distributions (mean, std) per (image, flip), in memory and optionally on disk."""

    def __init__(self, vae: torch.nn.Module, directory: Path | None, device: torch.device, dtype: torch.dtype) -> None:
        self.vae = vae
        self.dir = directory
        self.device = device
        self.dtype = dtype
        self.mem: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]] = {}
        self.vae_hash = hash_text_encoders({"vae": vae}) if directory is not None else ""

    def _encode(self, item: Item, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        px, _ = load_pixels(item, flip)
        with torch.no_grad():
            dist = self.vae.encode(px[None].to(self.device, self.dtype)).latent_dist
        return dist.mean[0].float().cpu(), dist.std[0].float().cpu()

    def get(self, index: int, item: Item, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
        key = (index, flip)
        if key in self.mem:
            return self.mem[key]
        if self.dir is None:
            return self._encode(item, flip)
        import hashlib

        from safetensors.torch import load, save

        ident = f"{file_digest(item.path)}|{item.bucket}|{flip}|{self.vae_hash}|{self.dtype}"
        name = hashlib.sha256(ident.encode()).hexdigest()
        path = self.dir / name[:2] / f"{name}.safetensors"
        value = None
        if path.is_file():
            why = ""
            try:
                data = read_bytes(path, TrainError)
                meta = _safetensors.parse_header(data, len(data), label=str(path), error=TrainError).metadata
                t = load(data)
                if meta.get("te_align.tensors_sha256") != tensors_digest({"mean": t["mean"], "std": t["std"]}):
                    why = "tensor bytes do not match their recorded digest" if "te_align.tensors_sha256" in meta else "no digest"
                else:
                    value = (t["mean"], t["std"])
            except Exception as e:  # a truncated or garbage entry is recomputed
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
            if value is None:
                logger.warning("latent cache: entry %s is damaged (%s); re-encoding it", path, why)
        if value is None:
            value = self._encode(item, flip)
            tensors = {"mean": value[0].contiguous(), "std": value[1].contiguous()}
            write_atomic(path, save(tensors, metadata={"te_align.tensors_sha256": tensors_digest(tensors)}))
        self.mem[key] = value
        return value


# ------------------------------------------------------------------------------------------ text
#: In-memory budget of cached text conditioning (the rest is read from the disk cache when needed).
MEMO_BYTES = 512 * 2**20


def _nbytes(cond: Conditioning) -> int:
    return sum(t.numel() * t.element_size() for t in cond.values())


class TextSource:
    """Conditioning for a batch of raw captions: caption processing, dropout and te_align.encode."""

    def __init__(
        self,
        cfg: TrainConfig,
        profile: AlignmentProfile,
        pipe: DiffusionPipeline,
        device: torch.device,
        dtype: torch.dtype,
        *,
        trainable: bool,
        cache_dir: Path,
        writer: bool = True,
    ) -> None:
        self.cfg = cfg.data
        self.profile = profile
        self.pipe = pipe
        self.device = device
        self.dtype = dtype
        self.trainable = trainable
        self.options = EncodeOptions(
            long_prompt_chunks=cfg.data.long_prompt_chunks,
            dropout_policy=cfg.data.dropout_policy,
            chunk_padding=cfg.data.long_prompt_padding,
        )
        probs: dict[str, float] = {}
        for k, v in cfg.data.encoder_dropout.items():
            if k == "all":
                for s in profile.slots:
                    if s.train_dropout:
                        probs[s.name] = float(s.train_dropout)
            else:
                try:
                    profile.slot(k)
                except Exception as e:
                    raise TrainError(str(e), key=f"data.encoder_dropout.{k}") from None
                probs[k] = float(v)
        self.slot_probs = probs
        #: The slots whose dropout rate the profile publishes (its own order). Their uniforms are drawn from the step's
        #: stream for every run on this profile, whatever rate the run sets (0 when it drops none): a run's rates set
        #: only the thresholds, so two runs that differ in per-encoder dropout consume the same numbers and share every
        #: later draw (timesteps). A rate for a slot the profile publishes none for draws from a stream of its own.
        self.published = [s.name for s in profile.slots if s.train_dropout]
        #: The dropout draws of the last :meth:`batch` (whole global batch), kept while draws are recorded.
        self.last_draws: JSONObject = {}
        longest = cfg.data.long_prompt_padding == "longest"
        self.use_cache = cfg.data.cache_text and not trainable and not cfg.data.shuffle_tags and not longest
        if cfg.data.cache_text and not self.use_cache:
            if trainable or cfg.data.shuffle_tags:
                why = "text encoders are trained" if trainable else "tags are shuffled"
                why += ", so captions change every step"
            else:
                why = "each batch's chunks are padded to its longest caption (data.long_prompt_padding)"
            logger.info("text-embedding cache off: %s", why)
        self._caches: dict[str, EmbeddingCache] = {}
        #: Recently used conditionings in memory, least recently used first; the disk cache holds them all.
        self._memo: OrderedDict[tuple[str, str], Conditioning] = OrderedDict()
        self._memo_bytes = 0
        self.cache_dir = cache_dir
        #: Only this process writes cache files (rank 0 of a data-parallel run; the others read them).
        self.writer = writer
        self._te_hash: str | None = None

    def _cache(self, pattern: str, options: EncodeOptions | None = None) -> EmbeddingCache:
        options = options or self.options
        key = pattern if options is self.options else f"{pattern}|{options.as_dict()}"
        if key not in self._caches:
            if self._te_hash is None:
                self._te_hash = hash_text_encoders(
                    {s.name: getattr(self.pipe, s.encoder_subfolder) for s in self.profile.slots},
                    {s.name: getattr(self.pipe, s.tokenizer_subfolder) for s in self.profile.slots},
                )
            opts = dict(options.as_dict(), dropped=pattern)
            self._caches[key] = EmbeddingCache(self.cache_dir, self.profile, self._te_hash, opts)
        return self._caches[key]

    def _encode(
        self, captions: list[str], drop: list[bool], drop_slots: dict[str, list[bool]], options: EncodeOptions | None = None
    ) -> Conditioning:
        return te_align.encode(
            self.profile, captions, pipeline=self.pipe, options=options or self.options, drop=drop,
            drop_slots=drop_slots or None, requires_grad=self.trainable,
        )

    @property
    def chunk_positions(self) -> int:
        """Positions of one long-prompt chunk (the chunkable slot's max_length, 77 for CLIP)."""
        return next(s.tokenizer.max_length for s in self.profile.slots if s.tokenizer.chunkable)

    def chunks_of(self, cond: Conditioning) -> int:
        """How many long-prompt chunks a (chunked) conditioning holds."""
        return _seq_len(cond) // self.chunk_positions

    def padded_options(self, chunks: int) -> EncodeOptions:
        """The options that encode a caption padded to exactly ``chunks`` long-prompt chunks (a batch's chunk count)."""
        return dataclasses.replace(self.options, long_prompt_chunks=chunks, pad_chunks=True)

    def _cached(self, pattern: str, text: str, dropped: list[str], options: EncodeOptions | None = None) -> Conditioning:
        """One caption's conditioning from the memo or the disk cache (``pattern``: the dropped slots, ``*`` all)."""

        def fn(caps: list[str]) -> Conditioning:
            m = len(caps)
            return self._encode(caps, [pattern == "*"] * m, {s: [True] * m for s in dropped if pattern != "*"}, options)

        memo = (pattern, text) if options is None else (f"{pattern}|{options.as_dict()}", text)
        hit = self._memo.get(memo)
        if hit is None:
            hit = self._cache(pattern, options).get_or_encode([text], fn, store=self.writer)[0]
        self._remember(memo, hit)
        return hit

    def precache(self, captions: list[str], batch: int = 16) -> None:
        if not self.use_cache:
            return
        cache = self._cache("")
        if self.options.long_prompt_chunks:
            batch = 1  # a batch shares its longest caption's chunk count; each caption keeps its own
        for i in range(0, len(captions), batch):
            chunk = captions[i : i + batch]
            for text, cond in zip(chunk, cache.get_or_encode(chunk, lambda caps: self._encode(caps, [False] * len(caps), {}), store=self.writer), strict=True):
                self._remember(("", text), cond)

    def _remember(self, key: tuple[str, str], cond: Conditioning) -> None:
        """Keep ``cond`` in the in-memory memo, evicting the least recently used beyond ``MEMO_BYTES``
        (a large dataset's T5 conditioning would not fit in RAM: Flux, 512 x 4096 bf16 = 4 MiB per
        caption; evicted entries are read back from the disk cache)."""
        if key in self._memo:
            self._memo.move_to_end(key)
            return
        self._memo[key] = cond
        self._memo_bytes += _nbytes(cond)
        while self._memo_bytes > MEMO_BYTES and len(self._memo) > 1:
            _, old = self._memo.popitem(last=False)
            self._memo_bytes -= _nbytes(old)

    def slot_dropout(self, n: int, gen: torch.Generator, own: torch.Generator | None = None) -> dict[str, list[bool]]:
        """Per-encoder dropout flags of ``n`` captions for the slots this run drops: the profile's published slots from
        ``gen`` (always drawn, see :attr:`published`), any other slot from ``own`` (its own stream)."""
        shared = {s: self.slot_probs.get(s, 0.0) for s in self.published}
        flags = sample_dropout(self.profile, n, shared, gen) if shared else {}
        rest = {k: v for k, v in self.slot_probs.items() if k not in shared}
        if rest:
            flags.update(sample_dropout(self.profile, n, rest, own if own is not None else gen))
        return {k: flags[k] for k in self.slot_probs}

    def batch(
        self, captions: list[str], gen: torch.Generator, span: tuple[int, int] | None = None,
        dropout_gen: torch.Generator | None = None,
    ) -> Conditioning:
        """Conditioning for ``captions[lo:hi]`` (``span``; default all).

        Caption processing and dropout are drawn for the whole (global) batch, so every process
        consumes ``gen`` exactly as a single process training the whole batch would. ``dropout_gen`` is the stream of
        per-encoder dropout for slots the profile publishes no rate for (:meth:`slot_dropout`).
        """
        import torch

        n = len(captions)
        texts = [process_caption(c, self.cfg, gen) for c in captions]
        drop = [False] * n
        if self.cfg.caption_dropout > 0:
            draws = torch.rand(n, generator=gen).tolist()
            for i, x in enumerate(draws):
                if x < self.cfg.caption_dropout:
                    if self.cfg.dropout_caption:
                        texts[i] = self.cfg.dropout_caption
                    else:
                        drop[i] = True
        slot_flags = self.slot_dropout(n, gen, dropout_gen)
        if _DRAWS is not None:
            self.last_draws = {"texts": list(texts), "drop": list(drop), "slots": {k: list(v) for k, v in slot_flags.items()}}
        if span is not None:
            lo, hi = span
            texts, drop = texts[lo:hi], drop[lo:hi]
            slot_flags = {k: v[lo:hi] for k, v in slot_flags.items()}
            n = len(texts)
        if not self.use_cache:
            cond = self._encode(texts, drop, slot_flags)
        else:
            parts = []
            for i in range(n):
                if drop[i]:
                    pattern, text = "*", ""
                else:
                    pattern = ",".join(s for s, f in slot_flags.items() if f[i])
                    text = texts[i]
                dropped = [s for s in self.slot_probs if pattern == "*" or s in pattern.split(",")]

                parts.append(self._cached(pattern, text, dropped))
            if self.options.long_prompt_chunks and len({_seq_len(c) for c in parts}) > 1:
                # each caption is cached with its own chunk count: pad the shorter ones to the batch's chunk count,
                # as the uncached path (one encode of the whole batch) does
                longest = max(_seq_len(c) for c in parts)
                for i in range(n):
                    if _seq_len(parts[i]) != longest:
                        pattern = "*" if drop[i] else ",".join(s for s, f in slot_flags.items() if f[i])
                        dropped = [s for s in self.slot_probs if pattern == "*" or s in pattern.split(",")]
                        opts = self.padded_options(longest // self.chunk_positions)
                        parts[i] = self._cached(pattern, "" if drop[i] else texts[i], dropped, opts)
            cond = Conditioning.cat(parts)
        return cond.to(self.device, dtype=self.dtype)


# ------------------------------------------------------------------------------------------ helpers
def _seq_len(cond: Conditioning) -> int:
    """The sequence length of a conditioning's (first) embeddings tensor."""
    t = cond.tensors.get("prompt_embeds") if hasattr(cond, "tensors") else None
    if t is None:
        t = next(v for v in cond.tensors.values() if v.dim() >= 3)
    return int(t.shape[-2])


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


def _lr_lambda(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "cosine":
            span = max(1, total - warmup)
            progress = min(1.0, (step - warmup) / span)
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return f


#: The first bitsandbytes whose AdamW8bit steps on the CPU (0.48/0.49 crash in the first step's 32-bit update).
CPU_ADAMW8BIT = (0, 50)


def _make_optimizer(cfg: TrainConfig, groups: list[dict[str, object]], device: torch.device) -> torch.optim.Optimizer:
    import importlib.util

    import torch

    t = cfg.train
    kw = {"betas": (t.adam_beta1, t.adam_beta2), "eps": t.adam_epsilon, "weight_decay": t.weight_decay}
    if t.optimizer == "adamw8bit":
        if importlib.util.find_spec("bitsandbytes") is None:
            logger.warning("train.optimizer = adamw8bit needs bitsandbytes (pip install bitsandbytes); using torch AdamW")
        else:
            import bitsandbytes as bnb

            version = getattr(bnb, "__version__", "0")
            if device.type == "cpu" and _key(version) < CPU_ADAMW8BIT:
                # 0.48 and 0.49 build the optimizer on CPU, then fail inside its first step (tools/deps.py lowest)
                logger.warning("train.optimizer = adamw8bit on the CPU needs bitsandbytes >= %s (installed: %s; "
                               "pip install \"te-align[bnb]\"); using torch AdamW",
                               ".".join(map(str, CPU_ADAMW8BIT)), version)
                return torch.optim.AdamW(groups, **kw)
            try:
                return bnb.optim.AdamW8bit(groups, **kw)
            except Exception as e:  # an old bitsandbytes without this device's kernels
                logger.warning("train.optimizer = adamw8bit: bitsandbytes %s cannot run on %s (%s); using torch AdamW",
                               getattr(bnb, "__version__", "?"), device.type, str(e).splitlines()[0] if str(e) else type(e).__name__)
    return torch.optim.AdamW(groups, **kw)


def _direct_step(
    accelerator: Accelerator, optimizer: torch.optim.Optimizer, trainable: list[torch.nn.Parameter]
) -> tuple[Callable[[], object], Callable[[float], object]]:
    """(optimizer step, gradient clip) without accelerate's per-step wrapper work where it adds nothing.

    ``AcceleratedOptimizer.step`` looks up the optional ``lomo_optim`` package twice per call (a
    filesystem search) and ``Accelerator.clip_grad_norm_`` walks every parameter in Python looking
    for DTensors before calling ``torch.nn.utils.clip_grad_norm_``; at small model sizes that is a
    measurable share of a step. Without a gradient scaler (fp16) and outside XLA/DeepSpeed/FSDP the
    wrapper's step is exactly the inner optimizer's step (te-align does its own accumulation, so
    ``sync_gradients`` is always true here) and the clip is exactly torch's, so both are called
    directly. Otherwise accelerate's own methods run.
    """
    import torch
    from accelerate.utils import DistributedType

    plain = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
    inner = getattr(optimizer, "optimizer", None)
    if inner is None or getattr(optimizer, "scaler", None) is not None or accelerator.distributed_type not in plain:
        return optimizer.step, lambda norm: accelerator.clip_grad_norm_(trainable, norm)
    return inner.step, lambda norm: torch.nn.utils.clip_grad_norm_(trainable, norm)


def _write_json(path: Path, data: object) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str))


# ------------------------------------------------------------------------------------------ the run
@dataclass(eq=False)
class Run:
    """What the phases of one training run share: set up by :func:`_setup`, then advanced by
    :func:`_resume` and :func:`_loop` (``step``, ``pos``, ``last_ckpt``) and read by :func:`_finish`."""

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
                       "profile": self.profile.name, "run": _run_record(self)},
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
        run = _setup(cfg, pipeline)
        if resume:
            _resume(run, resume)
        _loop(run, stop_after)
        return _finish(run)
    except (WriteError, CacheError) as e:
        last = latest_checkpoint(cfg.output.dir)
        hint = (f"the run can continue from its last checkpoint {last} with --resume" if last is not None
                else "no checkpoint was written yet")
        raise TrainError(f"{e.message}; {hint}", file=e.file) from None


# ---------------------------------------------------------------------------------------- setup
def _setup(cfg: TrainConfig, pipeline: DiffusionPipeline | None) -> Run:
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
    optimizer = _make_optimizer(cfg, groups, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(t.lr_scheduler, t.warmup_steps, total))
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


# --------------------------------------------------------------------------------------- resume
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


def _run_record(run: Run) -> JSONObject:
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
    now = _run_record(run)
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


def _resume(run: Run, resume: bool | str | Path) -> None:
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


# ----------------------------------------------------------------------------------------- loop
def _loop(run: Run, stop_after: int | None) -> None:
    """Optimizer steps until ``run.total`` (or ``stop_after`` more), with logs, checkpoints, samples."""
    from tqdm.auto import tqdm

    cfg, t = run.cfg, run.cfg.train
    if run.main:
        _write_run_record(run)
    run.log = RunLog(run.out_dir, resume_step=run.step, tensorboard=cfg.logging.tensorboard, enabled=run.main)
    bar = tqdm(total=run.total, initial=run.step, disable=not (run.main and cfg.logging.progress), desc="train",
               unit="step", dynamic_ncols=True)
    stream = run.order.stream(run.pos)
    optimizer_step, clip_gradients = _direct_step(run.accelerator, run.optimizer, run.trainable)
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


def _write_run_record(run: Run) -> None:
    """``train_config.json``: the config, profile and dataset summary of this run."""
    cfg, report = run.cfg, run.report
    with writing(run.out_dir):
        run.out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(run.out_dir / "train_config.json", {
        "config": cfg.to_dict(), "profile": run.profile.name, "fingerprint": run.profile.fingerprint(),
        "profile_overrides": cfg.model.profile_overrides, "objective": run.objective, "family": run.family.name,
        "images": len(report.items), "buckets": sorted({it.bucket for it in report.items}), "te_align": te_align.__version__,
        "missing_captions": [str(p) for p in report.missing_captions],
        "unreadable": [str(p) for p, _ in report.unreadable],
        "weight_dtype": weight_dtype_name(cfg.model, cfg.train.mixed_precision), "quantize": cfg.model.quantize,
        "quantize_backend": QUANTIZE_BACKENDS[cfg.model.quantize],
        "residency": dataclasses.asdict(run.residency) if run.residency is not None else None,
        "denoiser_mask": run.denoiser_mask if run.family.mask_arg is not None else None,
    })


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
    if _DRAWS is not None:
        _DRAWS.append({
            "step": run.step, "batch": list(batch), "flips": list(flips), "noise": noise.detach().cpu().clone(),
            "timesteps": timesteps.detach().cpu().clone(), **run.text.last_draws,
            "lora": _params_digest(run) if run.step == 0 else "",
        })
    with run.accelerator.autocast():
        pred = denoise(family, run.model, noisy.to(run.compute_dtype), timesteps, cond, time_ids=time_ids,
                       guidance=cfg.train.guidance, config=run.denoiser.config, denoiser_mask=run.denoiser_mask)
    return torch.nn.functional.mse_loss(pred.float(), target.float())


#: Every random draw of the training steps, while :func:`recording_draws` is active (None otherwise).
_DRAWS: list[dict[str, Any]] | None = None


@contextlib.contextmanager
def recording_draws() -> Iterator[list[dict[str, Any]]]:
    """Record every micro-step's random draws of the runs trained inside (in this process): the global batch's item
    indices (data order), flips, noise, timesteps, processed captions, caption-dropout and per-encoder dropout flags,
    and at the first step a digest of the trainable parameters as initialised (the LoRA's initial weights). For
    checking that two arms of an A/B share every draw but the one their setting changes."""
    global _DRAWS
    previous, _DRAWS = _DRAWS, []
    try:
        yield _DRAWS
    finally:
        _DRAWS = previous


def _params_digest(run: Run) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, param in sorted(run.named_trainable.items()):
        h.update(name.encode())
        h.update(param.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


__all__ = ["Run", "TrainResult", "recording_draws", "train"]
