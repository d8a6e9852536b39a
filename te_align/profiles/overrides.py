"""User overrides of profile values: the one way in, for every entry point.

A profile is a *source* (a bundled name, a profile file, a model folder, a checkpoint, a hub id: :func:`profile
<te_align.profiles.resolve.profile>`) plus *overrides*. Overrides reach te-align from

* Python keyword arguments: ``te_align.profile("flux-schnell", t5_max_length=512)``;
* config files: ai-toolkit's YAML ``te_align: overrides:``, ``te-align train``'s ``model.profile_overrides``,
  an A/B preset's ``model.profile_overrides``;
* the command line: ``--set KEY=VALUE`` (``profile show``, ``check``; ``swap --override``) — :func:`parse_set`;
* the environment: ``TE_ALIGN_OVERRIDES`` (a JSON object) for every trainer's hooks — :func:`env_overrides`;

and every one of them goes through :func:`resolve` (source + overrides, in layers where several apply: the
environment first, explicit arguments over it) and :func:`apply_overrides`: one key resolver (shorthand
``t5_max_length``, ``t5.max_length`` or the dotted path), one typed validator (each value checked against its
field's type hint by :mod:`te_align._schema`, then ranges, then the profile's cross-field rules) and a
``dataclasses.replace`` of the field, recorded in provenance with status ``override``. A mistake is one
:class:`~te_align.errors.ProfileError` line naming where the override came from, the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING

from te_align import _schema as schema
from te_align._dtypes import DTYPE_NAMES
from te_align.errors import ProfileError, closest
from te_align.profiles.model import (
    AlignmentProfile,
    Alternative,
    EncoderSpec,
    ImageSpec,
    MaskSpec,
    Provenance,
    SlotSpec,
    TokenizerSpec,
)
from te_align.profiles.resolve import profile as load
from te_align.profiles.serialize import validate

if TYPE_CHECKING:
    from pathlib import Path

    from te_align._types import JSONValue

#: Profile overrides for every trainer's hooks, a JSON object (``{"t5_max_length": 512}``).
ENV_OVERRIDES = "TE_ALIGN_OVERRIDES"
#: The profile every trainer's hooks use instead of the one they choose per model.
ENV_PROFILE = "TE_ALIGN_PROFILE"

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


def _hint(path: str) -> object:
    """The type hint of the field a resolved override path sets."""
    parts = path.split(".")
    if parts[0] == "outputs":
        return str | None  # an expression, or None: remove the output
    if parts[0] != "slots":
        return schema.hints(AlignmentProfile)[parts[0]]
    if len(parts) == 3:
        return schema.hints(SlotSpec)[parts[2]]
    cls = _PARTS[parts[2]]
    return schema.hints(cls)[parts[3]]


def _default(path: str) -> object:
    """The dataclass default of the field at ``path`` (``dataclasses.MISSING`` when it has none)."""
    parts = path.split(".")
    if parts[0] != "slots" or len(parts) < 4:
        cls, name = (SlotSpec, parts[-1]) if parts[0] == "slots" else (AlignmentProfile, parts[0])
    else:
        cls, name = _PARTS[parts[2]], parts[3]
    f = next(f for f in fields(cls) if f.name == name)
    return f.default


def typed_value(profile: AlignmentProfile, path: str, value: object, key: str) -> object:
    """``value`` checked against the type hint of the field at ``path`` (None: the field's default where the
    field takes no None), then against its range (:func:`check_value`)."""
    hint = _hint(path)
    if value is None and path.split(".")[0] != "outputs":
        try:
            schema.check(None, hint, key=key, error=ProfileError)
        except ProfileError:
            default = _default(path)
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


def _replace(profile: AlignmentProfile, path: str, value: object) -> AlignmentProfile:
    """``profile`` with the field at ``path`` replaced (``dataclasses.replace`` at each level)."""
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


# ------------------------------------------------------------------------------ the ways in
def parse_set(items: Iterable[str], *, origin: str = "--set") -> dict[str, JSONValue]:
    """``KEY=VALUE`` pairs (``--set``): values read as TOML scalars (512, true, "text", 0.5), else as strings."""
    from te_align import _toml as tomllib

    out: dict[str, JSONValue] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ProfileError(f"expected KEY=VALUE, got {item!r}", key=origin)
        text = raw.strip()
        if text.lower() in ("true", "false"):  # Python's True / False, as printed
            out[key.strip()] = text.lower() == "true"
            continue
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        except RecursionError:
            raise ProfileError(f"the value of {key.strip()} is nested too deeply", key=origin) from None
        out[key.strip()] = value
    return out


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, JSONValue]:
    """``TE_ALIGN_OVERRIDES`` (a JSON object), or {}; anything else is one :class:`ProfileError` line."""
    raw = (os.environ if environ is None else environ).get(ENV_OVERRIDES, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{ENV_OVERRIDES} is not valid JSON ({e.msg}); expected an object such as "
                           "'{\"t5_max_length\": 512}'") from None
    except RecursionError:
        raise ProfileError(f"{ENV_OVERRIDES} is nested too deeply") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{ENV_OVERRIDES} must be a JSON object, got {type(data).__name__}")
    return data


def env_profile(environ: Mapping[str, str] | None = None) -> str | None:
    """``TE_ALIGN_PROFILE`` (a profile source), or None."""
    value = (os.environ if environ is None else environ).get(ENV_PROFILE, "").strip()
    return value or None


def merge(*layers: tuple[str, Mapping[str, object] | None]) -> tuple[dict[str, object], dict[str, str]]:
    """Layers of overrides ``(origin, mapping)``, later ones winning: (the merged overrides, the origin of each)."""
    merged: dict[str, object] = {}
    origins: dict[str, str] = {}
    for origin, mapping in layers:
        if mapping is None:
            continue
        if not isinstance(mapping, Mapping):
            raise ProfileError(f"expected a table of profile overrides (key = value), got {type(mapping).__name__}",
                               file=origin or None)
        for k, v in mapping.items():
            merged.pop(k, None)  # keep the latest layer's order
            merged[k] = v
            origins[k] = origin
    return merged, origins


def resolve(
    source: str | Path | AlignmentProfile,
    *layers: tuple[str, Mapping[str, object] | None],
    env: bool = False,
    environ: Mapping[str, str] | None = None,
) -> AlignmentProfile:
    """The profile for ``source`` with overrides: the one function every entry point calls.

    ``layers`` are ``(origin, mapping)`` pairs, later ones winning (``("--set", {...})``,
    ``("config.process[0].te_align.overrides", {...})``); ``env=True`` puts ``TE_ALIGN_OVERRIDES`` first (the
    explicit layers win over it). An error names the origin of the key it is about."""
    if env:
        layers = (("TE_ALIGN_OVERRIDES", env_overrides(environ)), *layers)
    merged, origins = merge(*layers)
    base = load(source)
    if not merged:
        return base
    try:
        return _apply(base, merged)
    except ProfileError as e:
        origin = origins.get(e.key or "") if e.key else None
        if origin and not e.file:
            raise ProfileError(e.message, file=origin, key=e.key) from None
        raise


__all__ = [
    "ENV_OVERRIDES",
    "ENV_PROFILE",
    "apply_overrides",
    "canonical_key",
    "check_value",
    "env_overrides",
    "env_profile",
    "merge",
    "parse_set",
    "resolve",
    "typed_value",
]
