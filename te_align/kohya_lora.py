"""kohya's LoRA file format: the tensor names and the ``ss_*`` metadata kohya sd-scripts writes into a
``.safetensors`` LoRA, in one place.

A file format, not a trainer part: te-align reads it (``te-align inspect``, :mod:`te_align.metadata`), picks a
profile from it (:mod:`te_align.integrations.lora`), writes it (:mod:`te_align.train.export`) and recognises
it (:mod:`te_align.profiles.sources.checkpoint`). Standard library only; no tensor is read here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

#: Metadata keys that describe text conditioning (train_network.py and the architecture-specific
#: ``update_metadata`` of sd3_/flux_train_network.py), plus the modelspec architecture. Keys some forks or
#: older versions write (ss_t5xxl_max_token_length, ss_network_train_unet_only, ss_weighted_captions) are read
#: when present.
METADATA_KEYS = (
    "ss_base_model_version",
    "ss_v2",
    "ss_sd_model_name",
    "modelspec.architecture",
    "ss_model_prediction_type",
    "ss_clip_skip",
    "ss_max_token_length",
    "ss_t5xxl_max_token_length",
    "ss_apply_t5_attn_mask",
    "ss_apply_lg_attn_mask",
    "ss_text_encoder_lr",
    "ss_network_train_unet_only",
    "ss_caption_dropout_rate",
    "ss_caption_tag_dropout_rate",
    "ss_weighted_captions",
    "ss_training_comment",
)

#: Tensor-name prefixes of text-encoder weights: kohya LoRA (lora_te_, lora_te1_…) and diffusers/PEFT.
TE_TENSOR_PREFIXES = ("lora_te", "text_encoder")
#: Component name -> tensor-name prefix of the denoiser (SD3/Flux transformers use "lora_unet" too).
DENOISER_PREFIX = {"unet": "lora_unet", "transformer": "lora_unet"}

#: modelspec.architecture (library/sai_model_spec.py ARCH_*) prefix -> bundled profile, longest first.
ARCHITECTURES: tuple[tuple[str, str], ...] = (
    ("stable-diffusion-3.5-large", "sd35-large"),
    ("stable-diffusion-3-5-large", "sd35-large"),
    ("stable-diffusion-3.5-medium", "sd35-medium"),
    ("stable-diffusion-3-5-medium", "sd35-medium"),
    ("stable-diffusion-3", "sd3-medium"),
    ("stable-diffusion-xl-v1-base", "sdxl"),
    ("stable-diffusion-v2", "sd21"),
    ("stable-diffusion-v1", "sd15"),
    ("flux-1-schnell", "flux-schnell"),
    ("flux-1-dev", "flux-dev"),
    ("flux-1", "flux-dev"),
    ("chroma", "chroma"),
    ("lumina-2", "lumina2"),
    ("lumina", "lumina2"),
)
#: ss_base_model_version -> bundled profile (used when modelspec.architecture is absent).
BASE_VERSIONS: tuple[tuple[str, str], ...] = (
    ("sdxl", "sdxl"), ("sd_v2", "sd21"), ("sd_v1", "sd15"), ("sd3", "sd3-medium"), ("flux1", "flux-dev"),
    ("chroma", "chroma"), ("lumina2", "lumina2"),
)

MetadataValue = str | int | float | bool | list[object] | None


def parse_value(v: str, error: type[Exception] = ValueError) -> MetadataValue:
    """sd-scripts writes ``str(value)``: "None", "True", "2", "0.0001", "[1e-05, 2e-05]"."""
    if v == "None":
        return None
    if v in ("True", "False"):
        return v == "True"
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    try:
        return float(v)
    except ValueError:
        pass
    if v.startswith("[") and v.endswith("]"):
        try:
            return json.loads(v)  # type: ignore[no-any-return]
        except json.JSONDecodeError:
            pass
        except RecursionError:
            raise error("a kohya metadata value is nested too deeply to read") from None
    return v


def read(metadata: Mapping[str, str], error: type[Exception] = ValueError) -> dict[str, MetadataValue]:
    """The :data:`METADATA_KEYS` present in a file's metadata, parsed from their ``str()`` form."""
    return {k: parse_value(metadata[k], error) for k in METADATA_KEYS if k in metadata}


def is_text_encoder_tensor(name: str) -> bool:
    return name.startswith(TE_TENSOR_PREFIXES)


def is_lora_tensor(name: str) -> bool:
    """A tensor name of a LoRA file (kohya's ``lora_unet_`` / ``lora_te`` or a ``.lora_`` / ``lora_down`` module)."""
    return ".lora_" in name or "lora_down" in name or name.startswith(("lora_unet_", "lora_te"))


def prefix(component: str, n_text_encoders: int) -> str | None:
    """The tensor-name prefix of a pipeline component (None: kohya's format has none for it)."""
    if component in DENOISER_PREFIX:
        return DENOISER_PREFIX[component]
    if component == "text_encoder":
        return "lora_te" if n_text_encoders == 1 else "lora_te1"
    if component.startswith("text_encoder_"):
        return f"lora_te{component.rsplit('_', 1)[1]}"
    return None


def _match(value: object, table: tuple[tuple[str, str], ...]) -> str | None:
    if not isinstance(value, str):
        return None
    v = value.strip().lower()
    for start, name in table:
        if v.startswith(start):
            return name
    return None


def profile_name(metadata: Mapping[str, object]) -> str | None:
    """The bundled profile the parsed metadata names (modelspec architecture first, then the base version)."""
    return (_match(metadata.get("modelspec.architecture"), ARCHITECTURES)
            or _match(metadata.get("ss_base_model_version"), BASE_VERSIONS))


def clip_skip_overrides(slot: str, clip_skip: int) -> dict[str, object]:
    """sd-scripts' ``clip_skip N`` as profile overrides of a CLIP slot: ``hidden_states[-N]`` plus the final
    layer
    norm (library/strategy_sd.py encode_tokens)."""
    return {f"slots.{slot}.encoder.layer": -int(clip_skip), f"slots.{slot}.encoder.final_layer_norm": True}


# ------------------------------------------------------------------------------------------- in plain words
def onoff(v: object) -> str:
    if v is True:
        return "on"
    if v is False:
        return "off"
    return "-" if v is None else str(v)


def short(v: object, n: int = 60) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return s if len(s) <= n else s[: n - 1] + "…"


def describe(kohya: Mapping[str, object], text_encoder_tensors: int | None = None) -> list[str]:
    """Plain-words description of kohya sd-scripts' text-encoder keys (and of text-encoder LoRA tensors)."""
    lines: list[str] = []
    if text_encoder_tensors:
        lines.append(f"text-encoder weights in this file: {text_encoder_tensors} tensors (lora_te*/text_encoder*)")
    if not kohya:
        return [*lines, "no kohya sd-scripts text-encoder keys"]
    version = kohya.get("ss_base_model_version")
    if "ss_base_model_version" in kohya or "modelspec.architecture" in kohya:
        arch = kohya.get("modelspec.architecture")
        lines.append(f"base model {version if version is not None else '-'}" + (f" (modelspec {arch})" if arch else ""))
    if kohya.get("ss_v2") is True:
        lines.append("SD 2.x (--v2)")
    if kohya.get("ss_sd_model_name"):
        lines.append(f"trained on {short(kohya['ss_sd_model_name'], 100)}")
    if kohya.get("ss_model_prediction_type") is not None:
        lines.append(f"model prediction type {kohya['ss_model_prediction_type']}")
    if "ss_clip_skip" in kohya:
        skip = kohya["ss_clip_skip"]
        used = version is None or str(version).startswith("sd_v")
        note = "" if used else f"; not used by sd-scripts for {version}"
        if isinstance(skip, int):
            lines.append(f"clip_skip {skip} (sd-scripts: hidden_states[-{skip}] + final LN{note})")
        else:
            lines.append(f"clip_skip not set (sd-scripts: last layer, text_encoder(ids)[0]{note})")
    if "ss_max_token_length" in kohya:
        m = kohya["ss_max_token_length"]
        if isinstance(m, int):
            lines.append(f"CLIP max tokens {m} ({m // 75} windows of 75 tokens + BOS/EOS, concatenated)")
        else:
            lines.append("CLIP max tokens 75 (one 77-token window)")
    if "ss_t5xxl_max_token_length" in kohya:
        lines.append(f"T5 max tokens {kohya['ss_t5xxl_max_token_length']}")
    if "ss_apply_t5_attn_mask" in kohya:
        lines.append(f"T5 attention mask: {onoff(kohya['ss_apply_t5_attn_mask'])}")
    if "ss_apply_lg_attn_mask" in kohya:
        lines.append(f"CLIP-L/G attention mask: {onoff(kohya['ss_apply_lg_attn_mask'])}")
    if kohya.get("ss_network_train_unet_only") is True:
        lines.append("text encoder trained: no (network_train_unet_only)")
    if "ss_text_encoder_lr" in kohya:
        lr = kohya["ss_text_encoder_lr"]
        if lr is None:
            lines.append("text encoder lr not set (sd-scripts uses --learning_rate unless --network_train_unet_only)")
        elif lr in (0, 0.0, [], [0], [0.0]):
            lines.append(f"text encoder lr {lr} (text encoder frozen)")
        else:
            lines.append(f"text encoder lr {lr}")
    if "ss_caption_dropout_rate" in kohya or "ss_caption_tag_dropout_rate" in kohya:
        lines.append(
            f"caption dropout {onoff(kohya.get('ss_caption_dropout_rate'))}, "
            f"tag dropout {onoff(kohya.get('ss_caption_tag_dropout_rate'))}"
        )
    if "ss_weighted_captions" in kohya:
        lines.append(f"weighted captions: {onoff(kohya['ss_weighted_captions'])}")
    if kohya.get("ss_training_comment"):
        lines.append(f"training comment: {short(kohya['ss_training_comment'], 100)}")
    return lines


__all__ = ["ARCHITECTURES", "BASE_VERSIONS", "DENOISER_PREFIX", "METADATA_KEYS", "TE_TENSOR_PREFIXES",
           "clip_skip_overrides", "describe", "is_lora_tensor", "is_text_encoder_tensor", "parse_value", "prefix",
           "profile_name", "read"]
