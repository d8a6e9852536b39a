"""A/B preset trainings: presets validate, the demo runs end to end, the report holds the measured numbers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from te_align import _toml as tomllib
from te_align.ab.preset import ABError, list_presets, load_preset, preset_from_dict, presets_root

ROOT = Path(__file__).resolve().parents[2]
FAMILY_PRESETS = {"sd15": "sd15", "sdxl": "sdxl", "sd35-large": "sd35-large", "flux-dev": "flux-dev", "flux-schnell": "flux-schnell"}


# --------------------------------------------------------------------------------------- presets
def test_every_bundled_preset_validates() -> None:
    found = list_presets()
    world = {n for n in found if n.startswith("world-")}
    assert set(found) - world == {*FAMILY_PRESETS, "tiny-demo"} and "world-sd3-null" in world
    for name, path in found.items():
        p = load_preset(path)
        assert p.name == name
        if name in FAMILY_PRESETS:
            assert path.parent.name == FAMILY_PRESETS[name] and p.profile == FAMILY_PRESETS[name] and p.model
        if p.baseline.kind in ("null", "positive"):
            continue
        # cites upstream code a user can open: owner/repo@commit path:line
        assert re.search(r"[\w-]+/[\w.-]+@[0-9a-f]{7,40} \S+:\d+", p.baseline.source), p.baseline.source
        assert p.baseline.behaviour and p.baseline.why
        a, b = p.arm_profiles()
        if p.baseline.kind == "inference":  # one LoRA for both arms; the tool's conditioning differs at sampling
            assert a.fingerprint() == b.fingerprint()
            assert p.baseline.inference_chunks or p.baseline.inference_profile(b).fingerprint() != b.fingerprint()
            continue
        assert a.fingerprint() != b.fingerprint() or p.baseline.train
    assert load_preset("tiny-demo") == load_preset(presets_root() / "tiny-demo.toml")


def _tiny_demo_data() -> dict[str, Any]:
    return tomllib.loads((presets_root() / "tiny-demo.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["baseline"].update(trainer="kohyaa"), "expected one of"),
        (lambda d: d["baseline"].pop("source"), "baseline.source"),
        (lambda d: d["baseline"].update(overrides={"t5_max_length": 256}), "both arms would be identical"),
        (lambda d: d["baseline"].update(overrides={}), "must differ"),
        (lambda d: d["baseline"].update(transform="kohya-clip-g"), "unknown key"),
        (lambda d: d["baseline"].update(overrides={"t5.tokenizer.pad_token_in_prompt": "bpe"}), "'pad_id' | 'text'"),
        (lambda d: d["train"]["train"].update(seed=3), "set by the A/B runner"),
        (lambda d: d["train"]["train"].update(max_step=3), "max_steps"),
        (lambda d: d.update(evl={}), "eval"),
        (lambda d: d["eval"].update(timesteps=[0.0, 0.5]), "timesteps"),
    ],
)
def test_preset_errors_name_the_key(change: Any, message: str) -> None:
    data = _tiny_demo_data()
    change(data)
    with pytest.raises(ABError, match=re.escape(message)):
        preset_from_dict(data, file="x.toml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["eval"].update(seeds="3"), "x.toml: key 'eval.seeds': expected an integer, got '3'"),
        (lambda d: d["eval"].update(every="x"), "x.toml: key 'eval.every': expected an integer, got 'x'"),
        (lambda d: d["baseline"].update(overrides=5), "x.toml: key 'baseline.overrides': expected a table, got 5"),
        (lambda d: d["eval"].update(timesteps=["a"]), "x.toml: key 'eval.timesteps[0]': expected a number, got 'a'"),
        (lambda d: d["eval"].update(prompts="a red circle"),
         "x.toml: key 'eval.prompts': expected a list of strings, got 'a red circle'"),
        (lambda d: d["baseline"].update(trainer=3), "x.toml: key 'baseline.trainer': expected a string, got 3"),
        (lambda d: d.update(name=3), "x.toml: key 'name': expected a string, got 3"),
        (lambda d: d.update(train=[1]), "x.toml: key 'train': expected a table, got [1]"),
        (lambda d: d["eval"].update(seed=3), "x.toml: key 'eval.seed': unknown key (did you mean: seeds, noise_seed, first_seed?)"),
    ],
)
def test_wrongly_typed_preset_values_are_one_line_errors(change: Any, message: str) -> None:
    """Presets are type-checked like the train config: file, key and expected type in one line (issue 12, bug 3)."""
    data = _tiny_demo_data()
    change(data)
    with pytest.raises(ABError) as e:
        preset_from_dict(data, file="x.toml")
    assert str(e.value) == message


def test_unknown_preset_names_the_closest() -> None:
    with pytest.raises(ABError, match="tiny-demo"):
        load_preset("tiny-dem")


def test_kohya_clip_g_override_changes_only_exclamation_captions() -> None:
    import te_align
    from te_align.ab.evaluate import conditioning_divergence
    from te_align.tiny.fit import fit_profile
    from te_align.tiny.pipelines import build_pipeline_for_encoding

    pipe = build_pipeline_for_encoding("sdxl")
    prof = fit_profile(te_align.profile("sdxl"), pipe)
    arm_a, _ = load_preset("sdxl").arm_profiles(prof)
    assert arm_a.slot("clip_g").tokenizer.pad_token_in_prompt == "text"
    prompts = ["wow! amazing!!", "a photo of a cat"]
    a = te_align.encode(arm_a, prompts, pipeline=pipe)
    b = te_align.encode(prof, prompts, pipeline=pipe)
    div = {d.tensor: d for d in conditioning_divergence(a, b)}
    assert div["prompt_embeds"].prompts_differing == 1 and div["prompt_embeds"].max_abs_diff > 0
    assert div["prompt_embeds"].cosine < 1.0


# ------------------------------------------------------------------------------------------ demo
@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny-demo preset's A/B (random tiny SD3-shaped model, synthetic shapes): the runner and the report on
    presets without probe prompts."""
    from te_align.ab.runner import run_ab
    from te_align.tiny.datasets import make_shapes_dataset
    from te_align.tiny.fit import tiny_profile_overrides
    from te_align.tiny.pipelines import build_tiny_sd3

    root = tmp_path_factory.mktemp("demo")
    model = build_tiny_sd3(root / "model")
    make_shapes_dataset(root / "data")
    return run_ab("tiny-demo", model=model, data=root / "data", seeds=2, out=root / "ab", max_steps=4,
                  profile_overrides=tiny_profile_overrides(model), say=lambda s: None)  # fmt: skip


def _tables(md: str) -> list[list[list[str]]]:
    tables, cur = [], []
    for line in md.splitlines():
        if line.startswith("|"):
            cur.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif cur:
            tables.append(cur)
            cur = []
    if cur:
        tables.append(cur)
    return tables


def test_demo_runs_end_to_end(demo: Any) -> None:
    assert demo.seeds == 2 and len(demo.runs) == 4
    for r in demo.runs:
        assert r.steps == 4 and len(r.losses) == 4
        assert [s for s, _ in r.val] == [0, 4] and len(r.samples) == 4
        assert all(Path(f).is_file() for f in r.samples)
    # step 0 is the base model: identical for both arms under the profile's conditioning
    assert demo.run(0, "A").val[0] == demo.run(0, "B").val[0]
    # arm B is conditioned by the profile: both of its validation losses coincide
    assert demo.run(0, "B").val == demo.run(0, "B").val_own
    div = {d.tensor: d for d in demo.divergence}
    t5_a, t5_b = 77 + 154, 77 + 256
    assert div["prompt_embeds"].shape_a[1] == t5_a and div["prompt_embeds"].shape_b[1] == t5_b
    assert div["prompt_embeds"].max_abs_diff > 0 and div["pooled_prompt_embeds"].max_abs_diff == 0
    state = json.loads((demo.out_dir / "ab_state.json").read_text())
    assert set(state["runs"]) == {"0/A", "0/B", "1/A", "1/B"} and all(r["evaluated"] for r in state["runs"].values())


def test_report_tables_hold_the_measured_numbers(demo: Any) -> None:
    from te_align.ab.report import fmt

    md = demo.report_md.read_text(encoding="utf-8")
    tables = _tables(md)
    # one summary (it was shown twice: a headline and a full-precision table), right under the verdict
    summaries = [t for t in tables if t[0][0] == "metric"]
    assert len(summaries) == 1 and "## Summary" not in md
    summary = summaries[0]
    assert summary[0] == ["metric", "A", "B", "A - B", "95% interval of A - B", "verdict"]
    assert len(summary) - 2 == len(demo.summary)
    for row, s in zip(summary[2:], demo.summary, strict=True):
        assert row[0] == s.metric and row[5] == s.verdict
        pct = "loss" not in s.metric and "per image" not in s.metric
        scale = 100.0 if pct else 1.0
        for cell, value in ((row[1], s.a_mean), (row[2], s.b_mean), (row[3], s.diff_mean)):
            number = cell.removesuffix("%").removesuffix(" points")
            decimals = len(number.split(".")[1]) if "." in number else 0
            # the measured value, rounded (half a unit of its last digit), at most 4 significant digits past the spread
            assert float(number) == pytest.approx(value * scale, abs=0.5 * 10**-decimals + 1e-12), (s.metric, cell, value)
        if s.n >= 2 and s.ci_low == s.ci_low:
            lo, hi = (float(x) for x in row[4].strip("[]").split(", "))
            assert (lo, hi) == (pytest.approx(s.ci_low * scale, abs=10**-decimals), pytest.approx(s.ci_high * scale, abs=10**-decimals))
    val_a = [r.final_val for r in demo.runs if r.arm == "A"]
    val_b = [r.final_val for r in demo.runs if r.arm == "B"]
    loss = next(s for s in demo.summary if s.metric.startswith("validation loss, final (profile"))
    assert loss.diff_mean == pytest.approx(sum(val_a) / 2 - sum(val_b) / 2)
    div = next(t for t in tables if t[0][0] == "tensor")
    assert {r[0]: float(r[3]) for r in div[2:]} == {d.tensor: float(fmt(d.max_abs_diff)) for d in demo.divergence}
    per_step = next(t for t in tables if t[0][0] == "step")
    assert per_step[0][1:] == [f"seed {r.seed} {r.arm}" for r in demo.runs]
    for row in per_step[2:]:
        step = int(row[0])
        assert row[1:] == [fmt(dict(r.val)[step]) for r in demo.runs]
    runs = next(t for t in tables if t[0][0] == "seed")
    assert [(int(r[0]), r[1], r[5]) for r in runs[2:]] == [(r.seed, r.arm, fmt(r.final_val)) for r in demo.runs]


def test_report_pngs_are_valid_and_html_is_self_contained(demo: Any) -> None:
    from PIL import Image

    md = demo.report_md.read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == 3
    for link in links:
        with Image.open(demo.out_dir / link) as im:
            im.verify()
        with Image.open(demo.out_dir / link) as im:
            assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    page = demo.report_html.read_text(encoding="utf-8")
    srcs = re.findall(r'src="([^"]+)"', page)
    assert len(srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in srcs)
    import base64
    import io

    for s in srcs:
        with Image.open(io.BytesIO(base64.b64decode(s.split(",", 1)[1]))) as im:
            im.verify()


def test_interrupted_ab_resumes_finished_arms(demo: Any) -> None:
    from te_align.ab.runner import run_ab
    from te_align.tiny.fit import tiny_profile_overrides

    state_path = demo.out_dir / "ab_state.json"
    state = json.loads(state_path.read_text())
    del state["runs"]["1/B"]  # as if the run had stopped while training seed 1, arm B
    state_path.write_text(json.dumps(state))
    said: list[str] = []
    model = demo.out_dir.parent / "model"
    again = run_ab("tiny-demo", model=model, data=demo.out_dir.parent / "data", seeds=2, out=demo.out_dir, max_steps=4,
                   profile_overrides=tiny_profile_overrides(model), say=said.append, report=False)  # fmt: skip
    trained = [s for s in said if s.startswith("seed") and "..." in s]
    assert trained == ["seed 1 arm B (profile sd35-large): resuming ..."]
    assert again.run(1, "B").val == demo.run(1, "B").val  # same weights, same fixed noise: same numbers
    assert again.run(0, "A").val == demo.run(0, "A").val
    with pytest.raises(ABError, match="different preset"):
        run_ab("tiny-demo", model=model, data=demo.out_dir.parent / "data", seeds=2, out=demo.out_dir, max_steps=5,
               profile_overrides=tiny_profile_overrides(model), say=said.append)  # fmt: skip


def test_cli_ab_list_and_help_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom te_align.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['ab', 'list']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_sdxl_preset_with_the_kohya_clip_g_override_trains_and_evaluates(tmp_path: Path, tiny_model_folder: Callable[[str], Path]) -> None:
    """Arm A's tokenizer override (CLIP-G "!" as text) through te_align.train, and the eps validation loss."""
    from te_align.ab.runner import run_ab
    from te_align.tiny.datasets import make_squares_dataset
    from te_align.tiny.fit import profile_overrides

    data = tomllib.loads((presets_root() / "sdxl" / "sdxl-vs-kohya.toml").read_text(encoding="utf-8"))
    data["train"]["data"] = {"resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64}
    data["train"]["train"] = {"max_steps": 2, "batch_size": 2, "learning_rate": 1e-3}
    data["eval"].update(every=1, resolution=32, sample_size=32, sample_steps=2, sample_seeds=[0])
    preset = preset_from_dict(data)
    model = tiny_model_folder("sdxl")
    ds = make_squares_dataset(tmp_path / "data", n=6)
    for i, txt in enumerate(sorted(ds.glob("*.txt"))):
        if i % 2:
            txt.write_text(txt.read_text() + ", wow!", encoding="utf-8")
    result = run_ab(preset, model=model, data=ds, seeds=1, out=tmp_path / "ab", profile_overrides=profile_overrides("sdxl"),
                    say=lambda s: None)  # fmt: skip
    a, b = result.run(0, "A"), result.run(0, "B")
    assert [s for s, _ in a.val] == [0, 1, 2] and a.val[0] == b.val[0]
    assert a.val_own[0] != a.val[0]  # the base model sees different conditioning for the '!' captions
    div = {d.tensor: d for d in result.divergence}
    assert div["prompt_embeds"].shape_a == div["prompt_embeds"].shape_b and 0 < div["prompt_embeds"].prompts_differing
    assert div["prompt_embeds"].prompts_differing < div["prompt_embeds"].prompts  # captions without '!' are identical
    assert (tmp_path / "ab" / "data" / "val").is_dir()  # a held-out split was made
    assert result.report_html is not None and result.report_html.is_file()


def test_failed_ab_run_leaves_no_output_folder_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from te_align.cli import main

    for var, value in (("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                       ("DIFFUSERS_VERBOSITY", "error")):
        monkeypatch.setenv(var, value)  # what the command sets in its process, undone after the test
    out = tmp_path / "nested" / "ab-out"
    argv = ["ab", "run", "tiny-demo", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "nonexistent")]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"te-align: error: {tmp_path / 'nonexistent'}: key '--data': dataset folder does not exist\n"
    assert not out.exists() and not out.parent.exists()
    # a folder that was there before is left exactly as it was
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine", encoding="utf-8")
    assert main([*argv, "--out", str(kept)]) == 2
    assert sorted(p.name for p in kept.rglob("*")) == ["notes.txt"]
    assert (kept / "notes.txt").read_text(encoding="utf-8") == "mine"


@pytest.mark.parametrize("quiet", ["1", "0"])
def test_ab_commands_silence_library_bars_only_when_quiet(quiet: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`te-align ab run / matrix / demo` turn diffusers' and transformers' bars and info lines off; TE_ALIGN_QUIET=0
    (see te_align/_quiet.py) leaves them as they were."""
    import diffusers
    import transformers

    from te_align.commands.ab import _quiet

    libs = (diffusers.utils.logging, transformers.utils.logging)
    monkeypatch.setenv("TE_ALIGN_QUIET", quiet)
    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "DIFFUSERS_VERBOSITY"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    for lib in libs:
        lib.enable_progress_bar()
    try:
        _quiet()
        assert [lib.is_progress_bar_enabled() for lib in libs] == [quiet == "0"] * 2
        import os

        assert ("TRANSFORMERS_VERBOSITY" in os.environ) is (quiet == "1")
    finally:
        for lib in libs:
            lib.enable_progress_bar()


def test_demo_help_describes_the_demo_that_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`te-align --help` and `te-align demo --help` describe the demo row that runs (the Flux-shaped world base, T5
    512 vs 256) and its real defaults, not the tiny SD3 preset the demo once was."""
    from te_align.ab.demo import DEMO_ROW, DEMO_SEEDS, DEMO_STEPS
    from te_align.cli import main

    assert DEMO_ROW == "world-flux-t5-512"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert " ".join(out[out.index("    demo "):out.index("    comfyui ")].split()) == (
        "demo offline A/B on the shipped Flux-shaped world base: T5 at 512 tokens (as ai-toolkit trains schnell) vs "
        "the schnell recipe's 256, with a report (CPU, minutes)")
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"training steps per arm (default: {DEMO_STEPS})" in text
    assert f"seeds per arm (default: {DEMO_SEEDS})" in text
    # its description: the row, the base, the arms, what it shows and writes; no tiny SD3 model
    assert text[text.index("One row"):text.index(" options:")] == (
        "One row of te-align's pre-registered effects matrix (world-flux-t5-512), live and offline: a LoRA teaches the "
        "shipped Flux-shaped world base (a tiny FLUX.1-schnell-style model pretrained on coloured shapes, pink never "
        "seen) the colour pink, per seed twice: arm A with T5 at 512 tokens as ai-toolkit, diffusion-pipe and the "
        "diffusers Flux examples train schnell, arm B by the schnell recipe (256). Both arms are sampled on probe "
        "prompts and scored by the world's reader. Shows each phase with an ETA on stderr, then prints the verdict and "
        "the summary, and writes OUT/ab/report.html.")
    assert "SD3" not in text
