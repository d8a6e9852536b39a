"""On-disk patch of a Nerogar/OneTrainer checkout: its launch scripts go through te-align.

Plan: each launch script that exists (``scripts/train.py`` for the CLI; ``scripts/train_ui_qt.py``, which
``start-ui.sh`` / ``start-ui.bat`` run, ``scripts/train_ui.py`` (kept by OneTrainer for external
launchers) and ``scripts/train_ui_ctk.py`` for the GUI, whose training runs in the GUI's own process
(``modules/ui/TrainUIController.py`` starts a thread); ``scripts/sample.py``) is replaced by a drop-in
(template ``templates/launch_script.py.tmpl`` of this folder) that installs :mod:`te_align.trainers.onetrainer.hooks`
right after OneTrainer's own ``script_imports()`` and then runs the original code, kept byte for byte
as ``te_align_originals/scripts/<name>``. Version: the git HEAD; a commit te-align was not verified
against is accepted only when every hook target is present with the expected parameters, checked
statically (the source is parsed, nothing is imported).
"""

from __future__ import annotations

from pathlib import Path

from te_align.patching.dropins import ORIGINALS, plan_drop_ins, shim_from_template, target_problems
from te_align.patching.trainers import Detection, commit_version
from te_align.patching.transaction import (
    PatchError,
    Plan,
)
from te_align.trainers.api import target_mismatch
from te_align.trainers.onetrainer.hooks import OneTrainerHook

TRAINER = "onetrainer"
#: Launch scripts that get a drop-in (those that exist), with what they start.
SCRIPTS: tuple[tuple[str, str], ...] = (
    ("scripts/train.py", "CLI training"),
    ("scripts/train_ui_qt.py", "GUI (start-ui), training in-process"),
    ("scripts/train_ui.py", "GUI entry kept for external launchers"),
    ("scripts/train_ui_ctk.py", "legacy GUI, training in-process"),
    ("scripts/sample.py", "sampling"),
)
#: Files whose presence marks a OneTrainer checkout.
MARKERS = ("scripts/train.py", "scripts/util/import_util.py", "modules/model/BaseModel.py", "modules/trainer/GenericTrainer.py")


def templates_dir() -> Path:
    d = Path(__file__).with_name("templates")
    if not (d / "launch_script.py.tmpl").is_file():
        raise PatchError(f"te-align's OneTrainer patch files are incomplete in {d}; reinstall te-align")
    return d


def detect(path: Path) -> Detection | None:
    root = Path(path)
    if not all((root / m).is_file() for m in MARKERS):
        return None
    return Detection(TRAINER, root, "checkout", *commit_version(root, OneTrainerHook.supported))


def static_problems(root: Path) -> list[str]:
    """Hook targets that are missing or whose parameters changed, read from the source (no import)."""
    return target_problems(root, OneTrainerHook().targets())


def shim_source(script: str, profile: str | None) -> bytes:
    up = "/".join([".."] * (len(Path(script).parts) - 1)) or "."
    return shim_from_template(templates_dir() / "launch_script.py.tmpl", script, profile,
                              unpinned="profile chosen per model type", up=up)


def plan(detection: Detection, profile: str | None) -> Plan:
    root = detection.root
    problems = static_problems(root)
    if problems:
        commit = next(iter(OneTrainerHook.supported))[:7]
        raise PatchError(target_mismatch("OneTrainer", detection.version, root, problems, OneTrainerHook.supported,
                                         how=f"check that commit out (git -C {root} checkout {commit})"))
    readme = (
        "Original OneTrainer launch scripts, kept byte for byte by te-align; the scripts of the same name in\n"
        f"scripts/ run them after activating te-align. Undo everything with: te-align unpatch {root}\n"
    )
    return plan_drop_ins(detection, profile, trainer=TRAINER, name="OneTrainer", scripts=SCRIPTS, shim=shim_source,
                         readme=readme)


__all__ = ["ORIGINALS", "SCRIPTS", "detect", "plan", "shim_source", "static_problems"]
