"""``te-align check`` on SimpleTuner configs of the LLM-encoder families (bghira/SimpleTuner@bc8e6ab): ``flux2`` with
``model_flavour`` dev / klein-4b / klein-9b (default klein-9b), ``z_image``, ``qwen_image`` with the edit flavours
(edit-v1 Qwen-Image-Edit, edit-v2 and edit-v2+ 2509, edit-v3 2511). A flavour te-align has no profile for is "not
checked" with the nearest named. The live problem: SimpleTuner's FLUX.2 dev system message has a space where
diffusers' has a newline (simpletuner/helpers/models/flux2/model.py:52).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from te_align.checking import check_file
from te_align.trainers.simpletuner import audit as st


def config(tmp_path: Path, **values) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(values, indent=2), encoding="utf-8")
    return str(p)


def deviations(r):
    return [(f.severity, f.setting, f.effective, f.profile, f.fix) for f in r.findings if f.kind == "deviation"]


@pytest.mark.parametrize(("values", "profile", "why"), [
    ({"model_family": "flux2"}, "flux2-klein-9b", "model_family 'flux2', model_flavour 'klein-9b' (SimpleTuner's default)"),
    ({"model_family": "flux2", "model_flavour": "dev"}, "flux2-dev", "model_family 'flux2', model_flavour 'dev'"),
    ({"model_family": "flux2", "model_flavour": "klein-4b"}, "flux2-klein-4b",
     "model_family 'flux2', model_flavour 'klein-4b'"),
    ({"model_family": "z_image", "model_flavour": "turbo"}, "z-image", "model_family 'z_image'"),
    ({"model_family": "qwen_image", "model_flavour": "edit-v1"}, "qwen-image-edit",
     "model_family 'qwen_image', model_flavour 'edit-v1'"),
    ({"model_family": "qwen_image", "model_flavour": "edit-v2+"}, "qwen-image-edit-2509",
     "model_family 'qwen_image', model_flavour 'edit-v2+'"),
    ({"model_family": "qwen_image", "model_flavour": "edit-v3"}, "qwen-image-edit-2511",
     "model_family 'qwen_image', model_flavour 'edit-v3'"),
])
def test_family_and_flavour_name_the_profile(values, profile, why):
    assert st.guess_profile(values) == (profile, why)


@pytest.mark.parametrize(("values", "reason"), [
    ({"model_family": "flux2", "model_flavour": "klein-12b"},
     "not checked: te-align has no profile for SimpleTuner model_family 'flux2' model_flavour 'klein-12b'; the nearest "
     "it has, flux2-klein-9b, is not used in its place"),
    ({"model_family": "qwen_image", "model_flavour": "v1.0", "pretrained_model_name_or_path": "Qwen/Qwen-Image-2.1"},
     "not checked: te-align has no profile for qwen-image-2.1 (model_family 'qwen_image' and "
     "pretrained_model_name_or_path 'Qwen/Qwen-Image-2.1'); the nearest it has, qwen-image-edit, is not used in its "
     "place; pass --profile NAME to check against a profile you choose"),
    ({"model_family": "qwen_image", "model_flavour": "edit-v4"},
     "not checked: te-align has no profile for SimpleTuner model_family 'qwen_image' model_flavour 'edit-v4'; the "
     "nearest it has, qwen-image-edit-2511, is not used in its place"),
])
def test_a_flavour_without_a_profile_is_not_checked(tmp_path, values, reason):
    r = check_file(config(tmp_path, **values))
    assert (r.exit_code, r.status, r.reason) == (3, "not-checked", reason)


def test_layers_converter_reads_the_json_array_and_the_flavour_default():
    conv = st.rules.CONVERTERS["st_flux2_layers"]
    klein, dev = st.Context({"model_flavour": "klein-4b"}, "flux2-klein-4b"), st.Context({"model_flavour": "dev"}, "")
    assert conv.to(None, klein) == (9, 18, 27) and conv.to(None, dev) == (10, 20, 30)
    assert conv.to("[10, 20, 30]", klein) == (10, 20, 30) and conv.to([1, 2], klein) == (1, 2)
    assert conv.back((9, 18, 27), klein) is st.rules.REMOVE
    assert conv.back((9, 18, 27), dev) == "[9, 18, 27]"


def test_klein_default_is_aligned(tmp_path):
    r = check_file(config(tmp_path, model_family="flux2", model_flavour="klein-4b"))
    assert (r.profile, deviations(r)) == ("flux2-klein-4b", [])
    assert r.effective == {"qwen3.tokenizer.max_length": 512, "qwen3.tokenizer.enable_thinking": False,
                           "qwen3.encoder.layer": (9, 18, 27)}


def test_klein_with_dev_layers_is_caught_and_fixed(tmp_path):
    path = config(tmp_path, model_family="flux2", model_flavour="klein-9b",
                  custom_text_encoder_intermediary_layers="[10, 20, 30]")
    r = check_file(path)
    assert deviations(r) == [("warning", "qwen3.encoder.layer", (10, 20, 30), (9, 18, 27),
                              "remove custom_text_encoder_intermediary_layers")]
    from te_align.checking import fix_file

    assert fix_file(path).written
    assert "custom_text_encoder_intermediary_layers" not in json.loads(Path(path).read_text(encoding="utf-8"))
    assert deviations(check_file(path)) == []


def test_tokenizer_max_length_is_ignored_for_flux2(tmp_path):
    r = check_file(config(tmp_path, model_family="flux2", model_flavour="klein-9b", tokenizer_max_length=256))
    (f,) = [f for f in r.findings if f.kind == "unused-value"]
    assert (f.setting, f.fix) == ("tokenizer_max_length", "remove tokenizer_max_length")


def test_flux2_dev_system_message_space_is_an_error_not_settable(tmp_path):
    r = check_file(config(tmp_path, model_family="flux2", model_flavour="dev"))
    assert deviations(r) == [("warning", "mistral.tokenizer.system_prompt", st.FLUX2_SYSTEM_MESSAGE,
                              st.FLUX2_SYSTEM_MESSAGE.replace("object attribution", "object\nattribution"),
                              st.NOT_SETTABLE)]


def test_z_image_length_and_thinking(tmp_path):
    r = check_file(config(tmp_path, model_family="z_image", model_flavour="turbo"))
    assert (r.profile, deviations(r)) == ("z-image", [])
    assert r.effective == {"qwen3.tokenizer.max_length": 512, "qwen3.encoder.layer": -2,
                           "qwen3.tokenizer.enable_thinking": True}
    r = check_file(config(tmp_path, model_family="z_image", tokenizer_max_length=1024))
    assert deviations(r) == [("warning", "qwen3.tokenizer.max_length", 1024, 512, "remove tokenizer_max_length")]


@pytest.mark.parametrize(("flavour", "found"), [
    ("edit-v2", []), ("edit-v2+", []), ("edit-v3", []),
    ("edit-v1", [("warning", "qwen.images.area", "the conditioning image's own size", 1048576, st.NOT_SETTABLE)]),
])
def test_qwen_edit_vl_image_size(tmp_path, flavour, found):
    r = check_file(config(tmp_path, model_family="qwen_image", model_flavour=flavour))
    assert deviations(r) == found
