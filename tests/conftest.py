"""Shared test settings (no network, quiet third-party loggers) and the session's tiny model folders and data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    import logging

    for name in ("diffusers", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # One intra-op thread: on a shared 2-core machine, tiny matmuls are ~50x faster this way, and
    # bit-exact comparisons must run both sides with the same setting anyway.
    import torch

    torch.set_num_threads(1)
    try:
        import diffusers.utils.logging as dlog
        import transformers.utils.logging as tlog

        dlog.set_verbosity_error()
        tlog.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_model_folder(family)``: the saved tiny pipeline of ``family`` (:func:`te_align.tiny.pipelines.build_model_folder`),
    built once per session on first use. Tests only read these folders."""
    from te_align.tiny.pipelines import build_model_folder

    root = tmp_path_factory.mktemp("tiny-models")
    built: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in built:
            built[family] = build_model_folder(family, root / f"tiny-{family}")
        return built[family]

    return folder


@pytest.fixture(scope="session")
def squares_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default :func:`te_align.tiny.datasets.make_squares_dataset` (six images, 5 repeats), drawn once per session."""
    from te_align.tiny.datasets import make_squares_dataset

    return make_squares_dataset(tmp_path_factory.mktemp("data") / "5_squares")
