"""Where the drop-in files that ``te-align patch`` installs come from: ``patches/<trainer>/`` of the
repository, or its copy in an installed wheel (:mod:`te_align._shipped`).
"""

from __future__ import annotations

from pathlib import Path

from te_align._shipped import shipped_dir
from te_align.patching.transaction import PatchError


def patch_dir(trainer: str) -> Path:
    """The folder holding ``trainer``'s drop-in files (``kohya``, ``ai-toolkit``)."""
    root = shipped_dir("patches")
    if root is not None and (root / trainer).is_dir():
        return root / trainer
    raise PatchError(f"te-align's drop-in files for {trainer} are missing from this installation (reinstall te-align)")
