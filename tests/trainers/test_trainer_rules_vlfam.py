"""``te-align check`` rules for Krea 2, Ideogram 4 and LTX-2 in every trainer that trains them at the commit te-align
cites: musubi-tuner (krea2, ideogram4), ai-toolkit (krea2, ideogram4, ltx2 / ltx2.3; ltx2.5 not checked), OneTrainer
(KREA_2, IDEOGRAM_4), SimpleTuner (krea2, ideogram, ltxvideo2; 2.5 flavours not checked) and the diffusers examples
(train_dreambooth_lora_krea2.py, train_dreambooth_lora_ideogram4.py). One deviating and one aligned config per pair,
with the exact exit code, finding and fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from te_align.checking import check_file


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def found(r):
    return [(f.severity, f.setting, f.effective, f.profile, f.fix) for f in r.findings
            if f.kind in ("deviation", "unused-value")]


def aitk(tmp_path: Path, arch: str, extra: str = "") -> str:
    return write(tmp_path, "job.yaml", f"""job: extension
config:
  name: t
  process:
    - type: sd_trainer
      training_folder: out
      network:
        type: lora
      model:
        arch: "{arch}"
        name_or_path: "some/model"
{extra}""")


# ------------------------------------------------------------------------------------ diffusers examples
def test_diffusers_krea2(tmp_path):
    cmd = "accelerate launch train_dreambooth_lora_krea2.py --pretrained_model_name_or_path krea/Krea-2-Raw"
    r = check_file(write(tmp_path, "a.sh", cmd + " --max_sequence_length 256\n"))
    assert (r.exit_code, r.profile) == (1, "krea2")
    assert found(r) == [("error", "qwen.tokenizer.max_length", 256, 512, "--max_sequence_length 512")]
    r = check_file(write(tmp_path, "b.sh", cmd + " --caption_dropout 0.1\n"))
    assert (r.exit_code, found(r)) == (0, [])
    assert r.effective == {"qwen.tokenizer.max_length": 512}


def test_diffusers_ideogram4(tmp_path):
    cmd = "accelerate launch train_dreambooth_lora_ideogram4.py --pretrained_model_name_or_path ideogram-ai/ideogram-v4"
    r = check_file(write(tmp_path, "a.sh", cmd + " --max_sequence_length 1024\n"))
    assert (r.exit_code, r.profile) == (1, "ideogram4")
    assert found(r) == [("error", "qwen.tokenizer.max_length", 1024, 2048, "--max_sequence_length 2048")]
    r = check_file(write(tmp_path, "b.sh", cmd + "\n"))
    assert (r.exit_code, found(r)) == (0, [])


# ------------------------------------------------------------------------------------ musubi-tuner
def test_musubi_krea2(tmp_path):
    cmd = "python krea2_cache_text_encoder_outputs.py --dataset_config ds.toml --text_encoder te.safetensors"
    r = check_file(write(tmp_path, "a.sh", cmd + " --text_encoder_dtype fp16\n"))
    assert (r.exit_code, r.profile) == (1, "krea2")
    assert found(r) == [("warning", "qwen.encoder.dtype", "float16", "bfloat16", "remove --text_encoder_dtype")]
    r = check_file(write(tmp_path, "b.sh", cmd + "\n"))
    assert (r.exit_code, r.profile, found(r)) == (0, "krea2", [])
    assert r.effective["qwen.encoder.position_ids"] == "real_tokens"
    assert r.effective["qwen.tokenizer.suffix_after_padding"] is True


def test_musubi_ideogram4(tmp_path):
    cmd = "python ideogram4_cache_text_encoder_outputs.py --dataset_config ds.toml --text_encoder te.safetensors"
    r = check_file(write(tmp_path, "a.sh", cmd + " --text_cache_dtype fp8_e4m3fn\n"))
    assert (r.exit_code, r.profile) == (1, "ideogram4")
    assert found(r) == [("warning", "qwen.encoder.dtype", "float8_e4m3fn", "bfloat16", "remove --text_cache_dtype")]
    r = check_file(write(tmp_path, "b.sh", cmd + " --text_cache_dtype float32\n"))
    assert (r.exit_code, found(r)) == (0, [])
    assert r.effective["qwen.tokenizer.max_length"] == 2048 and r.effective["qwen.tokenizer.truncation"] is False


def test_musubi_training_script_names_the_profile_and_points_to_the_cache_step():
    r = check_file("<command line>", command=["python", "src/musubi_tuner/ideogram4_train_network.py", "--dataset_config",
                                              "d.toml", "--dit", "/m/i4.safetensors", "--sampler_preset",
                                              "V4_DEFAULT_20", "--initial_sigma", "1.004"])  # fmt: skip
    assert (r.trainer, r.exit_code, r.profile) == ("musubi", 0, "ideogram4")
    assert [f.kind for f in r.findings if f.kind in ("unknown-key", "deviation")] == []


# ------------------------------------------------------------------------------------ ai-toolkit
def test_aitk_krea2(tmp_path):
    r = check_file(aitk(tmp_path, "krea2"))
    # the caption is cut at 512 tokens + the 5 suffix tokens, where the pipeline keeps 512 positions in all
    assert r.exit_code == 0
    assert found(r) == [("info", "qwen.tokenizer.max_length", 517, 512, "model.model_kwargs.max_text_length: 507")]
    r = check_file(aitk(tmp_path, "krea2", "        model_kwargs:\n          max_text_length: 507\n"))
    assert (r.exit_code, found(r)) == (0, [])


def test_aitk_ideogram4(tmp_path):
    from te_align.trainers.ai_toolkit import audit

    r = check_file(aitk(tmp_path, "ideogram4"))
    assert (r.exit_code, r.profile) == (1, "ideogram4")
    assert found(r) == [
        ("warning", "qwen.tokenizer.max_length", 3072, 2048, "model.model_kwargs.max_text_length: 2048"),
        ("info", "qwen.tokenizer.text_cleaning", audit.IDEOGRAM_DIGEST, "none", audit.NOT_SETTABLE),
        ("info", "qwen.tokenizer.truncation", True, False, audit.NOT_SETTABLE),
    ]
    r = check_file(aitk(tmp_path, "ideogram4", "        model_kwargs:\n          max_text_length: 2048\n"))
    assert r.exit_code == 0 and [f[1] for f in found(r)] == ["qwen.tokenizer.text_cleaning",
                                                            "qwen.tokenizer.truncation"]


@pytest.mark.parametrize("arch", ["ltx2", "ltx2.3"])
def test_aitk_ltx2(tmp_path, arch):
    from te_align.trainers.ai_toolkit import audit

    r = check_file(aitk(tmp_path, arch))
    assert (r.exit_code, r.profile) == (0, "ltx2")
    assert found(r) == [("info", "gemma.tokenizer.padding", "longest", "max_length", audit.NOT_SETTABLE)]
    assert r.effective["gemma.encoder.layer"] == tuple(range(49))


def test_aitk_ltx25_is_not_checked(tmp_path):
    r = check_file(aitk(tmp_path, "ltx2.5"))
    assert (r.exit_code, r.status) == (3, "not-checked")
    assert "LTX-2.5, a Gemma 4 text encoder (the nearest te-align has, ltx2, is not used in its place)" in r.reason


# ------------------------------------------------------------------------------------ OneTrainer
def ot(tmp_path: Path, model_type: str, **more) -> str:
    data = {"__version": 10, "training_method": "LORA", "model_type": model_type, **more}
    return write(tmp_path, "ot.json", json.dumps(data))


@pytest.mark.parametrize(("model_type", "profile"), [("KREA_2", "krea2"), ("IDEOGRAM_4", "ideogram4")])
def test_onetrainer_dropout_raises(tmp_path, model_type, profile):
    r = check_file(ot(tmp_path, model_type, text_encoder={"dropout_probability": 0.1}))
    assert (r.exit_code, r.profile) == (1, profile)
    assert found(r)[-1] == ("error", "text_encoder.dropout_probability", 0.1, None,
                            '"text_encoder": {"dropout_probability": 0.0}')
    assert [f[1] for f in found(r)[:-1]] == (["qwen.tokenizer.truncation"] if profile == "ideogram4" else [])


def test_onetrainer_krea2_aligned(tmp_path):
    r = check_file(ot(tmp_path, "KREA_2"))
    assert (r.exit_code, found(r)) == (0, [])
    assert r.effective["qwen.encoder.position_ids"] == "real_tokens"


def test_onetrainer_ideogram4_truncates(tmp_path):
    from te_align.trainers.onetrainer import audit

    r = check_file(ot(tmp_path, "IDEOGRAM_4"))
    assert r.exit_code == 0
    assert found(r) == [("info", "qwen.tokenizer.truncation", True, False, audit.NOT_HOOKED)]


# ------------------------------------------------------------------------------------ SimpleTuner
def st(tmp_path: Path, **values) -> str:
    return write(tmp_path, "config.json", json.dumps(values))


def test_simpletuner_krea2(tmp_path):
    r = check_file(st(tmp_path, model_family="krea2", model_flavour="turbo", tokenizer_max_length=1024))
    assert (r.exit_code, r.profile) == (1, "krea2")
    assert found(r) == [("warning", "tokenizer_max_length", 1024, None, "remove tokenizer_max_length")]
    r = check_file(st(tmp_path, model_family="krea2"))
    assert (r.exit_code, r.profile, found(r)) == (0, "krea2", [])


def test_simpletuner_ideogram(tmp_path):
    from te_align.trainers.simpletuner import audit

    r = check_file(st(tmp_path, model_family="ideogram", caption_dropout_probability=0.0))
    assert (r.exit_code, r.profile) == (1, "ideogram4")
    assert found(r) == [("warning", "qwen.tokenizer.text_cleaning", audit.IDEOGRAM_AUTO_JSON, "none",
                         '"ideogram_auto_json": false')]
    r = check_file(st(tmp_path, model_family="ideogram", ideogram_auto_json=False, caption_dropout_probability=0.0))
    assert (r.exit_code, found(r)) == (0, [])


@pytest.mark.parametrize("flavour", ["dev", "2.3-distilled"])
def test_simpletuner_ltx2(tmp_path, flavour):
    from te_align.trainers.simpletuner import audit

    r = check_file(st(tmp_path, model_family="ltxvideo2", model_flavour=flavour, tokenizer_max_length=512))
    assert (r.exit_code, r.profile) == (1, "ltx2")
    assert found(r) == [("info", "gemma.masks.zero_padded", True, False, audit.NOT_SETTABLE),
                        ("warning", "tokenizer_max_length", 512, None, "remove tokenizer_max_length")]
    r = check_file(st(tmp_path, model_family="ltxvideo2", model_flavour=flavour))
    assert r.exit_code == 0 and [f[1] for f in found(r)] == ["gemma.masks.zero_padded"]


def test_simpletuner_ltx25_is_not_checked(tmp_path):
    r = check_file(st(tmp_path, model_family="ltxvideo2", model_flavour="2.5-dev"))
    assert (r.exit_code, r.status, r.reason) == (3, "not-checked", (
        "not checked: te-align has no profile for LTX-2.5 (a Gemma 4 text encoder, ltxvideo2/model.py:363-376) "
        "(SimpleTuner model_family 'ltxvideo2' model_flavour '2.5-dev'); the nearest it has, ltx2, is not used in "
        "its place"))


def test_fix_writes_the_keys(tmp_path):
    from te_align.checking import fix_file

    path = st(tmp_path, model_family="ideogram", caption_dropout_probability=0.0)
    assert fix_file(path).written
    assert json.loads(Path(path).read_text(encoding="utf-8"))["ideogram_auto_json"] is False
