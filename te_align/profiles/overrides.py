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


def apply_overrides(profile: AlignmentProfile, overrides: dict[str, Any]) -> AlignmentProfile:
    if not overrides:
        return profile
    from te_align.profiles.serialize import profile_from_dict, profile_to_dict, set_dict_path

    data = profile_to_dict(profile)
    prov = data["provenance"]
    for key, value in overrides.items():
        path = resolve_key(profile, key)
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
