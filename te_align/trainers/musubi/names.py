"""musubi-tuner's architectures, scripts and model versions -> te-align's bundled profiles (torch-free).

Read at kohya-ss/musubi-tuner@30c658c4f4b0bf05038b3346eff9670259b10fc7 (0.3.4). musubi-tuner names each
architecture by a script prefix (``<prefix>_train_network.py``, ``<prefix>_cache_text_encoder_outputs.py``) and a
short name in its cache files (``*_<short>_te.safetensors``; ``src/musubi_tuner/dataset/architectures.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arch:
    """One musubi-tuner architecture."""

    #: script prefix (``qwen_image`` in ``qwen_image_train_network.py``)
    prefix: str
    #: short name in cache files (``qi`` in ``*_qi_te.safetensors``)
    short: str
    #: the model as people call it
    display: str
    #: te-align's bundled profile (None: te-align has none)
    profile: str | None
    #: LoRA network module of its LoRA scripts (``--network_module``)
    network: str = ""


#: Every architecture musubi-tuner trains (dataset/architectures.py; the scripts in src/musubi_tuner).
ARCHS: tuple[Arch, ...] = (
    Arch("qwen_image", "qi", "Qwen-Image", "qwen-image", "networks.lora_qwen_image"),
    Arch("wan", "wan", "Wan 2.1/2.2", "wan21", "networks.lora_wan"),
    Arch("hv", "hv", "HunyuanVideo", None, "networks.lora"),
    Arch("hv_1_5", "hv15", "HunyuanVideo 1.5", None, "networks.lora_hv_1_5"),
    Arch("fpack", "fp", "FramePack", None, "networks.lora_framepack"),
    Arch("flux_kontext", "fk", "FLUX.1 Kontext", "flux-dev", "networks.lora_flux"),
    Arch("flux_2", "f2d", "FLUX.2", None, "networks.lora_flux_2"),
    Arch("zimage", "zi", "Z-Image", "z-image", "networks.lora_zimage"),
    Arch("kandinsky5", "k5", "Kandinsky 5", None, "networks.lora_kandinsky"),
    Arch("krea2", "kr2", "Krea 2", "krea2", "networks.lora_krea2"),
    Arch("ideogram4", "i4", "Ideogram 4", "ideogram4", "networks.lora_ideogram4"),
    Arch("hidream_o1", "ho1", "HiDream-O1", None, "networks.lora_hidream_o1"),
)
BY_PREFIX = {a.prefix: a for a in ARCHS}
BY_SHORT = {a.short: a for a in ARCHS}
#: Short names of the Qwen-Image variants whose cache files share the ``qi`` family (edit, layered).
QWEN_VARIANTS = {"qie": "Qwen-Image-Edit", "qil": "Qwen-Image-Layered"}

#: The training and caching scripts, by kind (``<prefix>_<kind>.py``): training (its text encoder runs for sample
#: prompts only), text-encoder caching (every caption) and latent / pixel caching (no text encoder).
TRAIN_KINDS = ("train_network", "train", "train_network_self_flow")
TE_CACHE_KIND = "cache_text_encoder_outputs"
LATENT_KINDS = ("cache_latents", "cache_pixel")
KINDS = (*TRAIN_KINDS, TE_CACHE_KIND, *LATENT_KINDS)
#: HunyuanVideo's caching scripts carry no prefix (docs/hunyuan_video.md; src/musubi_tuner/cache_*.py).
UNPREFIXED = {"cache_text_encoder_outputs.py": ("hv", TE_CACHE_KIND), "cache_latents.py": ("hv", "cache_latents")}
#: A training / caching script's file name (``qwen_image_train_network.py``): a regular expression.
SCRIPTS = (r"(?:(?:" + "|".join(sorted((a.prefix for a in ARCHS), key=len, reverse=True)) + r")_(?:"
           + "|".join(sorted(KINDS, key=len, reverse=True)) + r")|" + "|".join(u[:-3] for u in UNPREFIXED) + r")\.py")

#: Qwen-Image ``--model_version`` values -> the model (``original`` is the one te-align profiles)
#: (qwen_image/qwen_image_utils.py:1550-1581).
QWEN_VERSIONS = {"original": "Qwen-Image", "layered": "Qwen-Image-Layered", "edit": "Qwen-Image-Edit",
                 "edit-2509": "Qwen-Image-Edit-2509", "edit-2511": "Qwen-Image-Edit-2511"}
#: Qwen-Image ``--model_version`` -> the te-align profile it is checked with (a name te-align does not bundle is
#: "not checked", naming the nearest: never checked as another version).
QWEN_PROFILES = {"original": "qwen-image", "layered": "qwen-image-layered", "edit": "qwen-image-edit",
                 "edit-2509": "qwen-image-edit-2509", "edit-2511": "qwen-image-edit-2511"}
#: FLUX.2 ``--model_version`` (choices, default "dev") -> the te-align profile (flux_2/flux2_utils.py:68-118). The
#: klein base models use the distilled ones' text encoder and pipeline (Flux2KleinPipeline): their names are the
#: klein profiles' aliases where te-align bundles them.
FLUX2_DEFAULT = "dev"
FLUX2_PROFILES = {"dev": "flux2-dev", "klein-4b": "flux2-klein-4b", "klein-base-4b": "flux2-klein-base-4b",
                  "klein-9b": "flux2-klein-9b", "klein-base-9b": "flux2-klein-base-9b"}
#: Wan ``--task`` values of Wan 2.2 (checked with the wan21 profile: the same umT5 text encoding).
WAN22_TASKS = ("t2v-A14B", "i2v-A14B")


def script_arch(script: str | None) -> tuple[Arch, str] | None:
    """(architecture, kind) of a musubi-tuner script name, or None."""
    if not script:
        return None
    name = script.replace("\\", "/").rsplit("/", 1)[-1]
    if name in UNPREFIXED:
        prefix, kind = UNPREFIXED[name]
        return BY_PREFIX[prefix], kind
    for kind in sorted(KINDS, key=len, reverse=True):
        suffix = f"_{kind}.py"
        if name.endswith(suffix) and name[: -len(suffix)] in BY_PREFIX:
            return BY_PREFIX[name[: -len(suffix)]], kind
    return None


def qwen_version(values: dict[str, Any]) -> str:
    """``--model_version`` as musubi-tuner resolves it (``--edit_plus`` / ``--edit`` are older spellings)."""
    version = values.get("model_version")
    if isinstance(version, str) and version:
        return version.lower()
    if values.get("edit_plus"):
        return "edit-2509"
    if values.get("edit"):
        return "edit"
    return "original"


def flux2_version(values: dict[str, Any]) -> str:
    """FLUX.2 ``--model_version`` (default "dev", flux_2/flux2_utils.py:116-118)."""
    version = values.get("model_version")
    return version if isinstance(version, str) and version else FLUX2_DEFAULT


def version_profile(arch: Arch, values: dict[str, Any]) -> tuple[str | None, str, bool]:
    """(te-align profile name, the version key as written, known to musubi-tuner) for an architecture and its
    ``--model_version``. The name may be one te-align does not bundle (``check`` then says "not checked")."""
    given = isinstance(values.get("model_version"), str) and bool(values.get("model_version"))
    if arch.prefix == "qwen_image":
        version = qwen_version(values)
        said = (f"--model_version {version}" if given else "--edit_plus" if values.get("edit_plus")
                else "--edit" if values.get("edit") else "")
        return QWEN_PROFILES.get(version), said, version in QWEN_PROFILES
    if arch.prefix == "flux_2":
        version = flux2_version(values)
        said = f"--model_version {version}" if given else f"--model_version {version} (the default)"
        return FLUX2_PROFILES.get(version), said, version in FLUX2_PROFILES
    return arch.profile, "", True
