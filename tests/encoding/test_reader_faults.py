"""Readers under hostile input: ``inspect`` on odd paths (a FIFO must not hang) and crafted metadata
(control characters escaped, deep nesting one line), ``cache info/clear`` on odd folders and caches
written with overrides, and ``te_align.encode`` with inputs of the wrong type."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import te_align
from te_align.cli import main
from te_align.encoding import encode
from te_align.encoding.cache.store import EmbeddingCache
from te_align.errors import EncodingError
from tests.encoding.test_cache import encode_captions
from tests.encoding.test_encode import sd35

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err.strip()


# -------------------------------------------------------------------------------------------- inspect
def test_inspect_odd_paths_are_one_line_and_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.safetensors"
    loop.symlink_to(loop)
    cases = {fifo: "is a named pipe (FIFO)", loop: "symlink loop", tmp_path: "is a folder",
             tmp_path / "nope.safetensors": "no such file", tmp_path / "nope.safetensors" / "x": "no such file"}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for path, needle in cases.items():  # a child process with a timeout: the old reader blocked forever on the FIFO
        out = subprocess.run([sys.executable, "-m", "te_align", "inspect", str(path)], capture_output=True, text=True,
                             env=env, timeout=60)  # fmt: skip
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and needle in out.stderr, (path, out.stderr)


def _with_metadata(path: Path, meta: dict[str, str]) -> Path:
    save_file({"lora_unet_a.lora_down.weight": torch.zeros(2, 2)}, str(path), metadata=meta)
    return path


def test_inspect_escapes_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evil = "\x1b[2J\x1b]0;owned\x07line\rback\u202etxt.exe"
    f = _with_metadata(tmp_path / "x.safetensors", {"ss_training_comment": evil, "ss_sd_model_name": "a\nb"})
    code, out, _ = run(capsys, "inspect", str(f))
    assert code == 0
    assert not any(c in out for c in "\x1b\x07\r\u202e")
    assert "training comment: \\x1b[2J\\x1b]0;owned\\x07line\\x0dback\\u202etxt.exe" in out
    assert "trained on a\\x0ab" in out
    code, out, _ = run(capsys, "inspect", str(f), "--json")
    assert code == 0 and "\u202e" not in out and "\x1b" not in out
    assert json.loads(out)["kohya"]["ss_training_comment"] == evil  # still valid JSON with the exact value


def test_inspect_deeply_nested_metadata_and_headers_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    f = _with_metadata(tmp_path / "a.safetensors", {"te_align.profile_json": deep, "te_align.fingerprint": "x"})
    code, _, err = run(capsys, "inspect", str(f))
    assert code == 2 and "nested too deeply" in err and "\n" not in err
    f = _with_metadata(tmp_path / "b.safetensors", {"ss_clip_skip": deep})
    code, _, err = run(capsys, "inspect", str(f))
    assert code == 2 and "nested too deeply" in err and "\n" not in err
    body = ('{"t":{"dtype":"F32","shape":' + "[" * 50_000 + "]" * 50_000 + ',"data_offsets":[0,0]}}').encode()
    (tmp_path / "c.safetensors").write_bytes(struct.pack("<Q", len(body)) + body)
    code, _, err = run(capsys, "inspect", str(tmp_path / "c.safetensors"))
    assert code == 2 and "nested too deeply" in err and "\n" not in err


# ---------------------------------------------------------------------------------------------- cache
def test_cache_info_tells_an_overridden_profile_from_a_stale_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    over = te_align.profile("sd35-large", t5_max_length=77)
    cache = EmbeddingCache(tmp_path / "c", over, "te-hash", {})
    cond = encode_captions(["a cat"], fp=over.fingerprint())
    cache.put("a cat", cond)
    code, out, _ = run(capsys, "cache", "info", str(tmp_path / "c"))
    assert code == 0 and "overridden profile: slots.t5.tokenizer.max_length" in out and "stale" not in out
    code, out, _ = run(capsys, "cache", "info", str(tmp_path / "c"), "--json")
    assert json.loads(out)["profiles"][0]["overrides"] == ["slots.t5.tokenizer.max_length"]


def test_cache_odd_folders_and_deep_headers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, _, err = run(capsys, "cache", "info", str(loop))
    assert code == 2 and "symlink loop" in err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "cache", "info", str(fifo))
    assert code == 2 and "named pipe" in err
    cache = EmbeddingCache(tmp_path / "c", "sd35-large", "te-hash", {})
    path = cache.put("a cat", encode_captions(["a cat"]))
    body = ('{"t":{"dtype":"F32","shape":' + "[" * 50_000 + "]" * 50_000 + ',"data_offsets":[0,0]}}').encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body)
    code, out, _ = run(capsys, "cache", "info", str(tmp_path / "c"))
    assert code == 0 and "corrupt files: 1" in out
    assert cache.get("a cat") is None and cache.stats.corrupt == 1


# --------------------------------------------------------------------------------------------- encode
def test_encode_rejects_wrong_input_types_with_encoding_error() -> None:
    pipe, p = sd35()
    cases = [
        ({"prompts": None}, "got NoneType"),
        ({"prompts": [None]}, "prompt 0 is NoneType"),
        ({"prompts": b"bytes"}, "got bytes"),
        ({"prompts": ["ok", "lone \ud800 surrogate"]}, r"prompt 1 is not valid Unicode text: a lone surrogate U\+D800"),
        ({"prompts": ["a"], "tokenizers": [pipe.tokenizer], "text_encoders": {"clip_l": pipe.text_encoder}},
         "tokenizers must be a dict"),
        ({"prompts": ["a"], "tokenizers": {"clip_l": pipe.tokenizer, "clip_g": pipe.tokenizer_2, "t5": pipe.tokenizer_3},
          "text_encoders": "not a dict"}, "text encoders must be a dict"),
        ({"prompts": ["a"], "tokenizers": {"clip_l": pipe.tokenizer, "clip_g": pipe.tokenizer_2, "t5": pipe.tokenizer_3},
          "text_encoders": {"clip_l": "model.bin", "clip_g": pipe.text_encoder_2, "t5": pipe.text_encoder_3}},
         "the text encoder is a str, not a torch module"),
        ({"prompts": ["a"], "drop": 1}, "drop must be a list"),
        ({"prompts": ["a"], "drop_slots": ["t5"]}, "drop_slots must map"),
    ]  # fmt: skip
    for kwargs, needle in cases:
        if "tokenizers" not in kwargs:
            kwargs["pipeline"] = pipe
        with pytest.raises(EncodingError, match=needle):
            encode(p, **kwargs)  # type: ignore[arg-type]
    assert encode(p, ("a", "b"), pipeline=pipe)["prompt_embeds"].shape[0] == 2  # tuples and other sequences still work


# -------------------------------------------------------------------------------------------------- ab
@pytest.mark.parametrize("seeds", ["0", "-2"])
def test_ab_run_and_demo_reject_zero_and_negative_seeds(seeds: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["ab", "run", "tiny-demo", "--model", str(tmp_path), "--data", str(tmp_path), "--out", str(tmp_path / "o"),
                  "--seeds", seeds], ["demo", "--out", str(tmp_path / "d"), "--seeds", seeds]):  # fmt: skip
        code, _, err = run(capsys, *argv)
        assert code == 2 and err == f"te-align: error: key '--seeds': must be >= 1, got {seeds}"
    assert not (tmp_path / "o").exists() and not (tmp_path / "d").exists()
