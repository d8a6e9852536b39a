"""kohya-ss/sd-scripts and the bmaltais/kohya_ss GUI that runs it."""

import re

from te_align.trainers.api import Dialect, TrainerSpec
from te_align.trainers.kohya.names import SCRIPTS

SPEC = TrainerSpec(
    name="kohya",
    display_name="kohya sd-scripts",
    repo="kohya-ss/sd-scripts",
    aliases=("sd-scripts", "sd_scripts", "kohya-ss", "kohya_ss"),
    source_words=("sd-scripts",),
    check=(
        Dialect("kohya", "audit", "sd-scripts TOML or command line",
                scripts="|".join(re.escape(s) for s in sorted(SCRIPTS, key=len, reverse=True)), writer="writer"),
        Dialect("kohya-gui", "audit_gui", "kohya_ss GUI JSON", repo="bmaltais/kohya_ss",
                env_dir="TE_ALIGN_KOHYA_GUI_DIR", writer="writer_gui"),
    ),
    names="names",
    hooks="hooks",
    patch="patch",
    probe="probe",
    patch_path="kohya_ss GUI folder or sd-scripts checkout",
    probe_path="an sd-scripts checkout at --path or $ENV",
    env_dir="TE_ALIGN_KOHYA_DIR",
)
