"""Validated user overrides of profile values (``profile("flux-schnell", t5_max_length=512)``)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from te_align.errors import ProfileError, closest
from te_align.profiles.model import AlignmentProfile, EncoderSpec, MaskSpec, TokenizerSpec

_PARTS = {"tokenizer": TokenizerSpec, "encoder": EncoderSpec, "masks": MaskSpec}
_TOP = ("empty_prompt",)


def _field_part(field: str) -> str | None:
    for part, cls in _PARTS.items():
        if field in {f.name for f in fields(cls)}:
            return part
    return None


def resolve_key(profile: AlignmentProfile, key: str) -> str:
    """Map an override key to its full dotted path, or raise naming the valid keys."""
    if key in _TOP:
        return key
    if key.startswith("outputs."):
        profile.get(key)
        return key
    path = None
    if key.startswith("slots."):
        path = key
    elif "." in key:
        slot, _, rest = key.partition(".")
        if rest == "train_dropout":
            path = f"slots.{slot}.train_dropout"
        elif "." in rest:
            path = f"slots.{slot}.{rest}"
        else:
            part = _field_part(rest)
            path = f"slots.{slot}.{part}.{rest}" if part else f"slots.{slot}.{rest}"
    else:
        for slot in sorted(profile.slot_names, key=len, reverse=True):
            if key.startswith(slot + "_"):
                rest = key[len(slot) + 1 :]
                if rest == "train_dropout":
                    path = f"slots.{slot}.train_dropout"
                else:
                    part = _field_part(rest)
                    path = f"slots.{slot}.{part}.{rest}" if part else f"slots.{slot}.{rest}"
                break
    valid = set(profile.behaviour_paths())
    if path is None or path not in valid:
        shorthand = [
            f"{s}_{p.rsplit('.', 1)[1]}" for s in profile.slot_names for p in valid if p.startswith(f"slots.{s}.")
        ]
        raise ProfileError(
            f"unknown override for profile '{profile.name}'{closest(key, [*shorthand, *valid])}; "
            "use SLOT_FIELD (t5_max_length), SLOT.FIELD or a dotted path such as slots.t5.tokenizer.max_length",
            key=key,
        )
    return path


#: Largest token count an override may set (no released text encoder reads more than this many tokens).
MAX_TOKENS = 1 << 16
#: Field name -> (smallest, largest) accepted integer value of an override (None stays allowed where the field allows it).
_INT_RANGES: dict[str, tuple[int, int]] = {
    "max_length": (1, MAX_TOKENS),
    "tokenize_max_length": (1, MAX_TOKENS),
    "min_length": (0, MAX_TOKENS),
    "drop_start_tokens": (0, MAX_TOKENS),
    "pad_token_id": (0, 1 << 24),
    "bos_token_id": (0, 1 << 24),
    "eos_token_id": (0, 1 << 24),
    "min_length_pad_id": (0, 1 << 24),
    "hidden_size": (1, 1 << 16),
    "num_layers": (1, 1024),
    "projection_dim": (1, 1 << 16),
    "max_position_embeddings": (1, 1 << 20),
    "vocab_size": (1, 1 << 24),
    "denoiser_extra_pad_tokens": (0, MAX_TOKENS),
}


def check_value(profile: AlignmentProfile, path: str, value: Any, key: str) -> None:
    """Refuse an override value that is out of range or nonsensical for its field (one line naming the key)."""
    import math

    from te_align._dtypes import DTYPE_NAMES

    field = path.rsplit(".", 1)[-1]

    def bad(message: str) -> ProfileError:
        return ProfileError(f"invalid override for profile '{profile.name}': {message}, got {value!r}", key=key)

    if isinstance(value, float) and not math.isfinite(value):
        raise bad("expected a finite number")
    if field in _INT_RANGES and value is not None:
        lo, hi = _INT_RANGES[field]
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad("expected an integer")
        if not lo <= value <= hi:
            raise bad(f"must be in [{lo}, {hi}]")
    if field == "dtype" and path.endswith("encoder.dtype") and value not in DTYPE_NAMES:
        raise bad(f"expected one of {', '.join(DTYPE_NAMES)}")
    if field == "train_dropout" and value is not None and not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
    ):
        raise bad("expected a probability in [0, 1]")


def apply_overrides(profile: AlignmentProfile, overrides: dict[str, Any]) -> AlignmentProfile:
    if not overrides:
        return profile
    from te_align.profiles.serialize import profile_from_dict, profile_to_dict, set_dict_path

    data = profile_to_dict(profile)
    prov = data["provenance"]
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ProfileError(f"override names must be non-empty strings, got {key!r}")
        path = resolve_key(profile, key)
        check_value(profile, path, value, key)
        old = profile.get(path)
        set_dict_path(data, path, value)
        before = profile.provenance_of(path)
        alts = []
        if before is not None:
            alts.append({"value": old if old is not None else "none", "source": before.source, "status": before.status})
        prov[path] = {
            "source": f"user override {key}={value!r}",
            "status": "override",
            "note": f"profile value was {old!r}",
            "alternatives": alts,
        }
    try:
        return profile_from_dict(data)
    except ProfileError as e:
        raise ProfileError(f"invalid override for profile '{profile.name}': {e.message}", key=e.key) from None
