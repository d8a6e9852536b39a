"""The te-align ComfyUI nodes: "te-align Text Encode" and "te-align Empty Negative".

Both take ComfyUI's CLIP object and a profile: a bundled name, or ``from LoRA`` (the profile the chosen LoRA's
``te_align.*`` metadata or kohya ``ss_*`` keys name; a LoRA without either falls back to the CLIP family's
default profile and says so). Outputs: CONDITIONING, and a STRING saying which profile encoded it and why
(connect it to ComfyUI's "Preview as Text" to see it; ComfyUI's frontend does not draw a node's own text output).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from te_align.errors import TeAlignError
from te_align.integrations.comfyui.encode import (
    FALLBACK_PROFILES,
    NodeError,
    check_supported,
    encode_with_clip,
    to_conditioning,
)
from te_align.integrations.lora import profile_from_lora
from te_align.profiles import profile as load
from te_align.profiles import profiles

if TYPE_CHECKING:
    from te_align.integrations.comfyui.encode import ComfyClip
    from te_align.profiles.model import AlignmentProfile

#: A node's INPUT_TYPES: section -> input name -> (type or choices, options).
InputTypes = dict[str, dict[str, tuple[object, ...]]]

FROM_LORA = "from LoRA"
NO_LORA = "(none)"
CATEGORY = "conditioning/te-align"
log = logging.getLogger("te_align.comfyui")


def _profile_names() -> list[str]:
    families = set(FALLBACK_PROFILES)
    return [p.name for p in profiles() if p.family in families]


def _lora_names() -> list[str]:
    try:
        import folder_paths

        return [NO_LORA, *folder_paths.get_filename_list("loras")]
    except Exception:  # outside a ComfyUI process (tests, docs): no LoRA folder to list
        return [NO_LORA]


#: (node class, profile, lora_name) whose last run was a user mistake: ComfyUI would otherwise replay the cached
#: blocked result silently when the same graph is queued again.
_BLOCKED: set[tuple[str, str, str]] = set()


def changed(node: str, profile: object = None, lora_name: object = NO_LORA, **_: object) -> float | str:
    """The nodes' IS_CHANGED: NaN (run again) after a mistake with these inputs, so the line is reported again;
    with 'from LoRA', the LoRA file's size and modification time, so a re-stamped LoRA is read again."""
    if (node, str(profile), str(lora_name)) in _BLOCKED:
        return float("nan")
    if profile == FROM_LORA and lora_name and lora_name != NO_LORA:
        try:
            import folder_paths

            st = os.stat(folder_paths.get_full_path("loras", lora_name) or lora_name)
            return f"{lora_name}:{st.st_size}:{st.st_mtime_ns}"
        except (ImportError, OSError, TypeError):
            return str(lora_name)
    return ""


def blocked(node: str, error: Exception) -> dict[str, object]:
    """The node's result for a user mistake: one line, no traceback.

    ComfyUI's ExecutionBlocker (comfy_execution/graph_utils.py) as both outputs: the nodes that use them are not run
    and ComfyUI reports "Execution Blocked: <node>: <message>" with an empty traceback (execution.py,
    execution_block_cb). The line is also logged (and is the node's ui text). A ComfyUI without ExecutionBlocker
    gets the error raised (its panel then shows the same line, with a traceback).
    """
    line = f"{node}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    log.warning("te-align: %s", line)
    try:
        from comfy_execution.graph_utils import ExecutionBlocker
    except ImportError:
        raise NodeError(line) from None
    return {"ui": {"text": [line]}, "result": (ExecutionBlocker(line), ExecutionBlocker(line))}


def pick_profile(
    clip: object, profile: AlignmentProfile | str, lora_name: str = NO_LORA
) -> tuple[AlignmentProfile, str]:
    """(profile, one-line info) for the node inputs; a user mistake raises :class:`NodeError` in one line."""
    if hasattr(profile, "slots"):
        return profile, f"profile {profile.name}"
    if profile != FROM_LORA:
        try:
            p = load(profile)
        except TeAlignError as e:
            raise NodeError(str(e).splitlines()[0]) from None
        return p, f"profile {p.name}"
    fam, _ = check_supported(clip)
    fallback = FALLBACK_PROFILES.get(fam or "")
    if not lora_name or lora_name == NO_LORA:
        raise NodeError("profile is 'from LoRA' but no LoRA is chosen: pick the LoRA you sample with, or a profile")
    try:
        import folder_paths

        path = folder_paths.get_full_path("loras", lora_name) or lora_name
    except ImportError:
        path = lora_name
    try:
        found = profile_from_lora(path, fallback=fallback)
    except TeAlignError as e:
        raise NodeError(str(e).splitlines()[0]) from None
    if found.fell_back:
        log.warning("te-align: %s", found.message)
    return found.profile, found.message


class TeAlignTextEncode:
    """Encode a prompt exactly as a profile (the one the LoRA was trained with) says."""

    @classmethod
    def INPUT_TYPES(cls) -> InputTypes:
        return {
            "required": {
                "clip": ("CLIP", {"tooltip": "ComfyUI's loaded text encoders (no second copy is made)"}),
                "profile": ([FROM_LORA, *_profile_names()], {
                    "default": "flux-dev",
                    "tooltip": "the alignment profile to encode by, or 'from LoRA' to read it from the LoRA's metadata"}),
                "text": ("STRING", {"multiline": True, "dynamicPrompts": True,
                                    "tooltip": "the prompt, encoded as written: ( ) are text, not weights"}),
            },
            "optional": {
                "lora_name": (_lora_names(), {"tooltip": "the LoRA whose metadata names the profile ('from LoRA')"}),
                "guidance": ("FLOAT", {"default": 3.5, "min": 0.0, "max": 100.0, "step": 0.1,
                                       "tooltip": "Flux only: the guidance key, as CLIPTextEncodeFlux sets it"}),
                "width": ("INT", {"default": 0, "min": 0, "max": 16384, "step": 8,
                                  "tooltip": "SDXL only: size keys; 0 uses the latent's size, as diffusers does"}),
                "height": ("INT", {"default": 0, "min": 0, "max": 16384, "step": 8}),
            },
        }

    RETURN_TYPES = ("CONDITIONING", "STRING")
    RETURN_NAMES = ("conditioning", "profile_info")
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    @classmethod
    def IS_CHANGED(cls, **inputs: object) -> float | str:
        return changed("TeAlignTextEncode", **inputs)

    DESCRIPTION = ("Encodes the prompt with ComfyUI's loaded text encoders exactly as the alignment profile says "
                   "(the conditioning the LoRA was trained with), equal to te_align.encode.")

    def encode(self, clip: ComfyClip, profile: AlignmentProfile | str, text: str, lora_name: str = NO_LORA,
               guidance: float = 3.5, width: int = 0, height: int = 0) -> dict[str, object]:
        key = ("TeAlignTextEncode", str(profile), str(lora_name))
        try:
            p, info = pick_profile(clip, profile, lora_name)
            cond = encode_with_clip(clip, p, text)
        except TeAlignError as e:  # a user mistake (te-align's errors are one line naming the fix)
            _BLOCKED.add(key)
            return blocked(NODE_DISPLAY_NAME_MAPPINGS["TeAlignTextEncode"], e)
        _BLOCKED.discard(key)
        out = to_conditioning(p, cond, guidance=guidance, width=width, height=height)
        info = f"{info} · fingerprint {p.fingerprint()} · {tuple(out[0][0].shape)}"
        return {"ui": {"text": [info]}, "result": (out, info)}


class TeAlignEmptyNegative:
    """The profile's empty prompt: zeros for SDXL, the encoded "" for SD3 and Flux."""

    @classmethod
    def INPUT_TYPES(cls) -> InputTypes:
        req = TeAlignTextEncode.INPUT_TYPES()
        return {"required": {"clip": req["required"]["clip"], "profile": req["required"]["profile"]},
                "optional": {k: req["optional"][k] for k in ("lora_name", "guidance", "width", "height")}}

    RETURN_TYPES = ("CONDITIONING", "STRING")
    RETURN_NAMES = ("conditioning", "profile_info")
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    @classmethod
    def IS_CHANGED(cls, **inputs: object) -> float | str:
        return changed("TeAlignEmptyNegative", **inputs)

    DESCRIPTION = "The unconditional (negative) conditioning the profile's model was trained and sampled with."

    def encode(self, clip: ComfyClip, profile: AlignmentProfile | str, lora_name: str = NO_LORA,
               guidance: float = 3.5, width: int = 0, height: int = 0) -> dict[str, object]:
        key = ("TeAlignEmptyNegative", str(profile), str(lora_name))
        try:
            p, info = pick_profile(clip, profile, lora_name)
            cond = encode_with_clip(clip, p, "", empty=True)
        except TeAlignError as e:
            _BLOCKED.add(key)
            return blocked(NODE_DISPLAY_NAME_MAPPINGS["TeAlignEmptyNegative"], e)
        _BLOCKED.discard(key)
        out = to_conditioning(p, cond, guidance=guidance, width=width, height=height)
        info = f"{info} · empty prompt: {p.empty_prompt} · {tuple(out[0][0].shape)}"
        return {"ui": {"text": [info]}, "result": (out, info)}


NODE_CLASS_MAPPINGS = {"TeAlignTextEncode": TeAlignTextEncode, "TeAlignEmptyNegative": TeAlignEmptyNegative}
NODE_DISPLAY_NAME_MAPPINGS = {"TeAlignTextEncode": "te-align Text Encode", "TeAlignEmptyNegative": "te-align Empty Negative"}
