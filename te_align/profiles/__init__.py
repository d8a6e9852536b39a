"""Alignment profiles: data model, bundled registry, the one source dispatcher, sources and serialization (no torch)."""

from te_align.profiles.model import (
    AlignmentProfile,
    Alternative,
    EncoderSpec,
    MaskSpec,
    Provenance,
    SlotSpec,
    TokenizerSpec,
)
from te_align.profiles.registry import bundled, bundled_names, profiles
from te_align.profiles.resolve import profile
from te_align.profiles.serialize import load_profile_file, profile_from_dict, profile_to_dict

__all__ = [
    "AlignmentProfile",
    "Alternative",
    "EncoderSpec",
    "MaskSpec",
    "Provenance",
    "SlotSpec",
    "TokenizerSpec",
    "bundled",
    "bundled_names",
    "load_profile_file",
    "profile",
    "profile_from_dict",
    "profile_to_dict",
    "profiles",
]
