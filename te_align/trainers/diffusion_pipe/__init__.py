"""tdrussell/diffusion-pipe (FLUX.1, SDXL, SD3, Chroma, Lumina 2, HiDream, Wan, Qwen-Image, AuraFlow, …)."""

from te_align.trainers.api import Dialect, TrainerSpec

SPEC = TrainerSpec(
    name="diffusion-pipe",
    display_name="diffusion-pipe",
    repo="tdrussell/diffusion-pipe",
    aliases=("diffusion_pipe", "diffusionpipe"),
    check=(Dialect("diffusion-pipe", "audit", "diffusion-pipe training TOML", writer="writer"),),
    names="names",
    hooks="hooks",
    patch="patch",
    probe="probe",
    patch_path="diffusion-pipe checkout",
    probe_path="a diffusion-pipe checkout at --path or $ENV",
    env_dir="TE_ALIGN_DIFFUSION_PIPE_DIR",
)
