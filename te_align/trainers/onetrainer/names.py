"""OneTrainer's model types -> te-align's bundled profiles: the one table ``check`` and the hooks both read.

Read at Nerogar/OneTrainer@23df3832e8f213d64c337e39f9365ba46e99fed0 (``modules/util/enum/ModelType.py``).
"""

from __future__ import annotations

from typing import Any

#: ``ModelType`` name prefix -> (bundled profile, whether te-align's OneTrainer hooks encode it); the first matching
#: prefix wins (SD3.5 before SD3). Anima: OneTrainer trains it, te-align checks it but does not hook its model class.
MODEL_TYPES: tuple[tuple[str, str, bool], ...] = (
    ("STABLE_DIFFUSION_15", "sd15", True), ("STABLE_DIFFUSION_2", "sd21", True),
    ("STABLE_DIFFUSION_35", "sd35-large", True), ("STABLE_DIFFUSION_3", "sd3-medium", True),
    ("STABLE_DIFFUSION_XL", "sdxl", True), ("FLUX_DEV", "flux-dev", True), ("FLUX_FILL_DEV", "flux-dev", True),
    ("CHROMA", "chroma", True), ("HI_DREAM", "hidream", True), ("QWEN", "qwen-image", True),
    ("PIXART_SIGMA", "pixart-sigma", True), ("SANA", "sana", True), ("ANIMA", "anima", False),
    # checked, not hooked; FLUX_2 is dev or klein by the transformer's head count (Flux2Model.py:204-208), so the
    # profile named here is only where the base model's name says nothing (the reader then refuses to guess)
    ("FLUX_2", "flux2-dev", False), ("Z_IMAGE", "z-image", False), ("KREA_2", "krea2", False),
    ("IDEOGRAM_4", "ideogram4", False),
)  # fmt: skip

#: ``ModelType`` values te-align has no profile for, by the model's name.
NO_PROFILE: dict[str, str] = {
    "ERNIE": "ERNIE-Image", "HUNYUAN_VIDEO": "HunyuanVideo", "WUERSTCHEN_2": "Würstchen v2",
    "STABLE_CASCADE_1": "Stable Cascade", "PIXART_ALPHA": "PixArt-α",
}

#: The model type a config without ``model_type`` trains (TrainConfig's default).
DEFAULT = "STABLE_DIFFUSION_15"


def model_type_name(model_type: Any) -> str:
    """A ``ModelType`` (enum or its name) as its name."""
    return str(getattr(model_type, "name", model_type) or DEFAULT)


def profile_of(model_type: Any) -> tuple[str | None, bool]:
    """(bundled profile, hooked) of a ``ModelType``; (None, False) when te-align has no profile for it."""
    name = model_type_name(model_type)
    if name in NO_PROFILE:
        return None, False
    for prefix, prof, hooked in MODEL_TYPES:
        if name.startswith(prefix):
            return prof, hooked
    return None, False
