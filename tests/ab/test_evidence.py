"""The evidence machinery: paired statistics and verdicts, world presets (null control, arm-A train settings),
answer keys and prompt-accuracy scoring, and the matrix table (the shipped world bases: test_bases.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from te_align.ab.preset import (
    NULL_SEED_OFFSET,
    ABError,
    load_preset,
    preset_from_dict,
    presets_root,
    train_config_dict,
)
from te_align.ab.stats import (
    NO_DIFFERENCE,
    PROFILE_BETTER,
    TRAINER_BETTER,
    Metric,
    paired,
    round_to_spread,
    t_quantile,
)

WORLD = sorted((presets_root() / "world").glob("*.toml"))


# ------------------------------------------------------------------------------------------ stats
def test_t_quantiles_are_the_table_values() -> None:
    assert t_quantile(1) == 12.706 and t_quantile(4) == 2.776 and t_quantile(30) == 2.042
    assert t_quantile(60) == pytest.approx(2.000, abs=2e-3)  # table: 2.000
    assert t_quantile(120) == pytest.approx(1.980, abs=2e-3)  # table: 1.980
    with pytest.raises(ValueError):
        t_quantile(0)


def test_paired_interval_and_verdicts() -> None:
    loss = Metric("loss", higher_better=False)
    s = paired(loss, [1.0, 2.0, 3.0, 4.0, 5.0], [0.5, 1.0, 2.0, 3.5, 4.0])
    assert s.diffs == (0.5, 1.0, 1.0, 0.5, 1.0)
    mean, sd = 0.8, math.sqrt(0.075)
    assert s.diff_mean == pytest.approx(mean) and s.diff_sd == pytest.approx(sd)
    half = 2.776 * sd / math.sqrt(5)
    assert s.interval == pytest.approx((mean - half, mean + half))
    # A's loss is higher with the whole interval above zero: the profile (B) is better
    assert s.verdict == PROFILE_BETTER
    acc = Metric("accuracy", higher_better=True)
    assert paired(acc, [0.9, 0.8, 0.85], [0.5, 0.45, 0.5]).verdict == TRAINER_BETTER
    assert paired(acc, [0.5, 0.45, 0.5], [0.9, 0.8, 0.85]).verdict == PROFILE_BETTER
    assert paired(acc, [0.5, 0.6, 0.4], [0.55, 0.5, 0.45]).verdict == NO_DIFFERENCE
    # one seed: no interval, no verdict either way (a degenerate difference: te_align.ab.stats.NO_VERDICT)
    one = paired(loss, [1.0], [0.0])
    assert math.isnan(one.interval[0]) and one.verdict == "no verdict (degenerate: fewer than 2 seeds or no spread)"
    with pytest.raises(ValueError):
        paired(loss, [1.0, 2.0], [1.0])


def test_round_to_spread_keeps_two_significant_digits_of_the_spread() -> None:
    assert round_to_spread(0.123456, 0.0042) == "0.1235"
    assert round_to_spread(12.3456, 3.1) == "12.3"
    assert round_to_spread(12.3456, 31.0) == "12"
    assert round_to_spread(0.5, float("nan")) == "0.5"
    assert round_to_spread(float("nan"), 1.0) == "n/a"


# ---------------------------------------------------------------------------------- world presets
def test_world_presets_validate_and_cite_sources() -> None:
    from te_align.tiny.bases import BASES

    assert {p.stem for p in WORLD} >= {"sd3-t5-77", "sd3-t5-154", "sd3-no-encoder-dropout", "sd3-null"}
    for path in WORLD:
        p = load_preset(path)
        assert p.world is not None and p.world.base in BASES  # a known world base
        assert p.name.startswith("world-")
        if p.baseline.kind in ("null", "positive"):
            assert not p.baseline.overrides and not p.baseline.train
            continue
        assert re.search(r"[\w-]+/[\w.-]+@[0-9a-f]{7,40} \S+:\d+", p.baseline.source), p.baseline.source


def test_every_world_row_trains_at_the_rate_its_base_was_calibrated_to() -> None:
    """The calibration rule fixes one learning rate per base before its rows run (bench_effects.md; the files written
    by benchmarks/effects/effects_calibrate.py); every row on that base trains at it, none at a placeholder."""
    root = Path(__file__).resolve().parents[2] / "benchmarks" / "effects"
    chosen: dict[str, float] = {}
    for path in sorted(root.glob("calibration*.json")):
        for base, rate in json.loads(path.read_text(encoding="utf-8"))["chosen"].items():
            assert base not in chosen, f"{base} calibrated twice ({path.name})"
            chosen[base] = rate
    assert chosen == {"sd3": 3e-4, "flux": 1e-4, "sd15": 1e-3, "sdxl": 1e-3, "chroma": 3e-4, "klein": 1e-3}
    for path in WORLD:
        p = load_preset(path)
        assert p.world is not None
        assert p.train["train"]["learning_rate"] == chosen[p.world.base], path.name


def test_null_control_arm_a_conditions_like_b_with_its_own_seed() -> None:
    p = load_preset(presets_root() / "world" / "sd3-null.toml")
    a, b = p.arm_profiles()
    assert a.fingerprint() == b.fingerprint()
    cfg_a = train_config_dict(p, model="m", data="d", out="o", profile="x", seed=3, arm="A")
    cfg_b = train_config_dict(p, model="m", data="d", out="o", profile="x", seed=3, arm="B")
    assert cfg_b["train"]["seed"] == 45 and cfg_a["train"]["seed"] == 45 + NULL_SEED_OFFSET
    cfg_a["train"].pop("seed"), cfg_b["train"].pop("seed")
    assert cfg_a == cfg_b


def test_baseline_train_settings_apply_to_arm_a_only() -> None:
    p = load_preset(presets_root() / "world" / "sd3-no-encoder-dropout.toml")
    a = train_config_dict(p, model="m", data="d", out="o", profile="x", seed=0, arm="A")
    b = train_config_dict(p, model="m", data="d", out="o", profile="x", seed=0, arm="B")
    assert b["data"]["encoder_dropout"] == {"all": "profile"} and a["data"]["encoder_dropout"] == {}
    a["data"].pop("encoder_dropout"), b["data"].pop("encoder_dropout")
    assert a == b


def _world_data() -> dict[str, Any]:
    from te_align import _toml as tomllib

    return tomllib.loads((presets_root() / "world" / "sd3-t5-77.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["baseline"].update(null=True), "a null control has no overrides"),
        (lambda d: d["baseline"].update(overrides={}), "must differ from the profile: set overrides or train"),
        (lambda d: d["baseline"].update(train={"data": {"path": "x"}}), "key 'baseline.train.data': set by the A/B runner"),
        (lambda d: d["baseline"].update(train={"dat": {}}), "baseline.train.dat"),
        (lambda d: d["world"].update(concept="colour=magenta"), "key 'world.concept'"),
        (lambda d: d["world"].update(concept="pink"), "key 'world.concept'"),
        (lambda d: d["world"].update(base="sd4"), "no pretrained world base 'sd4'"),
        (lambda d: d["world"].update(train_images=0), "train_images >= 1"),
        (lambda d: d["world"].update(space="tiny"), "key 'world.space': no scene space 'tiny'; spaces: full, simple"),
        (lambda d: d["eval"].update(accuracy_steps=0), "accuracy_steps >= 1"),
    ],
)
def test_world_preset_errors_name_the_key(change: Any, message: str) -> None:
    data = _world_data()
    change(data)
    with pytest.raises(ABError, match=re.escape(message)):
        preset_from_dict(data, file="w.toml")


# ------------------------------------------------------------------------------ answer keys, accuracy
def test_answer_key_round_trip_and_ground_truth_scores_perfectly(tmp_path: Path) -> None:
    from te_align.ab.accuracy import score_images
    from te_align.tiny import world
    from te_align.tiny.datasets import read_answer_key, write_world_split

    concept = world.Concept("colour", "pink", holdout=(("shape", "triangle"),))
    samples = world.make_dataset(8, 5, split="validation", concept=concept, image_size=48, tokenizer=False)
    write_world_split(tmp_path, samples, concept)
    key = read_answer_key(tmp_path)
    assert key is not None and key["concept"] == {"attribute": "colour", "value": "pink", "holdout": [["shape", "triangle"]]}
    assert sorted(key["items"]) == [f"{s.index:05d}" for s in samples]
    for s in samples:
        entry = key["items"][f"{s.index:05d}"]
        assert entry["objects"] == [[o.colour, o.shape, o.position, o.colour == "pink"] for o in s.objects]
        assert (tmp_path / f"{s.index:05d}.txt").read_text(encoding="utf-8") == s.caption
    # every validation scene carries the concept in a held-out combination (a pink triangle)
    assert all(any(o[3] and o[1] == "triangle" for o in e["objects"]) for e in key["items"].values())
    truths = [key["items"][f"{s.index:05d}"]["objects"] for s in samples]
    scores = score_images([s.image for s in samples], truths)
    n_obj = sum(len(s.objects) for s in samples)
    n_con = sum(o.colour == "pink" for s in samples for o in s.objects)
    assert scores["objects"] == n_obj and scores["concept_objects"] == n_con
    assert scores["object_accuracy"] == 1.0 and scores["concept_accuracy"] == 1.0 and scores["image_accuracy"] == 1.0
    # a blank image reads as nothing: every object missed
    blank = [s.image * 0 + 242 for s in samples]
    assert score_images(blank, truths)["object_accuracy"] == 0.0
    (tmp_path / "world.json").write_text(json.dumps({"format": 2}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a shapes-world answer key"):
        read_answer_key(tmp_path)


# ------------------------------------------------------------------------------------------ tables
def test_summary_rows_carry_interval_and_verdict() -> None:
    from te_align.ab.runner import ArmRun, summarize, verdict_of

    runs = []
    for s, (va, vb, aa, ab) in enumerate([(0.50, 0.40, 0.2, 0.6), (0.52, 0.41, 0.3, 0.7), (0.49, 0.42, 0.25, 0.65)]):
        for arm, v, acc in (("A", va, aa), ("B", vb, ab)):
            r = ArmRun(seed=s, arm=arm, steps=10, losses=[(i, 1.0) for i in range(10)], val=[(0, 1.0), (10, v)],
                       val_own=[(0, 1.0), (10, v)])  # fmt: skip
            r.accuracy = {"object_accuracy": acc, "concept_accuracy": acc / 2}
            runs.append(r)
    rows = {r.metric: r for r in summarize(runs, 3)}
    val = rows["validation loss, final (profile conditioning)"]
    d = [0.10, 0.11, 0.07]
    assert val.diff_mean == pytest.approx(sum(d) / 3) and val.verdict == PROFILE_BETTER
    half = 4.303 * val.diff_sd / math.sqrt(3)
    assert (val.ci_low, val.ci_high) == pytest.approx((val.diff_mean - half, val.diff_mean + half))
    acc = rows["prompt accuracy: objects exact (profile conditioning)"]
    assert acc.higher_better and acc.diff_mean == pytest.approx(-0.4) and acc.verdict == PROFILE_BETTER
    # both arms' training loss is 1.0 at every step: a zero difference on every seed is degenerate, no verdict
    assert rows["training loss, last 20% of steps"].verdict == "no verdict (degenerate: fewer than 2 seeds or no spread)"
    assert verdict_of(list(rows.values())) == PROFILE_BETTER
