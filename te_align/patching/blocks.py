"""Block patches: one block of te-align's appended to a file every process of a trainer imports (its package's
``__init__.py``), restored byte for byte by ``te-align unpatch`` (the ``patch`` part of a trainer folder uses this).

:func:`plan_block` keeps the original its manifest recorded when the tree was patched before (so unpatch gives back
what the trainer shipped), takes a file changed since (``git pull``) as the new original, and refuses a block
without its manifest. No trainer is named here.
"""

from __future__ import annotations

from pathlib import Path

from te_align.patching.trainers import Detection
from te_align.patching.transaction import (
    STATE_DIR,
    FileChange,
    PatchError,
    Plan,
    read_manifest,
    sha256_bytes,
    sha256_file,
)


def fill(template: Path, values: dict[bytes, str]) -> bytes:
    """A block template with each placeholder line (``_X = None``) replaced once; a missing one is an error."""
    if not template.is_file():
        raise PatchError(f"te-align's patch file {template} is missing; reinstall te-align")
    text = template.read_bytes()
    for placeholder, value in values.items():
        if placeholder not in text:
            raise PatchError(f"te-align's patch file {template} has no {placeholder.decode()} line; reinstall te-align")
        text = text.replace(placeholder, value.encode(), 1)
    return text


def plan_block(detection: Detection, profile: str | None, *, trainer: str, relpath: str, block: bytes, mark: bytes,
               note: str = "appends te-align's boot block") -> Plan:
    """The plan that appends ``block`` (whose first line holds ``mark``) to ``root/relpath``."""
    root = detection.root
    target = root / relpath
    current = target.read_bytes() if target.is_file() else None
    if current is None:
        raise PatchError(f"{target} is missing; restore it from the trainer's checkout, then patch again")
    manifest = read_manifest(root) or {}
    known = manifest.get("files", {}) if manifest.get("trainer") in (None, trainer) else {}
    entry = known.get(relpath)
    restore_to = None
    if entry is None:
        if mark in current:
            raise PatchError(f"{target} holds te-align's block but {root / STATE_DIR} has no manifest for it (was it "
                             f"deleted?); remove the block between the te-align markers (or git checkout -- {relpath}), "
                             "then patch again")
        original = current
    else:  # patched before: keep the original unpatch must give back, or take a changed file as the new original
        if sha256_bytes(current) == entry["patched_sha256"] or mark in current:
            backup = entry.get("backup")
            if not backup:
                raise PatchError(f"te-align state has no backup of {relpath}; restore it by hand (git checkout -- "
                                 f"{relpath}), then delete {root / STATE_DIR}", file=str(root / STATE_DIR / "manifest.json"))
            original = (root / STATE_DIR / backup).read_bytes()
        else:
            original = current  # replaced since (git pull): the new original
        restore_to = original
    content = original + (b"" if original.endswith(b"\n") else b"\n") + block
    change = FileChange(relpath, content, sha256_file(target), note=note, restore_to=restore_to)
    return Plan(root, trainer, detection.version, (change,), profile=profile, extra={"layout": detection.layout})


__all__ = ["fill", "plan_block"]
