"""te-align: make diffusion-model training condition on text exactly the way the model was trained.

Public API. Heavy modules (torch, transformers, diffusers) are imported only when a function that
needs them is called, so ``import te_align`` and the CLI start fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from te_align import _quiet, encoding, integrations
from te_align._version import __version__
from te_align.errors import TeAlignError
from te_align.profiles import AlignmentProfile, profile, profiles

# Function-local te_align imports in this module: would close an import loop at module level.

_quiet.install()  # drop the third-party log lines a user cannot act on (te_align/_quiet.py says which and why)


if TYPE_CHECKING:  # pragma: no cover
    from diffusers import DiffusionPipeline

    from te_align.encoding import Conditioning


def encode(profile: AlignmentProfile | str, prompts: str | list[str], **kwargs: Any) -> Conditioning:
    """Encode prompts exactly by a profile (see :func:`te_align.encoding.encode`)."""
    return encoding.encode(profile, prompts, **kwargs)


def load_text_encoders(profile: AlignmentProfile | str, path_or_repo: str, **kwargs: Any) -> tuple[dict, dict]:
    """Load the tokenizers and text encoders a profile needs (see :func:`te_align.encoding.load_text_encoders`)."""
    return encoding.load_text_encoders(profile, path_or_repo, **kwargs)


_Pipe = TypeVar("_Pipe", bound="DiffusionPipeline")


def apply(pipe: _Pipe, profile: AlignmentProfile | str | None = None, **kwargs: Any) -> _Pipe:
    """Make a diffusers pipeline encode its prompts by a profile, by default the one it carries (see
    :func:`te_align.integrations.diffusers.apply`)."""
    return integrations.apply(pipe, profile, **kwargs)


__all__ = [
    "AlignmentProfile", "TeAlignError", "__version__", "apply", "encode", "load_text_encoders", "profile", "profiles",
]
