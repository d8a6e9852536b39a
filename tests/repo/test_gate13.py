"""benchmarks/klein/gate13.py: amendment 13's gate and choice, applied to the probes' committed diagnosis files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DIAGNOSTIC = ROOT / "benchmarks" / "base_eval" / "diagnostic"


def test_the_logged_gate_reads_as_the_plan_reported_it_and_chooses_13b(capsys):
    gate13 = load_script("benchmarks/klein/gate13.py")
    assert gate13.main(["klein-13a", "klein-13b"]) == 0
    assert capsys.readouterr().out == (
        "klein-13a: colour 598/600 (>= 570), position 586/600 (>= 480), sum 1184: passes\n"
        "klein-13b: colour 600/600 (>= 570), position 591/600 (>= 480), sum 1191: passes\n"
        "chosen: klein-13b\n"
    )


def _variant(tmp_path: Path, label: str, colour: int, position: int) -> None:
    data = json.loads((DIAGNOSTIC / "encoder-probe-seed2-klein-13a-diagnosis.json").read_text(encoding="utf-8"))
    for attr, count in (("colour", colour), ("position", position)):
        probes = data["read"][attr]["official (9, 18, 27)"]
        probes["mean"]["correct"], probes["attention"]["correct"] = count - 3, count
        data["read"][attr]["deviating (10, 20, 30)"]["mean"]["correct"] = 600  # other taps never count
    (tmp_path / f"encoder-probe-seed2-{label}-diagnosis.json").write_text(json.dumps(data), encoding="utf-8")


def test_a_tie_goes_to_the_first_label_and_one_bar_missed_fails_the_encoder(tmp_path: Path, capsys):
    gate13 = load_script("benchmarks/klein/gate13.py")
    _variant(tmp_path, "a", 580, 500)
    _variant(tmp_path, "b", 590, 490)
    _variant(tmp_path, "c", 600, 479)
    assert gate13.main(["a", "b", "c", "--folder", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "c: colour 600/600 (>= 570), position 479/600 (>= 480), sum 1079: misses"
    assert out[3] == "chosen: a"
    assert gate13.main(["b", "a", "--folder", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "chosen: b"
    assert gate13.main(["c", "--folder", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "chosen: none (no denoiser runs; the base is not reached)"


def test_a_missing_or_foreign_file_is_one_line_and_exit_2(tmp_path: Path, capsys):
    gate13 = load_script("benchmarks/klein/gate13.py")
    assert gate13.main(["absent", "--folder", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("gate13: absent: cannot read its diagnosis file (FileNotFoundError")
    shutil.copy(DIAGNOSTIC / "encoder-probe-seed3-klein-2-diagnosis.json", tmp_path / "encoder-probe-seed2-s3-diagnosis.json")
    assert gate13.main(["s3", "--folder", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "expected seed 2 and 600 prompts, found seed 3 and 600 prompts" in err and err.count("\n") == 1
