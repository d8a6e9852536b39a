"""Versions of trainer checkouts, read from their files (no git binary, nothing imported).

:func:`git_head`: the commit a git work tree has checked out (plain checkouts, submodules and worktrees,
whose ``.git`` is a file pointing at the real git folder; loose and packed refs). :func:`read_version`:
the ``VERSION = "..."`` assignment of a Python file (ai-toolkit's ``version.py``). :func:`dist_version`:
the version of a distribution installed in a ``site-packages`` folder (its ``*.dist-info/METADATA``);
:func:`installed_version`: the version of an installed distribution of the running Python.
"""

from __future__ import annotations

import re
from pathlib import Path


def git_dir(root: Path) -> Path | None:
    """The git folder of the work tree at ``root`` (``.git``, or where a ``.git`` file points), or None."""
    dot = Path(root) / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():  # submodule / worktree: "gitdir: <path>"
        text = dot.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:") :].strip())
            return target if target.is_absolute() else (Path(root) / target).resolve()
    return None


def git_head(root: Path) -> str | None:
    """The commit checked out at ``root`` (40 hex digits), or None when that cannot be read."""
    gd = git_dir(root)
    if gd is None:
        return None
    try:
        head = (gd / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head if len(head) == 40 else None
    ref = head[4:].strip()
    common = gd
    if (gd / "commondir").is_file():
        common = (gd / (gd / "commondir").read_text(encoding="utf-8").strip()).resolve()
    for base in (gd, common):
        f = base / ref
        if f.is_file():
            return f.read_text(encoding="utf-8").strip()
        packed = base / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    return None


def read_version(path: Path) -> str | None:
    """``VERSION = "x.y.z"`` from a Python file (None when the file or the assignment is absent)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r"""^VERSION\s*=\s*["']([^"']+)["']""", text, re.M)
    return m.group(1) if m else None


def dist_version(site: Path, package: str) -> str | None:
    """The version of ``package`` installed in the folder ``site`` (from its dist-info METADATA), or None."""
    for meta in Path(site).glob(f"{package}-*.dist-info/METADATA"):
        m = re.search(r"^Version:\s*(\S+)", meta.read_text(encoding="utf-8", errors="replace"), re.M)
        if m:
            return m.group(1)
    return None


def installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` installed in this Python (None: not installed)."""
    import importlib.metadata  # 20 ms with its email parser: off the cold path of `te-align check`

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
