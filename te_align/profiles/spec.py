"""The parts of an alignment profile: one text-encoder slot's tokenizer, encoder, masks and images, the slot, and
provenance; the value types they take. A leaf: :mod:`te_align.profiles.model` (the profile itself, which re-exports
every name here) and the modules that read, check, change and write profiles import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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


__all__ = [
    "FINGERPRINT_VERSION", "NO_ENCODER", "STATUSES", "AbsentText", "Alternative", "EmptyPrompt",
    "EncoderMaskDtype", "EncoderSpec", "ImageSpec", "LayerCombine", "LayerName", "LayerTaps", "MaskDtype",
    "MaskSpec", "PadTokenInPrompt", "Padding", "PaddingSide", "Pooled", "PositionIds", "Provenance", "Repad",
    "SlotSpec", "TextCleaning", "TextTransform", "TokenWindow", "TokenizerSpec"
]
