"""``te-align check`` on the diffusers example scripts' command lines (``accelerate launch train_*.py ARGS``).

Exact findings per script; the command-line reader on good and bad input (one clear line, exit codes 0/1/2/3 as
``te-align check`` defines them); the bundled option table against a real diffusers checkout when
``TE_ALIGN_DIFFUSERS_EXAMPLES_DIR`` is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from te_align.checking import check_file
from te_align.cli import main
from te_align.trainers.diffusers_examples import audit as dx

ENV = "TE_ALIGN_DIFFUSERS_EXAMPLES_DIR"

README_SD3 = """\
export MODEL_NAME="stabilityai/stable-diffusion-3-medium-diffusers"
export INSTANCE_DIR="dog"
export OUTPUT_DIR="trained-sd3-lora"

accelerate launch train_dreambooth_lora_sd3.py \\
  --pretrained_model_name_or_path=$MODEL_NAME  \\
  --instance_data_dir=$INSTANCE_DIR \\
  --output_dir=$OUTPUT_DIR \\
  --mixed_precision="fp16" \\
  --instance_prompt="a photo of sks dog" \\
  --resolution=512 \\
  --train_batch_size=1 \\
  --learning_rate=4e-4 \\
  --max_train_steps=500 \\
  --seed="0"
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def findings(result):
    """The findings, less the note that says which profile was assumed (tests of that note assert ``assumed``)."""
    return [(f.kind, f.severity, f.setting, f.effective, f.profile, f.fix) for f in result.findings
            if not (f.kind == "note" and f.setting == "profile" and f.message == result.assumed)]


def test_a_default_profile_is_said_to_be_assumed_where_the_family_has_several():
    r = cmd("train_dreambooth_lora_flux.py")  # no model named: the script's default
    assert r.profile == "flux-dev" and r.assumed.startswith("flux-dev assumed: --pretrained_model_name_or_path None")
    assert [f.message for f in r.findings if f.setting == "profile"] == [r.assumed]
    # SDXL's other profile is a community base (Pony): the assumption names it and the --profile to pass
    assert cmd("train_dreambooth_lora_sdxl.py").assumed == (
        "assumed sdxl (the architecture's own recipe): nothing in --pretrained_model_name_or_path None (its name or "
        "files) names another base; if your base is Pony Diffusion V6 XL or a descendant (SDXL; its authors' clip skip "
        "2), pass --profile sdxl-pony")
    assert cmd("train_dreambooth_lora_sdxl.py", "--pretrained_model_name_or_path",
               "stabilityai/stable-diffusion-xl-base-1.0").assumed == ""
    assert cmd("train_dreambooth_lora_flux.py", "--pretrained_model_name_or_path", "black-forest-labs/FLUX.1-dev"
               ).assumed == ""


def cmd(script: str, *args: str, **kw):
    return check_file("<command line>", command=["accelerate", "launch", script, *args], **kw)


# ------------------------------------------------------------------------------------ findings per script
def test_sd3_readme_command_defaults_t5_to_77(tmp_path):
    r = check_file(write(tmp_path, "train.sh", README_SD3))
    assert (r.trainer, r.profile, r.exit_code) == ("diffusers-examples", "sd3-medium", 1)
    assert "--pretrained_model_name_or_path 'stabilityai/stable-diffusion-3-medium-diffusers'" in r.family_reason
    assert findings(r) == [("deviation", "warning", "t5.tokenizer.max_length", 77, 256, "--max_sequence_length 256")]
    (f,) = r.findings
    assert f.trainer_source.startswith("examples/dreambooth/train_dreambooth_lora_sd3.py:338-343")
    assert f.line is None  # not written: the default
    assert r.effective["t5.tokenizer.max_length"] == 77
    assert len(r.rules_ran) == 6


def test_sd3_with_the_fix_is_aligned():
    r = cmd("train_dreambooth_lora_sd3.py", "--pretrained_model_name_or_path", "stabilityai/stable-diffusion-3.5-large",
            "--max_sequence_length", "256")
    assert (r.profile, r.exit_code, findings(r)) == ("sd35-large", 0, [])


def test_sd3_text_encoder_training_with_captions_is_77_whatever_the_flag():
    base = ["--max_sequence_length=256", "--train_text_encoder"]
    r = cmd("train_dreambooth_lora_sd3.py", *base)  # one --instance_prompt: T5 re-tokenized at the flag's length
    assert (r.exit_code, findings(r)) == (0, [])
    r = cmd("train_dreambooth_lora_sd3.py", *base, "--dataset_name", "me/ds", "--caption_column", "text")
    assert findings(r) == [("deviation", "warning", "t5.tokenizer.max_length", 77, 256, dx.NOT_SETTABLE)]
    r = cmd("train_dreambooth_sd3.py", *base)  # the full fine-tune always tokenizes T5 with tokenize_prompt (77)
    assert findings(r) == [("deviation", "warning", "t5.tokenizer.max_length", 77, 256, dx.NOT_SETTABLE)]


def test_flux_scripts():
    assert findings(cmd("train_dreambooth_lora_flux.py")) == []
    r = cmd("train_dreambooth_flux.py", "--pretrained_model_name_or_path", "black-forest-labs/FLUX.1-dev")
    assert (r.profile, findings(r)) == ("flux-dev", [
        ("deviation", "error", "t5.tokenizer.max_length", 77, 512, "--max_sequence_length 512")])
    # full fine-tune with --train_text_encoder and one instance prompt: T5 ids at a hard-coded 512
    r = cmd("train_dreambooth_flux.py", "--max_sequence_length", "512", "--train_text_encoder")
    assert (r.exit_code, findings(r)) == (0, [])
    r = cmd("train_dreambooth_flux.py", "--max_sequence_length", "256", "--train_text_encoder",
            "--pretrained_model_name_or_path", "black-forest-labs/FLUX.1-schnell")
    assert (r.profile, r.effective["t5.tokenizer.max_length"]) == ("flux-schnell", 512)
    assert findings(r)[0][-1] == dx.NOT_SETTABLE
    # schnell at the LoRA script's default 512: the diffusers pipeline default, so a warning
    r = cmd("train_dreambooth_lora_flux.py", "--pretrained_model_name_or_path", "black-forest-labs/FLUX.1-schnell")
    assert findings(r) == [("deviation", "warning", "t5.tokenizer.max_length", 512, 256, "--max_sequence_length 256")]


def test_sd15_flags_and_aligned_defaults():
    for script in ("train_dreambooth_lora.py", "train_dreambooth.py", "train_text_to_image_lora.py",
                   "train_text_to_image.py"):
        r = cmd(script, "--pretrained_model_name_or_path", "stable-diffusion-v1-5/stable-diffusion-v1-5")
        assert (r.profile, r.exit_code, findings(r)) == ("sd15", 0, []), script
    r = cmd("train_dreambooth_lora.py", "--tokenizer_max_length", "100", "--text_encoder_use_attention_mask")
    assert findings(r) == [
        ("deviation", "warning", "clip_l.tokenizer.max_length", 100, 77, "remove --tokenizer_max_length"),
        ("deviation", "warning", "clip_l.masks.encoder", True, False, "remove --text_encoder_use_attention_mask"),
    ]
    r = cmd("train_dreambooth.py", "--pretrained_model_name_or_path", "stabilityai/stable-diffusion-2-1",
            "--text_encoder_use_attention_mask")
    assert (r.profile, findings(r)) == ("sd21", [
        ("deviation", "warning", "clip_h.masks.encoder", True, False, "remove --text_encoder_use_attention_mask")])


def test_sdxl_scripts_and_empty_prompt_dropout():
    for script in ("train_dreambooth_lora_sdxl.py", "train_text_to_image_lora_sdxl.py", "train_text_to_image_sdxl.py"):
        r = cmd(script)
        assert (r.profile, r.exit_code, findings(r)) == ("sdxl", 0, []), script
    r = cmd("train_text_to_image_sdxl.py", "--proportion_empty_prompts", "0.1")
    assert findings(r) == [("deviation", "warning", "empty_prompt", "encode", "zeros",
                            "remove --proportion_empty_prompts (the script cannot drop captions as zeros)")]


def test_profile_option_and_family_mismatch():
    r = cmd("train_dreambooth_lora_sd3.py", "--pretrained_model_name_or_path", "/models/mine", profile="sd35-medium")
    assert (r.profile, r.exit_code) == ("sd35-medium", 1)
    r = cmd("train_dreambooth_lora_sd3.py", profile="sdxl")  # a default guess: another family is still refused
    assert r.exit_code == 2
    assert r.findings[0].message == ("<command line>: --profile sdxl is a sdxl profile, but this config trains sd3 "
                                     "(script train_dreambooth_lora_sd3.py (its family's default profile; pass "
                                     "--profile to choose)); pass a sd3 profile or leave --profile out")


# ------------------------------------------------------------------------------------ the reader
def test_reader_variables_continuations_and_launchers(tmp_path):
    text = ('# comment\nset MODEL=black-forest-labs/FLUX.1-schnell\r\n'
            'python -m accelerate.commands.launch --num_processes 2 C:\\x\\train_dreambooth_lora_flux.py ^\r\n'
            '  --pretrained_model_name_or_path %MODEL% ^\r\n  --max_sequence_length 256\r\n')
    r = check_file(write(tmp_path, "run.bat", text))
    assert (r.profile, r.exit_code, findings(r)) == ("flux-schnell", 0, [])
    text = 'MODEL="stabilityai/stable-diffusion-3.5-medium"\ntorchrun --nproc_per_node 2 train_dreambooth_lora_sd3.py ' \
           '--pretrained_model_name_or_path "${MODEL}" --max_seq 256  # abbreviated\n'
    r = check_file(write(tmp_path, "run.txt", text))
    assert (r.profile, r.exit_code, findings(r)) == ("sd35-medium", 0, [
        ("note", "info", "--max_sequence_length", None, None, "write --max_sequence_length in full")])
    assert r.findings[0].line == 2 and r.findings[0].message == (
        "--max_seq is an abbreviation: argparse reads it as --max_sequence_length, the one option it starts")


def test_reader_unknown_option_line_and_exit_1(tmp_path):
    path = write(tmp_path, "run.sh", "accelerate launch train_dreambooth_lora_sd3.py \\\n  --max_sequence_length 256 \\\n"
                                     "  --max_sequnce_length 300\n")
    r = check_file(path)
    assert r.exit_code == 1
    (f,) = [f for f in r.findings if f.kind == "unknown-key"]
    assert (f.severity, f.line, f.fix) == ("error", 3, "did you mean 'max_sequence_length'?")
    assert "unrecognized arguments: --max_sequnce_length" in f.message


@pytest.mark.parametrize(("text", "expected"), [
    ("accelerate launch train_dreambooth_lora_sd3.py --max_sequence_length=abc\n",
     "run.sh:1: wrong type/value for --max_sequence_length: expected a whole number, got 'abc' "
     "(argparse: invalid int value)"),
    ("accelerate launch train_dreambooth_lora_sd3.py --max_sequence_length\n",
     "run.sh:1: wrong type/value for --max_sequence_length: expected one argument"),
    ("echo hello\n", "run.sh: no training command line in this file (expected a line running train_*.py"),
    ('accelerate launch train_dreambooth_lora_sd3.py --instance_prompt "unclosed\n',
     "run.sh:1:1: syntax error: cannot split the command line: No closing quotation"),
    ("accelerate launch train_dreambooth_lora_hidream.py\n",
     "run.sh:1: train_dreambooth_lora_hidream.py is not a script te-align reads: not one of sd-scripts' "
     "(flux_train_network.py, sdxl_train_network.py, train_network.py, …), musubi-tuner's"),
])
def test_reader_bad_input_one_line_exit_2(tmp_path, capsys, text, expected):
    path = write(tmp_path, "run.sh", text)
    assert main(["check", path]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert cap.out == "" and "\n" not in err and "Traceback" not in err
    assert err.startswith("te-align: error: " + path + expected[len("run.sh"):])


def test_reader_not_utf8_and_missing(tmp_path, capsys):
    p = tmp_path / "run.sh"
    p.write_bytes(b"accelerate launch train_dreambooth_lora_sd3.py --instance_prompt \xff\n")
    assert main(["check", str(p)]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "nope.sh")]) == 2
    assert capsys.readouterr().err == f"te-align: error: {tmp_path / 'nope.sh'}: no such file\n"


def test_cli_command_after_double_dash(capsys):
    assert main(["check", "--", "accelerate", "launch", "train_dreambooth_lora_sd3.py"]) == 1
    out = capsys.readouterr().out
    assert "<command line>: diffusers-examples · profile sd3-medium" in out
    assert "fix: --max_sequence_length 256" in out
    assert main(["check", "--json", "--", "accelerate", "launch", "train_dreambooth_lora_sd3.py",
                 "--max_sequence_length", "256"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["results"][0]["trainer"] == "diffusers-examples" and data["exit_code"] == 0
    assert main(["check", "--", "accelerate", "launch", "--num_processes", "2"]) == 2
    assert capsys.readouterr().err.strip() == "te-align: error: <command line>: no training script (train_*.py) in the command line"
    with pytest.raises(SystemExit) as e:
        main(["check"])
    assert e.value.code == 2


def test_other_trainer_given_a_command_line(tmp_path, capsys):
    path = write(tmp_path, "run.sh", "accelerate launch train_dreambooth_lora_sd3.py\n")
    assert main(["check", "--trainer", "kohya", path]) == 2
    assert "run.sh: a command line; te-align reads kohya configs from their config file" in capsys.readouterr().err
    toml = write(tmp_path, "c.toml", 'pretrained_model_name_or_path = "x"\n')
    assert main(["check", "--trainer", "diffusers-examples", toml]) == 2
    assert "expected a command line" in capsys.readouterr().err


def test_check_imports_no_torch(tmp_path):
    import subprocess
    import sys

    path = write(tmp_path, "train.sh", README_SD3)
    code = (f"import sys; from te_align.cli import main; rc = main(['check', {path!r}]); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("1")


# ------------------------------------------------------------------------------------ against a checkout
def _checkout() -> Path:
    root = os.environ.get(ENV)
    if not root:
        pytest.skip(f"{ENV} is not set (path of a huggingface/diffusers checkout with examples/dreambooth)")
    path = Path(root)
    if not (path / "examples" / "dreambooth").is_dir():
        pytest.skip(f"{ENV}={root} has no examples/dreambooth")
    return path


def test_bundled_option_table_matches_the_checkout():
    root = _checkout()
    for name, spec in dx.SCRIPTS.items():
        source = (root / spec.folder / name).read_text(encoding="utf-8")
        assert dx.flags(name) == dx.scan_flags(source), name


def test_cited_defaults_match_the_checkout():
    """Every default te-align reads from a script, at the line it cites."""
    root = _checkout()
    want = {"train_dreambooth_lora_sd3.py": ("max_sequence_length", "77", 338),
            "train_dreambooth_sd3.py": ("max_sequence_length", "77", 314),
            "train_dreambooth_lora_flux.py": ("max_sequence_length", "512", 348),
            "train_dreambooth_flux.py": ("max_sequence_length", "77", 328),
            "train_dreambooth_lora.py": ("tokenizer_max_length", "None", 500),
            "train_dreambooth.py": ("tokenizer_max_length", "None", 547)}
    import ast

    for name, (flag, default, line) in want.items():
        tree = ast.parse((root / dx.SCRIPTS[name].folder / name).read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"
                 and n.args and getattr(n.args[0], "value", None) == f"--{flag}"]
        assert len(calls) == 1, name
        kw = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
        assert (kw["default"], calls[0].lineno) == (default, line), name
        assert f"{dx.SCRIPTS[name].folder}/{name}:{line}" in " ".join(r.source for r in dx.RULES_BY_SCRIPT[name])
