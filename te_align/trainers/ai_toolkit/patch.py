"""On-disk patch of an ostris ai-toolkit checkout: the te-align extension and a ``run.py`` shim.

The plan (applied by :mod:`te_align.patching.transaction`):

* create ``extensions/te_align/__init__.py`` (``templates/extension/`` of this folder): ai-toolkit imports it
  before building a job's processes, and it switches every training process to the te-align hooks
  (the process's ``te_align:`` section, the profile pinned with ``--profile``, or the model's own);
* replace ``run.py`` by a shim (``templates/run.py``) that checks te-align imports and then runs
  the original, kept as ``te_align_original_run.py`` — the web UI spawns ``python run.py CONFIG`` and
  takes that path unchanged.

The PyPI packaging (``ostris_ai_toolkit`` in site-packages) is not patched on disk: install the
hooks in-process (``te_align.trainers.ai_toolkit.hooks.AiToolkitHook(layout="pypi").install()``).
"""

from __future__ import annotations

from pathlib import Path

from te_align._git import git_dir
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
from te_align.trainers.ai_toolkit.hooks import SUPPORTED, checkout_version

TRAINER = "ai-toolkit"
#: ai-toolkit checkout versions the hooks were verified with (the hook's own data).
VERIFIED = tuple(SUPPORTED["current"])
EXTENSION = "extensions/te_align/__init__.py"
ORIGINAL_RUN = "te_align_original_run.py"
#: Files whose presence marks an ai-toolkit checkout.
#: The first line of te-align's run.py shim (every te-align version).
SHIM_MARK = b"# te-align shim for ai-toolkit's run.py"
MARKERS = ("run.py", "toolkit/train_tools.py", "toolkit/job.py", "extensions_built_in")


def templates_dir() -> Path:
    d = Path(__file__).with_name("templates")
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
    shim = shim_source(tpl)
    state = root / STATE_DIR
    manifest = read_manifest(root) or {}
    known = manifest.get("files", {}) if manifest.get("trainer") in (None, TRAINER) else {}
    current_run = run.read_bytes() if run.is_file() else None
    orig = root / ORIGINAL_RUN
    entry = known.get("run.py")
    restore_to = None
    if entry is None:
        if current_run is None:
            raise PatchError(f"{run} is missing; restore it from ai-toolkit, then patch again")
        if current_run.startswith(SHIM_MARK):
            raise PatchError(
                f"{run} is te-align's shim but {state} holds no manifest for it (was {STATE_DIR} deleted?); "
                f"{_restore_hint(root)}, then patch again"
            )
        original = current_run
    else:  # patched before: the original unpatch must give back
        orig_entry = known.get(ORIGINAL_RUN)
        orig_now = orig.read_bytes() if orig.is_file() else None
        orig_edited = (
            orig_entry is not None and orig_now is not None and sha256_bytes(orig_now) != orig_entry["patched_sha256"]
            and not orig_now.startswith(SHIM_MARK)
        )
        ours = current_run is None or sha256_bytes(current_run) == entry["patched_sha256"] or current_run.startswith(SHIM_MARK)
        if ours:  # te-align's shim, maybe edited by the user: --replan writes a fresh one
            original = orig_now if orig_edited else (state / entry["backup"]).read_bytes() if entry.get("backup") else None
        elif orig_edited:
            raise PatchError(
                f"both {run} and {orig} changed since te-align patched them; keep the one you want (copy it over "
                f"{run}), then run: te-align unpatch {root} --keep-changed and patch again"
            )
        else:
            original = current_run  # replaced by something else (e.g. git pull): the new original
        if original is None:
            raise PatchError(f"te-align state file is unreadable (no backup of run.py); restore run.py by hand, then delete {state}",
                             file=str(state / "manifest.json"))
        restore_to = original
    changes = [
        FileChange(EXTENSION, ext, sha256_file(root / EXTENSION), note="te-align extension"),
        FileChange(ORIGINAL_RUN, original, sha256_file(orig), note="the original run.py", original_of="run.py"),
        FileChange("run.py", shim, sha256_file(run), note=f"shim: runs {ORIGINAL_RUN}", restore_to=restore_to),
    ]
    return Plan(root, TRAINER, detection.version, tuple(changes), profile=profile, extra={"layout": detection.layout})


def _restore_hint(root: Path) -> str:
    """How to get the original run.py back: git only where the tree is a git checkout."""
    orig = root / ORIGINAL_RUN
    if orig.is_file() and not orig.read_bytes().startswith(SHIM_MARK):
        return f"restore the original te-align kept with: mv {orig} {root / 'run.py'}"
    if git_dir(root) is not None:
        return f"restore the original with: git -C {root} checkout -- run.py"
    return "restore run.py from a fresh copy of ai-toolkit"
