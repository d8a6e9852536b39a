"""kohya-ss/musubi-tuner (Qwen-Image, Wan 2.1/2.2, HunyuanVideo, FramePack, FLUX.1 Kontext, …)."""

from te_align.trainers.api import Dialect, TrainerSpec
from te_align.trainers.musubi.names import SCRIPTS

SPEC = TrainerSpec(
    name="musubi",
    display_name="musubi-tuner",
    repo="kohya-ss/musubi-tuner",
    aliases=("musubi-tuner", "musubi_tuner"),
    check=(Dialect("musubi", "audit", "musubi-tuner --config_file / --dataset_config TOML or command line",
                   scripts=SCRIPTS, command_line=True, writer="writer"),),
    names="names",
    hooks="hooks",
    patch="patch",
    probe="probe",
    patch_path="musubi-tuner checkout",
    probe_path="a musubi-tuner checkout at --path or $ENV",
    env_dir="TE_ALIGN_MUSUBI_DIR",
)
