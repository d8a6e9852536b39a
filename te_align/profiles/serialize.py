"""Profiles to and from plain dicts, TOML and JSON (lossless round trips)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from te_align import _schema as schema
from te_align import _toml as tomllib
from te_align.errors import ProfileError, closest
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

# Function-local te_align imports in this module: would close an import loop at module level.

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


def _spec_to_dict(spec: object) -> dict[str, object]:
    return {f.name: getattr(spec, f.name) for f in fields(spec) if getattr(spec, f.name) is not None}


def profile_to_dict(p: AlignmentProfile) -> dict[str, object]:
    slots: dict[str, dict[str, object]] = {}
    for s in p.slots:
        d: dict[str, object] = {
            "tokenizer_subfolder": s.tokenizer_subfolder,
            "encoder_subfolder": s.encoder_subfolder,
        }
        if s.train_dropout is not None:
            d["train_dropout"] = s.train_dropout
        if s.tokenizer_only:
            d["tokenizer_only"] = True
        d["tokenizer"] = _spec_to_dict(s.tokenizer)
        if not s.tokenizer_only:
            d["encoder"] = _spec_to_dict(s.encoder)
        d["masks"] = _spec_to_dict(s.masks)
        if s.images is not None:
            d["images"] = _spec_to_dict(s.images)
        slots[s.name] = d
    prov: dict[str, dict[str, object]] = {}
    for path, pv in p.provenance:
        e: dict[str, object] = {"source": pv.source, "status": pv.status}
        if pv.note:
            e["note"] = pv.note
        if pv.alternatives:
            e["alternatives"] = [
                {k: v for k, v in (("value", a.value), ("source", a.source), ("status", a.status), ("note", a.note)) if v != ""}
                for a in pv.alternatives
            ]
        prov[path] = e
    return {
        "name": p.name,
        "family": p.family,
        "display_name": p.display_name,
        "repo": p.repo,
        "pipeline": p.pipeline,
        "aliases": list(p.aliases),
        "description": p.description,
        "empty_prompt": p.empty_prompt,
        "slots": slots,
        "outputs": dict(p.outputs),
        "provenance": prov,
    }


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


def _validate_images(s: SlotSpec, file: str | None) -> None:
    """An edit slot's ``images`` table: a positive pixel area, a processor component name, and a prefix that
    names only the image's number (``{n}``)."""
    where = f"slots.{s.name}.images"
    im = s.images
    assert im is not None
    if im.area < 28 * 28:
        raise ProfileError(f"expected a pixel area of at least 784 (one 28x28 merged patch), got {im.area}", file=file,
                           key=f"{where}.area")
    if not im.processor_subfolder.strip():
        raise ProfileError("expected the processor's component name (e.g. 'processor')", file=file,
                           key=f"{where}.processor_subfolder")
    if "{" in im.prefix.replace("{n}", ""):
        raise ProfileError("the prefix may hold only the {n} place (the image's number)", file=file, key=f"{where}.prefix")
    if s.tokenizer_only:
        raise ProfileError("a tokenizer-only slot runs no encoder to take images", file=file, key=where)


def validate(p: AlignmentProfile, file: str | None = None) -> None:
    """Cross-field checks: expressions name real slots, lengths are sane, provenance paths exist."""
    from te_align.profiles.expr import check_expression, output_specs, refs

    for s in p.slots:
        where = f"slots.{s.name}"
        t, e = s.tokenizer, s.encoder
        if t.max_length < 1:
            raise ProfileError(f"expected a positive max_length, got {t.max_length}", file=file, key=f"{where}.tokenizer.max_length")
        if e.max_position_embeddings is not None and t.max_length > e.max_position_embeddings:
            raise ProfileError(
                f"max_length {t.max_length} exceeds the encoder's max_position_embeddings {e.max_position_embeddings}",
                file=file,
                key=f"{where}.tokenizer.max_length",
            )
        for index in e.layer if isinstance(e.layer, tuple) else (e.layer,):
            if isinstance(index, int) and not -(e.num_layers + 1) <= index <= e.num_layers:
                raise ProfileError(
                    f"layer index {index} is outside hidden_states of a {e.num_layers}-layer encoder",
                    file=file,
                    key=f"{where}.encoder.layer",
                )
        if isinstance(e.layer, tuple) and not e.layer:
            raise ProfileError("expected one or more hidden_states indices", file=file, key=f"{where}.encoder.layer")
        if e.layer_combine != "concat" and not isinstance(e.layer, tuple):
            raise ProfileError("layer_combine applies to a list of layers; this slot taps one", file=file,
                               key=f"{where}.encoder.layer_combine")
        if "{thinking}" in t.template and t.enable_thinking is None:
            raise ProfileError("the template has a {thinking} place but enable_thinking is not set", file=file,
                               key=f"{where}.tokenizer.enable_thinking")
        if s.masks.denoiser_extra_pad_tokens < 0:
            raise ProfileError("expected a count >= 0", file=file, key=f"{where}.masks.denoiser_extra_pad_tokens")
        if s.images is not None:
            _validate_images(s, file)
        if "{prompt}" not in t.template:
            raise ProfileError("the template must contain {prompt}", file=file, key=f"{where}.tokenizer.template")
        if t.absent_text != "empty" and t.text_transform == "none":
            raise ProfileError(
                "absent_text applies to prompts a text_transform finds no text in; this slot has text_transform = \"none\"",
                file=file, key=f"{where}.tokenizer.absent_text",
            )
        if s.masks.encoder_mask_dtype != "int64" and not s.masks.encoder:
            raise ProfileError("encoder_mask_dtype needs masks.encoder = true (no mask goes into the encoder)",
                               file=file, key=f"{where}.masks.encoder_mask_dtype")
        if t.min_length_pad_id is not None and t.min_length is None:
            raise ProfileError("min_length_pad_id needs a min_length", file=file, key=f"{where}.tokenizer.min_length_pad_id")
        if s.tokenizer_only:
            for flag in ("encoder", "zero_padded"):
                if getattr(s.masks, flag):
                    raise ProfileError(f"a tokenizer_only slot has no encoder: masks.{flag} must be false", file=file, key=f"{where}.masks.{flag}")
            if s.masks.repad != "none" or t.token_window != "all" or t.drop_start_tokens:
                raise ProfileError(
                    "a tokenizer_only slot keeps its token ids as tokenized (no repad, token_window or drop_start_tokens)",
                    file=file, key=f"{where}.tokenizer",
                )
    tokenizer_only = {s.name for s in p.slots if s.tokenizer_only}
    for name, expr in p.outputs:
        node = check_expression(expr, p.slot_names, key=f"outputs.{name}", file=file)
        for r in refs(node):
            if r.slot in tokenizer_only and r.attr not in ("ids", "mask", "denoiser_mask"):
                raise ProfileError(
                    f"slot '{r.slot}' is tokenizer_only: it gives ids, mask and denoiser_mask, not {r.attr}", file=file, key=f"outputs.{name}"
                )
    try:
        output_specs(p)  # every output is one kind of tensor (embeddings, mask or ids)
    except ProfileError as e:
        raise ProfileError(e.message, file=file, key=e.key) from None
    valid = set(p.behaviour_paths())
    prefixes = {path.rsplit(".", i)[0] for path in valid for i in range(path.count(".") + 1)}
    for path, _ in p.provenance:
        if path not in prefixes:
            raise ProfileError(f"provenance for a field that does not exist{closest(path, sorted(prefixes))}", file=file, key=f"provenance.{path}")


#: The former name of :func:`validate`.
_validate = validate


def profile_to_toml(p: AlignmentProfile) -> str:
    import toml

    return toml.dumps(profile_to_dict(p))


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
