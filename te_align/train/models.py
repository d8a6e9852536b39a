"""Loading a model with diffusers, checking it against its profile, and each family's denoiser call.

Families: ``sd1`` / ``sd2`` (UNet, eps or v), ``sdxl`` (UNet with pooled + size conditioning; eps, v
or flow), ``sd3`` (MMDiT, rectified flow), ``flux`` (packed latents, image/text position ids,
guidance embedding for dev; rectified flow), ``chroma`` (Flux's packing and ids, no pooled vector or
guidance embedding, the T5 attention mask into the transformer as ``ChromaPipeline`` passes it;
rectified flow), ``flux2-klein`` (FLUX.2 [klein]: 2x2-patchified latents normalised by the VAE's BatchNorm
statistics, one token per patch with 4-axis ids, no guidance embedding; rectified flow). Conditioning always comes from ``te_align.encode`` with the run's profile; this
module only routes its named tensors into the denoiser.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align import _quiet
from te_align._compat import require_peft
from te_align._dtypes import torch_dtype
from te_align._lazy import lazy_module
from te_align.errors import TeAlignError
from te_align.profiles.overrides import resolve
from te_align.profiles.sources.hub import offline_model_problem, unreachable_model_problem
from te_align.train.config import ModelConfig, TrainError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline, ModelMixin

    from te_align.profiles import AlignmentProfile

#: Deferred: it imports torch and transformers, which this module keeps off its own import (the CLI's cold path).
_encoding_core = lazy_module("te_align.encoding.core")

logger = logging.getLogger("te_align.train")

SUPPORTED_FAMILIES = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "flux2-klein")

#: Default LoRA targets, as diffusers' LoRA example scripts use them.
UNET_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]
SD3_TARGETS = [
    "attn.add_k_proj",
    "attn.add_q_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "attn.to_k",
    "attn.to_out.0",
    "attn.to_q",
    "attn.to_v",
]
FLUX_TARGETS = [
    "attn.to_k",
    "attn.to_q",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_k_proj",
    "attn.add_q_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
]
#: ChromaTransformer2DModel has Flux's block modules under the same names (its pruned norms have no
#: modulation Linear: every block's modulation comes from ``distilled_guidance_layer``, the approximator,
#: which is not a default target).
CHROMA_TARGETS = list(FLUX_TARGETS)
#: FLUX.2 [klein] (``Flux2Transformer2DModel``): the diffusers klein LoRA script's default targets, the double blocks'
#: attention projections, every single block's fused ``to_qkv_mlp_proj`` and single blocks 0-23's ``attn.to_out``
#: (huggingface/diffusers@58eb52c examples/dreambooth/train_dreambooth_lora_flux2_klein.py:1300-1303; 24 = the 9B's
#: single blocks, the 4B has 20: names of blocks a model lacks match nothing).
KLEIN_TARGETS = ["to_k", "to_q", "to_v", "to_out.0", "to_qkv_mlp_proj",
                 *[f"single_transformer_blocks.{i}.attn.to_out" for i in range(24)]]
CLIP_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]

@dataclass
class Family:
    """What differs between families on the denoiser side."""

    name: str
    denoiser_attr: str  # "unet" or "transformer"
    default_targets: list[str]
    flow_native: bool
    patch: int = 1  # latent side must be a multiple of this
    #: The denoiser takes Flux's 2x2-packed latent sequence with image/text position ids (flux, chroma).
    packed: bool = False
    #: The denoiser's keyword for the text attention mask, when it takes one (chroma: ``attention_mask``).
    mask_arg: str | None = None
    #: FLUX.2: the model's latents are the VAE's 2x2-patchified posterior normalised by its BatchNorm statistics
    #: (:func:`patchify_normalize`); the denoiser reads them one token per patch with (t, h, w, l) ids.
    patchified: bool = False

    @property
    def lora_prefix(self) -> str:
        return self.denoiser_attr


FAMILIES: dict[str, Family] = {
    "sd1": Family("sd1", "unet", UNET_TARGETS, False),
    "sd2": Family("sd2", "unet", UNET_TARGETS, False),
    "sdxl": Family("sdxl", "unet", UNET_TARGETS, False),
    "sd3": Family("sd3", "transformer", SD3_TARGETS, True, patch=2),
    "flux": Family("flux", "transformer", FLUX_TARGETS, True, patch=2, packed=True),
    "chroma": Family("chroma", "transformer", CHROMA_TARGETS, True, patch=2, packed=True, mask_arg="attention_mask"),
    "flux2-klein": Family("flux2-klein", "transformer", KLEIN_TARGETS, True, patch=2, patchified=True),
}


def family_of(profile: AlignmentProfile) -> Family:
    fam = FAMILIES.get(profile.family)
    if fam is None:
        raise TrainError(
            f"profile '{profile.name}' is a {profile.family} model; te-align train supports "
            "SD1.5/SD2 (sd1, sd2), SDXL, SD3/3.5, Flux, Chroma and FLUX.2 [klein]",
            key="model.profile",
        )
    return fam


# ----------------------------------------------------------------------------------------- loading
def resolve_profile(cfg: ModelConfig) -> AlignmentProfile:
    source = cfg.path if cfg.profile == "auto" else cfg.profile
    try:
        return resolve(source, ("model.profile_overrides", cfg.profile_overrides or None))
    except TrainError:
        raise
    except Exception as e:
        if isinstance(e, TeAlignError):
            raise TrainError(f"model.profile: {e}") from None
        raise


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def weight_dtype_name(cfg: ModelConfig, mixed_precision: str = "no") -> str:
    """The frozen weights' dtype: ``model.dtype`` when set, else the mixed-precision dtype (float32 without)."""
    if cfg.dtype != "auto":
        return cfg.dtype
    return {"bf16": "bfloat16", "fp16": "float16"}.get(mixed_precision, "float32")


#: What each ``model.quantize`` value is made of, for logs, the LoRA stamp and ``train_config.json``.
QUANTIZE_BACKENDS = {
    "none": "none",
    "int8": "bitsandbytes LLM.int8 (diffusers/transformers BitsAndBytesConfig load_in_8bit)",
    "nf4": "bitsandbytes 4-bit NF4 (diffusers/transformers BitsAndBytesConfig load_in_4bit, double quant)",
    "fp8": "float8_e4m3fn storage, per-layer upcast (diffusers layerwise casting)",
}


def big_text_encoders(profile: AlignmentProfile) -> list[str]:
    """Pipeline attributes of the large (non-CLIP) text encoders: T5 or an LLM; ``model.quantize`` covers them."""
    return [s.encoder_subfolder for s in profile.slots if not s.tokenizer.cls.startswith("CLIP")]


def check_quantize(quantize: str, device: torch.device | str) -> None:
    """Refuse a ``model.quantize`` this machine cannot run, in one line naming the alternative."""
    import importlib.util

    if quantize not in ("int8", "nf4"):
        return
    if importlib.util.find_spec("bitsandbytes") is None:
        raise TrainError(f"quantize = \"{quantize}\" needs bitsandbytes (pip install \"te-align[bnb]\"); "
                         "or use quantize = \"fp8\", which needs no extra package", key="model.quantize")
    if getattr(device, "type", str(device)) != "cuda":
        raise TrainError(f"quantize = \"{quantize}\" (bitsandbytes through diffusers) needs a CUDA GPU and this run is "
                         f"on {getattr(device, 'type', device)}; use quantize = \"fp8\" (float8 weight storage, any "
                         "device) or \"none\"", key="model.quantize")


def _bnb_config(quantize: str, dtype: torch.dtype) -> tuple[str, dict[str, object]]:
    """(diffusers quant_backend, its kwargs) for ``int8`` / ``nf4``."""
    if quantize == "int8":
        return "bitsandbytes_8bit", {"load_in_8bit": True}
    return "bitsandbytes_4bit", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                                 "bnb_4bit_compute_dtype": dtype}


def quantized_components(pipe: DiffusionPipeline, profile: AlignmentProfile) -> list[str]:
    """The components ``model.quantize`` covers: the denoiser and the large text encoder(s)."""
    fam = family_of(profile)
    return [fam.denoiser_attr] + [a for a in big_text_encoders(profile) if getattr(pipe, a, None) is not None]


def apply_fp8(module: torch.nn.Module, compute_dtype: torch.dtype) -> None:
    """Store ``module``'s Linear/Conv weights as float8_e4m3fn, upcast to ``compute_dtype`` layer by layer
    (diffusers' layerwise casting; norms, embedding tables, keep-in-fp32 layers and LoRA layers stay as they are)."""
    import torch
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN, apply_layerwise_casting

    skip = tuple(getattr(module, "_skip_layerwise_casting_patterns", None) or DEFAULT_SKIP_MODULES_PATTERN)
    # transformers' keep-in-fp32 layers (T5's ``wo``: T5 casts its input to that layer's weight dtype) stay too
    keep = tuple(rf"(^|\.){name}$" for name in getattr(module, "_keep_in_fp32_modules", None) or ())
    apply_layerwise_casting(module, storage_dtype=torch.float8_e4m3fn, compute_dtype=compute_dtype,
                            skip_modules_pattern=(*skip, *keep, "lora_"), skip_modules_classes=(torch.nn.Embedding,))


def is_quantized(module: torch.nn.Module) -> bool:
    """True for a bitsandbytes-quantized diffusers/transformers model."""
    return bool(getattr(module, "is_quantized", False) or getattr(module, "quantization_method", None))


def load_pipeline(cfg: ModelConfig, profile: AlignmentProfile, *, dtype_name: str | None = None) -> DiffusionPipeline:
    """The diffusers pipeline of the model, from a folder, a hub id or a single-file checkpoint.

    ``dtype_name``: the frozen weights' dtype (default :func:`weight_dtype_name` without mixed
    precision). ``model.quantize = "int8"`` / ``"nf4"`` loads the denoiser and the large text encoder
    through diffusers' ``PipelineQuantizationConfig`` (bitsandbytes); ``fp8`` is applied after loading.
    """
    import te_align.encoding.projected  # noqa: F401  (diffusers loads a swapped model's text encoder class from it)

    dtype = torch_dtype(dtype_name or weight_dtype_name(cfg))
    path = Path(cfg.path).expanduser()
    common: dict[str, object] = {"torch_dtype": dtype}
    if cfg.quantize in ("int8", "nf4"):
        if path.is_file():
            raise TrainError(f"quantize = \"{cfg.quantize}\" loads through diffusers' quantization config, which this "
                             "trainer uses with diffusers folders and hub ids; convert the single file to a diffusers "
                             "folder, or use quantize = \"fp8\"", file=str(path), key="model.quantize")
        from diffusers import PipelineQuantizationConfig

        backend, kwargs = _bnb_config(cfg.quantize, dtype)
        fam = family_of(profile)
        common["quantization_config"] = PipelineQuantizationConfig(
            quant_backend=backend, quant_kwargs=kwargs, components_to_quantize=[fam.denoiser_attr, *big_text_encoders(profile)])
    if cfg.revision:
        common["revision"] = cfg.revision
    if cfg.variant:
        common["variant"] = cfg.variant
    import warnings

    try:
        warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
        with _quiet.no_progress_bars():  # diffusers' / transformers' loading bars (TE_ALIGN_QUIET=0 shows them)
            pipe = _load(path, cfg, profile, common)
    except TrainError:
        raise
    except (OSError, ValueError) as e:
        why = None if path.exists() else unreachable_model_problem(cfg.path, e)
        if why:
            raise TrainError(why, key="model.path") from None
        raise TrainError(f"cannot load the model: {_first_line(e)}", file=cfg.path, key="model.path") from None
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    return pipe


def _load(path: Path, cfg: ModelConfig, profile: AlignmentProfile, common: dict[str, object]) -> DiffusionPipeline:
    """The pipeline from ``path`` (a single file, a diffusers folder) or the hub id ``cfg.path``."""
    import diffusers

    if path.is_file():
        if path.suffix.lower() not in (".safetensors", ".sft"):
            raise TrainError("single-file checkpoints must be .safetensors (pickle files are never opened)", file=str(path), key="model.path")
        pipe = _load_single_file(path, cfg, profile, common)
    elif path.is_dir():
        if not (path / "model_index.json").is_file():
            raise TrainError("not a diffusers model folder (no model_index.json)", file=str(path), key="model.path")
        pipe = diffusers.DiffusionPipeline.from_pretrained(str(path), **common)
    elif path.suffix.lower() in (".safetensors", ".sft", ".ckpt") or str(path).startswith((".", "/", "~")):
        raise TrainError("no such model file or folder", file=cfg.path, key="model.path")
    else:  # a hub repo id
        why = offline_model_problem(cfg.path, cfg.revision or None)
        if why:
            raise TrainError(why, key="model.path")
        pipe = diffusers.DiffusionPipeline.from_pretrained(cfg.path, **common)
    return pipe


#: Denoiser class per denoiser attribute and family, for denoiser-only single-file checkpoints.
_DENOISER_CLASSES = {"unet": "UNet2DConditionModel", "sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel",
                     "chroma": "ChromaTransformer2DModel", "flux2-klein": "Flux2Transformer2DModel"}


def _load_single_file(
    path: Path, cfg: ModelConfig, profile: AlignmentProfile, common: dict[str, object]
) -> DiffusionPipeline:
    """A pipeline from a single-file checkpoint in the original (non-diffusers) layout.

    ``model.config`` (a diffusers folder or hub id) gives diffusers the component configs, so no
    config is fetched. A checkpoint with every component loads as a whole; one that holds only the
    denoiser (the usual Flux / SD3 / fine-tuned UNet file) loads the denoiser from the file and the
    other components from ``model.config``.
    """
    import diffusers
    from diffusers.loaders.single_file_utils import SingleFileComponentError

    cls = getattr(diffusers, profile.pipeline)
    options = {k: v for k, v in common.items() if k != "variant"}
    extra = {"config": cfg.config} if cfg.config else {}
    try:
        return cls.from_single_file(str(path), **extra, **options)
    except SingleFileComponentError as e:
        if not cfg.config:
            raise TrainError(f"the checkpoint does not hold every component ({_first_line(e)}); set model.config to the "
                             "diffusers folder or hub id of the base model", file=str(path), key="model.config") from None
    fam = family_of(profile)
    denoiser_cls = getattr(diffusers, _DENOISER_CLASSES[fam.denoiser_attr if fam.denoiser_attr == "unet" else fam.name])
    denoiser = denoiser_cls.from_single_file(str(path), config=cfg.config, subfolder=fam.denoiser_attr, **options)
    return diffusers.DiffusionPipeline.from_pretrained(cfg.config, **{fam.denoiser_attr: denoiser}, **common)


def _base_pipeline(name: str) -> str:
    for suffix in ("Img2Img", "Inpaint", "InstructPix2Pix", "ControlNet", "PAG"):
        name = name.replace(suffix, "")
    return name


def check_model(profile: AlignmentProfile, pipe: DiffusionPipeline, where: str) -> None:
    """Refuse a model whose pipeline or text encoders do not fit the profile (one line, names both)."""
    got = _base_pipeline(type(pipe).__name__)
    want = _base_pipeline(profile.pipeline)
    if got != want:
        raise TrainError(
            f"the model is a {got} but profile '{profile.name}' is for {want}; set model.profile to a matching "
            "profile or \"auto\"",
            file=where,
        )
    fam = family_of(profile)
    if getattr(pipe, fam.denoiser_attr, None) is None or getattr(pipe, "vae", None) is None:
        raise TrainError(f"the model has no {fam.denoiser_attr} or no vae", file=where)
    for slot in profile.slots:
        tok = getattr(pipe, slot.tokenizer_subfolder, None)
        enc = getattr(pipe, slot.encoder_subfolder, None)
        if tok is None or enc is None:
            missing = slot.tokenizer_subfolder if tok is None else slot.encoder_subfolder
            raise TrainError(f"the model has no '{missing}' for profile '{profile.name}' slot '{slot.name}'", file=where)
        width = _encoding_core._config_width(getattr(enc, "config", None))
        if width is not None and width != slot.encoder.hidden_size:
            raise TrainError(
                f"{slot.encoder_subfolder} has hidden size {width} but profile '{profile.name}' slot '{slot.name}' "
                f"expects {slot.encoder.hidden_size}: the model does not match the profile (use model.profile = \"auto\" "
                "or model.profile_overrides)",
                file=where,
            )


def vae_scale_factor(vae: ModelMixin) -> int:
    return 2 ** (len(vae.config.block_out_channels) - 1)


def latent_transform(vae: Any) -> tuple[float, float]:
    """(shift, scale): latents = (vae_latents - shift) * scale. A FLUX.2 VAE (``AutoencoderKLFlux2``) has neither:
    its latents are normalised per patchified channel by :func:`patchify_normalize` instead, so (0, 1) here."""
    if has_latent_batchnorm(vae):
        return 0.0, 1.0
    shift = getattr(vae.config, "shift_factor", None) or 0.0
    return float(shift), float(vae.config.scaling_factor)


def has_latent_batchnorm(vae: object) -> bool:
    """A FLUX.2 VAE: a ``bn`` BatchNorm over the 2x2-patchified latents whose running statistics normalise them."""
    import torch

    return isinstance(getattr(vae, "bn", None), torch.nn.BatchNorm2d) and "batch_norm_eps" in dict(getattr(vae, "config", {}) or {})


def patchify(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, 4C, H/2, W/2): each 2x2 patch's pixels as channels, channel-major (c, row, column)."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)


def unpatchify(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`patchify`."""
    b, c4, h, w = x.shape
    return x.reshape(b, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c4 // 4, h * 2, w * 2)


def latent_norm(vae: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) of a FLUX.2 VAE's patchified latents, (1, 4C, 1, 1) float32: the BatchNorm's running mean and
    sqrt(running variance + ``batch_norm_eps``), as ``Flux2KleinPipeline`` normalises encoded images with them and
    un-normalises its samples (diffusers 0.42.1 pipelines/flux2/pipeline_flux2_klein.py:471-475, :911-916)."""
    import torch

    bn = vae.bn
    mean = bn.running_mean.detach().float().cpu().view(1, -1, 1, 1)
    std = torch.sqrt(bn.running_var.detach().float().cpu().view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    return mean, std


def patchify_normalize(
    norm: tuple[torch.Tensor, torch.Tensor], mean: torch.Tensor, std: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A FLUX.2 model's latents from the VAE posterior (``mean``, ``std``: (B, C, H, W) or (C, H, W)): patchified,
    then (x - bn mean) / bn std per patchified channel (``norm``: :func:`latent_norm`); ``std`` patchified and divided
    by the same std (so that ``mean' + std' * noise`` is the normalised patchified posterior sample)."""
    single = mean.dim() == 3
    m, s = norm
    x = patchify(mean[None] if single else mean)
    x = (x - m.to(x.dtype)) / s.to(x.dtype)
    sd = None
    if std is not None:
        sd = patchify(std[None] if single else std) / s.to(std.dtype)
    if single:
        return x[0], (sd[0] if sd is not None else None)
    return x, sd


def prepare_frozen(
    cfg: ModelConfig, profile: AlignmentProfile, pipe: DiffusionPipeline, device: torch.device, dtype: torch.dtype
) -> None:
    """Freeze the denoiser, text encoders and VAE, put them on ``device`` in ``dtype`` (the VAE stays
    float32 when ``dtype`` is float16, which overflows in the SDXL VAE), then apply ``model.quantize =
    "fp8"`` to the denoiser and the large text encoder. bitsandbytes-quantized modules stay as loaded."""
    import torch

    fam = family_of(profile)
    names = [fam.denoiser_attr, "vae", *dict.fromkeys(s.encoder_subfolder for s in profile.slots)]
    for name in names:
        module = getattr(pipe, name)
        module.requires_grad_(False)
        if is_quantized(module):
            continue
        want = torch.float32 if name == "vae" and dtype == torch.float16 else dtype
        # on a GPU the denoiser waits in host RAM while the encoders fill the caches (place_denoiser moves it)
        where = "cpu" if name == fam.denoiser_attr and getattr(device, "type", "") == "cuda" else device
        module.to(device=where, dtype=want)
    if cfg.quantize in ("int8", "nf4"):
        plain = [n for n in quantized_components(pipe, profile) if not is_quantized(getattr(pipe, n))]
        if plain:
            raise TrainError(f"quantize = \"{cfg.quantize}\": {', '.join(plain)} of the given pipeline is not quantized; "
                             "let te-align load model.path, or pass a pipeline loaded with a BitsAndBytesConfig",
                             key="model.quantize")
    if cfg.quantize == "fp8":
        for name in quantized_components(pipe, profile):
            apply_fp8(getattr(pipe, name), dtype)


def place_denoiser(pipe: DiffusionPipeline, profile: AlignmentProfile, device: torch.device) -> None:
    """The denoiser onto ``device`` (after the caches are full and the encoders freed; see prepare_frozen)."""
    module = getattr(pipe, family_of(profile).denoiser_attr)
    if not is_quantized(module):
        module.to(device)


# ------------------------------------------------------------------------------------------- lora
def add_lora(
    model: torch.nn.Module, *, rank: int, alpha: float, dropout: float, targets: list[str], seed: int
) -> list[torch.nn.Parameter]:
    """Add a peft LoRA adapter ``default`` to a diffusers model or transformers text encoder; trainable params."""
    import torch
    from peft import LoraConfig

    require_peft(type(model).__module__.split(".")[0])  # a library/peft pair that cannot work: name both versions
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, init_lora_weights="gaussian", target_modules=targets)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model.add_adapter(config)
        except ValueError as e:
            raise TrainError(f"cannot add LoRA to {type(model).__name__}: {_first_line(e)}", key="lora.target_modules") from None
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    if not params:
        raise TrainError(f"no module of {type(model).__name__} matches {targets}", key="lora.target_modules")
    low = any(p.dtype.itemsize == 1 for p in params)  # peft gives LoRA its base layer's dtype: float8 for an fp8 base
    for p in params:
        p.requires_grad_(True)
        if p.dtype != torch.float32:
            p.data = p.data.float()
    if low:  # an init rounded to float8 would lose most of its precision: draw it again in float32
        from peft.tuners.lora import LoraLayer

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in model.modules():
                if isinstance(module, LoraLayer) and "default" in module.lora_A:
                    module.reset_lora_parameters("default", config.init_lora_weights)
    return params


# ------------------------------------------------------------------------------------ denoiser call
def pack_latents(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, C*4): Flux's 2x2 patch sequence."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`pack_latents` for a latent of side (h, w)."""
    b, _, d = x.shape
    c = d // 4
    return x.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def latent_ids(b: int, h: int, w: int, device: torch.device) -> torch.Tensor:
    """FLUX.2 image position ids (B, H*W, 4) int64 of a (B, C, H, W) patchified latent: (t, h, w, l) = (0, row, column,
    0) in row-major order, the order :func:`pack_patches` lays the tokens in."""
    import torch

    ids = torch.zeros(h, w, 4, dtype=torch.int64)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(1, h * w, 4).expand(b, -1, -1).to(device)


def pack_patches(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H*W, C): one token per position of a patchified latent, row-major."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h * w).permute(0, 2, 1)


def unpack_patches(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`pack_patches`."""
    b, _, c = x.shape
    return x.permute(0, 2, 1).reshape(b, c, h, w)


def image_ids(h: int, w: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Flux image position ids (H/2 * W/2, 3): (0, row, column)."""
    import torch

    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3).to(device=device, dtype=dtype)


def sdxl_time_ids(original: tuple[int, int], crop: tuple[int, int], target: tuple[int, int]) -> list[float]:
    """SDXL micro-conditioning: original (h, w), crop (top, left), target (h, w)."""
    return [float(original[0]), float(original[1]), float(crop[0]), float(crop[1]), float(target[0]), float(target[1])]


def denoise(
    family: Family,
    model: torch.nn.Module,
    noisy: torch.Tensor,
    timesteps: torch.Tensor,
    cond: Mapping[str, torch.Tensor],
    *,
    time_ids: torch.Tensor | None = None,
    guidance: float | None = None,
    config: object = None,
    denoiser_mask: bool = True,
) -> torch.Tensor:
    """The denoiser's prediction in latent layout (B, C, H, W).

    ``denoiser_mask``: the text attention mask of ``cond`` goes to a denoiser that takes one (chroma); False
    (the profile's ``masks.denoiser`` off, :func:`denoiser_mask_on`) calls it without a mask.
    """
    import torch

    emb = cond["prompt_embeds"]
    if family.name in ("sd1", "sd2"):
        return model(noisy, timesteps, encoder_hidden_states=emb, return_dict=False)[0]
    if family.name == "sdxl":
        added = {"text_embeds": cond["pooled_prompt_embeds"], "time_ids": time_ids}
        return model(noisy, timesteps, encoder_hidden_states=emb, added_cond_kwargs=added, return_dict=False)[0]
    if family.name == "sd3":
        return model(
            hidden_states=noisy, timestep=timesteps, encoder_hidden_states=emb,
            pooled_projections=cond["pooled_prompt_embeds"], return_dict=False,
        )[0]
    if family.name == "chroma":
        return _chroma(model, noisy, timesteps, cond, denoiser_mask)
    if family.patchified:
        return _flux2(model, noisy, timesteps, cond)
    # flux
    b, _, h, w = noisy.shape
    g = None
    if getattr(config if config is not None else model.config, "guidance_embeds", False):
        g = torch.full((b,), float(guidance if guidance is not None else 1.0), device=noisy.device, dtype=noisy.dtype)
    out = model(
        hidden_states=pack_latents(noisy),
        timestep=timesteps,
        guidance=g,
        pooled_projections=cond["pooled_prompt_embeds"],
        encoder_hidden_states=emb,
        txt_ids=cond["text_ids"],
        img_ids=image_ids(h, w, noisy.device, noisy.dtype),
        return_dict=False,
    )[0]
    return unpack_latents(out, h, w)


def _chroma(
    model: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor, cond: Mapping[str, torch.Tensor], masked: bool
) -> torch.Tensor:
    """``ChromaTransformer2DModel`` called as ``ChromaPipeline.__call__`` calls it (diffusers 0.42.1
    pipelines/chroma/pipeline_chroma.py:858-867): packed latents, flow time t in [0, 1] (the pipeline's
    ``timestep / 1000``), the T5 states, the zero text ids, the image ids, and the profile's
    ``prompt_attention_mask`` (real tokens plus one pad, in the embeddings' dtype) extended with ones for the
    image tokens exactly as ``_prepare_attention_mask`` extends it (:545-561: ``torch.cat`` with bool ones,
    so the result keeps the mask's floating dtype). No pooled projections, no guidance: Chroma has neither."""
    import torch

    b, _, h, w = noisy.shape
    mask = cond.get("prompt_attention_mask") if masked else None
    if mask is not None:
        mask = torch.cat([mask, torch.ones(b, (h // 2) * (w // 2), device=mask.device, dtype=torch.bool)], dim=1)
    out = model(
        hidden_states=pack_latents(noisy),
        timestep=timesteps,
        encoder_hidden_states=cond["prompt_embeds"],
        txt_ids=cond["text_ids"],
        img_ids=image_ids(h, w, noisy.device, noisy.dtype),
        attention_mask=mask,
        return_dict=False,
    )[0]
    return unpack_latents(out, h, w)


def _flux2(model: torch.nn.Module, noisy: torch.Tensor, timesteps: torch.Tensor, cond: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``Flux2Transformer2DModel`` called as ``Flux2KleinPipeline.__call__`` calls it (diffusers 0.42.1
    pipelines/flux2/pipeline_flux2_klein.py:850-860): ``noisy`` is the patchified, normalised latent (B, C, H, W)
    handed over as one token per position, flow time t in [0, 1] (the pipeline's ``timestep / 1000``), no guidance,
    the stacked text states and their (0, 0, 0, position) ids, the latent's (0, row, column, 0) ids. Returns the
    prediction in the same (B, C, H, W) layout."""
    b, _, h, w = noisy.shape
    out = model(
        hidden_states=pack_patches(noisy),
        timestep=timesteps,
        guidance=None,
        encoder_hidden_states=cond["prompt_embeds"],
        txt_ids=cond["text_ids"],
        img_ids=latent_ids(b, h, w, noisy.device),
        return_dict=False,
    )[0]
    return unpack_patches(out[:, : h * w], h, w)


def denoiser_mask_on(profile: AlignmentProfile) -> bool:
    """Whether the profile hands the denoiser a text attention mask: it has an output that is a slot's
    ``denoiser_mask`` and that slot's ``masks.denoiser`` is on. ``t5.masks.denoiser = false`` (or removing
    the mask output) on chroma trains and samples the transformer without the mask."""
    from te_align.profiles.expr import parse_expression, refs

    for _, text in profile.outputs:
        found = [r for r in refs(parse_expression(text)) if r.attr == "denoiser_mask"]
        if found and all(profile.slot(r.slot).masks.denoiser for r in found):
            return True
    return False


def enable_gradient_checkpointing(family: Family, model: torch.nn.Module) -> None:
    """Gradient checkpointing on the denoiser, with the mask it was called with reaching every block.

    diffusers 0.42.1's ``ChromaTransformer2DModel.forward`` checkpoints a single-stream block as
    ``_gradient_checkpointing_func(block, hidden_states, temb, image_rotary_emb)`` without the
    ``attention_mask`` it passes when not checkpointing (models/transformers/transformer_chroma.py:589-594
    against :597-603), so a checkpointed run would train those blocks unmasked and sample them masked.
    Here the checkpoint function hands such a block the mask of the current call (kept by a forward
    pre-hook on the model), so a checkpointed step computes what an uncheckpointed one does.
    """
    import torch

    if family.name != "chroma":
        model.enable_gradient_checkpointing()
        return
    from diffusers.models.transformers.transformer_chroma import ChromaSingleTransformerBlock

    current: dict[str, torch.Tensor | None] = {"mask": None}

    def remember(_module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        mask = kwargs.get("attention_mask")
        current["mask"] = mask if isinstance(mask, torch.Tensor) else None

    def forget(_module: torch.nn.Module, _args: tuple[object, ...], _out: object) -> None:
        current["mask"] = None

    def checkpoint(block: torch.nn.Module, *args: object) -> object:
        if isinstance(block, ChromaSingleTransformerBlock) and len(args) == 3:
            args = (*args, current["mask"])  # (hidden_states, temb, image_rotary_emb) + attention_mask
        return torch.utils.checkpoint.checkpoint(block.__call__, *args, use_reentrant=False)

    model.register_forward_pre_hook(remember, with_kwargs=True)
    model.register_forward_hook(forget)
    model.enable_gradient_checkpointing(gradient_checkpointing_func=checkpoint)


def default_flow_shift(family: Family) -> float:
    return 3.0 if family.name == "sdxl" else 1.0


def flow_timestep_scale(family: Family) -> float:
    """What the denoiser takes for flow time t in [0, 1]: t * 1000 (SD3, SDXL-flow) or t (Flux, Chroma, FLUX.2: their
    pipelines pass ``timestep / 1000`` and the transformer multiplies by 1000 itself)."""
    return 1.0 if family.packed or family.patchified else 1000.0


def logit_normal(n: int, shift: float, gen: torch.Generator) -> torch.Tensor:
    """t = sigmoid(N(log(shift), 1)) (the SD3 logit-normal, shifted)."""
    import torch

    return torch.sigmoid(torch.randn(n, generator=gen) + math.log(shift))


__all__ = [
    "FAMILIES",
    "QUANTIZE_BACKENDS",
    "SUPPORTED_FAMILIES",
    "Family",
    "add_lora",
    "apply_fp8",
    "big_text_encoders",
    "check_model",
    "check_quantize",
    "denoise",
    "denoiser_mask_on",
    "enable_gradient_checkpointing",
    "family_of",
    "has_latent_batchnorm",
    "image_ids",
    "is_quantized",
    "latent_ids",
    "latent_norm",
    "load_pipeline",
    "pack_latents",
    "pack_patches",
    "patchify",
    "patchify_normalize",
    "place_denoiser",
    "prepare_frozen",
    "quantized_components",
    "resolve_profile",
    "unpack_latents",
    "unpack_patches",
    "unpatchify",
    "weight_dtype_name",
]
