"""te-align check --for comfyui|forge|diffusers: what each inference tool does differently from the training
(torch-free), and the SD3 profiles' reference-code alternatives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import te_align
from te_align.cli import main
from te_align.errors import TeAlignError
from te_align.integrations.targets import BEHAVIOURS, check_tool, inference_notes

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"


def test_flux_dev_trained_at_512_comfyui_samples_at_256(capsys):
    code = main(["check", str(EX / "kohya" / "flux_dev_aligned.toml"), "--for", "comfyui"])
    out = capsys.readouterr().out
    assert code == 0
    assert ("you trained at 512 (t5.tokenizer.max_length); ComfyUI pads T5 to at least 256 tokens and never truncates "
            "(T5XXLTokenizer min_length=256, max_length=99999999), unless you use the te-align Text Encode node, or a "
            "T5TokenizerOptions node with min_length=512 before it") in out
    assert "comfyanonymous/ComfyUI@fe25114 comfy/text_encoders/flux.py:12-15" in out


def test_for_json_and_diffusers_schnell():
    prof = te_align.profile("flux-schnell")
    notes = inference_notes(prof, "diffusers")
    assert [(n.setting, n.trained, n.tool_value) for n in notes] == [("t5.tokenizer.max_length", 256, 512)]
    assert notes[0].fix == "pass max_sequence_length=256 to the pipeline call, or call te_align.apply(pipe, 'flux-schnell')"
    # a trainer that trained schnell at 512 (ai-toolkit) samples as trained in diffusers' default
    assert inference_notes(prof, "diffusers", {"t5.tokenizer.max_length": 512}) == []


def test_check_for_json(capsys):
    code = main(["check", str(EX / "kohya" / "sdxl_typo.toml"), "--for", "forge", "--json"])
    data = json.loads(capsys.readouterr().out)
    inf = data["results"][0]["inference"]
    assert code == data["exit_code"] and inf["tool"] == "forge"
    assert [n["setting"] for n in inf["notes"]] == ["prompt syntax"]  # Forge zeros an empty SDXL negative, as trained


def test_sdxl_zeros_vs_comfyui_and_sd3_encode_vs_forge():
    sdxl = {n.setting: n for n in inference_notes(te_align.profile("sdxl"), "comfyui")}
    assert sdxl["empty_prompt"].message.startswith("you trained with empty_prompt = zeros; ComfyUI encodes an empty negative")
    assert "te-align Empty Negative" in sdxl["empty_prompt"].fix
    sd3 = {n.setting for n in inference_notes(te_align.profile("sd35-large"), "forge")}
    assert sd3 == {"t5.tokenizer.max_length", "clip_l.encoder.layer", "empty_prompt", "prompt syntax"}
    assert {n.setting for n in inference_notes(te_align.profile("sd35-large"), "diffusers")} == set()


def test_unknown_tool_names_the_closest():
    with pytest.raises(TeAlignError, match="unknown inference tool 'comfy'; choose one of comfyui, forge, diffusers"):
        check_tool("comfy")


def test_every_behaviour_cites_a_commit_and_known_paths():
    paths = set()
    for p in te_align.profiles():
        paths |= {path.split(".", 1)[-1] if path.startswith("slots.") else path for path in p.behaviour_paths()}
    for b in BEHAVIOURS:
        assert "@" in b.source or "diffusers 0.42.1" in b.source, b
        assert b.path is None or b.path in paths, b.path


def test_check_for_imports_no_torch():
    cfg = str(EX / "kohya" / "flux_dev_aligned.toml")
    code = (f"import sys; from te_align.cli import main; main(['check', {cfg!r}, '--for', 'comfyui']); "
            "bad = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]; "
            "print('HEAVY', bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "HEAVY []" in out


def test_sd3_profiles_cite_the_reference_code_as_an_alternative():
    for name in ("sd3-medium", "sd35-medium", "sd35-large"):
        pv = te_align.profile(name).provenance_of("slots.t5.tokenizer.max_length")
        alt = {a.value: a for a in pv.alternatives}[77]
        assert alt.source.startswith("Stability-AI/sd3.5@fbf8f48 other_impls.py:578-589 T5XXLTokenizer: min_length=77")
        assert "t5.min_length=77" in alt.note
