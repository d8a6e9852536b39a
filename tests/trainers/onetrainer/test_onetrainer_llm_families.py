"""``te-align check`` on OneTrainer configs of the LLM-encoder families (Nerogar/OneTrainer@23df383): ``FLUX_2`` (dev or
klein: OneTrainer asks the transformer's head count, so the base model's name decides here, and nothing is guessed
when it does not), ``Z_IMAGE``, ``KREA_2``, ``IDEOGRAM_4``. The live problem: OneTrainer's FLUX.2 dev system message
has a space where diffusers' has a newline (modules/model/Flux2Model.py:25).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from te_align.checking import check_file
from te_align.cli import main
from te_align.trainers.onetrainer import audit as ot
from te_align.trainers.onetrainer import names


def config(tmp_path: Path, **values) -> str:
    p = tmp_path / "ot.json"
    p.write_text(json.dumps({"training_method": "LORA", **values}, indent=2), encoding="utf-8")
    return str(p)


def test_model_types_name_profiles_that_the_hooks_do_not_encode():
    for mt, prof in (("FLUX_2", "flux2-dev"), ("Z_IMAGE", "z-image"), ("KREA_2", "krea2"), ("IDEOGRAM_4", "ideogram4")):
        assert names.profile_of(mt) == (prof, False)


@pytest.mark.parametrize(("base", "profile"), [
    ("black-forest-labs/FLUX.2-dev", "flux2-dev"),
    ("black-forest-labs/FLUX.2-klein-4B", "flux2-klein-4b"),
    ("black-forest-labs/FLUX.2-klein-base-9B", "flux2-klein-9b"),
])
def test_flux2_base_model_name_decides_dev_or_klein(base, profile):
    assert ot.guess_profile({"model_type": "FLUX_2", "base_model_name": base}) == (
        profile, f"model_type 'FLUX_2' and base_model_name {base!r}")


def test_flux2_without_a_telling_name_asks_for_the_profile(tmp_path, capsys):
    path = config(tmp_path, model_type="FLUX_2", base_model_name="/models/mine")
    assert main(["check", path]) == 3
    cap = capsys.readouterr()
    assert cap.err == "" and cap.out.splitlines()[0] == (
        f"{path}: onetrainer · cannot work out the model family from model_type 'FLUX_2' (OneTrainer tells FLUX.2 "
        "dev from klein by the transformer's head count, modules/model/Flux2Model.py:204-208, and base_model_name "
        "'/models/mine' does not say which: flux2-dev, flux2-klein-4b or flux2-klein-9b); pass --profile NAME")


def test_klein_default_is_aligned(tmp_path):
    r = check_file(config(tmp_path, model_type="FLUX_2", base_model_name="black-forest-labs/FLUX.2-klein-4B"))
    assert (r.exit_code, r.profile) == (0, "flux2-klein-4b")
    assert r.effective == {"qwen3.tokenizer.max_length": 512, "qwen3.tokenizer.enable_thinking": False,
                           "qwen3.encoder.layer": (9, 18, 27)}


def test_klein_sequence_length_is_caught_and_fixed(tmp_path):
    path = config(tmp_path, model_type="FLUX_2", base_model_name="black-forest-labs/FLUX.2-klein-9B",
                  text_encoder_sequence_length=256)
    r = check_file(path)
    found = [(f.kind, f.severity, f.setting, f.effective, f.profile, f.fix, f.line) for f in r.findings]
    assert found == [("deviation", "error", "qwen3.tokenizer.max_length", 256, 512,
                      '"text_encoder_sequence_length": 512', 5)]
    assert main(["check", "--fix", path]) == 0
    assert json.loads(Path(path).read_text(encoding="utf-8"))["text_encoder_sequence_length"] == 512


def test_klein_caption_dropout_raises_in_onetrainer(tmp_path):
    r = check_file(config(tmp_path, model_type="FLUX_2", base_model_name="black-forest-labs/FLUX.2-klein-4B",
                          text_encoder={"dropout_probability": 0.1}))
    (f,) = [f for f in r.findings if f.kind == "unused-value"]
    assert (f.severity, f.setting, f.fix) == ("error", "text_encoder.dropout_probability",
                                              '"text_encoder": {"dropout_probability": 0.0}')
    assert f.message == ("text_encoder.dropout_probability = 0.1: OneTrainer raises NotImplementedError for "
                         "flux2-klein caption dropout")
    assert f.trainer_source == "OneTrainer: modules/model/Flux2Model.py:199-200"


def test_flux2_dev_system_message_space_is_an_error_with_no_config_fix(tmp_path):
    r = check_file(config(tmp_path, model_type="FLUX_2", base_model_name="black-forest-labs/FLUX.2-dev"))
    assert (r.exit_code, r.profile) == (1, "flux2-dev")
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert (f.severity, f.setting, f.effective, f.fix) == ("warning", "mistral.tokenizer.system_prompt",
                                                           ot.FLUX2_SYSTEM_MESSAGE, ot.NOT_HOOKED)
    assert f.profile == ot.FLUX2_SYSTEM_MESSAGE.replace("object attribution", "object\nattribution")
    assert f.trainer_source.startswith("modules/model/Flux2Model.py:25,151-157")


def test_z_image_is_aligned(tmp_path):
    r = check_file(config(tmp_path, model_type="Z_IMAGE"))
    assert (r.exit_code, r.profile) == (0, "z-image")
    assert r.effective == {"qwen3.tokenizer.max_length": 512, "qwen3.encoder.layer": -2,
                           "qwen3.tokenizer.enable_thinking": True}


def test_a_version_without_a_profile_is_not_read_as_the_model_type_profile(tmp_path):
    r = check_file(config(tmp_path, model_type="QWEN", base_model_name="Qwen/Qwen-Image-2.1"))
    assert (r.exit_code, r.status) == (3, "not-checked")
    assert r.reason.startswith("not checked: te-align has no profile for qwen-image-2.1 (model_type 'QWEN' and "
                               "base_model_name 'Qwen/Qwen-Image-2.1')")
