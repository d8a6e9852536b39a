"""The alignment profile: a frozen, typed description of how one model turns prompts into conditioning.

A profile is data. Behaviour lives in :class:`TokenizerSpec`, :class:`EncoderSpec`, :class:`MaskSpec`
(one of each per text-encoder *slot*) and in model-level rules (how slots combine into the tensors
the denoiser takes, what an empty prompt becomes). Where each value came from lives beside it in
``AlignmentProfile.provenance``, keyed by the value's dotted path (``slots.t5.tokenizer.max_length``).
The fingerprint hashes behaviour only, so rewording a source never invalidates a cache.

This module is the data only: the parts of a profile live in :mod:`te_align.profiles.spec` (re-exported here);
reading tables lives in :mod:`te_align.profiles.serialize` (with :mod:`te_align._schema`), the cross-field checks in
:mod:`te_align.profiles.validate`, writing in :mod:`te_align.profiles.dump`, changing values in
:mod:`te_align.profiles.edit` and the ways overrides come in in :mod:`te_align.profiles.overrides`. The convenience
methods :meth:`AlignmentProfile.with_overrides`, ``to_dict``, ``to_toml`` and ``to_json`` reach edit and dump at
call time: those import this module only for type checking, so the imports run one way; importing this module
imports neither (nor torch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from te_align.errors import ProfileError, closest
from te_align.profiles.spec import (
    FINGERPRINT_VERSION,
    NO_ENCODER,
    STATUSES,
    AbsentText,
    Alternative,
    EmptyPrompt,
    EncoderMaskDtype,
    EncoderSpec,
    ImageSpec,
    LayerCombine,
    LayerName,
    LayerTaps,
    MaskDtype,
    MaskSpec,
    Padding,
    PaddingSide,
    PadTokenInPrompt,
    Pooled,
    PositionIds,
    Provenance,
    Repad,
    SlotSpec,
    TextCleaning,
    TextTransform,
    TokenizerSpec,
    TokenWindow,
)

# Function-local te_align imports in this module: keep the modules that build on the profile (editing, checking,
# writing it) and their imports off this module's import.


@dataclass(frozen=True)
class AlignmentProfile:
    """The exact text-conditioning recipe of one model."""

    name: str
    family: str
    display_name: str
    repo: str
    pipeline: str
    slots: tuple[SlotSpec, ...]
    #: Named conditioning tensors and the expression that builds each (see te_align.encoding).
    outputs: tuple[tuple[str, str], ...]
    empty_prompt: EmptyPrompt = "encode"
    aliases: tuple[str, ...] = ()
    #: Prose for people. A value it names is written as its dotted path in braces
    #: (``{slots.t5.tokenizer.max_length}``) so that :meth:`describe` says the profile's effective value.
    description: str = ""
    provenance: tuple[tuple[str, Provenance], ...] = ()

    # ----------------------------------------------------------------- display
    def __repr__(self) -> str:
        """One screen: name, family, fingerprint, one line per slot (tokenizer length and padding, encoder layer)
        and the overridden values. The fields themselves: ``dataclasses.asdict`` or :meth:`to_dict`."""
        lines = [f"<AlignmentProfile {self.name} (family {self.family}, fingerprint {self.fingerprint()})"]
        for s in self.slots:
            tok = s.tokenizer
            line = f"  {s.name}: {tok.cls} max_length={tok.max_length} padding={tok.padding}"
            if s.tokenizer_only:
                line += "; tokenized only"
            else:
                enc = s.encoder
                layer = _layers_text(enc.layer) + f" ({enc.layer_combine})" if isinstance(enc.layer, tuple) else enc.layer
                line += f"; {enc.cls} layer={layer}" + (f" pooled={enc.pooled}" if enc.pooled != "none" else "")
            masks = [m for m in ("encoder", "zero_padded", "denoiser") if getattr(s.masks, m)]
            if masks:
                line += f" masks={'+'.join(masks)}"
            lines.append(line)
        changed = [f"{path}={_short_value(self, path)} (was {_was(pv.note)})" for path, pv in self.provenance
                   if pv.status == "override"]
        if changed:
            lines.append("  overrides: " + ", ".join(changed))
        return "\n".join(lines) + ">"

    def describe(self) -> str:
        """:attr:`description` with each ``{dotted.path}`` replaced by this profile's value there, so an override
        (``t5_max_length=512``) is what the prose says. ``{dotted.path|VALUE=words|...}`` says a value in words
        (``{slots.t5.masks.encoder|true=with its mask|false=without a mask}``); ``*=words`` is used for any other
        value, with ``#`` standing for it; a value with no words is written as it is. A placeholder naming no value
        is left as written."""

        def fill(m: re.Match[str]) -> str:
            try:
                value = self.get(m.group(1))
            except ProfileError:
                return m.group(0)
            text = "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            words = dict(choice.split("=", 1) for choice in m.group(2).split("|")[1:])
            if text in words:
                return words[text]
            return words["*"].replace("#", text) if "*" in words else text

        return _PLACEHOLDER.sub(fill, self.description)

    # ----------------------------------------------------------------- lookups
    def slot(self, name: str) -> SlotSpec:
        for s in self.slots:
            if s.name == name:
                return s
        raise ProfileError(
            f"profile '{self.name}' has no text-encoder slot '{name}'; slots: "
            + ", ".join(self.slot_names)
            + closest(name, self.slot_names)
        )

    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.outputs)

    def get(self, path: str) -> Any:
        """The value at a dotted path such as ``slots.t5.tokenizer.max_length``."""
        return _get_path(self, path)

    def provenance_of(self, path: str) -> Provenance | None:
        """Provenance of a dotted path; falls back to the nearest enclosing path that has one."""
        table = dict(self.provenance)
        probe = path
        while probe:
            if probe in table:
                return table[probe]
            probe = probe.rpartition(".")[0]
        return None

    def behaviour_paths(self) -> list[str]:
        """Every dotted path of a behaviour value (what the fingerprint covers)."""
        return [p for p, _ in _walk_behaviour(self)]

    # ------------------------------------------------------------ fingerprint
    def behaviour(self) -> dict[str, Any]:
        """The behaviour fields only, as plain data (what the fingerprint hashes): every path of
        :meth:`behaviour_paths` except fields added after fingerprint version 1 that hold the value
        version 1 behaved as (:data:`ADDED_FIELDS`)."""
        return {p: v for p, v in _walk_behaviour(self, hashed=True)}

    def fingerprint(self) -> str:
        """A stable 16-hex-digit hash of the behaviour fields (not names, aliases or provenance)."""
        cached: str | None = self.__dict__.get("_fingerprint")
        if cached is not None:
            return cached
        payload = json.dumps(
            {"v": FINGERPRINT_VERSION, "behaviour": self.behaviour()}, sort_keys=True, separators=(",", ":")
        )
        value = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
        object.__setattr__(self, "_fingerprint", value)  # frozen: behaviour can never change afterwards
        return value

    # -------------------------------------------------------------- overrides
    def with_overrides(self, overrides: dict[str, Any] | None = None, /, **kw: Any) -> AlignmentProfile:
        """A copy with validated changes, each recorded in provenance with status ``override``.

        Keys are dotted paths (``slots.t5.tokenizer.max_length``), slot-relative paths
        (``t5.max_length``, ``t5.masks.encoder``) or shorthands (``t5_max_length``,
        ``clip_l_layer``, ``empty_prompt``).
        """
        from te_align.profiles.edit import apply_overrides

        merged = dict(overrides or {})
        merged.update(kw)
        return apply_overrides(self, merged)  # the one typed validator (te_align.profiles.edit)

    # ---------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        from te_align.profiles.dump import profile_to_dict

        return profile_to_dict(self)

    def to_toml(self) -> str:
        from te_align.profiles.dump import profile_to_toml

        return profile_to_toml(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)


#: A value named in a description: ``{slots.SLOT.PART.FIELD}``, ``{slots.SLOT.FIELD}``, ``{outputs.NAME}``, ``{family}``.
#: ``{dotted.path}`` or ``{dotted.path|VALUE=words|...}`` in a description (see :meth:`AlignmentProfile.describe`).
_PLACEHOLDER = re.compile(r"\{((?:slots|outputs)(?:\.\w+)+|family|empty_prompt)((?:\|[^{}|=]+=[^{}|]*)*)\}")


def _layers_text(layers: tuple[int, ...]) -> str:
    """A tapped-layer list for :meth:`AlignmentProfile.__repr__`: in full up to 12 indices, else its ends and count."""
    if len(layers) <= 12:
        return ",".join(map(str, layers))
    return f"{layers[0]},{layers[1]},…,{layers[-1]} [{len(layers)}]"


def _short_value(profile: AlignmentProfile, path: str) -> str:
    """The value at ``path`` for :meth:`AlignmentProfile.__repr__`, cut to 40 characters (``-``: removed)."""
    try:
        value = profile.get(path)
    except ProfileError:  # an output an override removed
        return "-"
    text = "-" if value is None else repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _was(note: str) -> str:
    """The old value an override's provenance note records (``profile value was 256``), cut to 40 characters."""
    text = note.removeprefix("profile value was ")
    return text if len(text) <= 40 else text[:39] + "…"


# ---------------------------------------------------------------------------- walking helpers
_BEHAVIOUR_TOP = ("family", "empty_prompt")


#: Tokenizer fields added after fingerprint version 1 -> the value version 1 behaved as, from the
#: tokenizer class. A profile file without the field gets that value, and a field at that value is left
#: out of the hash, so profile files and fingerprints (and embedding-cache keys) made before stay valid.
ADDED_FIELDS: dict[str, Callable[[str], Any]] = {
    "chunkable": lambda cls: cls.startswith("CLIP"),  # version 1 chunked the CLIP tokenizer classes
    "pad_token_in_prompt": lambda cls: "pad_id",
    "enable_thinking": lambda cls: None,
    "thinking_off_text": lambda cls: "",
    "suffix_after_padding": lambda cls: False,
    "refuse_over_length": lambda cls: False,
}
#: Encoder fields added after fingerprint version 1 -> the value version 1 behaved as (left out of the hash there).
ADDED_ENCODER_FIELDS: dict[str, Any] = {"layer_combine": "concat", "position_ids": "default", "layer_taps": "hidden_states"}


def _walk_behaviour(profile: AlignmentProfile, *, hashed: bool = False) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [(k, getattr(profile, k)) for k in _BEHAVIOUR_TOP]
    for slot in profile.slots:
        base = f"slots.{slot.name}"
        out.append((f"{base}.train_dropout", slot.train_dropout))
        out.append((f"{base}.tokenizer_only", slot.tokenizer_only))
        for part in ("tokenizer", "masks") if slot.tokenizer_only else ("tokenizer", "encoder", "masks"):
            spec = getattr(slot, part)
            for f in fields(spec):
                value = getattr(spec, f.name)
                if hashed and part == "tokenizer" and f.name in ADDED_FIELDS and value == ADDED_FIELDS[f.name](spec.cls):
                    continue
                if hashed and part == "encoder" and f.name in ADDED_ENCODER_FIELDS and value == ADDED_ENCODER_FIELDS[f.name]:
                    continue
                out.append((f"{base}.{part}.{f.name}", value))
        if slot.images is not None:  # only edit profiles have images: every other fingerprint is unchanged
            out.extend((f"{base}.images.{f.name}", getattr(slot.images, f.name)) for f in fields(slot.images))
    for name, expr in profile.outputs:
        out.append((f"outputs.{name}", expr))
    return out


def _get_path(profile: AlignmentProfile, path: str) -> Any:
    parts = path.split(".")
    if parts[0] == "slots" and len(parts) >= 2:
        obj: Any = profile.slot(parts[1])
        rest = parts[2:]
    elif parts[0] == "outputs" and len(parts) == 2:
        table = dict(profile.outputs)
        if parts[1] not in table:
            raise ProfileError(f"profile '{profile.name}' has no output '{parts[1]}'", key=path)
        return table[parts[1]]
    else:
        obj = profile
        rest = parts
    for p in rest:
        if not dataclasses.is_dataclass(obj) or p not in {f.name for f in fields(obj)}:
            raise ProfileError(f"no such profile field '{p}'", key=path)
        obj = getattr(obj, p)
    return obj


__all__ = [
    "ADDED_ENCODER_FIELDS", "ADDED_FIELDS", "FINGERPRINT_VERSION", "NO_ENCODER", "STATUSES", "AbsentText",
    "AlignmentProfile", "Alternative", "EmptyPrompt", "EncoderMaskDtype", "EncoderSpec", "ImageSpec",
    "LayerCombine", "LayerName", "LayerTaps", "MaskDtype", "MaskSpec", "PadTokenInPrompt", "Padding",
    "PaddingSide", "Pooled", "PositionIds", "Provenance", "Repad", "SlotSpec", "TextCleaning",
    "TextTransform", "TokenWindow", "TokenizerSpec"
]
