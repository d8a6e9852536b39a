"""The progress display of `te-align demo` and `te-align ab matrix` (times, ETA, status line, TTY and plain output),
and the report's labels and numbers as a person reads them, on the committed per-seed results of the demo's row."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from te_align.ab.progress import Phase, Progress, duration, eta, status_line

ROOT = Path(__file__).resolve().parents[2]
DEMO_RESULTS = ROOT / "benchmarks" / "effects" / "results" / "world-flux-t5-512"


def test_duration_reads_as_minutes_and_seconds() -> None:
    assert [duration(s) for s in (0, 7.4, 59.6, 185, 3599.4, 3723)] == ["0:00", "0:07", "1:00", "3:05", "59:59", "1:02:03"]
    assert duration(-3) == "0:00"


def test_eta_from_measured_unit_times() -> None:
    assert eta([], 1, [30.0], 1) is None  # nothing measured yet: calibrating
    # mean unit 110 s: one unit not started (110) and one running for 30 s (80 more)
    assert eta([120.0, 100.0], 1, [30.0], 1) == 190.0
    # a running unit past the mean counts as nothing left; two workers share the rest
    assert eta([100.0], 3, [150.0, 20.0], 2) == (300.0 + 0.0 + 80.0) / 2


def test_status_line_exact() -> None:
    first = status_line(label="te-align demo", done=0, total=2,
                        running=[("world-flux-t5-512 seed 0", Phase("training arm A", 37, 100, 40.2))],
                        stage="", elapsed=72.0, left=None)  # fmt: skip
    assert first == ("te-align demo: [1/2] world-flux-t5-512 seed 0: training arm A, step 37/100 | 1:12 elapsed | "
                     "ETA after the first unit (this arm: 0:40 left)")
    later = status_line(label="te-align demo", done=1, total=2,
                        running=[("world-flux-t5-512 seed 1", Phase("sampling and scoring arm B"))],
                        stage="", elapsed=250.0, left=64.6)  # fmt: skip
    assert later == "te-align demo: [2/2] world-flux-t5-512 seed 1: sampling and scoring arm B | 4:10 elapsed | about 1:05 left"
    two = status_line(label="te-align ab matrix", done=3, total=19,
                      running=[("world-sd3-null seed 1", Phase("training arm B", 5, 300)),
                               ("world-flux-null seed 1", Phase("loading the base for scoring"))],
                      stage="", elapsed=3700.0, left=7200.0)  # fmt: skip
    assert two == ("te-align ab matrix: [3/19 done, 2 running] world-sd3-null seed 1: training arm B, step 5/300; "
                   "world-flux-null seed 1: loading the base for scoring | 1:01:40 elapsed | about 2:00:00 left")
    assert status_line(label="te-align demo", done=2, total=2, running=[], stage="writing the report", elapsed=301.0,
                       left=None) == "te-align demo: writing the report | 5:01 elapsed"  # fmt: skip


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_at_each_new_phase_and_every_interval(tmp_path: Path) -> None:
    """Not a TTY: a line when the phase changes and every ``interval`` seconds, none for a mere new step."""
    clock, err, said = _Clock(), io.StringIO(), []
    p = Progress("te-align demo", stream=err, out=said.append, tty=False, interval=30.0, clock=clock, stage="loading")
    unit = tmp_path / "seed-0"
    p.update(force=True)
    p.plan([("row seed 0", unit, 0, 100, ("A", "B"))])  # its folder does not exist yet: starting
    clock.t = 5.0
    p.update()  # same phase, 5 s later: no line
    (unit / "profiles").mkdir(parents=True)
    (unit / "data" / "seed-0" / "val").mkdir(parents=True)
    (unit / "data" / "seed-0" / "val" / "world.json").write_text("{}")
    clock.t = 6.0
    p.update()  # a new phase: a line
    clock.t = 40.0
    p.update()  # 34 s since the last line: a line
    p.say("a line of the command's own")
    p.stage("writing the report")
    assert err.getvalue().splitlines() == [
        "te-align demo: loading | 0:00 elapsed",
        "te-align demo: [1/1] row seed 0: starting | 0:00 elapsed | ETA after the first unit",
        "te-align demo: [1/1] row seed 0: loading the base, encoding arm A's captions | 0:06 elapsed | ETA after the first unit",
        "te-align demo: [1/1] row seed 0: loading the base, encoding arm A's captions | 0:40 elapsed | ETA after the first unit",
        "te-align demo: writing the report | 0:40 elapsed",
    ]
    assert said == ["a line of the command's own"]


def test_tty_redraws_one_line_and_keeps_it_under_the_commands_lines() -> None:
    clock, err, said = _Clock(), io.StringIO(), []
    with Progress("te-align demo", stream=err, out=said.append, tty=True, clock=clock, stage="loading", refresh=60) as p:
        clock.t = 3.0
        p.stage("writing the report")
        p.say("verdict: no measurable difference")
    assert said == ["verdict: no measurable difference"]
    assert err.getvalue() == (
        "\r\033[Kte-align demo: loading | 0:00 elapsed"
        "\r\033[Kte-align demo: writing the report | 0:03 elapsed"
        "\r\033[K"  # cleared for the command's line (printed on stdout), then drawn again
        "te-align demo: writing the report | 0:03 elapsed"
        "\r\033[Kte-align demo: done in 0:03\n"
    )


def test_a_failure_leaves_only_its_own_error_line() -> None:
    err = io.StringIO()
    with pytest.raises(RuntimeError), Progress("te-align demo", stream=err, tty=True, refresh=60):
        raise RuntimeError("boom")
    assert err.getvalue() == "\r\033[Kte-align demo: starting | 0:00 elapsed\r\033[K"


# ------------------------------------------------------------------------------- labels and numbers
def _committed() -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(DEMO_RESULTS.glob("seed-*.json"))]


def test_probe_labels_say_what_was_asked_and_read_on_two_lines() -> None:
    from te_align.ab.report import probe_label

    a = _committed()[0]["arms"]["A"]
    assert [probe_label("A", a["probes"][i], a["probe_reads"][i]) for i in (0, 1, 15, 18)] == [
        "A asked: pink triangle, middle left\nread: pink triangle, middle left",
        "A asked: pink triangle, center\nread: pink circle, center",
        "A asked: pink triangle, top right\nread: nothing",
        "A asked: red triangle, middle left\nread: pink circle, middle left; red triangle, bottom left",
    ]


def test_label_words_are_drawn_apart() -> None:
    """Pillow's default font draws a space 2 px wide (the report read "Aasked:" and "red crosscenter"): every space
    of a label is now a blank gap wider than any gap inside a word."""
    pytest.importorskip("PIL")
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    from te_align.tiny.world.grid import draw_text, wrap

    font = ImageFont.load_default()
    text = "A asked: red cross, center"
    img = Image.new("RGB", (400, 24), "white")
    width = draw_text(ImageDraw.Draw(img), (2, 2), text, font=font)
    ink = (np.asarray(img.convert("L")) < 128).any(axis=0)
    cols = np.flatnonzero(ink)
    gaps, run = [], 0
    for x in range(cols[0], cols[-1] + 1):
        if ink[x]:
            if run:
                gaps.append(run)
            run = 0
        else:
            run += 1
    wide = [g for g in gaps if g >= 4]
    assert len(wide) == text.count(" ") and max(g for g in gaps if g < 4) <= 3
    assert cols[-1] - 2 < width
    assert wrap("A asked: pink triangle, middle left\nread: nothing", 120, font) == [
        "A asked: pink triangle,", "middle left", "read: nothing"]  # fmt: skip


def test_plot_ticks_are_round_numbers() -> None:
    from te_align.ab.plots import ticks

    assert [t for _, t in ticks(0.09688, 0.7156)] == ["0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7"]
    assert [t for _, t in ticks(0.08551, 0.2081)] == ["0.100", "0.125", "0.150", "0.175", "0.200"]
    assert [t for _, t in ticks(1, 100)] == ["20", "40", "60", "80", "100"]
    assert [t for _, t in ticks(-0.2, 0.3)] == ["-0.2", "-0.1", "0.0", "0.1", "0.2", "0.3"]


def test_summary_of_the_committed_demo_row_reads_at_a_glance() -> None:
    """The six committed seeds of world-flux-t5-512 through the report's summary: rates in percent, differences in
    points, every number rounded to what its 95% interval supports, the interval the one the verdict reads."""
    pytest.importorskip("torch")
    from te_align.ab.matrix import _runs_of
    from te_align.ab.report import summary_lines
    from te_align.ab.runner import ABResult, summarize

    recs = _committed()
    assert [r["seed"] for r in recs] == [0, 1, 2, 3, 4, 5]
    summary = summarize(_runs_of(recs), [0, 1, 2, 3, 4, 5])
    lines = summary_lines(ABResult(Path("."), None, 6, [], [], summary))  # type: ignore[arg-type]
    assert lines == [
        "concept net accuracy, learning-curve mean (as sampled at inference): A 43.0% vs B 44.3%; A - B -1.3 points "
        "[-4.8, +2.2]: no measurable difference",
        "concept net accuracy, final (hit minus false pink at the last checkpoint): A 56.2% vs B 59.4%; A - B -3.1 "
        "points [-12.2, +5.9]: no measurable difference",
        "concept hit rate, final (asked pink at the asked position): A 79.2% vs B 80.2%; A - B -1.0 points [-6.0, +3.9]: "
        "no measurable difference",
        "concept exact, final (colour, shape and position): A 50.0% vs B 58.3%; A - B -8.3 points [-17.3, +0.6]: "
        "no measurable difference",
        "known colours, final (forgetting: asked colour at the asked position): A 41.7% vs B 39.6%; A - B +2.1 points "
        "[-3.3, +7.4]: no measurable difference",
        "false concept readings, final (pink where another colour was asked): A 22.9% vs B 20.8%; A - B +2.1 points "
        "[-3.3, +7.4]: no measurable difference",
        "spurious objects per image, final: A 0.40 vs B 0.32; A - B +0.08 [-0.07, +0.22]: no measurable difference",
        "validation loss, final (profile conditioning): A 0.0990 vs B 0.0858; A - B +0.0133 [+0.0121, +0.0144]: "
        "profile better",
        "validation loss, final (arm's own conditioning): A 0.08635 vs B 0.08575; A - B +0.00059 [+0.00028, +0.00090]: "
        "profile better",
        "training loss, last 20% of steps: A 0.06485 vs B 0.06502; A - B -0.00017 [-0.00117, +0.00082]: "
        "no measurable difference",
    ]
    # the primary metric's interval is the committed per-seed differences' 95% t interval, in points
    m = summary[0]
    assert (round(100 * m.ci_low, 1), round(100 * m.ci_high, 1)) == (-4.8, 2.2)


def test_ab_matrix_shows_its_stages_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`te-align ab matrix --dry-run` on the committed results of the demo's row: its stages on stderr (not a TTY
    here), the table on stdout."""
    pytest.importorskip("diffusers")
    from te_align.cli import main

    assert main(["ab", "matrix", "--dry-run", "--only", "world-flux-t5-512", "--results", str(DEMO_RESULTS.parent),
                 "--out", str(tmp_path / "m")]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    stages = [line.split(" | ")[0] for line in err.splitlines()]
    assert stages[:2] == ["te-align ab matrix: loading torch, diffusers and transformers",
                          "te-align ab matrix: reading the plan and its results"]  # fmt: skip
    assert stages[2].startswith("te-align ab matrix: done in ") and len(stages) == 3
    assert "world-flux-t5-512" in out and "6/6 seeds  no measurable difference" in out
