"""The severity policy of ``te-align check`` (te_align/audit/policy.py, docs/severity.md) on real findings of the
shipped example configs, with the shipped effects summary; and the summary's added statistics recomputed from the
committed per-seed results."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from te_align.ab.evidence import evidence_for, measured_direction
from te_align.ab.stats import smallest_detectable
from te_align.audit.findings import Finding
from te_align.audit.policy import decide
from te_align.checking import check_file, fix_file

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
SUMMARY = ROOT / "te_align" / "ab" / "data" / "effects.json"
RESULTS = ROOT / "benchmarks" / "effects" / "results"


def _deviation(r, setting: str) -> Finding:
    return next(f for f in r.findings if f.kind == "deviation" and f.setting == setting)


def test_an_uninformative_reading_is_no_measurement_and_shows_its_numbers(tmp_path: Path) -> None:
    """kohya's SD3 per-encoder dropout at 0.0 against the profile's 0.464 (world-sd3-no-encoder-dropout): re-run
    paired under amendment 9, its verdict is uninformative (amendment 10's positive control was not seen), so check
    does not act on it: the rule's own note, the profile's fix, the numbers and the trade-off shown beside it."""
    r = check_file(str(EX / "kohya" / "sd35_masks_live.toml"))
    for enc in ("clip_l", "clip_g", "t5"):
        f = _deviation(r, f"{enc}.train_dropout")
        assert (f.severity, f.effective, f.profile, f.fix) == ("info", 0.0, 0.464, f"{enc}_dropout_rate = 0.464")
    ev = evidence_for("sd3", "sd35-large", "clip_l.train_dropout", 0.0, trainer="kohya")
    assert measured_direction(ev) == ""
    assert ev["text"] == (
        "world-sd3-no-encoder-dropout (sd3 world base, 6 of 6 seeds): trainer's arm minus profile's +0.091 "
        "[Holm-adjusted interval +0.053, +0.129] on concept accuracy: uninformative (the positive control on the "
        "deviations' axis, world-sd3-positive-cut, was not seen) (Holm over the first plan's deviation and inference "
        "rows) (see docs/effects.md)")
    assert "forgetting (known colours) -0.146 [-0.245, -0.047] (higher is better)" in ev["lines"][-1]
    # instrument 2 (amendment 11) is shown, labelled post hoc: this row's arm A ran before the amendment
    assert ev["lines"][-2] == (
        "instrument 2 (concept net accuracy at 300 steps, amendment 11; post hoc: shown, not acted on): +0.062 "
        "[Holm-adjusted interval, all rows, -0.105, +0.230]: no measurable difference")
    assert ev["instrument_2"]["confirmatory"] is False and measured_direction(ev) == ""
    cfg = tmp_path / "sd35.toml"
    shutil.copy(EX / "kohya" / "sd35_masks_live.toml", cfg)
    report = fix_file(str(cfg), backup=False)  # --fix writes warnings' and errors' fixes, not a note's
    assert not any(c.describe().startswith(("clip_l_dropout", "clip_g_dropout", "t5_dropout")) for c in report.changes)
    assert "dropout_rate" not in cfg.read_text(encoding="utf-8")


def test_a_confirmatory_instrument_2_verdict_counts_where_the_preregistered_one_is_uninformative(tmp_path: Path) -> None:
    """sd-scripts' --max_token_length 225 on SD 1.5 (world-sd15-max-token-225): re-run paired under amendment 11, its
    pre-registered verdict is uninformative (amendment 10's control was not seen on the primary) and its instrument-2
    reading is confirmatory (its arm A ran after the amendment, whose control on new seeds read "profile better"): a
    measured null, so at most a warning, with both readings printed."""
    cfg = tmp_path / "sd15.toml"
    cfg.write_text('pretrained_model_name_or_path = "runwayml/stable-diffusion-v1-5"\nmax_token_length = 225\n',
                   encoding="utf-8")
    f = _deviation(check_file(str(cfg), trainer="kohya"), "clip_l.tokenizer.max_length")
    assert (f.severity, f.effective, f.profile) == ("warning", 227, 77)
    ev = evidence_for("sd15", "sd15", "clip_l.tokenizer.max_length", 227, trainer="kohya")
    assert ev["verdict"].startswith("uninformative") and ev["instrument_2"]["confirmatory"] is True
    assert ev["instrument_2"]["verdict"] == "no measurable difference" and measured_direction(ev) == "null"
    assert ev["lines"][1] == (
        "instrument 2 (concept net accuracy at 300 steps, amendment 11; confirmatory): +0.167 "
        "[Holm-adjusted interval, all rows, -0.055, +0.389]: no measurable difference")
    # the same reading recomputed from the committed per-seed results: the last checkpoint's net, A - B
    diffs = []
    for seed in range(6):
        arms = json.loads((RESULTS / "world-sd15-max-token-225" / f"seed-{seed}.json").read_text(encoding="utf-8"))["arms"]
        diffs.append(arms["A"]["curve"][-1][1]["net"] - arms["B"]["curve"][-1][1]["net"])
    assert ev["instrument_2"]["diff_mean"] == pytest.approx(statistics.fmean(diffs))


def test_trainer_default_measured_better_is_a_note_and_fix_keeps_it() -> None:
    """A row read "trainer default better" in both Holm families: a note saying so, a fix that keeps the trainer's
    value and no edit (the policy, on the kohya SD3 dropout finding with that reading)."""
    r = check_file(str(EX / "kohya" / "sd35_masks_live.toml"))
    f = dataclass_replace(_deviation(r, "clip_l.train_dropout"), severity="warning")
    ev = evidence_for("sd3", "sd35-large", "clip_l.train_dropout", 0.0, trainer="kohya")
    better = {**ev, "verdict": "trainer default better", "verdict_all": "trainer default better"}
    assert measured_direction(better) == "trainer default better"
    g = decide(f, better, None)
    assert (g.severity, g.edit) == ("info", None)
    assert g.fix == "keep 0.0: it measured better than the profile's 0.464 (the profile's fix would be: clip_l_dropout_rate = 0.464)"
    assert "te-align measured the trainer's value (0.0) better than the profile's (0.464)" in g.message


def test_a_measured_null_is_a_warning_with_its_interval() -> None:
    """SimpleTuner's SD3 T5 at 154: once an error, measured null (world-sd3-t5-154), so a warning; its fix needs
    i_know_what_i_am_doing, which the finding names."""
    r = check_file(str(EX / "simpletuner" / "sd3_config.json"))
    f = _deviation(r, "t5.tokenizer.max_length")
    assert (f.severity, f.effective, f.profile) == ("warning", 154, 256)
    assert "a measured null (no difference this study resolves), so at most a warning" in f.message
    assert "--allow-unsafe-keys" in f.message
    ev = evidence_for("sd3", "sd35-large", "t5.tokenizer.max_length", 154, trainer="simpletuner")
    assert measured_direction(ev) == "null"
    assert ev["text"].startswith("world-sd3-t5-154 (sd3 world base, 6 of 6 seeds): trainer's arm minus profile's +0.042 "
                                 "[Holm-adjusted interval -0.036, +0.120] on concept accuracy: no measurable difference")
    assert ev["lines"][0] == ("unadjusted 95% CI -0.004, +0.088; smallest effect this row could detect: 0.116 (80% "
                              "power, from the null controls' spread)")
    assert ev["lines"][1] == ("instrument 2 (concept net accuracy at 300 steps, amendment 11; post hoc: shown, not acted "
                              "on): +0.083 [Holm-adjusted interval, all rows, -0.055, +0.222]: no measurable difference")
    assert ev["lines"][2] == ("simpletuner's defaults together (world-sd3-simpletuner-defaults: t5_max_length = 154, "
                              "train.data.encoder_dropout = {}): +0.089 [Holm-adjusted interval +0.023, +0.154]: "
                              "uninformative (the positive control on the deviations' axis, world-sd3-positive-cut, was "
                              "not seen)")
    assert ev["lines"][3] == ("trade-off, trainer's arm minus profile's, unadjusted 95% CI (secondary metrics): "
                              "forgetting (known colours) -0.083 [-0.151, -0.016] (higher is better); validation loss "
                              "(profile conditioning) +0.00115 [+0.00091, +0.00139] (lower is better)")


def test_not_measured_and_losing_nothing_is_a_warning() -> None:
    r = check_file(str(EX / "kohya" / "flux_schnell_lora.toml"))
    for setting in ("t5.masks.encoder", "t5.masks.denoiser"):
        f = _deviation(r, setting)
        assert f.severity == "warning"
        assert f.message.endswith("Severity: not measured by te-align's effects matrix and it cuts no token, so a warning")
    assert _deviation(r, "t5.tokenizer.max_length").severity == "warning"  # measured null (world-flux-t5-512)


def test_tokens_cut_is_counted_on_the_users_captions(tmp_path: Path) -> None:
    """OneTrainer's FLUX.1-dev T5 at 77 against 512 (not measured: the Flux base has schnell's recipe): an error
    without captions; with --dataset, a warning when no caption can pass 77 tokens, an error when one certainly does."""
    cfg = str(EX / "onetrainer" / "flux_lora.json")
    f = _deviation(check_file(cfg), "t5.tokenizer.max_length")
    assert (f.severity, f.effective, f.profile) == ("error", 77, 512)
    assert "pass --dataset DIR to count yours" in f.message
    short = tmp_path / "short"
    short.mkdir()
    (short / "a.txt").write_text("a red circle on white", encoding="utf-8")
    f = _deviation(check_file(cfg, dataset=[str(short)]), "t5.tokenizer.max_length")
    assert f.severity == "warning" and f"no caption of 1 caption file(s) in {short} certainly passes 77 tokens" in f.message
    (short / "b.txt").write_text("x" * 100, encoding="utf-8")  # one word of 100 bytes: might pass 77 tokens
    f = _deviation(check_file(cfg, dataset=[str(short)]), "t5.tokenizer.max_length")
    assert f.severity == "warning" and "(1 might: more than 75 bytes)" in f.message
    (short / "c.txt").write_text(" ".join(["word"] * 80), encoding="utf-8")  # 80 words: 81 tokens at least
    f = _deviation(check_file(cfg, dataset=[str(short)]), "t5.tokenizer.max_length")
    assert f.severity == "error" and f"1 of 3 caption file(s) in {short} have more words than the 77 tokens kept" in f.message


def test_a_verdict_that_rests_on_its_family_is_read_as_a_null() -> None:
    """world-chroma-t5-no-mask: profile better in its own one-row family, no measurable difference among all rows."""
    ev = evidence_for("chroma", "chroma", "t5.masks.encoder", False)
    assert (ev["verdict"], ev["verdict_all"], ev["family_differs"]) == ("profile better", "no measurable difference", True)
    assert measured_direction(ev) == "null"
    assert ev["lines"][0] == ("† the verdict rests on its family: among all deviation and inference rows in one Holm "
                              "family it reads no measurable difference (Holm p 0.492)")
    assert ev["lines"][1] == ("‡ the paired t test (p 0.038) and the exact sign-flip test (p 0.125) disagree at 0.05")
    f = Finding(kind="deviation", severity="error", setting="t5.masks.encoder", effective=False, profile=True,
                message="T5 encodes without its mask")
    assert decide(f, ev, None).severity == "warning"
    # the same row read as a harm in both families would be an error (a measured harm)
    harm = {**ev, "verdict_all": "profile better"}
    assert decide(dataclass_replace(f, severity="warning"), harm, None).severity == "error"


def dataclass_replace(f: Finding, **kw: object) -> Finding:
    import dataclasses

    return dataclasses.replace(f, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------- the shipped summary, recomputed
def test_effects_summary_is_strict_json_with_both_holm_readings() -> None:
    text = SUMMARY.read_text(encoding="utf-8")

    def refuse(c: str) -> None:
        raise ValueError(f"not strict JSON: {c}")

    data = json.loads(text, parse_constant=refuse)
    rows = {r["preset"]: r for r in data["rows"]}
    differs = sorted(n for n, r in rows.items() if r["family_differs"] and r["kind"] in ("deviation", "inference"))
    assert differs == ["world-chroma-t5-no-mask"]
    assert rows["world-chroma-t5-no-mask"]["p_holm"] == pytest.approx(0.0379, abs=1e-4)
    assert rows["world-chroma-t5-no-mask"]["p_holm_all"] == pytest.approx(0.492, abs=1e-3)
    assert sorted(n for n, r in rows.items() if r["tests_disagree"]) == [
        "world-chroma-t5-no-mask", "world-flux-comfyui", "world-sd3-positive-cut-confirm"]
    # an adjusted interval excludes 0 exactly when the verdict names a winner (a gated verdict, uninformative, is not
    # the test's reading: its interval is the test's all the same)
    for r in rows.values():
        if r["kind"] in ("deviation", "inference") and not r["verdict"].startswith("uninformative"):
            lo, hi = r["adjusted_ci"]
            assert (lo > 0 or hi < 0) == (r["verdict"] != "no measurable difference"), r["preset"]
    assert rows["world-sd3-no-encoder-dropout"]["secondary"]["forgetting (known colours)"]["ci_low"] == pytest.approx(
        -0.245, abs=1e-3)
    assert "world-sd3-simpletuner-defaults" in rows["world-sd3-no-encoder-dropout"]["shares_arm_b_with"]


def test_smallest_detectable_effect_is_computed_from_the_committed_null_seeds() -> None:
    """The pooled spread of the null controls' per-seed differences, recomputed here from the result files."""
    num = den = 0.0
    for row in ("world-sd3-null", "world-flux-null"):
        diffs = []
        for f in sorted((RESULTS / row).glob("seed-*.json")):
            d = json.loads(f.read_text(encoding="utf-8"))
            diffs.append(d["arms"]["A"]["curve_mean"] - d["arms"]["B"]["curve_mean"])
        num += (len(diffs) - 1) * statistics.variance(diffs)
        den += len(diffs) - 1
    s = math.sqrt(num / den)
    assert s == pytest.approx(0.0476, abs=1e-4)
    rows = {r["preset"]: r for r in json.loads(SUMMARY.read_text(encoding="utf-8"))["rows"]}
    assert rows["world-sd3-t5-77"]["mde_unadjusted"] == pytest.approx(smallest_detectable(s, 6, 0.05))
    assert rows["world-sd3-t5-77"]["mde"] == pytest.approx(smallest_detectable(s, 6, 0.05 / 13))
    # the all-rows family: every deviation and inference row (18, and the 3 klein rows of issue 49)
    assert rows["world-sd3-t5-77"]["mde_all"] == pytest.approx(smallest_detectable(s, 6, 0.05 / 21))
    assert rows["world-chroma-t5-no-mask"]["mde"] == pytest.approx(smallest_detectable(s, 6, 0.05))  # a family of 1
    assert round(rows["world-sd3-t5-77"]["mde"], 3) == 0.116


def test_demo_shows_the_committed_matrix_in_its_verdicts_terms() -> None:
    from te_align.ab.demo import committed_blocks

    kind, header, rows = committed_blocks()[-1]
    assert kind == "table" and header[5] == "A - B [interval in its verdict's terms: Holm-adjusted; controls 95%]"
    by = {r[0]: r for r in rows}
    # world-flux-comfyui: unadjusted [+0.006, +0.165] beside "no measurable difference" was the contradiction
    assert by["world-flux-comfyui"][5:] == ["+0.086 [-0.054, +0.226]", "no measurable difference"]
    assert by["world-chroma-t5-no-mask"][6] == "profile better †"
    assert by["world-sd3-null"][5] == "+0.026 [-0.012, +0.064]"  # a control: its plain 95% interval
