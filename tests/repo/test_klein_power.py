"""benchmarks/klein/klein_power.py --null: amendment 12's power rule read from the null control's per-seed results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.scripts import load_script


def _null(folder: Path, nets: list[tuple[float, float]]) -> Path:
    folder.mkdir()
    for seed, (a, b) in enumerate(nets):
        arms = {arm: {"curve": [[50, {"net": 0.9}], [300, {"net": net}]]} for arm, net in (("A", a), ("B", b))}
        (folder / f"seed-{seed}.json").write_text(json.dumps({"seed": seed, "arms": arms}), encoding="utf-8")
    return folder


def test_the_spread_is_the_sd_of_the_last_checkpoints_differences_and_the_rule_reads_it(tmp_path: Path, capsys, monkeypatch):
    power = load_script("benchmarks/klein/klein_power.py")
    # differences 0.0, +0.125, -0.125, 0.0, +0.25, -0.25: mean 0, sd sqrt(0.15625 / 5) = 0.17678
    folder = _null(tmp_path / "null", [(0.5, 0.5), (0.625, 0.5), (0.375, 0.5), (0.5, 0.5), (0.75, 0.5), (0.25, 0.5)])
    diffs, s = power.null_spread(folder)
    assert diffs == [0.0, 0.125, -0.125, 0.0, 0.25, -0.25] and s == pytest.approx(0.1767767, abs=1e-7)
    monkeypatch.setattr(power.sys, "argv", ["klein_power.py", "--null", str(folder)])
    power.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "null control instrument 2, A - B by seed: +0.0000, +0.1250, -0.1250, +0.0000, +0.2500, -0.2500; s = 0.1768"
    # 1.818 s at 6 seeds, Holm over 3 rows: 0.321 > 0.20
    assert out[-1].startswith("amendment 12's rule: Holm-3 smallest detectable effect at 6 seeds 0.321 > 0.20: every")
    small = _null(tmp_path / "small", [(0.5, 0.5), (0.52, 0.5), (0.48, 0.5), (0.5, 0.5), (0.54, 0.5), (0.46, 0.5)])
    monkeypatch.setattr(power.sys, "argv", ["klein_power.py", "--null", str(small)])
    power.main()
    assert capsys.readouterr().out.splitlines()[-1].endswith("<= 0.20: 6 seeds")


def test_fewer_than_the_six_planned_seeds_is_one_line(tmp_path: Path):
    power = load_script("benchmarks/klein/klein_power.py")
    folder = _null(tmp_path / "null", [(0.5, 0.5)] * 5)
    with pytest.raises(SystemExit, match=r"seed-5\.json is missing \(the rule reads all 6 planned seeds\)$"):
        power.null_spread(folder)
