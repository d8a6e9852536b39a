"""sd-scripts keys whose effect on the text side is not what their name says: epoch-wise caption dropout (in the
config and in a dataset_config's subsets, and with a text-encoder cache that never drops), and text-encoder
learning-rate keys the script never reads. Each with its aligned counterpart."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from te_align.checking import check_file, fix_file
from te_align.trainers.kohya import semantics

FLUX_DEV = """
pretrained_model_name_or_path = "/m/flux1-dev.safetensors"
clip_l = "/m/clip_l.safetensors"
t5xxl = "/m/t5xxl.safetensors"
ae = "/m/ae.safetensors"
network_module = "networks.lora_flux"
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def effects(r):
    return [(f.kind, f.severity, f.setting, f.line, f.message, f.fix) for f in r.findings
            if f.kind in ("effect", "unused-value", "unknown-key")]


# ------------------------------------------------------------------------ caption_dropout_every_n_epochs
def test_every_epoch_dropout_trains_unconditionally(tmp_path):
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV + "caption_dropout_every_n_epochs = 1\n"))
    assert r.exit_code == 1
    assert effects(r) == [(
        "effect", "error", "caption_dropout_every_n_epochs", 7,
        'caption_dropout_every_n_epochs = 1: sd-scripts drops every caption in every epoch whose number is a multiple '
        'of N, so with 1 every caption of every epoch becomes the empty caption "": the run trains unconditionally '
        "and learns nothing from your captions",
        "caption_dropout_every_n_epochs = 0 (for random dropout of a share of captions use caption_dropout_rate, "
        "e.g. 0.05)")]
    assert "library/train_util.py:829-837" in r.findings[0].trainer_source


def test_every_epoch_dropout_fix_removes_it(tmp_path):
    path = write(tmp_path, "a.toml", FLUX_DEV + "caption_dropout_every_n_epochs = 1\n")
    report = fix_file(path, backup=False)
    assert report.refused == ""
    assert Path(path).read_text(encoding="utf-8") == FLUX_DEV
    assert report.result.exit_code == 0


def test_aligned_counterpart_without_epoch_dropout(tmp_path):
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV + "caption_dropout_every_n_epochs = 0\n"))
    assert (r.exit_code, r.findings) == (0, [])


def test_every_third_epoch_is_a_note_with_the_epoch_count(tmp_path):
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV + "caption_dropout_every_n_epochs = 3\nmax_train_epochs = 10\n"))
    assert r.exit_code == 0
    assert effects(r) == [(
        "effect", "info", "caption_dropout_every_n_epochs", 7,
        'caption_dropout_every_n_epochs = 3: every caption is dropped in epochs 3, 6, … (whole epochs trained '
        'unconditionally on "", not a random share of captions in each); with max_train_epochs = 10 that is 3 of '
        "10 epochs",
        "keep it if whole unconditional epochs are meant; for per-caption dropout use caption_dropout_rate (about "
        "0.33) and caption_dropout_every_n_epochs = 0")]


def test_dataset_config_subset_every_epoch(tmp_path):
    img = tmp_path / "img"
    img.mkdir()
    data = write(tmp_path, "data.toml", f'[general]\ncaption_dropout_every_n_epochs = 1\n[[datasets]]\n'
                                        f'[[datasets.subsets]]\nimage_dir = "{img.as_posix()}"\n'
                                        f'[[datasets.subsets]]\nimage_dir = "{img.as_posix()}2"\n'
                                        'caption_dropout_every_n_epochs = 0\n')
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV + f'dataset_config = "{Path(data).as_posix()}"\n'))
    assert r.exit_code == 1
    assert effects(r) == [(
        "effect", "error", "caption_dropout_every_n_epochs", None,
        f"caption_dropout_every_n_epochs = 1 (dataset_config subsets: {img.as_posix()}): sd-scripts drops every "
        "caption in every epoch whose number is a multiple of N, so with 1 every caption of every epoch becomes the "
        'empty caption "": the run trains unconditionally and learns nothing from your captions',
        f"set caption_dropout_every_n_epochs = 0 in the dataset_config for {img.as_posix()} (for random dropout of "
        "a share of captions use caption_dropout_rate, e.g. 0.05)")]
    assert [f.edit for f in r.findings if f.kind == "effect"] == [None]


def test_cached_outputs_never_drop(tmp_path):
    text = FLUX_DEV + "caption_dropout_every_n_epochs = 1\ncache_text_encoder_outputs = true\nnetwork_train_unet_only = true\n"
    r = check_file(write(tmp_path, "a.toml", text))
    assert r.exit_code == 1
    assert effects(r) == [(
        "unused-value", "warning", "caption_dropout_every_n_epochs", 7,
        "caption_dropout_every_n_epochs = 1 with cached text-encoder outputs: no caption is ever dropped, because "
        "the cache holds each caption's outputs as written and training reads them without process_caption (and "
        "sd-scripts, which refuses caption_dropout_rate with a cache, accepts this key)",
        "caption_dropout_every_n_epochs = 0, or turn text-encoder output caching off")]
    assert "library/train_util.py:1697-1718" in r.findings[0].trainer_source


# ------------------------------------------------------------------------ text-encoder learning rates
def test_network_script_does_not_read_learning_rate_te1(tmp_path):
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV + "learning_rate = 1e-4\nlearning_rate_te1 = 5e-5\n"))
    assert r.exit_code == 1
    assert effects(r) == [(
        "unused-value", "warning", "learning_rate_te1", 8,
        "learning_rate_te1 = 5e-05 is not read by the network scripts (train_network.py and the *_train_network.py "
        "on it: the config sets network_module), which read text_encoder_lr: the text encoder trains at "
        "learning_rate = 0.0001, not at 5e-05",
        "text_encoder_lr = 5e-05 in place of learning_rate_te1")]


def test_network_lr_fix_writes_text_encoder_lr(tmp_path):
    path = write(tmp_path, "a.toml", FLUX_DEV + "learning_rate_te1 = 5e-5\n")
    report = fix_file(path, backup=False)
    assert report.refused == ""
    assert Path(path).read_text(encoding="utf-8") == FLUX_DEV + "text_encoder_lr = 5e-05\n"
    assert report.result.exit_code == 0


def test_aligned_counterpart_text_encoder_lr(tmp_path):
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV + "text_encoder_lr = 5e-5\n"))
    assert (r.exit_code, r.findings) == (0, [])


def test_sdxl_full_finetune_reads_te1_te2_not_text_encoder_lr(tmp_path):
    toml = write(tmp_path, "a.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n'
                                     "train_text_encoder = true\ntext_encoder_lr = 1e-5\n")
    r = check_file(toml, extra_args=["sdxl_train.py"])
    assert [row for row in effects(r) if row[2] == "text_encoder_lr"] == [(
        "unused-value", "warning", "text_encoder_lr", 3,
        "text_encoder_lr = 1e-05 is not read by sdxl_train.py, which read learning_rate_te1 / learning_rate_te2: "
        "the text encoder trains at learning_rate (its default), not at 1e-05",
        "learning_rate_te1 = 1e-05, learning_rate_te2 = 1e-05 in place of text_encoder_lr")]
    good = write(tmp_path, "b.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n'
                                     "train_text_encoder = true\nlearning_rate_te1 = 1e-5\nlearning_rate_te2 = 1e-5\n")
    assert [row for row in effects(check_file(good, extra_args=["sdxl_train.py"]))] == []


def test_full_finetune_without_train_text_encoder_reads_no_te_rate(tmp_path):
    toml = write(tmp_path, "a.toml", 'pretrained_model_name_or_path = "/m/v1-5-pruned.safetensors"\n'
                                     "learning_rate_te = 1e-6\n")
    r = check_file(toml, extra_args=["fine_tune.py"])
    assert effects(r) == [(
        "unused-value", "warning", "learning_rate_te", 2,
        "learning_rate_te = 1e-06 is not read: fine_tune.py does not train the text encoder: train_text_encoder is "
        "not set, so no text encoder trains at this rate",
        "remove learning_rate_te, or set train_text_encoder = true to train the text encoder")]
    assert r.exit_code == 1
    assert effects(check_file(toml, extra_args=["fine_tune.py", "--train_text_encoder"])) == []


def test_flux_full_finetune_trains_no_text_encoder(tmp_path):
    toml = write(tmp_path, "a.toml", FLUX_DEV.replace('network_module = "networks.lora_flux"\n', "")
                 + "learning_rate_te1 = 1e-6\n")
    r = check_file(toml, extra_args=["flux_train.py"])
    assert [(k, s, m) for k, s, _, _, m, _ in effects(r)] == [(
        "unused-value", "warning", "learning_rate_te1 = 1e-06 is not read: flux_train.py trains no text encoder (its "
        "optimizer takes only the FLUX DiT), so no text encoder trains at this rate")]


def test_command_line_flag_the_script_lacks_stops_it(tmp_path):
    toml = write(tmp_path, "a.toml", FLUX_DEV)
    r = check_file(toml, extra_args=["flux_train_network.py", "--learning_rate_te1", "1e-5"])
    assert r.exit_code == 1
    assert [(k, s, st, m, fx) for k, s, st, _, m, fx in effects(r)] == [(
        "unknown-key", "error", "learning_rate_te1",
        "flux_train_network.py's argparse has no --learning_rate_te1: it stops at start ('unrecognized arguments'), "
        "it reads text_encoder_lr", "remove --learning_rate_te1 and give --text_encoder_lr")]
    ok = check_file(toml, extra_args=["flux_train_network.py", "--text_encoder_lr", "1e-5"])
    assert (ok.exit_code, ok.findings) == (0, [])


def test_no_script_and_no_network_module_says_nothing(tmp_path):
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV.replace('network_module = "networks.lora_flux"\n', "")
                         + "learning_rate_te1 = 1e-6\n"))
    assert effects(r) == []


# ------------------------------------------------------------------------ the tables against sd-scripts itself
def _options(path: Path) -> set[str]:
    """Every ``--option`` string given to an ``add_argument`` call in a script."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            out |= {a.value[2:] for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    and a.value.startswith("--")}
    return out


def test_lr_tables_match_the_scripts_argparse():
    root = os.environ.get("TE_ALIGN_KOHYA_DIR")
    if not root:
        pytest.skip("TE_ALIGN_KOHYA_DIR is not set (an sd-scripts checkout)")
    base = _options(Path(root) / "train_network.py")
    for script in semantics.NETWORK_SCRIPTS:
        opts = _options(Path(root) / script) | base
        assert opts & set(semantics.LR_KEYS) == {"text_encoder_lr"}, script
    for script, (reads, flag, _) in semantics.FULL_SCRIPTS.items():
        opts = _options(Path(root) / script)
        assert opts & set(semantics.LR_KEYS) == set(reads), script
        assert flag is None or flag in opts, script
    for script in semantics.NO_TE_SCRIPTS:
        opts = _options(Path(root) / script)
        assert opts & set(semantics.LR_KEYS) == set(), script
        assert "train_text_encoder" not in opts, script


# ------------------------------------------------------------------------ caption changes a text-encoder cache cannot hold
LUMINA = ('pretrained_model_name_or_path = "/m/lumina_2_model_bf16.safetensors"\ngemma2 = "/m/gemma_2_2b.safetensors"\n'
          'ae = "/m/ae.safetensors"\nnetwork_module = "networks.lora_lumina"\nsystem_prompt = "You are an assistant '
          'designed to generate superior images with the superior degree of image-text alignment based on textual '
          'prompts or user prompts."\ncache_text_encoder_outputs = true\nnetwork_train_unet_only = true\n')


def test_flux_cache_with_shuffle_caption_stops_sd_scripts(tmp_path):
    text = FLUX_DEV + "cache_text_encoder_outputs = true\nnetwork_train_unet_only = true\nshuffle_caption = true\n"
    r = check_file(write(tmp_path, "a.toml", text))
    assert r.exit_code == 1
    assert effects(r) == [(
        "unused-value", "error", "shuffle_caption", 9,
        "shuffle_caption = true with cached text-encoder outputs: sd-scripts stops at start ('when caching Text "
        "Encoder output, either caption_dropout_rate, shuffle_caption, token_warmup_step or caption_tag_dropout_rate "
        "cannot be used')", "turn shuffle_caption off, or turn text-encoder output caching off")]
    assert "flux_train_network.py:65-68" in r.findings[0].trainer_source
    ok = check_file(write(tmp_path, "b.toml", text.replace("shuffle_caption = true", "shuffle_caption = false")))
    assert (ok.exit_code, effects(ok)) == (0, [])


def test_dataset_config_tag_dropout_with_a_cache(tmp_path):
    data = write(tmp_path, "data.toml", '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "/d/one"\n'
                                        "caption_tag_dropout_rate = 0.1\n")
    text = FLUX_DEV + f'cache_text_encoder_outputs = true\ndataset_config = "{Path(data).as_posix()}"\n'
    r = check_file(write(tmp_path, "a.toml", text))
    assert [(k, s, st, ln, m) for k, s, st, ln, m, _ in effects(r)] == [(
        "unused-value", "error", "caption_tag_dropout_rate", None,
        "caption_tag_dropout_rate = 0.1 (dataset_config subsets: /d/one) with cached text-encoder outputs: sd-scripts "
        "stops at start ('when caching Text Encoder output, either caption_dropout_rate, shuffle_caption, "
        "token_warmup_step or caption_tag_dropout_rate cannot be used')")]
    assert [f.edit for f in r.findings if f.kind == "unused-value"] == [None]


def test_lumina_network_cache_never_applies_per_step_caption_changes(tmp_path):
    r = check_file(write(tmp_path, "l.toml", LUMINA + "shuffle_caption = true\ncaption_dropout_rate = 0.1\n"))
    assert r.exit_code == 1
    assert [(k, s, st, ln) for k, s, st, ln, _, _ in effects(r)] == [
        ("unused-value", "warning", "caption_dropout_rate", 9), ("unused-value", "warning", "shuffle_caption", 8)]
    assert effects(r)[1][4] == (
        "shuffle_caption = true with cached text-encoder outputs does nothing: lumina_train_network.py does not check "
        "it (as the other scripts do) and the cache holds each caption's outputs as written, read without "
        "process_caption")
    # lumina_train.py checks, as the others do
    full = check_file(write(tmp_path, "m.toml", LUMINA.replace('network_module = "networks.lora_lumina"\n', "")
                            + "shuffle_caption = true\n"), extra_args=["lumina_train.py"])
    assert [(k, s, st) for k, s, st, *_ in effects(full)] == [("unused-value", "error", "shuffle_caption")]
    assert (check_file(write(tmp_path, "n.toml", LUMINA)).exit_code, effects(check_file(str(tmp_path / "n.toml")))) == (
        0, [])


# ------------------------------------------------------------------------ the kohya_ss GUI writes the same keys
def _gui(tmp_path: Path, **fields: object) -> str:
    import json

    data = {"LoRA_type": "Standard", "network_dim": 16, "network_alpha": 16, "text_encoder_lr": 0.0001,
            "unet_lr": 0.0001, "pretrained_model_name_or_path": "/m/v1-5-pruned.safetensors", "epoch": 10, **fields}
    return write(tmp_path, "gui.json", json.dumps(data, indent=2))


def test_gui_every_epoch_dropout_and_its_fix(tmp_path):
    path = _gui(tmp_path, caption_dropout_every_n_epochs=1)
    r = check_file(path)
    assert r.trainer == "kohya-gui" and r.exit_code == 1
    assert [(k, s, st, ln, fx) for k, s, st, ln, _, fx in effects(r)] == [(
        "effect", "error", "caption_dropout_every_n_epochs", 9,
        '"caption_dropout_every_n_epochs": 0 (for random dropout of a share of captions use caption_dropout_rate, '
        "e.g. 0.05)")]
    report = fix_file(path, backup=False)
    assert report.refused == ""
    assert '"caption_dropout_every_n_epochs": 0' in Path(path).read_text(encoding="utf-8")
    assert report.result.exit_code == 0
    assert (check_file(_gui(tmp_path, caption_dropout_every_n_epochs=0)).exit_code) == 0


def test_gui_text_encoder_lr_zero_is_unet_only_so_a_cache_never_drops(tmp_path):
    path = _gui(tmp_path, caption_dropout_every_n_epochs=1, text_encoder_lr=0, sdxl=True, sdxl_cache_text_encoder_outputs=True,
                pretrained_model_name_or_path="/m/sd_xl_base_1.0.safetensors")
    assert [(k, s, st) for k, s, st, *_ in effects(check_file(path))] == [
        ("unused-value", "warning", "caption_dropout_every_n_epochs")]
