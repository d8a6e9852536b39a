"""Changing a profile's values: the one key resolver (shorthand ``t5_max_length``, ``t5.max_length`` or the dotted
path), the one typed validator (each value against its field's type hint by :mod:`te_align._schema`, then ranges,
then the profile's cross-field rules) and a ``dataclasses.replace`` of the field, recorded in provenance with status
``override``. Every way overrides come in (:mod:`te_align.profiles.overrides`, which re-exports
:func:`apply_overrides`, :func:`canonical_key`, :func:`check_value` and :func:`typed_value`) and
:meth:`AlignmentProfile.with_overrides <te_align.profiles.model.AlignmentProfile.with_overrides>` end here.

It imports the profile model for type checking alone (a profile's own class comes from the profile), so that the
model's ``with_overrides`` calls it below the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from te_align import _schema as schema
from te_align._dtypes import DTYPE_NAMES
from te_align.errors import ProfileError, closest
from te_align.profiles.spec import (
    Alternative,
    EncoderSpec,
    ImageSpec,
    MaskSpec,
    Provenance,
    SlotSpec,
    TokenizerSpec,
)
from te_align.profiles.validate import validate

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles.model import AlignmentProfile

_PARTS = {"tokenizer": TokenizerSpec, "encoder": EncoderSpec, "masks": MaskSpec, "images": ImageSpec}
_TOP = ("empty_prompt",)


def _field_part(field: str) -> str | None:
    for part, cls in _PARTS.items():
        if field in {f.name for f in fields(cls)}:
            return part
    return None


def canonical_key(profile: AlignmentProfile, key: str) -> str:
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
    "area": (28 * 28, 1 << 26),  # an edit slot's condition-image pixel area (images.area)
}


def check_value(profile: AlignmentProfile, path: str, value: object, key: str) -> None:
    """Refuse an override value that is out of range or nonsensical for its field (one line naming the key)."""
    import math

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


def _hint(path: str, top: type) -> object:
    """The type hint of the field a resolved override path sets (``top``: the profile's class)."""
    parts = path.split(".")
    if parts[0] == "outputs":
        return str | None  # an expression, or None: remove the output
    if parts[0] != "slots":
        return schema.hints(top)[parts[0]]
    if len(parts) == 3:
        return schema.hints(SlotSpec)[parts[2]]
    cls = _PARTS[parts[2]]
    return schema.hints(cls)[parts[3]]


def _default(path: str, top: type) -> object:
    """The dataclass default of the field at ``path`` (``dataclasses.MISSING`` when it has none; ``top``: the
    profile's class)."""
    parts = path.split(".")
    if parts[0] != "slots" or len(parts) < 4:
        cls, name = (SlotSpec, parts[-1]) if parts[0] == "slots" else (top, parts[0])
    else:
        cls, name = _PARTS[parts[2]], parts[3]
    f = next(f for f in fields(cls) if f.name == name)
    return f.default


def typed_value(profile: AlignmentProfile, path: str, value: object, key: str) -> object:
    """``value`` checked against the type hint of the field at ``path`` (None: the field's default where the
    field takes no None), then against its range (:func:`check_value`)."""
    hint = _hint(path, type(profile))
    if value is None and path.split(".")[0] != "outputs":
        try:
            schema.check(None, hint, key=key, error=ProfileError)
        except ProfileError:
            default = _default(path, type(profile))
            if default is dataclasses.MISSING:
                raise ProfileError(f"invalid override for profile '{profile.name}': this value cannot be unset",
                                   key=key) from None
            value = default
    try:
        value = schema.check(value, hint, key=key, error=ProfileError)
    except ProfileError as e:
        raise ProfileError(f"invalid override for profile '{profile.name}': {e.message}", key=key) from None
    check_value(profile, path, value, key)
    return value


def _replace(profile: AlignmentProfile, path: str, value: Any) -> AlignmentProfile:
    """``profile`` with the field at ``path`` replaced (``dataclasses.replace`` at each level). ``value`` has been
    checked against that field's type hint (:func:`typed_value`); its static type depends on ``path``, hence Any."""
    parts = path.split(".")
    if parts[0] == "outputs":
        outputs = [(n, e) for n, e in profile.outputs if n != parts[1] or value is not None]
        if value is not None:
            outputs = [(n, value if n == parts[1] else e) for n, e in outputs]
            if parts[1] not in dict(outputs):
                outputs.append((parts[1], value))
        return dataclasses.replace(profile, outputs=tuple(outputs))
    if parts[0] != "slots":
        return dataclasses.replace(profile, **{parts[0]: value})
    slots = []
    for slot in profile.slots:
        if slot.name == parts[1]:
            if len(parts) == 3:
                slot = dataclasses.replace(slot, **{parts[2]: value})
            else:
                part = getattr(slot, parts[2])
                slot = dataclasses.replace(slot, **{parts[2]: dataclasses.replace(part, **{parts[3]: value})})
        slots.append(slot)
    return dataclasses.replace(profile, slots=tuple(slots))


def apply_overrides(profile: AlignmentProfile, overrides: Mapping[str, object], *, origin: str | None = None
                    ) -> AlignmentProfile:
    """``profile`` with validated ``overrides`` (key -> value), each recorded in provenance (status ``override``).

    ``origin`` names where the overrides came from (``--set``, ``TE_ALIGN_OVERRIDES``, a config key) in errors."""
    if not overrides:
        return profile
    try:
        return _apply(profile, overrides)
    except ProfileError as e:
        if origin and not e.file:
            raise ProfileError(e.message, file=origin, key=e.key) from None
        raise


def _apply(profile: AlignmentProfile, overrides: Mapping[str, object]) -> AlignmentProfile:
    prov = dict(profile.provenance)
    new = profile
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ProfileError(f"override names must be non-empty strings, got {key!r}")
        path = canonical_key(profile, key)
        value = typed_value(profile, path, value, key)
        old = profile.get(path)
        before = profile.provenance_of(path)
        alts = () if before is None else (Alternative(old if old is not None else "none", before.source, before.status),)
        new = _replace(new, path, value)
        prov[path] = Provenance(source=f"user override {key}={value!r}", status="override",
                                note=f"profile value was {old!r}", alternatives=alts)
    new = dataclasses.replace(new, provenance=tuple(prov.items()))
    try:
        validate(new, None)
    except ProfileError as e:
        shown = next((k for k in overrides if isinstance(k, str) and _same_path(profile, k, e.key)), e.key)
        raise ProfileError(f"invalid override for profile '{profile.name}': {e.message}", key=shown) from None
    return new


def _same_path(profile: AlignmentProfile, key: str, path: str | None) -> bool:
    try:
        return path is not None and canonical_key(profile, key) == path
    except ProfileError:
        return False


__all__ = ["MAX_TOKENS", "apply_overrides", "canonical_key", "check_value", "typed_value"]
