"""The shipped examples stay valid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import te_align

ROOT = Path(__file__).resolve().parents[2]


def test_custom_profile_example_loads_and_differs_only_in_t5_length():
    p = te_align.profile(str(ROOT / "examples" / "flux-schnell-t5-512.toml"))
    base = te_align.profile("flux-schnell")
    assert p.name == "flux-schnell-t5-512"
    diff = {k for k, v in p.behaviour().items() if base.behaviour()[k] != v}
    assert diff == {"slots.t5.tokenizer.max_length"}
    assert p.slot("t5").tokenizer.max_length == 512
    assert p.provenance_of("slots.t5.tokenizer.max_length").status == "override"


def test_encode_example_parses_its_arguments():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "encode_prompts.py"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--profile" in out and "--stamp" in out
