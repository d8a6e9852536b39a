"""``te-align check``: trainer configs (aligned, misaligned, misspelled, broken) with exact findings."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from te_align.audit.findings import NOT_SETTABLE
from te_align.checking import check_file
from te_align.cli import main
from te_align.trainers.onetrainer.audit import NOT_SETTABLE as OT_NOT_SETTABLE

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"

SCHNELL_256 = "256"
LUMINA_SP = ("You are an assistant designed to generate superior images with the superior degree of "
             "image-text alignment based on textual prompts or user prompts.")


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def rows(result):
    """(kind, severity, setting, effective, profile, fix) of every finding."""
    return [(f.kind, f.severity, f.setting, f.effective, f.profile, f.fix) for f in result.findings]


def deviations(result):
    return {f.setting: (f.effective, f.profile, f.severity, f.fix) for f in result.findings if f.kind == "deviation"}


# ------------------------------------------------------------------------------------ sd-scripts
FLUX_DEV = """
pretrained_model_name_or_path = "/m/flux1-dev.safetensors"
clip_l = "/m/clip_l.safetensors"
t5xxl = "/m/t5xxl.safetensors"
ae = "/m/ae.safetensors"
network_module = "networks.lora_flux"
"""


def test_kohya_aligned_flux_dev(tmp_path):
    r = check_file(write(tmp_path, "a.toml", FLUX_DEV))
    assert (r.trainer, r.profile, r.exit_code, r.findings) == ("kohya", "flux-dev", 0, [])
    assert r.effective == {"t5.tokenizer.max_length": 512, "t5.masks.encoder": False, "t5.masks.denoiser": False}


def test_kohya_schnell_misaligned_exact(tmp_path):
    text = FLUX_DEV.replace("flux1-dev", "flux1-schnell") + (
        "[te]\nt5xxl_max_token_length = 512\napply_t5_attn_mask = true\n")
    r = check_file(write(tmp_path, "s.toml", text))
    assert r.profile == "flux-schnell" and r.exit_code == 1
    assert rows(r) == [
        # the severity policy (te_align/audit/policy.py): T5 at 512 measured null, the mask flags not measured and
        # cutting no token: all three warnings, in the rule table's order
        ("deviation", "warning", "t5.tokenizer.max_length", 512, 256, "t5xxl_max_token_length = 256"),
        ("deviation", "warning", "t5.masks.encoder", True, False, f"remove apply_t5_attn_mask from {tmp_path / 's.toml'}"),
        ("deviation", "warning", "t5.masks.denoiser", True, False, f"remove apply_t5_attn_mask from {tmp_path / 's.toml'}"),
    ]
    assert r.findings[0].line == 8
    assert "black-forest-labs/flux" in r.findings[0].source


def test_kohya_schnell_default_is_256_when_unset(tmp_path):
    r = check_file(write(tmp_path, "s.toml", FLUX_DEV.replace("flux1-dev", "flux1-schnell")))
    assert r.exit_code == 0 and r.effective["t5.tokenizer.max_length"] == 256


def test_kohya_misspelled_key_and_unused_clip_skip(tmp_path):
    text = ('pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\nclip_skip = 2\n'
            "t5xxl_max_token_lenght = 256\n")
    r = check_file(write(tmp_path, "x.toml", text))
    assert r.profile == "sdxl" and r.exit_code == 1
    assert rows(r) == [
        ("deviation", "info", "clip_g.tokenizer.pad_token", "<|endoftext|>", "!", NOT_SETTABLE),
        ("unused-value", "warning", "clip_skip", 2, None, f"remove clip_skip from {tmp_path / 'x.toml'}"),
        ("unknown-key", "warning", "t5xxl_max_token_lenght", None, None, "did you mean 't5xxl_max_token_length'?"),
    ]
    assert [f.line for f in r.findings] == [None, 2, 3]


def test_kohya_sd3_mask_flags_ignored_live_but_used_when_cached(tmp_path):
    base = ('pretrained_model_name_or_path = "/m/sd3.5_large.safetensors"\nclip_g = "/m/g.safetensors"\n'
            't5xxl = "/m/t5.safetensors"\napply_t5_attn_mask = true\n')
    live = check_file(write(tmp_path, "live.toml", base))
    unused = [f for f in live.findings if f.kind == "unused-value"]
    assert [(f.setting, f.effective, f.severity) for f in unused] == [("apply_t5_attn_mask", True, "warning")]
    assert live.effective["t5.masks.encoder"] is False
    cached = check_file(write(tmp_path, "cached.toml", base + "cache_text_encoder_outputs = true\n"))
    assert deviations(cached)["t5.masks.encoder"] == (True, False, "warning", f"remove apply_t5_attn_mask from {tmp_path / 'cached.toml'}")
    assert not [f for f in cached.findings if f.kind == "unused-value"]
    assert [f.kind for f in cached.findings][-1] == "stale-cache"


def test_kohya_lumina_empty_system_prompt(tmp_path):
    r = check_file(write(tmp_path, "l.toml", 'pretrained_model_name_or_path = "/m/lumina.safetensors"\nsystem_prompt = ""\n'))
    assert r.profile == "lumina2"
    # the severity policy: not measured and no token of the caption lost, so a warning (exit 1 all the same)
    assert deviations(r) == {"gemma.tokenizer.system_prompt": (None, LUMINA_SP, "warning", f"system_prompt = {json.dumps(LUMINA_SP)}")}
    assert r.exit_code == 1
    ok = check_file(write(tmp_path, "ok.toml", f"system_prompt = {json.dumps(LUMINA_SP)}\n"))
    assert ok.exit_code == 0


def test_kohya_anima_lengths_and_script(tmp_path):
    base = 'pretrained_model_name_or_path = "/m/anima.safetensors"\nqwen3 = "/m/qwen_3_06b_base.safetensors"\n'
    ok = check_file(write(tmp_path, "a.toml", base))
    assert (ok.profile, ok.exit_code, ok.findings) == ("anima", 0, [])
    assert ok.effective == {"qwen.tokenizer.max_length": 512, "t5.tokenizer.max_length": 512}
    r = check_file(write(tmp_path, "b.toml", base + "t5_max_token_length = 256\n"), extra_args=["anima_train_network.py"])
    assert r.profile == "anima" and deviations(r) == {"t5.tokenizer.max_length": (256, 512, "error", "t5_max_token_length = 512")}


def test_kohya_hunyuan_image_hard_coded_differences(tmp_path):
    base = 'pretrained_model_name_or_path = "/m/hunyuanimage2.1.safetensors"\nbyt5 = "/m/byt5.safetensors"\n'
    r = check_file(write(tmp_path, "h.toml", base))
    assert r.profile == "hunyuanimage-2.1"
    dev = deviations(r)
    assert set(dev) == {"qwen.tokenizer.max_length", "qwen.tokenizer.padding", "byt5.tokenizer.text_transform"}
    assert dev["qwen.tokenizer.max_length"][:2] == (1024, 1000) and dev["qwen.tokenizer.padding"][:3] == ("longest", "max_length", "info")
    assert dev["byt5.tokenizer.text_transform"][:3] == ("quoted_text without '...'", "quoted_text", "warning")
    assert all(fix == NOT_SETTABLE for *_, fix in dev.values())
    by_script = check_file(write(tmp_path, "s.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\n'),
                           extra_args=["hunyuan_image_train_network.py"])
    assert by_script.profile == "hunyuanimage-2.1"


def test_kohya_sd1_clip_skip_and_chunks(tmp_path):
    r = check_file(write(tmp_path, "sd.toml", 'pretrained_model_name_or_path = "runwayml/stable-diffusion-v1-5"\n'
                         "clip_skip = 2\nmax_token_length = 225\n"))
    assert r.profile == "sd15"
    assert deviations(r) == {
        # both measured null on the SD 1.5 world base (world-sd15-clip-skip-2, world-sd15-max-token-225): warnings
        "clip_l.encoder.layer": ("penultimate", "last", "warning", f"remove clip_skip from {tmp_path / 'sd.toml'}"),
        "clip_l.tokenizer.max_length": (227, 77, "warning", f"remove max_token_length from {tmp_path / 'sd.toml'}"),
    }


def test_kohya_extra_cli_args_override_toml_and_name_the_script(tmp_path):
    path = write(tmp_path, "c.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\nt5xxl_max_token_length = 512\n')
    r = check_file(path, extra_args=["flux_train_network.py", "--t5xxl_max_token_length", "256", "--apply_t5_attn_mask"],
                   profile="flux-schnell")
    assert r.effective == {"t5.tokenizer.max_length": 256, "t5.masks.encoder": True, "t5.masks.denoiser": True}
    assert deviations(r)["t5.masks.encoder"][3] == "remove --apply_t5_attn_mask"


def test_kohya_broken_toml_reports_line_and_column(tmp_path):
    r = check_file(write(tmp_path, "b.toml", 'pretrained_model_name_or_path = "x"\nclip_skip = = 2\n'))
    assert r.exit_code == 2
    (f,) = r.findings
    assert (f.kind, f.line, f.column) == ("syntax", 2, 13)
    assert f.message.startswith(f"{tmp_path / 'b.toml'}:2:13: syntax error: ")


# ------------------------------------------------------------------------------------ kohya GUI
def test_gui_flux_schnell_512_and_additional_parameters(tmp_path):
    g = {"LoRA_type": "Flux1", "flux1_checkbox": True, "pretrained_model_name_or_path": "/m/flux1-schnell.safetensors",
         "t5xxl_max_token_length": 512, "apply_t5_attn_mask": False, "clip_skip": 1, "max_token_length": 75,
         "additional_parameters": ""}
    r = check_file(write(tmp_path, "g.json", json.dumps(g, indent=2)))
    assert (r.trainer, r.profile) == ("kohya-gui", "flux-schnell")
    assert rows(r) == [("deviation", "warning", "t5.tokenizer.max_length", 512, 256, '"t5xxl_max_token_length": 256')]
    g["additional_parameters"] = "--t5xxl_max_token_length 256"
    assert check_file(write(tmp_path, "g2.json", json.dumps(g))).exit_code == 0


def test_gui_sd3_t5_length_fix_goes_to_additional_parameters(tmp_path):
    g = {"LoRA_type": "Standard", "sd3_checkbox": True, "pretrained_model_name_or_path": "/m/sd3.5_large.safetensors",
         "additional_parameters": "--t5xxl_max_token_length 154", "bogus_field": 1}
    r = check_file(write(tmp_path, "g.json", json.dumps(g)))
    assert deviations(r)["t5.tokenizer.max_length"] == (
        154, 256, "warning", 'add --t5xxl_max_token_length 256 to "additional_parameters" (the GUI has no field for it)')
    unknown = [f for f in r.findings if f.kind == "unknown-key"]
    assert [(f.setting, f.severity) for f in unknown] == [("bogus_field", "warning")]


def test_gui_broken_json(tmp_path):
    r = check_file(write(tmp_path, "g.json", '{\n  "LoRA_type": "Flux1",\n  "sdxl": tru\n}\n'))
    assert (r.exit_code, r.findings[0].line, r.findings[0].column) == (2, 3, 11)


# ------------------------------------------------------------------------------------ ai-toolkit
AT = """job: extension
config:
  name: x
  process:
    - type: sd_trainer
      model:
        name_or_path: {path}
        {flag}: true
{extra}
      train:
        lr: 1e-4
"""


def test_ai_toolkit_schnell_512_not_settable(tmp_path):
    r = check_file(write(tmp_path, "a.yaml", AT.format(path="black-forest-labs/FLUX.1-schnell", flag="is_flux", extra="")))
    assert (r.trainer, r.profile) == ("ai-toolkit", "flux-schnell")
    assert rows(r) == [("deviation", "warning", "t5.tokenizer.max_length", 512, 256, NOT_SETTABLE)]


def test_ai_toolkit_dev_aligned_and_attn_masking(tmp_path):
    r = check_file(write(tmp_path, "a.yaml", AT.format(path="black-forest-labs/FLUX.1-dev", flag="is_flux", extra="")))
    assert r.exit_code == 0 and r.findings == []
    r = check_file(write(tmp_path, "b.yaml", AT.format(path="black-forest-labs/FLUX.1-dev", flag="is_flux",
                                                      extra="        attn_masking: true")))
    assert rows(r) == [("deviation", "warning", "t5.masks.zero_padded", True, False, "remove model.attn_masking (or set it to false)")]


def test_ai_toolkit_misspelled_and_myth_keys(tmp_path):
    text = AT.format(path="stabilityai/stable-diffusion-3.5-large", flag="is_v3",
                     extra="        t5_max_length: 154\n        quantise: true")
    r = check_file(write(tmp_path, "a.yaml", text))
    assert r.profile == "sd35-large"
    assert [(f.kind, f.setting, f.fix, f.line) for f in r.findings] == [
        ("unknown-key", "model.t5_max_length",
         "ai-toolkit has no T5 length setting (the CivitAI SD3.5 advice does nothing): not settable: use `te-align patch`", 9),
        ("unknown-key", "model.quantise", "did you mean 'quantize'?", 10),
    ]


def test_ai_toolkit_broken_yaml(tmp_path):
    # the CivitAI advice written into YAML as "t5_max_length = 154" under a mapping
    text = "job: extension\nconfig:\n  process:\n    - model:\n        is_v3: true\n      t5_max_length = 154\n      x: 1\n"
    r = check_file(write(tmp_path, "a.yaml", text))
    assert r.exit_code == 2
    f = r.findings[0]
    assert (f.kind, f.line, f.column) == ("syntax", 7, 7)


# ------------------------------------------------------------------------------------ SimpleTuner
def test_simpletuner_sd3_capped_at_154_and_fix(tmp_path):
    cfg = {"model_family": "sd3", "model_flavour": "large", "tokenizer_max_length": 256, "model_type": "lora"}
    r = check_file(write(tmp_path, "config.json", json.dumps(cfg)))
    # measured null (world-sd3-t5-154): a warning, and --fix leaves it (i_know_what_i_am_doing needs --allow-unsafe-keys)
    assert deviations(r) == {"t5.tokenizer.max_length": (154, 256, "warning", '"tokenizer_max_length": 256, "i_know_what_i_am_doing": true')}
    cfg["i_know_what_i_am_doing"] = True
    assert check_file(write(tmp_path, "ok.json", json.dumps(cfg))).exit_code == 0


def test_simpletuner_unknown_key_is_an_error_and_toml_works(tmp_path):
    text = 'model_family = "flux"\nmodel_flavour = "schnell"\n"--flux_fast_schedule" = true\ntokenizer_max_lenght = 512\n'
    r = check_file(write(tmp_path, "config.toml", text))
    assert (r.trainer, r.profile) == ("simpletuner", "flux-schnell")
    assert rows(r) == [("unknown-key", "error", "tokenizer_max_lenght", None, None, "did you mean 'tokenizer_max_length'?")]


def test_simpletuner_flux_ignores_tokenizer_max_length(tmp_path):
    r = check_file(write(tmp_path, "config.json", json.dumps({"model_family": "flux", "tokenizer_max_length": 256})))
    assert r.profile == "flux-dev" and r.effective["t5.tokenizer.max_length"] == 512
    assert [(f.kind, f.setting) for f in r.findings] == [("unused-value", "tokenizer_max_length")]


# ------------------------------------------------------------------------------------ OneTrainer
def test_onetrainer_flux_77_and_aligned(tmp_path):
    cfg = {"__version": 10, "model_type": "FLUX_DEV_1", "training_method": "LORA",
           "base_model_name": "black-forest-labs/FLUX.1-dev"}
    r = check_file(write(tmp_path, "ot.json", json.dumps(cfg)))
    assert rows(r) == [("deviation", "error", "t5.tokenizer.max_length", 77, 512, '"text_encoder_2_sequence_length": 512')]
    cfg["text_encoder_2_sequence_length"] = 512
    cfg["transformer"] = {"attention_mask": False, "trian": True}
    r = check_file(write(tmp_path, "ot2.json", json.dumps(cfg)))
    assert rows(r) == [("unknown-key", "warning", "transformer.trian", None, None, "did you mean 'train'?")]


def test_onetrainer_sd3_hard_77(tmp_path):
    r = check_file(write(tmp_path, "ot.json", json.dumps({"model_type": "STABLE_DIFFUSION_35", "training_method": "LORA"})))
    assert r.profile == "sd35-large"
    # 77 is what SAI's reference code pads T5 to (min_length=77), so a documented alternative: warning
    assert deviations(r) == {"t5.tokenizer.max_length": (77, 256, "warning", OT_NOT_SETTABLE)}


# ------------------------------------------------------------------------------------ input errors
def test_unknown_trainer_shape_and_missing_file(tmp_path):
    r = check_file(write(tmp_path, "x.json", '{"learning_rate": 1e-4}'))  # a trainer's key, but whose?
    assert r.exit_code == 2 and "cannot tell which trainer" in r.findings[0].message
    r = check_file(str(tmp_path / "missing.toml"))
    assert r.exit_code == 2 and "no such file" in r.findings[0].message


#: Files that are no trainer's config (no key a trainer reads): exit 3 in one line; the same bytes broken: exit 2.
NOT_A_CONFIG = {
    "pyproject.toml": ('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
                       '[project]\nname = "demo"\nversion = "1.0"\ndependencies = ["numpy"]\n\n'
                       '[project.optional-dependencies]\ntrain = ["torch"]\n\n[tool.ruff]\nline-length = 110\n',
                       "[project\n"),
    "ci.yml": ("name: tests\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n"
               "      - uses: actions/checkout@v4\n      - run: pytest\n", "name: [tests\n"),
    ".pre-commit-hooks.yaml": ("- id: black\n  name: black\n  entry: black\n  language: python\n", "- id: [black\n"),
    "package.json": ('{"name": "demo", "version": "1.0.0", "scripts": {"test": "jest"}, "devDependencies": {}}',
                     '{"name": '),
}
NOT_A_CONFIG_REASON = ("not a trainer config: no key in it is one a trainer te-align checks reads "
                       "(kohya, kohya-gui, ai-toolkit, simpletuner, onetrainer, diffusion-pipe); nothing to check")


@pytest.mark.parametrize("name", sorted(NOT_A_CONFIG))
def test_a_file_that_is_no_trainer_config_is_exit_3_in_one_line(name, tmp_path, capsys):
    good, broken = NOT_A_CONFIG[name]
    path = write(tmp_path, name, good)
    r = check_file(path)
    assert (r.trainer, r.exit_code, r.status, r.reason) == (None, 3, "not-training", NOT_A_CONFIG_REASON)
    assert main(["check", path]) == 3
    assert capsys.readouterr() == (f"{path}: {NOT_A_CONFIG_REASON}\n", "")
    assert main(["check", path, "--diff"]) == 3  # no diff: why, on stderr (stdout stays a patch)
    assert capsys.readouterr() == ("", f"{path}: {NOT_A_CONFIG_REASON}\n")
    write(tmp_path, name, broken)
    assert main(["check", path]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.startswith(f"te-align: error: {path}:") and "syntax error" in cap.err


@pytest.mark.parametrize("suffix", [".example", ".sample", ".dist"])
def test_an_example_config_with_an_extra_suffix_is_read_by_its_inner_extension(suffix, tmp_path):
    original = check_file(str(EX / "simpletuner" / "sd3_config.json"))
    copy = write(tmp_path, "config.json" + suffix, (EX / "simpletuner" / "sd3_config.json").read_text(encoding="utf-8"))
    for trainer in ("auto", "simpletuner"):
        r = check_file(copy, trainer=trainer)
        assert (r.trainer, r.exit_code, r.profile) == ("simpletuner", original.exit_code, original.profile) == (
            "simpletuner", 1, "sd35-large")
        assert rows(r) == rows(original)
    toml = write(tmp_path, "flux.toml" + suffix, FLUX_DEV)
    assert check_file(toml).exit_code == 0 and check_file(toml).trainer == "kohya"
    r = check_file(write(tmp_path, "notes.md" + suffix, "hello"))  # a config's (or command line's) extension inside
    assert r.exit_code == 2 and "unknown config format" in r.findings[0].message


#: The shape of kohya_ss's own GUI settings file (bmaltais/kohya_ss `config example.toml`, copied to config.toml):
#: GUI defaults by tab, no model and no training job.
GUI_SETTINGS = """# Copy this file and name it config.toml
[settings]
use_shell = false

[server]
allowed_paths = []

[model]
models_dir = "./models"
output_name = "new model"
train_data_dir = "./data"
save_precision = "bf16"

[folders]
output_dir = "./outputs"
logging_dir = "./logs"

[configuration]
config_dir = "./presets"

[accelerate_launch]
mixed_precision = "fp16"
num_processes = 1

[basic]
learning_rate = 0.0001
optimizer = "AdamW8bit"

[advanced]
caption_dropout_rate = 0
clip_skip = 1

[sdxl]
sdxl_cache_text_encoder_outputs = false
"""
GUI_SETTINGS_REASON = ("not a training config: this is kohya_ss's GUI settings file (config.toml: the defaults "
                       "of the GUI's fields and folders); check the training config it saves instead (the .json "
                       "of the GUI's Save, or the config_lora-*.toml it writes to the output folder)")


def test_kohya_ss_gui_settings_file_is_not_a_training_config(tmp_path, capsys):
    path = write(tmp_path, "config example.toml", GUI_SETTINGS)
    for kw in ({}, {"profile": "sdxl"}):
        r = check_file(path, **kw)
        assert (r.trainer, r.exit_code, r.status, r.reason) == ("kohya", 3, "not-training", GUI_SETTINGS_REASON)
        assert [(f.kind, f.severity) for f in r.findings] == [("not-checked", "info")]
    for extra in ((), ("--profile", "sdxl")):
        assert main(["check", path, *extra]) == 3
        assert capsys.readouterr() == (f"{path}: kohya · {GUI_SETTINGS_REASON}\n", "")


def test_family_unknown_needs_profile(tmp_path):
    path = write(tmp_path, "x.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\nlearning_rate = 1e-4\n')
    assert "pass --profile" in check_file(path).findings[0].message
    assert check_file(path, profile="sd15").exit_code == 0


# ------------------------------------------------------------------------------------ cache folder
def _npy(shape: tuple[int, ...], descr: str = "<f2", data: bytes = b"") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    pad = 64 - (10 + len(header) + 1) % 64
    header += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def test_stale_sd_scripts_cache_files(tmp_path):
    cache = tmp_path / "img"
    cache.mkdir()
    for i, length in enumerate((512, 512, 256)):
        with zipfile.ZipFile(cache / f"{i}_flux_te.npz", "w") as z:
            z.writestr("t5_out.npy", _npy((length, 4096)))
            z.writestr("apply_t5_attn_mask.npy", _npy((), "|b1", b"\x00"))
    path = write(tmp_path, "c.toml", FLUX_DEV.replace("flux1-dev", "flux1-schnell") + "cache_text_encoder_outputs_to_disk = true\n")
    r = check_file(path, cache_dir=str(cache))
    stale = [f for f in r.findings if f.kind == "stale-cache"]
    assert [(f.severity, f.setting, f.effective) for f in stale] == [("error", "t5.tokenizer.max_length", 256)]
    assert "2 of 3 cached files" in stale[0].message and "2 with 512" in stale[0].message


def test_ai_toolkit_cache_files_are_read_from_their_headers(tmp_path):
    np = pytest.importorskip("numpy", reason="writes the cache files with numpy (the train extra)")
    save_file = pytest.importorskip("safetensors.numpy", reason="writes the cache files with safetensors").save_file

    import te_align
    from te_align.trainers.ai_toolkit.audit import scan_cache

    cache = tmp_path / "_t_e_cache"
    cache.mkdir()
    for i, length in enumerate((512, 256)):
        save_file({"text_embed": np.zeros((1, length, 8), dtype=np.float16)}, str(cache / f"{i}.safetensors"))
    good = (cache / "0.safetensors").read_bytes()
    (cache / "truncated.safetensors").write_bytes(good[:-4])
    (cache / "garbage.safetensors").write_bytes(b"not a safetensors file")
    found, lengths, bad, path = scan_cache(str(cache), te_align.profile("flux-dev"))[:4]
    assert (found, dict(lengths), bad, path) == (4, {512: 1, 256: 1}, 2, "t5.tokenizer.max_length")


# ------------------------------------------------------------------------------------ CLI
def test_cli_exit_codes_and_json(capsys, tmp_path):
    good = write(tmp_path, "good.toml", FLUX_DEV)
    assert main(["check", good]) == 0
    assert "aligned" in capsys.readouterr().out
    bad = write(tmp_path, "bad.toml", FLUX_DEV + "apply_t5_attn_mask = true\n")
    assert main(["check", good, bad, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 1 and [r["exit_code"] for r in data["results"]] == [0, 1]
    f = data["results"][1]["findings"][0]
    assert {k: f[k] for k in ("kind", "severity", "setting", "effective", "profile")} == {
        "kind": "deviation", "severity": "warning", "setting": "t5.masks.encoder", "effective": True, "profile": False}
    broken = write(tmp_path, "broken.json", "{")
    assert main(["check", good, broken]) == 2
    cap = capsys.readouterr()
    # unreadable input goes to stderr with the prefix every command uses; the good file's report stays on stdout
    assert f"te-align: error: {broken}:1:2: syntax error" in cap.err and "syntax error" not in cap.out
    assert "aligned" in cap.out


def test_json_carries_the_exit_code_the_process_exits_with(capsys, tmp_path):
    """README's exit-code table, one row each, and with --fix/--diff: ``exit_code`` at the top level is the
    process's, and each file's is the code that file alone gives (2 for a --fix that refused it)."""
    assumed = write(tmp_path, "flux.toml", 'network_module = "networks.lora_flux"\nt5xxl_max_token_length = 256\n')
    runs = [
        ([write(tmp_path, "good.toml", FLUX_DEV)], 0),
        ([write(tmp_path, "bad.toml", FLUX_DEV + "apply_t5_attn_mask = true\n")], 1),
        ([write(tmp_path, "broken.json", "{")], 2),
        ([write(tmp_path, "pyproject.toml", '[project]\nname = "demo"\nversion = "1.0"\n')], 3),
        ([assumed, "--trainer", "kohya", "--fix"], 2),  # refused: the model is only assumed
        ([assumed, "--trainer", "kohya", "--diff"], 2),
        ([str(tmp_path / "bad.toml"), "--diff"], 1),
    ]
    for args, code in runs:
        assert main(["check", *args, "--json"]) == code, args
        data = json.loads(capsys.readouterr().out)
        assert (data["exit_code"], [r["exit_code"] for r in data["results"]]) == (code, [code]), args
    assert main(["check", str(tmp_path / "good.toml"), str(tmp_path / "pyproject.toml"), assumed, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["exit_code"], [r["exit_code"] for r in data["results"]]) == (1, [0, 3, 1])  # 2 > 1 > 3 > 0


def test_cli_trainer_profile_and_extra_args(capsys, tmp_path):
    path = write(tmp_path, "c.toml", 'pretrained_model_name_or_path = "/m/x.safetensors"\n')
    assert main(["check", path, "--profile", "flux-schnell", "--trainer", "kohya", "--", "--t5xxl_max_token_length", "512"]) == 1
    out = capsys.readouterr().out
    assert "t5.tokenizer.max_length" in out and "fix: --t5xxl_max_token_length 256" in out
    # readable, but nothing names the model: not checked (exit 3), saying what would decide it; not a read error
    assert main(["check", "--trainer", "simpletuner", path]) == 3
    cap = capsys.readouterr()
    assert cap.err == "" and f"{path}: simpletuner · cannot work out the model family" in cap.out
    assert cap.out.rstrip().endswith("pass --profile NAME")


def test_check_needs_no_torch():
    code = (
        "import sys, contextlib, io\n"
        "from te_align.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['check', {str(EX / 'kohya' / 'flux_schnell_lora.toml')!r}, {str(EX / 'ai-toolkit' / 'flux_schnell_lora.yaml')!r},\n"
        f"          {str(EX / 'simpletuner' / 'sd3_config.json')!r}, {str(EX / 'onetrainer' / 'flux_lora.json')!r}, '--json'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


# ------------------------------------------------------------------------------------ examples
EXAMPLES = {
    "kohya/flux_dev_aligned.toml": (0, []),
    # T5 at 512 measured null; the T5 mask flags not measured and cutting no token: warnings
    "kohya/flux_schnell_lora.toml": (1, [("deviation", "warning", "t5.tokenizer.max_length"),
                                         ("deviation", "warning", "t5.masks.encoder"), ("deviation", "warning", "t5.masks.denoiser"),
                                         ("stale-cache", "warning", "text-encoder cache")]),
    "kohya/sd35_masks_live.toml": (1, [("deviation", "info", "clip_g.tokenizer.pad_token"),
                                       ("deviation", "info", "clip_l.train_dropout"), ("deviation", "info", "clip_g.train_dropout"),
                                       ("deviation", "info", "t5.train_dropout"),
                                       ("unused-value", "warning", "apply_lg_attn_mask"),
                                       ("unused-value", "warning", "apply_t5_attn_mask")]),
    "kohya/lumina2_lora.toml": (1, [("deviation", "warning", "gemma.tokenizer.system_prompt")]),  # not measured, no token lost
    "kohya/sdxl_typo.toml": (1, [("deviation", "info", "clip_g.tokenizer.pad_token"), ("unused-value", "warning", "clip_skip"),
                                 ("unknown-key", "warning", "cache_text_encoder_output")]),
    # the severity policy: --max_token_length 225 on SDXL measured null (world-sdxl-max-token-225): warnings
    "kohya-gui/sdxl_lora.json": (1, [("deviation", "warning", "clip_l.tokenizer.max_length"),
                                     ("deviation", "warning", "clip_g.tokenizer.max_length"),
                                     ("deviation", "info", "clip_g.tokenizer.pad_token"),
                                     ("stale-cache", "warning", "text-encoder cache")]),
    "kohya-gui/flux_schnell_lora.json": (1, [("deviation", "warning", "t5.tokenizer.max_length"),
                                             ("stale-cache", "warning", "text-encoder cache")]),
    "ai-toolkit/flux_schnell_lora.yaml": (1, [("deviation", "warning", "t5.tokenizer.max_length"),
                                              ("unknown-key", "warning", "model.t5_max_length")]),
    "ai-toolkit/sd35_large_lora.yaml": (1, [("unknown-key", "warning", "model.t5_max_length")]),
    "simpletuner/sd3_config.json": (1, [("deviation", "warning", "t5.tokenizer.max_length"),  # measured null
                                        ("stale-cache", "warning", "text-encoder cache")]),
    "simpletuner/flux_schnell_config.toml": (0, []),
    "onetrainer/flux_lora.json": (1, [("deviation", "error", "t5.tokenizer.max_length")]),
    "musubi/qwen_image_lora.sh": (0, [("deviation", "info", "qwen.tokenizer.max_length"),
                                      ("note", "info", "text-encoder cache")]),
    # a dataset config names no model: check the command line that names it (the same exit 3 for every trainer)
    "musubi/qwen_image_dataset.toml": (3, [("not-checked", "info", "")]),
    "diffusion-pipe/flux_schnell.toml": (1, [("deviation", "warning", "t5.tokenizer.max_length"),
                                             ("stale-cache", "warning", "text-encoder cache")]),
    "diffusion-pipe/dataset.toml": (3, [("not-checked", "info", "")]),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_give_their_documented_findings(name):
    code, expected = EXAMPLES[name]
    r = check_file(str(EX / name))
    assert [(f.kind, f.severity, f.setting) for f in r.findings] == expected
    assert r.exit_code == code


def test_every_example_config_is_covered():
    found = {str(p.relative_to(EX)) for d in ("kohya", "kohya-gui", "ai-toolkit", "simpletuner", "onetrainer", "musubi",
                                              "diffusion-pipe")
             for p in (EX / d).iterdir()}
    assert found == set(EXAMPLES)


def test_one_kohya_table_for_check_hooks_and_patch():
    """te_align.trainers.kohya is read by `te-align check`, the kohya hooks and the patch planner alike."""
    from te_align.trainers.kohya import names as table
    from te_align.trainers.kohya.audit import guess_profile
    from te_align.trainers.kohya.hooks import ARCHS, default_profile_name
    from te_align.trainers.kohya.patch import SCRIPTS as DROP_INS

    assert {a.name for a in ARCHS} == set(table.ARCH_PROFILES)
    for script, (arch, drop_in) in table.SCRIPTS.items():
        assert guess_profile({}, script)[0] == table.ARCH_PROFILES[arch] == default_profile_name(arch)
        assert ((script, arch) in DROP_INS) is drop_in
    assert guess_profile({"model_type": "chroma"}, "flux_train_network.py")[0] == "chroma"
    assert guess_profile({"v2": True}, "train_db.py")[0] == "sd21"


def test_one_ai_toolkit_table_for_check_and_hooks():
    from te_align.trainers.ai_toolkit import names as table
    from te_align.trainers.ai_toolkit.audit import NO_PROFILE, guess_profile
    from te_align.trainers.ai_toolkit.hooks import profile_name_for

    for arch, (profile, hooked) in table.ARCHS.items():
        # Flex.2 (not hooked, not verified) is "not checked", never silently FLUX.1-dev
        assert guess_profile({"arch": arch})[0] == (None if arch in NO_PROFILE else profile)
        assert not (hooked and arch in NO_PROFILE)
        if hooked:
            assert profile_name_for({"arch": arch}) == profile
    assert guess_profile({"arch": "wan22_5b:ti2v"})[0] == "wan21"  # was unknown to `te-align check`


def test_exit_0_with_notes_prints_the_notes_not_every_one_matches(tmp_path, capsys):
    """An info-only result exits 0, but the text output must show its notes instead of claiming a full match."""
    from te_align.cli import main

    qwen = write(tmp_path, "config.json", json.dumps({"model_family": "qwen_image", "caption_dropout_probability": 0.0}))
    assert main(["check", qwen]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  aligned: 2 rule(s) for simpletuner/qwen-image ran; no error or warning, but these notes:"
    assert [line.split()[:2] for line in out if line.startswith("  info")] == [
        ["info", "qwen.tokenizer.max_length"], ["info", "qwen.tokenizer.padding"]]
    assert out[-1] == "  0 error(s), 0 warning(s), 2 note(s)"
    flux = write(tmp_path, "flux.toml", 'pretrained_model_name_or_path = "/m/flux1-dev.safetensors"\nt5xxl_max_token_length = 512\n')
    assert main(["check", flux]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("ran and every one matches the profile")


DATASET_ALONE = {
    "kohya": ("dataset.toml", '[general]\nshuffle_caption = true\ncaption_extension = ".txt"\n\n[[datasets]]\nresolution = 1024\n'
              'batch_size = 2\n\n  [[datasets.subsets]]\n  image_dir = "/data/img"\n  num_repeats = 10\n',
              "not checked: an sd-scripts dataset config names no model; check the training config or command line "
              "that uses it (--dataset_config) — the model is set there"),
    "musubi": ("dataset.toml", '[general]\nresolution = [960, 544]\ncaption_extension = ".txt"\nbatch_size = 1\n\n[[datasets]]\n'
               'image_directory = "/data/img"\ncache_directory = "/data/cache"\nnum_repeats = 1\n',
               "not checked: a musubi-tuner dataset config names no model; check the caching command line that uses "
               "it (`te-align check DATASET.toml -- qwen_image_cache_text_encoder_outputs.py …`, or the command's own "
               "file)"),
    "diffusion-pipe": ("dataset.toml", "resolutions = [512]\nenable_ar_bucket = true\n\n[[directory]]\npath = '/data/img'\n"
                       "num_repeats = 1\n",
                       "not checked: a diffusion-pipe dataset config names no model; check the training config that "
                       "names it (dataset = '…') — the model is set there"),
    # SimpleTuner's --data_backend_config and OneTrainer's concepts file: JSON lists
    "simpletuner": ("multidatabackend.json", json.dumps([
        {"id": "photos", "type": "local", "instance_data_dir": "/data/img", "caption_strategy": "textfile"},
        {"id": "text-embeds", "type": "local", "dataset_type": "text_embeds", "default": True, "cache_dir": "/c"}]),
        "not checked: a SimpleTuner data backend config names no model; check the config.json that uses it "
        "(data_backend_config) — the model is set there"),
    "onetrainer": ("concepts.json", json.dumps([{"name": "c", "path": "/data/img", "enabled": True, "image": {},
                                                 "text": {"prompt_source": "sample"}, "balancing": 1.0}]),
                   "not checked: a OneTrainer concepts file names no model; check the training config that uses it "
                   "(concept_file_name) — the model is set there"),
}


@pytest.mark.parametrize("trainer", sorted(DATASET_ALONE))
def test_a_dataset_config_alone_is_not_checked_by_every_trainer(trainer, tmp_path, capsys):
    """A dataset config names no model: exit 3 ("not checked") with what to check instead, the same for every trainer
    that keeps its datasets in a file of their own, with or without --profile."""
    name, text, reason = DATASET_ALONE[trainer]
    path = write(tmp_path, name, text)
    for kw in ({}, {"profile": "qwen-image"}):
        r = check_file(path, **kw)
        assert (r.trainer, r.exit_code, r.status, r.reason) == (trainer, 3, "not-checked", reason)
        assert [(f.kind, f.severity) for f in r.findings] == [("not-checked", "info")]
    assert main(["check", path]) == 3
    assert capsys.readouterr().out.splitlines()[0] == f"{path}: {trainer} · {reason}"


#: Lumina-Image 2.0's other system-prompt templates, as the authors' reference code writes them
#: (Alpha-VLLM/Lumina-Image-2.0@4a4d6f8 sample.py:246-255).
LUMINA_OFFICIAL = {
    "base": "You are an assistant designed to generate high-quality images based on user prompts.",
    "align": ("You are an assistant designed to generate high-quality images with the highest degree of image-text "
              "alignment based on textual prompts."),
    "aesthetics": ("You are an assistant designed to generate high-quality images with highest degree of aesthetics "
                   "based on user prompts."),
    "4grid": ("You are an assistant designed to generate four high-quality images with highest degree of aesthetics "
              "arranged in 2x2 grids based on user prompts."),
}


def test_lumina2_profile_holds_the_official_templates():
    import te_align

    pv = te_align.profile("lumina2").provenance_of("slots.gemma.tokenizer.system_prompt")
    assert [(a.value, a.status) for a in pv.alternatives] == [
        (LUMINA_OFFICIAL[k], "official") for k in ("base", "align", "aesthetics", "4grid")]
    assert all(a.source.startswith("Alpha-VLLM/Lumina-Image-2.0@4a4d6f856115db07e8ae127280ebcc3d9f65004e sample.py:")
               for a in pv.alternatives)  # fmt: skip


@pytest.mark.parametrize("kind", sorted(LUMINA_OFFICIAL))
def test_an_official_alternative_is_a_note_naming_it(kind, tmp_path):
    """sd-scripts --system_prompt with one of the authors' other templates: a note naming the template, not an error."""
    r = check_file(write(tmp_path, "l.toml", 'pretrained_model_name_or_path = "/m/lumina.safetensors"\n'
                                             f"system_prompt = {json.dumps(LUMINA_OFFICIAL[kind])}\n"))  # fmt: skip
    assert (r.profile, r.exit_code) == ("lumina2", 0)
    (dev,) = [f for f in r.findings if f.kind == "deviation"]
    assert (dev.setting, dev.severity, dev.effective, dev.profile) == (
        "gemma.tokenizer.system_prompt", "info", LUMINA_OFFICIAL[kind], LUMINA_SP)
    assert "This is an official alternative of lumina2: the Lumina-Image 2.0 " in dev.message
    assert f"('{kind}')" in dev.message and "Alpha-VLLM/Lumina-Image-2.0@4a4d6f8" in dev.message
    # a system prompt nobody published stays a deviation (exit 1): a warning by the severity policy (not measured,
    # no token of the caption lost)
    r = check_file(write(tmp_path, "x.toml", 'pretrained_model_name_or_path = "/m/lumina.safetensors"\n'
                                             'system_prompt = "You are an assistant."\n'))  # fmt: skip
    assert r.exit_code == 1 and deviations(r)["gemma.tokenizer.system_prompt"][2] == "warning"


def test_findings_table_never_shows_two_values_as_the_same_text(tmp_path, capsys):
    path = write(tmp_path, "l.toml", 'pretrained_model_name_or_path = "/m/lumina.safetensors"\n'
                                     f'system_prompt = {json.dumps(LUMINA_OFFICIAL["base"])}\n')  # fmt: skip
    assert main(["check", path]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "gemma.tokenizer.system_prompt" in line)
    assert row.split() == ["info", "gemma.tokenizer.system_prompt", "…high-quality…", "…superior", "images", "with",
                           "the", "superior…", "(line", "2)"]


def test_kohya_toml_naming_no_script_and_no_known_model_is_not_checked_with_what_decides(capsys, tmp_path):
    """A readable sd-scripts TOML that names neither its script nor a model te-align knows: exit 3 naming what is
    missing and how to give it, its keys still read; with the script after -- it is checked."""
    path = write(tmp_path, "run.toml", 'pretrained_model_name_or_path = "/models/mymodel.safetensors"\n'
                 'network_module = "networks.lora"\nclip_skip = 2\n')
    assert main(["check", path]) == 3
    cap = capsys.readouterr()
    assert cap.err == "" and cap.out.splitlines()[0] == (
        f"{path}: kohya · cannot work out the model family from pretrained_model_name_or_path "
        "'/models/mymodel.safetensors' (a model te-align does not know by name) and no training script: name the "
        "script after --, as sd-scripts runs it (te-align check CONFIG -- sdxl_train_network.py); pass --profile NAME")
    assert main(["check", path, "--", "train_network.py"]) == 1
    assert "profile sd15 (script train_network.py; sd15 assumed)" in capsys.readouterr().out
