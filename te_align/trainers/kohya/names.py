"""kohya-ss/sd-scripts (and the kohya_ss GUI, which runs it): architecture and script names -> profile.

sd-scripts names its architectures by its strategy modules (``library/strategy_<arch>.py``, read at
kohya-ss/sd-scripts@48d368fa557731ad0488c07304dfeba8c07910eb). Each trains one model family; where a
family has several bundled profiles, the variant is decided by the run (see :func:`profile_name`).
"""

from __future__ import annotations

#: sd-scripts architecture -> the bundled profile a run of it follows by default.
ARCH_PROFILES: dict[str, str] = {
    "sd": "sd15",
    "sdxl": "sdxl",
    "sd3": "sd35-large",  # every bundled SD3 profile has the same behaviour
    "flux": "flux-dev",
    "lumina": "lumina2",
    "anima": "anima",
    "hunyuan_image": "hunyuanimage-2.1",
}

#: (architecture, variant) -> profile. ``sd`` + ``v2``: SD 2.x (``--v2``, or a tokenizer padding with "!");
#: ``flux`` + ``schnell`` (sd-scripts' checkpoint analysis finds no guidance embedder) or ``chroma``
#: (``--model_type chroma``).
VARIANT_PROFILES: dict[tuple[str, str], str] = {
    ("sd", "v2"): "sd21",
    ("flux", "schnell"): "flux-schnell",
    ("flux", "chroma"): "chroma",
}

#: sd-scripts train scripts -> (architecture, whether ``te-align patch`` installs a drop-in for it),
#: LoRA scripts first, then full fine-tunes (the order of the patch plan).
SCRIPTS: dict[str, tuple[str, bool]] = {
    "train_network.py": ("sd", True),
    "sdxl_train_network.py": ("sdxl", True),
    "sd3_train_network.py": ("sd3", True),
    "flux_train_network.py": ("flux", True),
    "lumina_train_network.py": ("lumina", True),
    "hunyuan_image_train_network.py": ("hunyuan_image", True),
    "anima_train_network.py": ("anima", True),
    "fine_tune.py": ("sd", True),
    "train_db.py": ("sd", True),
    "sdxl_train.py": ("sdxl", True),
    "sd3_train.py": ("sd3", True),
    "flux_train.py": ("flux", True),
    "lumina_train.py": ("lumina", True),
    "anima_train.py": ("anima", True),
    "train_textual_inversion.py": ("sd", False),
    "sdxl_train_textual_inversion.py": ("sdxl", False),
}

#: sd-scripts network modules that train one architecture only (``--network_module``; ``networks.lora`` trains SD 1.x/2.x
#: and SDXL, so it decides nothing).
NETWORK_MODULES: dict[str, str] = {
    "networks.lora_flux": "flux",
    "networks.lora_sd3": "sd3",
    "networks.lora_lumina": "lumina",
    "networks.lora_anima": "anima",
    "networks.lora_hunyuan_image": "hunyuan_image",
}


def network_arch(module: object) -> str | None:
    """The architecture a ``network_module`` trains (None: any, or not an sd-scripts module)."""
    return NETWORK_MODULES.get(module) if isinstance(module, str) else None


#: kohya_ss GUI model checkboxes -> the script the GUI runs, first checked box wins
#: (bmaltais/kohya_ss@45088f04 kohya_gui/lora_gui.py:1779-1792); none checked: ``train_network.py``.
GUI_CHECKBOXES: tuple[tuple[str, str], ...] = (
    ("sdxl", "sdxl_train_network.py"),
    ("flux1_checkbox", "flux_train_network.py"),
    ("sd3_checkbox", "sd3_train_network.py"),
    ("hunyuan_image_checkbox", "hunyuan_image_train_network.py"),
    ("anima_checkbox", "anima_train_network.py"),
    ("lumina_checkbox", "lumina_train_network.py"),
)
GUI_DEFAULT_SCRIPT = "train_network.py"


def profile_name(arch: str, variant: str | None = None) -> str:
    """The bundled profile of an sd-scripts architecture, or of one of its variants (:data:`VARIANT_PROFILES`)."""
    if variant is not None and (arch, variant) in VARIANT_PROFILES:
        return VARIANT_PROFILES[(arch, variant)]
    return ARCH_PROFILES[arch]


def script_arch(script: str | None) -> str | None:
    """The architecture a train script trains (None: not an sd-scripts train script)."""
    return SCRIPTS[script][0] if script in SCRIPTS else None


def drop_in_scripts() -> tuple[tuple[str, str], ...]:
    """(script, architecture) of every script ``te-align patch`` replaces by a drop-in, in plan order."""
    return tuple((s, arch) for s, (arch, drop_in) in SCRIPTS.items() if drop_in)
