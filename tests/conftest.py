"""Shared test settings: no network, quiet third-party loggers."""

from __future__ import annotations

import os

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
