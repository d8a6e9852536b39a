"""On-disk patch of an ostris ai-toolkit checkout: the te-align extension and a ``run.py`` shim.

The plan (applied by :mod:`te_align.patching.transaction`):

* create ``extensions/te_align/__init__.py`` (patches/ai-toolkit/extension/): ai-toolkit imports it
  before building a job's processes, and it switches every training process to the te-align hooks
  (the process's ``te_align:`` section, the profile pinned with ``--profile``, or the model's own);
* replace ``run.py`` by a shim (patches/ai-toolkit/run.py) that checks te-align imports and then runs
  the original, kept as ``te_align_original_run.py`` — the web UI spawns ``python run.py CONFIG`` and
  takes that path unchanged.

The PyPI packaging (``ostris_ai_toolkit`` in site-packages) is not patched on disk: install the
hooks in-process (``te_align.hooks.ai_toolkit.AiToolkitHook(layout="pypi").install()``).
"""

from __future__ import annotations

from pathlib import Path

from te_align.hooks.ai_toolkit import SUPPORTED, checkout_version
from te_align.hooks.base import OFF_WORDS
from te_align.patching.templates import patch_dir
from te_align.patching.trainers import Detection
from te_align.patching.transaction import FileChange, PatchError, Plan, sha256_file

TRAINER = "ai-toolkit"
#: ai-toolkit checkout versions the hooks were verified with (the hook's own data).
VERIFIED = tuple(SUPPORTED["current"])
EXTENSION = "extensions/te_align/__init__.py"
ORIGINAL_RUN = "te_align_original_run.py"
#: Files whose presence marks an ai-toolkit checkout.
MARKERS = ("run.py", "toolkit/train_tools.py", "toolkit/job.py", "extensions_built_in")


def templates_dir() -> Path:
    d = patch_dir("ai-toolkit")
    if not (d / "run.py").is_file() or not (d / "extension" / "__init__.py").is_file():
        raise PatchError(f"te-align's ai-toolkit patch files are incomplete in {d}; reinstall te-align")
    return d


def shim_source(tpl: Path) -> bytes:
    """The ``run.py`` shim with te-align's ``TE_ALIGN=off`` words written in (it decides before importing te-align)."""
    shim = (tpl / "run.py").read_bytes()
    placeholder = b"_OFF_WORDS = None"
    if placeholder not in shim:
        raise PatchError(f"te-align's ai-toolkit shim {tpl / 'run.py'} has no {placeholder.decode()} line; reinstall te-align")
    return shim.replace(placeholder, f"_OFF_WORDS = {OFF_WORDS!r}".encode(), 1)


def detect(path: Path) -> Detection | None:
    root = Path(path)
    if not all((root / m).exists() for m in MARKERS):
        return None
    version = checkout_version(root)
    notes: list[str] = []
    if version is None:
        version = "unknown"
    elif version not in VERIFIED:
        notes.append(f"te-align was verified with ai-toolkit {', '.join(VERIFIED)}; the hooks check every target when a job starts and refuse if one changed")
    return Detection(TRAINER, root, "checkout", version, tuple(notes))


def plan(detection: Detection, profile: str | None) -> Plan:
    root = detection.root
    if detection.version == "unknown":
        raise PatchError(
            f"{root} looks like ai-toolkit but its version is unknown (no VERSION in version.py); "
            f"te-align was verified with {', '.join(VERIFIED)}: update the checkout (git pull)"
        )
    tpl = templates_dir()
    ext = (tpl / "extension" / "__init__.py").read_bytes()
    if profile is not None:
        ext = ext.replace(b"PINNED_PROFILE = None", f"PINNED_PROFILE = {profile!r}".encode(), 1)
    run = root / "run.py"
    current_run = run.read_bytes()
    shim = shim_source(tpl)
    changes = [FileChange(EXTENSION, ext, sha256_file(root / EXTENSION), note="te-align extension")]
    if current_run != shim:  # an earlier patch's shim: the saved original stays as it is
        changes.append(FileChange(ORIGINAL_RUN, current_run, sha256_file(root / ORIGINAL_RUN), note="the original run.py"))
    else:
        orig = root / ORIGINAL_RUN
        if not orig.is_file():
            raise PatchError(f"{run} is te-align's shim but {orig} is missing; restore run.py from git")
        changes.append(FileChange(ORIGINAL_RUN, orig.read_bytes(), sha256_file(orig), note="the original run.py"))
    changes.append(FileChange("run.py", shim, sha256_file(run), note="shim: runs te_align_original_run.py"))
    return Plan(root, TRAINER, detection.version, tuple(changes), profile=profile, extra={"layout": detection.layout})
