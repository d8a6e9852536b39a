"""Drop third-party log lines that a te-align user cannot act on.

Each entry names the logger a library emits the line on and a fragment of the line. Only those exact lines are
dropped; everything else the libraries log (warnings a user should act on) still shows. Installed from
``te_align/__init__.py`` before any of these libraries is imported: ``logging.getLogger`` returns the same logger
object the library gets later, so the filter is in place from the library's first line on. Imports nothing heavy.

Why each line is noise for te-align's users:

- bitsandbytes >= 0.50 warns on every import, on CPUs with AVX-512 BF16, that the optional ``kernels`` package
  (a faster CPU 4-bit matmul) is missing. te-align imports bitsandbytes only through diffusers/transformers or for
  ``adamw8bit``; its 4-bit path runs on CUDA only, where the CPU kernel is never used.
- diffusers' ``ModelMixin.to(dtype)`` warns that modules "should be kept in float32: []" with an *empty* list: the
  model has nothing to keep in float32, so there is nothing to act on (a non-empty list still shows).
- transformers 5 falls back to the PIL image processors of a pipeline's safety checker / image encoder when
  torchvision is missing, and says so once per class. te-align never runs those processors.

:func:`no_progress_bars` does the same for diffusers' and transformers' own progress bars ("Loading pipeline
components...", "Loading weights", "Writing model shards") while te-align loads or saves a model for the user: they
time steps of te-align's work that a user cannot act on. te-align's own bars (``te-align train``'s) stay.

``TE_ALIGN_QUIET=0`` turns the filter and :func:`no_progress_bars` off (to see every line when reporting a bug).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Iterator
from types import ModuleType

#: (logger name, fragment of the formatted message, why) — the lines dropped.
DROPPED: tuple[tuple[str, str, str], ...] = (
    (
        "bitsandbytes.backends.cpu.ops",
        "Failed to load CPU gemm_4bit_forward from kernels-community",
        "optional CPU 4-bit kernel package missing; te-align's 4-bit path is CUDA-only",
    ),
    (
        "diffusers.models.modeling_utils",
        "that should be kept in float32: []",
        "an empty list of float32 modules",
    ),
    (
        "transformers.utils.import_utils",
        "requires torchvision (not installed); falling back to",
        "PIL image processor fallback for components te-align never runs",
    ),
)


class _DropLines(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the library's bug; let logging report it as usual
            return True
        return not any(f in text for f in self.fragments)


_installed: list[tuple[logging.Logger, _DropLines]] = []


def quiet() -> bool:
    """False when ``TE_ALIGN_QUIET=0`` asks for every third-party line and bar."""
    return os.environ.get("TE_ALIGN_QUIET", "1").strip() != "0"


#: The libraries whose progress bars :func:`no_progress_bars` turns off (each has ``is_progress_bar_enabled``,
#: ``disable_progress_bar`` and ``enable_progress_bar`` in its ``utils.logging``).
PROGRESS_BAR_LIBRARIES = ("diffusers.utils.logging", "transformers.utils.logging")


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """diffusers' and transformers' progress bars off inside the block, then back as they were (a script that
    turned them on or off keeps its choice). A no-op with ``TE_ALIGN_QUIET=0``, and for a library not installed."""
    turned_off: list[ModuleType] = []
    if quiet():
        for name in PROGRESS_BAR_LIBRARIES:
            try:
                lib = importlib.import_module(name)
            except ImportError:  # not installed: it shows no bars
                continue
            if lib.is_progress_bar_enabled():
                lib.disable_progress_bar()
                turned_off.append(lib)
    try:
        yield
    finally:
        for lib in turned_off:
            lib.enable_progress_bar()


def install() -> None:
    """Attach the filters (idempotent; a no-op with ``TE_ALIGN_QUIET=0``)."""
    if _installed or not quiet():
        return
    by_logger: dict[str, list[str]] = {}
    for name, fragment, _why in DROPPED:
        by_logger.setdefault(name, []).append(fragment)
    for name, fragments in by_logger.items():
        logger = logging.getLogger(name)
        f = _DropLines(tuple(fragments))
        logger.addFilter(f)
        _installed.append((logger, f))


def uninstall() -> None:
    """Remove the filters (tests)."""
    while _installed:
        logger, f = _installed.pop()
        logger.removeFilter(f)
