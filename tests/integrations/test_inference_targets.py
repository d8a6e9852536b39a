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

ROOT = Path(__file__).resolve().parents[2]
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


def test_schnell_trained_at_512_gets_one_direction_per_tool():
    """ai-toolkit trains FLUX.1 schnell at 512 (the profile says 256): each tool's note says how to sample at 512,
    never the te-align encoders that follow the profile's 256."""
    prof = te_align.profile("flux-schnell")
    eff = {"t5.tokenizer.max_length": 512, "t5.masks.zero_padded": False}
    comfy = {n.setting: n for n in inference_notes(prof, "comfyui", eff)}["t5.tokenizer.max_length"]
    assert comfy.message.startswith("you trained at 512 (t5.tokenizer.max_length), not the profile's 256; ComfyUI pads")
    assert comfy.fix == ("add a T5TokenizerOptions node with min_length=512 before it (prompts over 512 tokens are "
                         "still not cut)")
    forge = {n.setting: n for n in inference_notes(prof, "forge", eff)}["t5.tokenizer.max_length"]
    assert forge.fix.startswith("sample elsewhere, as Forge has no setting for it: in diffusers with "
                                "max_sequence_length=512, or in ComfyUI with a T5TokenizerOptions node with min_length=512")
    assert inference_notes(prof, "diffusers", eff) == []  # FluxPipeline's default 512 is what was trained
    assert (comfy.trained, comfy.profile_value, comfy.tool_value, comfy.trained_known) == (512, 256, 256, True)


def test_no_fix_for_a_deviating_training_points_at_the_profile():
    """For every profile, tool and setting: a training that used another value than the profile's is told how to
    sample as trained; the te-align encoders (which follow the profile) are never the fix then."""
    checked = 0
    for p in te_align.profiles():
        for tool in ("comfyui", "forge", "diffusers"):
            for b in BEHAVIOURS:
                if b.tool != tool or b.path is None or not b.applies(p.name, p.family):
                    continue
                if "." in b.path and b.path.split(".", 1)[0] not in p.slot_names:
                    continue
                prof = p.get(b.path if "." not in b.path else f"slots.{b.path}")
                other = {bool: lambda v: not v, int: lambda v: v + 64, str: lambda v: v + "x"}[type(prof)](prof) \
                    if prof is not None else "x"
                for n in inference_notes(p, tool, {b.path: other}):
                    if n.setting != b.path:
                        continue
                    checked += 1
                    assert "te-align Text Encode" not in n.fix and "Empty Negative" not in n.fix, (p.name, tool, n.fix)
                    assert f"apply(pipe, '{p.name}')" not in n.fix, (p.name, tool, n.fix)
                    assert f", not the profile's {n.profile_value!s}".lower() in n.message.lower() or isinstance(
                        n.profile_value, str), n.message
    assert checked >= 15


def test_mask_fix_names_a_profile_that_has_the_trained_value():
    kohya = te_align.profile("flux-schnell")
    eff = {"t5.tokenizer.max_length": 512, "t5.masks.encoder": True, "t5.masks.denoiser": True}
    note = {n.setting: n for n in inference_notes(kohya, "diffusers", eff)}["t5.masks.encoder"]
    assert note.fix.startswith("call te_align.apply(pipe, te_align.profile('flux-schnell', t5_encoder=True))")
    # the override the fix names is a real one, giving what was trained
    assert te_align.profile("flux-schnell", t5_encoder=True).get("slots.t5.masks.encoder") is True


def test_unknown_trained_value_is_said_to_be_unknown(capsys):
    code = main(["check", str(EX / "kohya" / "sdxl_typo.toml"), "--for", "comfyui"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert ("you trained with empty_prompt = unknown (the trainer does not record it); the profile says zeros, and "
            "ComfyUI encodes an empty negative prompt as the text \"\"") in out
    note = {n.setting: n for n in inference_notes(te_align.profile("sdxl"), "comfyui", {})}["empty_prompt"]
    assert (note.trained, note.trained_known, note.profile_value) == (None, False, "zeros")
    assert note.to_dict()["trained_known"] is False
    # the profile's value equals the tool's: nothing is known to differ, so no note
    assert "empty_prompt" not in {n.setting for n in inference_notes(te_align.profile("sdxl"), "forge", {})}


#: Families whose ComfyUI tokenizer (fe25114) parses (word:1.2): every SDTokenizer without disable_weights=True.
#: Qwen-Image's template tokenizer sets disable_weights=True (qwen_image.py:39); ComfyUI has no Sana encoder.
COMFYUI_WEIGHTS = {"sd1", "sd2", "sdxl", "sd3", "flux", "hidream", "chroma", "pixart", "auraflow", "wan", "lumina2",
                   "anima", "hunyuanimage", "ltx2"}


def test_prompt_syntax_note_for_every_family_whose_comfyui_tokenizer_reads_weights():
    families = {p.family for p in te_align.profiles()}
    assert COMFYUI_WEIGHTS <= families
    for p in te_align.profiles():
        notes = [n for n in inference_notes(p, "comfyui") if n.setting == "prompt syntax"]
        assert len(notes) == (p.family in COMFYUI_WEIGHTS), p.name
        if notes:
            assert "(word:1.2)" in notes[0].message and "comfy/sd1_clip.py:304-349" in notes[0].source


def test_wan_in_comfyui_skips_the_text_cleaning_and_reads_weights(capsys):
    notes = {n.setting: n for n in inference_notes(te_align.profile("wan21"), "comfyui")}
    assert set(notes) == {"t5.tokenizer.text_cleaning", "prompt syntax"}
    clean = notes["t5.tokenizer.text_cleaning"]
    assert clean.message.startswith("you trained with t5.tokenizer.text_cleaning = wan; ComfyUI does not clean the prompt")
    assert "comfy/text_encoders/wan.py:11-14" in clean.source
    assert "UMT5 token weights and never cuts a prompt over 512 tokens" in notes["prompt syntax"].message
    assert not [n for n in inference_notes(te_align.profile("qwen-image"), "comfyui") if n.setting == "prompt syntax"]
