"""Community bases whose recipe differs from their architecture's (sd15-nai, sdxl-pony): ``check`` picks them from the
model's file name or its checkpoint metadata, names what it assumed and why, and never tells their users to remove
their base's own recipe; vanilla bases keep their findings. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from te_align.audit.models import assumption, community_bases, guess_model
from te_align.audit.rules import guess_from_name
from te_align.checking import check_file
from tests.support.files import unet_keys, write_sparse_safetensors

NAI = "/models/animefull-final-pruned.safetensors"
PONY = "/models/ponyDiffusionV6XL_v6StartWithThisOne.safetensors"
NAI_ASSUMPTION = (
    "assumed sd15 (the architecture's own recipe): nothing in pretrained_model_name_or_path (its name or files) names "
    "another base; if your base is SD 1.x of the NovelAI lineage (NovelAI's animefull model, Anything, AbyssOrangeMix, "
    "Counterfeit, ...), pass --profile sd15-nai")


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def rows(r):
    return [(f.kind, f.severity, f.setting, f.effective, f.profile) for f in r.findings]


@pytest.mark.parametrize(("name", "profile"), [
    ("animefull-final-pruned.ckpt", "sd15-nai"),
    ("anything-v4.5-pruned.safetensors", "sd15-nai"),
    ("AbyssOrangeMix3A1.safetensors", "sd15-nai"),
    ("aom3a1b.safetensors", "sd15-nai"),
    ("Counterfeit-V3.0_fp16.safetensors", "sd15-nai"),
    ("CounterfeitXL_beta.safetensors", "sdxl"),  # the XL namesake is an SDXL model
    ("ponyDiffusionV6XL_v6StartWithThisOne.safetensors", "sdxl-pony"),
    ("autismmixSDXL_autismmixPony.safetensors", "sdxl-pony"),
    ("ponyDiffusion_v5.safetensors", "sdxl"),  # V5 was not SDXL: never read as Pony V6's recipe
    ("runwayml/stable-diffusion-v1-5", "sd15"),
    ("stabilityai/stable-diffusion-xl-base-1.0", "sdxl"),
])
def test_model_names_pick_the_community_base(name: str, profile: str):
    assert guess_from_name(name) == profile


def test_a_community_base_is_decided_by_its_name_and_an_unnamed_base_is_assumed():
    assert guess_model(NAI) == ("sd15-nai", "", True)
    assert guess_model(PONY) == ("sdxl-pony", "", True)
    assert guess_model("runwayml/stable-diffusion-v1-5") == ("sd15", "", True)
    assert guess_model("/m/sd_xl_base_1.0.safetensors") == ("sdxl", "", True)
    assert guess_model("/m/illustriousXL_v01.safetensors") == ("sdxl", "", False)
    assert sorted(community_bases()) == ["sd15-nai", "sdxl-pony"]
    assert assumption("sd15", "pretrained_model_name_or_path (its name or files)") == NAI_ASSUMPTION


# ------------------------------------------------------------------------------------------------- sd-scripts
def test_kohya_nai_name_with_clip_skip_2_is_aligned_and_names_the_base(tmp_path):
    r = check_file(write(tmp_path, "nai.toml", f'pretrained_model_name_or_path = "{NAI}"\nnetwork_module = '
                                               '"networks.lora"\nclip_skip = 2\n'))
    assert (r.exit_code, r.profile, r.assumed, r.findings) == (0, "sd15-nai", "", [])
    assert r.family_reason == f"pretrained_model_name_or_path {NAI!r}"
    assert r.effective["clip_l.encoder.layer"] == "penultimate"


def test_kohya_nai_225_tokens_is_a_note_that_keeps_it(tmp_path):
    r = check_file(write(tmp_path, "nai.toml", f'pretrained_model_name_or_path = "{NAI}"\nclip_skip = 2\n'
                                               "max_token_length = 225\n"))
    assert (r.exit_code, r.profile) == (0, "sd15-nai")
    assert rows(r) == [("deviation", "info", "clip_l.tokenizer.max_length", 227, 77)]
    (f,) = r.findings
    assert "This is an official alternative of sd15-nai: NovelAI's own long-prompt method (225 tokens" in f.message
    assert f.fix.startswith("keep it (an official alternative of sd15-nai); for the profile's 77: remove max_token_length")


def test_kohya_vanilla_sd15_with_clip_skip_2_keeps_its_finding(tmp_path):
    path = write(tmp_path, "v.toml", 'pretrained_model_name_or_path = "runwayml/stable-diffusion-v1-5"\nclip_skip = 2\n')
    r = check_file(path)
    assert (r.exit_code, r.profile, r.assumed) == (1, "sd15", "")
    assert rows(r) == [("deviation", "warning", "clip_l.encoder.layer", "penultimate", "last")]
    assert r.findings[0].fix == f"remove clip_skip from {path}"


def test_kohya_pony_clip_skip_2_is_its_recipe_not_a_key_to_remove(tmp_path):
    r = check_file(write(tmp_path, "p.toml", f'pretrained_model_name_or_path = "{PONY}"\nclip_skip = 2\n'
                                             "cache_text_encoder_outputs = true\n"))
    assert (r.exit_code, r.profile) == (0, "sdxl-pony")
    notes = [f for f in r.findings if f.setting == "clip_skip"]
    assert [(f.kind, f.severity, f.line, f.edit) for f in notes] == [("note", "info", 2, None)]
    assert notes[0].message.startswith("clip_skip = 2 is the recipe published for sdxl-pony, Pony Diffusion V6 XL")
    assert notes[0].message.endswith('already encodes clip_l.encoder.layer = "penultimate", which is what the value '
                                     "asks for: nothing to change")
    assert "civitai.com/models/257749" in notes[0].message


def test_kohya_vanilla_sdxl_clip_skip_stays_an_unused_key(tmp_path):
    path = write(tmp_path, "x.toml", 'pretrained_model_name_or_path = "/m/sd_xl_base_1.0.safetensors"\nclip_skip = 2\n')
    r = check_file(path)
    assert (r.exit_code, r.profile) == (1, "sdxl")
    (f,) = [f for f in r.findings if f.setting == "clip_skip"]
    assert (f.kind, f.severity, f.fix) == ("unused-value", "warning", f"remove clip_skip from {path}")


def test_kohya_unnamed_base_states_the_assumption(tmp_path, capsys):
    from te_align.cli import main

    path = write(tmp_path, "a.toml", 'pretrained_model_name_or_path = "/models/mymodel.safetensors"\nclip_skip = 2\n')
    r = check_file(path, extra_args=["train_network.py"])
    assert (r.exit_code, r.profile, r.assumed) == (1, "sd15", NAI_ASSUMPTION)
    assert main(["check", path, "--", "train_network.py"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"{path}: kohya · profile sd15 (script train_network.py; sd15 assumed)", f"  {NAI_ASSUMPTION}"]


def test_profile_option_overrides_the_name(tmp_path):
    path = write(tmp_path, "a.toml", 'pretrained_model_name_or_path = "/models/mymodel.safetensors"\nclip_skip = 2\n')
    r = check_file(path, extra_args=["train_network.py"], profile="sd15-nai")
    assert (r.exit_code, r.profile, r.family_reason, r.findings) == (0, "sd15-nai", "--profile sd15-nai", [])
    r = check_file(write(tmp_path, "n.toml", f'pretrained_model_name_or_path = "{NAI}"\nclip_skip = 2\n'), profile="sd15")
    assert (r.exit_code, r.profile) == (1, "sd15")
    assert rows(r) == [("deviation", "warning", "clip_l.encoder.layer", "penultimate", "last")]


# ------------------------------------------------------------------------------------ a checkpoint's metadata
@pytest.mark.parametrize(("shapes", "title", "profile"), [
    (unet_keys(768), "Anything V5", "sd15-nai"),
    (unet_keys(2048), "Pony Diffusion V6 XL", "sdxl-pony"),
    (unet_keys(768), "My own merge", "sd15"),
])
def test_a_local_checkpoint_metadata_names_the_base(tmp_path, shapes, title, profile):
    ckpt = write_sparse_safetensors(tmp_path / "model.safetensors", shapes, metadata={"modelspec.title": title})
    r = check_file(write(tmp_path, "c.toml", f'pretrained_model_name_or_path = "{ckpt}"\nclip_skip = 2\n'))
    assert r.profile == profile
    width = 768 if profile.startswith("sd15") else 2048
    k = ("input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight" if width == 768
         else "input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight")
    why = f"its files: UNet cross-attention width {width} ({k} [{320 if width == 768 else 640}, {width}])"
    if profile != "sd15":
        why += f"; its metadata modelspec.title = {title!r}"
    assert r.family_reason == f"pretrained_model_name_or_path {str(ckpt)!r} ({why})"
    assert r.exit_code == {"sd15-nai": 0, "sdxl-pony": 0, "sd15": 1}[profile]


# ------------------------------------------------------------------------------------ the other readers
def test_onetrainer_layer_skip_on_nai_and_pony(tmp_path):
    cfg = {"model_type": "STABLE_DIFFUSION_15", "training_method": "LORA", "base_model_name": NAI,
           "text_encoder_layer_skip": 1}
    r = check_file(write(tmp_path, "ot.json", json.dumps(cfg, indent=2)))
    assert (r.exit_code, r.profile, r.findings) == (0, "sd15-nai", [])
    # on SDXL OneTrainer counts from the penultimate layer: layer skip 1 is hidden_states[-3], not Pony's clip skip 2
    cfg = {"model_type": "STABLE_DIFFUSION_XL_10_BASE", "training_method": "LORA", "base_model_name": PONY,
           "text_encoder_layer_skip": 1}
    r = check_file(write(tmp_path, "ot2.json", json.dumps(cfg, indent=2)))
    assert (r.exit_code, r.profile) == (1, "sdxl-pony")
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert (f.setting, f.effective, f.profile, f.fix) == ("clip_l.encoder.layer", -3, "penultimate",
                                                          '"text_encoder_layer_skip": 0')
    assert f.source.startswith("official: Pony Diffusion V6 XL model card")


def test_kohya_gui_preset_on_a_nai_base(tmp_path):
    g = {"LoRA_type": "Standard", "pretrained_model_name_or_path": NAI, "clip_skip": 2}
    r = check_file(write(tmp_path, "lora.json", json.dumps(g, indent=2)))
    assert (r.exit_code, r.profile, r.findings) == (0, "sd15-nai", [])


def test_kohya_gui_preset_on_a_pony_base(tmp_path):
    g = {"LoRA_type": "Standard", "sdxl": True, "pretrained_model_name_or_path": PONY, "clip_skip": 2}
    r = check_file(write(tmp_path, "lora.json", json.dumps(g, indent=2)))
    assert (r.exit_code, r.profile) == (0, "sdxl-pony")
    assert [(f.kind, f.severity, f.setting) for f in r.findings] == [
        ("deviation", "info", "clip_g.tokenizer.pad_token"), ("note", "info", "clip_skip")]
    # sdxl-pony encodes as sdxl: te-align's hooks need no profile of their own for it
    assert r.findings[0].fix == "not settable: use `te-align patch`"


def test_a_trainer_without_clip_skip_is_told_on_a_nai_base(tmp_path):
    r = check_file("run.sh", command=["accelerate", "launch", "train_text_to_image_lora.py",
                                      "--pretrained_model_name_or_path", "/m/anything-v4.5.safetensors"])
    assert (r.exit_code, r.profile) == (1, "sd15-nai")
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert (f.setting, f.effective, f.profile) == ("clip_l.encoder.layer", "last", "penultimate")
    # the script cannot take the penultimate layer; te-align's hooks can, once told which base this is
    assert f.fix.endswith(" (with TE_ALIGN_PROFILE=sd15-nai in the environment: the hooks otherwise use sd15's recipe, "
                          "the architecture's)")


def test_ai_toolkit_on_a_nai_base_names_the_profile_for_its_hooks(tmp_path):
    text = ("job: extension\nconfig:\n  name: x\n  process:\n    - type: sd_trainer\n      model:\n"
            "        name_or_path: /m/anything-v4.5.safetensors\n")
    r = check_file(write(tmp_path, "a.yaml", text))
    assert (r.exit_code, r.profile, r.family_reason) == (1, "sd15-nai", "model.name_or_path '/m/anything-v4.5.safetensors'")
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert (f.setting, f.effective, f.profile, f.severity) == ("clip_l.encoder.layer", "last", "penultimate", "warning")
    assert f.fix == ("not settable: use `te-align patch` (with TE_ALIGN_PROFILE=sd15-nai in the environment: the hooks "
                     "otherwise use sd15's recipe, the architecture's)")
