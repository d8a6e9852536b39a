"""Profiles to and from plain dicts, TOML and JSON (lossless round trips)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from te_align.errors import ProfileError, closest
from te_align.profiles.model import (
    ADDED_FIELDS,
    NO_ENCODER,
    STATUSES,
    AlignmentProfile,
    Alternative,
    EncoderSpec,
    MaskSpec,
    Provenance,
    SlotSpec,
    TokenizerSpec,
    build_spec,
    coerce,
    spec_hints,
)

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
)
_SLOT_KEYS = ("tokenizer_subfolder", "encoder_subfolder", "train_dropout", "tokenizer_only", "tokenizer", "encoder", "masks")


def _spec_to_dict(spec: Any) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in fields(spec) if getattr(spec, f.name) is not None}


def profile_to_dict(p: AlignmentProfile) -> dict[str, Any]:
    slots: dict[str, Any] = {}
    for s in p.slots:
        d: dict[str, Any] = {
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
        slots[s.name] = d
    prov: dict[str, Any] = {}
    for path, pv in p.provenance:
        e: dict[str, Any] = {"source": pv.source, "status": pv.status}
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


def set_dict_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path (``slots.t5.tokenizer.max_length``) in a profile dict; ``None`` removes the key."""
    parts = path.split(".")
    target = data
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    if value is None:
        target.pop(parts[-1], None)
    else:
        target[parts[-1]] = value


def _with_added_fields(tokenizer: Any) -> Any:
    """A tokenizer table written before a field of :data:`ADDED_FIELDS` existed gets the value version 1 behaved as."""
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("cls"), str):
        return tokenizer  # build_spec names the problem
    return {**{k: f(tokenizer["cls"]) for k, f in ADDED_FIELDS.items() if k not in tokenizer}, **tokenizer}


def _req(data: dict[str, Any], key: str, file: str | None, where: str = "") -> Any:
    if key not in data:
        raise ProfileError(f"missing required field '{key}'", file=file, key=f"{where}{key}")
    return data[key]


def profile_from_dict(data: Any, *, file: str | None = None) -> AlignmentProfile:
    """Build and validate a profile from plain data (as read from TOML or JSON)."""
    if not isinstance(data, dict):
        raise ProfileError("expected a table at the top level", file=file)
    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise ProfileError(f"unknown field '{unknown[0]}'{closest(unknown[0], _TOP_KEYS)}", file=file, key=unknown[0])
    hints = spec_hints(AlignmentProfile)
    slots_raw = _req(data, "slots", file)
    if not isinstance(slots_raw, dict) or not slots_raw:
        raise ProfileError("expected a table of one or more text-encoder slots", file=file, key="slots")
    slots = []
    for sname, sdata in slots_raw.items():
        where = f"slots.{sname}"
        if not isinstance(sdata, dict):
            raise ProfileError("expected a table", file=file, key=where)
        bad = [k for k in sdata if k not in _SLOT_KEYS]
        if bad:
            raise ProfileError(f"unknown field '{bad[0]}'{closest(bad[0], _SLOT_KEYS)}", file=file, key=f"{where}.{bad[0]}")
        dropout = sdata.get("train_dropout")
        if dropout is not None:
            dropout = coerce(dropout, float, key=f"{where}.train_dropout", file=file)
            if not 0.0 <= dropout <= 1.0:
                raise ProfileError(f"expected a probability in [0, 1], got {dropout}", file=file, key=f"{where}.train_dropout")
        tokenizer_only = coerce(sdata.get("tokenizer_only", False), bool, key=f"{where}.tokenizer_only", file=file)
        if tokenizer_only:
            # no encoder runs: no encoder table, and the encoder folder may be left out
            if "encoder" in sdata:
                raise ProfileError("a tokenizer_only slot has no encoder table", file=file, key=f"{where}.encoder")
            encoder = NO_ENCODER
            encoder_subfolder = coerce(sdata.get("encoder_subfolder", ""), str, key=f"{where}.encoder_subfolder", file=file)
        else:
            encoder = build_spec(EncoderSpec, _req(sdata, "encoder", file, where + "."), key=f"{where}.encoder", file=file)
            encoder_subfolder = coerce(_req(sdata, "encoder_subfolder", file, where + "."), str, key=f"{where}.encoder_subfolder", file=file)
        slots.append(
            SlotSpec(
                name=sname,
                tokenizer_subfolder=coerce(_req(sdata, "tokenizer_subfolder", file, where + "."), str, key=f"{where}.tokenizer_subfolder", file=file),
                encoder_subfolder=encoder_subfolder,
                tokenizer=build_spec(
                    TokenizerSpec, _with_added_fields(_req(sdata, "tokenizer", file, where + ".")), key=f"{where}.tokenizer", file=file
                ),
                encoder=encoder,
                masks=build_spec(MaskSpec, sdata.get("masks", {}), key=f"{where}.masks", file=file),
                train_dropout=dropout,
                tokenizer_only=tokenizer_only,
            )
        )
    outputs_raw = _req(data, "outputs", file)
    if not isinstance(outputs_raw, dict) or not outputs_raw:
        raise ProfileError("expected a table of output name = expression", file=file, key="outputs")
    outputs = tuple((str(k), coerce(v, str, key=f"outputs.{k}", file=file)) for k, v in outputs_raw.items())
    prov = []
    for path, pdata in (data.get("provenance") or {}).items():
        where = f"provenance.{path}"
        if not isinstance(pdata, dict):
            raise ProfileError("expected a table with source and status", file=file, key=where)
        status = coerce(_req(pdata, "status", file, where + "."), str, key=f"{where}.status", file=file)
        if status not in STATUSES:
            raise ProfileError(f"expected a status in {', '.join(STATUSES)}, got {status!r}", file=file, key=f"{where}.status")
        alts = []
        for i, a in enumerate(pdata.get("alternatives", [])):
            if not isinstance(a, dict) or "value" not in a or "source" not in a:
                raise ProfileError("expected a table with value, source and status", file=file, key=f"{where}.alternatives[{i}]")
            astatus = a.get("status", "unconfirmed")
            if astatus not in STATUSES:
                raise ProfileError(f"expected a status in {', '.join(STATUSES)}, got {astatus!r}", file=file, key=f"{where}.alternatives[{i}].status")
            alts.append(Alternative(value=a["value"], source=str(a["source"]), status=astatus, note=str(a.get("note", ""))))
        prov.append(
            (
                str(path),
                Provenance(
                    source=coerce(_req(pdata, "source", file, where + "."), str, key=f"{where}.source", file=file),
                    status=status,
                    note=str(pdata.get("note", "")),
                    alternatives=tuple(alts),
                ),
            )
        )
    profile = AlignmentProfile(
        name=coerce(_req(data, "name", file), str, key="name", file=file),
        family=coerce(_req(data, "family", file), str, key="family", file=file),
        display_name=coerce(data.get("display_name", data.get("name", "")), str, key="display_name", file=file),
        repo=coerce(data.get("repo", ""), str, key="repo", file=file),
        pipeline=coerce(data.get("pipeline", ""), str, key="pipeline", file=file),
        slots=tuple(slots),
        outputs=outputs,
        empty_prompt=coerce(data.get("empty_prompt", "encode"), hints["empty_prompt"], key="empty_prompt", file=file),
        aliases=coerce(data.get("aliases", []), tuple[str, ...], key="aliases", file=file),
        description=coerce(data.get("description", ""), str, key="description", file=file),
        provenance=tuple(prov),
    )
    _validate(profile, file)
    return profile


def _validate(p: AlignmentProfile, file: str | None) -> None:
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
        if isinstance(e.layer, int) and not -(e.num_layers + 1) <= e.layer <= e.num_layers:
            raise ProfileError(
                f"layer index {e.layer} is outside hidden_states of a {e.num_layers}-layer encoder",
                file=file,
                key=f"{where}.encoder.layer",
            )
        if s.masks.denoiser_extra_pad_tokens < 0:
            raise ProfileError("expected a count >= 0", file=file, key=f"{where}.masks.denoiser_extra_pad_tokens")
        if "{prompt}" not in t.template:
            raise ProfileError("the template must contain {prompt}", file=file, key=f"{where}.tokenizer.template")
        if t.absent_text != "empty" and t.text_transform == "none":
            raise ProfileError(
                "absent_text applies to prompts a text_transform finds no text in; this slot has text_transform = \"none\"",
                file=file, key=f"{where}.tokenizer.absent_text",
            )  # fmt: skip
        if s.masks.encoder_mask_dtype != "int64" and not s.masks.encoder:
            raise ProfileError("encoder_mask_dtype needs masks.encoder = true (no mask goes into the encoder)",
                               file=file, key=f"{where}.masks.encoder_mask_dtype")  # fmt: skip
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
                )  # fmt: skip
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


def profile_to_toml(p: AlignmentProfile) -> str:
    import toml

    return toml.dumps(profile_to_dict(p))


def load_profile_file(path: str | Path) -> AlignmentProfile:
    """Load a profile from a .toml or .json file, with errors naming the file and key."""
    path = Path(path)
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ProfileError(f"cannot read profile file: {e.strerror}", file=name) from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ProfileError(f"not valid JSON: {e}", file=name) from None
    else:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ProfileError(f"not valid TOML: {e}", file=name) from None
    return profile_from_dict(data, file=name)
