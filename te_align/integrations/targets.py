"""What each inference tool does with a model family's prompts, compared with how a LoRA was trained.

Torch-free data, read by ``te-align check --for comfyui|forge|diffusers`` (:func:`inference_notes`) and by the
inference matrix. Each :class:`Behaviour` names the setting it concerns (a slot-relative profile path such as
``t5.tokenizer.max_length``), the value the tool effectively uses, what it does in words, how to sample as
trained in that tool, and the upstream source (file:line at a commit) it was read from.

Sources: ComfyUI upstream (comfyanonymous/ComfyUI) at fe2511468d6b (2026-02-03, v0.12.1+); Forge
(lllyasviel/stable-diffusion-webui-forge) at dfdcbab685e5; diffusers 0.42.1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from te_align.errors import TeAlignError, closest

COMFYUI = "comfyanonymous/ComfyUI@fe25114"
FORGE = "lllyasviel/stable-diffusion-webui-forge@dfdcbab"
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
    value: Any
    #: What the tool does, as a clause ("pads T5 to at least 256 tokens and never truncates").
    does: str
    #: How to sample as trained in that tool; ``{trained}`` is filled with the trained value.
    fix: str
    source: str
    #: Prompts for which the difference is real ("prompts over 255 T5 tokens"); empty: every prompt.
    when: str = ""

    def applies(self, profile_name: str, family: str) -> bool:
        return profile_name in self.applies_to or family in self.applies_to


_T5_OPTS = "or a T5TokenizerOptions node with min_length={trained} before it (prompts over {trained} tokens are still not cut)"

BEHAVIOURS: tuple[Behaviour, ...] = (
    # ----------------------------------------------------------------------------------------- ComfyUI
    Behaviour("comfyui", ("flux",), "t5.tokenizer.max_length", 256,
              "pads T5 to at least 256 tokens and never truncates (T5XXLTokenizer min_length=256, max_length=99999999)",
              f"use {NODE}, " + _T5_OPTS,
              f"{COMFYUI} comfy/text_encoders/flux.py:12-15; padding in comfy/sd1_clip.py:637-645"),
    Behaviour("comfyui", ("sd3",), "t5.tokenizer.max_length", 77,
              "pads T5 to at least 77 tokens and never truncates, as Stability's sd3.5 reference code does",
              f"use {NODE}, " + _T5_OPTS,
              f"{COMFYUI} comfy/text_encoders/sd3_clip.py:35-38"),
    Behaviour("comfyui", ("chroma",), "t5.tokenizer.max_length", 0,
              "does not pad T5 at all (min_length=1) and passes no attention mask to T5 or the model",
              f"use {NODE} (it encodes with the mask and keeps the real tokens plus the pad Chroma sees)",
              f"{COMFYUI} comfy/text_encoders/pixart_t5.py:24-27, comfy/sd.py:1303-1305"),
    Behaviour("comfyui", ("flux", "sd3"), "t5.masks.encoder", False,
              "runs T5 without an attention mask (T5XXLModel attention_mask=False)",
              f"use {NODE}, which passes the mask as the profile says",
              f"{COMFYUI} comfy/text_encoders/sd3_clip.py:11-20, comfy/text_encoders/flux.py:41"),
    Behaviour("comfyui", ("sdxl",), "empty_prompt", "encode",
              "encodes an empty negative prompt as the text \"\" (zeros only through ConditioningZeroOut)",
              "use the te-align Empty Negative node or ConditioningZeroOut on the negative",
              f"{COMFYUI} nodes.py:58-79 (CLIPTextEncode), nodes.py:250-271 (ConditioningZeroOut)"),
    Behaviour("comfyui", ("lumina2",), "gemma.tokenizer.system_prompt", None,
              "adds no system prompt in CLIPTextEncode (only the CLIPTextEncodeLumina2 node adds one)",
              f"use {NODE} or CLIPTextEncodeLumina2",
              f"{COMFYUI} comfy_extras/nodes_lumina2.py:66-114, comfy/text_encoders/lumina2.py:6-9"),
    Behaviour("comfyui", ("sd1", "sdxl", "sd3", "flux"), None, None,
              "reads (word:1.2) and (word) in a prompt as weights (for T5 too) and encodes a prompt over 75 CLIP "
              "tokens as extra 77-token chunks instead of cutting it",
              f"{NODE} encodes the text as written, exactly as the profile says",
              f"{COMFYUI} comfy/sd1_clip.py:304-352 (weights), 550-645 (chunks)"),
    # ------------------------------------------------------------------------------------------ Forge
    Behaviour("forge", ("flux",), "t5.tokenizer.max_length", 256,
              "pads T5 to at least 256 tokens and never truncates",
              "sample in ComfyUI with " + NODE + " or in diffusers instead (Forge has no setting for it)",
              f"{FORGE} backend/text_processing/t5_engine.py:20,54,86-90; backend/diffusion_engine/flux.py:70-74"),
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
              f"{FORGE} backend/diffusion_engine/chroma.py:38-43"),
    Behaviour("forge", ("sdxl",), "empty_prompt", "zeros",
              "turns an empty negative prompt into zeros, as diffusers does",
              "", f"{FORGE} backend/diffusion_engine/sdxl.py:109-114"),
    Behaviour("forge", ("sd1", "sdxl", "sd3", "flux"), None, None,
              "reads (word:1.2) as weights and encodes a prompt over 75 CLIP tokens as extra 75-token chunks "
              "(moving back to the last comma)",
              "write prompts without ( ) weights and under 75 CLIP tokens",
              f"{FORGE} backend/text_processing/classic_engine.py:55,160-230"),
    # -------------------------------------------------------------------------------------- diffusers
    Behaviour("diffusers", ("flux-schnell",), "t5.tokenizer.max_length", 512,
              "FluxPipeline pads and truncates T5 to max_sequence_length=512 by default, for schnell too",
              "pass max_sequence_length={trained} to the pipeline call, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/flux/pipeline_flux.py:630"),
    Behaviour("diffusers", ("flux-dev",), "t5.tokenizer.max_length", 512,
              "FluxPipeline pads and truncates T5 to max_sequence_length=512 by default",
              "pass max_sequence_length={trained} to the pipeline call, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/flux/pipeline_flux.py:630"),
    Behaviour("diffusers", ("sd3",), "t5.tokenizer.max_length", 256,
              "StableDiffusion3Pipeline pads and truncates T5 to max_sequence_length=256 by default",
              "pass max_sequence_length={trained} to the pipeline call, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/stable_diffusion_3/pipeline_stable_diffusion_3.py:802"),
    Behaviour("diffusers", ("chroma",), "t5.tokenizer.max_length", 512,
              "ChromaPipeline pads and truncates T5 to max_sequence_length=512 by default",
              "pass max_sequence_length={trained} to the pipeline call, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/chroma/pipeline_chroma.py:614"),
    Behaviour("diffusers", ("sdxl",), "empty_prompt", "zeros",
              "StableDiffusionXLPipeline turns an empty negative prompt into zeros (force_zeros_for_empty_prompt)",
              "pass negative_prompt=\"\" explicitly to have \"\" encoded, or call te_align.apply(pipe, PROFILE)",
              f"{DIFFUSERS}/stable_diffusion_xl/pipeline_stable_diffusion_xl.py:250,422-425"),
    Behaviour("diffusers", ("sd3",), "empty_prompt", "encode",
              "StableDiffusion3Pipeline encodes an empty negative prompt as \"\"",
              "call te_align.apply(pipe, PROFILE), which gives the profile's empty prompt",
              f"{DIFFUSERS}/stable_diffusion_3/pipeline_stable_diffusion_3.py:466-469"),
)


@dataclass(frozen=True)
class InferenceNote:
    """How one inference tool differs from what was trained (or a note about its prompt syntax)."""

    tool: str
    setting: str
    trained: Any
    tool_value: Any
    message: str
    fix: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "setting": self.setting, "trained": self.trained, "tool_value": self.tool_value,
                "message": self.message, "fix": self.fix, "source": self.source}


def check_tool(tool: str) -> str:
    """The tool key for ``tool`` (case-insensitive), or one line naming the closest."""
    key = str(tool).strip().lower()
    if key not in TOOLS:
        raise TeAlignError(f"unknown inference tool '{tool}'; choose one of {', '.join(TOOLS)}" + closest(key, list(TOOLS)))
    return key


def _trained_value(profile: Any, effective: Mapping[str, Any], path: str) -> Any:
    if path in effective:
        return effective[path]
    if "." not in path:
        return profile.get(path)
    slot = path.split(".", 1)[0]
    if slot not in profile.slot_names:
        return None
    return profile.get(f"slots.{path}")


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, str):
        return f'"{v}"' if v == "" or " " in v or len(v) > 30 else v
    return str(v)


def inference_notes(profile: Any, tool: str, effective: Mapping[str, Any] | None = None) -> list[InferenceNote]:
    """Where sampling in ``tool`` gives other conditioning than the training did.

    ``profile``: the profile trained with (an :class:`~te_align.profiles.AlignmentProfile`); ``effective``: the
    trainer's effective settings by slot-relative path (``check``'s ``effective``), which win over the profile's
    values. A behaviour whose value equals the trained value gives no note; a behaviour without a path (prompt
    syntax) always gives one.
    """
    key = check_tool(tool)
    eff = dict(effective or {})
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
        trained = _trained_value(profile, eff, b.path)
        if _same(b, trained, profile, eff):
            continue
        setting = b.path
        fix = b.fix.replace("{trained}", _fmt(trained)).replace("PROFILE", f"'{profile.name}'")
        if b.path.endswith("tokenizer.max_length"):
            msg = f"you trained at {_fmt(trained)} ({setting}); {name} {b.does}"
        else:
            msg = f"you trained with {setting} = {_fmt(trained)}; {name} {b.does}"
        notes.append(InferenceNote(key, setting, trained, b.value, msg, fix, b.source))
    return notes


def _same(b: Behaviour, trained: Any, profile: Any, eff: Mapping[str, Any]) -> bool:
    if b.path is not None and b.path.endswith("system_prompt"):
        return not trained  # the tool adds none: the same only when none was trained
    if b.path is not None and b.path.endswith("tokenizer.max_length") and b.value == 0:
        return False  # no padding at all never matches a padded training
    return trained == b.value


__all__ = ["BEHAVIOURS", "TOOLS", "Behaviour", "InferenceNote", "check_tool", "inference_notes"]
