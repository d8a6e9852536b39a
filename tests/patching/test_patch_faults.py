"""The kill sweep of issue 15, fast subset: patch, re-patch and unpatch are SIGKILLed at a spread of their file
operations (and the recovering status at each of its own, for double faults), or meet a full disk / read-only
file system; every recovery must leave the tree byte-identical (bytes, modes, folders) to the tree before the
command or to its finished result. The full sweep, on real checkouts too, is ``tools/fault_campaign.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from te_align import _atomic
from tests.support.scripts import load_script

campaign = load_script("tools/fault_campaign.py")

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill sweep forks a process per command (no os.fork here)")


@pytest.fixture(autouse=True)
def _no_fsync():
    """Processes are killed, not machines: the page cache survives, so fsync only costs time here."""
    old = _atomic.FSYNC
    _atomic.FSYNC = False
    yield
    _atomic.FSYNC = old


def _layout(tmp_path: Path, trainer: str):
    src = tmp_path / "src"
    if trainer == "kohya":
        tree = campaign.fake_kohya(src / "sd-scripts", ("train_network.py", "sdxl_train_network.py"))
    elif trainer == "kohya_ss":
        tree = campaign.fake_kohya_gui(src / "kohya_ss")
    else:
        tree = campaign.fake_ai_toolkit(src / "ai-toolkit")
    root_of = campaign._kohya_root if trainer != "ai-toolkit" else (lambda p: p)
    return campaign.prepare(trainer, tree, tmp_path / "work", kohya=trainer != "ai-toolkit", root_of=root_of)


@pytest.mark.parametrize("trainer", ["kohya", "ai-toolkit"])
def test_kill_sweep_recovers_byte_identical(tmp_path, trainer):
    (tmp_path / "work").mkdir()
    lay = _layout(tmp_path, trainer)
    tally = campaign.Tally()
    campaign.sweep(lay, tally, commands=("patch", "re-patch", "unpatch"), every=5, rerun_every=13, double_every=0, disk_every=0)
    assert tally.failures == [] and tally.tracebacks == 0 and tally.data_loss == 0
    assert tally.cases >= 20 and tally.not_identical == 0
    assert tally.identical_before > 0 and tally.identical_after > 0  # kills before and after the commit point


def test_double_faults_and_full_disk_on_the_kohya_ss_gui_layout(tmp_path):
    (tmp_path / "work").mkdir()
    lay = _layout(tmp_path, "kohya_ss")
    tally = campaign.Tally()
    campaign.sweep(lay, tally, commands=("patch", "unpatch"), every=1000, rerun_every=0, double_every=37, disk_every=11)
    assert tally.failures == [] and tally.tracebacks == 0 and tally.data_loss == 0
    assert tally.classes.get("double-fault/patch", 0) >= 10 and tally.classes.get("enospc/unpatch", 0) >= 3
    assert tally.not_identical == 0
