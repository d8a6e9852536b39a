"""Text-encoder learning-rate keys that ai-toolkit and OneTrainer never read, with their aligned counterparts and
--fix."""

from __future__ import annotations

import json

from te_align.checking import check_file, fix_file

AITK = """job: extension
config:
  name: x
  process:
    - type: sd_trainer
      training_folder: output
      network:
        type: lora
        linear: 16
      train:
        batch_size: 1
        steps: 100
        lr: 0.0001
{extra}      model:
        name_or_path: black-forest-labs/FLUX.1-dev
        is_flux: true
"""


def unused(r):
    return [(f.severity, f.setting, f.line, f.message, f.fix) for f in r.findings if f.kind == "unused-value"]


def test_ai_toolkit_text_encoder_lr_is_never_read(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(AITK.format(extra="        train_text_encoder: true\n        text_encoder_lr: 0.00005\n"),
                    encoding="utf-8")
    r = check_file(str(path))
    assert r.exit_code == 1
    assert unused(r) == [(
        "warning", "train.text_encoder_lr", 15,
        "train.text_encoder_lr = 5e-05 is accepted but never used: TrainConfig stores it and nothing reads it: a "
        "text-encoder LoRA (train.train_text_encoder) and a full text-encoder fine-tune train at train.lr, so the text "
        "encoder does not train at this rate", "remove train.text_encoder_lr")]
    assert "toolkit/config_modules.py:383" in r.findings[0].trainer_source
    report = fix_file(str(path), backup=False)
    assert report.refused == ""
    assert path.read_text(encoding="utf-8") == AITK.format(extra="        train_text_encoder: true\n")
    assert check_file(str(path)).exit_code == 0


ONETRAINER = {"__version": 10, "model_type": "FLUX_DEV_1", "base_model_name": "black-forest-labs/FLUX.1-dev",
              "learning_rate": 0.0003, "text_encoder": {"train": False, "learning_rate": 0.00005},
              "text_encoder_2": {"train": False}, "text_encoder_2_sequence_length": 512}


def test_onetrainer_learning_rate_of_a_text_encoder_it_does_not_train(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(ONETRAINER, indent=4), encoding="utf-8")
    r = check_file(str(path))
    assert r.exit_code == 1
    assert unused(r) == [(
        "warning", "text_encoder.learning_rate", 8,
        "text_encoder.learning_rate = 5e-05 is not read: text_encoder.train is false, so OneTrainer trains no "
        "text_encoder and nothing trains at this rate",
        'remove "text_encoder.learning_rate" (or set "text_encoder": {"train": true} to train it at this rate)')]
    report = fix_file(str(path), backup=False)
    assert report.refused == ""
    assert json.loads(path.read_text(encoding="utf-8"))["text_encoder"] == {"train": False}
    assert check_file(str(path)).exit_code == 0


def test_onetrainer_trained_text_encoder_reads_its_rate(tmp_path):
    data = {**ONETRAINER, "text_encoder": {"train": True, "learning_rate": 0.00005}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data, indent=4), encoding="utf-8")
    assert unused(check_file(str(path))) == []


def _musubi_dataset(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "img" / "a.txt").write_text("a cat", encoding="utf-8")
    ds = tmp_path / "dataset.toml"
    ds.write_text(f'[general]\nresolution = [1024, 1024]\ncaption_extension = ".txt"\nbatch_size = 1\n[[datasets]]\n'
                  f'image_directory = "{(tmp_path / "img").as_posix()}"\n'
                  f'cache_directory = "{(tmp_path / "cache").as_posix()}"\nnum_repeats = 1\n', encoding="utf-8")
    return str(ds)


def test_musubi_skip_existing_keeps_caches_of_other_settings(tmp_path):
    base = ["python", "wan_cache_text_encoder_outputs.py", "--dataset_config", _musubi_dataset(tmp_path),
            "--t5", "/m/umt5-xxl-enc-bf16.pth"]
    r = check_file("<command line>", command=[*base, "--skip_existing"])
    assert r.exit_code == 0
    assert [(f.severity, f.setting, f.message, f.fix) for f in r.findings if f.setting == "skip_existing"] == [(
        "info", "skip_existing",
        "--skip_existing keeps every text-encoder cache file already there: it skips a caption whose cache file name "
        "exists, and the name comes from the item's file name and the architecture alone, so files encoded with "
        "another text encoder, length or template are kept as they are and training reads them",
        "after changing a text-encoder setting, cache once without --skip_existing")]
    r = check_file("<command line>", command=base)
    assert r.exit_code == 0 and [f for f in r.findings if f.setting == "skip_existing"] == []
