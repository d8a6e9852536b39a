"""Inference-side integrations: the conditioning a LoRA was trained with is the one it meets when sampled.

* :mod:`te_align.integrations.targets` — what ComfyUI, Forge and the diffusers pipelines do with each model
  family's prompts (torch-free data with sources), read by ``te-align check --for``;
* :mod:`te_align.integrations.diffusers` — :func:`apply`: a diffusers pipeline encodes prompts by a profile;
* :mod:`te_align.integrations.comfyui` — ComfyUI custom nodes that encode by a profile with the encoders
  ComfyUI loaded, and ``te-align comfyui install`` (a transaction);
* :mod:`te_align.integrations.lora` — which profile a LoRA file was trained with (its ``te_align.*``
  metadata or kohya ``ss_*`` keys), torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

    from te_align.profiles.model import AlignmentProfile

# Function-local te_align imports in this module: keep torch (te_align.integrations.diffusers imports it) off
# this package's import.

_Pipe = TypeVar("_Pipe", bound="DiffusionPipeline")


def apply(pipe: _Pipe, profile: AlignmentProfile | str | None = None, **kwargs: Any) -> _Pipe:
    """Make a diffusers pipeline encode prompts by ``profile`` (see :func:`te_align.integrations.diffusers.apply`)."""
    from te_align.integrations.diffusers import apply as _apply

    return _apply(pipe, profile, **kwargs)


__all__ = ["apply"]
