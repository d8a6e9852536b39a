"""``te-align train CONFIG --estimate``: the memory a run needs, per device, before anything big loads.

Every component is built from its config on the ``meta`` device (no weights are read or allocated), so
parameter counts are exact; bytes follow from the weight dtype and ``model.quantize`` layer by layer.
Activations come from a forward pass of the denoiser, with LoRA, at the run's batch and bucket size on
the meta device with ``torch.autograd.graph.saved_tensors_hooks`` summing what autograd keeps for the
backward pass (attention counted as a fused kernel keeps it: q, k, v, output and log-sum-exp), with and
without gradient checkpointing. The run has three phases and the peak is the largest:

- loading: every component's weights in the run's dtype, plus, for the component being loaded, the pages of
  its safetensors file when the file is stored in another dtype (measured on CPU: a bfloat16 T5 loaded in
  float32 holds its memory-mapped file pages and the float32 copy at once; a file already in the run's dtype
  is used memory-mapped, with no second copy). The load order is not fixed, so the largest such file is
  counted on top of every component (the worst order);
- caching: denoiser + text encoders + VAE resident, the VAE encoding one image;
- training: denoiser + LoRA parameters, gradients and optimizer state + activations (+ the text encoders and
  VAE when they are kept), the latent and text caches in host memory.

On CPU everything is one device (system RAM) and the process's own runtime (torch and the libraries,
measured as this process's resident set) is added; on CUDA the device holds the models and host RAM the
caches (and the weights while they load). A run that does not fit is refused with the settings that would
make it fit.

On CPU the estimate counts live bytes; the resident set follows them because the trainer fixes glibc's mmap
threshold (:func:`steady_cpu_heap`). With glibc's default, dynamic threshold (raised to the size of each
large block freed, up to 32 MiB: the model load frees many) the activations of a step come from the heap,
and freed ones stay resident, so the peak depends on the allocation history rather than on what is alive:
``benchmarks/speed/bench_train_scale.py`` with and without ``--glibc-heap`` shows both (numbers in its docstring).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._dtypes import dtype_name, torch_dtype
from te_align._types import JSONObject
from te_align.encoding.loading import _transformers_class
from te_align.train.config import TrainConfig, TrainError
from te_align.train.data import IMAGE_EXTENSIONS
from te_align.train.models import (
    CLIP_TARGETS,
    Family,
    big_text_encoders,
    denoise,
    family_of,
    resolve_profile,
    weight_dtype_name,
)
from te_align.train.real_configs import REAL_CONFIGS, TEXT_ENCODER_CLASSES, official_components

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedTokenizerBase

    from te_align.profiles.model import AlignmentProfile

GiB = 2**30
#: Blocks of at least this many bytes get their own mapping, returned to the OS when freed (steady_cpu_heap).
CPU_MMAP_THRESHOLD = 2**20
#: CUDA context and cuBLAS/cuDNN workspaces, not in torch's allocator counts.
CUDA_CONTEXT = int(0.6 * GiB)


@dataclass
class Line:
    what: str
    bytes: int
    #: ``device`` (GPU memory on CUDA) or ``host`` (system RAM).
    where: str = "device"


@dataclass
class Estimate:
    device: str
    available: int
    lines_caching: list[Line]
    lines_training: list[Line]
    params: dict[str, int]
    activations: dict[str, int]
    #: options that change the peak: name -> (device peak, host peak)
    options: dict[str, tuple[int, int]] = field(default_factory=dict)
    lines_loading: list[Line] = field(default_factory=list)

    def phases(self) -> dict[str, list[Line]]:
        return {"loading": self.lines_loading, "caching": self.lines_caching, "training": self.lines_training}

    def peak(self, where: str = "device") -> int:
        return max(sum(x.bytes for x in lines if x.where == where) for lines in self.phases().values())

    @property
    def fits(self) -> bool:
        return self.peak("device") <= self.available


def steady_cpu_heap() -> bool:
    """Make the resident set of a CPU run follow its live tensors: glibc's mmap threshold fixed at
    :data:`CPU_MMAP_THRESHOLD` (``mallopt(M_MMAP_THRESHOLD)``), so every tensor of 1 MiB or more has its own
    mapping and goes back to the OS when freed. glibc's default threshold is dynamic: freeing a mapped block
    raises it to that block's size (up to 32 MiB), after which such blocks come from the heap, where freed
    ones stay resident (see the module docstring for what that cost). The price is a page fault per fresh
    page of each large tensor, i.e. more system time per step (benchmarks/speed/bench_train_scale.py's speed column
    with and without ``--glibc-heap`` compares both); tensors below 1 MiB are not affected. Left alone when the user set
    ``MALLOC_MMAP_THRESHOLD_``; a no-op off glibc. True when the threshold was set."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # glibc malloc.h
    return bool(mallopt(m_mmap_threshold, CPU_MMAP_THRESHOLD))


# --------------------------------------------------------------------------------------------- models
def _clean(config: JSONObject) -> JSONObject:
    drop = {
        "architectures",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "_name_or_path",
        "_class_name",
        "_diffusers_version",
        "model_type",
    }
    return {k: v for k, v in config.items() if k not in drop and not k.startswith("_")}


def component_specs(cfg: TrainConfig, profile: AlignmentProfile) -> dict[str, tuple[str, JSONObject]]:
    """attribute -> (class name, config) of the denoiser, the text encoders and the VAE, read from the model
    folder's ``*/config.json`` or, for a hub id of a bundled preset's model, from :mod:`te_align.train.real_configs`."""
    import json

    fam = family_of(profile)
    wanted = [fam.denoiser_attr, "vae", *dict.fromkeys(s.encoder_subfolder for s in profile.slots)]
    folder = Path(cfg.model.config or cfg.model.path).expanduser()
    specs: dict[str, tuple[str, JSONObject]] = {}
    if folder.is_dir() and (folder / "model_index.json").is_file():
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
        for attr in wanted:
            entry = index.get(attr)
            path = folder / attr / "config.json"
            if not entry or not path.is_file():
                raise TrainError(f"no {attr}/config.json to estimate from", file=str(folder), key="model.path")
            specs[attr] = (entry[1], json.loads(path.read_text(encoding="utf-8")))
        return specs
    repo = cfg.model.config or cfg.model.path
    if repo not in REAL_CONFIGS:
        raise TrainError("--estimate needs the component configs: a diffusers folder (model.path or model.config) or "
                         f"one of the bundled hub ids ({', '.join(REAL_CONFIGS)})", file=repo, key="model.path")
    specs.update(REAL_CONFIGS[repo])
    for attr, conf in official_components(repo).items():
        if attr in wanted:
            arch = conf.get("architectures") or [TEXT_ENCODER_CLASSES.get(conf.get("model_type", ""), "")]
            specs[attr] = (arch[0], conf)
    missing = [a for a in wanted if a not in specs]
    if missing:
        raise TrainError(f"no bundled config for {', '.join(missing)}", file=repo, key="model.path")
    return specs


def build_meta(cls_name: str, config: JSONObject) -> torch.nn.Module:
    """The model of ``cls_name`` (a diffusers or transformers class) from ``config`` on the meta device."""
    import warnings

    import torch

    # import first, outside the meta device: a library's first import can run tensor code (torch 2.6's
    # torch._dynamo, imported by diffusers, calls .item() at import and fails on meta tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import diffusers

        if hasattr(diffusers, cls_name) and not cls_name.startswith(("CLIP", "T5")):
            model_cls = getattr(diffusers, cls_name)
            with torch.device("meta"):
                return model_cls.from_config(_clean(config))
        # _transformers_class also knows a swapped model's ProjectedTextEncoder (te-align swap)
        model_cls = _transformers_class(cls_name, cls_name)
        config_obj = model_cls.config_class(**_clean(config))
        with torch.device("meta"):
            return model_cls(config_obj)


# --------------------------------------------------------------------------------------------- weights
def _fp8_layers(module: torch.nn.Module) -> set[str]:
    """Names of the layers :func:`te_align.train.models.apply_fp8` stores in float8."""
    import torch
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    skip = tuple(getattr(module, "_skip_layerwise_casting_patterns", None) or DEFAULT_SKIP_MODULES_PATTERN)
    keep = tuple(rf"(^|\.){name}$" for name in getattr(module, "_keep_in_fp32_modules", None) or ())
    pats = (*skip, *keep, "lora_")
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    return {n for n, m in module.named_modules()
            if isinstance(m, kinds) and not any(re.search(p, n) for p in pats)}


def weight_bytes(module: torch.nn.Module, dtype_bytes: int, quantize: str, *, fp16: bool = False) -> int:
    """Bytes of ``module``'s weights stored in ``dtype_bytes`` per value, with ``quantize`` applied to its layers
    (``fp16``: loaded as float16, where transformers keeps ``_keep_in_fp32_modules`` in float32)."""
    import torch

    keep32 = tuple(getattr(module, "_keep_in_fp32_modules", None) or ())
    total = 0
    quantized: set[str] = set()
    if quantize == "fp8":
        quantized = _fp8_layers(module)
    elif quantize in ("int8", "nf4"):
        quantized = {n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)
                     and not any(re.search(rf"(^|\.){k}$", n) for k in keep32)}
    counted: set[int] = set()  # tied weights (T5's shared / embed_tokens) are one tensor
    for name, m in module.named_modules():
        own = [(n, p) for n, p in m.named_parameters(recurse=False) if id(p) not in counted]
        counted.update(id(p) for _, p in own)
        if not own or "lora_" in name:  # LoRA layers are counted as trainable state, not frozen weights
            continue
        in32 = fp16 and any(re.search(rf"(^|\.){k}($|\.)", name) for k in keep32)
        for pname, p in own:
            n = p.numel()
            if name in quantized and quantize == "fp8":
                total += n
            elif name in quantized and pname == "weight" and quantize == "int8":
                total += n + 4 * p.shape[0]  # int8 values + one float32 scale per output row
            elif name in quantized and pname == "weight" and quantize == "nf4":
                total += n // 2 + n // 64 + 4 * math.ceil(n / 64 / 256)  # 4-bit + double-quantized absmax per 64
            else:
                total += n * (4 if in32 else dtype_bytes)
    return total


_ST_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def stored_bytes(folder: Path) -> dict[str, int]:
    """dtype name -> bytes of the tensors in ``folder``'s ``*.safetensors`` files, read from their headers (no
    tensor is read)."""
    return stored_bytes_of(sorted(folder.glob("*.safetensors")))


def stored_bytes_of(paths: list[Path]) -> dict[str, int]:
    """dtype name -> bytes of the tensors in the safetensors files ``paths`` (their headers only)."""
    import json
    import struct

    out: dict[str, int] = {}
    for path in paths:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            start, end = info["data_offsets"]
            dtype = _ST_NAMES.get(info["dtype"], info["dtype"].lower())
            out[dtype] = out.get(dtype, 0) + end - start
    return out


def _count(module: torch.nn.Module) -> int:
    """Frozen parameters (LoRA excluded)."""
    return sum(p.numel() for n, p in module.named_parameters() if "lora_" not in n)


# ------------------------------------------------------------------------------------------ activations
def _fused_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Stands in for F.scaled_dot_product_attention while tracing: keeps what a fused (flash /
    memory-efficient) kernel keeps for the backward pass, not the L x S score matrix of the math path."""
    import torch

    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: torch.autograd.function.FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
        ) -> torch.Tensor:
            out = q.new_empty((*q.shape[:-1], v.shape[-1]))
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(  # pragma: no cover - never run on meta
            ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            q, k, v, _, _ = ctx.saved_tensors
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    return Fused.apply(query, key, value)


def _meta_inputs(
    denoiser: torch.nn.Module,
    family: Family,
    batch: int,
    latent_hw: tuple[int, int],
    text_len: int,
    compute_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """(noisy latents, timesteps, conditioning, SDXL time ids) on meta for one denoiser call."""
    import torch

    conf = denoiser.config
    h, w = latent_hw
    c = conf.in_channels // (4 if family.packed else 1)
    taps = 0
    if family.patchified:  # FLUX.2: the model's latent is the VAE's patchified 2x2 (in_channels = 4 x latent channels)
        h, w = h // 2, w // 2
        flux2: Any = conf  # diffusers' FrozenDict: the stacked taps' width
        taps = int(flux2.joint_attention_dim)
    cond: dict[str, torch.Tensor] = {}
    with torch.device("meta"):
        noisy = torch.empty(batch, c, h, w, dtype=compute_dtype)
        t = torch.full((batch,), 0.5 if family.packed or family.patchified else 500.0)
        if family.patchified:  # the stacked Qwen3 taps and their (t, h, w, l) ids; no pooled vector, no mask
            cond = {
                "prompt_embeds": torch.empty(batch, text_len, taps, dtype=compute_dtype),
                "text_ids": torch.zeros(batch, text_len, 4, dtype=torch.int64),
            }
        elif family.name == "chroma":  # no pooled vector; the T5 mask in the embeddings' dtype
            cond = {
                "prompt_embeds": torch.empty(batch, text_len, conf.joint_attention_dim, dtype=compute_dtype),
                "text_ids": torch.zeros(text_len, 3),
                "prompt_attention_mask": torch.ones(batch, text_len, dtype=compute_dtype),
            }
        elif family.name == "flux":
            cond = {
                "prompt_embeds": torch.empty(batch, text_len, conf.joint_attention_dim, dtype=compute_dtype),
                "pooled_prompt_embeds": torch.empty(batch, conf.pooled_projection_dim, dtype=compute_dtype),
                "text_ids": torch.zeros(text_len, 3),
            }
        elif family.name == "sd3":
            cond = {
                "prompt_embeds": torch.empty(batch, text_len, conf.joint_attention_dim, dtype=compute_dtype),
                "pooled_prompt_embeds": torch.empty(batch, conf.pooled_projection_dim, dtype=compute_dtype),
            }
        else:
            cond = {"prompt_embeds": torch.empty(batch, text_len, conf.cross_attention_dim, dtype=compute_dtype)}
            if family.name == "sdxl":
                cond["pooled_prompt_embeds"] = torch.empty(batch, conf.projection_class_embeddings_input_dim - 6 * conf.addition_time_embed_dim, dtype=compute_dtype)
        time_ids = torch.zeros(batch, 6, device="meta") if family.name == "sdxl" else None
    return noisy, t, cond, time_ids


def largest_block(
    denoiser: torch.nn.Module, family: Family, *, batch: int, latent_hw: tuple[int, int], text_len: int,
    compute_dtype: torch.dtype,
) -> int:
    """Bytes autograd keeps for the largest single transformer / UNet block of one denoiser call, traced on meta."""
    noisy, t, cond, time_ids = _meta_inputs(denoiser, family, batch, latent_hw, text_len, compute_dtype)
    return _largest_block(denoiser, family, noisy, t, cond, time_ids, compute_dtype)


def saved_activations(
    denoiser: torch.nn.Module, family: Family, *, batch: int, latent_hw: tuple[int, int], text_len: int,
    compute_dtype: torch.dtype, checkpointing: bool,
) -> int:
    """Bytes autograd keeps for the backward pass of one denoiser call (LoRA attached), traced on meta."""
    import torch
    import torch.nn.functional as functional

    seen: dict[int, int] = {}
    keep: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.nn.Parameter) or (t.requires_grad and t.is_leaf):
            return t
        base = t._base if t._base is not None else t
        if id(base) not in seen:
            seen[id(base)] = base.numel() * base.element_size()
            keep.append(base)
        return t

    noisy, t, cond, time_ids = _meta_inputs(denoiser, family, batch, latent_hw, text_len, compute_dtype)
    if checkpointing:
        denoiser.enable_gradient_checkpointing()
    real_sdpa = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _fused_sdpa
    try:
        autocast = torch.autocast("cpu", dtype=compute_dtype) if compute_dtype != torch.float32 else _null()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            out = denoise(family, denoiser, noisy, t, cond, time_ids=time_ids, guidance=1.0)
        total = sum(seen.values()) + out.numel() * 4
    finally:
        functional.scaled_dot_product_attention = real_sdpa
        if checkpointing:
            denoiser.disable_gradient_checkpointing()
    if checkpointing:  # the backward recomputes one block at a time: the largest block's activations on top
        total += _largest_block(denoiser, family, noisy, t, cond, time_ids, compute_dtype)
    return total


def _largest_block(
    denoiser: torch.nn.Module,
    family: Family,
    noisy: torch.Tensor,
    t: torch.Tensor,
    cond: dict[str, torch.Tensor],
    time_ids: torch.Tensor | None,
    compute_dtype: torch.dtype,
) -> int:
    import torch
    import torch.nn.functional as functional

    blocks = [m for name, m in denoiser.named_children() if isinstance(m, torch.nn.ModuleList)]
    per_block: dict[int, int] = {}
    current: list[int] = [-1]
    seen: set[int] = set()
    keep: list[torch.Tensor] = []
    hooks = []
    for ml in blocks:
        for m in ml:
            hooks.append(m.register_forward_pre_hook(lambda mod, *_: current.__setitem__(0, id(mod))))
            hooks.append(m.register_forward_hook(lambda *_: current.__setitem__(0, -1)))

    def pack(x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.nn.Parameter) or (x.requires_grad and x.is_leaf) or current[0] < 0:
            return x
        base = x._base if x._base is not None else x
        if id(base) not in seen:
            seen.add(id(base))
            keep.append(base)
            per_block[current[0]] = per_block.get(current[0], 0) + base.numel() * base.element_size()
        return x

    real_sdpa = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _fused_sdpa
    try:
        autocast = torch.autocast("cpu", dtype=compute_dtype) if compute_dtype != torch.float32 else _null()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), autocast:
            denoise(family, denoiser, noisy, t, cond, time_ids=time_ids, guidance=1.0)
    finally:
        functional.scaled_dot_product_attention = real_sdpa
        for hk in hooks:
            hk.remove()
    return max(per_block.values(), default=0)


def _null() -> AbstractContextManager[None]:
    import contextlib

    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------- estimate
def _host_runtime() -> int:
    """This process's resident set now (torch and the libraries loaded), Linux; 0 elsewhere."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _tokenizers(cfg: TrainConfig, profile: AlignmentProfile) -> list[PreTrainedTokenizerBase]:
    """The run's tokenizers, loaded from a local model folder with the classes its ``model_index.json`` names, so
    that the runtime read next includes them and the tokenizer libraries (on CPU, loading the tiny Flux
    pipeline's CLIP tokenizer is a visible share of the tiny run's peak); none for a hub id (nothing is
    downloaded) or a folder whose tokenizers do not load."""
    import json
    import warnings

    folder = Path(cfg.model.config or cfg.model.path).expanduser()
    if not (folder / "model_index.json").is_file():
        return []
    import transformers

    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    out = []
    for sub in dict.fromkeys(s.tokenizer_subfolder for s in profile.slots):
        entry = index.get(sub) or [None, ""]
        cls = getattr(transformers, str(entry[1]), None)
        if cls is None or not (folder / sub).is_dir():
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out.append(cls.from_pretrained(str(folder / sub)))
        except (OSError, ValueError, TypeError):
            continue
    return out


def _device_memory(device: str) -> int:
    import torch

    if device == "cuda":
        return int(torch.cuda.mem_get_info()[1])
    import psutil

    return int(psutil.virtual_memory().total)


@dataclass
class _Model:
    profile: AlignmentProfile
    family: Family
    specs: dict[str, tuple[str, JSONObject]]
    meta: dict[str, torch.nn.Module]
    lora_params: int
    te_lora_params: int
    latent_channels: int
    vae_factor: int
    text_len: int
    cond_values: int
    #: attribute -> dtype name -> bytes stored in its safetensors files; absent: not readable here (a hub id)
    files: dict[str, dict[str, int]] = field(default_factory=dict)


def _stored_files(cfg: TrainConfig, attrs: list[str], denoiser: str) -> dict[str, dict[str, int]]:
    """What each component's files hold (:func:`stored_bytes`), for the components in a local folder
    (``model.path``'s, or ``model.config``'s beside a single-file denoiser checkpoint)."""
    path = Path(cfg.model.path).expanduser()
    folder = Path(cfg.model.config).expanduser() if cfg.model.config else path
    out: dict[str, dict[str, int]] = {}
    for attr in attrs:
        if attr == denoiser and path.is_file():
            out[attr] = stored_bytes_of([path])
        elif (folder / attr).is_dir():
            out[attr] = stored_bytes(folder / attr)
    return out


def _load_meta(cfg: TrainConfig) -> _Model:
    import torch

    profile = resolve_profile(cfg.model)
    family = family_of(profile)
    specs = component_specs(cfg, profile)
    meta = {attr: build_meta(cls, conf) for attr, (cls, conf) in specs.items()}
    den = meta[family.denoiser_attr]
    den.requires_grad_(False)
    from peft import LoraConfig

    lo = cfg.lora
    if lo.rank > 0:  # lora.rank = 0: no denoiser LoRA (a full fine-tune of train.full_modules)
        den.add_adapter(LoraConfig(r=lo.rank, lora_alpha=lo.alpha, target_modules=lo.target_modules or family.default_targets))
    lora = [p for n, p in den.named_parameters() if "lora_" in n]
    if cfg.train.full_modules:  # trained in full: float32 weights with gradients and optimizer state, like LoRA's
        import re

        lora += [
            p
            for n, p in den.named_parameters()
            if "lora_" not in n
            and any(re.search(pat, n.replace(".base_layer.", ".")) for pat in cfg.train.full_modules)
        ]
    for p in lora:
        p.requires_grad_(True)
        p.data = p.data.float()
    te_lora = 0
    for name in lo.text_encoders:
        slot = profile.slot(name)
        enc = meta[slot.encoder_subfolder]
        rank = lo.text_encoder_rank or lo.rank
        targets = lo.text_encoder_target_modules or CLIP_TARGETS
        hits = [m for n, m in enc.named_modules() if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in targets]
        te_lora += sum(rank * (m.in_features + m.out_features) for m in hits)
    vae = meta["vae"]
    text_len = _sequence_length(profile, family)
    conf = den.config
    width = getattr(conf, "joint_attention_dim", None) or getattr(conf, "cross_attention_dim", 768)
    pooled = getattr(conf, "pooled_projection_dim", 0) or 0
    return _Model(profile, family, specs, meta, sum(p.numel() for p in lora), te_lora, int(vae.config.latent_channels),
                  2 ** (len(vae.config.block_out_channels) - 1), text_len, text_len * width + pooled,
                  _stored_files(cfg, list(meta), family.denoiser_attr))


def _sequence_length(profile: AlignmentProfile, family: Family) -> int:
    """Tokens of the conditioning sequence the denoiser sees (SD3: CLIP 77 + T5; Flux, Chroma: T5; FLUX.2: its one
    LLM slot's window; UNets: 77 x chunks)."""
    lengths = {s.name: int(getattr(s.tokenizer, "max_length", 77) or 77) for s in profile.slots}
    if family.patchified:
        return max(lengths.values(), default=512)
    if family.name == "sd3":
        return 77 + max((v for k, v in lengths.items() if k == "t5"), default=0)
    if family.packed:
        return lengths.get("t5", 512)
    return 77


def estimate(cfg: TrainConfig, *, device: str | None = None, available: int | None = None,
             options: bool = True) -> Estimate:
    """The memory estimate of ``cfg``; ``device``: ``cuda`` or ``cpu`` (default: the run's)."""
    import torch

    t = cfg.train
    if device is None:
        device = "cuda" if (t.device.startswith("cuda") or (t.device == "auto" and torch.cuda.is_available())) else "cpu"
    model = _load_meta(cfg)
    traces: dict[tuple[object, ...], int] = {}
    held = _tokenizers(cfg, model.profile)  # a run holds them (and their libraries) from the load on
    runtime = _host_runtime()  # read once: every option is compared on the same footing
    del held

    def build(c: TrainConfig) -> Estimate:
        return _estimate(c, model, device, available if available is not None else _device_memory(device), traces, runtime)

    est = build(cfg)
    if options:
        for name, change in _alternatives(cfg, device).items():
            alt = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model), train=dataclasses.replace(cfg.train),
                                      data=dataclasses.replace(cfg.data))
            change(alt)
            e = build(alt)
            est.options[name] = (e.peak("device"), e.peak("host"))
    return est


def _alternatives(cfg: TrainConfig, device: str) -> dict[str, Callable[[TrainConfig], None]]:
    out: dict[str, Callable[[TrainConfig], None]] = {}
    t, m = cfg.train, cfg.model
    quants = ["fp8"] + (["int8", "nf4"] if device == "cuda" else [])

    def setter(**kw: object) -> Callable[[TrainConfig], None]:
        def change(c: TrainConfig) -> None:
            for key, value in kw.items():
                section, attr = key.split("__")
                setattr(getattr(c, section), attr, value)

        return change

    if not t.gradient_checkpointing:
        out["train.gradient_checkpointing = true"] = setter(train__gradient_checkpointing=True)
    for q in quants:
        if m.quantize != q:
            out[f'model.quantize = "{q}"'] = setter(model__quantize=q)
            if not t.gradient_checkpointing:
                out[f'model.quantize = "{q}" + gradient_checkpointing'] = setter(model__quantize=q, train__gradient_checkpointing=True)
    if t.mixed_precision == "no" and m.dtype == "auto":
        out['train.mixed_precision = "bf16"'] = setter(train__mixed_precision="bf16")
    if t.batch_size > 1:
        out["train.batch_size = 1"] = setter(train__batch_size=1)
    if cfg.data.resolution > 512:
        out["data.resolution = 512"] = setter(data__resolution=512)
    return out


def _images(cfg: TrainConfig) -> tuple[int, int]:
    """(images, distinct captions) of the dataset (1, 1 when the folder is not there)."""
    root = Path(cfg.data.path).expanduser()
    if not root.is_dir():
        return 1, 1
    files = [p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")]
    captions = set()
    for p in files:
        cap = p.with_suffix(cfg.data.caption_extension)
        captions.add(cap.read_text(encoding="utf-8", errors="replace").strip() if cap.is_file() else "")
    return max(1, len(files)), max(1, len(captions))


def _estimate(cfg: TrainConfig, model: _Model, device: str, available: int, traces: dict[tuple[object, ...], int], host: int) -> Estimate:
    import torch

    t, fam = cfg.train, model.family
    wdt = torch_dtype(weight_dtype_name(cfg.model, t.mixed_precision))
    compute = wdt if t.mixed_precision == "no" else torch_dtype(t.mixed_precision)
    wb = wdt.itemsize
    q = cfg.model.quantize
    big = set(big_text_encoders(model.profile))
    weights = {}
    for attr, module in model.meta.items():
        if attr == "vae":
            weights[attr] = weight_bytes(module, 4 if wb == 2 and wdt == torch.float16 else wb, "none")
        else:
            weights[attr] = weight_bytes(module, wb, q if (attr == fam.denoiser_attr or attr in big) else "none",
                                         fp16=wdt == torch.float16)
    den = fam.denoiser_attr
    lora = model.lora_params + model.te_lora_params
    eight_bit = t.optimizer == "adamw8bit"
    optim = lora * (2 if eight_bit else 8)
    side = max(cfg.data.bucket_step, cfg.data.resolution // cfg.data.bucket_step * cfg.data.bucket_step)
    lat = side // model.vae_factor
    key = (t.batch_size, lat, t.gradient_checkpointing, str(compute), str(wdt))
    if key not in traces:
        for n, prm in model.meta[den].named_parameters():  # frozen weights in the run's dtype, LoRA float32
            if "lora_" not in n:
                prm.data = prm.data.to(wdt)
        try:
            traces[key] = saved_activations(model.meta[den], fam, batch=t.batch_size, latent_hw=(lat, lat),
                                            text_len=model.text_len, compute_dtype=compute,
                                            checkpointing=t.gradient_checkpointing)
        except (ValueError, RuntimeError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TrainError(f"the denoiser cannot run a {side}x{side} image: {first}", key="data.resolution") from None
    acts = traces[key]
    # Temporaries beside the saved activations: the forward's intermediates that are not saved live only inside
    # the block that makes them, and the backward frees each block's saved tensors as it makes their gradients,
    # so what is alive on top is bounded by one block's activations: the largest block's. A bound, not a fit:
    # no constant is calibrated here (benchmarks/speed/bench_train_scale.py compares the total with measured peaks).
    block_key = ("block", t.batch_size, lat, str(compute), str(wdt))
    if block_key not in traces:
        traces[block_key] = largest_block(model.meta[den], fam, batch=t.batch_size, latent_hw=(lat, lat),
                                          text_len=model.text_len, compute_dtype=compute)
    transient = traces[block_key]
    images, captions = _images(cfg)
    flips = 2 if cfg.data.random_flip else 1
    latent_cache = images * flips * 2 * model.latent_channels * lat * lat * 4 if cfg.data.cache_latents else 0
    variants = 1
    if cfg.data.caption_dropout > 0:
        variants += 1
    if cfg.data.encoder_dropout:
        variants += 2 ** max(1, len(cfg.data.encoder_dropout)) - 1
    text_cache = min(512 * 2**20, captions * variants * model.cond_values * 4) if cfg.data.cache_text else 0
    vae_conf = model.meta["vae"].config
    vae_bytes = 4 if wdt == torch.float16 else wb
    vae_work = 4 * vae_conf.block_out_channels[0] * side * side * vae_bytes
    where_cache = "host" if device == "cuda" else "device"
    free = cfg.model.free_encoders and not cfg.lora.text_encoders and cfg.data.cache_text and not cfg.data.shuffle_tags
    free_vae = cfg.model.free_encoders and cfg.data.cache_latents
    encoders = [a for a in model.meta if a not in (den, "vae")]
    runtime = [Line("runtime (CUDA context, workspaces)", CUDA_CONTEXT)] if device == "cuda" else \
        [Line("runtime (torch and libraries, this process)", host)]
    qs = f", {q}" if q != "none" else ""
    # on CUDA the denoiser waits in host RAM until the encoders are done (te_align.train.models.place_denoiser)
    on_host = device == "cuda" and q not in ("int8", "nf4")
    caching = [
        *runtime,
        Line(
            f"{den} weights ({weight_dtype_name(cfg.model, t.mixed_precision)}{qs})",
            weights[den],
            "host" if on_host else "device",
        ),
    ]
    caching += [Line(f"{a} weights", weights[a]) for a in encoders] + [Line("vae weights", weights["vae"])]
    caching.append(Line(f"VAE encoding one {side}x{side} image", vae_work))
    training = [
        *runtime,
        Line(f"{den} weights ({weight_dtype_name(cfg.model, t.mixed_precision)}{qs})", weights[den]),
        Line(f"LoRA parameters ({lora:,}, float32)", lora * 4),
        Line("LoRA gradients (float32)", lora * 4),
        Line(f"optimizer state ({t.optimizer})", optim),
        Line(
            f"activations (batch {t.batch_size}, {side}x{side}, checkpointing "
            f"{'on' if t.gradient_checkpointing else 'off'})",
            acts,
        ),
        Line("temporaries (forward/backward)", transient),
    ]
    if not free:
        training += [Line(f"{a} weights (kept)", weights[a]) for a in encoders]
    if not free_vae:
        training.append(Line("vae weights (kept)", weights["vae"]))
    training += [Line(f"latent cache ({images} images)", latent_cache, where_cache),
                 Line(f"text cache in memory ({captions} captions x {variants})", text_cache, where_cache)]
    if device == "cuda":
        training.append(Line("runtime (torch and libraries)", host, "host"))
    loading = _loading(cfg, model, device, weights, wdt, host)
    params = {a: _count(m) for a, m in model.meta.items()}
    params["lora"] = lora
    return Estimate(device, available, caching, training, params, {"saved": acts, "transient": transient},
                    lines_loading=loading)


def _loading(cfg: TrainConfig, model: _Model, device: str, weights: dict[str, int], wdt: torch.dtype, host: int) -> list[Line]:
    """The loading phase: every component's weights as loaded, plus the file pages of the component being
    converted. A component whose file holds another dtype than the one it is loaded in is read from the
    memory-mapped file into a converted copy, so both are resident until the load returns (seen on CPU with
    the bfloat16 T5 of the medium benchmark model loaded in float32: the resident set rose by its float32
    weights + its file bytes, then fell by the file bytes); one stored in the loaded dtype is used
    memory-mapped, with no second copy. Which component loads last is not fixed (diffusers' loading order varies between runs), so
    the largest conversion is counted on top of all the weights. On CUDA the weights load into host RAM first
    (``prepare_frozen`` moves them), except bitsandbytes-quantized ones, which load onto the GPU; fp8 storage
    is applied after the load, so the load holds the weights in the run's dtype.
    A hub id's files cannot be read here: they are taken as 16-bit (as FLUX.1 and SD3.5 publish them), so
    only a float32 run converts them."""
    import torch

    fam = model.family
    q = cfg.model.quantize
    bnb = {fam.denoiser_attr, *big_text_encoders(model.profile)} if q in ("int8", "nf4") else set()
    where = "host" if device == "cuda" else "device"
    lines = [Line("runtime (CUDA context, workspaces)", CUDA_CONTEXT)] if device == "cuda" else []
    lines.append(Line("runtime (torch and libraries, this process)", host, where))
    converted: dict[str, int] = {}
    for attr, module in model.meta.items():
        loaded = torch.float32 if attr == "vae" and wdt == torch.float16 else wdt
        if attr in bnb:
            lines.append(Line(f"{attr} weights ({q}, loaded onto the GPU)", weights[attr]))
        else:
            as_loaded = weight_bytes(module, loaded.itemsize, "none", fp16=loaded == torch.float16)
            lines.append(Line(f"{attr} weights (loaded in {dtype_name(loaded)})", as_loaded, where))
        files = model.files.get(attr)
        if files is None:  # a hub id: 16-bit files
            files = {"bfloat16": 2 * _count(module)}
        converted[attr] = sum(b for name, b in files.items() if name != dtype_name(loaded) and name.startswith(("float", "bfloat")))
    attr = max(converted, key=lambda a: converted[a], default="")
    if attr and converted[attr]:
        lines.append(Line(f"{attr} file pages while converting (largest conversion)", converted[attr], where))
    return lines


# ----------------------------------------------------------------------------------------------- report
def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def report(est: Estimate, cfg: TrainConfig) -> str:
    """The estimate as text: components per phase, the peak against the device, options that fit."""
    lines = [f"memory estimate for {cfg.source or 'the config'} on {est.device} ({_gib(est.available)} available)"]
    lines.append("parameters: " + ", ".join(f"{k} {v:,}" for k, v in est.params.items()))
    titles = {
        "loading": "loading (weights as loaded, the file of a converted component mapped)",
        "caching": "caching (text encoders + VAE resident)",
        "training": "training",
    }
    for phase, items in est.phases().items():
        if not items:
            continue
        lines.append(f"{titles[phase]}:")
        for it in items:
            if it.bytes:
                lines.append(f"  {it.what:<62} {_gib(it.bytes):>11}{'  (host RAM)' if it.where == 'host' and est.device == 'cuda' else ''}")
        dev = sum(x.bytes for x in items if x.where == "device")
        lines.append(f"  {'total on ' + est.device:<62} {_gib(dev):>11}")
    lines.append(f"peak: {_gib(est.peak('device'))} of {_gib(est.available)} on {est.device}"
                 + (f"; host RAM {_gib(est.peak('host'))}" if est.device == "cuda" else "")
                 + (" - fits" if est.fits else " - DOES NOT FIT"))
    if est.options:
        lines.append("other settings:")
        for name, (dev, _) in est.options.items():
            lines.append(f"  {name:<62} {_gib(dev):>11}{'  fits' if dev <= est.available else ''}")
    return "\n".join(lines)


def refusal(est: Estimate) -> str:
    """One line: the run does not fit, and what would."""
    fitting = [name for name, (dev, _) in sorted(est.options.items(), key=lambda x: x[1][0]) if dev <= est.available]
    alt = ("; these would fit: " + "; ".join(fitting)) if fitting else "; no single change tried here fits"
    return f"the run needs about {_gib(est.peak('device'))} on {est.device} but {_gib(est.available)} is available{alt}"


__all__ = [
    "Estimate",
    "Line",
    "build_meta",
    "component_specs",
    "estimate",
    "refusal",
    "report",
    "saved_activations",
    "steady_cpu_heap",
    "stored_bytes",
    "weight_bytes",
]
