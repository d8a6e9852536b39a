"""The training config: a TOML file with sections ``[model] [data] [lora] [train] [output] [sample] [logging]``.

Every key is a typed field below with its default and meaning. :func:`load_config` reads a file,
:func:`config_from_dict` validates a mapping; both reject unknown keys naming the closest valid one,
wrong types naming the key and the expected type, and out-of-range values. This module imports no
torch, so ``te-align train --check`` and ``--help`` stay fast.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from te_align import _schema as schema
from te_align import _toml as tomllib
from te_align._dtypes import DTYPE_NAMES
from te_align._paths import read_bytes
from te_align._types import JSONObject
from te_align.errors import TeAlignError, closest
from te_align.profiles.resolve import is_hub_id

# Function-local te_align imports in this module: would close an import loop at module level.


class TrainError(TeAlignError):
    """A training config, dataset or model the trainer cannot use, or a run that had to stop."""


Objective = Literal["auto", "eps", "v", "flow"]
Precision = Literal["no", "fp16", "bf16"]
Schedule = Literal["constant", "cosine"]
Optimizer = Literal["adamw", "adamw8bit"]
DropoutPolicy = Literal["profile", "empty", "zeros"]
LongPromptPadding = Literal["max_length", "longest"]
LatentSample = Literal["sample", "mean"]
Quantize = Literal["none", "int8", "nf4", "fp8"]


@dataclass
class ModelConfig:
    #: Diffusers folder, hub repo id or single-file ``.safetensors`` checkpoint.
    path: str = ""
    #: ``auto`` (read from the model), a bundled profile name, or a profile ``.toml``/``.json`` file.
    profile: str = "auto"
    #: Validated profile overrides (``t5_max_length = 512``); recorded in the LoRA metadata.
    profile_overrides: dict[str, Any] = field(default_factory=dict)
    #: For single-file checkpoints: the diffusers folder or hub id that holds the pipeline configs.
    config: str = ""
    revision: str = ""
    variant: str = ""
    #: dtype of the frozen weights: float32, bfloat16 or float16; ``auto`` = the mixed-precision dtype
    #: (bfloat16 / float16 with ``train.mixed_precision = "bf16"`` / ``"fp16"``, as diffusers' training
    #: scripts do), else float32. LoRA parameters are always float32.
    dtype: str = "auto"
    #: Frozen denoiser and large text encoder (T5 / LLM) weights: ``none``; ``int8`` / ``nf4``
    #: (bitsandbytes through diffusers'/transformers' BitsAndBytesConfig, CUDA); ``fp8`` (float8_e4m3fn
    #: storage, each layer computed in the weight dtype: diffusers' layerwise casting, any device).
    quantize: Quantize = "none"
    #: Free the text encoders and the VAE once every caption and latent is cached (they stay when
    #: captions are encoded live: shuffled tags, dropout without a text cache, trained text encoders).
    free_encoders: bool = True


@dataclass
class DataConfig:
    #: Folder of images with same-name ``.txt`` captions; ``N_name`` sub-folders repeat N times (kohya).
    path: str = ""
    caption_extension: str = ".txt"
    #: Extra repeats for every image (multiplied with the folder's ``N_``).
    repeats: int = 1
    #: Target training area is ``resolution x resolution`` pixels.
    resolution: int = 1024
    enable_bucketing: bool = True
    #: Bucket sides are multiples of this many pixels.
    bucket_step: int = 64
    min_bucket: int = 256
    max_bucket: int = 2048
    random_flip: bool = False
    #: Cache VAE latents (mean and std of the latent distribution) on disk.
    cache_latents: bool = True
    #: Draw a latent from the cached distribution each step (``sample``) or use its mean.
    latent_sample: LatentSample = "sample"
    #: Cache text embeddings in a te-align EmbeddingCache (not used when tags are shuffled or
    #: text encoders are trained: those captions change every step; nor with long_prompt_padding "longest").
    cache_text: bool = True
    #: Cache folder; default ``<output.dir>/cache``.
    cache_dir: str = ""
    shuffle_tags: bool = False
    tag_separator: str = ","
    #: Leading tags that are never shuffled (kohya ``keep_tokens``).
    keep_tokens: int = 0
    #: Probability that a whole caption is dropped.
    caption_dropout: float = 0.0
    #: What a dropped caption becomes: "" = the profile's empty prompt, else this text (a quality string).
    dropout_caption: str = ""
    #: Per-encoder dropout probabilities by slot name (``{t5 = 0.464}``), or ``{all = "profile"}``
    #: for the profile's published ``train_dropout`` values.
    encoder_dropout: dict[str, Any] = field(default_factory=dict)
    #: What a dropped encoder output becomes (te_align EncodeOptions.dropout_policy).
    dropout_policy: DropoutPolicy = "profile"
    #: NovelAI long-prompt chunks for CLIP slots (0 = off); batches are bucketed by chunk count.
    long_prompt_chunks: int = 0
    #: How far the last long-prompt chunk is padded (te_align EncodeOptions.chunk_padding): "max_length" (77,
    #: NovelAI) or "longest" (the batch's longest caption, diffusion-pipe's SDXL; text embeddings are then not
    #: cached, a caption's conditioning depends on its batch). "longest" needs long_prompt_chunks >= 1.
    long_prompt_padding: LongPromptPadding = "max_length"


@dataclass
class LoraConfig:
    #: Rank of the denoiser LoRA; 0 = no LoRA, a full fine-tune of the ``train.full_modules`` weights.
    rank: int = 16
    alpha: float = 16.0
    dropout: float = 0.0
    #: Module names to adapt; empty = the family default (diffusers' LoRA example scripts).
    target_modules: list[str] = field(default_factory=list)
    #: Text-encoder slots to train LoRA on too (CLIP slots: ``["clip_l"]``); empty = none.
    text_encoders: list[str] = field(default_factory=list)
    text_encoder_rank: int = 0
    text_encoder_target_modules: list[str] = field(default_factory=list)


@dataclass
class TrainSection:
    seed: int = 42
    batch_size: int = 1
    gradient_accumulation: int = 1
    #: Optimizer steps to run (takes precedence over ``epochs`` when > 0).
    max_steps: int = 1000
    epochs: int = 0
    learning_rate: float = 1e-4
    #: Learning rate of text-encoder LoRA (0 = learning_rate).
    text_encoder_lr: float = 0.0
    #: Learning rate of a swapped model's text projection (``te-align swap``; 0 = learning_rate).
    projection_lr: float = 0.0
    #: Denoiser weights trained in full besides the LoRA (or alone: ``lora.rank = 0``): regular expressions searched
    #: in parameter names (``["attn2"]``: the cross-attention a ``te-align swap --reset cross`` re-initialised; ``[""]``: all).
    full_modules: list[str] = field(default_factory=list)
    #: Learning rate of the ``full_modules`` weights (0 = learning_rate).
    full_lr: float = 0.0
    lr_scheduler: Schedule = "constant"
    warmup_steps: int = 0
    optimizer: Optimizer = "adamw"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    weight_decay: float = 1e-4
    max_grad_norm: float = 1.0
    mixed_precision: Precision = "no"
    gradient_checkpointing: bool = False
    #: ``auto``: the scheduler's prediction type for SD1.5/SDXL, rectified flow for SD3/Flux;
    #: ``flow`` on SDXL trains it as a flow-matching model.
    objective: Objective = "auto"
    #: Flow timesteps t = sigmoid(N(log(flow_shift), 1)); 0 = the family default (SD3/Flux 1.0, SDXL 3.0).
    flow_shift: float = 0.0
    #: Flux dev guidance-embedding value during training.
    guidance: float = 1.0
    noise_offset: float = 0.0
    #: Save a resumable checkpoint every N optimizer steps (0 = only at the end).
    checkpoint_every: int = 500
    #: Keep the newest N checkpoints (0 = all).
    checkpoints_keep: int = 3
    #: ``auto`` (accelerate's choice), ``cpu``, ``cuda``, ``cuda:1``…
    device: str = "auto"
    #: CPU runs: torch's intra-op threads. 0 = te-align picks (1 for models under 50 M denoiser parameters, else
    #: the cores other processes leave free); ``TE_ALIGN_THREADS`` / ``OMP_NUM_THREADS`` also choose.
    threads: int = 0


@dataclass
class OutputConfig:
    dir: str = "output"
    name: str = "lora"
    #: Also write ``<name>_kohya.safetensors`` in the kohya / ComfyUI key format.
    kohya: bool = True


@dataclass
class SampleConfig:
    #: Sample images every N optimizer steps (0 = never; a last set is made at the end when prompts are set).
    every: int = 0
    prompts: list[str] = field(default_factory=list)
    negative_prompt: str = ""
    seeds: list[int] = field(default_factory=lambda: [0])
    steps: int = 20
    guidance_scale: float = 5.0
    width: int = 0
    height: int = 0


@dataclass
class LoggingConfig:
    #: Log a CSV row every N optimizer steps.
    every: int = 1
    progress: bool = True
    #: Write TensorBoard event files when the ``tensorboard`` package is installed.
    tensorboard: bool = True
    loss_plot: bool = True


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainSection = field(default_factory=TrainSection)
    output: OutputConfig = field(default_factory=OutputConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: Where the config was read from (relative paths are resolved against its folder).
    source: str = ""

    def to_dict(self) -> JSONObject:
        d = dataclasses.asdict(self)
        d.pop("source", None)
        return d


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "lora": LoraConfig,
    "train": TrainSection,
    "output": OutputConfig,
    "sample": SampleConfig,
    "logging": LoggingConfig,
}


# ------------------------------------------------------------------------------------- validation
#: Largest accepted seed (numpy's seed range; accelerate seeds numpy with ``seed + process index``).
MAX_SEED = 2**32 - 1
#: Largest accepted ``data.resolution`` / bucket side in pixels (beyond any released model's training size x 4).
MAX_SIDE = 16384
#: ``train.device`` values: ``auto``, ``cpu``, ``mps`` or an accelerator with an optional index (``cuda:1``).
DEVICE = re.compile(r"auto|cpu|mps|(?:cuda|xpu|npu|hpu)(?::\d{1,3})?")
#: Characters a file name may not hold (``output.name``), besides the path separators.
_BAD_NAME_CHARS = set('\x00/\\') | {chr(c) for c in range(32)}
#: Suffixes of the images a dataset folder holds (lower case): the dataset scan (:mod:`te_align.train.data`) and
#: the ``data.caption_extension`` check read them.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def _finite_floats(cfg: TrainConfig) -> list[tuple[str, float]]:
    """(dotted key, value) of every float field, to refuse NaN and infinity in one place."""
    out = []
    for section, cls in SECTIONS.items():
        obj = getattr(cfg, section)
        for f in dataclasses.fields(cls):
            v = getattr(obj, f.name)
            if isinstance(v, float):
                out.append((f"{section}.{f.name}", v))
    return out


def _check(cfg: TrainConfig, file: str | None) -> None:
    def need(ok: bool, key: str, message: str) -> None:
        if not ok:
            raise TrainError(message, file=file, key=key)

    for key, v in _finite_floats(cfg):
        need(math.isfinite(v), key, f"must be a finite number, got {v}")
    need(bool(cfg.model.path), "model.path", "missing: a diffusers folder, hub repo id or .safetensors checkpoint")
    need(bool(cfg.model.profile), "model.profile", "must be 'auto', a bundled profile name or a profile file")
    need(bool(cfg.data.path), "data.path", "missing: a folder of images with .txt captions")
    need(cfg.model.dtype == "auto" or cfg.model.dtype in DTYPE_NAMES, "model.dtype",
         f"expected auto, float32, bfloat16 or float16, got {cfg.model.dtype!r}")
    d, t, lo, s = cfg.data, cfg.train, cfg.lora, cfg.sample
    need(8 <= d.resolution <= MAX_SIDE, "data.resolution", f"must be in [8, {MAX_SIDE}], got {d.resolution}")
    need(d.bucket_step >= 8 and d.bucket_step % 8 == 0, "data.bucket_step", f"must be a multiple of 8, got {d.bucket_step}")
    need(d.bucket_step <= d.resolution, "data.bucket_step", f"must be <= data.resolution ({d.resolution}), got {d.bucket_step}")
    need(0 < d.min_bucket <= d.max_bucket, "data.min_bucket", "must be > 0 and <= data.max_bucket")
    need(d.max_bucket <= MAX_SIDE, "data.max_bucket", f"must be <= {MAX_SIDE}, got {d.max_bucket}")
    need(d.repeats >= 1, "data.repeats", f"must be >= 1, got {d.repeats}")
    need(d.keep_tokens >= 0, "data.keep_tokens", f"must be >= 0, got {d.keep_tokens}")
    need(0.0 <= d.caption_dropout <= 1.0, "data.caption_dropout", f"must be in [0, 1], got {d.caption_dropout}")
    need(d.long_prompt_chunks >= 0, "data.long_prompt_chunks", f"must be >= 0, got {d.long_prompt_chunks}")
    need(
        d.long_prompt_padding == "max_length" or d.long_prompt_chunks >= 1,
        "data.long_prompt_padding",
        f'"longest" pads long-prompt chunks, so it needs data.long_prompt_chunks >= 1, got {d.long_prompt_chunks}',
    )
    ext = d.caption_extension
    need(ext.startswith("."), "data.caption_extension", f"must start with '.', got {ext!r}")
    need(len(ext) > 1 and not (set(ext) & _BAD_NAME_CHARS) and ext.strip(".") and not ext.endswith("."),
         "data.caption_extension", f"must be a file extension such as '.txt', got {ext!r}")
    need(ext.lower() not in IMAGE_EXTENSIONS, "data.caption_extension", f"{ext!r} is an image extension")
    need(d.tag_separator != "", "data.tag_separator", "must not be empty (tags are split on it)")
    for k, v in d.encoder_dropout.items():
        if k == "all":
            need(v == "profile", "data.encoder_dropout.all", f"only \"profile\" is accepted here, got {v!r}")
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0
            need(ok, f"data.encoder_dropout.{k}", f"must be a probability in [0, 1], got {v!r}")
    need(lo.rank >= 0, "lora.rank", f"must be >= 1 (or 0 with train.full_modules: no denoiser LoRA), got {lo.rank}")
    if lo.rank == 0:  # a full fine-tune: the train.full_modules weights (and a swapped model's projection) only
        need(
            bool(t.full_modules),
            "lora.rank",
            "0 trains no denoiser LoRA, so train.full_modules must name the weights to train in full "
            '(e.g. [""] for the whole denoiser); or set lora.rank >= 1',
        )
        need(not lo.target_modules, "lora.target_modules", "set, but lora.rank = 0 adds no denoiser LoRA: remove it")
        need(
            not lo.text_encoders or lo.text_encoder_rank >= 1,
            "lora.text_encoder_rank",
            "must be >= 1 when lora.rank = 0 and lora.text_encoders is set (it defaults to lora.rank)",
        )
    need(lo.rank <= 4096, "lora.rank", f"must be <= 4096, got {lo.rank}")
    need(lo.alpha > 0, "lora.alpha", f"must be > 0, got {lo.alpha}")
    need(0.0 <= lo.dropout < 1.0, "lora.dropout", f"must be in [0, 1), got {lo.dropout}")
    need(0 <= lo.text_encoder_rank <= 4096, "lora.text_encoder_rank", "must be in [0, 4096]")
    need(all(m.strip() for m in lo.target_modules), "lora.target_modules", "module names must not be empty")
    need(0 <= t.seed <= MAX_SEED, "train.seed", f"must be in [0, {MAX_SEED}], got {t.seed}")
    need(t.batch_size >= 1, "train.batch_size", f"must be >= 1, got {t.batch_size}")
    need(t.gradient_accumulation >= 1, "train.gradient_accumulation", "must be >= 1")
    need(t.max_steps > 0 or t.epochs > 0, "train.max_steps", "set train.max_steps or train.epochs to a positive number")
    need(t.max_steps >= 0 and t.epochs >= 0, "train.max_steps", "must be >= 0")
    need(t.learning_rate > 0, "train.learning_rate", f"must be > 0, got {t.learning_rate}")
    need(t.text_encoder_lr >= 0, "train.text_encoder_lr", "must be >= 0")
    need(t.projection_lr >= 0, "train.projection_lr", "must be >= 0")
    need(t.full_lr >= 0, "train.full_lr", "must be >= 0")
    for i, pattern in enumerate(t.full_modules):
        try:
            re.compile(pattern)
        except re.error as e:
            need(False, f"train.full_modules[{i}]", f"not a regular expression ({e}): {pattern!r}")
    need(t.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
    need(0.0 <= t.adam_beta1 < 1.0, "train.adam_beta1", f"must be in [0, 1), got {t.adam_beta1}")
    need(0.0 <= t.adam_beta2 < 1.0, "train.adam_beta2", f"must be in [0, 1), got {t.adam_beta2}")
    need(t.adam_epsilon > 0, "train.adam_epsilon", f"must be > 0, got {t.adam_epsilon}")
    need(t.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {t.weight_decay}")
    need(t.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0 (0 = no clipping)")
    need(t.flow_shift >= 0, "train.flow_shift", "must be >= 0 (0 = family default)")
    need(t.noise_offset >= 0, "train.noise_offset", f"must be >= 0, got {t.noise_offset}")
    need(t.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0")
    need(t.checkpoints_keep >= 0, "train.checkpoints_keep", "must be >= 0")
    need(t.threads >= 0, "train.threads", f"expected 0 (te-align picks) or a number of threads, got {t.threads}")
    need(DEVICE.fullmatch(t.device) is not None, "train.device",
         f"expected auto, cpu, mps, cuda or cuda:N, got {t.device!r}")
    need(not (t.mixed_precision == "fp16" and t.device == "cpu"), "train.mixed_precision",
         "fp16 mixed precision needs a GPU; use \"bf16\" or \"no\" on the CPU")
    name = cfg.output.name
    need(bool(name) and name not in (".", "..") and not (set(name) & _BAD_NAME_CHARS) and name == name.strip(),
         "output.name", f"must be a plain file name (no folders), got {name!r}")
    need(bool(cfg.output.dir), "output.dir", "must not be empty")
    need(s.every >= 0, "sample.every", "must be >= 0")
    need(s.steps >= 1, "sample.steps", "must be >= 1")
    need(bool(s.seeds), "sample.seeds", "needs at least one seed")
    for i, seed in enumerate(s.seeds):
        need(0 <= seed < 2**63, f"sample.seeds[{i}]", f"must be in [0, 2**63), got {seed}")
    for side in ("width", "height"):
        v = getattr(s, side)
        need(v == 0 or (8 <= v <= MAX_SIDE and v % 8 == 0), f"sample.{side}",
             f"must be 0 (the training resolution) or a multiple of 8 in [8, {MAX_SIDE}], got {v}")
    need(cfg.logging.every >= 1, "logging.every", "must be >= 1")


def config_from_dict(data: JSONObject, *, file: str | None = None, base_dir: str | Path | None = None) -> TrainConfig:
    """Validate a config mapping; relative paths are resolved against ``base_dir``."""
    if not isinstance(data, dict):
        raise TrainError("a training config must be a table", file=file)
    sections: dict[str, object] = {}
    for name, value in data.items():
        if name not in SECTIONS:
            hint = closest(name, SECTIONS)
            if not hint:
                owners = [s for s, cls in SECTIONS.items() if name in {f.name for f in dataclasses.fields(cls)}]
                hint = f" (it belongs under [{owners[0]}])" if owners else ""
            raise TrainError(f"unknown section{hint}; sections: {', '.join(SECTIONS)}", file=file, key=name)
        sections[name] = schema.build(SECTIONS[name], value, key=name, file=file, error=TrainError)
    cfg = TrainConfig(**sections, source=file or "")
    if base_dir is not None:
        base = Path(base_dir)

        def rel(p: str) -> str:
            if not p:
                return p
            q = Path(p).expanduser()
            if q.is_absolute():
                return str(q)
            local = base / q
            # A hub id (owner/name) that is not a local path stays as written.
            return str(local) if local.exists() or not is_hub_id(p) else p

        cfg.model.path = rel(cfg.model.path)
        if cfg.model.config:
            cfg.model.config = rel(cfg.model.config)
        if cfg.model.profile.endswith((".toml", ".json")):
            cfg.model.profile = rel(cfg.model.profile)
        cfg.data.path = str((base / Path(cfg.data.path).expanduser()) if cfg.data.path else "")
        cfg.output.dir = str(base / Path(cfg.output.dir).expanduser())
        if cfg.data.cache_dir:
            cfg.data.cache_dir = str(base / Path(cfg.data.cache_dir).expanduser())
    _check(cfg, file)
    return cfg




def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a TOML training config (paths relative to its folder)."""
    p = Path(path).expanduser()
    raw = read_bytes(p, TrainError, what="config file")
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except tomllib.TOMLDecodeError as e:
        raise TrainError(f"not valid TOML: {e}", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise TrainError(f"not UTF-8 text (byte {e.start})", file=str(path)) from None
    except RecursionError:
        raise TrainError("not a usable config: tables or arrays are nested too deeply", file=str(path)) from None
    return config_from_dict(data, file=str(path), base_dir=p.resolve().parent)


def as_config(config: TrainConfig | JSONObject | str | Path) -> TrainConfig:
    """A :class:`TrainConfig` from a config object, a mapping or a TOML path."""
    if isinstance(config, TrainConfig):
        _check(config, config.source or None)
        return config
    if isinstance(config, dict):
        return config_from_dict(config)
    return load_config(config)


__all__ = [
    "SECTIONS",
    "DataConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OutputConfig",
    "SampleConfig",
    "TrainConfig",
    "TrainError",
    "TrainSection",
    "as_config",
    "config_from_dict",
    "load_config",
]
