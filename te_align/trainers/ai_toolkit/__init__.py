"""ostris/ai-toolkit (a checkout, or the ostris-ai-toolkit package on PyPI)."""

from te_align.trainers.api import Dialect, TrainerSpec

SPEC = TrainerSpec(
    name="ai-toolkit",
    display_name="ai-toolkit",
    repo="ostris/ai-toolkit",
    aliases=("ai_toolkit", "aitoolkit", "ostris"),
    check=(Dialect("ai-toolkit", "audit", "ai-toolkit job YAML", writer="writer"),),
    names="names",
    hooks="hooks",
    patch="patch",
    probe="probe",
    patch_path="ai-toolkit checkout",
    probe_path="the installed ostris-ai-toolkit package or a checkout at --path",
    env_dir="TE_ALIGN_AI_TOOLKIT_DIR",
)
