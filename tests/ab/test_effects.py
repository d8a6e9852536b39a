"""The effects matrix: statistics, probe prompts, the new kinds of row, the plan hash, per-seed results, the table,
`check`'s evidence lines, ComfyUI's batching of a prompt with its negative, and the demo on a shipped base."""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from te_align import _toml as tomllib
from te_align.ab.preset import ABError, load_preset, preset_from_dict, presets_root
from te_align.ab.stats import holm, sd_ratio_interval, sign_flip_p, t_two_sided_p

WORLD = presets_root() / "world"
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "effects" / "results"


# ------------------------------------------------------------------------------------------ stats
def test_t_p_values_match_the_table() -> None:
    # t(0.975, df) from the table gives p = 0.05 two-sided
    assert t_two_sided_p(2.571, 5) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(12.706, 1) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(2.042, 30) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(0.0, 5) == 1.0
    assert t_two_sided_p(-2.571, 5) == t_two_sided_p(2.571, 5)
    # df = 1 is the Cauchy: P(|T| >= 1) = 1/2
    assert t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)


def test_sign_flip_is_exact() -> None:
    assert sign_flip_p([1.0] * 6) == 2 / 64  # its floor with 6 seeds
    assert sign_flip_p([1.0, -1.0] * 3) == 1.0
    # 3 positive of 3: only the all-plus and all-minus patterns reach |sum| = 3 + 2 + 1
    assert sign_flip_p([3.0, 2.0, 1.0]) == 2 / 8
    # |sum| >= 2 for (1, 1, -0): patterns with the two ones of equal sign: 4 of 8
    assert sign_flip_p([1.0, 1.0, 0.0]) == 4 / 8
    with pytest.raises(ValueError):
        sign_flip_p([1.0] * 21)


def test_holm_adjusts_in_order_and_keeps_nan() -> None:
    assert holm([0.01, 0.04, 0.03, math.nan])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm([0.01, math.nan])[1])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_degenerate_differences_get_no_interval_p_or_verdict() -> None:
    from te_align.ab.stats import NO_VERDICT, Metric, paired

    acc = Metric("false concept readings", higher_better=False)
    # issue 47's demo: -0.125 on both seeds, once reported as -0.125 [-0.125, -0.125]: trainer default better
    two = paired(acc, [0.0, 0.125], [0.125, 0.25])
    assert two.diffs == (-0.125, -0.125) and two.degenerate
    assert math.isnan(two.p_t) and all(math.isnan(v) for v in two.interval) and two.verdict == NO_VERDICT
    assert two.p_signflip == 2 / 4  # the exact test is still defined: 2 of 4 sign patterns reach |sum| 0.25
    assert paired(acc, [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]).verdict == NO_VERDICT  # all zero: no spread either
    assert paired(acc, [1.0], [0.0]).verdict == NO_VERDICT


def test_holm_multipliers_give_the_level_each_row_was_tested_at() -> None:
    from te_align.ab.stats import holm_multipliers, t_interval, t_quantile_at

    # sorted 0.01 (x3), 0.03 (x2), 0.04 (x1, but the running max 0.06 makes it 1.5)
    assert holm_multipliers([0.01, 0.04, 0.03, math.nan])[:3] == pytest.approx([3.0, 1.5, 2.0])
    assert math.isnan(holm_multipliers([0.01, math.nan])[1])
    assert t_quantile_at(0.05, 5) == pytest.approx(2.5706, abs=1e-4)  # the table's 2.571
    assert t_quantile_at(0.025, 5) == pytest.approx(3.1634, abs=1e-4)
    assert t_quantile_at(0.4, 5) == pytest.approx(0.9195, abs=1e-4)  # t(0.80, 5)
    diffs = [0.1, 0.2, 0.3, 0.4]
    half = t_quantile_at(0.05 / 3, 3) * statistics.stdev(diffs) / 2
    assert t_interval(diffs, 0.05 / 3) == pytest.approx((0.25 - half, 0.25 + half))
    assert all(math.isnan(v) for v in t_interval([0.1, 0.1], 0.05))


def test_smallest_detectable_effect_from_the_null_spread() -> None:
    from te_align.ab.stats import smallest_detectable

    # (t(0.975, 5) + t(0.80, 5)) x s / sqrt(6) = (2.5706 + 0.9195) x 0.05 / 2.4495
    assert smallest_detectable(0.05, 6, 0.05) == pytest.approx(3.4901 * 0.05 / math.sqrt(6), abs=1e-4)
    assert smallest_detectable(0.05, 6, 0.05 / 13) > smallest_detectable(0.05, 6, 0.05)
    assert math.isnan(smallest_detectable(0.05, 1, 0.05)) and math.isnan(smallest_detectable(math.nan, 6, 0.05))


def test_sd_ratio_interval_is_deterministic_and_brackets_the_ratio() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    ratio, lo, hi = sd_ratio_interval(a, b)
    assert ratio == pytest.approx(2.0) and (lo, hi) == pytest.approx((2.0, 2.0))  # a is exactly 2 b + c
    r2 = sd_ratio_interval([0.1, 0.5, 0.2, 0.9, 0.3, 0.4], [0.2, 0.1, 0.3, 0.2, 0.25, 0.15])
    assert r2 == sd_ratio_interval([0.1, 0.5, 0.2, 0.9, 0.3, 0.4], [0.2, 0.1, 0.3, 0.2, 0.25, 0.15])
    assert r2[1] <= r2[0] <= r2[2]
    assert all(math.isnan(v) for v in sd_ratio_interval([1.0, 2.0], [1.0, 3.0]))


# ---------------------------------------------------------------------------------- probe prompts
def test_probe_prompts_are_reproducible_and_new_in_wording() -> None:
    from te_align.tiny.world import make_dataset
    from te_align.tiny.world.phrasings import FRAMES, probe_prompts

    kw: dict[str, Any] = {"colour": "pink", "shapes": ["triangle"], "lengths": [("short", 10), ("long", 3), ("very long", 3)]}
    ps = probe_prompts(3, **kw)
    assert [p.text for p in ps] == [p.text for p in probe_prompts(3, **kw)]
    assert [p.text for p in ps] != [p.text for p in probe_prompts(4, **kw)]
    assert [p.length for p in ps] == ["short"] * 10 + ["long"] * 3 + ["very long"] * 3
    assert all(p.objects[0][:2] == ("pink", "triangle") and p.objects[0][3] for p in ps)
    # no caption of the grammar is written in any frame: each frame as a pattern over the world's words never matches
    from te_align.tiny.world import COLOURS, POSITIONS, SHAPES

    captions = [s.caption.lower() for s in make_dataset(800, 11, image_size=None, tokenizer=False)]
    words = {"pos": "(?:" + "|".join(POSITIONS) + ")", "a": "(?:a|an)",
             "desc": "(?:(?:small|large) )?(?:outlined )?(?:" + "|".join(COLOURS) + ") (?:" + "|".join(SHAPES) + ")"}  # fmt: skip
    for frame in FRAMES:
        pattern = re.compile(re.sub(r"\\\{([a-z]+)\\\}", lambda m: words[m.group(1)], re.escape(frame)))
        assert not any(pattern.search(c) for c in captions), frame
    assert not any(p.text.lower() in c for p in ps for c in captions)
    control = probe_prompts(3, colour="*", shapes=["square", "circle"], lengths=[("short", 8)], stream="control")
    assert all(p.objects[0][0] != "pink" and not p.objects[0][3] for p in control)


def test_long_probe_prompts_put_the_object_where_the_plan_says() -> None:
    from te_align.tiny.world.captions import default_tokenizer
    from te_align.tiny.world.phrasings import _clip_tokenizer, _n_tokens, probe_prompts

    t5, clip = default_tokenizer(), _clip_tokenizer()
    for p in probe_prompts(0, colour="pink", shapes=["triangle"], lengths=[("long", 4), ("very long", 4)]):
        prefix = p.text[: p.start].rstrip()  # the filler sentences before the object's sentence
        assert "pink" not in prefix.lower() and "pink triangle" in p.text[p.start :].lower()
        if p.length == "long":
            assert 77 < _n_tokens(t5, prefix) and _n_tokens(t5, p.text) < 154
        else:
            assert _n_tokens(t5, prefix) > 257 and _n_tokens(clip, prefix) > 78


def test_read_probes_scores_rendered_scenes() -> None:
    from te_align.ab.accuracy import read_probes
    from te_align.tiny.world import Background, Scene, SceneObject, render

    def scene(colour: str, shape: str, position: str) -> Any:
        return render(Scene((SceneObject(colour, shape, position, "large", "fill"),), Background("plain", "white")), 32)

    images = [scene("pink", "triangle", "top left"), scene("pink", "square", "center"), scene("blue", "circle", "top left")]
    asked = [[["pink", "triangle", "top left", True]], [["pink", "triangle", "top left", True]], [["red", "circle", "top left", False]]]
    got = read_probes(images, asked, concept_colour="pink")
    assert [(g["hit"], g["exact"], g["concept_colour"]) for g in got] == [(True, True, True), (False, False, True), (False, False, False)]


# ------------------------------------------------------------------------------------------- rows
def test_matrix_rows_of_every_kind_validate() -> None:
    from te_align.ab.matrix import matrix_presets

    rows = matrix_presets()
    kinds = [p.baseline.kind for p in rows]
    # controls first (the third: amendment 10; the fourth, on seeds 6-11: amendment 11; the klein base's, issue 49)
    assert kinds[:5] == ["positive"] * 5 and kinds[5:8] == ["null"] * 3
    confirm = next(p for p in rows if p.name == "world-sd3-positive-cut-confirm")
    assert (confirm.eval.first_seed, confirm.eval.seeds) == (6, 6)
    # the first plan's rows; the SDXL (amendment 7) and Chroma (amendment 8) rows are deviations added later, the
    # klein rows (issue 49) a null and a positive control and three deviations, two of them hypothetical
    shipped = [p for p in rows if p.world is not None and p.world.base not in ("sdxl", "chroma", "klein")]
    later = [p for p in rows if p.world is not None and p.world.base in ("sdxl", "chroma", "klein")]
    assert sorted((p.world.base, p.baseline.kind, p.baseline.hypothetical) for p in later) == [  # type: ignore[union-attr]
        ("chroma", "deviation", False), ("klein", "deviation", False), *[("klein", "deviation", True)] * 2,
        ("klein", "null", False), ("klein", "positive", False), *[("sdxl", "deviation", False)] * 4]
    assert sum(p.baseline.kind == "deviation" for p in shipped) == 10
    assert sum(p.baseline.kind == "inference" for p in shipped) == 3
    assert {p.world.base for p in rows if p.baseline.kind == "null"} == {"sd3", "flux", "klein"}  # type: ignore[union-attr]
    assert not any(p.baseline.hypothetical for p in shipped)
    for p in [*shipped, *later]:
        # amendment 13's power rule: the klein rows and controls run 10 seeds (benchmarks/klein/bench_klein.md)
        assert p.eval.curve_steps == [50, 100, 200, 300] and p.eval.seeds == (10 if p.world.base == "klein" else 6)  # type: ignore[union-attr]
        assert sum(p.eval.probe_concept.values()) == 16 and sum(p.eval.probe_control.values()) == 8
        if p.baseline.kind in ("deviation", "inference"):
            assert re.search(r"[\w-]+/[\w.-]+@[0-9a-f]{7,40} \S+:\d+", p.baseline.source), p.name


def _data(name: str) -> dict[str, Any]:
    return tomllib.loads((WORLD / f"{name}.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("sd3-t5-154", lambda d: d["baseline"].update(remove_words=["pink"]), "positive control (positive = true) names the words"),
        ("sd3-positive", lambda d: d["baseline"].update(overrides={"t5_max_length": 77}), "a positive control differs only in remove_words"),
        ("sd3-comfyui", lambda d: d["baseline"].update(inference_tool=""), "names inference_tool"),
        ("sd3-comfyui", lambda d: d["baseline"].update(overrides={"t5_max_length": 77}), "trains one LoRA by the profile"),
        ("sd3-comfyui", lambda d: d["baseline"].update(inference_overrides={"t5.tokenizer.truncation": True}, inference_chunks=0),
         "the inference overrides leave the profile's behaviour unchanged"),
        ("sd3-t5-154", lambda d: d["baseline"].update(sample_as="comfy"), "key 'baseline.sample_as': expected profile or trained"),
        ("sd3-null", lambda d: d["baseline"].update(sample_as="trained"), "only a deviation row samples arm A as trained"),
        ("sd3-t5-154", lambda d: d["eval"].update(curve_steps=[50, 120]), "expected increasing checkpoint steps"),
        ("sd3-t5-154", lambda d: d["eval"].update(probe_concept={"medium": 3}), "key 'eval.probe_concept'"),
        ("sd3-t5-154", lambda d: d["eval"].update(probe_concept={}, probe_control={}), "a learning curve reads the probe prompts"),
    ],
)
def test_new_row_settings_are_checked(name: str, change: Any, message: str) -> None:
    data = _data(name)
    change(data)
    with pytest.raises(ABError, match=re.escape(message)):
        preset_from_dict(data, file="w.toml")


def test_inference_row_samples_arm_a_as_the_tool() -> None:
    p = load_preset(WORLD / "sd3-comfyui.toml")
    a, b = p.arm_profiles()
    assert a.fingerprint() == b.fingerprint()  # one LoRA: both arms train by the profile
    inf = p.baseline.inference_profile(b)
    t5 = inf.slot("t5").tokenizer
    assert (t5.padding, t5.min_length, t5.truncation) == ("longest", 77, False)
    assert p.baseline.inference_chunks == 8


# --------------------------------------------------------------------------------- plan and results
def test_plan_hash_covers_presets_seeds_and_steps() -> None:
    import copy

    from te_align.ab.matrix import matrix_presets, plan_hash

    rows = matrix_presets()
    h = plan_hash(rows, seeds=None, max_steps=None)
    assert h == plan_hash(matrix_presets(), seeds=None, max_steps=None)
    assert h != plan_hash(rows, seeds=4, max_steps=None) and h != plan_hash(rows, seeds=None, max_steps=10)
    changed = copy.deepcopy(rows)
    changed[3].train["train"]["learning_rate"] = 0.5
    assert plan_hash(changed, seeds=None, max_steps=None) != h


def _record(preset: str, seed: int, a: list[float], b: list[float], plan: str = "p1") -> dict[str, Any]:
    def arm(nets: list[float]) -> dict[str, Any]:
        curve = [[s, {"net": n, "hit": n, "false": 0.0, "known": 0.5, "exact": n / 2, "extra": 0.0}] for s, n in zip((50, 100, 200, 300), nets, strict=True)]
        return {"steps": 300, "train_seconds": 1.0, "train_cpu_seconds": 1.0, "shares": "", "losses": [[1, 0.5]], "val": [[0, 0.2], [300, 0.1]],
                "val_own": [[0, 0.2], [300, 0.1]], "curve": curve, "probes": [], "probe_reads": [], "curve_mean": sum(nets) / 4}  # fmt: skip

    return {"format": 1, "plan": plan, "preset": preset, "seed": seed, "arms": {"A": arm(a), "B": arm(b)}, "seconds": 10.0,
            "cpu_seconds": 9.0, "device": "cpu", "machine": "test", "samples": {}}  # fmt: skip


def test_results_of_another_plan_or_unreadable_are_refused(tmp_path: Path) -> None:
    from te_align.ab.matrix import read_results

    (tmp_path / "world-sd3-t5-77").mkdir()
    (tmp_path / "world-sd3-t5-77" / "seed-0.json").write_text(json.dumps(_record("world-sd3-t5-77", 0, [0.1] * 4, [0.2] * 4)))
    assert len(read_results(tmp_path, "p1")["world-sd3-t5-77"]) == 1
    with pytest.raises(ABError, match=r"seed-0.json: a result of another plan \(p1; this plan is p2\)"):
        read_results(tmp_path, "p2")
    (tmp_path / "world-sd3-t5-77" / "seed-1.json").write_text("{not json")
    with pytest.raises(ABError, match=r"seed-1.json: unreadable result"):
        read_results(tmp_path, "p1")


def test_a_row_extended_by_the_power_rule_keeps_its_first_seeds_and_refuses_any_other_change(tmp_path: Path) -> None:
    """Amendment 13: the klein controls' seeds 0-5 ran at 6 planned seeds; at 10 their results stay current (a unit does
    not depend on its row's seed count), a result of the row with any other setting changed is still refused."""
    from dataclasses import replace

    from te_align.ab.matrix import EXTENDED, accepted_hashes, matrix_presets, read_results, row_hash

    p = next(p for p in matrix_presets() if p.name == "world-klein-null")
    assert EXTENDED == {"world-klein-null": 6, "world-klein-positive-cut": 6} and p.eval.seeds == 10
    now, then = accepted_hashes(p, seeds=None, max_steps=None)
    assert now == row_hash(p, seeds=None, max_steps=None)
    assert then == row_hash(replace(p, eval=replace(p.eval, seeds=6)), seeds=None, max_steps=None) != now
    other = row_hash(replace(p, eval=replace(p.eval, seeds=6, noise_seed=1)), seeds=None, max_steps=None)
    (tmp_path / p.name).mkdir()
    for seed, plan in ((0, then), (6, now)):
        (tmp_path / p.name / f"seed-{seed}.json").write_text(json.dumps({**_record(p.name, seed, [0.1] * 4, [0.2] * 4), "plan": plan}))
    assert [d["seed"] for d in read_results(tmp_path, {p.name: (now, then)})[p.name]] == [0, 6]
    (tmp_path / p.name / "seed-1.json").write_text(json.dumps({**_record(p.name, 1, [0.1] * 4, [0.2] * 4), "plan": other}))
    with pytest.raises(ABError, match=rf"seed-1.json: a result of another plan \({other}; this plan is {now} or {then}\)"):
        read_results(tmp_path, {p.name: (now, then)})
    # a row never extended accepts its present hash alone
    q = next(p for p in matrix_presets() if p.name == "world-klein-thinking-on")
    assert accepted_hashes(q, seeds=None, max_steps=None) == (row_hash(q, seeds=None, max_steps=None),)


def test_aggregate_gives_verdicts_only_when_complete_with_holm() -> None:
    from te_align.ab.matrix import aggregate, matrix_presets, render_effects
    from te_align.ab.runner import PRIMARY

    presets = {p.name: p for p in matrix_presets()}
    # a clear effect on 6 seeds (A lower: the profile better), a null row at zero, a row with 3 seeds only
    recs = {
        "world-sd3-t5-77": [_record("world-sd3-t5-77", s, [0.2 + 0.01 * s] * 4, [0.5 + 0.012 * s] * 4) for s in range(6)],
        "world-sd3-null": [_record("world-sd3-null", s, [0.4 + 0.01 * (-1) ** s] * 4, [0.4] * 4) for s in range(6)],
        "world-flux-t5-512": [_record("world-flux-t5-512", s, [0.3] * 4, [0.3] * 4) for s in range(3)],
    }
    gate = "world-sd3-positive-shuffled"
    recs[gate] = [_record(gate, s, [0.1 + 0.01 * s] * 4, [0.4] * 4) for s in range(6)]  # the gate: profile better
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows[gate].verdict == "profile better"
    dev = rows["world-sd3-t5-77"]
    m = dev.primary
    assert m is not None and m["metric"] == PRIMARY and m["n"] == 6
    diffs = [(0.2 + 0.01 * s) - (0.5 + 0.012 * s) for s in range(6)]
    assert m["diff_mean"] == pytest.approx(sum(diffs) / 6) and m["p_signflip"] == pytest.approx(2 / 64)
    assert dev.verdict == "profile better" and dev.p_holm == pytest.approx(m["p_t"])  # the only complete deviation row
    assert rows["world-sd3-null"].verdict == "no measurable difference"
    assert rows["world-flux-t5-512"].verdict == "pending (3 of 6 seeds)" and math.isnan(rows["world-flux-t5-512"].p_holm)
    text = render_effects(list(rows.values()), command="te-align ab matrix", plan="p1")
    line = next(x for x in text.splitlines() if x.startswith("| world-sd3-t5-77 |"))
    assert "| 6 | 0.225 | 0.530 |" in line and line.endswith("| **profile better** | 0.9 |")  # 6 x 9 CPU-seconds
    assert "**Progress: 21 of 24 row-seeds**" in text
    # a gate that is not seen makes every complete deviation row uninformative; a pending one keeps them pending
    recs[gate] = [_record(gate, s, [0.4 + 0.01 * (-1) ** s] * 4, [0.4] * 4) for s in range(6)]
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows["world-sd3-t5-77"].verdict == "uninformative (the gating positive control was not seen)"
    recs[gate] = recs[gate][:3]
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows["world-sd3-t5-77"].verdict == "pending (the gating positive control, world-sd3-positive-shuffled)"



def test_instrument_2_reads_the_last_checkpoint_in_one_family_gated_by_its_confirmatory_control() -> None:
    """Amendment 11: concept net accuracy at the last checkpoint, Holm over every complete deviation and inference row,
    each verdict pending until world-sd3-positive-cut-confirm is complete and uninformative unless it reads "profile
    better"; confirmatory only for the rows re-run under the amendment, post hoc for the others."""
    from te_align.ab.matrix import GATE_2, aggregate, matrix_presets, render_effects, summary_of
    from te_align.ab.runner import FINAL_NET

    presets = {p.name: p for p in matrix_presets()}
    # the curve mean favours A (early checkpoints), the last checkpoint favours B: instrument 2 sees B better
    a = [[0.5, 0.5, 0.3, 0.1 + 0.01 * s] for s in range(6)]
    b = [[0.0, 0.1, 0.3, 0.6 + 0.012 * s] for s in range(6)]
    recs = {n: [_record(n, s, a[s], b[s]) for s in range(6)] for n in ("world-sd3-t5-77", "world-sd15-max-token-225")}
    recs["world-sd3-null"] = [_record("world-sd3-null", s, [0.4] * 3 + [0.4 + 0.01 * (-1) ** s], [0.4] * 4) for s in range(6)]
    recs[GATE_2] = [_record(GATE_2, 6 + s, [0.2] * 3 + [0.1 + 0.02 * s], [0.2] * 3 + [0.5]) for s in range(6)]
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    gate = rows[GATE_2]
    assert gate.final_net is not None and gate.final_net["metric"] == FINAL_NET and gate.verdict_2 == "profile better"
    dev = rows["world-sd3-t5-77"]
    m = dev.final_net
    assert m is not None and m["diff_mean"] == pytest.approx(sum((0.1 + 0.01 * s) - (0.6 + 0.012 * s) for s in range(6)) / 6)
    assert dev.primary is not None and dev.primary["diff_mean"] > 0  # the primary reads the other way
    assert dev.holm_factor_2 == 2 and dev.p_holm_2 == pytest.approx(min(1.0, 2 * max(
        float(rows[n].final_net["p_t"]) for n in ("world-sd3-t5-77", "world-sd15-max-token-225"))))  # type: ignore[index]
    assert dev.verdict_2 == "profile better" and not dev.confirmatory_2
    assert rows["world-sd15-max-token-225"].confirmatory_2
    text = render_effects(list(rows.values()), command="te-align ab matrix", plan="p1")
    assert "## Instrument 2 (amendment 11): concept net accuracy at 300 steps" in text
    line = next(x for x in text.splitlines() if x.startswith("| world-sd3-t5-77 | deviation | sd3 | 6 | 0.125 |"))
    assert line.endswith("| **profile better** | post hoc |")
    line = next(x for x in text.splitlines() if x.startswith("| world-sd15-max-token-225 | deviation | sd15 | 6 | 0.125 |"))
    assert line.endswith("| **profile better** | confirmatory |")
    second = next(r for r in summary_of(list(rows.values()), "p1")["rows"] if r["preset"] == "world-sd3-t5-77")["instrument_2"]
    assert (second["verdict"], second["confirmatory"], second["metric"]) == ("profile better", False, FINAL_NET)
    # the gate not seen: every deviation verdict on instrument 2 is uninformative; incomplete: pending
    recs[GATE_2] = [_record(GATE_2, 6 + s, [0.2] * 4, [0.2] * 3 + [0.2 + 0.01 * (-1) ** s]) for s in range(6)]
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows["world-sd3-t5-77"].verdict_2 == f"uninformative (instrument 2's confirmatory control, {GATE_2}, was not seen)"
    recs[GATE_2] = recs[GATE_2][:2]
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows["world-sd3-t5-77"].verdict_2 == f"pending (instrument 2's confirmatory control, {GATE_2})"


def test_instrument_2_is_the_committed_seeds_last_checkpoint() -> None:
    """Recomputed from the committed per-seed results: the positive control of amendment 10 on instrument 2 (the
    numbers amendment 11 cites) and the confirmatory control's seeds, which no other row uses."""
    from te_align.ab.matrix import GATE_2, matrix_presets, row_hash

    diffs = []
    for s in range(6):
        arms = json.loads((RESULTS / "world-sd3-positive-cut" / f"seed-{s}.json").read_text(encoding="utf-8"))["arms"]
        diffs.append(arms["A"]["curve"][-1][1]["net"] - arms["B"]["curve"][-1][1]["net"])
    assert [round(d, 4) for d in diffs] == [-0.3125, -0.0625, -0.0625, -0.4375, -0.125, -0.375]
    assert statistics.fmean(diffs) == pytest.approx(-0.2291667, abs=1e-6)
    presets = {p.name: p for p in matrix_presets()}
    # its seeds are new to every row it gates; the klein rows (another base, their own gate) run 10 seeds
    used = {int(json.loads(f.read_text(encoding="utf-8"))["seed"]) for f in RESULTS.glob("*/seed-*.json")
            if f.parent.name != GATE_2 and not f.parent.name.startswith("world-klein-")}
    assert used == set(range(6))
    assert row_hash(presets[GATE_2], seeds=None, max_steps=None) != row_hash(presets["world-sd3-positive-cut"], seeds=None, max_steps=None)


def test_reading_is_computed_from_the_verdicts_once_every_row_is_complete() -> None:
    from te_align.ab.matrix import aggregate, matrix_presets, render_effects

    presets = {p.name: p for p in matrix_presets()}
    gate = "world-sd3-positive-shuffled"
    recs = {
        "world-sd3-t5-77": [_record("world-sd3-t5-77", s, [0.2 + 0.01 * s] * 4, [0.5 + 0.012 * s] * 4) for s in range(6)],
        "world-sd3-t5-154": [_record("world-sd3-t5-154", s, [0.45 + 0.01 * s] * 4, [0.4 + 0.012 * s] * 4) for s in range(6)],
        "world-sd3-null": [_record("world-sd3-null", s, [0.4 + 0.01 * (-1) ** s] * 4, [0.4] * 4) for s in range(6)],
        gate: [_record(gate, s, [0.1 + 0.01 * s] * 4, [0.4] * 4) for s in range(6)],
    }
    rows = list(aggregate([presets[n] for n in recs], recs, planned=None))
    text = render_effects(rows, command="te-align ab matrix", plan="p1")
    # A - B per seed: -0.3 - 0.002 s (mean -0.305) and 0.05 - 0.002 s (mean 0.045); half-width t(5) x 0.002 sd(0..5) / sqrt(6)
    reading = text.split("## Reading\n\n")[1].split("\n\n")[0].splitlines()
    assert reading == [
        "- Null control **world-sd3-null**: no measurable difference (as it must).",
        f"- Positive control **{gate}** (the gate of the deviation rows): profile better; the instrument sees it.",
        "- Intervals here are Holm-adjusted, in the verdict's terms (the table's adjusted column).",
        # the smaller p is doubled by Holm: its interval is the 97.5% one, t(0.9875, 5) = 3.163 x 0.002 x 1.8708 / sqrt(6) = 0.0048
        "- **profile better** (1 of 2: the profile's recipe gave the better LoRA): world-sd3-t5-77 (-0.3050 [-0.3098, -0.3002]).",
        "- **trainer default better** (1 of 2: the trainer's or tool's setting gave the better LoRA): "
        "world-sd3-t5-154 (0.0450 [0.0411, 0.0489]).",
        "- **no measurable difference** (0 of 2: no difference this study resolves; each interval bounds what it could "
        "have missed): none.",
    ]
    # a later base's control still running (the klein null, issue 49): named pending, the complete family still read
    klein = {**recs, "world-klein-null": [_record("world-klein-null", s, [0.3] * 4, [0.3 + 0.01 * s] * 4) for s in range(2)]}
    rows = list(aggregate([presets[n] for n in klein], klein, planned=None))
    text = render_effects(rows, command="te-align ab matrix", plan="p1")
    assert text.split("## Reading\n\n")[1].split("\n\n")[0].splitlines() == [
        *reading[:2], "- Null control **world-klein-null**: pending (2 of 10 seeds).", *reading[2:]]
    # a complete klein null with a wide spread: the first plan's rows keep their own nulls' smallest detectable effect
    wide = {**recs, "world-klein-null": [_record("world-klein-null", s, [0.3 + 0.2 * (-1) ** s] * 4, [0.3] * 4) for s in range(6)]}
    before = {r.preset: r.mde for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    after = {r.preset: r.mde for r in aggregate([presets[n] for n in wide], wide, planned=None)}
    assert after["world-sd3-t5-77"] == before["world-sd3-t5-77"] and not math.isnan(before["world-sd3-t5-77"])
    # a row with seeds missing: no reading at all
    recs["world-sd3-t5-154"] = recs["world-sd3-t5-154"][:5]
    rows = list(aggregate([presets[n] for n in recs], recs, planned=None))
    assert "## Reading" not in render_effects(rows, command="te-align ab matrix", plan="p1")

# ---------------------------------------------------------------------------------- check evidence
def test_check_evidence_names_the_measured_row(tmp_path: Path) -> None:
    from te_align.ab.evidence import evidence_for

    summary = {"format": 1, "plan": "p1", "rows": [
        {"preset": "world-flux-t5-512", "kind": "deviation", "trainer": "ai-toolkit", "family": "flux", "base": "flux", "verdict": "profile better",
         "seeds": 6, "planned": 6, "primary": {"diff_mean": -0.125, "ci_low": -0.2, "ci_high": -0.05, "p_t": 0.01, "p_signflip": 0.03, "n": 6}},
    ]}  # fmt: skip
    path = tmp_path / "effects.json"
    path.write_text(json.dumps(summary))
    ev = evidence_for("flux", "flux-schnell", "t5.tokenizer.max_length", 512, path=path)
    assert ev["row"] == "world-flux-t5-512" and ev["verdict"] == "profile better" and ev["ci"] == [-0.2, -0.05]
    assert ev["text"].startswith("world-flux-t5-512 (flux world base, 6 of 6 seeds): trainer's arm minus profile's -0.125 [95% CI -0.200, -0.050]")
    # the Flux base has schnell's recipe: a flux-dev finding is not measured; nor is a value no row tried
    assert evidence_for("flux", "flux-dev", "t5.tokenizer.max_length", 512, path=path)["verdict"] == "not measured"
    assert evidence_for("flux", "flux-schnell", "t5.tokenizer.max_length", 300, path=path)["verdict"] == "not measured"
    # a row still running shows no number
    summary["rows"][0].update(verdict="pending (2 of 6 seeds)", seeds=2)
    path.write_text(json.dumps(summary))
    from te_align.ab.evidence import _load

    _load.cache_clear()
    ev = evidence_for("flux", "flux-schnell", "t5.tokenizer.max_length", 512, path=path)
    assert ev["text"] == "world-flux-t5-512 (flux world base): pending (2 of 6 seeds); no verdict until all 6 seeds are in (see docs/effects.md)"
    # a measured row missing from the summary
    assert evidence_for("sd3", "sd35-large", "t5.tokenizer.max_length", 154, path=path)["text"].startswith("not measured (world-sd3-t5-154")


def test_check_cli_prints_and_serialises_the_evidence(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "k.toml"
    cfg.write_text('pretrained_model_name_or_path = "x"\nt5xxl_max_token_length = 512\n')
    out = subprocess.run([sys.executable, "-m", "te_align", "check", str(cfg), "--trainer", "kohya", "--profile", "flux-schnell", "--json"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    data = json.loads(out.stdout)
    f = next(x for x in data["results"][0]["findings"] if x["setting"] == "t5.tokenizer.max_length")
    assert f["evidence"]["row"] in ("world-flux-t5-512", None)
    from te_align.ab.evidence import evidence_for

    assert f["evidence"]["text"] == evidence_for("flux", "flux-schnell", "t5.tokenizer.max_length", 512)["text"]


# ------------------------------------------------------------------------ ComfyUI's negative batching
def test_separate_passes_run_prompt_and_negative_at_their_own_lengths() -> None:
    import torch

    from te_align.ab.accuracy import _match_lengths, _separate_passes

    class Denoiser(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[int, int]] = []

        def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                    return_dict: bool = False) -> tuple[torch.Tensor]:  # fmt: skip
            self.seen.append((encoder_hidden_states.shape[0], encoder_hidden_states.shape[1]))
            return (hidden_states + encoder_hidden_states.mean(dim=(1, 2)).view(-1, 1),)

    pos = {"prompt_embeds": torch.ones(2, 154, 4)}
    neg = {"prompt_embeds": torch.full((2, 77, 4), 3.0)}
    # 154 and 77: the lcm is 2 x the shorter, so both are repeated to 154 (one batched pass, as ComfyUI)
    assert _match_lengths(pos, neg) == {} and neg["prompt_embeds"].shape == (2, 154, 4)
    pos = {"prompt_embeds": torch.ones(2, 100, 4)}
    neg = {"prompt_embeds": torch.full((2, 77, 4), 3.0)}
    lengths = _match_lengths(pos, neg)  # lcm 7700: separate passes, zero-padded to 100 in between
    assert lengths == {"prompt_embeds": (77, 100)} and neg["prompt_embeds"].shape == (2, 100, 4)
    d = Denoiser()
    batch = torch.cat([neg["prompt_embeds"], pos["prompt_embeds"]])
    with _separate_passes(d, lengths, {"prompt_embeds": "encoder_hidden_states"}):
        (out,) = d(hidden_states=torch.zeros(4, 1), timestep=torch.zeros(4), encoder_hidden_states=batch)
    assert d.seen == [(2, 77), (2, 100)]
    assert out.view(-1).tolist() == [3.0, 3.0, 1.0, 1.0]  # the padding never reached the negative's pass
    assert "forward" not in d.__dict__  # restored


# ------------------------------------------------------------------------------------ chunked dropout
def test_dropped_encoder_in_a_chunked_batch_gets_the_batch_chunk_count() -> None:
    import torch

    import te_align
    from te_align.encoding import EncodeOptions
    from te_align.profiles.overrides import resolve
    from te_align.tiny.bases import base_info, load

    pipe = load("sd15")
    prof = resolve("sd15", ("base", base_info("sd15")["profile_overrides"]))
    long = "a large pink circle at the top left, " * 12
    opts = EncodeOptions(long_prompt_chunks=3)
    cond = te_align.encode(prof, [long, "a red square"], pipeline=pipe, options=opts, drop_slots={"clip_l": [False, True]})
    chunks = cond["prompt_embeds"].shape[1] // 77
    assert chunks == 2 and cond["prompt_embeds"].shape[1] == 2 * 77  # 12 x 9 CLIP tokens: two 75-token chunks
    empty = te_align.encode(prof, [""], pipeline=pipe, options=EncodeOptions(long_prompt_chunks=chunks, pad_chunks=True))
    assert torch.equal(cond["prompt_embeds"][1], empty["prompt_embeds"][0])


# -------------------------------------------------------------------------------------- matrix, demo
@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import io

    from te_align.ab.demo import run_demo
    from te_align.ab.progress import Progress

    out = tmp_path_factory.mktemp("world-demo")
    said: list[str] = []
    err = io.StringIO()  # the progress lines, as `te-align demo` shows them on a stderr that is not a terminal
    with Progress("te-align demo", stream=err, out=said.append, tty=False, refresh=0.1, stage="loading") as progress:
        result = run_demo(out, steps=4, seeds=2, workers=2, say=progress.say, progress=progress)
    return out, result, said, err.getvalue().splitlines()


def test_demo_runs_the_planned_row_on_the_shipped_base(demo: Any) -> None:
    from te_align.ab.demo import DEMO_ROW
    from te_align.ab.runner import PRIMARY

    out, result, said, _ = demo
    assert result.preset.name == DEMO_ROW and result.seeds == 2 and len(result.runs) == 4
    for r in result.runs:
        assert r.steps == 4 and [s for s, _ in r.curve] == [4] and len(r.probes) == 24 and len(r.probe_samples) == 24
    m = next(x for x in result.summary if x.metric == PRIMARY)
    # the summary is said once: the verdict, then one line per metric (the primary first), then the report
    assert [s for s in said if s.startswith("verdict: ")] == [
        f"verdict: {result.verdict} (2 seed(s) x 4 steps, paired by seed; A = T5 at 512 tokens, B = the profile's 256; "
        f"each A - B with its 95% interval; {result.seconds:.0f} s)"]  # fmt: skip
    i = said.index(next(s for s in said if s.startswith("verdict: ")))
    assert said[i + 1].startswith(f"  {PRIMARY}: A ") and said[i + 1].endswith(f": {m.verdict}")
    assert len(said[i + 1 : i + 1 + len(result.summary)]) == len(result.summary)
    assert [s for s in said if s.startswith(f"  {PRIMARY}")] == [said[i + 1]]
    assert [s for s in said if s.startswith("report: ")] == [f"report: {result.report_html}"]
    results = sorted((out / "matrix" / "results" / DEMO_ROW).glob("seed-*.json"))
    assert [p.name for p in results] == ["seed-0.json", "seed-1.json"]
    per_seed = [json.loads(p.read_text())["arms"]["A"]["curve_mean"] for p in results]
    assert per_seed == pytest.approx(m.a)


def test_demo_shows_each_phase_with_an_eta(demo: Any) -> None:
    """The progress lines of the real run (two workers): every phase named, in order, the ETA once a unit is
    measured, and no silent stretch (a plain line at least every 30 s)."""
    _, _, _, lines = demo
    assert lines[0] == "te-align demo: loading | 0:00 elapsed"
    assert lines[1].startswith("te-align demo: finding the world data and the shipped base | ")
    assert lines[-1].startswith("te-align demo: done in ")
    phases = [ln.split(" | ")[0] for ln in lines]
    want = ["loading the base, encoding arm A's captions", "training arm A, step", "loading the base, encoding arm B's "
            "captions", "training arm B, step", "loading the base for scoring", "sampling and scoring arm A",
            "sampling and scoring arm B", "writing the report"]  # fmt: skip
    seen = [next((k for k, ph in enumerate(phases) if w in ph), -1) for w in want]
    assert -1 not in seen and seen[:2] == sorted(seen[:2]) and seen[5:] == sorted(seen[5:]), phases
    both = [ln for ln in lines if "running]" in ln]
    assert both and all(ln.startswith("te-align demo: [0/2 done, 2 running] world-flux-t5-512 seed 0: ") and
                        "; world-flux-t5-512 seed 1: " in ln for ln in both)  # fmt: skip
    # once the first unit is measured, the other shows the time left
    after = [ln for ln in lines if ln.startswith("te-align demo: [2/2] ")]
    assert after and all(" | about " in ln and ln.endswith(" left") for ln in after)
    # no silent stretch: a plain line at least every 30 s (elapsed m:ss in each line)
    times = [int(t.split(":")[0]) * 60 + int(t.split(":")[1]) for t in (ln.split(" | ")[1].split()[0] for ln in lines[:-1])]
    assert times == sorted(times) and max(b - a for a, b in itertools.pairwise(times)) <= 31


def test_demo_report_leads_with_the_verdict_then_samples_accuracy_and_the_matrix(demo: Any) -> None:
    _, result, _, _ = demo
    md = result.report_md.read_text(encoding="utf-8")
    heads = [line for line in md.splitlines() if line.startswith(("# ", "## ", "**Verdict"))]
    assert heads[0] == f"# A/B: {result.preset.name}" and heads[1].startswith(f"**Verdict: {result.verdict}**")
    order = [next(i for i, h in enumerate(heads) if h.startswith(t)) for t in
             ("## Samples: what each arm draws", "## Prompt accuracy", "## Validation loss per checkpoint", "## The committed effects matrix")]  # fmt: skip
    assert order == sorted(order)
    page = result.report_html.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') >= 4 and "The committed effects matrix" in page
    # the wall time is the demo's own run (it read 0.0 s when taken from the unit folders' states)
    wall = float(md.split("; wall time ")[1].split(" s.")[0])
    assert wall == round(result.seconds, 1) and result.seconds > sum(r.seconds for r in result.runs) > 0


def test_interrupted_matrix_resumes_and_does_not_rerun_finished_seeds(demo: Any) -> None:
    from te_align.ab.demo import DEMO_ROW
    from te_align.ab.matrix import run_matrix

    out, _, _, _ = demo
    said: list[str] = []
    rows = run_matrix(out / "matrix", only=[DEMO_ROW], seeds=2, max_steps=4, say=said.append)
    assert said[0].endswith("0 unit(s) to run (row x seed), 2 done; results in " + str(out / "matrix" / "results"))
    assert rows[0].seeds == 2
    with pytest.raises(ABError, match="a result of another plan"):
        run_matrix(out / "matrix", only=[DEMO_ROW], seeds=2, max_steps=5, say=said.append)
    with pytest.raises(ABError, match="key '--only': no world preset 'world-sd9'"):
        run_matrix(out / "matrix", only=["world-sd9"], say=said.append)


def test_rows_added_by_an_amendment_are_a_holm_family_of_their_own() -> None:
    """bench_effects.md amendment 7: the SDXL rows are adjusted among themselves, so adding them changes no verdict of
    the first plan's rows; their hash names that correction, the first plan's rows' hashes are unchanged."""
    from te_align.ab.matrix import aggregate, holm_family, matrix_presets, render_effects, row_hash

    presets = {p.name: p for p in matrix_presets()}
    later = {n for n, p in presets.items() if holm_family(p.world.base)}
    assert later == {"world-sdxl-clip-g-bang", "world-sdxl-dropout-encoded", "world-sdxl-max-token-225",
                     "world-sdxl-pad-longest", "world-chroma-t5-no-mask", "world-klein-null", "world-klein-positive-cut",
                     "world-klein-layers-10-20-30", "world-klein-thinking-on", "world-klein-no-template"}
    assert len({holm_family(b) for b in ("chroma", "sdxl", "klein")}) == 3  # each amendment's rows are a family of their own
    # the first plan's row hashes as committed with its results (benchmarks/effects/results)
    committed = json.loads((RESULTS / "world-sd3-t5-77" / "seed-0.json").read_text(encoding="utf-8"))["plan"]
    assert row_hash(presets["world-sd3-t5-77"], seeds=None, max_steps=None) == committed
    gate = "world-sd3-positive-shuffled"
    recs = {
        # a later amendment's row that sorts before the first plan's rows: its family is still read after theirs
        "world-chroma-t5-no-mask": [_record("world-chroma-t5-no-mask", s, [0.3] * 4, [0.3] * 4) for s in range(6)],
        gate: [_record(gate, s, [0.1 + 0.01 * s] * 4, [0.4] * 4) for s in range(6)],
        "world-sd3-t5-77": [_record("world-sd3-t5-77", s, [0.2 + 0.01 * s] * 4, [0.5 + 0.012 * s] * 4) for s in range(6)],
        "world-sd3-t5-154": [_record("world-sd3-t5-154", s, [0.45 + 0.01 * s] * 4, [0.4 + 0.012 * s] * 4) for s in range(6)],
        "world-sdxl-pad-longest": [
            _record("world-sdxl-pad-longest", s, [0.3 + 0.02 * s] * 4, [0.5 + 0.01 * s] * 4) for s in range(6)
        ],
        "world-sdxl-clip-g-bang": [_record("world-sdxl-clip-g-bang", s, [0.3] * 4, [0.3] * 4) for s in range(2)],
    }
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    first = [rows["world-sd3-t5-77"].primary["p_t"], rows["world-sd3-t5-154"].primary["p_t"]]
    # Holm over the two first-plan rows alone: the smaller p doubled, the larger kept (monotone)
    assert rows["world-sd3-t5-77"].p_holm == pytest.approx(min(1.0, 2 * min(first)))
    # the SDXL row is the only complete row of its family: its p is not adjusted at all
    sdxl = rows["world-sdxl-pad-longest"]
    assert sdxl.holm_family and sdxl.p_holm == pytest.approx(sdxl.primary["p_t"]) and sdxl.verdict == "profile better"
    text = render_effects(list(rows.values()), command="te-align ab matrix", plan="p1")
    reading = text.split("## Reading\n\n")[1].split("\n## ")[0]
    assert "Adjusted on their own (Holm over 2 rows), the SDXL rows (amendment 7):" in reading
    chroma = "Adjusted on their own (Holm over 1 row), the Chroma row (amendment 8):"
    first_plan = "(1 of 2: the profile's recipe gave the better LoRA): world-sd3-t5-77"
    assert reading.index(first_plan) < reading.index("the SDXL rows (amendment 7)") < reading.index(chroma)
    assert "- Not read yet: 1 of 2 rows have all their seeds." in reading
    assert "(1 of 2: the profile's recipe gave the better LoRA): world-sd3-t5-77" in reading


def test_rows_without_results_stay_out_of_the_table_and_hypothetical_rows_say_so() -> None:
    """Issue 49: the klein rows join the plan before their base ships; a row without any result is left out of the
    table (so docs/effects.md and effects.json stay as they were until its first result), a study with no result yet
    shows its whole plan, and a hypothetical deviation is named so in the tables and the summary."""
    from te_align.ab.matrix import aggregate, documented, matrix_presets, render_effects, summary_of

    presets = matrix_presets()
    by_name = {p.name: p for p in presets}
    recs = {"world-sd3-t5-77": [_record("world-sd3-t5-77", 0, [0.2] * 4, [0.5] * 4)]}
    assert [p.name for p in documented(presets, recs)] == ["world-sd3-t5-77"]
    assert documented(presets, {}) == presets
    hypo = sorted(p.name for p in presets if p.baseline.hypothetical)
    assert hypo == ["world-klein-no-template", "world-klein-thinking-on"]
    rows = aggregate([by_name[n] for n in (*hypo, "world-klein-layers-10-20-30")], {}, planned=None)
    text = render_effects(rows, command="te-align ab matrix", plan="p1")
    line = next(x for x in text.splitlines() if x.startswith("| world-klein-thinking-on |"))
    assert line.startswith("| world-klein-thinking-on | deviation (hypothetical) | (hypothetical) | klein | 0 |")
    layers = next(x for x in text.splitlines() if x.startswith("| world-klein-layers-10-20-30 |"))
    assert layers.startswith("| world-klein-layers-10-20-30 | deviation | diffusers-examples | klein | 0 |")
    assert "- **world-klein-no-template** (deviation (hypothetical); (hypothetical)): qwen3.template = '{prompt}'." in text
    summary = {r["preset"]: r for r in summary_of(rows, "p1")["rows"]}  # type: ignore[union-attr]
    assert summary["world-klein-thinking-on"]["hypothetical"] is True
    assert "hypothetical" not in summary["world-klein-layers-10-20-30"]


def test_the_klein_rows_read_instrument_2_as_their_primary_in_their_own_family(monkeypatch, tmp_path: Path) -> None:
    """bench_klein.md decisions 7 and 10: the klein rows' primary is instrument 2, Holm over the klein rows alone,
    confirmatory, gated by world-klein-positive-cut (not amendment 11's control), noise from the klein null; `check`
    acts on that reading whatever the curve mean says."""
    import te_align_world

    from te_align.ab.matrix import aggregate, matrix_presets, summary_of
    from te_align.audit.evidence import evidence_for, measured_direction
    from te_align.tiny import bases

    (tmp_path / "klein").mkdir()
    (tmp_path / "klein" / bases.MANIFEST).write_text(json.dumps({"format": bases.FORMAT, "name": "klein",
                                                                 "family": "flux2-klein", "files": {}}))  # fmt: skip
    monkeypatch.setattr(te_align_world, "ROOT", tmp_path)  # the klein base is not shipped yet: a manifest stands in
    presets = {p.name: p for p in matrix_presets()}
    n = 10  # the klein rows' seeds (amendment 13's power rule)
    layers, gate, null = "world-klein-layers-10-20-30", "world-klein-positive-cut", "world-klein-null"
    # the curve mean favours A (early checkpoints), the last checkpoint favours B
    a = [[0.5, 0.5, 0.3, 0.1 + 0.01 * s] for s in range(n)]
    b = [[0.0, 0.1, 0.3, 0.6 + 0.012 * s] for s in range(n)]
    recs = {layers: [_record(layers, s, a[s], b[s]) for s in range(n)],
            "world-klein-thinking-on": [_record("world-klein-thinking-on", s, [0.4] * 3 + [0.4 + 0.01 * (-1) ** s], [0.4] * 4)
                                        for s in range(n)],
            null: [_record(null, s, [0.4] * 3 + [0.4 + 0.02 * (-1) ** s], [0.4] * 4) for s in range(n)],
            gate: [_record(gate, s, [0.2] * 3 + [0.1 + 0.02 * s], [0.2] * 3 + [0.5]) for s in range(n)]}  # fmt: skip
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows[gate].verdict_2 == "profile better"
    dev = rows[layers]
    assert dev.primary is not None and dev.primary["diff_mean"] > 0  # the curve mean reads the other way
    assert dev.confirmatory_2 and rows["world-klein-thinking-on"].confirmatory_2
    ps = [float(rows[n].final_net["p_t"]) for n in (layers, "world-klein-thinking-on")]  # type: ignore[index]
    assert dev.holm_factor_2 == 2 and dev.p_holm_2 == pytest.approx(min(1.0, 2 * min(ps)))
    assert dev.verdict_2 == "profile better"
    assert rows["world-klein-thinking-on"].verdict_2 == "no measurable difference"
    # docs/effects.md's Reading reads the family on instrument 2; the curve mean follows as a secondary
    from te_align.ab.matrix import _reading

    reading = _reading(list(rows.values()))
    start = reading.index("Adjusted on their own (Holm over 2 rows), the klein rows (issue 49):")
    family = reading[start + 2:]
    assert family[0].startswith("- Read on their pre-registered primary, instrument 2 (concept net accuracy at 300 steps;")
    assert family[1].startswith(f"- **profile better** (1 of 2: the profile's recipe gave the better LoRA): {layers} (-")
    assert family[3].startswith("- **no measurable difference** (1 of 2: no difference this study resolves; each interval "
                                "bounds what it could have missed): world-klein-thinking-on (")  # fmt: skip
    assert family[4].startswith("- The table's curve mean, a secondary for these rows (not what they were pre-registered "
                                f"on): {layers} {dev.verdict} (0.")  # fmt: skip
    assert dev.verdict != "profile better"  # the curve mean reads the other way: the Reading does not follow it
    null_line = next(x for x in reading if x.startswith(f"- Null control **{null}**"))
    assert null_line.endswith("this readout is a secondary for the klein rows, whose primary is instrument 2, where this "
                              "control reads no measurable difference.")  # fmt: skip
    # the smallest detectable effect comes from the klein null's spread (sd 0.02 * sqrt(n/(n-1))) at alpha / 2
    from te_align.ab.stats import smallest_detectable

    assert dev.mde_2 == pytest.approx(smallest_detectable(0.02 * (n / (n - 1)) ** 0.5, n, 0.025, 0.8))
    row = next(r for r in summary_of(list(rows.values()), "p1")["rows"] if r["preset"] == layers)  # type: ignore[union-attr]
    second = row["instrument_2"]
    assert (second["primary"], second["confirmatory"], second["holm_family"]) == (True, True, "the klein rows (issue 49)")
    summary = tmp_path / "effects.json"
    summary.write_text(json.dumps(summary_of(list(rows.values()), "p1")))
    ev = evidence_for("flux2-klein", "flux2-klein-4b", "qwen3.encoder.layer", [10, 20, 30], path=summary)
    assert ev["row"] == layers and measured_direction(ev) == "profile better"
    # instrument 2 heads the finding; the curve mean (which reads the other way here) follows as a secondary
    assert "on concept net accuracy at 300 steps (instrument 2, the row's pre-registered primary): profile better (Holm over the klein rows (issue 49))" in str(ev["text"])
    assert any(str(x).startswith("secondary, not acted on: the learning-curve mean +") and "trainer default better" in str(x)
               for x in ev["lines"])  # fmt: skip
    # the hypothetical rows are cited where a config switches thinking on or drops the template, and only there
    thinking = evidence_for("flux2-klein", "flux2-klein-4b", "qwen3.tokenizer.enable_thinking", True, path=summary)
    assert thinking["row"] == "world-klein-thinking-on" and measured_direction(thinking) == "null"
    template = evidence_for("flux2-klein", "flux2-klein-4b", "qwen3.tokenizer.template", "{prompt}", path=summary)
    assert template["row"] == "world-klein-no-template" and template["verdict"] == "not measured"  # no seeds in it
    assert evidence_for("z-image", "z-image", "qwen3.tokenizer.enable_thinking", True, path=summary)["row"] is None
    assert evidence_for("flux2-klein", "flux2-klein-4b", "qwen3.tokenizer.enable_thinking", False, path=summary)["row"] is None
    # its own gate: amendment 11's control is not theirs; their control not seen makes them uninformative
    recs[gate] = [_record(gate, s, [0.2] * 4, [0.2] * 3 + [0.2 + 0.01 * (-1) ** s]) for s in range(n)]
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows[layers].verdict_2 == f"uninformative (instrument 2's confirmatory control, {gate}, was not seen)"
    unseen = tmp_path / "effects-unseen.json"  # another file: summaries are read once per path
    unseen.write_text(json.dumps(summary_of(list(rows.values()), "p1")))
    assert measured_direction(evidence_for("flux2-klein", "flux2-klein-4b", "qwen3.encoder.layer", [10, 20, 30], path=unseen)) == ""
    del recs[gate]
    rows = {r.preset: r for r in aggregate([presets[n] for n in recs], recs, planned=None)}
    assert rows[layers].verdict_2 == f"pending (instrument 2's confirmatory control, {gate})"


def test_committed_sample_paths_stay_inside_the_matrix_folder() -> None:
    """Every committed result names its probe images relative to its matrix folder; a row whose arm B is reused
    names arm B's images as the reused record does (they were made relative twice once and climbed out of the
    folder to a machine's own: ``../../../work/...``)."""
    from te_align.ab.matrix import REDRAWN, relative_samples

    reused = 0
    for path in sorted(RESULTS.glob("*/seed-*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        # arm B taken from another row's result (shared_b) names that row's images, in that row's folder
        source_row = Path(rec["arm_b_from"]["file"]).parent.name if "arm_b_from" in rec else path.parent.name
        for arm, files in rec.get("samples", {}).items():
            folder = source_row if arm == "B" else path.parent.name
            assert all(not f.startswith(("/", "..")) and f.startswith(f"{folder}/") for f in files), (path, arm)
        if "arm_b_from" in rec:
            source = json.loads((RESULTS.parent / rec["arm_b_from"]["file"]).read_text(encoding="utf-8"))
            assert rec["samples"]["B"] == source["samples"]["B"] and rec["arms"]["B"] == source["arms"]["B"], path
            reused += path.parent.name in REDRAWN
    assert reused == 30  # amendment 9's and 11's re-runs
    root = Path("out")
    assert relative_samples({"A": [root / "row" / "seed-0" / "a.png"]}, root) == {"A": [str(Path("row/seed-0/a.png"))]}
