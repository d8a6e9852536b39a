"""``te-align comfyui install | uninstall | status``: the node package in a ComfyUI checkout, as a transaction.

The plan creates one file, ``custom_nodes/te-align/__init__.py``: a loader that imports the nodes from the te-align
installed in ComfyUI's Python (and logs one line naming the fix when it is not). :mod:`te_align.patching.transaction`
applies it under the tree's lock with a journal, and reverts it to byte-identical (the folder it created is removed).
A tree that is not a ComfyUI checkout is refused. Torch-free.
"""

from __future__ import annotations

import re
from pathlib import Path

from te_align.patching.transaction import (
    FileChange,
    PatchError,
    Plan,
    read_manifest,
    sha256_bytes,
    sha256_file,
)

TOOL = "comfyui"
NODE_DIR = "custom_nodes/te-align"
LOADER = f"{NODE_DIR}/__init__.py"
#: Files and folders whose presence marks a ComfyUI checkout (upstream layout).
MARKERS = ("main.py", "nodes.py", "comfy/sd.py", "comfy/model_management.py", "custom_nodes")
LOADER_MARK = b"# te-align loader for ComfyUI"

LOADER_SOURCE = (
    LOADER_MARK + b"""
# Written by `te-align comfyui install`; undo with `te-align comfyui uninstall <ComfyUI folder>`.
import logging
import sys

try:
    from te_align.integrations.comfyui.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
except ImportError as e:
    logging.getLogger("te_align").error(
        "te-align nodes not loaded: %s. Install te-align into the Python that runs ComfyUI (%s -m pip install "
        "/path/to/te-align: a clone or a built wheel; its core changes no package ComfyUI has).", e, sys.executable
    )
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
"""
)


def comfyui_root(path: str | Path) -> Path:
    """The ComfyUI checkout at ``path``, or one line saying why it is not one."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise PatchError(f"no such folder: {root}")
    missing = [m for m in MARKERS if not (root / m).exists()]
    if missing:
        raise PatchError(f"{root} is not a ComfyUI checkout (no {', '.join(missing)}); give the folder that holds "
                         "ComfyUI's main.py and custom_nodes/")
    return root.resolve()


def comfyui_version(root: Path) -> str:
    """ComfyUI's version from comfyui_version.py (or 'unknown')."""
    f = root / "comfyui_version.py"
    if f.is_file():
        m = re.search(r'__version__\s*=\s*"([^"]+)"', f.read_text(encoding="utf-8", errors="replace"))
        if m:
            return m.group(1)
    return "unknown"


def plan(path: str | Path) -> Plan:
    """The install plan for the checkout at ``path`` (refuses a foreign ``custom_nodes/te-align``)."""
    root = comfyui_root(path)
    current = sha256_file(root / LOADER)
    manifest = read_manifest(root)
    ours = manifest is not None and LOADER in manifest.get("files", {})
    if current is not None and not ours and current != sha256_bytes(LOADER_SOURCE):
        raise PatchError(f"{root / NODE_DIR} exists and was not written by te-align: move it away, then run again")
    if (root / NODE_DIR).exists() and not ours and current is None:
        raise PatchError(f"{root / NODE_DIR} exists and was not written by te-align: move it away, then run again")
    change = FileChange(LOADER, LOADER_SOURCE, current, note="loads te-align's nodes from the installed te-align")
    return Plan(root=root, trainer=TOOL, trainer_version=comfyui_version(root), changes=(change,))


__all__ = ["LOADER", "LOADER_SOURCE", "MARKERS", "NODE_DIR", "comfyui_root", "comfyui_version", "plan"]
