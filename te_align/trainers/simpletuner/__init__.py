"""bghira/SimpleTuner."""

from te_align.trainers.api import Dialect, TrainerSpec

SPEC = TrainerSpec(
    name="simpletuner",
    display_name="SimpleTuner",
    repo="bghira/SimpleTuner",
    aliases=("simple-tuner",),
    check=(Dialect("simpletuner", "audit", "SimpleTuner config.json/.toml", writer="writer"),),
    hooks="hooks",
    patch="patch",
    probe="probe",
    patch_path="SimpleTuner checkout",
    probe_path="a checkout at --path or $ENV, or the installed package",
    env_dir="TE_ALIGN_SIMPLETUNER_DIR",
)
