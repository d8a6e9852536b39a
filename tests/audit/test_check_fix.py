"""``te-align check --fix`` / ``--diff``: the fix written in the trainer's own terms, every other byte kept,
as a transaction (re-check before the write, backup, atomic replace), and one line for every input it
refuses."""

from __future__ import annotations

import difflib
import os
import re
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from te_align.checking import check_file, check_files, fix_file
from te_align.cli import main
from te_align.fixing.fix import BACKUP_SUFFIX, why_left

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: Every example config whose findings --fix writes: exactly the lines the fix changes (removed, added).
EXPECTED: dict[str, tuple[list[str], list[str]]] = {
    "kohya/flux_schnell_lora.toml": (["t5xxl_max_token_length = 512", "apply_t5_attn_mask = true"],
                                     ["t5xxl_max_token_length = 256"]),
    "kohya/lumina2_lora.toml": (['system_prompt = ""'],
                                ['system_prompt = "You are an assistant designed to generate superior '
                                 'images with the superior degree of image-text alignment based on textual '
                                 'prompts or user prompts."']),
    "kohya/sd35_masks_live.toml": (["apply_t5_attn_mask = true", "apply_lg_attn_mask = true"], []),
    "kohya/sdxl_typo.toml": (["clip_skip = 2"], []),
    "kohya-gui/flux_schnell_lora.json": (['  "t5xxl_max_token_length": 512,'],
                                         ['  "t5xxl_max_token_length": 256,']),
    "kohya-gui/sdxl_lora.json": (['  "max_token_length": 225,'], ['  "max_token_length": 75,']),
    "onetrainer/flux_lora.json": (['    "concept_file_name": "training_concepts/concepts.json"'],
                                  ['    "concept_file_name": "training_concepts/concepts.json",',
                                   '    "text_encoder_2_sequence_length": 512']),
}


def _changed(old: str, new: str) -> tuple[list[str], list[str]]:
    """The lines difflib finds removed and added (everything else is byte-identical)."""
    removed, added = [], []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        (removed if line.startswith("-") else added).append(line[1:])
    return removed, added


@pytest.fixture
def examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of examples/ to fix (relative dataset names resolve as in the repository)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "examples"


def _configs() -> list[str]:
    return sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*")
                  if p.suffix in (".toml", ".json", ".yaml", ".sh") and p.is_file())


@pytest.mark.parametrize("rel", _configs())
def test_every_example_fixed_rechecked_and_unchanged_elsewhere(examples: Path, rel: str) -> None:
    path = examples / rel
    before = path.read_text(encoding="utf-8")
    checked = check_file(str(path))
    report = fix_file(str(path))
    if rel not in EXPECTED:  # nothing --fix writes: no change, no backup
        assert not report.written and not report.changes
        assert path.read_text(encoding="utf-8") == before
        assert not Path(str(path) + BACKUP_SUFFIX).exists()
        return
    assert report.written and not report.refused
    after = path.read_text(encoding="utf-8")
    assert _changed(before, after) == EXPECTED[rel]
    assert Path(str(path) + BACKUP_SUFFIX).read_text(encoding="utf-8") == before
    fixed = {(f.kind, f.setting) for f in report.fixed}
    assert fixed and fixed <= {(f.kind, f.setting) for f in checked.findings}
    again = check_file(str(path))
    assert not [f for f in again.findings if (f.kind, f.setting) in fixed and f.severity != "info"]
    second = fix_file(str(path))  # idempotent
    assert not second.written and not second.changes and path.read_text(encoding="utf-8") == after


def test_fix_writes_no_safety_switch_unless_asked(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SimpleTuner lifts its SD3 T5 cap of 154 only with i_know_what_i_am_doing, which also bypasses its other safety
    limits: --fix leaves it and says what it would take; --fix --allow-unsafe-keys writes it."""
    path = examples / "simpletuner" / "sd3_config.json"
    before = path.read_text(encoding="utf-8")
    report = fix_file(str(path))
    assert not report.written and not report.changes and path.read_text(encoding="utf-8") == before
    (left,) = [f for f in report.left if f.kind == "deviation"]
    assert left.setting == "t5.tokenizer.max_length" and left.severity == "warning"
    assert why_left(left).startswith('not written: its fix ("tokenizer_max_length": 256, "i_know_what_i_am_doing": '
                                     "true) also sets i_know_what_i_am_doing = true, which bypasses SimpleTuner's")
    assert main(["check", str(path), "--fix"]) == 1
    out = capsys.readouterr().out
    assert ("  --fix left 2 finding(s): 1 not written (t5.tokenizer.max_length): the fix also sets "
            "i_know_what_i_am_doing = true, which switches off the trainer's own safety checks; --allow-unsafe-keys "
            "writes it; 1 left to you (text-encoder cache): see its fix") in out
    assert path.read_text(encoding="utf-8") == before and not Path(str(path) + BACKUP_SUFFIX).exists()
    assert main(["check", str(path), "--fix", "--allow-unsafe-keys", "--no-backup"]) == 0  # aligned once written
    after = path.read_text(encoding="utf-8")
    assert _changed(before, after) == (['  "resolution": 1024'], ['  "resolution": 1024,', '  "i_know_what_i_am_doing": true'])
    assert main(["check", str(path), "--allow-unsafe-keys"]) == 2  # a flag of --fix and --diff only
    assert "--allow-unsafe-keys goes with --fix or --diff" in capsys.readouterr().err


def test_diff_prints_the_fix_and_writes_nothing(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = examples / "kohya" / "flux_schnell_lora.toml"
    before = path.read_bytes()
    assert main(["check", str(path), "--diff"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"--- a/{path}"
    assert "-t5xxl_max_token_length = 512\n-apply_t5_attn_mask = true\n+t5xxl_max_token_length = 256\n" in out
    assert path.read_bytes() == before and not Path(str(path) + BACKUP_SUFFIX).exists()


def test_fix_cli_summary_names_what_is_left(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = examples / "kohya" / "sdxl_typo.toml"
    assert main(["check", str(path), "--fix", "--no-backup"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{path}: fixed 1 finding(s): removed clip_skip"
    assert "  --fix left 1 finding(s): 1 left to you (cache_text_encoder_output): see its fix" in out
    assert not Path(str(path) + BACKUP_SUFFIX).exists()
    gui = examples / "kohya-gui" / "sdxl_lora.json"
    assert main(["check", str(gui), "--fix"]) == 0
    out = capsys.readouterr().out
    cache = ("  cache: after fixing, delete the *_te_outputs.npz files (made with the settings before this "
             "fix)")
    assert cache in out
    job = examples / "ai-toolkit" / "flux_schnell_lora.yaml"
    assert main(["check", str(job), "--fix"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("  --fix left 2 finding(s): 2 no key sets (")
    assert out.splitlines()[-1].endswith("): `te-align patch` or the hooks, see its fix")


def test_a_backup_is_checked_as_the_file_it_backs_up_and_never_fixed(examples: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`te-align check NAME.te-align-original` (the backup --fix and patch write) reads it in its original's format,
    saying so in one line on stderr, with the check's own exit code; --fix and --diff refuse it (exit 2, untouched)."""
    from te_align.audit.readers import BACKUP_SUFFIX as READERS_BACKUP_SUFFIX
    from te_align.patching.transaction import KEPT_ORIGINAL_SUFFIX

    assert READERS_BACKUP_SUFFIX == BACKUP_SUFFIX == KEPT_ORIGINAL_SUFFIX
    path = examples / "kohya" / "flux_schnell_lora.toml"
    assert main(["check", str(path), "--fix"]) == 0
    backup = Path(str(path) + BACKUP_SUFFIX)
    capsys.readouterr()
    assert main(["check", str(backup)]) == 1
    out, err = capsys.readouterr()
    assert err == (f"te-align: {backup} is te-align's backup of {path}; checked as a .toml config, as {path} was "
                   "before te-align changed it\n")
    assert out.splitlines()[0].startswith(f"{backup}: kohya · profile flux-schnell (")
    assert out.splitlines()[-1] == "  0 error(s), 4 warning(s), 0 note(s)"  # the severity policy: all warnings
    before = backup.read_bytes()
    for flag in ("--fix", "--diff"):
        assert main(["check", str(backup), flag]) == 2
        assert capsys.readouterr() == ("", f"te-align: error: {backup}: te-align's backup of {path}; --fix and "
                                           f"--diff edit the file itself: run it on {path} (te-align check reads "
                                           "the backup as it is)\n")  # fmt: skip
    assert backup.read_bytes() == before
    assert not Path(str(backup) + BACKUP_SUFFIX).exists()
    gui = examples / "kohya-gui" / "sdxl_lora.json"
    assert main(["check", str(gui), "--fix"]) == 0
    capsys.readouterr()
    assert main(["check", str(gui) + BACKUP_SUFFIX]) == 1
    assert "checked as a .json config" in capsys.readouterr().err


def test_diff_says_the_line_fix_says_for_what_no_key_fixes(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = examples / "ai-toolkit" / "flux_schnell_lora.yaml"
    before = job.read_bytes()
    left = ("--fix left 2 finding(s): 2 no key sets (t5.tokenizer.max_length, model.t5_max_length): "
            "`te-align patch` or the hooks, see its fix")
    assert main(["check", str(job), "--diff"]) == 1
    assert capsys.readouterr() == ("", f"{job}: {left}\n")  # nothing to diff; stdout stays a patch
    assert job.read_bytes() == before
    assert main(["check", str(job), "--fix"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"  {left}"


def test_fix_summary_agrees_with_a_finding_only_the_user_can_fix(examples: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = examples / "kohya" / "sdxl_typo.toml"
    path.write_text(path.read_text(encoding="utf-8") + "caption_dropout_rate = 0.1\n", encoding="utf-8")
    left = "--fix left 2 finding(s): 2 left to you (empty_prompt, cache_text_encoder_output): see its fix"
    assert main(["check", str(path), "--diff"]) == 1
    out, err = capsys.readouterr()
    assert "-clip_skip = 2\n" in out and err == f"{path}: {left}\n"
    assert main(["check", str(path), "--fix", "--no-backup"]) == 1
    out = capsys.readouterr().out
    assert "fix: caption_dropout_rate = 0 (sd-scripts cannot drop captions as zeros)" in out
    assert out.splitlines()[-1] == f"  {left}"


def test_profile_and_set_apply_to_the_values_written(examples: Path) -> None:
    path = examples / "kohya" / "flux_schnell_lora.toml"
    before = path.read_text(encoding="utf-8")
    report = fix_file(str(path), profile="flux-schnell", overrides={"t5.tokenizer.max_length": 512})
    assert report.written
    assert _changed(before, path.read_text(encoding="utf-8")) == (["apply_t5_attn_mask = true"], [])


# ------------------------------------------------------------------------------------ formats
def test_toml_with_comments_and_literal_strings(tmp_path: Path) -> None:
    path = tmp_path / "lumina.toml"
    text = ("# sd-scripts lumina_train_network.py --config_file lumina.toml\n"
            "[model_arguments]   # the model\n"
            "pretrained_model_name_or_path = '/models/lumina_2.safetensors'  # local file\n"
            "network_module = 'networks.lora_lumina'\n"
            "system_prompt = ''   # keep this comment\n"
            "\n"
            "[training_arguments]\n"
            "gemma2_max_token_length = 512 # too long\n"
            "learning_rate = 1e-4\n")
    path.write_text(text, encoding="utf-8")
    report = fix_file(str(path))
    assert report.written, report.refused
    want = ("You are an assistant designed to generate superior images with the superior degree of "
            "image-text alignment based on textual prompts or user prompts.")
    assert _changed(text, path.read_text(encoding="utf-8")) == (
        ["system_prompt = ''   # keep this comment", "gemma2_max_token_length = 512 # too long"],
        [f"system_prompt = '{want}'   # keep this comment", "gemma2_max_token_length = 256 # too long"])


def test_toml_new_top_level_key_goes_after_the_last_one(tmp_path: Path) -> None:
    path = tmp_path / "lumina.toml"
    text = ("pretrained_model_name_or_path = \"/models/lumina_2.safetensors\"\n"
            "network_module = \"networks.lora_lumina\"\n"
            "\n"
            "# text encoder\n"
            "[te]\n"
            "gemma2 = \"/models/gemma_2_2b_fp16.safetensors\"\n")
    path.write_text(text, encoding="utf-8")
    report = fix_file(str(path))
    assert report.written, report.refused
    want = ("You are an assistant designed to generate superior images with the superior degree of "
            "image-text alignment based on textual prompts or user prompts.")
    assert path.read_text(encoding="utf-8") == text.replace(
        "network_module = \"networks.lora_lumina\"\n", f"network_module = \"networks.lora_lumina\"\n"
                                                      f"system_prompt = \"{want}\"\n")


YAML_JOB = """\
---
# ai-toolkit job: FLUX.1 dev LoRA
job: extension
config:
  name: "my_flux_lora"   # the output name
  process:
    - type: 'sd_trainer'
      training_folder: "output"
      model:
        name_or_path: "black-forest-labs/FLUX.1-dev"   # hub id
        is_flux: true
        attn_masking: true    # masks padded T5 tokens
        quantize: true
      train:
        steps: 2000
      datasets:
        - folder_path: "/data/img"
          caption_ext: "txt"
"""


def test_yaml_with_comments_keeps_everything_but_the_changed_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(YAML_JOB, encoding="utf-8")
    report = fix_file(str(path))
    assert report.written, report.refused
    assert _changed(YAML_JOB, path.read_text(encoding="utf-8")) == (
        ["        attn_masking: true    # masks padded T5 tokens"], [])
    assert not fix_file(str(path)).written


def test_yaml_new_key_and_quoting(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    text = YAML_JOB.replace("        attn_masking: true    # masks padded T5 tokens\n", "")
    text = text.replace("is_flux: true", "is_flux: true\n        arch: 'flux'")
    path.write_text(text, encoding="utf-8")
    assert fix_file(str(path)).changes == []  # aligned already: nothing to write
    from te_align.fixing import editing

    proc = ("config", "process", 0)
    changes = [editing.Change(str(path), "yaml", (*proc, "model", "arch"), "flux2"),
               editing.Change(str(path), "yaml", (*proc, "train", "lr"), 0.0001)]
    new = editing.apply(text, "yaml", changes, str(path))
    assert _changed(text, new) == (["        arch: 'flux'"], ["        arch: 'flux2'", "        lr: 0.0001"])


SH = """\
#!/bin/bash
# diffusers train_dreambooth_lora_flux.py, FLUX.1 schnell
export MODEL_NAME="black-forest-labs/FLUX.1-schnell"
accelerate launch train_dreambooth_lora_flux.py \\
  --pretrained_model_name_or_path=$MODEL_NAME \\
  --instance_data_dir=dog \\
  --max_sequence_length 512 \\
  --output_dir=out \\
  --mixed_precision="bf16"
"""


def test_command_line_keeps_continuations(tmp_path: Path) -> None:
    path = tmp_path / "train.sh"
    path.write_text(SH, encoding="utf-8")
    report = fix_file(str(path))
    assert report.written, report.refused
    assert _changed(SH, path.read_text(encoding="utf-8")) == (["  --max_sequence_length 512 \\"],
                                                               ["  --max_sequence_length 256 \\"])
    path.write_text(SH.replace("  --max_sequence_length 512 \\\n", ""), encoding="utf-8")
    report = fix_file(str(path), backup=False)
    assert report.written, report.refused
    assert path.read_text(encoding="utf-8") == SH.replace("  --max_sequence_length 512 \\\n", "").replace(
        '  --mixed_precision="bf16"', '  --max_sequence_length 256 \\\n  --mixed_precision="bf16"')


def test_command_line_crlf_and_windows_caret(tmp_path: Path) -> None:
    path = tmp_path / "train.bat"
    text = SH.replace("\\\n", "^\n").replace("export ", "set ").replace("\n", "\r\n")
    path.write_bytes(text.encode("utf-8"))
    assert fix_file(str(path)).written
    assert path.read_bytes() == text.replace("512", "256").encode("utf-8")


# ------------------------------------------------------------------------------------ bad input
def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_read_only_file(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = examples / "kohya" / "flux_schnell_lora.toml"
    before = path.read_bytes()
    path.chmod(0o444)
    try:
        assert main(["check", str(path), "--fix"]) == 2
        want = f"te-align: error: {path}: not writable (mode -r--r--r--); nothing written"
        assert _one_line(capsys) == want
        assert path.read_bytes() == before and not Path(str(path) + BACKUP_SUFFIX).exists()
    finally:
        path.chmod(0o644)


def test_file_changed_while_being_fixed(examples: Path) -> None:
    path = examples / "kohya" / "flux_schnell_lora.toml"
    edited = path.read_text(encoding="utf-8") + "# edited meanwhile\n"
    report = fix_file(str(path), before_write=lambda: path.write_text(edited, encoding="utf-8"))
    assert report.refused == f"{path}: changed while it was being fixed; nothing written: run --fix again"
    assert report.exit_code == 2 and path.read_text(encoding="utf-8") == edited
    assert not Path(str(path) + BACKUP_SUFFIX).exists()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_symlink_is_refused(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = examples / "kohya" / "flux_schnell_lora.toml"
    link = examples / "link.toml"
    link.symlink_to(target)
    before = target.read_bytes()
    assert main(["check", str(link), "--fix"]) == 2
    assert _one_line(capsys) == (f"te-align: error: {link}: a symbolic link (to {os.path.realpath(target)}); "
                                 "--fix writes regular files only: run it on the file the link points to")
    assert target.read_bytes() == before and link.is_symlink()


def test_assumed_profile_refuses_until_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "flux.toml"
    text = 'network_module = "networks.lora_flux"\nt5xxl_max_token_length = 256\n'
    path.write_text(text, encoding="utf-8")
    assert main(["check", str(path), "--trainer", "kohya", "--fix"]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"te-align: error: {path}: the model is assumed (flux-dev: ")
    assert line.endswith("--fix writes only against a profile the config settles: pass --profile NAME")
    assert path.read_text(encoding="utf-8") == text
    assert main(["check", str(path), "--trainer", "kohya", "--fix", "--profile", "flux-dev"]) == 0
    assert path.read_text(encoding="utf-8") == text.replace("256", "512")


def test_key_given_after_dashes_is_refused(examples: Path) -> None:
    path = examples / "kohya" / "flux_schnell_lora.toml"
    before = path.read_bytes()
    report = fix_file(str(path), extra_args=["flux_train_network.py", "--t5xxl_max_token_length", "512"])
    assert report.refused == (f"{path}: key 't5xxl_max_token_length': given on the command line after `--`, "
                              "which overrides the TOML: change it there")
    assert path.read_bytes() == before


#: A diffusion-pipe Lumina 2 training TOML (``{dataset}``: the dataset TOML it names).
DP_LUMINA = """\
output_dir = "/out"
dataset = "{dataset}"
epochs = 1
micro_batch_size_per_gpu = 1
pipeline_stages = 1
gradient_accumulation_steps = 1
gradient_clipping = 1.0
warmup_steps = 10
[model]
type = "lumina_2"
transformer_path = "/m/t.safetensors"
llm_path = "/m/g.safetensors"
vae_path = "/m/ae.safetensors"
dtype = "bfloat16"
lumina_shift = true
"""


def test_unknown_place_for_a_key_is_refused(tmp_path: Path) -> None:
    """diffusion-pipe's caption_prefix lives in the dataset TOML: when that is not found, no place to write
    it."""
    path = tmp_path / "lumina.toml"
    text = DP_LUMINA.format(dataset="missing.toml")
    path.write_text(text, encoding="utf-8")
    report = fix_file(str(path))
    assert report.refused == (f"{path}: key 'caption_prefix': the dataset TOML ('missing.toml') is not "
                              "found; caption_prefix goes there")
    assert path.read_text(encoding="utf-8") == text


def test_diffusion_pipe_caption_prefix_in_the_dataset_toml(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset.toml"
    dtext = ("# my dataset\nresolutions = [1024]\n\n[[directory]]\npath = '/data/img'  # images\n"
             "num_repeats = 1\n")
    dataset.write_text(dtext, encoding="utf-8")
    path = tmp_path / "lumina.toml"
    text = DP_LUMINA.format(dataset=dataset)
    path.write_text(text, encoding="utf-8")
    report = fix_file(str(path))
    assert report.written, report.refused
    assert path.read_text(encoding="utf-8") == text
    removed, added = _changed(dtext, dataset.read_text(encoding="utf-8"))
    assert removed == [] and len(added) == 1 and added[0].startswith('caption_prefix = "You are an assistant')
    assert added[0].endswith(' <Prompt Start> "')
    assert not fix_file(str(path)).written


# ------------------------------------------------------------------------------------ shipped configs
def _corpus() -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_corpus
    finally:
        sys.path.pop(0)
    return [(name, env) for name, env in check_corpus.ENV.items()]


@pytest.mark.parametrize(("dialect", "env"), _corpus())
def test_shipped_configs_fixed_rechecked_and_unchanged_elsewhere(dialect: str, env: str,
                                                                  tmp_path: Path) -> None:
    """Every shipped config of the trainer's checkout, fixed in a copy: re-checked clean for what was fixed,
    idempotent, and every changed line names a changed key (or only gained the comma a new JSON member
    needs)."""
    root = os.environ.get(env)
    if not root:
        pytest.skip(f"{env} is not set (a checkout of the trainer whose shipped configs are fixed)")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_corpus
    finally:
        sys.path.pop(0)
    cases = check_corpus.FINDERS[dialect](Path(root), tmp_path)
    written = 0
    for i, case in enumerate(cases):
        src = Path(case.path)
        path = tmp_path / "fix" / f"{i}{src.suffix}"
        path.parent.mkdir(exist_ok=True)
        text = src.read_text(encoding="utf-8", errors="replace")
        m = re.search(r'^dataset = "([^"]+)"', text, re.M) if dialect == "diffusion-pipe" else None
        if m and Path(m.group(1)).is_file():  # the dataset TOML a fix may write: a copy, never the checkout's
            copy = tmp_path / "fix" / f"{i}-dataset.toml"
            shutil.copy(m.group(1), copy)
            text = text.replace(m.group(0), f'dataset = "{copy}"')
        path.write_text(text, encoding="utf-8")
        before = path.read_text(encoding="utf-8")
        report = fix_file(str(path), trainer=case.trainer, extra_args=case.extra)
        if not report.written:
            assert path.read_text(encoding="utf-8") == before, case.name
            continue
        written += 1
        after = path.read_text(encoding="utf-8")
        keys = {str(c.path[-1]).split("--")[-1] for c in report.changes if c.file == str(path)}
        removed, added = _changed(before, after)
        for line in removed + added:
            assert any(k in line for k in keys) or line + "," in added or line.rstrip(",") in removed, (
                case.name, line, keys)
        fixed = {(f.kind, f.setting) for f in report.fixed}
        again = check_file(str(path), trainer=case.trainer, extra_args=case.extra)
        still = [f for f in again.findings if (f.kind, f.setting) in fixed and f.severity != "info"]
        assert not still, case.name
        assert not fix_file(str(path), trainer=case.trainer, extra_args=case.extra).written, case.name
    # at the checkouts the corpus was last run on (kohya-ss/sd-scripts, bmaltais/kohya_ss, Nerogar/OneTrainer,
    # bghira/SimpleTuner, tdrussell/diffusion-pipe heads of 2026-11-28): 2, 31, 1, 6 and 1 configs had a fix a key
    # can carry; none of ai-toolkit's and musubi's shipped configs has one
    if dialect in ("ai-toolkit", "musubi"):
        assert written == 0
    else:
        assert written >= 1, f"no shipped {dialect} config was fixed"


def test_pre_commit_hooks_file_names_a_real_entry_point() -> None:
    import yaml

    from te_align import _toml as tomllib

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    by_id = {h["id"]: h for h in hooks}
    assert set(by_id) == {"te-align-check", "te-align-check-fix"}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    for h in hooks:
        assert h["language"] == "python" and h["entry"].split()[0] in scripts
        assert h["entry"].split()[1] == "check" and isinstance(h["files"], str) and re.compile(h["files"])
    assert "--fix" in by_id["te-align-check-fix"]["entry"].split()
    assert "--fix" not in by_id["te-align-check"]["entry"].split()
    assert stat.S_ISREG((ROOT / ".pre-commit-hooks.yaml").stat().st_mode)


def test_readme_pre_commit_config_is_a_working_local_hook() -> None:
    """The README's .pre-commit-config.yaml is valid YAML whose `repo: local` hook runs the same entry as
    .pre-commit-hooks.yaml's te-align-check, and names no repository that does not exist."""
    import yaml

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, flags=re.S) if ".pre-commit-config.yaml" in b]
    config = yaml.safe_load(block)
    (repo,) = config["repos"]
    assert repo["repo"] == "local"
    (hook,) = repo["hooks"]
    published = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))}
    assert hook["id"] == "te-align-check" and hook["entry"] == published["te-align-check"]["entry"]
    assert hook["language"] == "system" and re.compile(hook["files"]).search("configs/flux_lora.toml")
    assert "TE_ALIGN_REPOSITORY_URL" not in readme


# ------------------------------------------------------------------------------ two files, one transaction
#: The caption_prefix the Lumina 2 profile gives diffusion-pipe's dataset TOML.
DP_PREFIX = ("You are an assistant designed to generate superior images with the superior degree of image-text "
             "alignment based on textual prompts or user prompts. <Prompt Start> ")
DP_TRAIN = DP_LUMINA.format(dataset="dp_data/dataset.toml") + "max_sequence_length = 512\n"
DP_TRAIN_FIXED = DP_TRAIN.replace("max_sequence_length = 512", "max_sequence_length = 256")
DP_DATASET = "# my dataset\nresolutions = [1024]\n\n[[directory]]\npath = '/data/img'  # images\nnum_repeats = 1\n"
DP_DATASET_FIXED = DP_DATASET.replace("resolutions = [1024]\n",
                                      f'resolutions = [1024]\ncaption_prefix = "{DP_PREFIX}"\n')
Snap = dict[str, tuple[int, bytes]]


@pytest.fixture
def dp_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A diffusion-pipe Lumina 2 training TOML whose fix writes it ([model] max_sequence_length) and the dataset
    TOML it names in another folder (caption_prefix), in ``tmp_path/run``.

    No shipped diffusion-pipe rule fixes keys in both files for one model today (Lumina 2's fix is
    caption_prefix alone), so the fact table gets one [model] rule (trainer data, not the code under test):
    Gemma's max_length as [model] max_sequence_length, the way a future rule or a plugin's would be."""
    from te_align.audit.rules import Rule
    from te_align.trainers.diffusion_pipe import audit as dp

    rule = Rule("gemma.tokenizer.max_length", ("lumina2",), "max_sequence_length", 256,
                "max_length = [model] max_sequence_length (test rule)", "models/lumina_2.py")
    monkeypatch.setattr(dp, "RULES", tuple(rule if r.path == rule.path and "lumina2" in r.families else r
                                           for r in dp.RULES))
    monkeypatch.chdir(tmp_path)  # the dataset name is relative: to the training TOML's folder
    return _dp_layout(tmp_path / "run")


#: The backup an earlier fix left beside the config, in the fault campaigns below.
OLDER = b"# the backup an earlier fix left\n"


def _relayout(root: Path) -> dict[str, bytes]:
    """``root`` laid out afresh as a pair whose config has an older backup; its files' bytes."""
    shutil.rmtree(root, ignore_errors=True)
    _dp_layout(root, older=OLDER)
    return _snap(root)


def _dp_layout(root: Path, *, mode: int = 0o640, older: bytes | None = None) -> tuple[Path, Path]:
    (root / "dp_data").mkdir(parents=True)
    config, dataset = root / "train.toml", root / "dp_data" / "dataset.toml"
    config.write_text(DP_TRAIN, encoding="utf-8")
    dataset.write_text(DP_DATASET, encoding="utf-8")
    config.chmod(mode)
    if older is not None:  # the backup an earlier fix left
        Path(str(config) + BACKUP_SUFFIX).write_bytes(older)
    return config, dataset


def _snap(root: Path) -> Snap:
    """Every file under ``root``: its permission bits and bytes."""
    return {p.relative_to(root).as_posix(): (p.stat().st_mode & 0o7777, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def _fixed_snap(before: Snap) -> Snap:
    """``before`` after a clean fix: both files fixed (modes kept), their originals the backups (an older one
    replaced)."""
    want = dict(before)
    for rel, text in (("train.toml", DP_TRAIN_FIXED), ("dp_data/dataset.toml", DP_DATASET_FIXED)):
        want[rel + BACKUP_SUFFIX] = before[rel]
        want[rel] = (before[rel][0], text.encode("utf-8"))
    return want


def test_two_files_are_fixed_together(dp_pair: tuple[Path, Path]) -> None:
    config, dataset = dp_pair
    root = config.parent
    before = _snap(root)
    report = fix_file(str(config))
    assert report.written and not report.refused
    assert report.backups == [str(config) + BACKUP_SUFFIX, str(dataset) + BACKUP_SUFFIX]
    assert config.read_bytes() == DP_TRAIN_FIXED.encode("utf-8")
    assert dataset.read_bytes() == DP_DATASET_FIXED.encode("utf-8")
    assert _snap(root) == _fixed_snap(before)  # backups beside both, no journal, no temp file, modes kept
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert not fix_file(str(config)).written


def test_second_file_changed_before_the_write_writes_nothing(dp_pair: tuple[Path, Path]) -> None:
    config, dataset = dp_pair
    root = config.parent
    before = _snap(root)
    edited = DP_DATASET + "# edited meanwhile\n"
    report = fix_file(str(config), before_write=lambda: dataset.write_text(edited, encoding="utf-8"))
    assert report.refused == f"{dataset}: changed while it was being fixed; nothing written: run --fix again"
    assert not report.written and report.exit_code == 2
    assert _snap(root) == {**before, "dp_data/dataset.toml": (before["dp_data/dataset.toml"][0],
                                                              edited.encode("utf-8"))}


def _fail_replace_of(monkeypatch: pytest.MonkeyPatch, target: Path, fail: BaseException,
                     after: Callable[[str], None] | None = None) -> None:
    """os.replace fails for ``target`` (``fail`` raised instead of renaming onto it); ``after`` runs after
    every other real rename (with its destination)."""
    real = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str], **kw: object) -> None:
        if os.fspath(dst) == str(target):
            raise fail
        real(src, dst, **kw)  # type: ignore[arg-type]
        if after is not None:
            after(os.fspath(dst))

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("older", [None, b"# the backup an earlier fix left\n"])
def test_second_replace_fails_first_file_restored(dp_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                  older: bytes | None) -> None:
    config, dataset = dp_pair
    root = config.parent
    if older is not None:
        bak = Path(str(config) + BACKUP_SUFFIX)
        bak.write_bytes(older)
        bak.chmod(0o604)
    before = _snap(root)
    _fail_replace_of(monkeypatch, dataset, OSError(28, "No space left on device"))
    report = fix_file(str(config))
    monkeypatch.undo()
    assert report.refused == f"{dataset}: cannot write: No space left on device; nothing written"
    assert not report.written and not report.backups
    assert _snap(root) == before  # the config restored byte-identical (mode 0640 too), no backup of this run
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    if older is not None:  # the older backup back: its bytes and mode (the journal's copy renamed into place)
        assert bak.read_bytes() == older and stat.S_IMODE(bak.stat().st_mode) == 0o604


def test_interrupt_during_the_second_replace_rolls_back_then_propagates(dp_pair: tuple[Path, Path],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config, dataset = dp_pair
    before = _snap(config.parent)
    _fail_replace_of(monkeypatch, dataset, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        fix_file(str(config))
    monkeypatch.undo()
    assert _snap(config.parent) == before


def test_second_file_changed_under_the_lock_after_the_first_replace(dp_pair: tuple[Path, Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An editor (no te-align lock) writes the dataset TOML just after the config was replaced: the config
    gets its bytes back, the editor's bytes stay."""
    config, dataset = dp_pair
    root = config.parent
    before = _snap(root)
    edited = DP_DATASET + "# edited meanwhile\n"

    def editor(dst: str) -> None:
        if dst == str(config):
            dataset.write_text(edited, encoding="utf-8")

    _fail_replace_of(monkeypatch, root / "nothing", OSError(), after=editor)
    report = fix_file(str(config))
    monkeypatch.undo()
    assert report.refused == f"{dataset}: changed while it was being fixed; nothing written: run --fix again"
    assert _snap(root) == {**before, "dp_data/dataset.toml": (before["dp_data/dataset.toml"][0],
                                                              edited.encode("utf-8"))}


def _fix_in_child(config: Path, *, kill_at: int | None = None, log: Path | None = None) -> int | None:
    """``fix_file(config)`` in a forked child (a real process: a kill is a real SIGKILL, at the ``kill_at``-th
    file operation, see te_align._atomic). Its exit code, None when it was killed."""
    from te_align import _atomic

    pid = os.fork()
    if pid == 0:  # child
        code = 98
        try:
            for key in ("TE_ALIGN_FAULT_AT", "TE_ALIGN_FAULT_MODE", "TE_ALIGN_FAULT_LOG"):
                os.environ.pop(key, None)
            if kill_at is not None:
                os.environ.update(TE_ALIGN_FAULT_AT=str(kill_at), TE_ALIGN_FAULT_MODE="kill")
            if log is not None:
                os.environ["TE_ALIGN_FAULT_LOG"] = str(log)
            _atomic.reset_fault_counter()
            _atomic.FSYNC = False  # a killed process, not a machine: the page cache survives
            code = 0 if fix_file(str(config)).written else 1
        except BaseException:
            code = 99
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return None if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _ops(config: Path, tmp_path: Path) -> list[str]:
    """The file operations of a clean fix of a copy of ``config``'s layout (``N op path`` lines)."""
    scratch = tmp_path / "scratch"
    shutil.copytree(config.parent, scratch)
    log = tmp_path / "ops.log"
    assert _fix_in_child(scratch / config.name, log=log) == 0
    shutil.rmtree(scratch)
    return [line.split(" ", 2)[1] + " " + line.split(" ", 2)[2].replace(str(scratch), str(config.parent))
            for line in log.read_text(encoding="utf-8").splitlines()]


def test_killed_between_the_two_replaces_is_rolled_back_by_the_next_fix(
        dp_pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, dataset = dp_pair
    root = config.parent
    before = _snap(root)
    dataset_mode = stat.S_IMODE(dataset.stat().st_mode)
    ops = _ops(config, tmp_path)
    at = ops.index(f"rename {dataset}") + 1  # the rename of the second file
    assert _fix_in_child(config, kill_at=at) is None
    journal = root / f".{config.name}.te-align-fix" / "journal.json"
    assert config.read_bytes() == DP_TRAIN_FIXED.encode("utf-8") and dataset.read_bytes() == DP_DATASET.encode()
    # the journal of patch's transaction: each file the fix replaces (the backups too) by absolute path, whether
    # it existed, the sha256 and mode of its bytes before (copied into journal-data/, private) and of the new ones
    import hashlib
    import json

    def sha(b: bytes) -> str:
        return hashlib.sha256(b).hexdigest()

    data = json.loads(journal.read_bytes())
    assert data["op"] == "check --fix" and data["state_existed"] is False and data["dirs"] == []
    assert data["files"] == [
        {"path": str(config), "existed": True, "sha256": sha(DP_TRAIN.encode()), "mode": 0o640, "copy": "0",
         "new_sha256": sha(DP_TRAIN_FIXED.encode())},
        {"path": str(config) + BACKUP_SUFFIX, "existed": False, "new_sha256": sha(DP_TRAIN.encode())},
        {"path": str(dataset), "existed": True, "sha256": sha(DP_DATASET.encode()), "mode": dataset_mode, "copy": "2",
         "new_sha256": sha(DP_DATASET_FIXED.encode())},
        {"path": str(dataset) + BACKUP_SUFFIX, "existed": False, "new_sha256": sha(DP_DATASET.encode())}]
    copy = journal.parent / "journal-data" / "0"
    assert copy.read_bytes() == DP_TRAIN.encode() and stat.S_IMODE(copy.stat().st_mode) == 0o600
    # --diff writes nothing, not even the rollback
    assert main(["check", str(config), "--diff"]) == 2
    assert _one_line(capsys) == (f"te-align: error: {config}: an interrupted --fix left its journal {journal}: "
                                 "run --fix to roll it back first (--diff writes nothing)")
    # the next --fix rolls it back, says so and stops
    assert main(["check", str(config), "--fix"]) == 2
    assert _one_line(capsys) == (f"te-align: error: {config}: an interrupted --fix was rolled back ({config} "
                                 "restored to the bytes before it; its backups as before, its journal removed); "
                                 "nothing fixed yet: run --fix again")
    assert _snap(root) == before
    # then it fixes, byte-identical to a clean run
    report = fix_file(str(config))
    assert report.written
    assert _snap(root) == _fixed_snap(before)


def test_journal_of_a_file_with_other_bytes_is_refused(dp_pair: tuple[Path, Path], tmp_path: Path) -> None:
    config, dataset = dp_pair
    root = config.parent
    ops = _ops(config, tmp_path)
    assert _fix_in_child(config, kill_at=ops.index(f"rename {dataset}") + 1) is None
    config.write_text(DP_TRAIN_FIXED + "# edited after the crash\n", encoding="utf-8")
    left = _snap(root)
    state = root / f".{config.name}.te-align-fix"
    report = fix_file(str(config))
    assert report.refused == (f"{config}: holds neither its bytes from before the interrupted te-align check --fix "
                              "nor the ones it wrote; nothing rolled back: restore its bytes from before (its copy "
                              f"{state}/journal-data/0) or keep the file as it is, then delete {state}/journal.json")
    assert not report.written and _snap(root) == left  # nothing touched: journal, backup, both files


def test_damaged_journal_is_refused(dp_pair: tuple[Path, Path]) -> None:
    config, _ = dp_pair
    state = config.parent / f".{config.name}.te-align-fix"
    state.mkdir()
    (state / "journal.json").write_text('{"op": "check --fix", "state_existed": false, "dirs": [], '
                                        '"files": [{"path": "x", "existed": false}]}')
    left = _snap(config.parent)
    report = fix_file(str(config))
    assert report.refused == (f"{state}/journal.json: te-align state file is unreadable (file must be an absolute "
                              f"path, found 'x'); check the files it names (each one's bytes from before the fix "
                              f"are in {state}/journal-data, named by its 'copy'), then delete {state}")
    assert report.exit_code == 2 and not report.written
    assert _snap(config.parent) == left


def test_journal_of_an_older_te_align_is_refused_in_one_line(dp_pair: tuple[Path, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The journal an interrupted --fix of te-align before the shared transaction left (its own format) is never
    ignored: --fix and --diff refuse in one line saying what to do, and touch nothing."""
    config, _ = dp_pair
    legacy = config.parent / f".{config.name}.te-align-fix-journal"
    legacy.write_text('{"te_align": "check --fix journal", "version": 1, "committed": false, "files": []}')
    left = _snap(config.parent)
    want = (f"{config}: an interrupted --fix of an older te-align left its journal {legacy}, which this te-align "
            "does not roll back: run --fix with the te-align that wrote it to roll it back; or by hand: each file "
            "it names ('path') holds its bytes from before that --fix (its 'original', base64) or the fixed ones, "
            "and an older backup may wait at .NAME.te-align-original.te-align-fix-older beside it: restore what "
            "you keep, delete the journal, then run --fix again")
    assert fix_file(str(config)).refused == want
    for flag in ("--fix", "--diff"):
        assert main(["check", str(config), flag]) == 2
        assert _one_line(capsys) == f"te-align: error: {want}"
    assert _snap(config.parent) == left
    legacy.unlink()
    assert fix_file(str(config)).written


def test_killed_at_every_file_operation_recovers_byte_identical(tmp_path: Path,
                                                                dp_pair: tuple[Path, Path]) -> None:
    """A kill at each file operation of a fix (the config has a backup from an earlier fix, the dataset TOML
    none): the next --fix rolls back to exactly the files before (or finds the fix done), and the one after
    it leaves exactly what a clean run leaves."""
    config, _ = dp_pair
    root = config.parent
    before = _relayout(root)
    want = _fixed_snap(before)
    ops = _ops(config, tmp_path)
    assert len(ops) >= 12, ops
    for at in range(1, len(ops) + 1):
        _relayout(root)
        assert _fix_in_child(config, kill_at=at) is None, (at, ops[at - 1])
        first = fix_file(str(config))
        if first.rolled_back or "interrupted --fix was rolled back" in first.refused:
            assert _snap(root) == before, (at, ops[at - 1])
            assert fix_file(str(config)).written, (at, ops[at - 1])
        elif first.written:  # killed before the journal was written: nothing had changed
            assert not first.refused
        assert _snap(root) == want, (at, ops[at - 1], sorted(set(_snap(root)) ^ set(want)))


def test_rollback_killed_at_every_file_operation_is_rolled_back_again(tmp_path: Path,
                                                                      dp_pair: tuple[Path, Path]) -> None:
    """The rollback of a fix killed between its two replaces, itself killed at each of its file operations:
    the --fix after it still gives back exactly the files before."""
    config, dataset = dp_pair
    root = config.parent
    before = _relayout(root)
    at = _ops(config, tmp_path).index(f"rename {dataset}") + 1

    def killed_fix() -> None:
        _relayout(root)
        assert _fix_in_child(config, kill_at=at) is None

    killed_fix()
    log = tmp_path / "rollback.log"
    assert _fix_in_child(config, log=log) == 1  # the rollback (it writes no fix)
    n = len(log.read_text(encoding="utf-8").splitlines())
    assert n >= 4
    finished: list[int] = []
    for k in range(1, n + 1):
        killed_fix()
        assert _fix_in_child(config, kill_at=k) is None, k
        report = fix_file(str(config))
        if report.written:  # killed after the rollback's commit point (its state folder renamed away): the next
            assert not report.refused  # --fix removes the leftovers and fixes
            assert _snap(root) == _fixed_snap(before), k
            finished.append(k)
            continue
        assert "an interrupted --fix was rolled back" in report.refused, (k, report.refused)
        assert _snap(root) == before, k
    assert finished == list(range(n - len(finished) + 1, n + 1)), finished  # only the last operations, after it


@pytest.mark.parametrize("mode", ["enospc", "erofs"])
def test_full_disk_or_read_only_at_every_file_operation(tmp_path: Path, dp_pair: tuple[Path, Path],
                                                        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """ENOSPC (that operation and every later one that needs space) or EROFS (every change from then on) at
    each file operation: one line, and the files exactly as before (when even the rollback cannot write, the
    journal stays and the next --fix rolls back); or the fix whole."""
    from te_align import _atomic

    config, _ = dp_pair
    root = config.parent
    before = _relayout(root)
    n = len(_ops(config, tmp_path))
    for at in range(1, n + 1):
        _relayout(root)
        monkeypatch.setenv("TE_ALIGN_FAULT_AT", str(at))
        monkeypatch.setenv("TE_ALIGN_FAULT_MODE", mode)
        _atomic.reset_fault_counter()
        report = fix_file(str(config))
        monkeypatch.delenv("TE_ALIGN_FAULT_AT")
        if report.written:  # the fault came after the commit point
            assert _snap(root) == _fixed_snap(before) or ".train.toml.te-align-fix" in str(_snap(root))
            report = fix_file(str(config))  # finishes a committed journal's cleanup
            assert not report.refused and _snap(root) == _fixed_snap(before), at
            continue
        assert "\n" not in report.refused, (at, report.refused)
        if "rolling back failed too" in report.refused:  # the journal stays for the next --fix
            assert report.refused.endswith(f"its journal {root}/.train.toml.te-align-fix/journal.json is kept: run "
                                           "--fix again to roll it back"), (at, report.refused)
            again = fix_file(str(config))
            assert "an interrupted --fix was rolled back" in again.refused, (at, again.refused)
        elif "could not be removed" in report.refused:  # failed before its journal was written: no file touched,
            assert report.refused.endswith("the next --fix removes them)"), (at, report.refused)  # only leftovers
            assert {k: v for k, v in _snap(root).items() if not k.startswith(".train.toml.te-align-fix")} == before
            again = fix_file(str(config))
            assert again.written and _snap(root) == _fixed_snap(before), (at, again.refused)
            continue
        else:
            assert "nothing written" in report.refused, (at, report.refused)
        assert _snap(root) == before, (at, report.refused)


# ------------------------------------------------------------------------- several commands in one file
TWO_RUNS = """\
# two sd-scripts FLUX.1 dev runs
export T5=/m/t5xxl_fp16.safetensors
export LEN=256
accelerate launch flux_train_network.py --pretrained_model_name_or_path /m/flux1-dev.safetensors \\
  --t5xxl "$T5" --t5xxl_max_token_length 128 --output_name a
accelerate launch --mixed_precision bf16 flux_train_network.py \\
  --pretrained_model_name_or_path /m/flux1-dev.safetensors \\
  --t5xxl "$T5" \\
  --t5xxl_max_token_length $LEN --output_name b
"""


def test_fix_edits_every_command_of_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both runs are fixed in one write: the first command's flag, and the second's value where the file sets the
    variable it comes from ($LEN is used only there); continuations, quoting and the other variable kept."""
    path = tmp_path / "train.sh"
    path.write_text(TWO_RUNS, encoding="utf-8")
    assert main(["check", str(path), "--diff"]) == 1
    assert capsys.readouterr().out == (
        f"--- a/{path}\n+++ b/{path}\n@@ -1,8 +1,8 @@\n # two sd-scripts FLUX.1 dev runs\n"
        " export T5=/m/t5xxl_fp16.safetensors\n-export LEN=256\n+export LEN=512\n"
        " accelerate launch flux_train_network.py --pretrained_model_name_or_path /m/flux1-dev.safetensors \\\n"
        '-  --t5xxl "$T5" --t5xxl_max_token_length 128 --output_name a\n'
        '+  --t5xxl "$T5" --t5xxl_max_token_length 512 --output_name a\n'
        " accelerate launch --mixed_precision bf16 flux_train_network.py \\\n"
        "   --pretrained_model_name_or_path /m/flux1-dev.safetensors \\\n"
        '   --t5xxl "$T5" \\\n')
    assert path.read_text(encoding="utf-8") == TWO_RUNS  # --diff writes nothing
    report = fix_file(str(path))
    assert report.written, report.refused
    assert path.read_text(encoding="utf-8") == TWO_RUNS.replace("LEN=256", "LEN=512").replace(
        "--t5xxl_max_token_length 128", "--t5xxl_max_token_length 512")
    assert Path(str(path) + BACKUP_SUFFIX).read_text(encoding="utf-8") == TWO_RUNS
    assert [(c.at_line, c.describe()) for c in report.changes] == [
        (4, "--t5xxl_max_token_length 512"), (6, "--t5xxl_max_token_length 512")]
    assert [(r.file, r.exit_code) for r in report.results] == [(f"{path}:4", 0), (f"{path}:6", 0)]
    assert report.exit_code == 0


def test_fix_refuses_a_variable_used_twice_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "train.sh"
    text = TWO_RUNS.replace("--t5xxl_max_token_length 128", "--t5xxl_max_token_length $LEN")
    path.write_text(text, encoding="utf-8")
    assert main(["check", str(path), "--fix"]) == 2
    assert _one_line(capsys) == (f"te-align: error: {path}: --t5xxl_max_token_length takes its value from $LEN, "
                                 "which is used 2 times in this file; set it by hand (nothing written)")
    assert path.read_text(encoding="utf-8") == text  # all or nothing: the first command is not fixed alone
    assert not Path(str(path) + BACKUP_SUFFIX).exists()


def test_fix_every_command_of_a_bat_with_carets(tmp_path: Path) -> None:
    """cmd.exe: ``^`` continuations, CRLF, ``set "VAR=…"``, ``%VAR%``; the second command writes an abbreviation
    (--t5xxl_max), which the fix writes in full."""
    text = ('@echo off\r\nset "MODEL=C:\\m\\flux1-dev.safetensors"\r\n'
            'accelerate launch ^\r\n  sd-scripts\\flux_train_network.py ^\r\n  --pretrained_model_name_or_path "%MODEL%" ^\r\n'
            '  --t5xxl_max_token_length 256 ^\r\n  --output_name a\r\n'
            'accelerate launch sd-scripts\\flux_train_network.py ^\r\n  --pretrained_model_name_or_path "%MODEL%" ^\r\n'
            '  --t5xxl_max 128 ^\r\n  --output_name b\r\n')
    path = tmp_path / "train.bat"
    path.write_bytes(text.encode("utf-8"))
    report = fix_file(str(path), backup=False)
    assert report.written, report.refused
    assert path.read_bytes() == text.replace("--t5xxl_max_token_length 256", "--t5xxl_max_token_length 512").replace(
        "--t5xxl_max 128", "--t5xxl_max_token_length 512").encode("utf-8")
    assert [r.exit_code for r in check_files([str(path)])] == [0, 0]
