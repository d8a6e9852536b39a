"""``benchmarks/swap/swap_study.py`` (issue 35): the driver end to end at a tiny size on the shipped SD 1.5 world base, and
its readings of the plan's claims on made-up complete results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "benchmarks" / "swap" / "swap_study.py"
TINY = ["--steps", "4", "--checkpoints", "0,2,4", "--train-images", "16", "--val-images", "4", "--probes", "4",
        "--grid-prompts", "2", "--seeds", "1"]  # fmt: skip


def _driver() -> Any:
    return load_script("benchmarks/swap/swap_study.py")


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(DRIVER), *args], capture_output=True, text=True, env=env, timeout=300)


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_driver_end_to_end_at_a_tiny_size(tmp_path: Path) -> None:
    where = ["--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"), "--doc", str(tmp_path / "swap.md"),
             "--figures", str(tmp_path / "figures"), "--summary", str(tmp_path / "study.json")]  # fmt: skip
    cells = ["--cells", "baseline-lr1e-3,cross-matched-lr1e-4"]
    cpu0 = _children_cpu()
    proc = _run([*where, *TINY, *cells, "--workers", "2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # under a minute on 2 free cores: CPU seconds of the driver and its two workers (wall time depends on the load)
    assert _children_cpu() - cpu0 < 60
    assert proc.stdout.startswith("2 units to run (0 already done), 2 workers\n"), proc.stdout
    swap_study = _driver()
    plan = swap_study.Settings(steps=4, checkpoints=(0, 2, 4), train_images=16, val_images=4, probes=4, grid_prompts=2,
                               seeds=(0,)).hash()  # fmt: skip
    for cell in ("baseline-lr1e-3", "cross-matched-lr1e-4"):
        data = json.loads((tmp_path / "results" / cell / "seed-0.json").read_text(encoding="utf-8"))
        assert data["plan"] == plan and data["seed"] == 0 and data["cell"]["name"] == cell
        assert [c["step"] for c in data["checkpoints"]] == [0, 2, 4]
        for row in data["checkpoints"]:
            assert set(row) >= {"exact", "colour", "shape", "position", "drawn", "extra", "val_loss"}
            assert 0.0 <= row["exact"] <= row["colour"] + 1e-9 <= 1.0 + 1e-9
        assert len(data["checkpoints"][-1]["reads"]) == 4 and "reads" not in data["checkpoints"][0]
        assert data["machine"]["threads"] == 1
        from PIL import Image

        with Image.open(tmp_path / "results" / cell / "seed-0.png") as im:
            assert im.size == (64, 32)  # the first 2 prompts at 32 px
        assert not (tmp_path / "out" / cell / "seed-0" / "run" / "checkpoints").exists()
    base = json.loads((tmp_path / "results" / "baseline-lr1e-3" / "seed-0.json").read_text(encoding="utf-8"))
    swapped = json.loads((tmp_path / "results" / "cross-matched-lr1e-4" / "seed-0.json").read_text(encoding="utf-8"))
    assert base["swap"] is None
    assert swapped["swap"]["used_scale"] == swapped["swap"]["measured_scale"]
    assert swapped["swap"]["reset_layers"] == 28 and 1.5 < swapped["swap"]["target"]["std"] < 1.8
    assert base["checkpoints"][0]["exact"] == 1.0  # the unswapped base draws what is asked before any training
    # the results section
    doc = (tmp_path / "swap.md").read_text(encoding="utf-8")
    assert doc.startswith(swap_study.BEGIN) and doc.rstrip().endswith(swap_study.END)
    assert f"settings hash `{plan}`); 2 of 19 cell-seeds in" in doc
    assert "| baseline: CLIP, not swapped | 1.00 | |" in doc and "Readings pending: 2 of 19 cell-seeds are in" in doc
    assert "![exact accuracy by step, lr 0.001](figures/curves-lr1e-3.png)" in doc
    for name in ("curves-lr1e-3.png", "curves-lr1e-4.png", "samples-lr1e-3.png", "samples-lr1e-4.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # resumable: finished units are never run again; the dry run rewrites only its own section
    (tmp_path / "swap.md").write_text("# Swap\n\nintro\n\n" + doc + "\n## After\n", encoding="utf-8")
    proc = _run([*where, *TINY, *cells])
    assert proc.returncode == 0 and proc.stdout.startswith("0 units to run (2 already done)"), proc.stdout + proc.stderr
    again = (tmp_path / "swap.md").read_text(encoding="utf-8")
    assert again.startswith("# Swap\n\nintro\n\n" + swap_study.BEGIN) and again.endswith(swap_study.END + "\n\n## After\n")
    assert again.count(swap_study.BEGIN) == 1
    # results of another plan (here: the planned size) are refused, never mixed
    proc = _run([*where, "--dry-run"])
    assert proc.returncode == 0, proc.stderr
    assert "0 of 57 cell-seeds in" in proc.stdout and "Refused (another plan): 2 files" in proc.stdout
    assert not (tmp_path / "study.json").exists()  # an unfinished study is never summarised for --report


def _fake(settings: Any, cell: Any, seed: int, exact: float, drawn: float = 1.0, extra: float = 0.0) -> dict[str, Any]:
    rows = [{"step": s, "exact": exact * s / settings.steps, "colour": 1.0, "shape": 1.0, "position": 1.0, "drawn": drawn,
             "extra": extra, "val_loss": 0.01, "reads": []} for s in settings.checkpoints]  # fmt: skip
    swap = None if cell.reset is None else {"target": {"std": 1.654}, "before": {"std": 0.678}}
    return {"plan": settings.hash(), "seed": seed, "cell": {"name": cell.name}, "checkpoints": rows, "swap": swap,
            "wall_seconds": 100.0, "cpu_seconds": 98.0}  # fmt: skip


def test_the_readings_follow_the_plans_rules(tmp_path: Path) -> None:
    swap_study = _driver()
    settings = swap_study.Settings()
    noise = (0.0, 0.01, -0.01)
    for index, cell in enumerate(swap_study.cells(settings)):
        for seed in settings.seeds:
            exact, drawn, extra = 0.5, 1.0, 0.0
            if cell.reset == "cross" and cell.lr == 1e-4 and cell.scaling == "matched":
                exact = 0.8  # best at the low rate
            if cell.reset == "qk":
                exact = 0.7 if cell.lr == 1e-3 else 0.3  # gains from the higher rate
            if cell.reset == "all":
                exact, drawn, extra = (0.1, 0.2, 0.0) if cell.lr == 1e-4 else (0.4, 0.95, 0.0)  # collapses at the low rate
            if cell.scaling == "unscaled":
                exact -= 0.05  # matching helps everywhere
            if cell.scaling == "std0.2":
                exact = 0.6
            # a little noise of the cell's own, so that no paired difference is degenerate (zero spread gets no verdict)
            jitter = 0.003 * ((index + seed) % 3)
            data = _fake(settings, cell, seed, exact + noise[seed] + jitter, drawn, extra)
            path = tmp_path / "results" / cell.name / f"seed-{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data), encoding="utf-8")
    section = swap_study.write_doc(settings, tmp_path / "results", tmp_path / "swap.md", tmp_path / "figures")
    assert "57 of 57 cell-seeds in" in section
    assert "57 units ran on a free core (wall within 5% of CPU): median 98 s. The grid on two free cores: 57 units x 98 s" \
           " / 2 workers = 0.78 hours (the budget: 3)." in section
    assert "**C1, the cross-attention reset recovers best at the low rate: supported.**" in section
    assert "**C2, a Q/K reset needs the higher rate: supported.**" in section
    assert "**C3, a full reset collapses unless the rate is raised: supported.**" in section
    assert "**C4, matching the std matters: supported** (8 of 8 pairs: matching helps; 0: it hurts)" in section
    assert "C5, is 0.2 special?** The SD 1.5 world base's CLIP conditioning std is 1.654" in section
    assert "what helps is the base's own statistic" in section
    assert "| cross | 0.80 [0.78, 0.83] | 0.45 [0.42, 0.49] |" in section
    stats, _ = swap_study.load_results(tmp_path / "results", settings)
    summary = swap_study.study_summary(stats, settings)
    assert {k: v["verdict"] for k, v in summary["claims"].items()} == {
        "C1": "supported", "C2": "supported", "C3": "supported", "C4": "supported", "C5": "own std better"}
    assert summary["best"]["0.0001"] == {"cell": "cross-matched-lr1e-4", "reset": "cross", "scaling": "matched",
                                         "exact": [0.803, 0.7809, 0.8251], "next": "none-matched-lr1e-4",
                                         "difference": [0.3, 0.2871, 0.3129], "resolved": True}  # fmt: skip
    assert summary["best"]["0.001"]["cell"] == "qk-matched-lr1e-3" and summary["base_std"] == 1.654
    from te_align.swap.study import report_lines

    lines = report_lines(summary, base_std=2.5)
    assert "    reset cross, matched           0.80 [0.78, 0.83]" in lines
    assert ("    highest: reset cross, matched (0.80 [0.78, 0.83]); against reset none, matched: +0.30 [+0.29, +0.31], "
            "resolved at 3 seeds") in lines  # fmt: skip
    assert "    C3 a full reset collapses unless the rate is raised: supported" in lines
    assert lines[-1] == ("  the study base's own conditioning std was 1.654; yours (measured above) is 2.500, and the output "
                         "scale above matches it.")  # fmt: skip
    # one seed missing: no summary (te-align swap --report never cites an unfinished study)
    (tmp_path / "results" / "all-unscaled-lr1e-4" / "seed-2.json").unlink()
    stats, _ = swap_study.load_results(tmp_path / "results", settings)
    assert swap_study.study_summary(stats, settings) is None
    assert not swap_study.write_summary(stats, settings, tmp_path / "study.json") and not (tmp_path / "study.json").exists()


def test_the_shipped_summary_is_the_committed_results_summary() -> None:
    """``te_align/swap/data/study.json`` (what ``te-align swap --report`` prints) is regenerated from the committed
    per-seed results, number for number."""
    swap_study = _driver()
    settings = swap_study.Settings()
    stats, refused = swap_study.load_results(swap_study.RESULTS, settings)
    assert not refused
    expected = swap_study.study_summary(stats, settings)
    shipped = ROOT / "te_align" / "swap" / "data" / "study.json"
    if expected is None:
        assert not shipped.exists()  # never a summary of an unfinished study
        return
    assert json.loads(shipped.read_text(encoding="utf-8")) == json.loads(json.dumps(expected))


@pytest.mark.parametrize("args, message", [
    (["--unit", "nope:0"], "--unit: expected CELL:SEED with CELL one of baseline-lr1e-3"),
    (["--cells", "cross-lr1e-3"], "--cells: unknown cell 'cross-lr1e-3'"),
    (["--steps", "8", "--checkpoints", "0,4"], "--checkpoints: expected increasing steps from 0 to --steps (8), got [0, 4]"),
])  # fmt: skip
def test_bad_arguments_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    proc = _run([*args, "--out", str(tmp_path / "o"), "--results", str(tmp_path / "r")])
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_an_interrupted_unit_resumes_to_the_same_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit stopped after its step-2 checkpoint was trained but before it was evaluated continues from that
    checkpoint (not from the start) and ends with exactly the result of an uninterrupted unit."""
    import torch

    swap_study = _driver()
    torch.set_num_threads(1)
    settings = swap_study.Settings(steps=4, checkpoints=(0, 2, 4), train_images=16, val_images=4, probes=2, grid_prompts=1,
                                   seeds=(0,))  # fmt: skip
    cell = next(c for c in swap_study.cells(settings) if c.name == "qk-unscaled-lr1e-3")
    whole = swap_study.run_unit(settings, cell, 0, tmp_path / "a", tmp_path / "ra", say=lambda m: None)
    real = swap_study.Evaluator.__call__
    calls = []

    def stop_at_step_2(self: Any, pipe: Any, profile: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # step 0 was evaluated; step 2 is trained and checkpointed, then the process "dies"
            raise KeyboardInterrupt
        return real(self, pipe, profile)

    monkeypatch.setattr(swap_study.Evaluator, "__call__", stop_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        swap_study.run_unit(settings, cell, 0, tmp_path / "b", tmp_path / "rb", say=lambda m: None)
    unit = tmp_path / "b" / cell.name / "seed-0"
    assert [p.name for p in (unit / "run" / "checkpoints").iterdir()] == ["step-00000002"]
    monkeypatch.setattr(swap_study.Evaluator, "__call__", real)
    resumed = swap_study.run_unit(settings, cell, 0, tmp_path / "b", tmp_path / "rb", say=lambda m: None)
    strip = ("eval_seconds",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in resumed["checkpoints"]] == \
        [{k: v for k, v in r.items() if k not in strip} for r in whole["checkpoints"]]  # fmt: skip
    assert resumed["losses"] == whole["losses"] and resumed["swap"] == whole["swap"]
    assert (tmp_path / "rb" / cell.name / "seed-0.png").read_bytes() == (tmp_path / "ra" / cell.name / "seed-0.png").read_bytes()


def test_caveats_cite_the_guidance_and_the_post_study_check(tmp_path: Path) -> None:
    swap_study = _driver()
    settings = swap_study.Settings()
    assert swap_study.caveats(settings, tmp_path / "none.json") == ["every checkpoint was sampled at the base's guidance scale 4"]
    sweep = {g: {"exact": e} for g, e in (("1", 0.9), ("1.5", 1.0), ("2", 1.0), ("4", 0.3125))}
    (tmp_path / "cfg.json").write_text(json.dumps({"runs": {"baseline-lr1e-4:0": sweep}}), encoding="utf-8")
    assert swap_study.caveats(settings, tmp_path / "cfg.json")[1] == (
        "a check after the study (benchmarks/swap/swap_cfg_check.py, seed 0): the unswapped baseline-lr1e-4 reads exact 0.31 "
        "at guidance 4 and 1.00 at 1.5")
