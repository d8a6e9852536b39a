"""``te-align check`` on ai-toolkit jobs of the LLM-encoder families (ostris/ai-toolkit@27a03a9): the arch names the
profile (``flux2``, ``flux2_klein_4b/9b``, ``zimage``, ``flux_kontext``, ``qwen_image_edit``, ``qwen_image_edit_plus``
whose version comes from ``name_or_path``, ``krea2``, ``ideogram4``, ``ltx2``); a model (version) whose profile is not
bundled is "not checked" (exit 3), never checked against another family's profile. The hooks do not encode these archs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from te_align.checking import check_file
from te_align.trainers.ai_toolkit import audit as aitk
from te_align.trainers.ai_toolkit import names as aitk_table

BASE = ("job: extension\nconfig:\n  name: x\n  process:\n    - type: sd_trainer\n      model:\n        arch: {arch}\n"
        "        name_or_path: {path}\n      train:\n        batch_size: 1\n")


def job(tmp_path: Path, arch: str, path: str = "some/model"):
    p = tmp_path / f"{arch}.yaml"
    p.write_text(BASE.format(arch=arch, path=path), encoding="utf-8")
    return check_file(str(p))


def test_the_new_archs_are_check_only_and_the_hooks_still_refuse_them():
    assert set(aitk_table.CHECK_ONLY) == {"flux2", "flux2_klein_4b", "flux2_klein_9b", "zimage", "flux_kontext",
                                          "qwen_image_edit", "qwen_image_edit_plus", "krea2", "ideogram4", "ltx2",
                                          "ltx2.3"}
    assert not set(aitk_table.CHECK_ONLY) & set(aitk_table.ARCHS)  # hooks.enable refuses an arch not in ARCHS


@pytest.mark.parametrize(("arch", "path", "profile", "why"), [
    ("flux2", "black-forest-labs/FLUX.2-dev", "flux2-dev", "model.arch 'flux2'"),
    ("flux2_klein_9b", "black-forest-labs/FLUX.2-klein-9B", "flux2-klein-9b", "model.arch 'flux2_klein_9b'"),
    ("zimage", "Tongyi-MAI/Z-Image-Turbo", "z-image", "model.arch 'zimage'"),
    ("qwen_image_edit", "Qwen/Qwen-Image-Edit", "qwen-image-edit", "model.arch 'qwen_image_edit'"),
    ("qwen_image_edit_plus", "Qwen/Qwen-Image-Edit-2511", "qwen-image-edit-2511",
     "model.arch 'qwen_image_edit_plus' and model.name_or_path 'Qwen/Qwen-Image-Edit-2511'"),
    ("qwen_image_edit_plus", "Qwen/Qwen-Image-Edit-2603", "qwen-image-edit-2603",
     "model.arch 'qwen_image_edit_plus' and model.name_or_path 'Qwen/Qwen-Image-Edit-2603'"),
    ("krea2", "krea/krea-2", "krea2", "model.arch 'krea2'"),
])
def test_the_arch_names_the_profile(arch, path, profile, why):
    assert aitk.guess_profile({"arch": arch, "name_or_path": path}) == (profile, why)


def test_the_plus_arch_without_a_version_in_the_name_assumes_2509_and_says_so():
    prof, why = aitk.guess_profile({"arch": "qwen_image_edit_plus", "name_or_path": "/models/edit"})
    assert prof == "qwen-image-edit-2509"
    assert why.assumed == ("qwen-image-edit-2509 assumed: model.name_or_path '/models/edit' does not say whether it is "
                           "Qwen-Image-Edit-2509 or -2511 (pass --profile qwen-image-edit-2511 if it is that)")


def test_a_future_edit_version_is_not_checked_and_the_nearest_is_named(tmp_path):
    r = job(tmp_path, "qwen_image_edit_plus", "Qwen/Qwen-Image-Edit-2603")
    assert (r.exit_code, r.status) == (3, "not-checked")
    assert r.reason.startswith("not checked: te-align has no profile for qwen-image-edit-2603 (model.arch "
                               "'qwen_image_edit_plus' and model.name_or_path 'Qwen/Qwen-Image-Edit-2603'); the "
                               "nearest it has, ")


def test_ltx23_is_checked_with_ltx2_and_ltx25_is_not_checked(tmp_path):
    # LTX-2.3 keeps Gemma 3 and LTX2Pipeline.encode_prompt (the ltx2 profile's alias ltx2.3); LTX-2.5 uses Gemma 4
    assert job(tmp_path, "ltx2.3").profile == "ltx2"
    r = job(tmp_path, "ltx2.5")
    assert (r.exit_code, r.reason) == (3, "not checked: te-align has no profile for LTX-2.5, a Gemma 4 text encoder "
                                          "(the nearest te-align has, ltx2, is not used in its place) "
                                          "(model.arch 'ltx2.5')")


@pytest.mark.parametrize(("arch", "profile"), [("flux2_klein_4b", "flux2-klein-4b"), ("flux2_klein_9b", "flux2-klein-9b")])
def test_klein_matches_the_pipeline(tmp_path, arch, profile):
    r = job(tmp_path, arch)
    assert (r.exit_code, r.profile) == (0, profile)
    assert r.effective == {"qwen3.tokenizer.max_length": 512, "qwen3.encoder.layer": (9, 18, 27),
                           "qwen3.tokenizer.enable_thinking": False}


def test_flux2_dev_matches_the_pipeline(tmp_path):
    r = job(tmp_path, "flux2", "black-forest-labs/FLUX.2-dev")
    assert (r.exit_code, r.profile) == (0, "flux2-dev")
    assert r.effective["mistral.encoder.layer"] == (10, 20, 30)
    assert r.effective["mistral.tokenizer.system_prompt"] == aitk.FLUX2_SYSTEM_MESSAGE


@pytest.mark.parametrize(("arch", "path", "profile", "area"), [
    ("qwen_image_edit", "Qwen/Qwen-Image-Edit", "qwen-image-edit", 1024 * 1024),
    ("qwen_image_edit_plus", "Qwen/Qwen-Image-Edit-2509", "qwen-image-edit-2509", 384 * 384),
    ("qwen_image_edit_plus", "Qwen/Qwen-Image-Edit-2511", "qwen-image-edit-2511", 384 * 384),
])
def test_qwen_edit_vl_image_area_matches_and_bilinear_resize_is_a_warning(tmp_path, arch, path, profile, area):
    r = job(tmp_path, arch, path)
    assert (r.exit_code, r.profile) == (1, profile)
    assert r.effective["qwen.images.area"] == area
    found = [(f.kind, f.severity, f.setting, f.effective, f.profile) for f in r.findings if f.kind == "deviation"]
    assert found == [("deviation", "warning", "qwen.images.resample", "bilinear", "lanczos")]
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert f.fix == aitk.NOT_SETTABLE


def test_z_image_through_the_pipeline_is_aligned(tmp_path):
    r = job(tmp_path, "zimage", "Tongyi-MAI/Z-Image-Turbo")
    assert (r.exit_code, r.profile, r.effective) == (0, "z-image", {"qwen3.tokenizer.max_length": 512})


@pytest.mark.parametrize(("extra", "caught"), [
    ("", True),
    ("        cache_text_embeddings: true\n", False),
])
def test_edit_plus_batch_above_one_without_cached_embeddings_is_a_warning(tmp_path, extra, caught):
    p = tmp_path / "plus.yaml"
    p.write_text(BASE.format(arch="qwen_image_edit_plus", path="Qwen/Qwen-Image-Edit-2511").replace(
        "batch_size: 1\n", "batch_size: 4\n" + extra), encoding="utf-8")
    found = [f for f in check_file(str(p)).findings if f.setting == "train.batch_size"]
    if not caught:
        assert found == []
        return
    (f,) = found
    assert (f.severity, f.effective, f.line) == ("warning", 4, 10)
    assert f.fix == ("train.cache_text_embeddings: true (each caption encoded alone with its own control images), or "
                     "train.batch_size: 1")
    assert f.trainer_source.startswith(
        "extensions_built_in/diffusion_models/qwen_image/qwen_image_edit_plus.py:196-219")
    batch_one = job(tmp_path, "qwen_image_edit_plus", "Qwen/Qwen-Image-Edit-2511")
    assert not [f for f in batch_one.findings if f.setting == "train.batch_size"]


def test_a_version_without_a_profile_is_not_read_as_the_arch_profile(tmp_path):
    r = job(tmp_path, "qwen_image", "Qwen/Qwen-Image-2.1")
    assert (r.exit_code, r.status) == (3, "not-checked")
    assert r.reason.startswith("not checked: te-align has no profile for qwen-image-2.1 (model.arch 'qwen_image' and "
                               "model.name_or_path 'Qwen/Qwen-Image-2.1')")
