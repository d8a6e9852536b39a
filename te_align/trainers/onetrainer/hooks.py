"""Runtime hooks for Nerogar/OneTrainer: its data loader tokenization and each model's ``encode_text`` by a profile.

OneTrainer encodes text in two places (read at Nerogar/OneTrainer@23df383, mgds@3a6994a):

* the data loader: ``<Family>BaseDataLoader._preparation_modules`` builds mgds ``Tokenize`` modules
  (caption -> ``tokens_N`` / ``tokens_mask_N``) and, when text is cached, ``Encode*Text`` modules
  (tokens -> ``text_encoder_N_hidden_state``) that the text disk cache stores;
* the model: ``<Family>Model.encode_text`` runs in training (from the batch's tokens or cached outputs),
  for sampling and for new embeddings (from the caption).

Targets (each pinned by module, qualified name and parameter names; :data:`FAMILIES` has one row per
model class): every family's ``encode_text`` and ``_preparation_modules``, and
``DataLoaderText2ImageMixin._cache_modules_from_names`` (the text cache folder gets the profile
fingerprint). Hooked, the ``Tokenize`` / ``Encode*Text`` modules that belong to the model's tokenizers
and encoders tokenize and encode by the profile (:func:`~te_align.encoding.core.tokenize_slot` /
:func:`~te_align.encoding.core.encode_slot_tokens`), and ``encode_text`` returns OneTrainer's own
tuple layout filled with the profile's tensors: so ``combine_text_encoder_output(*encode_text(...))``
and every tensor ``encode_text`` returns equal :func:`te_align.encode`'s outputs exactly.

What the profile replaces (OneTrainer settings then have no effect, logged once each): hard-coded lengths
(SD3 T5 77, PixArt T5 120; HiDream's T5 without its mask), ``text_encoder_2_sequence_length`` (FLUX.1,
default 77), ``text_encoder_*_layer_skip``, ``transformer.attention_mask`` (zeroing padded outputs) and
the Chroma and Qwen-Image token pruning (to the batch's longest mask, padded to 16). OneTrainer's caption
dropout (``text_encoder*.dropout_probability``: the dropped rows' embeddings, and for PixArt and Sana
their attention mask, are multiplied by 0, drawn from the batch ``rand`` in OneTrainer's order) and its
additional embeddings (``_apply_output_embeddings``) are kept as they are.

Families hooked: SD 1.5/2.x, SDXL, SD3/3.5, FLUX.1 (dev, schnell, fill), Chroma, PixArt-Σ, Sana, HiDream,
Qwen-Image (``NOT_HOOKED`` lists models te-align profiles but does not hook: none). OneTrainer has no Wan model.

Activation: :func:`install` (the drop-in ``scripts/train.py`` / ``scripts/train_ui.py`` that ``te-align
patch`` writes call it). Profile: ``install(profile=...)`` / ``TE_ALIGN_PROFILE``, else per model type
(:data:`te_align.trainers.onetrainer.names.MODEL_TYPES`); overrides: keyword arguments over ``TE_ALIGN_OVERRIDES``. ``TE_ALIGN=off``
leaves OneTrainer unmodified.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias

from te_align._git import git_head
from te_align._lazy import lazy_module
from te_align.hooks.base import (
    ENV_PROFILE,
    ENV_SWITCH,
    Hook,
    HookError,
    Lifecycle,
    Settings,
    Target,
    mark_wrapper,
    settings,
)
from te_align.trainers.onetrainer import names

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedTokenizerBase

    from te_align.encoding import core as _core
    from te_align.encoding.core import SlotResult
    from te_align.hooks.base import ProfileSource
    from te_align.profiles import AlignmentProfile
    from te_align.profiles.model import SlotSpec

    #: One value of a hooked mgds ``Encode*Text`` item: a tensor, a layer stack's tensors, or None.
    CachedItem: TypeAlias = "torch.Tensor | list[torch.Tensor] | None"
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")

logger = logging.getLogger("te_align")

#: OneTrainer commit the targets were read and verified against.
VERIFIED = "23df3832e8f213d64c337e39f9365ba46e99fed0"
#: The hooked text cache lives in <cache_dir>/text/<CACHE_PREFIX><fingerprint[:16]>.
CACHE_PREFIX = "te-align-"
#: mgds DiskCache's per-variation file of aggregated items (next to one ``<index>.pt`` per caption).
AGGREGATE = "aggregate.pt"

#: OneTrainer models te-align profiles but does not hook, with the reason.
NOT_HOOKED: dict[str, str] = {}


@dataclass(frozen=True)
class Encoder:
    """One OneTrainer text encoder of a model: the profile slot it is and the names OneTrainer uses for it."""

    slot: str
    tokenizer: str  # model attribute
    encoder: str  # model attribute
    tokens: str  # encode_text parameter
    mask: str | None  # encode_text parameter with the tokenizer mask (None: OneTrainer passes none)
    output: str | None  # encode_text parameter with a cached hidden state
    pooled: str | None  # encode_text parameter with a cached pooled output
    dropout: str | None  # encode_text parameter: the dropout probability
    layer_skip: str | None  # encode_text parameter: OneTrainer's layer skip


def _enc(
    slot: str, n: str = "", *, mask: str | None = "tokens_mask", pooled: bool = False, output: bool = True
) -> Encoder:
    """OneTrainer's names for encoder ``n`` ("" for the single-encoder models, "1".."3" otherwise)."""
    s, u = (f"_{n}", f"_{n}") if n else ("", "")
    return Encoder(slot=slot, tokenizer=f"tokenizer{s}", encoder=f"text_encoder{s}", tokens=f"tokens{u}",
                   mask=None if mask is None else (mask + u if mask == "tokens_mask" else mask),
                   output=f"text_encoder{u}_output" if output else None,
                   pooled=f"pooled_text_encoder{u}_output" if pooled else None,
                   dropout=f"text_encoder{u}_dropout_probability", layer_skip=f"text_encoder{u}_layer_skip")


_HEAD = ("self", "train_device", "batch_size", "rand", "text")
#: A tensor (or None) per profile slot name: the hidden states or pooled outputs ``encode_text`` returns from.
PerSlot = dict[str, "torch.Tensor | None"]


@dataclass(frozen=True)
class Family:
    """One OneTrainer model class: its ``encode_text`` signature, data loader, profile families and layout."""

    key: str
    model_class: str
    params: tuple[str, ...]
    loader_class: str
    profile_families: frozenset[str]
    encoders: tuple[Encoder, ...]
    #: OneTrainer's return value from (profile outputs, per-slot hidden, per-slot pooled).
    returns: Callable[[dict[str, torch.Tensor], PerSlot, PerSlot], object]
    #: encode_text parameters the profile replaces (logged once when set away from their default).
    replaced: tuple[tuple[str, object], ...] = ()
    #: OneTrainer's caption dropout zeroes the returned attention mask too (PixArt, Sana).
    drop_mask: bool = False
    #: The data loader's encode module hands on the post-processed tokens and mask with the cached hidden
    #: states (Qwen-Image's EncodeQwenText, then PadMaskedTokens pads all three to a fixed length).
    cached_post_processed: bool = False

    @property
    def model_module(self) -> str:
        return f"modules.model.{self.model_class}"

    @property
    def loader_module(self) -> str:
        return f"modules.dataLoader.{self.loader_class}"


FAMILIES: dict[str, Family] = {f.key: f for f in (
    Family("sd", "StableDiffusionModel",
           (*_HEAD, "tokens", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output"),
           "StableDiffusionBaseDataLoader", frozenset({"sd1", "sd2"}), (_enc("clip_l", mask=None),),
           lambda out, h, p: out["prompt_embeds"]),
    Family("sdxl", "StableDiffusionXLModel",
           (*_HEAD, "tokens_1", "tokens_2", "text_encoder_1_layer_skip", "text_encoder_2_layer_skip",
            "text_encoder_1_output", "text_encoder_2_output", "text_encoder_1_dropout_probability",
            "text_encoder_2_dropout_probability", "pooled_text_encoder_2_output"),
           "StableDiffusionXLBaseDataLoader", frozenset({"sdxl"}),
           (_enc("clip_l", "1", mask=None), _enc("clip_g", "2", mask=None, pooled=True)),
           lambda out, h, p: (h["clip_l"], h["clip_g"], p["clip_g"])),
    Family("sd3", "StableDiffusion3Model",
           (*_HEAD, "tokens_1", "tokens_2", "tokens_3", "tokens_mask_1", "tokens_mask_2", "tokens_mask_3",
            "text_encoder_1_layer_skip", "text_encoder_2_layer_skip", "text_encoder_3_layer_skip",
            "text_encoder_1_dropout_probability", "text_encoder_2_dropout_probability",
            "text_encoder_3_dropout_probability", "apply_attention_mask", "text_encoder_1_output",
            "pooled_text_encoder_1_output", "text_encoder_2_output", "pooled_text_encoder_2_output",
            "text_encoder_3_output"),
           "StableDiffusion3BaseDataLoader", frozenset({"sd3"}),
           (_enc("clip_l", "1", pooled=True), _enc("clip_g", "2", pooled=True), _enc("t5", "3")),
           lambda out, h, p: (h["clip_l"], h["clip_g"], h["t5"], p["clip_l"], p["clip_g"]),
           (("apply_attention_mask", False),)),
    Family("flux", "FluxModel",
           (*_HEAD, "tokens_1", "tokens_2", "tokens_mask_2", "text_encoder_1_layer_skip", "text_encoder_2_layer_skip",
            "text_encoder_2_sequence_length", "text_encoder_1_dropout_probability",
            "text_encoder_2_dropout_probability", "apply_attention_mask", "pooled_text_encoder_1_output",
            "text_encoder_2_output"),
           "FluxBaseDataLoader", frozenset({"flux"}),
           (Encoder("clip_l", "tokenizer_1", "text_encoder_1", "tokens_1", None, None, "pooled_text_encoder_1_output",
                    "text_encoder_1_dropout_probability", "text_encoder_1_layer_skip"), _enc("t5", "2")),
           lambda out, h, p: (out["prompt_embeds"], out["pooled_prompt_embeds"]),
           (("apply_attention_mask", False), ("text_encoder_2_sequence_length", None))),
    Family("chroma", "ChromaModel",
           (*_HEAD, "tokens", "tokens_mask", "text_encoder_layer_skip", "text_encoder_dropout_probability",
            "text_encoder_output"),
           "ChromaBaseDataLoader", frozenset({"chroma"}), (_enc("t5"),),
           lambda out, h, p: (out["prompt_embeds"], out["prompt_attention_mask"].bool())),
    Family("pixart", "PixArtAlphaModel",
           (*_HEAD, "tokens", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output",
            "attention_mask"),
           "PixArtAlphaBaseDataLoader", frozenset({"pixart"}), (_enc("t5", mask="attention_mask"),),
           lambda out, h, p: (out["prompt_embeds"], out["prompt_attention_mask"]), drop_mask=True),
    Family("sana", "SanaModel",
           (*_HEAD, "tokens", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output",
            "attention_mask"),
           "SanaBaseDataLoader", frozenset({"sana"}), (_enc("gemma", mask="attention_mask"),),
           lambda out, h, p: (out["prompt_embeds"], out["prompt_attention_mask"]), drop_mask=True),
    Family("hidream", "HiDreamModel",
           (*_HEAD, "tokens_1", "tokens_2", "tokens_3", "tokens_4", "tokens_mask_3", "tokens_mask_4",
            "text_encoder_3_layer_skip", "text_encoder_1_dropout_probability", "text_encoder_2_dropout_probability",
            "text_encoder_3_dropout_probability", "text_encoder_4_dropout_probability", "apply_attention_mask",
            "pooled_text_encoder_1_output", "pooled_text_encoder_2_output", "text_encoder_3_output",
            "text_encoder_4_output"),
           "HiDreamBaseDataLoader", frozenset({"hidream"}),
           (Encoder("clip_l", "tokenizer_1", "text_encoder_1", "tokens_1", None, None, "pooled_text_encoder_1_output",
                    "text_encoder_1_dropout_probability", None),
            Encoder("clip_g", "tokenizer_2", "text_encoder_2", "tokens_2", None, None, "pooled_text_encoder_2_output",
                    "text_encoder_2_dropout_probability", None),
            _enc("t5", "3"),
            Encoder("llama", "tokenizer_4", "text_encoder_4", "tokens_4", "tokens_mask_4", "text_encoder_4_output", None,
                    "text_encoder_4_dropout_probability", None)),
           lambda out, h, p: (p["clip_l"], p["clip_g"], out["prompt_embeds_t5"], out["prompt_embeds_llama3"]),
           (("apply_attention_mask", False),)),
    Family("qwen", "QwenModel",
           (*_HEAD, "tokens", "tokens_mask", "text_encoder_layer_skip", "text_encoder_dropout_probability",
            "text_encoder_output"),
           "QwenBaseDataLoader", frozenset({"qwen-image"}), (_enc("qwen"),),
           lambda out, h, p: (out["prompt_embeds"], out["prompt_embeds_mask"].bool()), cached_post_processed=True),
)}

MIXIN_MODULE = "modules.dataLoader.mixin.DataLoaderText2ImageMixin"
CACHE_PARAMS = (
    "self", "model", "model_setup", "image_split_names", "image_aggregate_names", "text_split_names",
    "sort_names", "config", "text_caching",
)


def family_of_model(model: object) -> Family:
    """The :data:`FAMILIES` row of a OneTrainer model object (by its class or a base class)."""
    names = [c.__name__ for c in type(model).__mro__]
    for n in names:
        if n in NOT_HOOKED:
            raise HookError(f"te-align: OneTrainer {n} is not hooked ({NOT_HOOKED[n]}); run with {ENV_SWITCH}=off")
        for f in FAMILIES.values():
            if f.model_class == n:
                return f
    raise HookError(f"te-align: OneTrainer model {type(model).__name__} is not one te-align hooks")


def profile_name_for_model_type(model_type: object) -> str:
    """The bundled profile for a OneTrainer ``ModelType`` (enum or its name), from the one table
    (:mod:`te_align.trainers.onetrainer.names`)."""
    name = str(getattr(model_type, "name", model_type))
    prof, hooked = names.profile_of(name)
    if prof is None:
        raise HookError(f"te-align: no profile for OneTrainer model_type {name}; set {ENV_PROFILE} or install(profile=...)")
    if not hooked:
        raise HookError(f"te-align: no hooked profile for OneTrainer model_type {name} (profile {prof}: te-align's "
                        f"hooks do not encode its model class); run with {ENV_SWITCH}=off")
    return prof


# ------------------------------------------------------------------------------------ run state
@dataclass
class _Run:
    explicit: ProfileSource = None
    overrides: dict[str, object] = field(default_factory=dict)
    settings: Settings | None = None
    logged: set[str] = field(default_factory=set)
    stale: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    def configure(self, settings: Settings | None) -> None:
        """The user's settings (:func:`te_align.hooks.base.settings`; a new one forgets the profiles chosen so far)."""
        with self.lock:
            self.settings = settings
            self.explicit = settings.source if settings is not None else None
            self.overrides = dict(settings.overrides) if settings is not None else {}

    def once(self, key: str, msg: str, *args: object) -> None:
        with self.lock:
            if key in self.logged:
                return
            self.logged.add(key)
        logger.info(msg, *args)

    def profile_for(self, model: object, fam: Family) -> AlignmentProfile:
        """The run's profile for ``model`` (explicit, else by its model type), checked against the family."""
        key = self.explicit if self.explicit is not None else profile_name_for_model_type(getattr(model, "model_type", ""))
        with self.lock:
            if self.settings is None:  # used without install(): the environment's settings
                self.settings = settings()
            # the one way in (source + TE_ALIGN_OVERRIDES + install() overrides), cached by Settings once per source
            p = self.settings.profile(key)
        if p.family not in fam.profile_families:
            raise HookError(f"te-align: OneTrainer {fam.model_class} encodes {'/'.join(sorted(fam.profile_families))} "
                            f"prompts but the profile '{p.name}' is for {p.family}")
        return p


RUN = _Run()


# ------------------------------------------------------------------------------------ encoding
def _slots(p: AlignmentProfile, fam: Family, model: object) -> list[tuple[Encoder, SlotSpec]]:
    """(OneTrainer encoder, profile slot) for the encoders the model has (SD 2.x's CLIP-H is its one slot)."""
    out = []
    for e in fam.encoders:
        name = p.slots[0].name if len(fam.encoders) == 1 else e.slot
        out.append((e, p.slot(name)))
    return out


def _post_mask(slot: SlotSpec, encoder: object, ids: torch.Tensor, mask: torch.Tensor) -> SlotResult:
    """The SlotResult of cached hidden states' tokens: masks after the profile's windowing steps."""
    import torch

    dummy = torch.zeros((*ids.shape, 1))  # only the masks and ids are used: no encoder needed (it may be unloaded)
    counts = [int(x) for x in mask.sum(dim=1)]
    return _core._post_process(slot, torch.nn.Module(), dummy, None, ids, mask, counts)


def _check_width(fam: Family, e: Encoder, slot: SlotSpec, model: object, ids: torch.Tensor) -> None:
    """Tokens of a fixed-length slot must have the profile's length (made by the hooked data loader)."""
    if slot.tokenizer.padding != "max_length":
        return
    want = _core.tokenize_length(slot, getattr(model, e.tokenizer))
    if ids.shape[-1] != want:
        raise HookError(f"te-align: OneTrainer {fam.model_class}.encode_text got {e.tokens} of length {ids.shape[-1]}, "
                        f"but profile slot '{slot.name}' tokenizes to {want}: these tokens were not made by the hooked "
                        "data loader (cached before te-align? clear the cache or install the hooks before the data "
                        "loader is built)")


def _batch_longest(
    slot: SlotSpec, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``padding = "longest"`` slot's right-padded tokens cut to the batch's longest caption, as tokenizing
    the batch does (the hooked data loader pads each caption to a fixed length so batches can be stacked)."""
    if slot.tokenizer.padding != "longest" or slot.tokenizer.padding_side != "right":
        return ids, mask
    width = int(mask.sum(dim=1).max())
    return ids[:, :width], mask[:, :width]


def _encode_text(fam: Family, original: Callable[..., object]) -> Callable[..., object]:
    params = fam.params

    def encode_text(*args: object, **kwargs: object) -> object:
        import torch

        # OneTrainer's arguments by name: the model, its tensors and settings, read as each one is
        a: dict[str, Any] = dict(zip(params, args, strict=False))
        a.update(kwargs)
        model = a["self"]
        p = RUN.profile_for(model, fam)
        for name, default in fam.replaced:
            if a.get(name, default) not in (default,):
                RUN.once(f"{fam.key}:{name}", "te-align: OneTrainer %s=%s has no effect; profile %s decides", name, a[name], p.name)
        text = a.get("text")
        batch = int(a.get("batch_size") or 1)
        results: dict[str, SlotResult] = {}
        hidden: PerSlot = {}
        pooled: PerSlot = {}
        for e, slot in _slots(p, fam, model):
            if e.layer_skip and a.get(e.layer_skip):
                RUN.once(f"{fam.key}:{e.layer_skip}", "te-align: OneTrainer %s=%s has no effect; profile %s decides the layer",
                         e.layer_skip, a[e.layer_skip], p.name)
            encoder = getattr(model, e.encoder, None)
            ids, mask = a.get(e.tokens), a.get(e.mask) if e.mask else None
            cached = a.get(e.output) if e.output else None
            if isinstance(cached, (list, tuple)):  # HiDream's Llama layers as the data loader caches them
                cached = torch.stack(list(cached), dim=0)
            cached_pooled = a.get(e.pooled) if e.pooled else None
            if ids is None and text is not None:
                texts = [text] if isinstance(text, str) else list(text)
                add = getattr(model, f"add_{e.encoder}_embeddings_to_prompt", None)
                texts = [add(t) for t in texts] if add is not None else texts
                ids, mask = _core.tokenize_slot(slot, getattr(model, e.tokenizer), texts)
                batch = len(texts)
            if ids is not None and mask is None:
                mask = _core.eos_mask(ids, slot.tokenizer.eos_token_id)
            have_hidden = cached is not None or e.output is None
            have_pooled = e.pooled is None or cached_pooled is not None
            if not (have_hidden and have_pooled):
                if ids is None:
                    raise HookError(f"te-align: OneTrainer {fam.model_class}.encode_text got neither text, tokens nor a "
                                    f"cached output for {e.encoder}")
                _check_width(fam, e, slot, model, ids)
                ids, mask = _batch_longest(slot, ids, mask)
                res = _core.encode_slot_tokens(p, slot, encoder, ids, mask)
                if cached is not None:
                    res = _core.SlotResult(
                        cached, res.pooled, res.mask, res.ids, res.denoiser_mask, res.token_counts
                    )
            elif fam.cached_post_processed:  # tokens and mask as encoded, padded to a fixed length by the loader

                width = int(mask.sum(dim=1).max())
                cached, ids, mask = cached[:, :width], ids[:, :width], mask[:, :width]
                res = _core.SlotResult(cached, None, mask, ids, _core.denoiser_mask(slot, mask, cached.dtype),
                                       [int(x) for x in mask.sum(dim=1)])
            else:
                post = _post_mask(slot, encoder, ids, mask)
                dmask = post.denoiser_mask if cached is None else post.denoiser_mask.to(cached.dtype)
                res = _core.SlotResult(cached, cached_pooled, post.mask, post.ids, dmask, post.token_counts)
            if cached_pooled is not None:
                res = _core.SlotResult(
                    res.hidden, cached_pooled, res.mask, res.ids, res.denoiser_mask, res.token_counts
                )
            apply = getattr(model, "_apply_output_embeddings", None)
            embeddings = getattr(model, f"all_{e.encoder}_embeddings", None)
            if res.hidden is not None and apply is not None and embeddings is not None and embeddings():
                res = _core.SlotResult(apply(embeddings(), getattr(model, e.tokenizer), res.ids, res.hidden),
                                       res.pooled, res.mask, res.ids, res.denoiser_mask, res.token_counts)
            rate = a.get(e.dropout) if e.dropout else None
            if rate is not None and rate > 0.0 and fam.key == "qwen":
                raise NotImplementedError("OneTrainer has no caption dropout for Qwen-Image (modules/model/QwenModel.py)")
            if rate is not None and rate > 0.0:
                ref = res.hidden if res.hidden is not None else res.pooled
                keep = torch.tensor([a["rand"].random() > rate for _ in range(batch)], device=ref.device).float()
                res = _core.SlotResult(
                    None if res.hidden is None else res.hidden * keep[:, None, None].to(res.hidden.dtype),
                    None if res.pooled is None else res.pooled * keep[:, None].to(res.pooled.dtype),
                    res.mask, res.ids, res.denoiser_mask if not fam.drop_mask else res.denoiser_mask *
                    keep[:, None].to(res.denoiser_mask.dtype), res.token_counts)
            results[slot.name] = res
            hidden[e.slot], pooled[e.slot] = res.hidden, res.pooled
        outs = _core._combine(p, {s.name: results[s.name] for s in p.slots}, None).tensors
        return fam.returns(outs, hidden, pooled)

    return mark_wrapper(encode_text, original)


# ------------------------------------------------------------------------------------ data loader
class _TokenizeModule(Protocol):
    """What a hooked ``get_item`` reads of an mgds ``Tokenize`` module."""

    in_name: str
    tokens_out_name: str
    mask_out_name: str
    tokenizer: PreTrainedTokenizerBase

    def _get_previous_item(self, variation: int, name: str, index: int) -> str: ...


class _EncodeModule(Protocol):
    """What a hooked ``get_item`` reads of an mgds ``Encode*Text`` module."""

    hidden_state_out_name: str
    text_encoder: torch.nn.Module

    def _get_previous_item(self, variation: int, name: str, index: int) -> torch.Tensor: ...


def loader_tokens(
    slot: SlotSpec, tokenizer: PreTrainedTokenizerBase, text: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """One caption's (ids, mask) as the hooked data loader makes them: the profile's tokenization, padded to a
    fixed length for ``padding = "longest"`` slots so that a batch can be stacked (cut back in encode_text)."""
    ids, mask = _core.tokenize_slot(slot, tokenizer, [text])
    if slot.tokenizer.padding == "longest":
        length, pad_id = _core.tokenize_length(slot, tokenizer), _core.pad_id_of(slot, tokenizer)
        ids, mask = _core.pad_tokens(slot, ids, mask, length, pad_id)
    return ids, mask


def _tokenize_item(module: _TokenizeModule, slot: SlotSpec, add: Callable[[str], str] | None, variation: int,
                   index: int, requested_name: str | None = None) -> dict[str, torch.Tensor]:
    """A hooked mgds ``Tokenize.get_item``: the caption tokenized by the profile slot."""
    text = module._get_previous_item(variation, module.in_name, index)
    lock = getattr(module, "tokenizer_lock", None) or threading.Lock()
    with lock:
        ids, mask = loader_tokens(slot, module.tokenizer, text)
    device = getattr(getattr(module, "pipeline", None), "device", None)
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return {module.tokens_out_name: ids[0], module.mask_out_name: mask[0]}


def _encode_item(module: _EncodeModule, profile: AlignmentProfile, slot: SlotSpec, tokens_name: str,
                 mask_name: str | None, variation: int, index: int,
                 requested_name: str | None = None) -> dict[str, CachedItem]:
    """A hooked mgds ``Encode*Text.get_item``: the tokens encoded by the profile slot (cached as OneTrainer caches)."""
    import torch

    ids = module._get_previous_item(variation, tokens_name, index)[None]
    if mask_name is not None:
        mask = module._get_previous_item(variation, mask_name, index)[None]
    else:
        mask = _core.eos_mask(ids, slot.tokenizer.eos_token_id)
    if slot.tokenizer.padding == "longest" and slot.tokenizer.padding_side == "right":  # as tokenized alone
        width = int(mask.sum(dim=1).max())
        ids, mask = ids[:, :width], mask[:, :width]
    with torch.no_grad():
        res = _core.encode_slot_tokens(profile, slot, module.text_encoder, ids, mask)
    if slot.encoder.layer == "all":  # a layer stack (HiDream's Llama): mgds caches one (L, D) tensor per layer
        out: dict[str, CachedItem] = {module.hidden_state_out_name: list(res.hidden[:, 0].unbind(0))}
    else:
        out = {module.hidden_state_out_name: res.hidden[0]}
    mask_out = getattr(module, "tokens_attention_mask_out_name", None)
    if mask_out:  # EncodeLlamaText also hands on the tokens and mask it encoded
        out[tokens_name] = res.ids[0]
        out[mask_out] = res.mask[0]
    pooled_name = getattr(module, "pooled_out_name", None)
    if pooled_name:
        out[pooled_name] = None if res.pooled is None else res.pooled[0]
    return out


def _preparation_modules(fam: Family, original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    # ``list[Any]``: mgds modules of many classes, told apart by the attributes they have, then hooked
    def _preparation_modules(
        loader: object, config: object, model: object, *args: object, **kwargs: object
    ) -> list[Any]:
        modules = original(loader, config, model, *args, **kwargs)
        p = RUN.profile_for(model, fam)
        by_tok: dict[int, tuple[Encoder, SlotSpec]] = {}
        by_enc: dict[int, tuple[Encoder, SlotSpec]] = {}
        for e, slot in _slots(p, fam, model):
            tok, enc = getattr(model, e.tokenizer, None), getattr(model, e.encoder, None)
            if tok is not None:
                by_tok[id(tok)] = (e, slot)
            if enc is not None:
                by_enc[id(enc)] = (e, slot)
        masks: dict[str, str] = {}
        n_tok = n_enc = 0
        for m in modules:
            if hasattr(m, "tokens_out_name") and id(getattr(m, "tokenizer", None)) in by_tok:
                e, slot = by_tok[id(m.tokenizer)]
                m.get_item = partial(_tokenize_item, m, slot, None)
                masks[m.tokens_out_name] = m.mask_out_name
                n_tok += 1
        for m in modules:
            if hasattr(m, "hidden_state_out_name") and id(getattr(m, "text_encoder", None)) in by_enc:
                e, slot = by_enc[id(m.text_encoder)]
                tokens_name = getattr(m, "tokens_in_name", None) or getattr(m, "tokens_name", None) or m.in_name
                m.get_item = partial(_encode_item, m, p, slot, tokens_name, masks.get(tokens_name))
                n_enc += 1
        RUN.once(f"loader:{fam.key}:{p.fingerprint()}",
                 "te-align: OneTrainer %s data loader tokenizes (%d) and encodes (%d) by profile %s (fingerprint %s)",
                 fam.loader_class, n_tok, n_enc, p.name, p.fingerprint()[:12])
        return modules

    return mark_wrapper(_preparation_modules, original)


# ------------------------------------------------------------------------------------ text cache
def count_stale(text_dir: Path, keep: str) -> int:
    """Cached text entries under ``text_dir`` that are not in the folder ``keep``: made without te-align or
    with another profile, never read by a hooked run (it re-encodes into ``keep``). An entry is one caption's
    file, mgds DiskCache's ``<group>/variation-<n>/<index>.pt``; each variation's ``aggregate.pt`` is not one."""
    if not text_dir.is_dir():
        return 0
    n = 0
    for child in text_dir.iterdir():
        if child.name != keep and child.is_dir():
            n += sum(1 for f in child.rglob("*.pt") if f.name != AGGREGATE)
    return n


def cache_folder(profile: AlignmentProfile) -> str:
    """The hooked text cache's folder name under ``<cache_dir>/text`` for a profile."""
    return CACHE_PREFIX + profile.fingerprint()[:16]


def _cache_modules(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    def _cache_modules_from_names(
        loader: object, model: object, *args: object, **kwargs: object
    ) -> list[Any]:
        modules = original(loader, model, *args, **kwargs)
        try:
            fam = family_of_model(model)
        except HookError:
            return modules
        a = dict(zip(CACHE_PARAMS[2:], args, strict=False))
        a.update(kwargs)
        config = a.get("config")
        p = RUN.profile_for(model, fam)
        text_dir = os.path.join(str(getattr(config, "cache_dir", "")), "text")
        for m in modules:
            if getattr(m, "cache_dir", None) == text_dir:
                keep = cache_folder(p)
                m.cache_dir = os.path.join(text_dir, keep)
                stale = count_stale(Path(text_dir), keep)
                with RUN.lock:
                    RUN.stale += stale
                if stale:
                    logger.warning("te-align: %d cached text-encoder file(s) in %s were made without te-align or with "
                                   "another profile; texts are re-encoded by profile %s into %s", stale, text_dir, p.name, keep)
                else:
                    logger.info("te-align: OneTrainer text cache keyed by profile %s: %s", p.name, m.cache_dir)
        return modules

    return mark_wrapper(_cache_modules_from_names, original)


# ------------------------------------------------------------------------------------ console
class _UntilRootLogs(logging.Filter):
    """Passes records only while the root logger has no handler: once something in the process sets up logging
    (a library OneTrainer's GUI imports does, after the hooks are installed), te-align's lines go through that
    handler alone instead of twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def _log_to_console() -> None:
    """Make te-align's INFO lines visible in a OneTrainer process: its scripts configure no logging. A stdout
    handler on the ``te_align`` logger, only when neither it nor the root logger has one (idempotent)."""
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(_UntilRootLogs())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


# ------------------------------------------------------------------------------------ the hook
@dataclass
class OneTrainerHook(Hook):
    name: ClassVar[str] = "OneTrainer"
    supported: ClassVar[dict[str, str]] = {VERIFIED: "Nerogar/OneTrainer 23df383 (master, with mgds 3a6994a)"}

    #: Which target groups: "models" (encode_text), "loader" (tokenize/encode modules), "cache" (text cache key).
    parts: tuple[str, ...] = ("models", "loader", "cache")
    families: tuple[str, ...] = tuple(FAMILIES)

    def configure(self, settings: Settings) -> None:
        super().configure(settings)
        RUN.configure(settings)

    def targets(self) -> Sequence[Target]:
        out: list[Target] = []
        for key in self.families:
            fam = FAMILIES[key]
            if "models" in self.parts:
                out.append(Target(fam.model_module, f"{fam.model_class}.encode_text", fam.params, wrap=partial(_encode_text, fam)))
            if "loader" in self.parts:
                out.append(Target(fam.loader_module, f"{fam.loader_class}._preparation_modules", ("self", "config", "model"),
                                  wrap=partial(_preparation_modules, fam)))
        if "cache" in self.parts:
            out.append(Target(MIXIN_MODULE, "DataLoaderText2ImageMixin._cache_modules_from_names", CACHE_PARAMS, wrap=_cache_modules))
        return out

    def detect_version(self) -> str:
        mod = sys.modules.get("modules")
        path = getattr(mod, "__file__", None) or next(iter(getattr(mod, "__path__", []) or []), None) if mod else None
        if not path:
            return "unknown (OneTrainer 'modules' not imported)"
        root = Path(path).resolve()
        root = root.parent.parent if root.name == "__init__.py" else root.parent
        head = git_head(root)
        return (self.supported.get(head, head[:7]) if head else "unknown (no git)") + f" at {root}"


LIFECYCLE = Lifecycle("OneTrainer", OneTrainerHook, console=_log_to_console)


def install(
    profile: ProfileSource = None,
    *,
    parts: Sequence[str] = ("models", "loader", "cache"),
    **overrides: object,
) -> bool:
    """Install the OneTrainer hooks (all targets or none; idempotent). Returns False under ``TE_ALIGN=off``.

    ``profile``: a profile name or object for every model (default ``TE_ALIGN_PROFILE``, else by model type);
    ``overrides``: profile overrides over ``TE_ALIGN_OVERRIDES``; ``parts``: target groups (see
    :class:`OneTrainerHook`). OneTrainer's scripts configure no logging: te-align's lines go to stdout until
    something sets up logging. The lifecycle is :class:`te_align.hooks.base.Lifecycle`.
    """
    return LIFECYCLE.install(profile, overrides, parts=tuple(parts))


def uninstall() -> None:
    """Restore every replaced method (idempotent)."""
    with RUN.lock:
        LIFECYCLE.uninstall()
        RUN.configure(None)
        RUN.stale = 0
        RUN.logged.clear()


def is_installed() -> bool:
    return LIFECYCLE.is_installed()


def check(parts: Sequence[str] = ("models", "loader", "cache")) -> None:
    """Resolve every target without changing anything; raises HookError listing each problem."""
    OneTrainerHook(parts=tuple(parts)).check()
