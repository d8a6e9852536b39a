"""On-disk patch of a tdrussell/diffusion-pipe checkout: ``train.py`` replaced by a drop-in.

``deepspeed train.py --deepspeed --config CONFIG`` starts every rank from ``train.py``; the drop-in (template
``templates/train_script.py.tmpl`` of this folder) arms :mod:`te_align.trainers.diffusion_pipe.hooks` for the model
type of the config and runs the original code, kept byte for byte as ``te_align_originals/train.py``
(:func:`te_align.patching.dropins.plan_drop_ins`). Version: the git HEAD; a commit te-align was not verified against
is accepted only when every hook target is present with the expected parameters, checked in the source.
"""

from __future__ import annotations

from pathlib import Path

from te_align.patching.dropins import ORIGINALS, plan_drop_ins, shim_from_template, target_problems
from te_align.patching.trainers import Detection, commit_version
from te_align.patching.transaction import PatchError, Plan
from te_align.trainers.api import target_mismatch
from te_align.trainers.diffusion_pipe.hooks import SUPPORTED, DiffusionPipeHook

TRAINER = "diffusion-pipe"
SCRIPTS: tuple[tuple[str, str], ...] = (("train.py", "training, every deepspeed rank"),)
#: Files whose presence marks a diffusion-pipe checkout.
MARKERS = ("train.py", "utils/dataset.py", "utils/cache.py", "models/base.py")


def detect(path: Path) -> Detection | None:
    root = Path(path)
    if not all((root / m).is_file() for m in MARKERS):
        return None
    return Detection(TRAINER, root, "checkout", *commit_version(root, SUPPORTED))


def static_problems(root: Path) -> list[str]:
    """Hook targets that are missing or whose parameters changed, read from the source (no import)."""
    return target_problems(Path(root), DiffusionPipeHook().targets())


def shim_source(script: str, profile: str | None) -> bytes:
    return shim_from_template(Path(__file__).with_name("templates") / "train_script.py.tmpl", script, profile)


def plan(detection: Detection, profile: str | None) -> Plan:
    root = detection.root
    problems = static_problems(root)
    if problems:
        raise PatchError(target_mismatch("diffusion-pipe", detection.version, root, problems, SUPPORTED))
    readme = ("Original diffusion-pipe train.py, kept byte for byte by te-align; the train.py one folder up runs it after "
              f"arming te-align. Undo everything with: te-align unpatch {root}\n")
    return plan_drop_ins(detection, profile, trainer=TRAINER, name="diffusion-pipe", scripts=SCRIPTS, shim=shim_source,
                         readme=readme)


__all__ = ["ORIGINALS", "SCRIPTS", "detect", "plan", "shim_source", "static_problems"]
