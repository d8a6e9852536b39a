"""Nerogar/OneTrainer."""

from te_align.trainers.api import Dialect, TrainerSpec

SPEC = TrainerSpec(
    name="onetrainer",
    display_name="OneTrainer",
    repo="Nerogar/OneTrainer",
    check=(Dialect("onetrainer", "audit", "OneTrainer JSON", writer="writer"),),
    names="names",
    hooks="hooks",
    patch="patch",
    probe="probe",
    patch_path="OneTrainer checkout",
    probe_path="a checkout at --path or $ENV",
    env_dir="TE_ALIGN_ONETRAINER_DIR",
)
