"""`te-align comfyui install | status | uninstall` on a stand-in ComfyUI tree (CI has no checkout), and the
profile a LoRA names (te_align.* stamp, kohya keys, fallback) — the parts of the ComfyUI integration that need
no ComfyUI."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import te_align
from te_align.cli import main
from te_align.errors import TeAlignError
from te_align.integrations.comfyui.install import LOADER, LOADER_SOURCE, MARKERS
from te_align.integrations.lora import profile_from_lora
from te_align.metadata import stamp_keys


def _tree(root: Path) -> Path:
    for m in MARKERS:
        p = root / m
        if m == "custom_nodes":
            p.mkdir(parents=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"# {m}\n")
    (root / "comfyui_version.py").write_text('__version__ = "0.12.1"\n')
    (root / "custom_nodes" / "other_node").mkdir()
    (root / "custom_nodes" / "other_node" / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    return root


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>"
    return out


def test_install_status_uninstall_byte_identical(tmp_path, capsys):
    root = _tree(tmp_path / "ComfyUI")
    before = _snapshot(root)
    assert main(["comfyui", "install", str(root)]) == 0
    assert (root / LOADER).read_bytes() == LOADER_SOURCE
    assert "installed; restart ComfyUI" in capsys.readouterr().out
    assert main(["comfyui", "install", str(root)]) == 0
    assert "already installed: nothing to do" in capsys.readouterr().out
    assert main(["comfyui", "status", str(root)]) == 0
    assert f"intact   {LOADER}" in capsys.readouterr().out
    assert main(["comfyui", "uninstall", str(root)]) == 0
    assert _snapshot(root) == before
    assert main(["comfyui", "status", str(root)]) == 1


def test_dry_run_changes_nothing(tmp_path, capsys):
    root = _tree(tmp_path / "ComfyUI")
    before = _snapshot(root)
    assert main(["comfyui", "install", str(root), "--dry-run"]) == 0
    assert "dry run: nothing changed" in capsys.readouterr().out
    assert _snapshot(root) == before


def test_refuses_a_tree_that_is_not_comfyui(tmp_path, capsys):
    (tmp_path / "main.py").write_text("")
    before = _snapshot(tmp_path)
    assert main(["comfyui", "install", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"te-align: error: {tmp_path} is not a ComfyUI checkout (no nodes.py, comfy/sd.py" in err
    assert _snapshot(tmp_path) == before


def test_refuses_a_foreign_te_align_folder(tmp_path, capsys):
    root = _tree(tmp_path / "ComfyUI")
    (root / "custom_nodes" / "te-align").mkdir()
    (root / LOADER).write_text("# someone else's\n")
    before = _snapshot(root)
    assert main(["comfyui", "install", str(root)]) == 2
    assert "exists and was not written by te-align: move it away" in capsys.readouterr().err
    assert _snapshot(root) == before


def test_loader_loads_the_nodes(tmp_path):
    ns: dict = {}
    exec(compile(LOADER_SOURCE, "loader", "exec"), ns)
    assert set(ns["NODE_CLASS_MAPPINGS"]) == {"TeAlignTextEncode", "TeAlignEmptyNegative"}
    assert ns["NODE_DISPLAY_NAME_MAPPINGS"]["TeAlignTextEncode"] == "te-align Text Encode"


# ------------------------------------------------------------------------------------- profile from a LoRA
def _lora(path: Path, meta: dict[str, str]) -> Path:
    save_file({"lora_unet_x.lora_down.weight": torch.zeros(2, 2)}, str(path), metadata=meta)
    return path


def test_profile_from_a_te_align_stamp(tmp_path):
    p = te_align.profile("flux-schnell")
    found = profile_from_lora(_lora(tmp_path / "a.safetensors", stamp_keys(p)))
    assert found.source == "te_align" and found.profile.fingerprint() == p.fingerprint()
    assert found.message == "a.safetensors: profile flux-schnell (te_align.* metadata)"
    changed = p.with_overrides({"t5_max_length": 512})
    found = profile_from_lora(_lora(tmp_path / "b.safetensors", stamp_keys(changed)))
    assert found.profile.fingerprint() == changed.fingerprint()
    assert found.overrides == {"slots.t5.tokenizer.max_length": 512}


def test_profile_from_kohya_keys(tmp_path):
    meta = {"modelspec.architecture": "flux-1-dev/lora", "ss_base_model_version": "flux1",
            "ss_apply_t5_attn_mask": "True", "ss_t5xxl_max_token_length": "256"}
    found = profile_from_lora(_lora(tmp_path / "k.safetensors", meta))
    assert found.source == "kohya" and found.profile.name == "flux-dev"
    t5 = found.profile.slot("t5")
    assert (t5.tokenizer.max_length, t5.masks.encoder, t5.masks.denoiser) == (256, True, True)
    sd = profile_from_lora(_lora(tmp_path / "s.safetensors", {"ss_base_model_version": "sd_v1", "ss_clip_skip": "2"}))
    assert sd.profile.name == "sd15"
    assert (sd.profile.slot("clip_l").encoder.layer, sd.profile.slot("clip_l").encoder.final_layer_norm) == (-2, True)
    assert profile_from_lora(_lora(tmp_path / "x.safetensors", {"modelspec.architecture": "stable-diffusion-3.5-large/lora"})
                             ).profile.name == "sd35-large"


def test_no_metadata_falls_back_or_asks(tmp_path):
    path = _lora(tmp_path / "plain.safetensors", {})
    found = profile_from_lora(path, fallback="sdxl")
    assert found.fell_back and found.profile.name == "sdxl"
    assert found.message == ("plain.safetensors has no te_align.* metadata and no kohya model keys: using profile sdxl "
                             "(pick another if it was trained differently)")
    with pytest.raises(TeAlignError, match=r"plain\.safetensors has no te_align\.\* metadata and no kohya keys that name its model"):
        profile_from_lora(path)
