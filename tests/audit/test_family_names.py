"""Model names of the newer families go to their own profiles, and a version without a profile is never read as another."""

from __future__ import annotations

import pytest

from te_align.audit import readers
from te_align.audit.check import _refuse_unbundled
from te_align.audit.rules import guess_from_name


@pytest.mark.parametrize(("name", "profile"), [
    ("black-forest-labs/FLUX.2-klein-4B", "flux2-klein-4b"),
    ("/models/flux-2-klein-base-9b.safetensors", "flux2-klein-9b"),
    ("black-forest-labs/FLUX.2-dev", "flux2-dev"),
    ("black-forest-labs/FLUX.1-Kontext-dev", "flux-dev"),
    ("black-forest-labs/FLUX.1-dev", "flux-dev"),
    ("Tongyi-MAI/Z-Image-Turbo", "z-image"),
    ("Qwen/Qwen-Image-Edit-2509", "qwen-image-edit-2509"),
    ("qwen_image_edit_2511_bf16.safetensors", "qwen-image-edit-2511"),
    ("Qwen/Qwen-Image-Edit-2603", "qwen-image-edit-2603"),
    ("Qwen/Qwen-Image-Edit", "qwen-image-edit"),
    ("Qwen/Qwen-Image", "qwen-image"),
    ("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "wan22"),
    ("Wan-AI/Wan2.1-T2V-14B-Diffusers", "wan21"),
    ("Lightricks/LTX-2", "ltx2"),
])
def test_newer_families_are_not_read_as_the_older_family_their_name_contains(name, profile):
    assert guess_from_name(name) == profile


def test_a_version_without_a_profile_is_not_checked_and_the_nearest_is_named():
    with pytest.raises(readers.NotChecked) as e:
        _refuse_unbundled("qwen-image-edit-2603", " model Qwen/Qwen-Image-Edit-2603", "c.toml")
    assert e.value.reason.startswith(
        "not checked: te-align has no profile for qwen-image-edit-2603 (model Qwen/Qwen-Image-Edit-2603); the nearest it has, ")
    assert e.value.reason.endswith(", is not used in its place; pass --profile NAME to check against a profile you choose")
    _refuse_unbundled("qwen-image", "", "c.toml")  # bundled: no error
