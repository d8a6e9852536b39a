"""``te-align check`` on configs in the shape of the ones the trainers ship (issue 13), and hostile input (issue 15
items 12-13): one test per defect class, no trainer checkout needed. ``tools/check_corpus.py`` runs the real ones."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from te_align.audit.findings import EXIT_NOT_CHECKED, NOT_SETTABLE
from te_align.checking import check_file
from te_align.cli import main


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return str(p)


def kinds(r) -> list[tuple[str, str, str]]:
    return [(f.kind, f.severity, f.setting) for f in r.findings]


def devs(r) -> dict:
    return {f.setting: (f.effective, f.profile, f.severity) for f in r.findings if f.kind == "deviation"}


# ------------------------------------------------------------------ 1. keys the trainer accepts
def test_simpletuner_legacy_loop_null_and_false_keys_are_accepted(tmp_path):
    cfg = {"model_family": "flux", "model_flavour": "dev", "validation_steps": 100, "checkpointing_steps": 500,
           "text_encoder_3_precision": "no_change", "text_encoder_4_precision": "no_change", "sdnq_use_hadamard": True,
           "validation_torch_compile": "false", "validation_seed": None, "ignore_final_epochs": True,
           "caption_dropout_probability": 0.1}
    r = check_file(write(tmp_path, "config.json", json.dumps(cfg, indent=2)))
    assert (r.trainer, r.profile, r.exit_code) == ("simpletuner", "flux-dev", 0)
    assert [f for f in r.findings if f.kind == "unknown-key"] == []
    cfg["use_gradient_checkpointing"] = True  # not an option: argparse stops the run (SDXL quickstart has it)
    r = check_file(write(tmp_path, "bad.json", json.dumps(cfg, indent=2)))
    assert [(f.kind, f.severity, f.setting, f.line) for f in r.findings] == [
        ("unknown-key", "error", "use_gradient_checkpointing", 13)]


GUI_DREAMBOOTH = {"save_as_bool": False, "pretrained_model_name_or_path": "runwayml/stable-diffusion-v1-5",
                  "sdxl": False, "learning_rate_te": 1e-5, "learning_rate_te1": 1e-5, "learning_rate_te2": 1e-5,
                  "no_token_padding": False, "stop_text_encoder_training": 0, "clip_skip": 1, "max_token_length": 75,
                  "use_wandb": "False"}


def test_gui_dreambooth_tab_keys_and_save_as_bool(tmp_path):
    r = check_file(write(tmp_path, "db.json", json.dumps(GUI_DREAMBOOTH, indent=2)))
    assert (r.trainer, r.profile, r.exit_code, r.findings) == ("kohya-gui", "sd15", 0, [])
    assert r.family_reason == "kohya_ss GUI: DreamBooth tab, script train_db.py"
    assert r.rules_ran == ["clip_l.encoder.layer (clip_skip)", "clip_l.tokenizer.max_length (max_token_length)"]


def test_gui_finetune_sdxl_checkbox_runs_sdxl_train(tmp_path):
    g = {"save_as_bool": False, "pretrained_model_name_or_path": "/m/model.safetensors", "sdxl_checkbox": True,
         "train_dir": "/d", "image_folder": "/d/img", "learning_rate_te1": 1e-5, "learning_rate_te2": 1e-5,
         "create_caption": True, "create_buckets": True, "max_token_length": 75}
    r = check_file(write(tmp_path, "ft.json", json.dumps(g, indent=2)))
    # a model name that names no base: SDXL's own recipe, assumed and said (it could be Pony, sdxl-pony)
    assert (r.profile, r.family_reason) == ("sdxl", "kohya_ss GUI: Finetune tab, script sdxl_train.py; sdxl assumed")
    assert r.assumed.startswith("assumed sdxl (the architecture's own recipe)")
    assert [f for f in r.findings if f.kind == "unknown-key"] == []


def test_gui_textual_inversion_tab(tmp_path):
    g = {"save_as_bool": False, "pretrained_model_name_or_path": "/m/sd_xl_base_1.0.safetensors", "sdxl": True,
         "token_string": "zkz", "init_word": "*", "num_vectors_per_token": 8, "template": "caption", "weights": ""}
    r = check_file(write(tmp_path, "ti.json", json.dumps(g, indent=2)))
    assert (r.profile, r.family_reason) == ("sdxl", "kohya_ss GUI: Textual Inversion tab, script sdxl_train_textual_inversion.py")
    assert [f for f in r.findings if f.kind == "unknown-key"] == []
    g["sdxl"] = False
    g["pretrained_model_name_or_path"] = "/m/model.safetensors"
    r = check_file(write(tmp_path, "ti15.json", json.dumps(g, indent=2)))
    assert r.family_reason.endswith("script train_textual_inversion.py; sd15 assumed") and r.profile == "sd15"


def test_gui_key_no_tab_reads_is_still_reported(tmp_path):
    g = {"LoRA_type": "Standard", "pretrained_model_name_or_path": "/m/v1-5.safetensors", "conv_dims": 8,
         "no_token_padding": False}
    r = check_file(write(tmp_path, "lora.json", json.dumps(g, indent=2)))
    assert [(f.kind, f.severity, f.setting, f.line) for f in r.findings] == [
        ("unknown-key", "warning", "conv_dims", 4), ("unknown-key", "info", "no_token_padding", 5)]
    assert "the GUI's LoRA tab ignores keys it does not know" in r.findings[0].message
    assert "a DreamBooth-tab field; the LoRA tab does not read it (no effect)" in r.findings[1].message


def test_onetrainer_weight_dtype_consumed_by_migration(tmp_path):
    cfg = {"model_type": "STABLE_DIFFUSION_15", "training_method": "LORA", "weight_dtype": "FLOAT_16",
           "base_model_name": "runwayml/stable-diffusion-v1-5"}
    r = check_file(write(tmp_path, "ot.json", json.dumps(cfg, indent=2)))
    assert (r.exit_code, r.findings) == (0, [])
    cfg["__version"] = 10  # a current config: nothing migrates weight_dtype any more
    r = check_file(write(tmp_path, "ot10.json", json.dumps(cfg, indent=2)))
    assert [(f.kind, f.setting) for f in r.findings] == [("unknown-key", "weight_dtype")]


def test_ai_toolkit_slider_section(tmp_path):
    text = ("job: train\nconfig:\n  name: s\n  process:\n    - type: slider\n      training_folder: out\n"
            "      model:\n        name_or_path: runwayml/stable-diffusion-v1-5\n      slider:\n"
            "        resolutions: [[512, 512]]\n        batch_full_slide: true\n        targets: []\n"
            "        anchors: []\n")
    r = check_file(write(tmp_path, "slider.yml", text))
    assert [f for f in r.findings if f.kind == "unknown-key"] == []
    assert r.profile == "sd15" and r.exit_code == 0


# ------------------------------------------------------------------ 2. exit 0 only when rules ran
def test_onetrainer_pixart_sigma_120_and_no_cleaning(tmp_path):
    cfg = {"__version": 10, "model_type": "PIXART_SIGMA", "training_method": "LORA",
           "base_model_name": "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS"}
    r = check_file(write(tmp_path, "ot.json", json.dumps(cfg)))
    assert r.profile == "pixart-sigma" and r.exit_code == 1
    assert devs(r) == {"t5.tokenizer.max_length": (120, 300, "error"),
                       "t5.tokenizer.text_cleaning": ("none", "pixart", "warning")}
    assert all(f.fix == "not settable in OneTrainer (hard-coded): run it through te-align with "
               "`te-align patch ONETRAINER_CHECKOUT`" for f in r.findings)
    assert "PixArtAlphaModel.py:190-202" in r.findings[0].trainer_source


def test_onetrainer_sana_has_no_instruction_and_chroma_is_aligned(tmp_path):
    r = check_file(write(tmp_path, "sana.json", json.dumps({"model_type": "SANA", "training_method": "FINE_TUNE"})))
    dev = devs(r)
    assert set(dev) == {"gemma.tokenizer.system_prompt", "gemma.tokenizer.text_cleaning"}
    assert dev["gemma.tokenizer.system_prompt"][0] is None and dev["gemma.tokenizer.system_prompt"][1].startswith(
        "Given a user prompt, generate an 'Enhanced prompt'")
    r = check_file(write(tmp_path, "chroma.json", json.dumps({"model_type": "CHROMA_1", "training_method": "LORA"})))
    assert (r.profile, r.exit_code, r.status) == ("chroma", 0, "checked")
    assert "t5.masks.denoiser_extra_pad_tokens" in r.rules_ran


def test_no_rules_for_trainer_and_family_is_not_checked(tmp_path):
    r = check_file(write(tmp_path, "anima.json", json.dumps({"model_type": "ANIMA", "training_method": "LORA"})))
    assert (r.profile, r.exit_code, r.status, r.rules_ran) == ("anima", EXIT_NOT_CHECKED, "not-checked", [])
    assert [(f.kind, f.message) for f in r.findings] == [
        ("not-checked", "not checked: te-align has no rules for onetrainer/anima")]


def test_ai_toolkit_pixart_sigma_skips_caption_cleaning(tmp_path):
    text = ("job: extension\nconfig:\n  process:\n    - type: sd_trainer\n      model:\n"
            "        name_or_path: PixArt-alpha/PixArt-Sigma-XL-2-1024-MS\n{flags}")
    r = check_file(write(tmp_path, "p.yaml", text.format(flags="        is_pixart: true\n        is_pixart_sigma: true\n")))
    assert r.profile == "pixart-sigma"
    assert devs(r) == {"t5.tokenizer.text_cleaning": ("none", "pixart", "warning")}
    assert r.effective["t5.tokenizer.max_length"] == 300
    # is_pixart without is_pixart_sigma on a Sigma checkpoint: 120 tokens
    r = check_file(write(tmp_path, "a.yaml", text.format(flags="        is_pixart: true\n")))
    assert devs(r)["t5.tokenizer.max_length"] == (120, 300, "error")
    assert [f.fix for f in r.findings if f.setting == "t5.tokenizer.max_length"] == [
        'model.arch: "pixart" with model.is_pixart_sigma: true']
    # is_pixart_sigma alone (arch pixart_sigma): not "is_pixart", so the generic T5 branch encodes it
    r = check_file(write(tmp_path, "s.yaml", text.format(flags="        is_pixart_sigma: true\n")))
    assert devs(r) == {"t5.tokenizer.max_length": (256, 300, "error"), "t5.tokenizer.text_cleaning": ("none", "pixart", "warning"),
                       "t5.masks.zero_padded": (True, False, "warning"), "t5.masks.denoiser": (False, True, "warning")}
    # PixArt-α: no profile
    alpha = text.replace("PixArt-Sigma-XL-2-1024-MS", "PixArt-XL-2-1024-MS").format(flags="        is_pixart: true\n")
    r = check_file(write(tmp_path, "alpha.yaml", alpha))
    assert (r.exit_code, r.reason) == (3, "not checked: te-align has no profile for PixArt-α (model.is_pixart / "
                                          "arch pixart without is_pixart_sigma)")


def test_simpletuner_auraflow_pixart_sana(tmp_path):
    r = check_file(write(tmp_path, "aura.json", json.dumps({"model_family": "auraflow"})))
    assert devs(r) == {"t5.tokenizer.max_length": (120, 256, "error")}
    assert [f.fix for f in r.findings if f.kind == "deviation"] == [
        '"tokenizer_max_length": 256, "i_know_what_i_am_doing": true']
    r = check_file(write(tmp_path, "pixart.json", json.dumps({"model_family": "pixart"})))
    r2 = check_file(write(tmp_path, "pixart_sigma.json", json.dumps({"model_family": "pixart_sigma"})))
    assert (r.profile, r.exit_code, r2.profile, r2.exit_code) == ("pixart-sigma", 0, "pixart-sigma", 0)
    assert "t5.tokenizer.text_cleaning" in r.rules_ran[1]
    r = check_file(write(tmp_path, "sana.json", json.dumps({"model_family": "sana"})))
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert (f.setting, f.severity, f.fix) == ("gemma.tokenizer.system_prompt", "warning", (
        'not settable in SimpleTuner (hard-coded); run SimpleTuner with te-align\'s hooks: eval "$(python -m '
        'te_align.hooks.simpletuner env)", then `simpletuner train` or `simpletuner server` in that shell'))
    assert f.effective.startswith("SimpleTuner's own 10-line instruction")


# ------------------------------------------------------------------ 3. family detection
def test_ai_toolkit_schnell_by_assistant_lora_flex_and_no_profile(tmp_path):
    base = "job: extension\nconfig:\n  process:\n    - type: sd_trainer\n      model:\n{model}"
    renamed = "        name_or_path: /m/my-model\n        is_flux: true\n        assistant_lora_path: ostris/FLUX.1-schnell-training-adapter\n"
    r = check_file(write(tmp_path, "s.yaml", base.format(model=renamed)))
    assert r.profile == "flux-schnell" and "assistant_lora_path" in r.family_reason
    flex1 = "        name_or_path: ostris/Flex.1-alpha\n        is_flux: true\n"
    r = check_file(write(tmp_path, "f1.yaml", base.format(model=flex1)))
    assert r.profile == "flux-dev" and [f.kind for f in r.findings] == ["note"]
    assert r.findings[0].message.startswith("Flex.1 is checked as FLUX.1")
    for arch, name in (("flex2", "Flex.2"), ("hidream_e1", "HiDream-E1")):
        r = check_file(write(tmp_path, f"{arch}.yaml", base.format(model=f"        arch: {arch}\n        name_or_path: x\n")))
        assert (r.exit_code, r.status) == (3, "not-checked")
        assert r.reason == f"not checked: te-align has no profile for {name} (model.arch {arch!r})"
    # Kontext is FLUX.1 dev's recipe: checked with flux-dev by its own get_prompt_embeds' rules
    r = check_file(write(tmp_path, "k.yaml", base.format(model="        arch: flux_kontext\n        name_or_path: x\n")))
    assert (r.exit_code, r.profile, r.family_reason) == (0, "flux-dev", "model.arch 'flux_kontext'")
    assert r.effective == {"t5.tokenizer.max_length": 512, "t5.masks.zero_padded": False}


@pytest.mark.parametrize(("name", "text", "reason"), [
    ("ot.json", json.dumps({"model_type": "ERNIE", "training_method": "LORA"}),
     "not checked: te-align has no profile for ERNIE-Image (OneTrainer model_type 'ERNIE')"),
    ("config.json", json.dumps({"model_family": "z_image_omni"}),
     "not checked: te-align has no profile for Z-Image Omni (SimpleTuner model_family 'z_image_omni')"),
    ("config2.json", json.dumps({"model_family": "cosmos2image"}),
     "not checked: te-align has no profile for Cosmos-Predict2 (SimpleTuner model_family 'cosmos2image')"),
])
def test_model_without_profile_is_not_checked(tmp_path, name, text, reason):
    r = check_file(write(tmp_path, name, text))
    assert (r.exit_code, r.reason) == (3, reason)


def test_wan22_maps_to_the_same_profile_in_every_trainer(tmp_path):
    st = check_file(write(tmp_path, "config.json", json.dumps({"model_family": "wan", "model_flavour": "ti2v-5b-2.2"})))
    at = check_file(write(tmp_path, "w.yaml", "job: extension\nconfig:\n  process:\n    - type: sd_trainer\n      model:\n"
                                              "        arch: wan22_14b\n        name_or_path: ai-toolkit/Wan2.2-T2V-A14B\n"))
    assert (st.profile, st.exit_code, at.profile, at.exit_code) == ("wan21", 0, "wan21", 0)
    assert [f.message.split(" is checked")[0] for f in st.findings + at.findings if f.kind == "note"] == [
        "Wan 2.2 (model_flavour 'ti2v-5b-2.2')", "Wan 2.2 (model.arch 'wan22_14b')"]


def test_profile_of_another_family_is_refused(tmp_path):
    path = write(tmp_path, "x.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\n')
    r = check_file(path, extra_args=["sdxl_train_network.py"], profile="flux-dev")
    assert r.exit_code == 2
    assert r.findings[0].message == (
        f"{path}: --profile flux-dev is a flux profile, but this config trains sdxl (script sdxl_train_network.py; "
        "sdxl assumed); "
        "pass a sdxl profile or leave --profile out")
    assert check_file(path, profile="flux-dev").exit_code == 0  # nothing in the config names a model


# ------------------------------------------------------------------ 4. jobs that do not train
@pytest.mark.parametrize(("job", "ptype"), [("extract", "locon"), ("generate", "to_folder"), ("mod", "rescale_lora"),
                                            ("extension", "example_merge_extension")])
def test_ai_toolkit_non_training_jobs(tmp_path, job, ptype):
    text = f"job: {job}\nconfig:\n  name: x\n  process:\n    - type: {ptype}\n      output_path: out\n"
    r = check_file(write(tmp_path, "j.yaml", text))
    assert (r.exit_code, r.status, r.profile) == (3, "not-training", None)
    assert r.reason.startswith("not a training job: ")
    assert [f.kind for f in r.findings] == ["not-checked"]


# ------------------------------------------------------------------ 5. fixes in the trainer's terms
def test_gui_sd3_dropout_fields_are_read_and_named(tmp_path):
    g = {"LoRA_type": "Standard", "sd3_checkbox": True, "pretrained_model_name_or_path": "/m/sd3.5_large.safetensors",
         "sd3_clip_l_dropout_rate": 0.1, "clip_g_dropout_rate": 0.464, "sd3_t5_dropout_rate": 0.464}
    r = check_file(write(tmp_path, "sd3.json", json.dumps(g, indent=2)))
    dev = {f.setting: (f.effective, f.fix, f.line) for f in r.findings if f.setting.endswith("train_dropout")}
    assert dev == {"clip_l.train_dropout": (0.1, '"sd3_clip_l_dropout_rate": 0.464', 5)}
    assert r.effective["t5.train_dropout"] == 0.464


def test_not_settable_names_the_patch_of_each_trainer(tmp_path):
    r = check_file(write(tmp_path, "ot.json", json.dumps({"model_type": "STABLE_DIFFUSION_35", "training_method": "LORA",
                                                          "base_model_name": "stabilityai/stable-diffusion-3.5-large"})))
    assert [f.fix for f in r.findings] == [
        "not settable in OneTrainer (hard-coded): run it through te-align with `te-align patch ONETRAINER_CHECKOUT`"]
    r = check_file(write(tmp_path, "k.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n'))
    assert [f.fix for f in r.findings] == [NOT_SETTABLE]  # sd-scripts: te-align patch does cover it
    ti = check_file(write(tmp_path, "ti.json", json.dumps({"pretrained_model_name_or_path": "/m/sd_xl_base_1.0.safetensors",
                                                           "sdxl": True, "token_string": "zkz", "init_word": "*"})))
    assert [f.fix for f in ti.findings] == [
        "not settable: hard-coded in sd-scripts, and te-align patch does not cover sdxl_train_textual_inversion.py"]


# ------------------------------------------------------------------ 6. caption dropout vs empty prompt
def test_caption_dropout_form_against_empty_prompt(tmp_path):
    sdxl = check_file(write(tmp_path, "k.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n'
                                                "caption_dropout_rate = 0.1\n"))
    (f,) = [f for f in sdxl.findings if f.setting == "empty_prompt"]
    assert (f.severity, f.effective, f.profile, f.line, f.fix) == (
        "warning", "encode", "zeros", 2, "caption_dropout_rate = 0 (sd-scripts cannot drop captions as zeros)")
    cached = check_file(write(tmp_path, "kc.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n'
                                                   "caption_dropout_rate = 0.1\ncache_text_encoder_outputs = true\n"))
    assert [(f.kind, f.severity, f.setting) for f in cached.findings if f.setting.startswith(("caption", "empty"))] == [
        ("unused-value", "error", "caption_dropout_rate")]
    sd15 = check_file(write(tmp_path, "k15.toml", 'pretrained_model_name_or_path = "/m/v1-5.safetensors"\n'
                                                  "caption_dropout_rate = 0.1\n"))
    assert sd15.exit_code == 0
    ot = {"model_type": "STABLE_DIFFUSION_15", "training_method": "LORA", "text_encoder": {"dropout_probability": 0.1}}
    r = check_file(write(tmp_path, "ot.json", json.dumps(ot, indent=2)))
    assert [(f.setting, f.effective, f.profile, f.key) for f in r.findings] == [
        ("empty_prompt", "zeros", "encode", "text_encoder.dropout_probability"), ("profile", None, None, None)]
    assert r.assumed.startswith("assumed sd15 (the architecture's own recipe)")
    ot["model_type"] = "STABLE_DIFFUSION_XL_10_BASE"
    assert check_file(write(tmp_path, "otxl.json", json.dumps(ot))).exit_code == 0
    st = check_file(write(tmp_path, "config.json", json.dumps({"model_family": "sdxl"})))
    assert [(f.setting, f.key) for f in st.findings] == [("empty_prompt", "caption_dropout_probability (default 0.1)")]


# ------------------------------------------------------------------ 7. severity from the captions
def test_clip_g_bang_depends_on_the_captions(tmp_path):
    cfg = write(tmp_path, "k.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n')
    assert (check_file(cfg).exit_code, devs(check_file(cfg))["clip_g.tokenizer.pad_token"][2]) == (0, "info")
    data = tmp_path / "data"
    write(data, "a.txt", "a red car")
    write(data, "b.txt", "a cat")
    r = check_file(cfg, dataset=[str(data)])
    (f,) = r.findings
    assert (f.severity, r.exit_code) == ("info", 0) and "No caption of 2 caption file(s)" in f.message
    write(data, "sub/c.txt", "wow!")
    r = check_file(cfg, dataset=[str(data)])
    assert (r.findings[0].severity, r.exit_code) == ("warning", 1)
    assert r.findings[0].message.endswith(f'1 of 3 caption file(s) in {data} contain a literal "!"')
    # the config's own data folder counts too
    r = check_file(write(tmp_path, "k2.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n'
                                              f"train_data_dir = {json.dumps(str(data))}\n"))
    assert r.exit_code == 1


def test_qwen_1024_matters_only_for_long_captions(tmp_path):
    text = ("job: extension\nconfig:\n  process:\n    - type: sd_trainer\n      model:\n        arch: qwen_image\n"
            "        name_or_path: Qwen/Qwen-Image\n      datasets:\n        - folder_path: {folder}\n")
    data = tmp_path / "img"
    write(data, "1.txt", "short caption")
    r = check_file(write(tmp_path, "q.yaml", text.format(folder=json.dumps(str(data)))))
    assert devs(r)["qwen.tokenizer.max_length"] == (1024, 512, "info") and r.exit_code == 0
    write(data, "2.txt", "word " * 200)
    r = check_file(write(tmp_path, "q.yaml", text.format(folder=json.dumps(str(data)))))
    assert devs(r)["qwen.tokenizer.max_length"] == (1024, 512, "warning") and r.exit_code == 1


def test_simpletuner_qwen_reads_captions_from_its_data_backend_config(tmp_path):
    data = tmp_path / "img"
    write(data, "1.txt", "x" * 600)
    backends = [{"id": "d", "type": "local", "instance_data_dir": str(data), "caption_strategy": "textfile"},
                {"id": "t", "type": "local", "dataset_type": "text_embeds", "cache_dir": str(tmp_path / "te")}]
    db = write(tmp_path, "multidatabackend.json", json.dumps(backends))
    config = write(tmp_path, "config.json", json.dumps({"model_family": "qwen_image", "data_backend_config": db,
                                                        "caption_dropout_probability": 0.0}))
    r = check_file(config)
    assert devs(r) == {"qwen.tokenizer.max_length": (1024, 512, "warning"), "qwen.tokenizer.padding": ("max_length", "longest", "info")}
    assert r.findings[0].message.endswith(f"1 of 1 caption file(s) in {data} are longer than 512 bytes (so may pass "
                                          "512 tokens)")
    # with SimpleTuner's default caption_strategy "filename" the .txt files are not its captions: none are counted
    del backends[0]["caption_strategy"]
    write(tmp_path, "multidatabackend.json", json.dumps(backends))
    r = check_file(config)
    assert "1 of 1" not in r.findings[0].message and r.findings[0].message.endswith(
        "te-align cannot see the captions (pass --dataset DIR to count them)")


def test_text_output_never_cuts_source_text(tmp_path, capsys):
    path = write(tmp_path, "ot.json", json.dumps({"model_type": "PIXART_SIGMA", "training_method": "LORA"}))
    assert main(["check", path]) == 1
    out = capsys.readouterr().out
    assert "…" not in out
    assert "src/diffusers/pipelines/pixart_alpha/pipeline_pixart_sigma.py:259,657 encode_prompt / __call__ " \
           "max_sequence_length=300" in out


# ------------------------------------------------------------------ issue 15: readers
@pytest.mark.parametrize(("name", "text"), [
    ("deep.json", "[" * 100_000 + "]" * 100_000),
    ("deep.yaml", "- " * 100_000 + "x\n"),
    ("deep2.yaml", "a:\n" + "".join(" " * (i + 1) + "b:\n" for i in range(200)) + " " * 201 + "c: 1\n"),
    ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n"),
])
def test_deep_nesting_is_one_line_exit_2(tmp_path, name, text):
    path = write(tmp_path, name, text)
    r = check_file(path)
    assert r.exit_code == 2 and len(r.findings) == 1
    assert r.findings[0].message.startswith(f"{path}:") and r.findings[0].message.endswith("nested deeper than 64 levels")


def test_huge_config_work_is_bounded(tmp_path):
    g = {"LoRA_type": "Standard", "pretrained_model_name_or_path": "/m/v1-5.safetensors"}
    g.update({f"bogus_key_{i}": i for i in range(10_000)})
    path = write(tmp_path, "big.json", json.dumps(g, indent=2))
    t0 = time.perf_counter()
    r = check_file(path)
    assert time.perf_counter() - t0 < 10
    unknown = [f for f in r.findings if f.kind == "unknown-key"]
    assert len(unknown) == 10_000 and unknown[-1].line == 10_003
    assert sum(f.fix.startswith("did you mean") for f in unknown) <= 50


@pytest.mark.parametrize(("name", "text", "extra", "key", "line", "problem"), [
    ("m.yaml", 'job: extension\nconfig:\n  process:\n    - type: sd_trainer\n      model: "flux"\n', (), "model", 5,
     "expected a table of settings, got 'flux'"),
    ("d.yaml", "job: extension\nconfig:\n  process:\n    - type: sd_trainer\n      datasets: /data\n", (), "datasets", 5,
     "expected a list of datasets, got '/data'"),
    ("o.json", json.dumps({"model_type": "FLUX_DEV_1", "training_method": "LORA", "text_encoder": 5}, indent=1), (),
     "text_encoder", 4, "expected a table of settings, got 5"),
    ("t.toml", 'pretrained_model_name_or_path = "/m/flux1-dev.safetensors"\nt5xxl = "t"\nt5xxl_max_token_length = nan\n',
     (), "t5xxl_max_token_length", 3, "expected a whole number, got nan"),
    ("c.toml", 'pretrained_model_name_or_path = "/m/flux1-dev.safetensors"\nt5xxl = "t"\n',
     ("--t5xxl_max_token_length", "abc"), "t5xxl_max_token_length", None, "expected a whole number, got 'abc'"),
    ("g.json", json.dumps({"LoRA_type": "Flux1", "flux1_checkbox": True, "apply_t5_attn_mask": "maybe"}, indent=1), (),
     "apply_t5_attn_mask", 4, "expected true or false, got 'maybe'"),
])
def test_wrong_type_or_value_is_exit_2_with_key_and_line(tmp_path, name, text, extra, key, line, problem):
    path = write(tmp_path, name, text)
    r = check_file(path, extra_args=list(extra))
    assert r.exit_code == 2
    (f,) = [f for f in r.findings if f.kind in ("wrong-value", "syntax")]
    where = f"{path}:{line}" if line else path
    assert f.message.startswith(f"{where}") and f"wrong type/value for {key}: {problem}" in f.message


@pytest.mark.parametrize(("name", "text"), [("e.toml", ""), ("e.json", "{}"), ("e.yaml", "# nothing\n")])
def test_empty_config_is_not_aligned(tmp_path, name, text):
    path = write(tmp_path, name, text)
    r = check_file(path)
    assert (r.exit_code, r.findings[0].message) == (2, f"{path}: empty config: nothing to check")


# ------------------------------------------------------------------ CLI
def test_cli_exit_3_json_status_and_precedence(tmp_path, capsys):
    extract = write(tmp_path, "x.yaml", "job: extract\nconfig:\n  process:\n    - type: locon\n")
    assert main(["check", extract]) == 3
    assert "not a training job: job: extract" in capsys.readouterr().out
    bad = write(tmp_path, "bad.toml", 'pretrained_model_name_or_path = "/m/flux1-dev.safetensors"\nt5xxl = "t"\n'
                                      "apply_t5_attn_mask = true\n")
    assert main(["check", extract, bad, "--json"]) == 1  # deviations outrank "not checked"
    data = json.loads(capsys.readouterr().out)
    assert [(x["exit_code"], x["status"]) for x in data["results"]] == [(3, "not-training"), (1, "checked")]
    assert data["results"][1]["rules_ran"][0] == "t5.tokenizer.max_length (t5xxl_max_token_length)"


def test_cli_dataset_option_counts_captions(tmp_path, capsys):
    cfg = write(tmp_path, "k.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\n')
    data = tmp_path / "captions"
    write(data, "a.caption", "hello!")
    assert main(["check", cfg]) == 0
    capsys.readouterr()
    assert main(["check", cfg, "--dataset", str(data)]) == 1
    assert f'1 of 1 caption file(s) in {data} contain a literal "!"' in capsys.readouterr().out
    assert main(["check", cfg, "--dataset", str(tmp_path / "missing")]) == 2
    assert f"te-align: error: {tmp_path / 'missing'}: --dataset: no such folder" in capsys.readouterr().err
