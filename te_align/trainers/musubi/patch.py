"""On-disk patch of a kohya-ss/musubi-tuner checkout: one block appended to ``src/musubi_tuner/__init__.py``.

Every musubi-tuner process imports the ``musubi_tuner`` package first, whichever way it is started (``accelerate
launch src/musubi_tuner/qwen_image_train_network.py``, the top-level wrapper scripts, ``python -m``, the GUI's
subprocesses). The appended block (``templates/init_block.py.tmpl`` of this folder) installs
:mod:`te_align.trainers.musubi.hooks` for the script being run (:func:`~te_align.trainers.musubi.hooks.boot`).
``te-align unpatch`` restores the file byte for byte (:mod:`te_align.patching.transaction`). ``TE_ALIGN=off``
skips te-align; a missing te-align stops with one clear message. Version: the git HEAD; a commit te-align was not
verified against is accepted only when every hook target is present with the expected parameters, checked in the
source (nothing is imported).
"""

from __future__ import annotations

import re
from pathlib import Path

from te_align._git import git_head
from te_align.hooks.base import OFF_WORDS
from te_align.patching.blocks import fill, plan_block
from te_align.patching.dropins import target_problems
from te_align.patching.trainers import Detection
from te_align.patching.transaction import PatchError, Plan
from te_align.trainers.api import target_mismatch
from te_align.trainers.musubi.hooks import SUPPORTED, MusubiHook

TRAINER = "musubi"
INIT = "src/musubi_tuner/__init__.py"
#: Files whose presence marks a musubi-tuner checkout.
MARKERS = (INIT, "src/musubi_tuner/dataset/cache_io.py", "src/musubi_tuner/cache_text_encoder_outputs.py", "pyproject.toml")
BLOCK_MARK = b"# >>> te-align patch: musubi-tuner"


def block(profile: str | None) -> bytes:
    """The block appended to ``src/musubi_tuner/__init__.py`` (te-align's off words, the pinned profile)."""
    return fill(Path(__file__).with_name("templates") / "init_block.py.tmpl",
                {b"_OFF_WORDS = None": f"_OFF_WORDS = {OFF_WORDS!r}", b"_PINNED_PROFILE = None": f"_PINNED_PROFILE = {profile!r}"})


def version(root: Path) -> str | None:
    """``version`` of the checkout's pyproject.toml (``[project]``)."""
    try:
        text = (Path(root) / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not re.search(r'^name\s*=\s*"musubi-tuner"', text, re.M):
        return None
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1) if m else None


def detect(path: Path) -> Detection | None:
    root = Path(path)
    if not all((root / m).is_file() for m in MARKERS) or version(root) is None:
        return None
    head = git_head(root)
    found = f"{version(root)} ({head[:7]})" if head else f"{version(root)} (no git)"
    notes: tuple[str, ...] = ()
    if head not in SUPPORTED:
        verified = ", ".join(SUPPORTED.values())
        notes = (f"te-align was verified with {verified}; the hook targets are checked in the source",)
    return Detection(TRAINER, root, "checkout", found, notes)


def static_problems(root: Path) -> list[str]:
    """Hook targets that are missing or whose parameters changed, read from the source (no import)."""
    return target_problems(Path(root) / "src", MusubiHook().targets())


def plan(detection: Detection, profile: str | None) -> Plan:
    root = detection.root
    problems = static_problems(root)
    if problems:
        raise PatchError(target_mismatch("musubi-tuner", detection.version, root, problems, SUPPORTED))
    return plan_block(detection, profile, trainer=TRAINER, relpath=INIT, block=block(profile), mark=BLOCK_MARK)


__all__ = ["BLOCK_MARK", "INIT", "block", "detect", "plan", "static_problems"]
