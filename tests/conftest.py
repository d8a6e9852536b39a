"""Shared test settings (no network, quiet third-party loggers), the one skip rule of the kohya tests, and the
session's tiny model folders and data."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `te-align patch` installs te-align into the trainer's venv; the trainer trees of the test suite have none, so the
# suite patches files only (= `te-align patch --no-install`). tests/patching/test_patch_environment.py turns it back on.
os.environ.setdefault("TE_ALIGN_NO_INSTALL", "1")


#: Environment variable naming a kohya-ss/sd-scripts checkout, and sd-scripts' own import dependencies
#: that its tested modules need beyond te-align's (the ``kohya-test`` extra in pyproject.toml).
KOHYA_ENV = "TE_ALIGN_KOHYA_DIR"
KOHYA_TEST_DEPS = ("einops", "imagesize")


def kohya_skip_reason() -> str | None:
    """Why the tests marked ``kohya`` cannot run here (None when they can): one reason for all of them."""
    missing = [] if os.environ.get(KOHYA_ENV) else [f"{KOHYA_ENV} is not set"]
    absent = [name for name in KOHYA_TEST_DEPS if importlib.util.find_spec(name) is None]
    if absent:
        missing.append(f"sd-scripts' import dependencies {', '.join(absent)} are not installed")
    if not missing:
        return None
    return (
        f"kohya tests need a kohya-ss/sd-scripts checkout in {KOHYA_ENV} and its import dependencies "
        f'(pip install -e ".[kohya-test]"): {"; ".join(missing)}'
    )


def pytest_collection_modifyitems(config, items):
    reason = kohya_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("kohya") is not None:
            item.add_marker(skip)


def pytest_configure(config):
    import logging

    for name in ("diffusers", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # One intra-op thread: on a shared 2-core machine, tiny matmuls are ~50x faster this way, and
    # bit-exact comparisons must run both sides with the same setting anyway.
    try:  # the core's own jobs run the torch-free tests in an environment without torch
        import torch
    except ModuleNotFoundError:
        torch = None
    if torch is not None:
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
