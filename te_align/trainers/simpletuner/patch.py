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
from te_align.trainers.simpletuner.hooks import SUPPORTED

TRAINER = "simpletuner"
VERIFIED = tuple(SUPPORTED)
INIT = "simpletuner/__init__.py"
#: Files whose presence marks a SimpleTuner checkout.
MARKERS = (INIT, "simpletuner/helpers/models/common.py", "simpletuner/helpers/caching/text_embeds.py", "pyproject.toml")
BLOCK_MARK = b"# >>> te-align patch: SimpleTuner"


def block(profile: str | None) -> bytes:
    """The block appended to ``simpletuner/__init__.py``, with the off words and the pinned profile filled in."""
    tpl = Path(__file__).with_name("templates") / "init_block.py.tmpl"
    if not tpl.is_file():
        raise PatchError(f"te-align's SimpleTuner patch file {tpl} is missing; reinstall te-align")
    text = tpl.read_bytes()
    for placeholder, value in ((b"_OFF_WORDS = None", f"_OFF_WORDS = {OFF_WORDS!r}"),
                               (b"_PINNED_PROFILE = None", f"_PINNED_PROFILE = {profile!r}")):
        if placeholder not in text:
            raise PatchError(f"te-align's SimpleTuner patch file {tpl} has no {placeholder.decode()} line; reinstall te-align")
        text = text.replace(placeholder, value.encode(), 1)
    return text


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
    root = detection.root
    init = root / INIT
    current = init.read_bytes() if init.is_file() else None
    if current is None:
        raise PatchError(f"{init} is missing; restore it from SimpleTuner, then patch again")
    manifest = read_manifest(root) or {}
    known = manifest.get("files", {}) if manifest.get("trainer") in (None, TRAINER) else {}
    entry = known.get(INIT)
    restore_to = None
    if entry is None:
        if BLOCK_MARK in current:
            raise PatchError(f"{init} holds te-align's block but {root / STATE_DIR} has no manifest for it (was it "
                             f"deleted?); remove the block between the te-align markers (or git checkout -- {INIT}), "
                             "then patch again")
        original = current
    else:  # patched before: keep the original unpatch must give back, or take a changed file as the new original
        if sha256_bytes(current) == entry["patched_sha256"] or BLOCK_MARK in current:
            backup = entry.get("backup")
            if not backup:
                raise PatchError(f"te-align state has no backup of {INIT}; restore it by hand (git checkout -- "
                                 f"{INIT}), then delete {root / STATE_DIR}", file=str(root / STATE_DIR / "manifest.json"))
            original = (root / STATE_DIR / backup).read_bytes()
        else:
            original = current  # replaced since (git pull): the new original
        restore_to = original
    content = original + (b"" if original.endswith(b"\n") else b"\n") + block(profile)
    change = FileChange(INIT, content, sha256_file(init), note="appends te-align's boot block", restore_to=restore_to)
    return Plan(root, TRAINER, detection.version, (change,), profile=profile, extra={"layout": detection.layout})
