"""What each inference tool does with a model family's prompts, compared with how a LoRA was trained.

Torch-free data, read by ``te-align check --for comfyui|forge|diffusers`` (:func:`inference_notes`) and by the
inference matrix. Each :class:`Behaviour` names the setting it concerns (a slot-relative profile path such as
``t5.tokenizer.max_length``), the value the tool effectively uses, what it does in words, how to sample as
trained in that tool, and the upstream source (file:line at a commit) it was read from.

Sources: ComfyUI upstream (comfyanonymous/ComfyUI) at fe2511468d6b (2026-02-03, v0.12.1+); Krea 2 and Ideogram 4,
which fe25114 does not have, at the later commits named per behaviour; Forge (lllyasviel/stable-diffusion-webui-forge)
at dfdcbab685e5 (no engine for FLUX.2, Z-Image, Qwen-Image-Edit, Krea 2, Ideogram 4 or LTX-2); diffusers 0.42.1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from te_align.errors import TeAlignError, closest
from te_align.profiles.overrides import canonical_key

if TYPE_CHECKING:
    from te_align.profiles.model import AlignmentProfile

COMFYUI = "comfyanonymous/ComfyUI@fe25114"
FORGE = "lllyasviel/stable-diffusion-webui-forge@dfdcbab"
#: Krea 2 and Ideogram 4 were added to ComfyUI after fe25114: the commits their encoders were read at.
COMFYUI_KREA2 = "comfyanonymous/ComfyUI@1e32fc1"
COMFYUI_IDEOGRAM4 = "comfyanonymous/ComfyUI@0f548d2"
COMFYUI_QWEN3VL = "comfyanonymous/ComfyUI@d763a4d"
DIFFUSERS = "huggingface/diffusers 0.42.1 src/diffusers/pipelines"

#: Tool key -> the name a person knows it by.
TOOLS: dict[str, str] = {"comfyui": "ComfyUI", "forge": "Forge", "diffusers": "diffusers"}

NODE = "the te-align Text Encode node"


@dataclass(frozen=True)
class Behaviour:
    """One thing an inference tool does with prompts of some model families."""

    tool: str
    #: Profile families (``flux``, ``sd3``, ``sdxl``) or profile names (``flux-schnell``) it applies to.
    applies_to: tuple[str, ...]
    #: The slot-relative profile path it concerns; None: a note shown whatever was trained.
    path: str | None
    #: The tool's effective value for ``path`` (compared with the trained value); None when ``path`` is None.
    value: object
    #: What the tool does, as a clause ("pads T5 to at least 256 tokens and never truncates").
    does: str
    #: How to sample as trained in that tool; ``{trained}`` is filled with the trained value.
    fix: str
    source: str
    #: Prompts for which the difference is real ("prompts over 255 T5 tokens"); empty: every prompt.
    when: str = ""
    #: How to sample as trained when the trainer used another value than the profile's (te-align's encoders follow
    #: the profile, so they are not the way then); ``OVERRIDDEN``: the profile with the trained value. Empty: ``fix``.
    fix_as_trained: str = ""
    #: Profile names it does not apply to, though their family is in ``applies_to``.
    not_for: tuple[str, ...] = ()

    def applies(self, profile_name: str, family: str) -> bool:
        if profile_name in self.not_for:
            return False
        return profile_name in self.applies_to or family in self.applies_to


_MAXLEN_AS_TRAINED = "pass max_sequence_length={trained} to the pipeline call"
_T5_OPTS = "a T5TokenizerOptions node with min_length={trained} before it (prompts over {trained} tokens are still not cut)"
#: Parsing of ``(word:1.2)`` in ComfyUI's tokenizers (SDTokenizer.tokenize_with_weights, unless a tokenizer passes
#: disable_weights=True, as Qwen-Image's, Flux 2's, Z-Image's and Lumina's Gemma-3 do).
_WEIGHTS = f"{COMFYUI} comfy/sd1_clip.py:304-349 (token_weights), 550-564 (parsed unless disable_weights), 27-62 (applied)"
_NO_PARENS = "write prompts without ( ) or escape them as \\( \\)"
#: The official diffusers pipeline's default call encodes these families as their profiles do.
_DIFFUSERS_DEFAULT = "sample in diffusers, where {pipe} default call encodes as the profile (the te-align node does not " \
                     "encode {family})"

BEHAVIOURS: tuple[Behaviour, ...] = (
    # ----------------------------------------------------------------------------------------- ComfyUI
    Behaviour("comfyui", ("flux",), "t5.tokenizer.max_length", 256,
              "pads T5 to at least 256 tokens and never truncates (T5XXLTokenizer min_length=256, max_length=99999999)",
              f"use {NODE}, or " + _T5_OPTS,
              f"{COMFYUI} comfy/text_encoders/flux.py:12-15; padding in comfy/sd1_clip.py:637-645",
              fix_as_trained="add " + _T5_OPTS),
    Behaviour("comfyui", ("sd3",), "t5.tokenizer.max_length", 77,
              "pads T5 to at least 77 tokens and never truncates, as Stability's sd3.5 reference code does",
              f"use {NODE}, or " + _T5_OPTS,
              f"{COMFYUI} comfy/text_encoders/sd3_clip.py:35-38",
              fix_as_trained="add " + _T5_OPTS),
    Behaviour("comfyui", ("chroma",), "t5.tokenizer.max_length", 0,
              "does not pad T5 at all (min_length=1) and passes no attention mask to T5 or the model",
              f"use {NODE} (it encodes with the mask and keeps the real tokens plus the pad Chroma sees)",
              f"{COMFYUI} comfy/text_encoders/pixart_t5.py:24-27, comfy/sd.py:1303-1305",
              fix_as_trained="sample in diffusers with max_sequence_length={trained} (ComfyUI's Chroma encoder passes "
                             "no mask, so no node setting gives it)"),
    Behaviour("comfyui", ("pixart",), "t5.tokenizer.max_length", 0,
              "does not pad T5 at all (min_length=1) and passes no attention mask to T5 or the model",
              "sample in diffusers with te_align.encode's tensors, or PixArtSigmaPipeline's default call (the "
              "te-align node does not encode PixArt)",
              f"{COMFYUI} comfy/text_encoders/pixart_t5.py:10-27, comfy/sd.py:1303-1305",
              fix_as_trained="sample in diffusers with max_sequence_length={trained}"),
    Behaviour("comfyui", ("flux", "sd3"), "t5.masks.encoder", False,
              "runs T5 without an attention mask (T5XXLModel attention_mask=False)",
              f"use {NODE}, which passes the mask as the profile says",
              f"{COMFYUI} comfy/text_encoders/sd3_clip.py:11-20, comfy/text_encoders/flux.py:41",
              fix_as_trained="sample in diffusers with te_align.apply(pipe, OVERRIDDEN) (no ComfyUI node runs T5 with "
                             "its mask)"),
    Behaviour("comfyui", ("sdxl",), "empty_prompt", "encode",
              "encodes an empty negative prompt as the text \"\" (zeros only through ConditioningZeroOut)",
              "use the te-align Empty Negative node or ConditioningZeroOut on the negative",
              f"{COMFYUI} nodes.py:58-79 (CLIPTextEncode), nodes.py:250-271 (ConditioningZeroOut)",
              fix_as_trained="use ConditioningZeroOut on the negative"),
    Behaviour("comfyui", ("lumina2",), "gemma.tokenizer.system_prompt", None,
              "adds no system prompt in CLIPTextEncode (only the CLIPTextEncodeLumina2 node adds one)",
              "use the CLIPTextEncodeLumina2 node with the system prompt you trained with (the te-align node does not "
              "encode Lumina 2)",
              f"{COMFYUI} comfy_extras/nodes_lumina2.py:66-114, comfy/text_encoders/lumina2.py:6-9"),
    Behaviour("comfyui", ("wan", "pixart"), "t5.tokenizer.text_cleaning", "none",
              "does not clean the prompt first (no ftfy, HTML unescaping, whitespace collapsing or caption cleaning): "
              "the tokenizer gets the text as written",
              "clean prompts before sampling as the profile's text_cleaning does (te_align.encoding.text has the "
              "cleaners); prompts of plain words with single spaces are unaffected",
              f"{COMFYUI} comfy/text_encoders/wan.py:11-14, comfy/text_encoders/pixart_t5.py:24-27 (no cleaning "
              "step); comfy/sd1_clip.py:550-597 (the text is only split at ( ) weights and embedding names)"),
    Behaviour("comfyui", ("sd1", "sd2", "sdxl", "sd3", "flux"), None, None,
              "reads (word:1.2) and (word) in a prompt as weights (for T5 too) and encodes a prompt over 75 CLIP "
              "tokens as extra 77-token chunks instead of cutting it",
              f"{NODE} encodes the text as written, exactly as the profile says",
              f"{_WEIGHTS}, 599-645 (chunks); SD2: comfy/sd2_clip.py (SDTokenizer)"),
    Behaviour("comfyui", ("hidream",), None, None,
              "reads (word:1.2) and (word) as weights for all four encoders (CLIP-L, CLIP-G, T5, Llama), encodes a "
              "prompt over 75 CLIP tokens as extra 77-token chunks and keeps T5's first 128-token chunk only",
              _NO_PARENS + " (the te-align node does not encode HiDream)",
              f"{COMFYUI} comfy/text_encoders/hidream.py:10-24; {_WEIGHTS}"),
    Behaviour("comfyui", ("chroma", "pixart", "auraflow"), None, None,
              "reads (word:1.2) and (word) in a prompt as T5 token weights and tokenizes the text between them "
              "separately",
              f"{NODE} encodes the text as written (Chroma); for PixArt and AuraFlow {_NO_PARENS}",
              f"{COMFYUI} comfy/text_encoders/pixart_t5.py:24-27, comfy/text_encoders/aura_t5.py:11-14; {_WEIGHTS}"),
    Behaviour("comfyui", ("wan",), None, None,
              "reads (word:1.2) and (word) in a prompt as UMT5 token weights and never cuts a prompt over 512 tokens "
              "(UMT5XXlTokenizer min_length=512, max_length=99999999)",
              _NO_PARENS + " and keep prompts under 512 tokens (the te-align node does not encode Wan)",
              f"{COMFYUI} comfy/text_encoders/wan.py:11-14; {_WEIGHTS}"),
    Behaviour("comfyui", ("lumina2",), None, None,
              "reads (word:1.2) and (word) in a prompt as Gemma token weights (Gemma2BTokenizer keeps weights on)",
              _NO_PARENS,
              f"{COMFYUI} comfy/text_encoders/lumina2.py:6-9 (Gemma-3's tokenizer at :14-17 turns them off); {_WEIGHTS}"),
    Behaviour("comfyui", ("anima",), None, None,
              "reads (word:1.2) and (word) in a prompt as T5 token weights and gives Qwen3 the text with the ( ) and "
              ":1.2 removed (its weights reset to 1.0)",
              _NO_PARENS,
              f"{COMFYUI} comfy/text_encoders/anima.py:23-28,46-50; {_WEIGHTS}"),
    Behaviour("comfyui", ("hunyuanimage",), None, None,
              "reads (word:1.2) and (word) as weights in the quoted text it gives ByT5 (the Qwen2.5-VL text is read "
              "as written)",
              _NO_PARENS + " inside quotes",
              f"{COMFYUI} comfy/text_encoders/hunyuan_image.py:20-38, comfy/text_encoders/qwen_image.py:39 "
              f"(disable_weights=True); {_WEIGHTS}"),
    # ------------------------------------------------------- ComfyUI: the LLM-encoder families (issue 45)
    Behaviour("comfyui", ("flux2",), "mistral.tokenizer.max_length", 0,
              "does not pad the Mistral prompt (min_length=1, and pad_left=True where it pads) and never truncates "
              "(max_length=99999999), so the transformer, which gets no mask, sees the prompt's tokens only, not 512",
              _DIFFUSERS_DEFAULT.format(pipe="Flux2Pipeline's", family="FLUX.2"),
              f"{COMFYUI} comfy/text_encoders/flux.py:118-121 (Mistral3Tokenizer), 126-138 (Flux2Tokenizer); "
              "comfy/model_base.py:889-898 (Flux2 inherits Flux: no mask to the model)",
              fix_as_trained="sample in diffusers with max_sequence_length={trained} (no ComfyUI setting pads it)"),
    Behaviour("comfyui", ("flux2",), "mistral.tokenizer.text_cleaning", "none",
              "does not remove \"[IMG]\" from the prompt (Flux2Tokenizer formats the text into its system-prompt "
              "template as written)",
              "remove \"[IMG]\" from prompts before sampling; prompts without it are unaffected",
              f"{COMFYUI} comfy/text_encoders/flux.py:126-138", when="prompts containing \"[IMG]\""),
    Behaviour("comfyui", ("flux2-klein",), "qwen3.tokenizer.truncation", False,
              "pads Qwen3 to at least 512 tokens but never cuts a longer prompt (Qwen3Tokenizer min_length=512, "
              "max_length=99999999)",
              "keep prompts, with the chat template, under 512 Qwen3 tokens, or "
              + _DIFFUSERS_DEFAULT.format(pipe="Flux2KleinPipeline's", family="FLUX.2 klein"),
              f"{COMFYUI} comfy/text_encoders/flux.py:176-203 (template with the empty think block at :194)",
              when="prompts over 512 Qwen3 tokens with the template"),
    Behaviour("comfyui", ("z-image",), "qwen3.tokenizer.truncation", False,
              "never cuts a prompt over 512 tokens (Qwen3Tokenizer min_length=1, max_length=99999999: no padding, "
              "no truncation)",
              "keep prompts, with the chat template, under 512 Qwen3 tokens, or "
              + _DIFFUSERS_DEFAULT.format(pipe="ZImagePipeline's", family="Z-Image"),
              f"{COMFYUI} comfy/text_encoders/z_image.py:6-9 (Qwen3Tokenizer), 15-23 (template, weights off)",
              when="prompts over 512 Qwen3 tokens with the template"),
    Behaviour("comfyui", ("qwen-image-edit",), "qwen.images.resample", "area",
              "gives the VL encoder the image scaled to about 1024x1024 pixels by \"area\" resampling with no rounding "
              "to a multiple of 32 in TextEncodeQwenImageEdit (CLIPTextEncode uses Qwen-Image's text-to-image template "
              "and no image)",
              "encode with the TextEncodeQwenImageEdit node (its template and 64-token drop are the profile's); the VL "
              "image's resampling has no setting",
              f"{COMFYUI} comfy_extras/nodes_qwen.py:28-50, comfy/text_encoders/qwen_image.py:17-38 (templates), "
              "61-85 (drops the prefix up to <|im_start|>user\\n)",
              not_for=("qwen-image-edit-2509", "qwen-image-edit-2511")),
    Behaviour("comfyui", ("qwen-image-edit-2509", "qwen-image-edit-2511"), "qwen.images.resample", "area",
              "gives the VL encoder each image scaled to about 384x384 pixels by \"area\" resampling with no "
              "rounding to a multiple of 32 in TextEncodeQwenImageEditPlus (TextEncodeQwenImageEdit uses the original "
              "Edit template and 1024x1024; CLIPTextEncode Qwen-Image's text-to-image template)",
              "encode with the TextEncodeQwenImageEditPlus node (its \"Picture N:\" prefix and template are the "
              "profile's); the VL image's resampling has no setting",
              f"{COMFYUI} comfy_extras/nodes_qwen.py:73-106, comfy/text_encoders/qwen_image.py:61-85"),
    Behaviour("comfyui", ("ltx2",), "gemma.tokenizer.max_length", 0,
              "does not pad Gemma (min_length=1) and never truncates (max_length=99999999): the text connectors get "
              "the prompt's tokens only, not 1024 left-padded ones",
              _DIFFUSERS_DEFAULT.format(pipe="LTX2Pipeline's", family="LTX-2"),
              f"{COMFYUI} comfy/text_encoders/lt.py:25-35 (Gemma3_12BTokenizer), 96-112 (all layers, normalised "
              "over the unpadded tokens)",
              fix_as_trained="sample in diffusers with max_sequence_length={trained} (no ComfyUI setting pads it)"),
    Behaviour("comfyui", ("ltx2",), "gemma.tokenizer.text_cleaning", "none",
              "does not strip spaces and line breaks from the ends of the prompt",
              "write prompts without leading or trailing whitespace",
              f"{COMFYUI} comfy/text_encoders/lt.py:25-35; comfy/sd1_clip.py:550-597 (no cleaning step)",
              when="prompts with leading or trailing whitespace"),
    Behaviour("comfyui", ("ltx2",), None, None,
              "reads (word:1.2) and (word) in a prompt as Gemma token weights (Gemma3_12BTokenizer keeps weights on)",
              _NO_PARENS,
              f"{COMFYUI} comfy/text_encoders/lt.py:25-28; {_WEIGHTS}"),
    Behaviour("comfyui", ("krea2",), "qwen.tokenizer.truncation", False,
              "does not pad the prompt (min_length=1, so the model gets no padding before the template's suffix) and "
              "never cuts a prompt over 512 tokens (max_length=99999999)",
              "keep prompts, with the chat template, under 512 Qwen3-VL tokens, or "
              + _DIFFUSERS_DEFAULT.format(pipe="Krea2Pipeline's", family="Krea 2"),
              f"{COMFYUI_KREA2} comfy/text_encoders/krea2.py:17-33 (taps, template, no think block), 46-75 (drops "
              f"the prefix up to <|im_start|>user\\n); {COMFYUI_QWEN3VL} comfy/text_encoders/qwen3vl.py "
              "(Qwen3VLSDTokenizer: min_length=1, max_length=99999999, weights off). Not in ComfyUI fe25114",
              when="prompts over 512 Qwen3-VL tokens with the template"),
    Behaviour("comfyui", ("ideogram4",), "qwen.tokenizer.max_length", 0,
              "does not pad Qwen3-VL (min_length=1; the profile left-pads to 2048 and zeroes the padding) and encodes a "
              "prompt over 2048 tokens instead of refusing it",
              _DIFFUSERS_DEFAULT.format(pipe="Ideogram4Pipeline's", family="Ideogram 4"),
              f"{COMFYUI_IDEOGRAM4} comfy/text_encoders/ideogram4.py:19-42 (tokenizer, template, weights off), 15-16 "
              "and 64-68 (the 13 taps, offset +1, interleaved as the profile). Not in ComfyUI fe25114",
              fix_as_trained="sample in diffusers with max_sequence_length={trained} (no ComfyUI setting pads it)"),
    # ------------------------------------------------------------------------------------------ Forge
    Behaviour("forge", ("flux",), "t5.tokenizer.max_length", 256,
              "pads T5 to at least 256 tokens and never truncates",
              "sample in ComfyUI with " + NODE + " or in diffusers instead (Forge has no setting for it)",
              f"{FORGE} backend/text_processing/t5_engine.py:20,54,86-90; backend/diffusion_engine/flux.py:70-74",
              fix_as_trained="sample elsewhere, as Forge has no setting for it: in diffusers with "
                             "max_sequence_length={trained}, or in ComfyUI with " + _T5_OPTS),
    Behaviour("forge", ("sd3",), "t5.tokenizer.max_length", 0,
              "leaves T5 off by default (sd3_enable_t5 = False) and feeds zeros [B, 256, 4096] instead",
              "enable T5 in Settings (sd3_enable_t5); Forge then pads T5 to at least 256 without truncating",
              f"{FORGE} backend/diffusion_engine/sd35.py:107-110, modules/shared_options.py:198"),
    Behaviour("forge", ("sd3",), "clip_l.encoder.layer", "last",
              "takes CLIP-L and CLIP-G hidden_states[-1] without the final layer norm (clip skip 1); diffusers "
              "and the reference use hidden_states[-2]",
              "set Clip skip to 2 in Settings",
              f"{FORGE} backend/diffusion_engine/sd35.py:56-82, modules/processing.py:472"),
    Behaviour("forge", ("sd3",), "empty_prompt", "zeros",
              "turns an empty negative prompt into all zeros (CLIP, T5 and pooled)",
              "write a negative prompt (even a space is not empty to Forge's check)",
              f"{FORGE} backend/diffusion_engine/sd35.py:114-121"),
    Behaviour("forge", ("chroma",), "t5.tokenizer.max_length", 0,
              "does not pad T5 at all (min_length=1)",
              "sample in ComfyUI with " + NODE + " or in diffusers instead (Forge has no setting for it)",
              f"{FORGE} backend/diffusion_engine/chroma.py:38-43",
              fix_as_trained="sample in diffusers with max_sequence_length={trained} (Forge has no setting for it)"),
    Behaviour("forge", ("sdxl",), "empty_prompt", "zeros",
              "turns an empty negative prompt into zeros, as diffusers does",
              "", f"{FORGE} backend/diffusion_engine/sdxl.py:109-114"),
    Behaviour("forge", ("sd1", "sd2", "sdxl", "sd3", "flux"), None, None,
              "reads (word:1.2) as weights and encodes a prompt over 75 CLIP tokens as extra 75-token chunks "
              "(moving back to the last comma)",
              "write prompts without ( ) weights and under 75 CLIP tokens",
              f"{FORGE} backend/text_processing/classic_engine.py:55,160-230"),
    Behaviour("forge", ("chroma", "flux"), None, None,
              "reads (word:1.2) and [word] as T5 token weights (its emphasis setting) and tokenizes the text between "
              "them separately",
              "write prompts without ( ) or [ ] weights",
              f"{FORGE} backend/text_processing/t5_engine.py:68-71,95-105,147-156; modules/shared_options.py:179 (emphasis "
              "\"Original\")"),
    # -------------------------------------------------------------------------------------- diffusers
    Behaviour("diffusers", ("flux-schnell",), "t5.tokenizer.max_length", 512,
              "FluxPipeline pads and truncates T5 to max_sequence_length=512 by default, for schnell too",
              "pass max_sequence_length={trained} to the pipeline call, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/flux/pipeline_flux.py:630", fix_as_trained=_MAXLEN_AS_TRAINED),
    Behaviour("diffusers", ("flux-dev",), "t5.tokenizer.max_length", 512,
              "FluxPipeline pads and truncates T5 to max_sequence_length=512 by default",
              "pass max_sequence_length={trained} to the pipeline call, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/flux/pipeline_flux.py:630", fix_as_trained=_MAXLEN_AS_TRAINED),
    Behaviour("diffusers", ("flux",), "t5.masks.encoder", False,
              "FluxPipeline runs T5 without an attention mask and passes none to the transformer",
              "", f"{DIFFUSERS}/flux/pipeline_flux.py:234-254",
              fix_as_trained="call te_align.apply(pipe, OVERRIDDEN), which runs T5 with its mask (FluxPipeline "
                             "takes no mask for the transformer)"),
    Behaviour("diffusers", ("sd3",), "t5.tokenizer.max_length", 256,
              "StableDiffusion3Pipeline pads and truncates T5 to max_sequence_length=256 by default",
              "pass max_sequence_length={trained} to the pipeline call, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/stable_diffusion_3/pipeline_stable_diffusion_3.py:802", fix_as_trained=_MAXLEN_AS_TRAINED),
    Behaviour("diffusers", ("chroma",), "t5.tokenizer.max_length", 512,
              "ChromaPipeline pads and truncates T5 to max_sequence_length=512 by default",
              "pass max_sequence_length={trained} to the pipeline call",
              f"{DIFFUSERS}/chroma/pipeline_chroma.py:614"),
    Behaviour("diffusers", ("sdxl",), "empty_prompt", "zeros",
              "StableDiffusionXLPipeline turns an empty negative prompt into zeros (force_zeros_for_empty_prompt)",
              "pass negative_prompt=\"\" explicitly to have \"\" encoded, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/stable_diffusion_xl/pipeline_stable_diffusion_xl.py:250,422-425",
              fix_as_trained="pass negative_prompt=\"\" explicitly to have \"\" encoded"),
    Behaviour("diffusers", ("sd3",), "empty_prompt", "encode",
              "StableDiffusion3Pipeline encodes an empty negative prompt as \"\"",
              "call te_align.apply(pipe, PROFILE), which gives the profile's empty prompt",
              f"{DIFFUSERS}/stable_diffusion_3/pipeline_stable_diffusion_3.py:466-469",
              fix_as_trained="call te_align.apply(pipe, OVERRIDDEN)"),
)


@dataclass(frozen=True)
class InferenceNote:
    """How one inference tool differs from what was trained (or a note about its prompt syntax)."""

    tool: str
    setting: str
    #: The trained value; None where the trainer does not record it (``trained_known`` False) or none applies.
    trained: object
    tool_value: object
    message: str
    fix: str
    source: str
    #: The profile's value of ``setting`` (None for a prompt-syntax note).
    profile_value: object = None
    trained_known: bool = True

    def to_dict(self) -> dict[str, object]:
        return {"tool": self.tool, "setting": self.setting, "trained": self.trained,
                "trained_known": self.trained_known, "profile": self.profile_value, "tool_value": self.tool_value,
                "message": self.message, "fix": self.fix, "source": self.source}


#: What a note says instead of a value the trainer does not record.
UNKNOWN = "unknown (the trainer does not record it)"


def check_tool(tool: str) -> str:
    """The tool key for ``tool`` (case-insensitive), or one line naming the closest."""
    key = str(tool).strip().lower()
    if key not in TOOLS:
        raise TeAlignError(f"unknown inference tool '{tool}'; choose one of {', '.join(TOOLS)}" + closest(key, list(TOOLS)))
    return key


def _profile_value(profile: AlignmentProfile, path: str) -> object:
    return profile.get(path) if "." not in path else profile.get(f"slots.{path}")


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, str):
        return f'"{v}"' if v == "" or " " in v or len(v) > 30 else v
    return str(v)


def _overridden(profile: AlignmentProfile, path: str, value: object) -> str:
    """Python for the profile with ``path`` set to ``value`` (``te_align.profile('flux-schnell', t5_max_length=512)``)."""
    full = path if "." not in path else f"slots.{path}"
    slot, _, rest = path.partition(".")
    short = f"{slot}_{rest.rsplit('.', 1)[-1]}" if rest else path
    try:
        ok = short.isidentifier() and canonical_key(profile, short) == full
    except TeAlignError:
        ok = False
    arg = f"{short}={value!r}" if ok else f"**{{{path!r}: {value!r}}}"
    return f"te_align.profile({profile.name!r}, {arg})"


def inference_notes(
    profile: AlignmentProfile, tool: str, effective: Mapping[str, object] | None = None
) -> list[InferenceNote]:
    """Where sampling in ``tool`` gives other conditioning than the training did.

    ``profile``: the profile trained with (an :class:`~te_align.profiles.AlignmentProfile`). ``effective``: the
    trainer's recorded settings by slot-relative path (``check``'s ``effective``): a value there is what was trained;
    a path missing from it is unknown, and the note says so and compares the profile's value with the tool's. None:
    trained exactly by the profile (te-align's own training). A behaviour whose value equals the trained (or, when
    unknown, the profile's) value gives no note; a behaviour without a path (prompt syntax) always gives one.

    Each note carries one recommendation: where the trained value is the profile's (or unknown), sample by the
    profile (te-align's node, ``te_align.apply``); where the trainer used another value, sample as trained with the
    tool's own settings (the behaviour's ``fix_as_trained``), never the profile's value.
    """
    key = check_tool(tool)
    eff = None if effective is None else dict(effective)
    name = TOOLS[key]
    notes: list[InferenceNote] = []
    for b in BEHAVIOURS:
        if b.tool != key or not b.applies(profile.name, profile.family):
            continue
        if b.path is None:
            notes.append(InferenceNote(key, "prompt syntax", None, None, f"{name} {b.does}", b.fix, b.source))
            continue
        slot = b.path.split(".", 1)[0]
        if "." in b.path and slot not in profile.slot_names:
            continue
        prof = _profile_value(profile, b.path)
        known = eff is None or b.path in eff
        trained = (prof if eff is None else eff[b.path]) if known else None
        compared = trained if known else prof
        if _same(b, compared):
            continue
        setting = b.path
        deviates = known and trained != prof
        fix = (b.fix_as_trained or b.fix) if deviates else b.fix
        fix = (fix.replace("{trained}", _fmt(compared)).replace("OVERRIDDEN", _overridden(profile, b.path, trained))
               .replace("PROFILE", f"'{profile.name}'"))
        if not known:
            msg = (f"you trained with {setting} = {UNKNOWN}; the profile says {_fmt(prof)}, and {name} {b.does}")
        elif b.path.endswith("tokenizer.max_length"):
            msg = f"you trained at {_fmt(trained)} ({setting})" + (f", not the profile's {_fmt(prof)}" if deviates else "")
            msg += f"; {name} {b.does}"
        else:
            msg = f"you trained with {setting} = {_fmt(trained)}" + (f", not the profile's {_fmt(prof)}" if deviates else "")
            msg += f"; {name} {b.does}"
        notes.append(InferenceNote(key, setting, trained, b.value, msg, fix, b.source, prof, known))
    return notes


def _same(b: Behaviour, trained: object) -> bool:
    if b.path is not None and b.path.endswith("system_prompt"):
        return not trained  # the tool adds none: the same only when none was trained
    if b.path is not None and b.path.endswith("tokenizer.max_length") and b.value == 0:
        return False  # no padding at all never matches a padded training
    return trained == b.value


__all__ = ["BEHAVIOURS", "TOOLS", "UNKNOWN", "Behaviour", "InferenceNote", "check_tool", "inference_notes"]
