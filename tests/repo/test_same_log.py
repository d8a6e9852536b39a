"""benchmarks/klein/same_log.py: a remade run is checked against its committed log, record by record."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
LOGGED = ROOT / "benchmarks" / "klein" / "runs" / "klein-13" / "log.jsonl"


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_log_equals_itself_and_a_run_still_going_is_compared_as_far_as_it_went(tmp_path: Path, capsys):
    same_log = load_script("benchmarks/klein/same_log.py")
    lines = LOGGED.read_text(encoding="utf-8").splitlines()
    assert same_log.main([str(LOGGED), str(LOGGED)]) == 0
    assert capsys.readouterr().out == "72 records compared, 0 differ; 0 in one log only (not reached by the other)\n"
    # the remade run's first 20 records, with other clocks and another machine's folders in its config
    remade = []
    for line in lines[:20]:
        rec = json.loads(line)
        rec["time"] = rec["time"] + 9000.0
        if "seconds" in rec:
            rec["seconds"] = 1.5
        if rec["phase"] == "config":
            rec["encoders"] = "/elsewhere/encoders-klein-13b"
        remade.append(json.dumps(rec))
    assert same_log.main([str(LOGGED), str(_write(tmp_path / "remade.jsonl", remade))]) == 0
    assert capsys.readouterr().out == "19 records compared, 0 differ; 53 in one log only (not reached by the other)\n"


def test_one_changed_loss_is_named_and_fails(tmp_path: Path, capsys):
    same_log = load_script("benchmarks/klein/same_log.py")
    lines = LOGGED.read_text(encoding="utf-8").splitlines()
    rec = json.loads(lines[6])
    assert (rec["phase"], rec["step"]) == ("transformer", 100)
    rec["loss"] = 1.010401368141175  # a last digit of the logged loss
    lines[6] = json.dumps(rec)
    assert same_log.main([str(LOGGED), str(_write(tmp_path / "remade.jsonl", lines))]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "72 records compared, 1 differ; 0 in one log only (not reached by the other)"
    assert out[1].startswith("transformer step 100: {'phase': 'transformer', 'step': 100, 'loss': 1.0104013681411743,")
    assert "'loss': 1.010401368141175," in out[1]
    assert len(out) == 2


def test_a_resumed_run_is_read_from_its_last_written_record(tmp_path: Path, capsys):
    same_log = load_script("benchmarks/klein/same_log.py")
    a = {"phase": "klein_encoder", "step": 50, "loss": 2.0}
    b = {"phase": "klein_encoder", "step": 50, "loss": 1.0}
    first = _write(tmp_path / "a.jsonl", [json.dumps(b)])
    resumed = _write(tmp_path / "b.jsonl", [json.dumps(a), json.dumps({"phase": "config", "init": "x"}), json.dumps(b)])
    assert same_log.main([str(first), str(resumed)]) == 0
    assert capsys.readouterr().out == "1 records compared, 0 differ; 0 in one log only (not reached by the other)\n"


def test_bad_input_is_one_line(tmp_path: Path, capsys):
    same_log = load_script("benchmarks/klein/same_log.py")
    assert same_log.main([str(LOGGED), str(tmp_path / "absent.jsonl")]) == 2
    assert capsys.readouterr().err == f"same_log.py: {tmp_path / 'absent.jsonl'}: no such log\n"
    broken = _write(tmp_path / "broken.jsonl", ['{"phase": "data"}', "{not json"])
    try:
        same_log.main([str(LOGGED), str(broken)])
    except SystemExit as exc:
        assert str(exc) == f"same_log.py: {broken} line 2 is not JSON (Expecting property name enclosed in double quotes)"
    else:
        raise AssertionError("a broken log was read")


def test_kept_runs_come_back_byte_for_byte_and_a_present_run_is_left_alone(tmp_path: Path):
    keep = load_script("benchmarks/klein/keep_state.py")
    runs, state = tmp_path / "runs", tmp_path / "state"
    (runs / "enc" / "work").mkdir(parents=True)
    (runs / "enc" / "work" / "checkpoint.pt").write_bytes(bytes(range(256)) * 4)
    (runs / "enc" / "log.jsonl").write_text('{"phase": "config"}\n', encoding="utf-8")
    (runs / "enc" / "cond-cache").mkdir()
    (runs / "enc" / "cond-cache" / "a.pt").write_bytes(b"cache")
    assert keep.save(runs, ["enc"], state) == ["enc: 2 files, 0.0 MiB kept"]
    assert sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file()) == [
        "enc/log.jsonl", "enc/work/checkpoint.pt"]
    (runs / "enc" / "log.jsonl").write_text('{"phase": "config"}\n{"step": 50}\n', encoding="utf-8")
    assert keep.save(runs, ["enc"], state, skip=("work",)) == ["enc: 1 files, 0.0 MiB kept"]  # replaces the earlier
    assert sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file()) == ["enc/log.jsonl"]
    keep.save(runs, ["enc"], state)
    assert (state / "enc" / "log.jsonl").read_text(encoding="utf-8").count("\n") == 2
    fresh = tmp_path / "fresh"
    assert keep.restore(fresh, state) == [f"enc: restored into {fresh / 'enc'}"]
    assert (fresh / "enc" / "work" / "checkpoint.pt").read_bytes() == bytes(range(256)) * 4
    assert keep.restore(fresh, state) == [f"enc: {fresh / 'enc'} is there already, left as it is"]
    assert keep.restore(fresh, tmp_path / "none") == [f"nothing kept in {tmp_path / 'none'}"]
    try:
        keep.save(runs, ["absent"], state)
    except SystemExit as exc:
        assert str(exc) == f"keep_state.py save: {runs / 'absent'} is not a run folder (expected a folder of {runs})"
    else:
        raise AssertionError("an absent run was saved")
