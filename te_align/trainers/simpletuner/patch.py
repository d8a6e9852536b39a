"""On-disk patch of a bghira/SimpleTuner checkout: one block appended to ``simpletuner/__init__.py``.

Every process of a SimpleTuner run imports the ``simpletuner`` package first: ``simpletuner train`` (its console
script) and the server both start training in new processes (``accelerate launch …/simpletuner/train.py``,
``simpletuner/cli/train.py:277-312``; the server's job runner, ``simpletuner_sdk/process_keeper.py:604``). The
appended block (``templates/init_block.py.tmpl`` of this folder) arms :mod:`te_align.trainers.simpletuner.hooks` in each of
them; the hooks install when the text-embed cache module imports. ``te-align unpatch`` restores the file byte
for byte (:mod:`te_align.patching.transaction`). ``TE_ALIGN=off`` skips te-align; a missing te-align stops with
one clear message.

A pip-installed SimpleTuner (site-packages) is not patched on disk (an upgrade would silently drop the patch):
enable the hooks by the environment instead, ``eval "$(python -m te_align.hooks.simpletuner env)"``.
"""

from __future__ import annotations

import re
from pathlib import Path

from te_align.hooks.base import OFF_WORDS
from te_align.patching.blocks import fill, plan_block
from te_align.patching.trainers import Detection
from te_align.patching.transaction import Plan
from te_align.trainers.simpletuner.hooks import SUPPORTED

TRAINER = "simpletuner"
VERIFIED = tuple(SUPPORTED)
INIT = "simpletuner/__init__.py"
#: Files whose presence marks a SimpleTuner checkout.
MARKERS = (INIT, "simpletuner/helpers/models/common.py", "simpletuner/helpers/caching/text_embeds.py", "pyproject.toml")
BLOCK_MARK = b"# >>> te-align patch: SimpleTuner"


def block(profile: str | None) -> bytes:
    """The block appended to ``simpletuner/__init__.py``, with the off words and the pinned profile filled in."""
    return fill(Path(__file__).with_name("templates") / "init_block.py.tmpl",
                {b"_OFF_WORDS = None": f"_OFF_WORDS = {OFF_WORDS!r}", b"_PINNED_PROFILE = None": f"_PINNED_PROFILE = {profile!r}"})


def version(root: Path) -> str | None:
    try:
        text = (Path(root) / INIT).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M)
    return m.group(1) if m else None


def detect(path: Path) -> Detection | None:
    root = Path(path)
    if not all((root / m).is_file() for m in MARKERS):
        return None
    found = version(root) or "unknown"
    notes: list[str] = []
    if found not in VERIFIED:
        notes.append(f"te-align was verified with SimpleTuner {', '.join(VERIFIED)}; the hooks check every target when "
                     "SimpleTuner's text-embed cache imports and refuse if one changed")
    return Detection(TRAINER, root, "checkout", found, tuple(notes))


def plan(detection: Detection, profile: str | None) -> Plan:
    return plan_block(detection, profile, trainer=TRAINER, relpath=INIT, block=block(profile), mark=BLOCK_MARK)
