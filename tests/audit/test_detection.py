"""``te-align check`` works the model out from every signal a trainer's own config carries — local model folders and
checkpoints (their files, not only their names), ai-toolkit's schnell training adapter, sd-scripts' network module,
OneTrainer's model type, SimpleTuner's default flavour — and where no signal decides between two profiles of a family
it says which one it assumed and why, never a bare "aligned" on an assumption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from te_align.audit.models import assumption, guess_model, siblings
from te_align.checking import check_file
from te_align.cli import main
from tests.support.files import write_sparse_safetensors


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def flux_folder(tmp_path: Path, name: str, *, guidance: bool) -> str:
    """A diffusers FLUX.1 folder whose name says nothing: only its transformer config tells dev from schnell."""
    root = tmp_path / name
    (root / "transformer").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}), encoding="utf-8")
    (root / "transformer" / "config.json").write_text(json.dumps({"guidance_embeds": guidance}), encoding="utf-8")
    return str(root)


def flux_checkpoint(tmp_path: Path, name: str, *, guidance: bool) -> str:
    keys = {"double_blocks.0.img_attn.qkv.weight": (4, 4), "single_blocks.0.linear1.weight": (4, 4),
            "img_in.weight": (4, 4)}
    if guidance:
        keys["guidance_in.in_layer.weight"] = (4, 4)
    return str(write_sparse_safetensors(tmp_path / name, keys))


def notes(r):
    return [f.message for f in r.findings if f.kind == "note" and f.setting == "profile"]


# ------------------------------------------------------------------------------------ the shared pieces
def test_guess_model_reads_files_first_and_knows_when_a_name_decides(tmp_path):
    assert guess_model(flux_folder(tmp_path, "m1", guidance=False)) == (
        "flux-schnell", " (its files: model_index.json _class_name FluxPipeline; transformer/config.json "
                        "guidance_embeds false)", True)
    assert guess_model(flux_checkpoint(tmp_path, "ckpt.safetensors", guidance=True))[::2] == ("flux-dev", True)
    assert guess_model("black-forest-labs/FLUX.1-schnell") == ("flux-schnell", "", True)
    assert guess_model("black-forest-labs/FLUX.1-dev") == ("flux-dev", "", True)
    assert guess_model("/models/my_flux_finetune") == ("flux-dev", "", False)  # "flux" decides nothing
    assert guess_model("stabilityai/stable-diffusion-3.5-medium") == ("sd35-medium", "", True)
    assert guess_model("/m/sd_xl_base_1.0.safetensors") == ("sdxl", "", True)  # the base's name: not sdxl-pony
    assert guess_model("/no/such/thing") == (None, "", False)
    assert siblings("flux-dev") == ["flux-schnell"] and siblings("sdxl") == ["sdxl-pony"] and siblings("sd21") == []
    assert assumption("sd21") == "" and assumption("sdxl").startswith(
        "assumed sdxl (the architecture's own recipe): nothing in the config and the model's files names another base; "
        "if your base is Pony Diffusion V6 XL or a descendant") and assumption("flux-dev").startswith("flux-dev assumed: nothing in")


# ------------------------------------------------------------------------------------ sd-scripts
def test_kohya_local_checkpoint_files_decide_the_flux_variant(tmp_path):
    ckpt = flux_checkpoint(tmp_path, "model.safetensors", guidance=False)  # the name says nothing
    r = check_file(write(tmp_path, "a.toml", f'pretrained_model_name_or_path = "{ckpt}"\nt5xxl = "/m/t5.safetensors"\n'
                                             'ae = "/m/ae.safetensors"\nnetwork_module = "networks.lora_flux"\n'))
    assert (r.trainer, r.profile, r.assumed) == ("kohya", "flux-schnell", "")
    assert "(its files: double/single blocks without guidance_in" in r.family_reason
    r = check_file(write(tmp_path, "b.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\n'
                                             't5xxl = "/m/t5.safetensors"\nae = "/m/ae.safetensors"\n'))
    assert (r.profile, r.exit_code) == ("flux-dev", 0)
    assert r.assumed.startswith("flux-dev assumed: nothing in pretrained_model_name_or_path (its name or files) tells "
                                "it from flux-schnell")
    assert notes(r) == [r.assumed]


def test_kohya_network_module_names_the_architecture(tmp_path):
    r = check_file(write(tmp_path, "a.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\n'
                                             'network_module = "networks.lora_sd3"\n'))
    assert (r.trainer, r.profile) == ("kohya", "sd35-large")
    assert r.family_reason.startswith("network_module 'networks.lora_sd3'") and "encodes the same way" in r.assumed
    r = check_file(write(tmp_path, "b.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\n'
                                             'network_module = "networks.lora_lumina"\n'))
    assert (r.trainer, r.profile, r.assumed) == ("kohya", "lumina2", "")
    # sd-scripts and musubi-tuner share networks.lora_flux: pretrained_model_name_or_path says sd-scripts
    r = check_file(write(tmp_path, "c.toml", 'pretrained_model_name_or_path = "/m/flux1-dev.safetensors"\n'
                                             'network_module = "networks.lora_flux"\n'))
    assert (r.trainer, r.profile, r.assumed) == ("kohya", "flux-dev", "")


def test_text_output_says_the_assumption_instead_of_a_bare_aligned(tmp_path, capsys):
    path = write(tmp_path, "a.toml", 'pretrained_model_name_or_path = "/m/model.safetensors"\n'
                                     't5xxl = "/m/t5.safetensors"\nae = "/m/ae.safetensors"\n')
    assert main(["check", path]) == 0
    out = capsys.readouterr().out
    assert "aligned if the model is flux-dev (assumed, see the note)" in out and "flux-dev assumed" in out
    assert "aligned: " not in out
    # --profile removes the assumption
    assert main(["check", path, "--profile", "flux-schnell"]) == 0
    assert "assumed" not in capsys.readouterr().out


def test_json_carries_the_assumption(tmp_path, capsys):
    path = write(tmp_path, "a.toml", 't5xxl = "/m/t5.safetensors"\nae = "/m/ae.safetensors"\n')
    main(["check", path, "--json"])
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["assumed"].startswith("flux-dev assumed")


# ------------------------------------------------------------------------------------ ai-toolkit
def aitk(tmp_path: Path, model: dict) -> str:
    cfg = {"job": "extension", "config": {"name": "x", "process": [{"type": "sd_trainer", "model": model}]}}
    return write(tmp_path, "job.json", json.dumps(cfg))


@pytest.mark.parametrize("model", [
    {"arch": "flux", "name_or_path": "/models/base", "assistant_lora_path": "ostris/FLUX.1-schnell-training-adapter"},
    {"is_flux": True, "name_or_path": "/models/base", "assistant_lora_path": "/adapters/my_adapter.safetensors"},
])
def test_ai_toolkit_training_adapter_means_schnell(tmp_path, model):
    r = check_file(aitk(tmp_path, model))
    assert (r.trainer, r.profile, r.assumed) == ("ai-toolkit", "flux-schnell", "")
    assert "training adapter" in r.family_reason and "stable_diffusion_model.py:718-721" in r.family_reason


def test_ai_toolkit_local_folder_and_the_assumption(tmp_path):
    r = check_file(aitk(tmp_path, {"arch": "flux", "name_or_path": flux_folder(tmp_path, "base", guidance=False)}))
    assert (r.profile, r.assumed) == ("flux-schnell", "") and "guidance_embeds false" in r.family_reason
    r = check_file(aitk(tmp_path, {"arch": "flux", "name_or_path": "/models/base"}))
    assert r.profile == "flux-dev" and r.assumed.startswith("flux-dev assumed") and r.family_reason.endswith(
        "flux-dev assumed")
    r = check_file(aitk(tmp_path, {"arch": "flux", "name_or_path": "black-forest-labs/FLUX.1-dev"}))
    assert (r.profile, r.assumed) == ("flux-dev", "")


# ------------------------------------------------------------------------------------ OneTrainer
def test_onetrainer_model_type_then_the_base_model_files(tmp_path):
    base = flux_folder(tmp_path, "base", guidance=False)
    r = check_file(write(tmp_path, "ot.json", json.dumps({"model_type": "FLUX_DEV_1", "training_method": "LORA",
                                                          "base_model_name": base})))
    assert (r.profile, r.assumed) == ("flux-schnell", "") and "its files" in r.family_reason
    r = check_file(write(tmp_path, "ot2.json", json.dumps({"model_type": "FLUX_DEV_1", "training_method": "LORA",
                                                           "base_model_name": "/models/base"})))
    assert r.profile == "flux-dev" and r.assumed.startswith("flux-dev assumed")
    r = check_file(write(tmp_path, "ot3.json", json.dumps({"model_type": "STABLE_DIFFUSION_XL_10_BASE",
                                                           "training_method": "LORA", "base_model_name": "/m/x"})))
    # a name that matches nothing: the architecture's own recipe, assumed, naming the community base it could be
    assert r.profile == "sdxl" and r.assumed.startswith("assumed sdxl (the architecture's own recipe)")
    assert r.assumed.endswith("pass --profile sdxl-pony")


# ------------------------------------------------------------------------------------ SimpleTuner
def test_simpletuner_default_flavour_path_files_and_assumption(tmp_path):
    def st(cfg: dict):
        return check_file(write(tmp_path, "config.json", json.dumps(cfg)))

    r = st({"model_family": "flux", "model_type": "lora"})  # SimpleTuner loads its default flavour (Krea dev)
    assert (r.profile, r.assumed) == ("flux-dev", "") and "'krea' (SimpleTuner's default)" in r.family_reason
    r = st({"model_family": "sd3", "model_type": "lora"})
    assert (r.profile, r.assumed) == ("sd35-medium", "")
    r = st({"model_family": "flux", "pretrained_model_name_or_path": flux_folder(tmp_path, "b", guidance=False)})
    assert (r.profile, r.assumed) == ("flux-schnell", "")
    r = st({"model_family": "flux", "pretrained_model_name_or_path": "/models/base"})
    assert r.profile == "flux-dev" and r.assumed.startswith("flux-dev assumed")
    r = st({"model_family": "flux", "model_flavour": "schnell", "pretrained_model_name_or_path": "/models/base"})
    assert (r.profile, r.assumed) == ("flux-schnell", "")


# ------------------------------------------------------------------------------------ diffusers examples
def test_diffusers_examples_local_folder(tmp_path):
    folder = flux_folder(tmp_path, "base", guidance=False)
    r = check_file("<command line>", command=["accelerate", "launch", "train_dreambooth_lora_flux.py",
                                               "--pretrained_model_name_or_path", folder])
    assert (r.profile, r.assumed) == ("flux-schnell", "")
