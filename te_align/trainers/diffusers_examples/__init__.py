"""The huggingface/diffusers example training scripts (examples/dreambooth, examples/text_to_image)."""

from te_align.trainers.api import Dialect, TrainerSpec

SPEC = TrainerSpec(
    name="diffusers-examples",
    display_name="diffusers example scripts",
    repo="huggingface/diffusers",
    aliases=("diffusers", "diffusers_examples"),
    check=(Dialect("diffusers-examples", "audit", "a diffusers example script's command line",
                   scripts=r"train[\w.-]*\.py", command_line=True, writer="writer"),),
    probe="probe",
    probe_path="a diffusers checkout at --path or $ENV",
    env_dir="TE_ALIGN_DIFFUSERS_EXAMPLES_DIR",
)
