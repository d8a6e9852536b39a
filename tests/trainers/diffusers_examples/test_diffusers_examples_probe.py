"""``te-align probe --trainer diffusers-examples`` / ``te-align matrix`` rows: the example scripts' own
``encode_prompt`` (imported from a diffusers checkout in ``TE_ALIGN_DIFFUSERS_EXAMPLES_DIR``) against
``te_align.encode`` on tiny models. Without the fix flags the documented deviations are measured (SD3's T5 at 77
tokens, FLUX.1 schnell at 512); with the flags ``te-align check`` gives, every output equals ``te_align.encode``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from te_align.probe import ProbeError

ENV = "TE_ALIGN_DIFFUSERS_EXAMPLES_DIR"
#: What the scripts import that the encode path needs (the rest is stood in for by the probe).
NEEDED = ("torch", "transformers", "diffusers", "accelerate", "peft", "huggingface_hub", "PIL", "numpy", "tqdm",
          "packaging")


def _checkout() -> str:
    root = os.environ.get(ENV)
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not root or missing:
        why = [f"{ENV} is not set (path of a huggingface/diffusers checkout)"] if not root else []
        why += [f"missing imports: {', '.join(missing)}"] if missing else []
        pytest.skip("; ".join(why))
    if not (Path(root) / "examples" / "dreambooth" / "train_dreambooth_lora_sd3.py").is_file():
        pytest.skip(f"{ENV}={root} has no examples/dreambooth/train_dreambooth_lora_sd3.py")
    return root


def test_no_checkout_is_one_clear_error(monkeypatch, tmp_path):
    from te_align.parts import adapter_for

    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ProbeError, match=f"give --path to a huggingface/diffusers checkout \\(or set {ENV}\\)"):
        adapter_for("diffusers-examples", None)
    with pytest.raises(ProbeError, match="is not a diffusers checkout"):
        adapter_for("diffusers", str(tmp_path))


def test_fix_flags_come_from_check():
    import te_align
    from te_align.trainers.diffusers_examples.probe import fix_flags

    assert fix_flags(te_align.profile("sd3-medium")) == ["--max_sequence_length", "256"]
    assert fix_flags(te_align.profile("flux-schnell")) == ["--max_sequence_length", "256"]
    assert fix_flags(te_align.profile("flux-dev")) == []
    assert fix_flags(te_align.profile("sdxl")) == []


@pytest.fixture(scope="module")
def matrix():
    from te_align.parts import run_matrix
    from te_align.probe.matrix import Found

    root = _checkout()
    return run_matrix(trainers=[Found("diffusers-examples", root, f"{ENV}={root}")],
                      profiles=["sd15", "sdxl", "sd3-medium", "flux-dev", "flux-schnell"])


def _rows(matrix):
    return {r.profile: r for r in matrix.rows}


def test_aligned_scripts_are_identical_as_they_are(matrix):
    rows = _rows(matrix)
    assert sorted(rows) == ["flux-dev", "flux-schnell", "sd15", "sd3-medium", "sdxl"]
    for name in ("sd15", "sdxl", "flux-dev"):
        plain = rows[name].plain.result
        assert plain is not None and plain.aligned, (name, rows[name].plain.text())
        assert all(t.identical for t in plain.tensors), name
    assert [t.name for t in rows["flux-dev"].plain.result.tensors] == ["prompt_embeds", "pooled_prompt_embeds",
                                                                       "text_ids"]


def test_sd3_t5_at_77_is_measured_and_the_flag_fixes_it(matrix):
    row = _rows(matrix)["sd3-medium"]
    plain = {t.name: t for t in row.plain.result.tensors}
    embeds = plain["prompt_embeds"]
    # tiny encoders: CLIP 77 + T5 77 tokens on the script's side, 77 + 256 in the profile; width 96 = tiny T5
    assert (embeds.trainer_shape, embeds.profile_shape, embeds.shape_match) == ((154, 96), (333, 96), False)
    assert embeds.compared == 15 and len(embeds.differing) == 15
    assert plain["pooled_prompt_embeds"].identical
    fixed = row.hooked.result
    assert fixed is not None and fixed.aligned and all(t.identical for t in fixed.tensors)
    assert any("--max_sequence_length 256" in n for n in fixed.notes)


def test_flux_schnell_at_512_is_measured_and_the_flag_fixes_it(matrix):
    row = _rows(matrix)["flux-schnell"]
    plain = {t.name: t for t in row.plain.result.tensors}
    assert (plain["prompt_embeds"].trainer_shape, plain["prompt_embeds"].profile_shape) == ((512, 96), (256, 96))
    assert (plain["text_ids"].trainer_shape, plain["text_ids"].profile_shape) == ((512, 3), (256, 3))
    assert plain["pooled_prompt_embeds"].identical
    assert row.hooked.result.aligned


def test_matrix_markdown_has_the_rows(matrix):
    text = matrix.markdown()
    assert "| diffusers-examples" in text and "| sd3-medium | **differs**" in text


def test_probe_cli_with_a_differing_shared_output(capsys):
    """A shared output (text_ids) that differs is listed by group; the CLI used to crash on it (ValueError)."""
    from te_align.cli import main

    root = _checkout()
    assert main(["probe", "--trainer", "diffusers-examples", "--path", root, "--profile", "flux-schnell"]) == 1
    out = capsys.readouterr().out
    assert "text_ids              (512, 3)       (256, 3)" in out
    assert "result: DIFFERS from the profile" in out


def test_matrix_finds_the_scripts_and_simpletuner_by_environment():
    from te_align.parts import find_trainers
    from te_align.probe.matrix import Found

    found, absent = find_trainers({ENV: "/d", "TE_ALIGN_SIMPLETUNER_DIR": "/s"})
    assert Found("diffusers-examples", "/d", f"{ENV}=/d") in found
    assert Found("simpletuner", "/s", "TE_ALIGN_SIMPLETUNER_DIR=/s") in found
    _, absent = find_trainers({})
    assert f"diffusers example scripts: {ENV} is not set (path of a huggingface/diffusers checkout)" in absent
