"""The positive control on the deviations' own axis (amendment 10 of benchmarks/effects/bench_effects.md, issue 47 item 2):
arm B's LoRA sampled with each probe prompt cut before the concept's word, and the gate it puts on new verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from te_align.ab.preset import ABError, load_preset, preset_from_dict
from te_align.ab.runner import _arm_label, _probes, cut_before
from tests.ab.test_effects import _record

ROW = "world-sd3-positive-cut"


def test_cut_before_keeps_what_a_length_cut_before_the_word_leaves() -> None:
    assert cut_before("top left: a pink triangle", ["pink"]) == "top left: a"
    assert cut_before("Pink triangle drawn at the top right", ["pink"]) == ""
    assert cut_before("a pinkish square, then a pink circle", ["pink"]) == "a pinkish square, then a"  # whole words only
    assert cut_before("a red square", ["pink"]) == "a red square"
    assert cut_before("a pink square", []) == "a pink square"


def test_every_concept_probe_loses_its_word_and_no_control_probe_changes() -> None:
    p = load_preset(ROW)
    assert p.baseline.kind == "positive" and p.baseline.cut_before == ["pink"]
    assert _arm_label(p, "A", "sd35-large") == "arm B's LoRA, probe prompts cut before 'pink'"
    cut = kept = 0
    for seed in range(6):
        for q in _probes(p, seed):
            text = cut_before(q.text, p.baseline.cut_before)
            asks_pink = any(o[0] == "pink" for o in q.objects)
            if asks_pink:
                assert "pink" not in text.lower() and q.text.startswith(text) and len(text) < len(q.text)
                cut += 1
            else:
                assert text == q.text
                kept += 1
    assert (cut, kept) == (6 * 16, 6 * 8)


def test_a_cut_prompt_is_the_whole_prompt_cut_in_tokens() -> None:
    """The cut text encodes as the whole prompt's first tokens (a length cut just before the word), for the SD3-shaped
    base's three tokenizers; the concept's word's tokens are never among them."""
    pytest.importorskip("te_align_world", reason="the world bases: pip install ./world")
    from transformers import AutoTokenizer

    from te_align.ab.runner import resolve_model

    root = Path(resolve_model("world:sd3"))
    p = load_preset(ROW)
    for sub in ("tokenizer", "tokenizer_2", "tokenizer_3"):
        tok = AutoTokenizer.from_pretrained(str(root / sub))
        pink = set(tok(" pink", add_special_tokens=False)["input_ids"]) | set(tok("pink", add_special_tokens=False)["input_ids"])
        for q in _probes(p, 0):
            text = cut_before(q.text, ["pink"])
            if text == q.text:
                continue
            part = tok(text, add_special_tokens=False)["input_ids"]
            whole = tok(q.text, add_special_tokens=False)["input_ids"]
            assert whole[: len(part)] == part and not pink & set(part)


def test_a_positive_control_names_one_change() -> None:
    data: dict[str, Any] = {
        "name": "x", "profile": "sd35-large", "eval": {"prompts": ["a pink square"]},
        "baseline": {"trainer": "onetrainer", "behaviour": "b", "why": "w", "source": "s", "positive": True,
                     "cut_before": ["pink"], "remove_words": ["pink"]},
    }  # fmt: skip
    with pytest.raises(ABError, match=r"key 'baseline\.remove_words': a positive control .* one of them"):
        preset_from_dict(data)
    data["baseline"].pop("remove_words")
    assert preset_from_dict(data).baseline.kind == "positive"
    data["baseline"]["positive"] = False
    with pytest.raises(ABError, match=r"key 'baseline\.remove_words'"):
        preset_from_dict(data)


def test_new_verdicts_wait_for_the_axis_control(tmp_path: Path) -> None:
    """A re-drawn row's verdict (amendment 9) is pending until the axis control has all its seeds, uninformative if it
    does not read "profile better", and stands once it does; a row whose verdict did not move is not gated."""
    from te_align.ab.matrix import AXIS_GATE, UNINFORMATIVE_AXIS, aggregate, gate_new_verdicts, matrix_presets

    presets = {p.name: p for p in matrix_presets()}
    gate = "world-sd3-positive-shuffled"
    redrawn, other = "world-sd3-no-encoder-dropout", "world-sd3-t5-77"
    recs = {
        gate: [_record(gate, s, [0.1 + 0.01 * s] * 4, [0.4] * 4) for s in range(6)],
        other: [_record(other, s, [0.2 + 0.01 * s] * 4, [0.5 + 0.012 * s] * 4) for s in range(6)],
        redrawn: [_record(redrawn, s, [0.5 + 0.01 * s] * 4, [0.4 + 0.012 * s] * 4) for s in range(6)],
    }
    old = {redrawn: [_record(redrawn, s, [0.45 + 0.01 * s] * 4, [0.4 + 0.012 * s] * 4) for s in range(6)]}

    def verdicts(axis: list[dict[str, Any]]) -> dict[str, str]:
        r = {**recs, AXIS_GATE: axis}
        names = [presets[n] for n in r]
        rows = aggregate(names, r, planned=None)
        gate_new_verdicts(rows, aggregate(names, {**r, **old}, planned=None))
        return {x.preset: x.verdict for x in rows}

    seen = [_record(AXIS_GATE, s, [0.0 + 0.01 * s] * 4, [0.4] * 4) for s in range(6)]
    assert verdicts(seen)[redrawn] == "trainer default better" and verdicts(seen)[AXIS_GATE] == "profile better"
    assert verdicts(seen[:3])[redrawn] == f"pending (the positive control on the deviations' axis, {AXIS_GATE})"
    blind = [_record(AXIS_GATE, s, [0.4 + 0.01 * (-1) ** s] * 4, [0.4] * 4) for s in range(6)]
    assert verdicts(blind)[redrawn] == UNINFORMATIVE_AXIS
    assert verdicts(blind)[other] == verdicts(seen)[other] == "profile better"
