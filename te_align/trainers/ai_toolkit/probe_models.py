"""ai-toolkit's model objects on tiny encoders: ``StableDiffusion`` and the ``BaseModel`` families.

Shared by the probe (:class:`te_align.probe.adapter.AiToolkit`, checkout layout) and
``tests/trainers/ai_toolkit/test_ai_toolkit_checkout.py``. ai-toolkit's model modules import its whole image/video stack
(torchvision, torchaudio, OpenCV...); where that stack is missing they do not import, and
:func:`import_model_classes` raises with the reason (nothing is stood in for them here).

Model objects are made with ``cls.__new__`` plus the attributes the encode methods read (no weights
are loaded, no ``__init__`` runs); every method called on them is ai-toolkit's own code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

MODEL_PACKAGE = "extensions_built_in.diffusion_models"

#: family key -> (profile, ``model:`` section of the job config, te_align.tiny family)
BASE_MODELS: dict[str, tuple[str, dict[str, Any], str]] = {
    "chroma": ("chroma", {"arch": "chroma"}, "chroma"),
    "hidream": ("hidream", {"arch": "hidream"}, "hidream"),
    "qwen-image": ("qwen-image", {"arch": "qwen_image"}, "qwen-image"),
    "wan": ("wan21", {"arch": "wan22_14b"}, "wan21"),
}
#: profile -> family key of :data:`BASE_MODELS`
BASE_MODEL_PROFILES = {v[0]: k for k, v in BASE_MODELS.items()}

#: profile -> (``model:`` section, te_align.tiny family, number of tokenizer/encoder pairs) for
#: ``StableDiffusion.encode_prompt``
LEGACY: dict[str, tuple[dict[str, Any], str, int]] = {
    "sd15": ({"arch": "sd1", "name_or_path": "runwayml/stable-diffusion-v1-5"}, "sd15", 1),
    "sdxl": ({"arch": "sdxl"}, "sdxl", 2),
    "sd35-large": ({"arch": "sd3", "name_or_path": "stabilityai/stable-diffusion-3.5-large"}, "sd3", 3),
    "flux-dev": ({"arch": "flux", "name_or_path": "black-forest-labs/FLUX.1-dev"}, "flux", 2),
    "flux-schnell": ({"arch": "flux", "name_or_path": "black-forest-labs/FLUX.1-schnell"}, "flux", 2),
    "auraflow": ({"arch": "auraflow"}, "auraflow", 1),
    "lumina2": ({"arch": "lumina2"}, "lumina2", 1),
    "pixart-sigma": ({"arch": "pixart_sigma"}, "pixart-sigma", 1),
}


def import_model_package() -> str | None:
    """Import ai-toolkit's model package; returns a note when it had to be registered without its ``__init__``.

    That ``__init__`` imports every built-in model; OmniGen2's triton kernels ask the CUDA driver for the
    device at import, which raises on a machine without a GPU (ai-toolkit itself cannot start there). The
    modules used here (Chroma, HiDream, Qwen-Image) are then imported for real below the bare package.
    """
    try:
        importlib.import_module(MODEL_PACKAGE)
        return None
    except Exception as e:
        for name in [m for m in sys.modules if m == MODEL_PACKAGE or m.startswith(MODEL_PACKAGE + ".")]:
            del sys.modules[name]
        spec = importlib.util.find_spec(MODEL_PACKAGE)
        if spec is None:
            raise
        sys.modules[MODEL_PACKAGE] = importlib.util.module_from_spec(spec)
        return f"{MODEL_PACKAGE}/__init__.py not run ({type(e).__name__}: {str(e)[:80]})"


def import_model_classes() -> dict[str, Any]:
    """ai-toolkit's model classes (checkout on ``sys.path``); raises whatever their import raises."""
    note = import_model_package()
    from extensions_built_in.diffusion_models.chroma.chroma_model import ChromaModel
    from extensions_built_in.diffusion_models.hidream.hidream_model import HidreamModel
    from extensions_built_in.diffusion_models.hidream.src.pipelines.hidream_image.pipeline_hidream_image import (
        HiDreamImagePipeline,
    )
    from extensions_built_in.diffusion_models.qwen_image.qwen_image import QwenImageModel
    from toolkit.config_modules import ModelConfig
    from toolkit.models.wan21.wan21 import Wan21
    from toolkit.stable_diffusion_model import StableDiffusion

    return {"ModelConfig": ModelConfig, "StableDiffusion": StableDiffusion, "chroma": ChromaModel, "hidream": HidreamModel,
            "qwen-image": QwenImageModel, "wan": Wan21, "HiDreamImagePipeline": HiDreamImagePipeline,
            "package_note": note}


def bare(classes: Mapping[str, Any], cls: Any, model: Mapping[str, Any], **attrs: Any) -> Any:
    """An ai-toolkit model object with only what its encode methods read (ai-toolkit's own methods)."""
    import torch

    m = cls.__new__(cls)
    m.model_config = classes["ModelConfig"](**{"name_or_path": "tiny", **model})
    if cls is classes["StableDiffusion"]:
        m.arch = m.model_config.arch
    m.device_torch, m.torch_dtype = torch.device("cpu"), torch.float32
    m.encode_control_in_text_embeddings = False
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def _suffixes(n: int) -> list[str]:
    return ["" if i == 0 else f"_{i + 1}" for i in range(n)]


def base_model(classes: Mapping[str, Any], family: str, pipe: Any) -> tuple[Any, Any]:
    """(``BaseModel`` subclass object, the pipeline it holds) for ``family`` over ``pipe``'s text side.

    ``pipe`` is the tiny diffusers pipeline of the family (:func:`te_align.tiny.pipelines.build_pipeline_for_encoding`).
    HiDream gets ai-toolkit's own pipeline class over the same tokenizers and encoders (its
    ``_encode_prompt`` is what ``get_prompt_embeds`` calls).
    """
    _, model, _ = BASE_MODELS[family]
    comps = {k: v for k, v in pipe.components.items() if k.startswith(("tokenizer", "text_encoder")) and v is not None}
    if family == "hidream":
        pipe = classes["HiDreamImagePipeline"](scheduler=None, vae=None, transformer=None, **comps)
    sfx = [s for s in ("", "_2", "_3", "_4") if f"tokenizer{s}" in comps]
    toks, encs = [comps[f"tokenizer{s}"] for s in sfx], [comps[f"text_encoder{s}"] for s in sfx]
    if family == "chroma":  # ChromaModel: [FakeCLIP, T5]
        toks, encs = [None, *toks], [None, *encs]
    return bare(classes, classes[family], model, pipeline=pipe, tokenizer=toks, text_encoder=encs), pipe


def legacy_model(classes: Mapping[str, Any], profile: str, pipe: Any) -> Any:
    """A ``StableDiffusion`` object for ``profile`` holding ``pipe``'s tokenizers and text encoders."""
    model, _, n = LEGACY[profile]
    sfx = _suffixes(n)
    toks, encs = [getattr(pipe, f"tokenizer{s}") for s in sfx], [getattr(pipe, f"text_encoder{s}") for s in sfx]
    return bare(classes, classes["StableDiffusion"], model, pipeline=pipe, tokenizer=toks if n > 1 else toks[0],
                text_encoder=encs if n > 1 else encs[0])
