"""``te-align check`` on what users paste (issue 46): sd-scripts / musubi-tuner / diffusers command lines in
.sh and .bat files (continuations, variables, ``accelerate launch`` options, several commands per file),
SimpleTuner ``config.env``, argparse abbreviations, and OneTrainer keys its config migrations read."""

from __future__ import annotations

import json
from pathlib import Path

from te_align.checking import check_file, check_files, exit_code
from te_align.cli import main

FLUXGYM_BAT = """\
@echo off
set "MODEL=C:\\models\\flux1-dev.safetensors"
set OUT=C:\\out
accelerate launch ^
  --mixed_precision bf16 ^
  --num_cpu_threads_per_process 1 ^
  sd-scripts/flux_train_network.py ^
  --pretrained_model_name_or_path "%MODEL%" ^
  --clip_l "C:\\models\\clip_l.safetensors" ^
  --t5xxl "C:\\models\\t5xxl_fp16.safetensors" ^
  --ae "C:\\models\\ae.sft" ^
  --network_module networks.lora_flux ^
  --t5xxl_max_token_length 256 ^
  --output_dir %OUT%
"""

FLUXGYM_SH = """\
export MODEL=/models/flux1-dev.safetensors
accelerate launch \\
  --mixed_precision bf16 \\
  --num_cpu_threads_per_process 1 \\
  sd-scripts/flux_train_network.py \\
  --pretrained_model_name_or_path "$MODEL" \\
  --clip_l "/models/clip_l.safetensors" --t5xxl "/models/t5xxl_fp16.safetensors" --ae "/models/ae.sft" \\
  --cache_latents_to_disk --save_model_as safetensors --sdpa --persistent_data_loader_workers \\
  --network_module networks.lora_flux --network_dim 4 --optimizer_type adamw8bit \\
  --learning_rate 8e-4 --cache_text_encoder_outputs --cache_text_encoder_outputs_to_disk --fp8_base \\
  --output_dir /x/out --output_name foo --t5xxl_max 512
"""

MUSUBI = """\
export DS=/data/dataset.toml
python src/musubi_tuner/qwen_image_cache_latents.py --dataset_config $DS --vae /m/vae.safetensors
python src/musubi_tuner/qwen_image_cache_text_encoder_outputs.py --dataset_config $DS --text_encoder /m/q.safetensors
accelerate launch --num_cpu_threads_per_process 1 --mixed_precision bf16 -m musubi_tuner.qwen_image_train_network \\
  --dit /m/qwen_image_bf16.safetensors --vae /m/vae.safetensors --text_encoder /m/qwen.safetensors \\
  --dataset_config $DS --network_module networks.lora_qwen_image --network_dim 16 --learning_r 1e-4
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def devs(r):
    return [(f.setting, f.effective, f.profile, f.line) for f in r.findings if f.kind == "deviation"]


def test_fluxgym_bat_is_sd_scripts(tmp_path):
    r = check_file(write(tmp_path, "train.bat", FLUXGYM_BAT))
    assert (r.trainer, r.profile, r.exit_code, r.family_reason) == ("kohya", "flux-dev", 1,
                                                                    "script flux_train_network.py")
    assert devs(r) == [("t5.tokenizer.max_length", 256, 512, 13)]


def test_fluxgym_sh_with_abbreviated_option_is_aligned(tmp_path):
    r = check_file(write(tmp_path, "train.sh", FLUXGYM_SH))
    assert (r.trainer, r.profile, r.exit_code) == ("kohya", "flux-dev", 0)
    assert r.effective["t5.tokenizer.max_length"] == 512  # --t5xxl_max is --t5xxl_max_token_length to argparse
    assert not [f for f in r.findings if f.kind == "unknown-key"]


def test_python_sdxl_and_accelerate_options_are_not_the_scripts(tmp_path):
    r = check_file(write(tmp_path, "sdxl.sh", "python sdxl_train_network.py --pretrained_model_name_or_path="
                         "/m/sd_xl_base_1.0.safetensors --clip_skip 2 \\\n  --network_module networks.lora\n"))
    assert (r.trainer, r.profile, r.exit_code) == ("kohya", "sdxl", 1)
    assert [(f.kind, f.setting, f.line) for f in r.findings if f.severity == "warning"] == [
        ("unused-value", "clip_skip", 1)]
    r = check_file(write(tmp_path, "sd15.sh", (
        "accelerate launch --num_processes 2 --mixed_precision bf16 --config_file acc.yaml "
        "--num_cpu_threads_per_process 1 sd-scripts/train_network.py \\\n"
        "  --pretrained_model_name_or_path=/m/v1-5-pruned-emaonly.safetensors --max_token_length 225\n")))
    assert (r.trainer, r.profile, r.exit_code) == ("kohya", "sd15", 1)
    assert devs(r) == [("clip_l.tokenizer.max_length", 227, 77, 2)]
    assert not [f for f in r.findings if f.setting == "config_file"]  # accelerate's --config_file, not the script's


def test_musubi_cache_and_train_pair_each_checked(tmp_path, capsys):
    path = write(tmp_path, "musubi.sh", MUSUBI)
    results = check_files([path])
    assert [(r.file, r.trainer, r.status, r.exit_code) for r in results] == [
        (f"{path}:2", "musubi", "not-training", 3),
        (f"{path}:3", "musubi", "checked", 0),
        (f"{path}:4", "musubi", "checked", 0),
    ]
    assert exit_code(results) == 0  # the latent caching step runs no text encoder: it does not make the file exit 3
    assert results[2].family_reason == "script qwen_image_train_network.py and network_module 'networks.lora_qwen_image'"
    assert not [f for f in results[2].findings if f.kind == "unknown-key"]  # --learning_r: --learning_rate
    assert main(["check", path]) == 0
    out = capsys.readouterr().out
    assert f"{path}:2: musubi · not checked: qwen_image_cache_latents.py caches latents only" in out


def test_file_mixing_trainers_gives_one_result_per_command(tmp_path, capsys):
    path = write(tmp_path, "mixed.sh", (
        "accelerate launch flux_train_network.py --pretrained_model_name_or_path /m/flux1-dev.safetensors\n"
        "accelerate launch train_dreambooth_lora_sd3.py --pretrained_model_name_or_path "
        "stabilityai/stable-diffusion-3-medium-diffusers --max_sequence_length 77\n"))
    assert main(["check", path]) == 1
    out = capsys.readouterr().out.splitlines()
    heads = [x for x in out if x.startswith(path)]
    assert heads == [
        f"{path}:1: kohya · profile flux-dev (script flux_train_network.py)",
        f"{path}:2: diffusers-examples · profile sd3-medium (script train_dreambooth_lora_sd3.py and "
        "--pretrained_model_name_or_path 'stabilityai/stable-diffusion-3-medium-diffusers')",
    ]


def test_unknown_script_one_line_with_file_and_line(tmp_path, capsys):
    path = write(tmp_path, "run.sh", "export X=1\naccelerate launch train_lora.py --rank 4\n")
    assert main(["check", path]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.startswith(f"te-align: error: {path}:2: train_lora.py is not a script te-align reads: ")
    assert cap.err.count("\n") == 1


def test_ambiguous_abbreviation_is_argparses_error(tmp_path, capsys):
    path = write(tmp_path, "run.sh", "accelerate launch flux_train_network.py --pretrained_model_name_or_path "
                                     "/m/flux1-dev.safetensors --lr_warm 10 --lr 1e-4\n")
    r = check_file(path)
    assert r.exit_code == 2
    [f] = [f for f in r.findings if f.kind == "wrong-value"]
    # argparse's own words, the matches in the order flux_train_network.py's setup_parser registers them (the same
    # line Python 3.10's argparse prints for that parser)
    assert f.message == ("ambiguous option: --lr could match --lr_scheduler_type, --lr_scheduler_args, --lr_scheduler, "
                         "--lr_warmup_steps, --lr_decay_steps, --lr_scheduler_num_cycles, --lr_scheduler_power, "
                         "--lr_scheduler_timescale, --lr_scheduler_min_lr_ratio (argparse's error: the script stops "
                         "with exit status 2 before training)")
    assert (f.line, f.trainer_source) == (1, "sd-scripts: flux_train_network.py setup_parser (argparse)")
    r = check_file(write(tmp_path, "d.sh", "accelerate launch train_dreambooth_lora_sd3.py --max_seq 256 "
                                           "--pretrained_model_name_or_path stabilityai/stable-diffusion-3-medium-"
                                           "diffusers\n"))
    assert (r.exit_code, r.effective["t5.tokenizer.max_length"]) == (0, 256)


ENV = """\
# SimpleTuner env config
export MODEL_TYPE='lora'
export MODEL_FAMILY="flux"
export MODEL_NAME="black-forest-labs/FLUX.1-dev"
export USE_GRADIENT_CHECKPOINTING=true
export USE_EMA=false
export CAPTION_DROPOUT_PROBABILITY=0.0
export TRAINER_EXTRA_ARGS="--lora_rank=16 --tokenizer_max_length 256 --flux_lora_target=all"
CUDA_VISIBLE_DEVICES=0
if [ -z "$X" ]; then echo hi; fi
"""


def test_simpletuner_env_through_its_key_mapping(tmp_path):
    path = write(tmp_path, "config.env", ENV)
    r = check_file(path)
    assert (r.trainer, r.profile, r.exit_code) == ("simpletuner", "flux-dev", 1)
    assert [(f.kind, f.severity, f.setting, f.line) for f in r.findings] == [
        ("unused-value", "warning", "tokenizer_max_length", 8),
        ("note", "info", "config.env", 10),
        ("note", "info", "config.env", None),
    ]
    assert r.findings[1].message.startswith(f"{path}:10: shell syntax beyond KEY=VALUE / export")
    assert r.findings[2].message.startswith("CUDA_VISIBLE_DEVICES: not in SimpleTuner's env_to_args_map")


def test_simpletuner_env_dropout_from_its_variable(tmp_path):
    r = check_file(write(tmp_path, "config.env", 'MODEL_FAMILY=flux\nMODEL_NAME=black-forest-labs/FLUX.1-dev\n'
                                                 'CAPTION_DROPOUT_PROBABILITY=0.1\n'))
    assert r.exit_code in (0, 1)
    assert r.trainer == "simpletuner" and r.profile == "flux-dev"


def _ot(version: int, **top: object) -> dict[str, object]:
    part = {"__version": 0, "model_name": "", "train": True, "learning_rate": None, "weight_dtype": "FLOAT_32"}
    return {"__version": version, "model_type": "FLUX_DEV_1", "training_method": "LORA",
            "base_model_name": "black-forest-labs/FLUX.1-dev", "text_encoder": dict(part),
            "text_encoder_2": dict(part), "transformer": dict(part), **top}


def test_onetrainer_keys_its_migrations_read_are_not_unknown(tmp_path):
    old = _ot(6, gradient_checkpointing="ON", enable_activation_offloading=True, layer_offload_fraction=0.0,
              enable_async_offloading=True, lora_layer_preset="full", weight_dtype="BFLOAT_16")
    r = check_file(write(tmp_path, "old.json", json.dumps(old, indent=2)))
    assert r.trainer == "onetrainer"
    assert [f.setting for f in r.findings if f.kind == "unknown-key"] == []
    new = _ot(11, gradient_checkpointing="ON")  # at __version 11 no migration reads it: OneTrainer ignores it
    r = check_file(write(tmp_path, "new.json", json.dumps(new, indent=2)))
    assert [f.setting for f in r.findings if f.kind == "unknown-key"] == ["gradient_checkpointing"]


# ------------------------------------------------------------------------- argparse prefixes, per script
def test_abbreviation_resolves_against_the_named_scripts_parser(tmp_path):
    """sd-scripts' scripts have different options: a prefix is read against the one script the command runs."""
    # sdxl_train.py has --learning_rate_te1 and --learning_rate_te2 (no --learning_rate_te, which sd3_train.py has)
    r = check_file(write(tmp_path, "sdxl.sh", "accelerate launch sdxl_train.py --pretrained_model_name_or_path "
                                              "/m/sd_xl_base_1.0.safetensors \\\n  --learning_rate_te 1e-5\n"))
    [f] = [f for f in r.findings if f.kind == "wrong-value"]
    assert (r.exit_code, f.line, f.message) == (2, 2, (
        "ambiguous option: --learning_rate_te could match --learning_rate_te1, --learning_rate_te2 (argparse's error: "
        "the script stops with exit status 2 before training)"))
    # --mem: the only option of flux_train_network.py that starts so is --mem_eff_attn (every script's options
    # together also have --mem_eff_attn's neighbours); argparse runs it
    r = check_file(write(tmp_path, "flux.sh", "accelerate launch flux_train_network.py --pretrained_model_name_or_path "
                                              "/m/flux1-dev.safetensors --mem --t5xxl_max 512\n"))
    assert (r.exit_code, r.effective["t5.tokenizer.max_length"]) == (0, 512)
    notes = [(f.setting, f.line, f.message) for f in r.findings if f.kind == "note" and "abbreviation" in f.message]
    assert notes == [
        ("--mem_eff_attn", 1, "--mem is an abbreviation: argparse reads it as --mem_eff_attn, the one option it starts"),
        ("--t5xxl_max_token_length", 1, "--t5xxl_max is an abbreviation: argparse reads it as --t5xxl_max_token_length, "
                                        "the one option it starts")]
    # --gemma2_max is Lumina's --gemma2_max_token_length: sd3_train_network.py has no option it starts
    r = check_file(write(tmp_path, "sd3.sh", "accelerate launch sd3_train_network.py --pretrained_model_name_or_path "
                                             "/m/sd3.5_large.safetensors --gemma2_max 512\n"))
    [f] = [f for f in r.findings if f.kind == "unknown-key"]
    assert (f.setting, f.severity, f.line) == ("gemma2_max", "warning", 1)  # unknown, as any unknown option


def test_abbreviated_option_keeps_its_finding_under_the_full_name(tmp_path):
    r = check_file(write(tmp_path, "flux.sh", "accelerate launch flux_train_network.py \\\n"
                                              "  --pretrained_model_name_or_path /m/flux1-dev.safetensors \\\n"
                                              "  --t5xxl_max 256\n"))
    assert r.exit_code == 1
    assert devs(r) == [("t5.tokenizer.max_length", 256, 512, 3)]  # the line where the prefix is written
    [note] = [f for f in r.findings if f.kind == "note" and f.setting == "--t5xxl_max_token_length"]
    assert (note.line, note.fix) == (3, "write --t5xxl_max_token_length in full")


def test_help_prefix_and_musubi_per_script_prefix(tmp_path):
    r = check_file(write(tmp_path, "h.sh", "accelerate launch flux_train_network.py --pretrained_model_name_or_path "
                                           "/m/flux1-dev.safetensors --he\n"))
    [f] = [f for f in r.findings if f.kind == "wrong-value"]
    assert f.message == "--he is --help to argparse: the script prints its help and exits without training"
    # musubi-tuner: qwen_image_cache_text_encoder_outputs.py's own options (--text_encoder, --batch_size)
    r = check_file(write(tmp_path, "q.sh", "python qwen_image_cache_text_encoder_outputs.py --dataset_config d.toml "
                                           "--text /m/qwen.safetensors --batch 4\n"))
    assert [(f.setting, f.message) for f in r.findings if "abbreviation" in f.message] == [
        ("--text_encoder", "--text is an abbreviation: argparse reads it as --text_encoder, the one option it starts"),
        ("--batch_size", "--batch is an abbreviation: argparse reads it as --batch_size, the one option it starts")]


def test_a_command_running_a_script_te_align_does_not_read_names_file_and_line(tmp_path, capsys):
    """A pasted file whose only command runs some other Python script: one line naming the file, the line and the
    script (exit 2), not the generic "no training command line"."""
    from te_align.cli import main as cli_main

    path = tmp_path / "run.sh"
    path.write_text("#!/bin/bash\nset -e\n\npython my_train.py --foo 1\n", encoding="utf-8")
    assert cli_main(["check", str(path)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == (
        f"te-align: error: {path}:4: my_train.py is not a training or caching script te-align reads (e.g. `accelerate "
        "launch flux_train_network.py …`, `accelerate launch train_dreambooth_lora_sd3.py …`); nothing checked\n")
