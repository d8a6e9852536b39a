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
    try:
        import diffusers.utils.logging as dlog
        import transformers.utils.logging as tlog

        dlog.set_verbosity_error()
        tlog.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass
