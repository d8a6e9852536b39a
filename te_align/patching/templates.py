"""Where the drop-in files that ``te-align patch`` installs come from.

The source of truth is the repository's top-level ``patches/<trainer>/``. A wheel carries a copy as
``te_align/_patches/<trainer>/`` (setup.py copies it at build time), so an installed te-align can
patch without a source checkout; an editable install or a checkout reads ``patches/`` directly.
"""

from __future__ import annotations

from pathlib import Path

from te_align.patching.transaction import PatchError

_PACKAGE = Path(__file__).resolve().parents[1]


def patch_dir(trainer: str) -> Path:
    """The folder holding ``trainer``'s drop-in files (``kohya``, ``ai-toolkit``)."""
    for candidate in (_PACKAGE / "_patches" / trainer, _PACKAGE.parent / "patches" / trainer):
        if candidate.is_dir():
            return candidate
    raise PatchError(f"te-align's drop-in files for {trainer} are missing from this installation (reinstall te-align)")
