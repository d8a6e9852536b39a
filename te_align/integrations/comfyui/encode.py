"""Encoding by a profile with the text encoders ComfyUI loaded.

No second copy of any encoder: each profile slot runs ComfyUI's own transformer module (the ``transformer`` of
the ``SDClipModel`` inside ``clip.cond_stage_model``, with whatever weights, LoRA patches, dtype casts and
offloading ComfyUI gave it) behind a small adapter that answers like a Hugging Face encoder
(``last_hidden_state``, ``hidden_states[i]``, ``pooler_output``, ``text_embeds``). Tokenizing, layer choice,
pooling, masks and combining are :func:`te_align.encode`'s, so the tensors equal it by construction; the test
suite checks them against ``te_align.encode`` on Hugging Face encoders holding the same weights.

Before encoding, ``clip.load_model()`` lets ComfyUI's model management place the encoders (GPU, low-VRAM or
CPU) exactly as its own CLIPTextEncode does; encoding runs on ``clip.patcher.load_device`` and the conditioning
is returned on ``model_management.intermediate_device()``, as ComfyUI's is.

ComfyUI (GPL-3.0) is only called at run time through its public objects; none of its code is copied here.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Protocol, TypeAlias

from te_align.encoding import encode
from te_align.errors import TeAlignError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from te_align.encoding.conditioning import Conditioning
    from te_align.profiles.model import AlignmentProfile, SlotSpec

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.

#: te-align slot name -> attribute of ComfyUI's cond_stage_model and tokenizer objects.
SLOT_ATTRS: dict[str, str] = {"clip_l": "clip_l", "clip_g": "clip_g", "t5": "t5xxl", "clip_h": "clip_h"}

#: ComfyUI text-encoder classes (most derived first) -> the te-align profile family they encode for.
COMFY_FAMILIES: tuple[tuple[str, str], ...] = (
    ("FluxClipModel", "flux"),
    ("SD3ClipModel", "sd3"),
    ("SDXLClipModel", "sdxl"),
    ("PixArtT5XXL", "chroma"),
    ("LuminaModel", "lumina2"),
    ("SD2ClipModel", "sd2"),
    ("SD1ClipModel", "sd1"),
)
#: (family, slot) whose pooled output the model's authors take unprojected. The profile says ``text_embeds`` (the
#: diffusers pipeline's choice), which is the same value because the model's projection is the identity; ComfyUI
#: takes the unprojected output and leaves the projection uninitialised when a file has none, so the node never
#: reads it.
UNPROJECTED_POOLED: dict[tuple[str, str], str] = {
    ("sd3", "clip_l"): (
        "Stability-AI/sd3.5@fbf8f48 sd3_infer.py:105-112 (CLIP-L return_projected_pooled=False) and other_impls.py:"
        "227-230 (its text_projection initialised to the identity); ComfyUI fe25114 comfy/text_encoders/sd3_clip.py:65 "
        "(return_projected_pooled=False), comfy/sd.py:253 (a missing text_projection is not reported); diffusers "
        "0.42.1 loaders/single_file_utils.py:1763 and kohya-ss/sd-scripts@48d368f library/sd3_utils.py:151-153 set a "
        "missing one to the identity"),
}
#: Families the nodes encode for, and the profile a LoRA without metadata falls back to.
FALLBACK_PROFILES: dict[str, str] = {"flux": "flux-dev", "sd3": "sd35-large", "sdxl": "sdxl", "sd1": "sd15", "chroma": "chroma"}
#: Families ComfyUI loads whose encoders cannot give the profile's tensors, and why (one line each, shown in the UI).
UNSUPPORTED: dict[str, str] = {
    "lumina2": (
        "Lumina 2 cannot be encoded by its profile on ComfyUI's encoder: ComfyUI's Gemma-2 tokenizes with the "
        "SentencePiece model stored in the weights file, not the Gemma tokenizer.json Lumina 2 was trained with, and its attention "
        "has no logit soft-capping (transformers' Gemma2 applies attn_logit_softcapping), so its loaded encoder cannot "
        "give te_align.encode's tensors; encode with te_align.encode or te_align.apply in diffusers, or use ComfyUI's "
        "CLIPTextEncodeLumina2 (system prompt; no padding to 256 and no mask)"),
}


class NodeError(TeAlignError):
    """A user mistake the te-align nodes report in one line (ComfyUI shows it in its error panel)."""


class ComfyPatcher(Protocol):
    """What te-align reads of a ComfyUI ``ModelPatcher``: the device the model runs on."""

    load_device: torch.device


class ComfyClip(Protocol):
    """What te-align reads of a ComfyUI ``CLIP`` object (comfy/sd.py): the text-encoder model and tokenizer
    (their per-slot attributes are looked up by name), its model patcher, and ``load_model()``."""

    cond_stage_model: object
    tokenizer: object
    patcher: ComfyPatcher

    def load_model(self) -> object: ...


#: ComfyUI's CONDITIONING: ``[[cross_attn, {"pooled_output": ..., ...}]]``.
ComfyConditioning: TypeAlias = "list[list[torch.Tensor | dict[str, torch.Tensor | float | int]]]"


def comfy_family(clip: object) -> tuple[str | None, str]:
    """(te-align family, ComfyUI class name) of a ComfyUI CLIP object's text-encoder model."""
    model = getattr(clip, "cond_stage_model", None)
    if model is None:
        raise NodeError("the clip input is not a ComfyUI CLIP object (connect a checkpoint's or a CLIP loader's CLIP output)")
    names = [c.__name__ for c in type(model).__mro__]
    for cls, fam in COMFY_FAMILIES:
        if any(n == cls or n.startswith(cls + "_") for n in names):
            return fam, type(model).__name__
    return None, type(model).__name__


def check_supported(clip: object) -> tuple[str | None, str]:
    """(family, class name) of a ComfyUI CLIP object; a family the nodes cannot encode raises its reason."""
    fam, cls = comfy_family(clip)
    if fam in UNSUPPORTED:
        raise NodeError(UNSUPPORTED[fam])
    return fam, cls


def check_family(clip: object, profile: AlignmentProfile) -> str:
    """Refuse a CLIP object of another family than the profile's, naming both."""
    fam, cls = check_supported(clip)
    if profile.family in UNSUPPORTED:
        raise NodeError(UNSUPPORTED[profile.family])
    want = "chroma" if profile.family == "chroma" else profile.family
    if fam != want:
        what = f"a {fam} text encoder ({cls})" if fam else f"a {cls} text encoder, which te-align does not encode for"
        raise NodeError(f"the clip input is {what}, but profile '{profile.name}' is for {profile.family} models: "
                        f"load the {profile.family} text encoders or pick a {fam or 'matching'} profile")
    if fam not in FALLBACK_PROFILES:
        raise NodeError(f"{fam} text encoders are not encoded by te-align in ComfyUI (it encodes "
                        f"{', '.join(FALLBACK_PROFILES)})")
    return fam


# ------------------------------------------------------------------------------------------- tokenizers
_CONFORMED: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, dict[str, PreTrainedTokenizerBase]] = (
    weakref.WeakKeyDictionary()
)


def conform_tokenizer(slot: SlotSpec, tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """ComfyUI's Hugging Face tokenizer for ``slot``, with the profile's pad token where ComfyUI's differs
    (ComfyUI loads CLIP-G from the CLIP-L files and pads with id 0 itself; the hub CLIP-G tokenizer's pad is "!",
    a special token). The copy is made once per tokenizer object."""
    want = slot.tokenizer.pad_token
    if want is None or tok.pad_token == want:
        return tok
    cached = _CONFORMED.setdefault(tok, {})
    if want not in cached:
        new = copy.deepcopy(tok)
        new.add_special_tokens({"pad_token": want})
        if slot.tokenizer.pad_token_id is not None and new.pad_token_id != slot.tokenizer.pad_token_id:
            raise NodeError(f"slot '{slot.name}': ComfyUI's tokenizer gives pad token {want!r} id {new.pad_token_id}, "
                            f"the profile expects {slot.tokenizer.pad_token_id}")
        cached[want] = new
    return cached[want]


# ---------------------------------------------------------------------------------------------- encoders
@dataclass
class _Out:
    last_hidden_state: torch.Tensor
    hidden_states: _OneLayer
    pooler_output: torch.Tensor | None = None
    text_embeds: torch.Tensor | None = None


class _OneLayer:
    """``hidden_states`` with the one entry the slot asks for (ComfyUI computes one intermediate per pass)."""

    def __init__(self, index: int | None, value: torch.Tensor, last: torch.Tensor) -> None:
        self.index, self.value, self.last = index, value, last

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == -1 and self.index is None:
            return self.last
        if i != self.index:
            raise TeAlignError(f"hidden_states[{i}] was not computed (asked for {self.index})")
        return self.value


class ComfyEncoder:
    """One profile slot's encoder: ComfyUI's loaded module answering like a Hugging Face text encoder.

    Holds a reference to ComfyUI's module (no copy) and has no parameters of its own. With ``unprojected`` its
    ``text_embeds`` is the unprojected pooled output (see :data:`UNPROJECTED_POOLED`).
    """

    def __init__(self, slot: SlotSpec, module: torch.nn.Module, *, unprojected: bool = False) -> None:
        import torch

        self.slot = slot
        self.module = module
        self.unprojected = unprojected
        self.is_clip = hasattr(module, "text_model")
        width = module.get_input_embeddings().weight.shape[-1]
        self.config = SimpleNamespace(hidden_size=int(width))
        self.dtype = torch.float32  # ComfyUI runs text encoders in float32 (its outputs are .float())
        if self.is_clip:
            self.final_layer_norm = module.text_model.final_layer_norm
        elif hasattr(module, "encoder") and hasattr(module.encoder, "final_layer_norm"):
            self.final_layer_norm = module.encoder.final_layer_norm

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return iter(())

    def _index(self) -> int | None:
        layer = self.slot.encoder.layer
        if layer == "all":
            raise NodeError(f"slot '{self.slot.name}': a profile that stacks every layer cannot run on ComfyUI's encoders")
        if layer == "last":
            # Hugging Face hidden_states[-1]: CLIP's is the last layer before the final norm; T5's is after it
            return -1 if (self.is_clip and not self.slot.encoder.final_layer_norm) else None
        if layer == "penultimate":
            return -2
        return int(layer) - 1 if int(layer) > 0 else int(layer)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> _Out:
        import torch

        index = self._index()
        mask = None if attention_mask is None else attention_mask
        out = self.module(input_ids, mask, intermediate_output=index, final_layer_norm_intermediate=False,
                          dtype=torch.float32)
        x, inter = out[0], out[1]
        hf_index = index if index is None or index < 0 else index + 1
        hidden = _OneLayer(hf_index, inter, x)
        if self.is_clip:
            return _Out(x, hidden, pooler_output=out[3], text_embeds=out[3] if self.unprojected else out[2])
        return _Out(x, hidden)


#: (slot name, layer, final norm, unprojected): what a :class:`ComfyEncoder` reads of its slot.
_EncoderKey: TypeAlias = "tuple[str, str | int, bool, bool]"
#: ComfyUI module -> its adapters by :data:`_EncoderKey`.
_ENCODERS: weakref.WeakKeyDictionary[torch.nn.Module, dict[_EncoderKey, ComfyEncoder]] = (
    weakref.WeakKeyDictionary()
)


def comfy_encoder(slot: SlotSpec, module: torch.nn.Module, family: str = "") -> ComfyEncoder:
    """The :class:`ComfyEncoder` of ``module`` for ``slot`` of a ``family`` profile, made once per module and per the
    slot fields it reads (name, layer, final norm); it holds nothing but references, so reusing it is the same as
    making it anew."""
    unprojected = (family, slot.name) in UNPROJECTED_POOLED
    key = (slot.name, slot.encoder.layer, slot.encoder.final_layer_norm, unprojected)
    per_module = _ENCODERS.setdefault(module, {})
    enc = per_module.get(key)
    if enc is None:
        enc = per_module[key] = ComfyEncoder(slot, module, unprojected=unprojected)
    return enc


def components(
    clip: ComfyClip, profile: AlignmentProfile
) -> tuple[dict[str, PreTrainedTokenizerBase], dict[str, ComfyEncoder]]:
    """(tokenizers, encoders) by slot name, taken from a ComfyUI CLIP object."""
    tokenizers: dict[str, PreTrainedTokenizerBase] = {}
    encoders: dict[str, ComfyEncoder] = {}
    for slot in profile.slots:
        attr = SLOT_ATTRS.get(slot.name)
        sub = getattr(clip.cond_stage_model, attr, None) if attr else None
        tok = (getattr(clip.tokenizer, attr, None) or getattr(clip.tokenizer, f"clip_{attr}", None)) if attr else None
        if sub is None or tok is None:
            raise NodeError(f"profile '{profile.name}' needs the {slot.name} text encoder, but this CLIP has none "
                            f"(load it with the others: {', '.join(s.name for s in profile.slots)})")
        tokenizers[slot.name] = conform_tokenizer(slot, tok.tokenizer)
        encoders[slot.name] = comfy_encoder(slot, sub.transformer, profile.family)
    return tokenizers, encoders


def encode_with_clip(
    clip: ComfyClip, profile: AlignmentProfile, prompt: str, *, empty: bool = False
) -> Conditioning:
    """``te_align.encode`` (or, with ``empty``, the profile's empty prompt) on ComfyUI's loaded encoders.

    Returns the :class:`~te_align.encoding.Conditioning` on ComfyUI's intermediate device.
    """
    import comfy.model_management as mm

    from te_align.encoding.core import encode_uncond

    check_family(clip, profile)
    tokenizers, encoders = components(clip, profile)
    clip.load_model()  # ComfyUI's model management places (and LoRA-patches) the encoders as for its own nodes
    device = clip.patcher.load_device
    if empty:
        cond = encode_uncond(profile, 1, tokenizers=tokenizers, text_encoders=encoders, device=device)
    else:
        cond = encode(profile, [prompt], tokenizers=tokenizers, text_encoders=encoders, device=device)
    return cond.to(mm.intermediate_device())


def to_conditioning(
    profile: AlignmentProfile,
    cond: Mapping[str, torch.Tensor],
    *,
    guidance: float | None = None,
    width: int = 0,
    height: int = 0,
) -> ComfyConditioning:
    """ComfyUI's CONDITIONING for a profile's tensors: ``[[cross_attn, {"pooled_output": ..., ...}]]``.

    Flux gets the ``guidance`` key as CLIPTextEncodeFlux sets it; SDXL gets the size keys when a size is given
    (ComfyUI otherwise uses the latent's size, as diffusers does); Chroma's T5 sequence is cut to the positions
    its mask leaves visible (the real tokens and one pad): ComfyUI's Chroma model takes no text mask, and a
    masked text position is one no image token attends to, while text positions carry no position ids.
    """
    names = list(cond)
    first = names[0]
    x = cond[first]
    extra: dict[str, torch.Tensor | float | int] = {}
    if "pooled_prompt_embeds" in cond:
        extra["pooled_output"] = cond["pooled_prompt_embeds"]
    if profile.family == "chroma":
        mask = cond["prompt_attention_mask"]
        keep = int(mask[0].sum().item())
        x = x[:, :keep]
    if profile.family == "flux" and guidance is not None:
        extra["guidance"] = float(guidance)
    if profile.family == "sdxl" and width > 0 and height > 0:
        extra.update(width=width, height=height, crop_w=0, crop_h=0, target_width=width, target_height=height)
    return [[x, extra]]


__all__ = ["COMFY_FAMILIES", "FALLBACK_PROFILES", "UNPROJECTED_POOLED", "UNSUPPORTED", "ComfyEncoder", "NodeError",
           "check_family", "check_supported", "comfy_family",
           "components", "conform_tokenizer", "encode_with_clip", "to_conditioning"]
