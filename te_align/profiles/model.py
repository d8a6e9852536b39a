"""The alignment profile: a frozen, typed description of how one model turns prompts into conditioning.

A profile is data. Behaviour lives in :class:`TokenizerSpec`, :class:`EncoderSpec`, :class:`MaskSpec`
(one of each per text-encoder *slot*) and in model-level rules (how slots combine into the tensors
the denoiser takes, what an empty prompt becomes). Where each value came from lives beside it in
``AlignmentProfile.provenance``, keyed by the value's dotted path (``slots.t5.tokenizer.max_length``).
The fingerprint hashes behaviour only, so rewording a source never invalidates a cache.

This module is the data only: reading and validating tables lives in :mod:`te_align.profiles.serialize`
(with :mod:`te_align._schema`), overrides in :mod:`te_align.profiles.overrides`. The convenience
methods :meth:`AlignmentProfile.with_overrides`, ``to_dict``, ``to_toml`` and ``to_json`` reach
them at call time; importing this module imports neither (nor torch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from te_align.errors import ProfileError, closest

# Function-local te_align imports in this module: would close an import loop at module level.

#: Provenance statuses, strongest first. ``override`` marks a value a user changed.
STATUSES = ("official", "derived-copy", "code", "paper", "inferred", "unconfirmed", "override")

Padding = Literal["max_length", "longest"]
PaddingSide = Literal["right", "left"]
TextCleaning = Literal["none", "basic", "wan", "pixart", "lower", "drop_img_tokens", "strip"]
TokenWindow = Literal["all", "bos_and_tail"]
Pooled = Literal["none", "pooler_output", "text_embeds", "first_eos"]
Repad = Literal["none", "batch_longest", "max_length"]
MaskDtype = Literal["int64", "bool", "embeds"]
EmptyPrompt = Literal["encode", "zeros"]
LayerName = Literal["last", "penultimate", "all"]
#: How several tapped layers (``encoder.layer`` a list of indices) become one tensor per token.
LayerCombine = Literal["concat", "interleave", "stack"]
TextTransform = Literal["none", "quoted_text"]
AbsentText = Literal["empty", "zeros"]
EncoderMaskDtype = Literal["int64", "float", "bool"]
PadTokenInPrompt = Literal["pad_id", "text"]
#: What the encoder is given as position ids: ``default``, none (the model numbers every position, padding
#: included); ``real_tokens``, ``cumsum(mask) - 1`` clamped at 0, so padding takes no position (Krea 2, Ideogram 4).
PositionIds = Literal["default", "real_tokens"]
#: What ``encoder.layer`` indices count: ``hidden_states`` (0 = the embeddings, the last entry is normed) or
#: ``decoder_layers`` (the raw output of decoder layer k, the last one before the final norm: Ideogram 4).
LayerTaps = Literal["hidden_states", "decoder_layers"]

FINGERPRINT_VERSION = 1


@dataclass(frozen=True)
class TokenizerSpec:
    """How prompts become token ids for one slot."""

    cls: str
    max_length: int
    padding: Padding = "max_length"
    truncation: bool = True
    add_special_tokens: bool = True
    pad_token: str | None = None
    pad_token_id: int | None = None
    bos_token: str | None = None
    bos_token_id: int | None = None
    eos_token: str | None = None
    eos_token_id: int | None = None
    padding_side: PaddingSide = "right"
    #: Pad to at least this many tokens even when ``padding == "longest"`` (SD3 reference code: 77;
    #: Anima: 1, for a batch whose prompts all tokenize to nothing).
    min_length: int | None = None
    #: Token id of the positions added to reach ``min_length`` (default: the pad token id). Anima's
    #: pipeline fills an empty batch with id 0, not its pad token.
    min_length_pad_id: int | None = None
    #: Text wrapped around the prompt before tokenizing; ``{prompt}`` and ``{system_prompt}`` are filled in.
    template: str = "{prompt}"
    system_prompt: str | None = None
    #: Template used for negative / unconditional prompts (Lumina 2 and Sana use the bare prompt).
    negative_template: str = "{prompt}"
    #: Truncation length handed to the tokenizer when it differs from ``max_length`` (Qwen-Image
    #: tokenizes up to 1024 + 34 and cuts the output to ``max_length`` afterwards).
    tokenize_max_length: int | None = None
    #: Token positions dropped from the front of the encoder output (Qwen-Image drops its 34-token
    #: chat prefix). The tokenizer is called with ``max_length + drop_start_tokens``.
    drop_start_tokens: int = 0
    #: ``bos_and_tail`` keeps position 0 and the last ``max_length - 1`` positions (Sana).
    token_window: TokenWindow = "all"
    text_cleaning: TextCleaning = "none"
    #: What of the prompt this slot encodes. ``quoted_text``: only the spans in '...', "...", ‘...’
    #: and “...” (found in that order), written as ``Text "span". `` and joined (HunyuanImage's
    #: ByT5 glyph text); a prompt without such a span has no text for this slot. Applied before
    #: ``text_cleaning`` and the template.
    text_transform: TextTransform = "none"
    #: What a prompt without text for this slot (see ``text_transform``) becomes: ``empty``, the
    #: empty string is encoded; ``zeros``, nothing is encoded and the sample gets zero embeddings
    #: and an all-zero mask (HunyuanImage's ByT5 slot). A tokenized sample whose mask is all zero is
    #: such a sample.
    absent_text: AbsentText = "empty"
    #: Long prompts can be encoded as chunks (``EncodeOptions.long_prompt_chunks``, the NovelAI
    #: method): ``max_length``-token pieces of BOS, body and EOS, each encoded alone (CLIP slots).
    chunkable: bool = False
    #: How the pad token, written literally in a prompt, tokenizes: ``pad_id``, as the tokenizer's
    #: special pad token (the hub SDXL/SD3 CLIP-G tokenizer, pad "!": every "!" becomes id 0);
    #: ``text``, as ordinary text (kohya sd-scripts' CLIP-G: "!" is BPE 256, "!!" 748; padding keeps
    #: the pad id).
    pad_token_in_prompt: PadTokenInPrompt = "pad_id"
    #: The chat template's thinking switch as the official pipeline sets it (``apply_chat_template(...,
    #: enable_thinking=...)``): True (Z-Image), False (FLUX.2 klein), None where the template has none. The
    #: template marks the place with ``{thinking}``, filled with ``thinking_off_text`` when this is False.
    enable_thinking: bool | None = None
    #: What the model's chat template writes at ``{thinking}`` when thinking is off (Qwen3: an empty
    #: ``<think>\n\n</think>\n\n`` block after the generation prompt); nothing is written when it is on.
    thinking_off_text: str = ""
    #: The template's part after ``{prompt}`` is tokenized on its own and appended after the padding,
    #: ``[prefix | prompt | PAD | suffix]`` (Krea 2); the prefix and prompt are padded and truncated to the
    #: tokenize length minus the suffix's token count.
    suffix_after_padding: bool = False
    #: With ``truncation = false``: a prompt whose rendered text is longer than the tokenize length is
    #: refused with an error instead of encoded wider (Ideogram 4 raises on it).
    refuse_over_length: bool = False


@dataclass(frozen=True)
class EncoderSpec:
    """Which encoder runs and which of its outputs become conditioning."""

    cls: str
    hidden_size: int
    num_layers: int
    projection_dim: int | None = None
    max_position_embeddings: int | None = None
    vocab_size: int | None = None
    #: ``last`` (last_hidden_state), ``penultimate`` (hidden_states[-2]), ``all``
    #: (every layer's output, hidden_states[1:], stacked), an index into hidden_states, or a list of
    #: indices into hidden_states whose states are combined per token by ``layer_combine`` (FLUX.2: 10, 20, 30).
    layer: LayerName | int | tuple[int, ...] = "last"
    #: How a list of ``layer`` indices becomes one tensor: ``concat``, the layers' widths side by side in list
    #: order (FLUX.2's stack on dim 1, permute and reshape: ``cat(dim=-1)``); ``interleave``, width-major with
    #: the layer index fastest (stack on the last dimension, then flatten it into the width); ``stack``, a
    #: layer axis after the sequence, (batch, sequence, layers, width).
    layer_combine: LayerCombine = "concat"
    #: Apply the encoder's final layer norm to the selected hidden state (CLIP clip-skip style).
    final_layer_norm: bool = False
    pooled: Pooled = "none"
    dtype: str = "float32"
    #: Run the encoder on one prompt at a time (batch of one), as pipelines that loop over prompts
    #: do (HunyuanImage's ByT5), so float results equal theirs whatever the batch.
    per_sample: bool = False
    #: Position ids handed to the encoder (:data:`PositionIds`).
    position_ids: PositionIds = "default"
    #: What the ``layer`` indices count (:data:`LayerTaps`).
    layer_taps: LayerTaps = "hidden_states"


@dataclass(frozen=True)
class ImageSpec:
    """How an edit model's condition images reach a vision-language text encoder (Qwen-Image-Edit).

    Each image is resized to about ``area`` pixels at its own aspect ratio (``resize = "round_32"``: width
    ``round(sqrt(area * w / h) / 32) * 32``, height ``round(width / (w / h) / 32) * 32``, the pipelines'
    ``calculate_dimensions``) with ``resample``, then the processor (``processor_subfolder``) expands every
    ``<|image_pad|>`` of the text and makes ``pixel_values`` and ``image_grid_thw`` for the encoder. ``prefix`` is
    the text written before the prompt once per image (``{n}``: the image's number from 1); "" where the
    template itself holds the vision tokens."""

    processor_subfolder: str = "processor"
    prefix: str = ""
    area: int = 1024 * 1024
    resize: Literal["round_32"] = "round_32"
    resample: Literal["lanczos", "bicubic", "bilinear", "nearest"] = "lanczos"


@dataclass(frozen=True)
class MaskSpec:
    """The three separate mask switches, plus how masked positions are trimmed."""

    #: The tokenizer's attention mask is passed into the text encoder.
    encoder: bool = False
    #: dtype of that mask: the tokenizer's int64, or ``float`` (float32, ``attention_mask.float()``:
    #: HunyuanImage's ByT5), or ``bool`` (``attention_mask.bool()``: Z-Image).
    encoder_mask_dtype: EncoderMaskDtype = "int64"
    #: Padded positions of the output embeddings are multiplied by zero.
    zero_padded: bool = False
    #: A mask is handed to the denoiser.
    denoiser: bool = False
    #: How many padding positions stay visible to the denoiser after the real tokens (Chroma: 1).
    denoiser_extra_pad_tokens: int = 0
    #: dtype of ``SLOT.denoiser_mask``: the tokenizer's int64, bool, or the embeddings' dtype (Chroma).
    denoiser_mask_dtype: MaskDtype = "int64"
    #: Drop masked positions per sample and re-pad with zeros to the batch's longest (Qwen-Image)
    #: or to ``max_length`` (Wan).
    repad: Repad = "none"


#: The ``encoder`` of a tokenizer-only slot: a placeholder that no code path runs or hashes.
NO_ENCODER = EncoderSpec(cls="", hidden_size=0, num_layers=0)


@dataclass(frozen=True)
class SlotSpec:
    """One text encoder of a model, with its tokenizer."""

    name: str
    tokenizer_subfolder: str
    encoder_subfolder: str
    tokenizer: TokenizerSpec
    encoder: EncoderSpec = field(default_factory=lambda: NO_ENCODER)
    masks: MaskSpec = field(default_factory=MaskSpec)
    #: Per-encoder caption dropout the model was trained with (SD3: 0.464), when known.
    train_dropout: float | None = None
    #: The slot is tokenized only: its token ids and mask go to the denoiser as they are and no
    #: encoder runs (Anima's T5 ids feed the LLM adapter in the DiT). Such a slot has no ``encoder``
    #: table and no ``hidden`` / ``pooled`` outputs.
    tokenizer_only: bool = False
    #: Condition images into the text encoder (edit models); None where the encoder reads text only.
    images: ImageSpec | None = None


@dataclass(frozen=True)
class Alternative:
    """A value another source gives for the same field."""

    value: Any
    source: str
    status: str
    note: str = ""


@dataclass(frozen=True)
class Provenance:
    """Where a value came from, and the values other sources give."""

    source: str
    status: str
    note: str = ""
    alternatives: tuple[Alternative, ...] = ()


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
        cached = self.__dict__.get("_fingerprint")
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
        from te_align.profiles.overrides import apply_overrides

        merged = dict(overrides or {})
        merged.update(kw)
        return apply_overrides(self, merged)  # the one typed validator (te_align.profiles.overrides)

    # ---------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        from te_align.profiles.serialize import profile_to_dict

        return profile_to_dict(self)

    def to_toml(self) -> str:
        from te_align.profiles.serialize import profile_to_toml

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
