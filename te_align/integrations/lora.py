"""Which alignment profile a LoRA was trained with, read from its file's metadata (header only, no torch).

Order: the ``te_align.*`` stamp (:mod:`te_align.metadata`: the profile by name, with the stamped behaviour values
applied as overrides where they differ from today's bundled profile); else kohya sd-scripts' keys
(``modelspec.architecture`` / ``ss_base_model_version`` for the model, ``ss_t5xxl_max_token_length``,
``ss_apply_t5_attn_mask`` and ``ss_clip_skip`` for the text-encoder settings sd-scripts trained with); else the
fallback the caller names. The result says in one line where the profile came from, for a UI to show.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from te_align import kohya_lora
from te_align.errors import TeAlignError
from te_align.metadata import read
from te_align.profiles import bundled, profile

#: kohya's modelspec.architecture / ss_base_model_version -> bundled profile (the file format:
#: :mod:`te_align.kohya_lora`).
ARCHITECTURES = kohya_lora.ARCHITECTURES
BASE_VERSIONS = kohya_lora.BASE_VERSIONS


@dataclass(frozen=True)
class LoraProfile:
    """A profile for a LoRA and where it came from."""

    profile: Any
    #: "te_align", "kohya" or "fallback".
    source: str
    message: str
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def fell_back(self) -> bool:
        return self.source == "fallback"


def _from_stamp(te: dict[str, Any], check: dict[str, Any] | None, label: str) -> LoraProfile | None:
    name = te.get("te_align.profile")
    same = (check or {}).get("same_behaviour_as") or []
    base_name = name if (check or {}).get("bundled") else (same[0] if same else None)
    if base_name is None:
        return None  # a stamped profile te-align does not bundle: kohya keys or the fallback decide
    base = bundled(base_name) if (check or {}).get("bundled") else profile(base_name)
    old = te.get("te_align.profile_json")
    overrides: dict[str, Any] = {}
    if isinstance(old, dict) and base.fingerprint() != te.get("te_align.fingerprint"):
        now = base.behaviour()
        overrides = {k: v for k, v in old.items() if k.startswith("slots.") and k in now and now[k] != v}
        if "empty_prompt" in old and old["empty_prompt"] != base.empty_prompt:
            overrides["empty_prompt"] = old["empty_prompt"]
    p = base.with_overrides(overrides) if overrides else base
    extra = f" with {len(overrides)} stamped value(s) that differ from today's bundled profile" if overrides else ""
    return LoraProfile(p, "te_align", f"{label}: profile {base.name}{extra} (te_align.* metadata)", overrides)


def _from_kohya(kohya: dict[str, Any], label: str) -> LoraProfile | None:
    name = kohya_lora.profile_name(kohya)
    if name is None:
        return None
    base = profile(name)
    overrides: dict[str, Any] = {}
    t5 = kohya.get("ss_t5xxl_max_token_length")
    if "t5" in base.slot_names and isinstance(t5, int) and t5 != base.slot("t5").tokenizer.max_length:
        overrides["slots.t5.tokenizer.max_length"] = t5
    if "t5" in base.slot_names and kohya.get("ss_apply_t5_attn_mask") is True:
        overrides["slots.t5.masks.encoder"] = True
        if base.family == "flux":  # sd-scripts passes the mask into the Flux DiT as well
            overrides["slots.t5.masks.denoiser"] = True
    skip = kohya.get("ss_clip_skip")
    if base.family in ("sd1", "sd2") and isinstance(skip, int) and skip > 1:
        overrides.update(kohya_lora.clip_skip_overrides(base.slots[0].name, skip))
    p = base.with_overrides(overrides) if overrides else base
    said = ", ".join(f"{k.removeprefix('slots.')}={v}" for k, v in overrides.items())
    return LoraProfile(p, "kohya", f"{label}: profile {name} from kohya metadata" + (f" ({said})" if said else ""), overrides)


def profile_from_lora(path: str | os.PathLike[str], fallback: Any = None) -> LoraProfile:
    """The profile ``path`` (a LoRA ``.safetensors``) was trained with.

    ``fallback``: a profile (name or object) used when the file has neither a te-align stamp nor kohya keys
    that name the model; without one that case raises :class:`TeAlignError` asking for a profile. An unreadable
    file raises one line naming it.
    """
    label = os.path.basename(os.fspath(path))
    info = read(path)
    found = None
    if info["stamped"]:
        found = _from_stamp(info["te_align"], info["profile_check"], label)
    if found is None:
        found = _from_kohya(info["kohya"], label)
    if found is not None:
        return found
    if fallback is None:
        raise TeAlignError(f"{label} has no te_align.* metadata and no kohya keys that name its model; pick a profile")
    p = profile(fallback) if isinstance(fallback, str) else fallback
    return LoraProfile(p, "fallback", f"{label} has no te_align.* metadata and no kohya model keys: "
                                      f"using profile {p.name} (pick another if it was trained differently)")


__all__ = ["ARCHITECTURES", "BASE_VERSIONS", "LoraProfile", "profile_from_lora"]
