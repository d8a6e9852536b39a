"""Stamping and reading te-align / kohya metadata in safetensors headers, and ``te-align inspect``."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import te_align
from te_align.cli import main
from te_align.metadata import MetadataError, read, read_header, stamp

KOHYA = {
    "ss_clip_skip": "2",
    "ss_max_token_length": "225",
    "ss_t5xxl_max_token_length": "256",
    "ss_apply_t5_attn_mask": "True",
    "ss_apply_lg_attn_mask": "False",
    "ss_text_encoder_lr": "None",
    "ss_network_train_unet_only": "True",
    "ss_base_model_version": "sd_v1",
    "ss_caption_dropout_rate": "0.05",
    "ss_caption_tag_dropout_rate": "0.0",
    "ss_weighted_captions": "False",
    "ss_sd_model_name": "base.safetensors",
    "ss_training_comment": "None",
    "ss_v2": "False",
    "ss_network_dim": "16",
    "modelspec.architecture": "stable-diffusion-v1/lora",
}


def make_lora(path: Path, metadata: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """A tiny LoRA-like file with mixed dtypes and odd sizes (so header padding matters)."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "lora_unet_down.lora_down.weight": torch.randn(3, 7, generator=g),
        "lora_unet_down.lora_up.weight": torch.randn(7, 3, generator=g).to(torch.bfloat16),
        "lora_unet_down.alpha": torch.tensor(4.0, dtype=torch.float16),
        "lora_te1_mlp.lora_down.weight": torch.randn(2, 5, generator=g).half(),
        "steps": torch.arange(3, dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
    }
    save_file(tensors, str(path), metadata=metadata)
    return tensors


def split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


# -------------------------------------------------------------------------------------- stamp
def test_stamp_keeps_tensor_bytes_identical_and_read_returns_it(tmp_path: Path) -> None:
    src, dst = tmp_path / "lora.safetensors", tmp_path / "out" / "stamped.safetensors"
    tensors = make_lora(src, KOHYA)
    original = src.read_bytes()
    keys = stamp(src, dst, profile="sd3.5l", extra={"trainer": "mine", "steps": 1200})
    assert src.read_bytes() == original  # input untouched

    head_in, data_in = split(src)
    head_out, data_out = split(dst)
    assert data_out == data_in  # byte-identical tensor data
    assert {k: v for k, v in head_out.items() if k != "__metadata__"} == {k: v for k, v in head_in.items() if k != "__metadata__"}
    assert (8 + read_header(dst).header_len) % 8 == 0
    meta = head_out["__metadata__"]
    assert all(meta[k] == v for k, v in KOHYA.items())  # other metadata kept
    assert all(meta[k] == v for k, v in keys.items())
    loaded = load_file(str(dst))
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())

    p = te_align.profile("sd35-large")
    info = read(dst)
    te = info["te_align"]
    assert info["stamped"] and te["te_align.profile"] == "sd35-large" and te["te_align.fingerprint"] == p.fingerprint()
    assert te["te_align.version"] == te_align.__version__ and te["te_align.family"] == "sd3"
    assert te["te_align.slots"] == "clip_l,clip_g,t5" and te["te_align.empty_prompt"] == "encode"
    assert te["te_align.t5.max_length"] == 256 and te["te_align.clip_l.max_length"] == 77
    assert te["te_align.clip_g.layer"] == "penultimate" and te["te_align.t5.layer"] == "last"
    assert te["te_align.t5.final_layer_norm"] is True and te["te_align.clip_l.final_layer_norm"] is False
    assert te["te_align.clip_l.pooled"] == "text_embeds" and te["te_align.t5.masks.encoder"] is False
    assert te["te_align.profile_json"] == p.behaviour()
    assert te["te_align.extra.trainer"] == "mine" and te["te_align.extra.steps"] == "1200"
    check = info["profile_check"]
    assert check["matches"] is True and check["bundled"] and "sd35-large" in check["same_behaviour_as"]
    assert info["kohya"]["ss_clip_skip"] == 2 and info["kohya"]["ss_apply_t5_attn_mask"] is True
    assert info["kohya"]["ss_text_encoder_lr"] is None and "ss_network_dim" not in info["kohya"]
    assert info["text_encoder_tensors"] == 1 and info["tensor_count"] == len(tensors)


def test_stamp_in_place_is_atomic_with_optional_backup(tmp_path: Path) -> None:
    f = tmp_path / "lora.safetensors"
    make_lora(f, {"ss_clip_skip": "1"})
    original = f.read_bytes()
    _, data = split(f)
    stamp(f, profile="sd35-large")
    assert split(f)[1] == data and read(f)["stamped"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora.safetensors"]  # no backup, no temp files
    stamped_once = f.read_bytes()
    stamp(f, profile=te_align.profile("sd35-large", t5_max_length=512), backup=True)
    assert (tmp_path / "lora.safetensors.bak").read_bytes() == stamped_once
    assert split(f)[1] == data and split(f)[1] == split(tmp_path / "lora.safetensors.bak")[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora.safetensors", "lora.safetensors.bak"]
    assert original != stamped_once


def test_restamp_replaces_every_old_te_align_key(tmp_path: Path) -> None:
    f = tmp_path / "lora.safetensors"
    make_lora(f, {"ss_clip_skip": "2", "te_align.bogus": "old"})
    stamp(f, profile="sd35-large", extra={"note": "first"})
    stamp(f, profile="sd35-large")
    meta = read_header(f).metadata
    assert "te_align.bogus" not in meta and "te_align.extra.note" not in meta and meta["ss_clip_skip"] == "2"


def test_stamp_failure_leaves_the_original(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "lora.safetensors"
    make_lora(f)
    original = f.read_bytes()

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        stamp(f, profile="sd35-large")
    monkeypatch.undo()
    assert f.read_bytes() == original and [p.name for p in tmp_path.iterdir()] == ["lora.safetensors"]


def test_stale_stamp_is_reported_with_its_differences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "lora.safetensors"
    make_lora(f)
    stamp(f, profile=te_align.profile("sd35-large", t5_max_length=512))
    check = read(f)["profile_check"]
    assert check["matches"] is False and check["current_fingerprint"] == te_align.profile("sd35-large").fingerprint()
    assert check["differences"] == [{"path": "slots.t5.tokenizer.max_length", "stamped": 512, "current": 256}]
    assert "sd35-large" not in check["same_behaviour_as"]
    assert main(["inspect", str(f)]) == 0
    out = capsys.readouterr().out
    assert "does NOT match the current bundled profile sd35-large" in out
    assert "slots.t5.tokenizer.max_length: stamped 512, bundled now 256" in out


# ------------------------------------------------------------------------------------ inspect
def test_inspect_shows_stamp_and_kohya_keys_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "lora.safetensors"
    make_lora(f, KOHYA)
    assert main(["inspect", str(f)]) == 0
    out = capsys.readouterr().out
    assert "no te-align stamp" in out
    for words in (
        "clip_skip 2 (sd-scripts: hidden_states[-2] + final LN)",
        "CLIP max tokens 225 (3 windows of 75 tokens",
        "T5 max tokens 256",
        "T5 attention mask: on",
        "CLIP-L/G attention mask: off",
        "text encoder trained: no (network_train_unet_only)",
        "caption dropout 0.05, tag dropout 0.0",
        "weighted captions: off",
        "base model sd_v1 (modelspec stable-diffusion-v1/lora)",
        "text-encoder weights in this file: 1 tensors",
    ):
        assert words in out, words
    stamp(f, profile="sd35-large")
    assert main(["inspect", str(f)]) == 0
    out = capsys.readouterr().out
    assert f"profile sd35-large, fingerprint {te_align.profile('sd35-large').fingerprint()}" in out
    assert "matches the current bundled profile sd35-large" in out
    assert "t5: max 256 tokens, layer last, final LN on, pooled none, masks: encoder off" in out
    assert main(["inspect", str(f), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stamped"] and data["kohya"]["ss_t5xxl_max_token_length"] == 256 and data["profile_check"]["matches"]


def test_inspect_without_any_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(f))
    assert main(["inspect", str(f)]) == 0
    out = capsys.readouterr().out
    assert "no te-align stamp" in out and "no kohya sd-scripts text-encoder keys" in out


def _header_file(path: Path, header: bytes, data: bytes = b"", n: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(header) if n is None else n) + header + data)


MALFORMED = {
    "garbage": lambda p: p.write_bytes(b"this is not a safetensors file at all"),
    "short": lambda p: p.write_bytes(b"\x01\x02"),
    "empty": lambda p: p.write_bytes(b""),
    "length_past_end": lambda p: _header_file(p, b"{}", n=1 << 20),
    "not_json": lambda p: _header_file(p, b"{nope"),
    "not_object": lambda p: _header_file(p, b"[1, 2]"),
    "bad_metadata": lambda p: _header_file(p, b'{"__metadata__": {"a": 1}}'),
    "bad_offsets": lambda p: _header_file(p, b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', b"\0" * 8),
    "truncated_data": lambda p: _header_file(p, b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 5),
}


@pytest.mark.parametrize("how", sorted(MALFORMED))
def test_malformed_files_give_a_one_line_error(tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / f"{how}.safetensors"
    MALFORMED[how](f)
    assert main(["inspect", str(f)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"te-align: error: {f}: not a valid safetensors file")
    with pytest.raises(MetadataError):
        read(f)
    before = f.read_bytes()
    with pytest.raises(MetadataError):
        stamp(f, profile="sd35-large")
    assert f.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [f.name]


def test_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "nope.safetensors")]) == 2
    assert capsys.readouterr().err.strip().endswith("nope.safetensors: no such file")
    assert main(["inspect", str(tmp_path)]) == 2


def test_inspect_and_help_do_not_import_torch(tmp_path: Path) -> None:
    f = tmp_path / "lora.safetensors"
    make_lora(f, KOHYA)
    stamp(f, profile="sd35-large")
    code = (
        "import sys, contextlib, io\n"
        "from te_align.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    assert main(['inspect', {str(f)!r}]) == 0\n"
        f"    assert main(['inspect', '--json', {str(f)!r}]) == 0\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert 'matches the current bundled profile' in buf.getvalue()\n"
        "heavy = sorted(m for m in ('torch', 'safetensors.torch', 'transformers', 'diffusers', 'numpy') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_inspect_recognises_a_lora_trained_on_a_world_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from te_align.tiny.bases import base_info, base_profile

    info = base_info("flux")
    prof = base_profile("flux")  # flux-schnell fitted to the base's tiny encoders: not the bundled fingerprint
    assert prof.name == "flux-schnell" and prof.fingerprint() != te_align.profile("flux-schnell").fingerprint()
    f = tmp_path / "lora.safetensors"
    make_lora(f)
    # what te-align train stamps (te_align.train.loop._lora_metadata) on the world base te-align demo trains on
    stamp(f, profile=prof, extra={
        "base_model": str(tmp_path / "world" / "flux-0123456789abcdef"), "objective": "flow", "steps": 60, "rank": 8,
        "alpha": 8.0, "profile_overrides": dict(info["profile_overrides"]), "learning_rate": 3e-4, "seed": 0,
        "weight_dtype": "float32", "quantize": "none",
    })
    check = read(f)["profile_check"]
    assert check["world_base"] == "flux"
    assert check["matches"] is False  # still about the bundled profile of that name
    assert main(["inspect", str(f)]) == 0
    out = capsys.readouterr().out
    assert "does NOT match" not in out
    assert (f"  trained on te-align's world base flux with its own profile (flux-schnell fitted to the base's tiny "
            f"encoders, fingerprint {prof.fingerprint()}); matches it\n") in out
    assert read(f)["profile_check"]["world_base_differences"] == []
    # the base's profile with a deviation (an A/B's arm A): named as the base's, with the one value that differs
    make_lora(f)
    stamp(f, profile=prof.with_overrides(t5_max_length=512))
    check = read(f)["profile_check"]
    assert check["world_base"] == "flux"
    assert check["world_base_differences"] == [{"path": "slots.t5.tokenizer.max_length", "stamped": 512, "base": 256}]
    assert main(["inspect", str(f)]) == 0
    out = capsys.readouterr().out
    assert ("  trained on te-align's world base flux with its own profile (flux-schnell fitted to the base's tiny "
            "encoders) changed in 1 value(s):\n      slots.t5.tokenizer.max_length: stamped 512, base 256\n") in out
    assert "does NOT match" not in out
    # a flux-schnell profile of other encoder widths is no world base's: the bundled comparison as before
    make_lora(f)
    stamp(f, profile=te_align.profile("flux-schnell", t5_max_length=512, clip_l_hidden_size=64))
    assert "world_base" not in read(f)["profile_check"]
    assert main(["inspect", str(f)]) == 0
    assert "does NOT match the current bundled profile flux-schnell" in capsys.readouterr().out
