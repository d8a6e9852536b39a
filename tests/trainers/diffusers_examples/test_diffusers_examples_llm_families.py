"""``te-align check`` on the diffusers example scripts of the LLM-encoder families: FLUX.2 dev and klein (and their
img2img scripts), Z-Image, Qwen-Image, FLUX.1 Kontext (huggingface/diffusers@58eb52c examples/dreambooth).

The live problem: ``train_dreambooth_lora_flux2_klein.py`` defaults ``--text_encoder_out_layers`` to [10, 20, 30]
(FLUX.2 dev's Mistral layers) and passes it to ``Flux2KleinPipeline.encode_prompt``, whose own layers are
(9, 18, 27): caught on a command line that leaves the option at its default, fixed by writing the option. The same
default is right for the dev script. A family whose profile is not bundled is "not checked" (exit 3), never checked
against another family's profile.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from te_align.checking import check_file, fix_file
from te_align.fixing.fix import BACKUP_SUFFIX
from te_align.trainers.diffusers_examples import audit as dx

KLEIN_DEFAULT = """\
accelerate launch train_dreambooth_lora_flux2_klein.py \\
  --pretrained_model_name_or_path=black-forest-labs/FLUX.2-klein-4B \\
  --instance_data_dir=dog \\
  --output_dir=out \\
  --instance_prompt="a photo of sks dog" \\
  --max_train_steps=500
"""


def cmd(script: str, *args: str, **kw):
    return check_file("<command line>", command=["accelerate", "launch", script, *args], **kw)


def findings(r):
    return [(f.kind, f.severity, f.setting, f.effective, f.profile, f.fix) for f in r.findings if f.kind != "note"]


# ------------------------------------------------------------------------------------ the reader
def test_the_new_scripts_are_read_with_their_own_options():
    for script in ("train_dreambooth_lora_flux2.py", "train_dreambooth_lora_flux2_klein.py"):
        assert dx.flags(script)["text_encoder_out_layers"] == "list"
        assert dx.flags(script)["max_sequence_length"] == "int"
    for script in ("train_dreambooth_lora_flux2_img2img.py", "train_dreambooth_lora_flux2_klein_img2img.py"):
        assert "text_encoder_out_layers" not in dx.flags(script)  # the pipeline's own layers
    assert dx.flags("train_dreambooth_lora_z_image.py")["max_sequence_length"] == "int"
    assert dx.flags("train_dreambooth_lora_qwen_image.py")["caption_dropout"] == "float"
    assert dx.flags("train_dreambooth_lora_flux_kontext.py")["max_sequence_length"] == "int"


def test_the_layers_option_reads_as_a_tuple_of_indices():
    values, found, _ = dx.read_args("train_dreambooth_lora_flux2_klein.py",
                                    ["--text_encoder_out_layers", "9", "18", "27", "--seed", "1"], "c.sh")
    assert values == {"text_encoder_out_layers": ["9", "18", "27"], "seed": 1} and found == []
    conv = dx._rules.CONVERTERS["dx_layers"]
    ctx = dx.Context({}, "flux2-klein-4b")
    assert conv.to(values["text_encoder_out_layers"], ctx) == (9, 18, 27)
    assert conv.back((9, 18, 27), ctx) == [9, 18, 27]


@pytest.mark.parametrize(("script", "model", "profile"), [
    ("train_dreambooth_lora_flux2.py", "black-forest-labs/FLUX.2-dev", "flux2-dev"),
    ("train_dreambooth_lora_flux2_klein.py", "black-forest-labs/FLUX.2-klein-9B", "flux2-klein-9b"),
    ("train_dreambooth_lora_flux2_klein.py", "black-forest-labs/FLUX.2-klein-base-4B", "flux2-klein-4b"),
    ("train_dreambooth_lora_z_image.py", "Tongyi-MAI/Z-Image-Turbo", "z-image"),
])
def test_the_model_name_names_the_profile(script, model, profile):
    prof, why, only_default = dx.guess_profile(script, {"pretrained_model_name_or_path": model})
    assert (prof, only_default) == (profile, False)
    assert why == f"script {script} and --pretrained_model_name_or_path {model!r}"


def test_a_model_version_without_a_profile_is_not_checked_never_the_script_default():
    r = cmd("train_dreambooth_lora_qwen_image.py", "--pretrained_model_name_or_path", "Qwen/Qwen-Image-2.1")
    assert (r.exit_code, r.status) == (3, "not-checked")
    assert r.reason.startswith("not checked: te-align has no profile for qwen-image-2.1 (script "
                               "train_dreambooth_lora_qwen_image.py and --pretrained_model_name_or_path "
                               "'Qwen/Qwen-Image-2.1'); the nearest it has, ")


# ------------------------------------------------------------------------------------ klein: the live problem
def test_klein_script_left_at_its_default_layers_is_an_error(tmp_path: Path):
    p = tmp_path / "train.sh"
    p.write_text(KLEIN_DEFAULT, encoding="utf-8")
    r = check_file(str(p))
    assert (r.trainer, r.profile, r.exit_code) == ("diffusers-examples", "flux2-klein-4b", 1)
    assert findings(r) == [("deviation", "warning", "qwen3.encoder.layer", (10, 20, 30), (9, 18, 27),
                            "--text_encoder_out_layers 9 18 27")]
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert f.trainer_source == ("examples/dreambooth/train_dreambooth_lora_flux2_klein.py:358-364; "
                                "examples/dreambooth/train_dreambooth_lora_flux2_klein.py:1533-1540")
    assert f.message.startswith("--text_encoder_out_layers (argparse default [10, 20, 30], FLUX.2 dev's Mistral "
                                "layers) is passed to Flux2KleinPipeline.encode_prompt(")
    assert f.line is None  # not written: the default
    assert r.effective == {"qwen3.tokenizer.max_length": 512, "qwen3.encoder.layer": (10, 20, 30)}
    # the finding's value is a tuple, the measure's a list: check cites the layers row all the same (issue 49)
    from te_align.commands.check import _evidence

    (ev,) = [e for e in _evidence(r) if e is not None]
    assert ev["row"] == "world-klein-layers-10-20-30"


def test_klein_written_out_is_caught_on_its_line_and_aligned_with_the_fix(tmp_path: Path):
    p = tmp_path / "train.sh"
    p.write_text(KLEIN_DEFAULT.replace("--max_train_steps=500", "--text_encoder_out_layers 10 20 30 \\\n"
                                       "  --max_train_steps=500"), encoding="utf-8")
    (f,) = [f for f in check_file(str(p)).findings if f.kind == "deviation"]
    assert (f.setting, f.effective, f.line, f.fix) == ("qwen3.encoder.layer", (10, 20, 30), 6,
                                                       "--text_encoder_out_layers 9 18 27")
    r = cmd("train_dreambooth_lora_flux2_klein.py", "--pretrained_model_name_or_path",
            "black-forest-labs/FLUX.2-klein-9B", "--text_encoder_out_layers", "9", "18", "27")
    assert (r.profile, r.exit_code, findings(r)) == ("flux2-klein-9b", 0, [])


@pytest.mark.parametrize("written", [False, True])
def test_fix_writes_the_klein_layers(tmp_path: Path, written: bool):
    p = tmp_path / "train.sh"
    text = KLEIN_DEFAULT
    if written:
        text = text.replace("--output_dir=out \\", "--output_dir=out --text_encoder_out_layers 10 20 30 \\")
    p.write_text(text, encoding="utf-8")
    report = fix_file(str(p))
    assert report.written and not report.refused
    after = p.read_text(encoding="utf-8")
    if written:
        assert after == text.replace("--text_encoder_out_layers 10 20 30", "--text_encoder_out_layers 9 18 27")
    else:
        assert after == KLEIN_DEFAULT.replace("  --max_train_steps=500",
                                              "  --text_encoder_out_layers 9 18 27 \\\n  --max_train_steps=500")
    assert Path(str(p) + BACKUP_SUFFIX).read_text(encoding="utf-8") == text
    again = check_file(str(p))
    assert (again.exit_code, findings(again)) == (0, [])
    assert not fix_file(str(p)).changes  # idempotent


def test_klein_img2img_script_keeps_the_pipeline_layers():
    r = cmd("train_dreambooth_lora_flux2_klein_img2img.py", "--pretrained_model_name_or_path",
            "black-forest-labs/FLUX.2-klein-base-4B")
    assert (r.profile, r.exit_code, findings(r)) == ("flux2-klein-4b", 0, [])
    assert r.effective == {"qwen3.tokenizer.max_length": 512, "qwen3.encoder.layer": (9, 18, 27)}
    r = cmd("train_dreambooth_lora_flux2_klein_img2img.py", "--pretrained_model_name_or_path",
            "black-forest-labs/FLUX.2-klein-base-4B", "--max_sequence_length", "256")
    assert findings(r) == [("deviation", "error", "qwen3.tokenizer.max_length", 256, 512, "--max_sequence_length 512")]


# ------------------------------------------------------------------------------------ dev: the same default is right
def test_flux2_dev_script_default_layers_are_aligned():
    r = cmd("train_dreambooth_lora_flux2.py", "--pretrained_model_name_or_path", "black-forest-labs/FLUX.2-dev")
    assert (r.profile, r.exit_code, findings(r)) == ("flux2-dev", 0, [])
    assert r.effective == {"mistral.tokenizer.max_length": 512, "mistral.encoder.layer": (10, 20, 30)}
    r = cmd("train_dreambooth_lora_flux2.py", "--pretrained_model_name_or_path", "black-forest-labs/FLUX.2-dev",
            "--text_encoder_out_layers", "9", "18", "27")
    assert findings(r) == [("deviation", "warning", "mistral.encoder.layer", (9, 18, 27), (10, 20, 30),
                            "--text_encoder_out_layers 10 20 30")]


def test_z_image_script_length():
    r = cmd("train_dreambooth_lora_z_image.py", "--pretrained_model_name_or_path", "Tongyi-MAI/Z-Image-Turbo")
    assert (r.profile, r.exit_code, findings(r)) == ("z-image", 0, [])
    r = cmd("train_dreambooth_lora_z_image.py", "--max_sequence_length", "1024")
    assert findings(r) == [("deviation", "warning", "qwen3.tokenizer.max_length", 1024, 512,
                            "--max_sequence_length 512")]


# ------------------------------------------------------------------------------------ bundled families
def test_qwen_image_script_default_is_aligned_and_a_longer_length_caught():
    r = cmd("train_dreambooth_lora_qwen_image.py", "--pretrained_model_name_or_path", "Qwen/Qwen-Image")
    assert (r.profile, r.exit_code, findings(r)) == ("qwen-image", 0, [])
    assert r.effective == {"qwen.tokenizer.max_length": 512}
    r = cmd("train_dreambooth_lora_qwen_image.py", "--pretrained_model_name_or_path", "Qwen/Qwen-Image",
            "--max_sequence_length", "1024")
    assert findings(r) == [("deviation", "warning", "qwen.tokenizer.max_length", 1024, 512,
                            "--max_sequence_length 512")]


def test_kontext_script_reads_as_flux_dev():
    r = cmd("train_dreambooth_lora_flux_kontext.py", "--pretrained_model_name_or_path",
            "black-forest-labs/FLUX.1-Kontext-dev")
    assert (r.profile, r.exit_code, findings(r)) == ("flux-dev", 0, [])
    assert r.effective["t5.tokenizer.max_length"] == 512
    assert "t5.masks.encoder" in r.effective
    r = cmd("train_dreambooth_lora_flux_kontext.py", "--pretrained_model_name_or_path",
            "black-forest-labs/FLUX.1-Kontext-dev", "--max_sequence_length", "256")
    assert findings(r) == [("deviation", "error", "t5.tokenizer.max_length", 256, 512, "--max_sequence_length 512")]
