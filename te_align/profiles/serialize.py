"""Profiles to and from plain dicts, TOML and JSON (lossless round trips)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from te_align import _schema as schema
from te_align import _toml as tomllib
from te_align.errors import ProfileError

# Re-exported where callers have always read them: profile_to_dict, profile_to_toml (te_align.profiles.dump),
# validate and its former name _validate (te_align.profiles.validate).
from te_align.profiles.dump import profile_to_dict as profile_to_dict
from te_align.profiles.dump import profile_to_toml as profile_to_toml
from te_align.profiles.model import (
    ADDED_FIELDS,
    NO_ENCODER,
    STATUSES,
    AlignmentProfile,
    Alternative,
    EncoderSpec,
    ImageSpec,
    MaskSpec,
    Provenance,
    SlotSpec,
    TokenizerSpec,
)
from te_align.profiles.validate import _validate as _validate
from te_align.profiles.validate import validate

_T = TypeVar("_T")

_TOP_KEYS = (
    "name",
    "family",
    "display_name",
    "repo",
    "pipeline",
    "aliases",
    "description",
    "empty_prompt",
    "slots",
    "outputs",
    "provenance",
    "fingerprint",
)
_SLOT_KEYS = ("tokenizer_subfolder", "encoder_subfolder", "train_dropout", "tokenizer_only", "tokenizer", "encoder", "masks", "images")


def set_dict_path(data: dict[str, Any], path: str, value: object) -> None:
    """Set a dotted path (``slots.t5.tokenizer.max_length``) in a profile dict; ``None`` removes the key."""
    parts = path.split(".")
    target = data
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    if value is None:
        target.pop(parts[-1], None)
    else:
        target[parts[-1]] = value


def _with_added_fields(tokenizer: object) -> object:
    """A tokenizer table written before a field of :data:`ADDED_FIELDS` existed gets the value version 1 behaved as."""
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("cls"), str):
        return tokenizer  # build_spec names the problem
    return {**{k: f(tokenizer["cls"]) for k, f in ADDED_FIELDS.items() if k not in tokenizer}, **tokenizer}


def profile_from_dict(data: object, *, file: str | None = None) -> AlignmentProfile:
    """Build and validate a profile from plain data (as read from TOML or JSON)."""
    if not isinstance(data, dict):
        raise ProfileError("expected a table at the top level", file=file)

    def take(
        table: dict[str, object], name: str, tp: object, key: str = "", default: object = schema.MISSING
    ) -> Any:
        return schema.take(table, name, tp, key=key, default=default, file=file, error=ProfileError)

    for k in data:
        if k not in _TOP_KEYS:
            raise schema.unknown_key(k, _TOP_KEYS, file=file, error=ProfileError)
    slots_raw = take(data, "slots", dict[str, Any])
    if not slots_raw:
        raise ProfileError("expected a table of one or more text-encoder slots", file=file, key="slots")
    slots = [_slot_from_dict(name, sdata, file) for name, sdata in slots_raw.items()]
    outputs_raw = take(data, "outputs", dict[str, str])
    if not outputs_raw:
        raise ProfileError("expected a table of output name = expression", file=file, key="outputs")
    prov = [(str(path), _provenance_from_dict(path, pdata, file))
            for path, pdata in take(data, "provenance", dict[str, Any], default={}).items()]
    hints = schema.hints(AlignmentProfile)
    name = take(data, "name", str)
    profile = AlignmentProfile(
        name=name,
        family=take(data, "family", str),
        display_name=take(data, "display_name", str, default=name),
        repo=take(data, "repo", str, default=""),
        pipeline=take(data, "pipeline", str, default=""),
        slots=tuple(slots),
        outputs=tuple(outputs_raw.items()),
        empty_prompt=take(data, "empty_prompt", hints["empty_prompt"], default="encode"),
        aliases=take(data, "aliases", tuple[str, ...], default=()),
        description=take(data, "description", str, default=""),
        provenance=tuple(prov),
    )
    validate(profile, file)
    if "fingerprint" in data:  # what `profile show --json` prints: checked, so an edited copy cannot pass as the original
        stated = take(data, "fingerprint", str)
        if stated != profile.fingerprint():
            raise ProfileError(
                f"fingerprint {stated} does not match the profile's behaviour values (their fingerprint is "
                f"{profile.fingerprint()}): the values were changed after it was written; remove the fingerprint key "
                "to use the values as they are", file=file, key="fingerprint")
    return profile


def _slot_from_dict(name: str, sdata: object, file: str | None) -> SlotSpec:
    where = f"slots.{name}"
    if not isinstance(sdata, dict):
        raise ProfileError(f"expected a table, got {sdata!r}", file=file, key=where)
    for k in sdata:
        if k not in _SLOT_KEYS:
            raise schema.unknown_key(f"{where}.{k}", _SLOT_KEYS, file=file, error=ProfileError)

    def take(field: str, tp: object, default: object = schema.MISSING) -> Any:
        return schema.take(sdata, field, tp, key=where, default=default, file=file, error=ProfileError)

    def spec(cls: type[_T], field: str, default: object = schema.MISSING) -> _T:
        raw = take(field, dict[str, Any], default)
        return schema.build(cls, raw, key=f"{where}.{field}", file=file, error=ProfileError)

    dropout = take("train_dropout", float | None, None)
    if dropout is not None and not 0.0 <= dropout <= 1.0:
        raise ProfileError(f"expected a probability in [0, 1], got {dropout}", file=file, key=f"{where}.train_dropout")
    tokenizer_only = take("tokenizer_only", bool, False)
    if tokenizer_only:
        # no encoder runs: no encoder table, and the encoder folder may be left out
        if "encoder" in sdata:
            raise ProfileError("a tokenizer_only slot has no encoder table", file=file, key=f"{where}.encoder")
        encoder = NO_ENCODER
        encoder_subfolder = take("encoder_subfolder", str, "")
    else:
        encoder = spec(EncoderSpec, "encoder")
        encoder_subfolder = take("encoder_subfolder", str)
    return SlotSpec(
        name=name,
        tokenizer_subfolder=take("tokenizer_subfolder", str),
        encoder_subfolder=encoder_subfolder,
        tokenizer=schema.build(
            TokenizerSpec, _with_added_fields(take("tokenizer", dict[str, Any])), key=f"{where}.tokenizer", file=file, error=ProfileError
        ),
        encoder=encoder,
        masks=spec(MaskSpec, "masks", {}),
        train_dropout=dropout,
        tokenizer_only=tokenizer_only,
        images=spec(ImageSpec, "images") if "images" in sdata else None,
    )


def _provenance_from_dict(path: str, pdata: object, file: str | None) -> Provenance:
    where = f"provenance.{path}"
    if not isinstance(pdata, dict):
        raise ProfileError("expected a table with source and status", file=file, key=where)

    def status(value: object, key: str) -> str:
        if value not in STATUSES:
            raise ProfileError(f"expected a status in {', '.join(STATUSES)}, got {value!r}", file=file, key=key)
        return value

    source = schema.take(pdata, "source", str, key=where, file=file, error=ProfileError)
    alts = []
    for i, a in enumerate(pdata.get("alternatives", [])):
        if not isinstance(a, dict) or "value" not in a or "source" not in a:
            raise ProfileError("expected a table with value, source and status", file=file, key=f"{where}.alternatives[{i}]")
        astatus = status(a.get("status", "unconfirmed"), f"{where}.alternatives[{i}].status")
        alts.append(Alternative(value=a["value"], source=str(a["source"]), status=astatus, note=str(a.get("note", ""))))
    return Provenance(
        source=source,
        status=status(schema.take(pdata, "status", str, key=where, file=file, error=ProfileError), f"{where}.status"),
        note=str(pdata.get("note", "")),
        alternatives=tuple(alts),
    )


def load_profile_file(path: str | Path) -> AlignmentProfile:
    """Load a profile from a .toml or .json file, with errors naming the file and key."""
    from te_align._paths import read_bytes

    path = Path(path)
    name = str(path)
    raw = read_bytes(path, ProfileError, what="profile file")
    kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(f"not valid {kind}: {e}", file=name) from None
    except RecursionError:
        raise ProfileError(f"not a usable {kind} file: tables or arrays are nested too deeply", file=name) from None
    return profile_from_dict(data, file=name)
