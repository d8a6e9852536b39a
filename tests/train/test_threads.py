"""CPU threads for te-align's runs (te_align/_threads.py): small models run on one thread, the user's choice wins.

The collapse this prevents (two intra-op threads on a 2-core machine with one core busy) is measured by
benchmarks/demo/bench_threads.py, not timed here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from te_align._threads import SMALL_MODEL_PARAMS, choose
from te_align.train import train
from tests.train.test_train import make_config


@pytest.fixture
def no_thread_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("TE_ALIGN_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_small_models_run_on_one_thread_and_a_choice_wins(no_thread_env: pytest.MonkeyPatch) -> None:
    assert choose(123_456) == (1, "small model (0.1 M parameters)")
    assert choose(SMALL_MODEL_PARAMS - 1)[0] == 1
    assert choose(123_456, requested=3) == (3, "train.threads")
    no_thread_env.setenv("OMP_NUM_THREADS", "2")
    assert choose(123_456) == (2, "OMP_NUM_THREADS")
    no_thread_env.setenv("TE_ALIGN_THREADS", "4")
    assert choose(123_456) == (4, "TE_ALIGN_THREADS")
    assert choose(123_456, requested=3) == (3, "train.threads")  # the config's key first
    no_thread_env.setenv("TE_ALIGN_THREADS", "zero")  # not a number: ignored, the next source decides
    assert choose(123_456) == (2, "OMP_NUM_THREADS")


def test_large_models_get_the_cores_the_load_leaves_free(no_thread_env: pytest.MonkeyPatch) -> None:
    # the machine is the environment here, not the code under test: 4 usable cores, then various loads
    no_thread_env.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for load, want in ((0.1, 4), (1.2, 3), (2.6, 1), (7.0, 1)):
        no_thread_env.setattr(os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert choose(SMALL_MODEL_PARAMS) == (want, f"4 core(s), load {load:.1f}")


def test_a_cpu_training_run_sets_the_chosen_threads(no_thread_env: pytest.MonkeyPatch, tmp_path: Path,
                                                   tiny_model_folder: Callable[[str], Path], squares_dataset: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cfg = make_config("sd15", tiny_model_folder("sd15"), squares_dataset, tmp_path / "a",
                          train={"max_steps": 1, "device": "cpu"})  # fmt: skip
        with caplog.at_level(logging.INFO, logger="te_align.threads"):
            train(cfg)
        assert torch.get_num_threads() == 1
        assert any(r.getMessage().startswith("CPU threads: 1 (small model (") for r in caplog.records)
        cfg = make_config("sd15", tiny_model_folder("sd15"), squares_dataset, tmp_path / "b",
                          train={"max_steps": 1, "device": "cpu", "threads": 2})  # fmt: skip
        train(cfg)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
