"""The one way the tests import ComfyUI from a checkout (``TE_ALIGN_COMFYUI_DIR``).

A test module calls :func:`comfyui_or_skip` at import: without the checkout, with a checkout that does not import,
or with one whose own requirements (its ``requirements.txt``: scipy, torchsde, av, ...) are not all installed, the
whole module is skipped with one reason naming what is missing, instead of erroring in collection.
"""

from __future__ import annotations

import importlib
import os

import pytest

ENV = "TE_ALIGN_COMFYUI_DIR"
#: ComfyUI modules the tests use beyond text encoding: its node classes (``nodes`` imports the samplers, which need
#: scipy and torchsde), model folders, the sampler code and the executor's blocker.
MODULES = ("nodes", "folder_paths", "comfy.samplers", "comfy.k_diffusion.sampling", "comfy_execution.graph_utils")


def skip_reason(path: str | None) -> str | None:
    """Why ComfyUI from ``path`` cannot be used by the tests (None when it can), in one line."""
    from te_align.errors import TeAlignError
    from te_align.integrations.comfyui import tiny

    if not path:
        return f"{ENV} (a ComfyUI checkout) is not set"
    try:
        tiny.import_comfyui(path)
        for name in MODULES:
            importlib.import_module(name)
    except TeAlignError as e:
        return f"ComfyUI from {ENV} does not import: {e}"
    except ImportError as e:
        missing = e.name or str(e)
        return (f"ComfyUI from {ENV} lacks its requirement {missing!r} ({type(e).__name__}: {e}); install "
                f"its requirements.txt")
    return None


def comfyui_or_skip() -> str:
    """The checkout's folder, with ComfyUI imported; else skip the calling module with one reason."""
    path = os.environ.get(ENV)
    reason = skip_reason(path)
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
    assert path is not None
    return path
