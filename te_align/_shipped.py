"""Repository folders that an installed te-align carries: ``presets/``.

The source of truth is the repository's top-level folder. A wheel carries a copy as ``te_align/_<name>/``
(setup.py copies it at build time), so an installed wheel (``pip install .`` of a clone, or a built wheel) can run the bundled A/B
presets (``te-align demo``) without a source checkout; an editable install or a checkout reads the
top-level folder directly.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

#: The top-level repository folders a wheel ships, each as ``te_align/_<name>``.
SHIPPED = ("presets",)


def shipped_dir(name: str) -> Path | None:
    """The installed copy ``te_align/_<name>`` or, in a checkout, the repository's ``<name>/``; None if neither."""
    if name not in SHIPPED:
        raise ValueError(f"not a shipped folder: {name!r} (shipped: {', '.join(SHIPPED)})")
    for candidate in (_PACKAGE / f"_{name}", _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    return None
