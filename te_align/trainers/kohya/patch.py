"""On-disk patch of kohya sd-scripts (bare checkout or the kohya_ss GUI's ``sd-scripts`` submodule).

Plan: every train script that exists (``train_network.py``, ``sdxl_train_network.py``, …, and the
full fine-tunes) is replaced by a drop-in (template ``templates/train_script.py.tmpl`` of this folder) that
activates :mod:`te_align.trainers.kohya.hooks` and then runs the original code, kept byte for byte as
``te_align_originals/<script>``. The GUI's ``accelerate launch sd-scripts/<script> --config_file …``
keeps working. Version: the git HEAD (submodule ``.git`` files are followed); a commit te-align was
not verified against is accepted only when every hook target is present with the expected
parameters, checked statically (the source is parsed, nothing is imported).
"""

from __future__ import annotations

from pathlib import Path

from te_align._git import git_dir
from te_align.patching.dropins import ORIGINALS, plan_drop_ins, shim_from_template, target_problems
from te_align.patching.trainers import Detection, commit_version
from te_align.patching.transaction import PatchError, Plan
from te_align.trainers.api import target_mismatch
from te_align.trainers.kohya import names as kohya_table
from te_align.trainers.kohya.hooks import KohyaHook, all_targets

TRAINER = "kohya"
#: Scripts that get a drop-in, with the architecture they train (LoRA first, then full fine-tunes).
SCRIPTS: tuple[tuple[str, str], ...] = kohya_table.drop_in_scripts()


def templates_dir() -> Path:
    return Path(__file__).with_name("templates")


# ------------------------------------------------------------------------------------ detection
def _is_sd_scripts(p: Path) -> bool:
    return (p / "library" / "strategy_base.py").is_file() and (p / "train_network.py").is_file()


def detect(path: Path) -> Detection | None:
    """A kohya_ss GUI folder (root = its sd-scripts submodule) or a bare sd-scripts checkout; else None."""
    path = Path(path)
    sub = path / "sd-scripts"
    gui = (path / "kohya_gui").is_dir() or (path / "kohya_gui.py").is_file()
    if gui and sub.is_dir():
        if not _is_sd_scripts(sub):
            how = (
                f"run: git -C {path} submodule update --init --recursive" if git_dir(path) is not None
                else f"{path} is not a git checkout: put a copy of kohya-ss/sd-scripts into {sub}"
            )
            raise PatchError(f"{path} is a kohya_ss GUI folder but its sd-scripts submodule is empty or incomplete; {how}")
        root, layout = sub, "kohya_ss GUI"
    elif _is_sd_scripts(path):
        root, layout = path, "sd-scripts checkout"
    else:
        return None
    version, notes = _version(root)
    if layout == "kohya_ss GUI":
        notes = (f"the GUI launches sd-scripts/<script>; patching {root}", *notes)
    return Detection(TRAINER, root, layout, version, notes)


def _version(root: Path) -> tuple[str, tuple[str, ...]]:
    return commit_version(root, KohyaHook.supported)


def static_problems(root: Path) -> list[str]:
    """Hook targets that are missing or whose parameters changed, read from the source (no import)."""
    return target_problems(root, all_targets())


def shim_source(script: str, profile: str | None) -> bytes:
    return shim_from_template(templates_dir() / "train_script.py.tmpl", script, profile)


def plan(detection: Detection, profile: str | None) -> Plan:
    root = detection.root
    problems = static_problems(root)
    if problems:
        commit = next(iter(KohyaHook.supported))[:7]
        if git_dir(root) is not None:
            how = f"check that commit out (git -C {root} checkout {commit})"
        else:
            how = (f"{root} is not a git checkout: replace it by sd-scripts at that commit "
                   f"(git clone https://github.com/kohya-ss/sd-scripts; git -C sd-scripts checkout {commit})")
        raise PatchError(target_mismatch("sd-scripts", detection.version, root, problems, KohyaHook.supported, how))
    readme = (
        "Original sd-scripts train scripts, kept byte for byte by te-align; the scripts of the same name one\n"
        f"folder up run them after activating te-align. Undo everything with: te-align unpatch {root}\n"
    )
    return plan_drop_ins(detection, profile, trainer=TRAINER, name="sd-scripts", scripts=SCRIPTS, shim=shim_source,
                         readme=readme)


__all__ = ["ORIGINALS", "SCRIPTS", "detect", "plan", "shim_source", "static_problems"]
