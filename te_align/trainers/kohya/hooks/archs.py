"""One row per sd-scripts architecture: everything te-align's kohya hooks know about it.

An :class:`Arch` names sd-scripts' strategy module and classes (``library/strategy_<arch>.py`` at
kohya-ss/sd-scripts 48d368f), the tokenize-strategy attribute of each tokenizer and the profile slot
it is, the parameters of every method replaced, and the architecture's own steps: how the profile's
tokens are packed into sd-scripts' token layout and how ``encode_tokens``' outputs are laid out. Its
default profile comes from the trainer table :mod:`te_align.trainers.kohya`. :meth:`Arch.targets`
declares every function replaced for it, each with its wrapper.

The logic shared by every architecture is in :mod:`~te_align.trainers.kohya.hooks.slots`; here are only the
differences, one function per difference, named after the architecture.

HunyuanImage-2.1 (``hunyuanimage-2.1``): both tokenizers pad to the profile's fixed lengths (Qwen 1000 + 34,
ByT5 128) so per-caption tokens and cached outputs keep one shape; see :func:`_tokenize_hunyuan` and
:func:`_encode_hunyuan` for what differs from sd-scripts' own encoding.

Anima: sd-scripts caches TE outputs per caption and collates them later, so its tokenize strategy
pads both tokenizers to a fixed length. The hooks keep that fixed shape: the profile's tokens are
padded to its ``max_length`` (512), and ``encode_tokens`` encodes the batch cut back to its longest
caption (the profile's ``padding = "longest"``), then pads the states with zeros and the mask with 0.
The result is the official encoding zero-padded to 512 (bit for bit), and padding positions get zero
weight in the denoiser's text conditioner (see :func:`_encode_anima`): equivalent in exact arithmetic,
with float differences at rounding level (the attention reduces over 512 instead of the batch's longest
keys), as between official batches of different composition. The T5 ids / mask pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from te_align._lazy import lazy_module
from te_align.hooks.base import HookError, Target, mark_wrapper
from te_align.trainers.kohya import names as table
from te_align.trainers.kohya.hooks import caches, sample, slots, weights
from te_align.trainers.kohya.hooks.run import ENV_OVERRIDES, RUN, chunk_options, with_clip_skip

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from te_align.encoding import core as _core
    from te_align.profiles import AlignmentProfile
    from te_align.profiles.model import SlotSpec
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")

#: sd-scripts' text encoders as ``encode_tokens`` gets them (None where a run has no such encoder).
Models = Sequence["torch.nn.Module | None"]
#: sd-scripts' token layout: what ``tokenize`` returns and ``encode_tokens`` gets (None: an absent part).
Tokens = Sequence["torch.Tensor | None"]
#: ``encode_tokens``' outputs in sd-scripts' layout (None: an output the batch does not have).
Outputs = list["torch.Tensor | None"]
#: ``tokenize(arch, profile, strategy, texts, negative)`` -> sd-scripts' token layout
Tokenize = Callable[["Arch", "AlignmentProfile", object, list[str], bool], Tokens]
#: ``encode(arch, profile, encoding strategy, tokenize strategy, models, tokens, **extra parameters)`` -> outputs
Encode = Callable[..., Outputs]


@dataclass(frozen=True)
class Weighted:
    """sd-scripts' ``--weighted_captions`` path of an architecture (:mod:`~te_align.trainers.kohya.hooks.weights`)."""

    #: ``encode_tokens_with_weights`` parameters.
    encode_params: tuple[str, ...]
    #: Where sd-scripts applies (or ignores) the weights.
    source: str
    #: sd-scripts multiplies the hidden states by the weights (else it tokenizes the caption as written).
    applied: bool = True
    #: Outputs of ``encode_tokens`` that are weighted (the first n); the rest (a pooled output) are not.
    hidden_outputs: int = 1
    pooled: bool = False
    #: Sample images take this path too.
    samples: bool = False
    #: The encoder named where no weights are applied.
    encoder: str = ""


@dataclass(frozen=True)
class Arch:
    """One sd-scripts architecture: its strategy classes and how sd-scripts' tensors map to profile slots."""

    name: str
    module: str
    tokenize_cls: str
    encode_cls: str
    cache_cls: str | None
    #: tokenize-strategy attribute holding each slot's tokenizer, in sd-scripts' order.
    tokenizers: tuple[str, ...]
    #: the profile slot of each tokenizer (None: the profile's only slot, whatever its name).
    slots: tuple[str | None, ...]
    #: the profile's tokens (a list of (ids, mask) per tokenizer, or the texts) -> sd-scripts' token layout.
    tokenize: Tokenize
    encode: Encode
    tokenize_params: tuple[str, ...] = ("self", "text")
    encode_params: tuple[str, ...] = ("self", "tokenize_strategy", "models", "tokens")
    #: name of ``cache_batch_outputs``' last parameter.
    cache_batch_param: str = "infos"
    #: CLIP long-prompt chunks from ``--max_token_length`` (SD1/2, SDXL).
    chunkable: bool = False
    weighted: Weighted | None = None
    #: the LoRA network module whose ``LoRANetwork.save_weights`` gets the stamp.
    network: str | None = None
    #: facts read from the models an encode or cache call gets (Flux: Chroma's dummy CLIP-L).
    observe: Callable[[Models], None] | None = None
    #: architecture-specific notes on sd-scripts settings the profile replaces (logged once).
    notes: Callable[[object, AlignmentProfile], None] | None = None
    #: further targets of this architecture (sample pipelines, sd-scripts' own checkpoint analysis).
    extra: Callable[[Arch], tuple[Target, ...]] = field(default=lambda arch: ())

    @property
    def default_profile(self) -> str:
        """The bundled profile a run of this architecture follows when none is chosen (variants aside)."""
        return table.ARCH_PROFILES[self.name]

    def targets(self) -> list[Target]:
        """Every function or method replaced for this architecture, with its wrapper."""
        m = self.module
        out = [
            Target(m, f"{self.tokenize_cls}.tokenize", self.tokenize_params, wrap=partial(tokenize_wrapper, self)),
            Target(m, f"{self.encode_cls}.encode_tokens", self.encode_params, wrap=partial(encode_wrapper, self)),
        ]
        if self.cache_cls:
            out.append(Target(m, f"{self.cache_cls}.is_disk_cached_outputs_expected", ("self", "npz_path"),
                              wrap=partial(caches.cache_check_wrapper, self, cache_fingerprint)))
            out.append(Target(m, f"{self.cache_cls}.cache_batch_outputs",
                              ("self", "tokenize_strategy", "models", "text_encoding_strategy", self.cache_batch_param),
                              wrap=partial(caches.cache_write_wrapper, self, cache_fingerprint)))
        if self.weighted is not None:
            out.append(Target(m, f"{self.tokenize_cls}.tokenize_with_weights", ("self", "text"),
                              wrap=partial(weights.tokenize_with_weights_wrapper, self)))
            out.append(Target(m, f"{self.encode_cls}.encode_tokens_with_weights", self.weighted.encode_params,
                              wrap=partial(weights.encode_tokens_with_weights_wrapper, self)))
        out.extend(self.extra(self))
        return out


# ------------------------------------------------------------------------------ the replacements
def tokenize_wrapper(arch: Arch, original: Callable[..., object]) -> Callable[..., object]:
    """``tokenize(self, text[, is_negative])``: the profile's tokens in sd-scripts' layout."""

    def tokenize(self: object, text: str | Sequence[str], is_negative: bool = False) -> Tokens:
        return slots.tokenize(arch, self, text, negative=is_negative)

    return mark_wrapper(tokenize, original)


def encode_wrapper(arch: Arch, original: Callable[..., object]) -> Callable[..., object]:
    """``encode_tokens(self, tokenize_strategy, models, tokens, ...)``: the profile's encoding in sd-scripts' layout;
    the architecture's further parameters (:attr:`Arch.encode_params`) are passed on by name."""
    extra = arch.encode_params[4:]

    def encode_tokens(self: object, tokenize_strategy: object, models: Models, tokens: Tokens, *args: object,
                      **kwargs: object) -> Outputs:
        kwargs.update(zip(extra, args, strict=False))
        return slots.encode(arch, self, tokenize_strategy, models, tokens, **kwargs)

    return mark_wrapper(encode_tokens, original)


def _stamp_target(network: str) -> Target:
    return Target(network, "LoRANetwork.save_weights", ("self", "file", "dtype", "metadata"), wrap=caches.stamping_save)


# ------------------------------------------------------------------------------ SD 1.x / 2.x, SDXL
def _tokenize_sd(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> Tokens:
    """``[ids]`` with sd-scripts' chunk axis: (B, 1, L)."""
    parts = slots.tokenize_slots(arch, p, strategy, texts, negative)
    return [parts[0][0].unsqueeze(1)]


def _encode_sd(arch: Arch, p: AlignmentProfile, self: object, tokenize_strategy: object, models: Models,
               tokens: Tokens, **_: object) -> Outputs:
    """``[hidden]``; sd-scripts' ``--clip_skip`` taken as a profile override (:func:`~.run.with_clip_skip`)."""
    p = with_clip_skip(p, getattr(self, "clip_skip", None))
    return [slots.slot_encode(p, p.slots[0].name, models[0], slots.one_chunk(tokens[0], arch.name), None).hidden]


def _tokenize_sdxl(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> Tokens:
    """``(clip_l ids, clip_g ids)``, each (B, 1, L)."""
    parts = slots.tokenize_slots(arch, p, strategy, texts, negative)
    return (parts[0][0].unsqueeze(1), parts[1][0].unsqueeze(1))


def _encode_sdxl(arch: Arch, p: AlignmentProfile, self: object, tokenize_strategy: object, models: Models,
                 tokens: Tokens, **_: object) -> Outputs:
    """``[clip_l hidden, clip_g hidden, clip_g pooled]``."""
    r1 = slots.slot_encode(p, "clip_l", models[0], slots.one_chunk(tokens[0], arch.name), None)
    r2 = slots.slot_encode(p, "clip_g", models[1], slots.one_chunk(tokens[1], arch.name), None)
    return [r1.hidden, r2.hidden, r2.pooled]


def _sample_targets_sd(arch: Arch) -> tuple[Target, ...]:
    """SD1/2 sample images: the lpw pipeline's own embeddings and its ``__call__`` (te_align.trainers.kohya.hooks.sample)."""
    m = "library.lpw_stable_diffusion"
    return (
        Target(m, "get_weighted_text_embeddings",
               ("pipe", "prompt", "uncond_prompt", "max_embeddings_multiples", "no_boseos_middle", "skip_parsing", "skip_weighting", "clip_skip"),
               wrap=partial(sample.lpw_embeddings_wrapper, arch)),
        Target(m, "StableDiffusionLongPromptWeightingPipeline.__call__", ("self", "prompt", "negative_prompt"),
               wrap=partial(sample.pipeline_call_wrapper, arch)),
    )


def _sample_targets_sdxl(arch: Arch) -> tuple[Target, ...]:
    """SDXL sample images: the lpw pipeline's ``__call__`` (its encoding is the hooked weighted path)."""
    return (
        Target("library.sdxl_lpw_stable_diffusion", "SdxlStableDiffusionLongPromptWeightingPipeline.__call__",
               ("self", "prompt", "negative_prompt"), wrap=partial(sample.pipeline_call_wrapper, arch)),
    )


# ------------------------------------------------------------------------------------------ SD3
def _tokenize_sd3(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> Tokens:
    """``[l ids, g ids, t5 ids, l mask, g mask, t5 mask]``."""
    parts = slots.tokenize_slots(arch, p, strategy, texts, negative)
    return [parts[0][0], parts[1][0], parts[2][0], parts[0][1], parts[1][1], parts[2][1]]


# ------------------------------------------------------------------------------------- FLUX.1, Chroma
def _is_chroma(models: Models) -> bool:
    return bool(models) and models[0] is not None and type(models[0]).__name__ == "DummyCLIPL"


def _observe_flux(models: Models) -> None:
    """Chroma: sd-scripts passes its zero ``DummyCLIPL`` in CLIP-L's place (recorded for the profile choice)."""
    if _is_chroma(models):
        RUN.record(flux_variant="chroma")


def _tokenize_flux(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> Tokens:
    """``[clip_l ids, t5 ids, t5 mask]``."""
    parts = slots.tokenize_slots(arch, p, strategy, texts, negative)
    return [parts[0][0], parts[1][0], parts[1][1]]


def _encode_flux(arch: Arch, p: AlignmentProfile, self: object, tokenize_strategy: object, models: Models,
                 tokens: Tokens, **_: object) -> Outputs:
    """``[clip_l pooled, t5 hidden, txt_ids (zeros), t5 mask]`` (Chroma: the dummy CLIP-L's pooled output)."""
    import torch

    clip_l, t5 = models if len(models) == 2 else (models[0], None)
    l_ids, t5_ids = tokens[:2]
    t5_mask = tokens[2] if len(tokens) > 2 else None
    if clip_l is None or l_ids is None:
        l_pooled = None
    elif "clip_l" in p.slot_names:
        l_pooled = slots.slot_encode(p, "clip_l", clip_l, l_ids, None).pooled
    else:  # Chroma: sd-scripts' zero dummy stands in for CLIP-L
        l_pooled = clip_l(l_ids.to(clip_l.device))["pooler_output"]
    if t5 is None or t5_ids is None:
        return [l_pooled, None, None, None]
    mask = t5_mask if t5_mask is not None else torch.ones_like(t5_ids)
    t5_out = slots.slot_encode(p, "t5", t5, t5_ids, mask).hidden
    txt_ids = torch.zeros(t5_out.shape[0], t5_out.shape[1], 3, device=t5_out.device)
    return [l_pooled, t5_out, txt_ids, t5_mask]


def _flux_probes(arch: Arch) -> tuple[Target, ...]:
    """Facts recorded from sd-scripts itself: the Flux checkpoint analysis (schnell or dev) and Chroma's dummy CLIP-L."""
    return (
        Target("library.flux_utils", "analyze_checkpoint_state", ("ckpt_path",), wrap=_analyze_checkpoint_wrapper),
        Target("library.flux_utils", "DummyCLIPL.__init__", ("self",), wrap=_dummy_clip_l_wrapper),
    )


def _analyze_checkpoint_wrapper(original: Callable[..., Sequence[object]]) -> Callable[..., Sequence[object]]:
    def analyze_checkpoint_state(ckpt_path: str, *a: object, **k: object) -> Sequence[object]:
        result = original(ckpt_path, *a, **k)
        if RUN.state().get("flux_variant") != "chroma":
            RUN.record(flux_variant="schnell" if result[1] else "dev")
        return result

    return mark_wrapper(analyze_checkpoint_state, original)


def _dummy_clip_l_wrapper(original: Callable[..., None]) -> Callable[..., None]:
    def dummy_init(self: object, *a: object, **k: object) -> None:
        RUN.record(flux_variant="chroma")
        original(self, *a, **k)

    return mark_wrapper(dummy_init, original)


# ----------------------------------------------------------------------------------------- Lumina 2
def _tokenize_single(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> Tokens:
    """``(ids, mask)`` of a one-tokenizer architecture, the mask as int64."""
    import torch

    ids, mask = slots.tokenize_slots(arch, p, strategy, texts, negative)[0]
    return (ids, mask.to(torch.long))


def _encode_lumina(arch: Arch, p: AlignmentProfile, self: object, tokenize_strategy: object, models: Models,
                   tokens: Tokens, **_: object) -> Outputs:
    """``[hidden, ids, mask]``."""
    ids, mask = tokens
    r = slots.slot_encode(p, p.slots[0].name, models[0], ids, mask)
    return [r.hidden, ids, mask]


def _notes_lumina(strategy: object, p: AlignmentProfile) -> None:
    sp = getattr(strategy, "system_prompt", None)
    if sp is not None:
        tmpl = p.slots[0].tokenizer
        RUN.once("lumina:sp", "te-align: Lumina 2 captions use profile %s's template (sd-scripts --system_prompt %r not used): %r",
                 p.name, sp, getattr(tmpl, "template", None))


def _notes_anima(strategy: object, p: AlignmentProfile) -> None:
    for attr, flag, slot in (("qwen3_max_length", "--qwen3_max_token_length", "qwen"), ("t5_max_length", "--t5_max_token_length", "t5")):
        have, want = getattr(strategy, attr, None), p.slot(slot).tokenizer.max_length if slot in p.slot_names else None
        if have is not None and want is not None and have != want:
            RUN.once(f"anima:{attr}", "te-align: sd-scripts' %s %s replaced by profile %s's %s (override with %s='{\"%s_max_length\": %s}')",
                     flag, have, p.name, want, ENV_OVERRIDES, slot, have)


# ------------------------------------------- the architectures with steps of their own: SD3, Anima, HunyuanImage
def _encode_sd3(arch: Arch, p: AlignmentProfile, self: object, tokenize_strategy: object, models: Models,
                tokens: Tokens, enable_dropout: bool = True, **_: object) -> Outputs:
    """``[lg_out, t5_out, lg_pooled, l_mask, g_mask, t5_mask]`` as Sd3TextEncodingStrategy.encode_tokens returns them,
    with sd-scripts' per-encoder caption dropout (``--clip_l_dropout_rate`` etc., zeroed rows)."""
    import torch

    clip_l, clip_g, t5 = [*list(models), None, None, None][:3]
    l_ids, g_ids, t5_ids, l_mask, g_mask, t5_mask = tokens
    flags = ("apply_lg_attn_mask", "apply_t5_attn_mask")
    if any(getattr(self, f, False) for f in flags):
        RUN.once("sd3:masks", "te-align: SD3 --apply_lg_attn_mask/--apply_t5_attn_mask are not used: masks follow profile %s "
                  "(encoder masks: clip_l=%s clip_g=%s t5=%s), on the live and the cached path alike",
                  p.name, *(p.slot(s).masks.encoder for s in ("clip_l", "clip_g", "t5")))
    lg_out = lg_pooled = None
    if l_ids is not None and clip_l is not None:
        rl = slots.slot_encode(p, "clip_l", clip_l, l_ids, l_mask)
        rg = slots.slot_encode(p, "clip_g", clip_g, g_ids, g_mask)
        n = l_ids.shape[0]
        dl, dg = slots.drop(getattr(self, "l_dropout_rate", 0.0), enable_dropout, n), slots.drop(getattr(self, "g_dropout_rate", 0.0), enable_dropout, n)
        lg_out = torch.cat([slots.zero_rows(rl.hidden, dl), slots.zero_rows(rg.hidden, dg)], dim=-1)
        lg_pooled = torch.cat([slots.zero_rows(rl.pooled, dl), slots.zero_rows(rg.pooled, dg)], dim=-1)
    else:
        l_mask = g_mask = None
    t5_out = None
    if t5_ids is not None and t5 is not None:
        r5 = slots.slot_encode(p, "t5", t5, t5_ids, t5_mask)
        t5_out = slots.zero_rows(r5.hidden, slots.drop(getattr(self, "t5_dropout_rate", 0.0), enable_dropout, t5_ids.shape[0]))
    else:
        t5_mask = None
    return [lg_out, t5_out, lg_pooled, l_mask, g_mask, t5_mask]


# ------------------------------------------------------------------------------------------ Anima
def _batch_longest(
    slot: SlotSpec, ids: torch.Tensor, mask: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-length tokens cut back to what :func:`~te_align.encoding.core.tokenize_slot` gives the same
    batch under ``padding = "longest"``: the longest caption's width (at least ``min_length``, the added
    positions holding ``min_length_pad_id``), every other masked position the pad id (captions tokenized
    one by one and collated may carry their own ``min_length`` fill). Tokens of a ``max_length`` profile
    are returned as they are."""
    import torch

    t = slot.tokenizer
    if t.padding != "longest":
        return ids, mask
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
    real = int(mask.sum(dim=1).max()) if mask.shape[0] else 0
    width = min(ids.shape[1], max(real, t.min_length or 0))
    left = t.padding_side == "left"
    ids, mask = (ids[:, ids.shape[1] - width :], mask[:, mask.shape[1] - width :]) if left else (ids[:, :width], mask[:, :width])
    if width > real and t.min_length_pad_id is not None:
        ids = ids.clone()
        if left:
            ids[:, : width - real] = t.min_length_pad_id
        else:
            ids[:, real:] = t.min_length_pad_id
    return ids, mask


def _tokenize_anima(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> Tokens:
    """``[qwen ids, qwen mask, t5 ids, t5 mask]`` as sd-scripts' AnimaTokenizeStrategy.tokenize returns them
    (strategy_anima.py:53-69), by the profile, each padded to the slot's ``max_length`` for collation."""
    out: list[torch.Tensor] = []
    for slot, tok in slots.slot_tokenizers(arch, strategy, p):
        ids, mask = _core.tokenize_slot(slot, tok, texts, negative=negative)
        out.extend(_core.pad_tokens(slot, ids, mask, slot.tokenizer.max_length, _core.pad_id_of(slot, tok)))
    return out


def _encode_anima(arch: Arch, p: AlignmentProfile, strategy: object, tokenize_strategy: object,
                  models: Models, tokens: Tokens, **_: object) -> Outputs:
    """``[qwen states, qwen mask, t5 ids, t5 mask]`` as AnimaTextEncodingStrategy.encode_tokens returns them
    (strategy_anima.py:82-107): Qwen3 runs on the batch cut back to its longest caption, exactly as the
    official pipeline encodes that batch; states and mask are then zero-padded back to sd-scripts' width.

    Why the zero padding is exact for the denoiser (diffusers 0.42.1 / sd-scripts 48d368f):

    * Qwen states: the conditioner's cross-attention takes the Qwen mask as key mask
      (df models/condition_embedders/condition_embedder_anima.py:217-223 with :306-307; sd
      library/anima_models.py:1528-1535,1574-1582), so padded source positions get zero weight; source
      RoPE positions are ``arange`` (:312-315; sd :1586-1589) and right padding leaves the real positions at
      0..n-1. The states of padded positions are zero either way (df modular_pipelines/anima/encoders.py:147;
      sd library/strategy_anima.py:105).
    * T5 ids: padded targets are key-masked in the conditioner's self-attention (:206-214; sd :1517-1525),
      their outputs are zeroed (:340-341; sd library/anima_models.py:1370), and the official output is
      right-padded with zeros to ``min_sequence_length`` 512 (:253,343-344), which is sd-scripts' width.
    * The DiT takes the 512 conditioning rows without a mask (df modular_pipelines/anima/denoise.py:131-137;
      sd anima_train_network.py:306-314), so it sees the same 512 rows: the real ones, then zeros.

    A batch of captions that all tokenize to nothing (Qwen3 adds no special tokens, so "") has one key,
    masked, officially and 512 masked keys in sd-scripts: the cross-attention output of a fully masked
    row is 0 in both (torch >= 2.5 SDPA; sd-scripts docs/anima_train_network.md asks for torch >= 2.5).

    So zero padding is exact in exact arithmetic. In float, attention over 512 instead of the batch's
    longest keys rounds differently: on the tiny test models (fp32) the conditioner output moves by at
    most 7.2e-7, the same as the official pipeline's own change when a prompt shares its batch with a
    longer one (tests/trainers/kohya/test_kohya_integration.py::test_anima_padding_is_invisible_to_sd_scripts_llm_adapter).
    """
    import torch

    qwen = p.slot("qwen")
    ids, mask, t5_ids, t5_mask = tokens
    width = ids.shape[1]
    pad_id = qwen.tokenizer.pad_token_id if qwen.tokenizer.pad_token_id is not None else 0
    cut_ids, cut_mask = _batch_longest(qwen, ids, mask, pad_id)
    r = _core.encode_slot_tokens(p, qwen, models[0], cut_ids, cut_mask)
    extra = width - r.hidden.shape[-2]
    left = qwen.tokenizer.padding_side == "left"
    hidden = torch.nn.functional.pad(r.hidden, (0, 0, extra, 0) if left else (0, 0, 0, extra))
    out_mask = torch.nn.functional.pad(r.denoiser_mask, (extra, 0) if left else (0, extra))
    return [hidden, out_mask, t5_ids, t5_mask]


# ----------------------------------------------------------------------------------- HunyuanImage
def _tokenize_hunyuan(
    arch: Arch, p: AlignmentProfile, strategy: object, texts: list[str], negative: bool
) -> Tokens:
    """``[vlm ids, vlm mask, byt5 ids, byt5 mask]`` as HunyuanImageTokenizeStrategy.tokenize returns them
    (strategy_hunyuan_image.py:27-45), by the profile.

    The profile pads Qwen to 1000 + 34 and ByT5 to 128 (``padding = "max_length"``), so every caption's
    tokens have the same shape and collate, where sd-scripts pads Qwen to the batch's longest (up to
    1024 + 34) and ByT5 to 128, or to 1 when no caption of the batch has quoted text. A caption without
    quoted text gets ByT5 pad ids with an all-zero mask, which sd-scripts' own encode step also reads as
    "no glyph text" (hunyuan_image_text_encoder.py:600-605).
    """
    RUN.once(
        "hunyuan:settings",
        "te-align: HunyuanImage captions follow profile %s: Qwen %s tokens (sd-scripts: up to 1024, padded to the batch's "
        "longest), ByT5 glyph text from '...', \"...\", ‘...’ and “...” (sd-scripts skips '...')",
        p.name, p.slot("qwen").tokenizer.max_length if "qwen" in p.slot_names else "?",
    )
    out: list[torch.Tensor] = []
    for slot, tok in slots.slot_tokenizers(arch, strategy, p):
        out.extend(_core.tokenize_slot(slot, tok, texts, negative=negative))
    return out


def _check_token_width(p: AlignmentProfile, slot_name: str, tokenizer: object, ids: torch.Tensor) -> None:
    slot = p.slot(slot_name)
    if slot.tokenizer.padding != "max_length" or not slot.tokenizer.truncation:
        return
    want = _core.tokenize_length(slot, tokenizer)
    if ids.shape[1] != want:
        raise HookError(
            f"te-align kohya hunyuan_image: {slot_name} tokens are {ids.shape[1]} wide but profile {p.name} tokenizes to "
            f"{want} (were these tokens made before the hooks were installed?)"
        )


def _encode_hunyuan(arch: Arch, p: AlignmentProfile, strategy: object, tokenize_strategy: object,
                    models: Models, tokens: Tokens, **_: object) -> Outputs:
    """``[vlm_embed, vlm_mask, byt5_embed, byt5_mask, ocr_mask]`` as HunyuanImageTextEncodingStrategy.encode_tokens
    returns them (strategy_hunyuan_image.py:53-79): states and int64 masks of both slots by the profile, and
    ``ocr_mask`` (bool, per caption, on the CPU as sd-scripts builds it): the caption has glyph text.

    The shapes stay fixed per caption ((1000, width), (1000,), (128, 1472), (128,), ()), which sd-scripts'
    per-item TE cache and its collate (train_util.py:1748-1787) take as they are. sd-scripts' denoiser
    (library/hunyuan_image_models.py:240-355) masks both sequences and moves the valid ByT5 and Qwen
    tokens to the front per sample, so the longer Qwen padding changes no valid position.
    """
    import torch

    vlm_ids, vlm_mask, byt5_ids, byt5_mask = tokens
    qwen, byt5 = models
    for attr, ids in zip(arch.tokenizers, (vlm_ids, byt5_ids), strict=True):  # sd-scripts' order: Qwen, ByT5
        _check_token_width(p, slots.slot_name(arch, attr, p), getattr(tokenize_strategy, attr, None), ids)
    with torch.no_grad():  # as sd-scripts (hunyuan_image_text_encoder.py:545-548,610): neither encoder is trained
        if getattr(getattr(qwen, "dtype", None), "itemsize", 2) == 1:
            vlm_embed, vlm_out_mask = _encode_hunyuan_fp8(p, qwen, vlm_ids, vlm_mask)
        else:
            rq = _core.encode_slot_tokens(p, p.slot("qwen"), qwen, vlm_ids, vlm_mask)
            vlm_embed, vlm_out_mask = rq.hidden, rq.denoiser_mask
        rb = _core.encode_slot_tokens(p, p.slot("byt5"), byt5, byt5_ids, byt5_mask)
    ocr = rb.denoiser_mask.bool().any(dim=1).cpu()
    return [vlm_embed, vlm_out_mask, rb.hidden, rb.denoiser_mask, ocr.to(torch.bool)]


def _encode_hunyuan_fp8(
    p: AlignmentProfile, qwen: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """--fp8_vl: float8 Qwen2.5-VL weights only run through sd-scripts' own forward (bf16 autocast and the
    float8 hooks it installs at load, hunyuan_image_text_encoder.py:411-491,544-546). It is handed the
    profile's tokens; it takes hidden_states[-3] and drops the first 34 positions, which is the profile's
    recipe when the profile says so (else refused). Floats then differ from an unquantised bf16 encoder."""
    from library import hunyuan_image_text_encoder as hte

    slot = p.slot("qwen")
    same = (slot.encoder.layer, slot.tokenizer.drop_start_tokens, slot.masks.repad, slot.masks.zero_padded, slot.encoder.final_layer_norm)
    if same != (-3, hte.PROMPT_TEMPLATE_ENCODE_START_IDX, "none", False, False) or not slot.masks.encoder:
        raise HookError(
            f"te-align kohya hunyuan_image: --fp8_vl runs Qwen2.5-VL through sd-scripts' own forward, which cannot follow "
            f"profile {p.name} (layer {slot.encoder.layer}, drop {slot.tokenizer.drop_start_tokens}, repad {slot.masks.repad}); "
            "remove --fp8_vl or those overrides"
        )
    RUN.once("hunyuan:fp8", "te-align: --fp8_vl: Qwen2.5-VL encodes the profile's tokens through sd-scripts' float8 forward "
              "(bf16 autocast); floats differ from the official bf16 encoding by the quantisation")
    return hte.get_qwen_prompt_embeds_from_tokens(qwen, ids, mask)




# ==================================================================================== the table
ARCHS: tuple[Arch, ...] = (
    Arch("sd", "library.strategy_sd", "SdTokenizeStrategy", "SdTextEncodingStrategy", None,
         tokenizers=("tokenizer",), slots=(None,), tokenize=_tokenize_sd, encode=_encode_sd, chunkable=True,
         weighted=Weighted(("self", "tokenize_strategy", "models", "tokens_list", "weights_list"),
                           "library/strategy_sd.py:108-130"),
         network="networks.lora", extra=_sample_targets_sd),
    Arch("sdxl", "library.strategy_sdxl", "SdxlTokenizeStrategy", "SdxlTextEncodingStrategy",
         "SdxlTextEncoderOutputsCachingStrategy", tokenizers=("tokenizer1", "tokenizer2"), slots=("clip_l", "clip_g"),
         tokenize=_tokenize_sdxl, encode=_encode_sdxl, chunkable=True,
         weighted=Weighted(("self", "tokenize_strategy", "models", "tokens_list", "weights_list"),
                           "library/strategy_sdxl.py:195-219", hidden_outputs=2, pooled=True, samples=True),
         extra=_sample_targets_sdxl),  # SDXL LoRAs are networks.lora too: stamped through the sd row
    Arch("sd3", "library.strategy_sd3", "Sd3TokenizeStrategy", "Sd3TextEncodingStrategy",
         "Sd3TextEncoderOutputsCachingStrategy", tokenizers=("clip_l", "clip_g", "t5xxl"), slots=("clip_l", "clip_g", "t5"),
         tokenize=_tokenize_sd3, encode=_encode_sd3,
         encode_params=("self", "tokenize_strategy", "models", "tokens", "apply_lg_attn_mask", "apply_t5_attn_mask", "enable_dropout"),
         network="networks.lora_sd3"),
    Arch("flux", "library.strategy_flux", "FluxTokenizeStrategy", "FluxTextEncodingStrategy",
         "FluxTextEncoderOutputsCachingStrategy", tokenizers=("clip_l", "t5xxl"), slots=("clip_l", "t5"),
         tokenize=_tokenize_flux, encode=_encode_flux,
         encode_params=("self", "tokenize_strategy", "models", "tokens", "apply_t5_attn_mask"),
         network="networks.lora_flux", observe=_observe_flux, extra=_flux_probes),
    Arch("lumina", "library.strategy_lumina", "LuminaTokenizeStrategy", "LuminaTextEncodingStrategy",
         "LuminaTextEncoderOutputsCachingStrategy", tokenizers=("tokenizer",), slots=(None,),
         tokenize=_tokenize_single, encode=_encode_lumina, tokenize_params=("self", "text", "is_negative"),
         cache_batch_param="batch",
         weighted=Weighted(("self", "tokenize_strategy", "models", "tokens", "weights"),
                           "library/strategy_lumina.py:74-89,125-144", applied=False, encoder="Gemma 2"),
         network="networks.lora_lumina", notes=_notes_lumina),
    Arch("anima", "library.strategy_anima", "AnimaTokenizeStrategy", "AnimaTextEncodingStrategy",
         "AnimaTextEncoderOutputsCachingStrategy", tokenizers=("qwen3_tokenizer", "t5_tokenizer"), slots=("qwen", "t5"),
         tokenize=_tokenize_anima, encode=_encode_anima, network="networks.lora_anima", notes=_notes_anima),
    Arch("hunyuan_image", "library.strategy_hunyuan_image", "HunyuanImageTokenizeStrategy",
         "HunyuanImageTextEncodingStrategy", "HunyuanImageTextEncoderOutputsCachingStrategy",
         tokenizers=("vlm_tokenizer", "byt5_tokenizer"), slots=("qwen", "byt5"),
         tokenize=_tokenize_hunyuan, encode=_encode_hunyuan),
)  # fmt: skip
BY_NAME: dict[str, Arch] = {a.name: a for a in ARCHS}
assert set(BY_NAME) == set(table.ARCH_PROFILES), "te_align.trainers.kohya and the hook rows name the same architectures"


def arch_of_strategy(strategy: object) -> Arch | None:
    """The architecture whose tokenize strategy ``strategy`` is (by class name; None: not one of sd-scripts')."""
    if strategy is None:
        return None
    names = {c.__name__ for c in type(strategy).__mro__}
    return next((a for a in ARCHS if a.tokenize_cls in names), None)


def cache_fingerprint(p: AlignmentProfile, strategy: object = None, *, weighted: bool = False) -> str:
    """Fingerprint stored in TE-output caches: the profile's, plus sd-scripts settings that change outputs.

    ``strategy``: the tokenize strategy (its architecture and ``--max_token_length`` decide long-prompt
    chunks). ``weighted``: the cache holds --weighted_captions outputs (sd-scripts' prompt weights applied).
    """
    fp = p.fingerprint()
    arch = arch_of_strategy(strategy)
    chunks = chunk_options(arch.chunkable, strategy).long_prompt_chunks if arch is not None else 0
    if chunks:
        fp += f"+long_prompt_chunks={chunks}"
    if weighted:
        fp += "+weighted_captions=sd-scripts"
    return fp


def all_targets() -> list[Target]:
    """Every function or method the kohya hooks replace, with the parameter names relied on and the wrapper."""
    out: list[Target] = []
    for a in ARCHS:
        out.extend(a.targets())
        if a.network is not None:
            out.append(_stamp_target(a.network))
    return out
