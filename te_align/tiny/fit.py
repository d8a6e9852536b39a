"""Fitting a bundled profile to the tiny encoders: the architecture numbers change, the behaviour does not.

The behaviour fields (lengths, layers, masks, templates, outputs) stay exactly as bundled; only the sizes
that a tiny random model cannot share with the real one (hidden size, layer count, projection,
vocabulary, token ids of a small vocabulary, dtype) are overridden, the same way a user's folder build
adopts the values it reads.

* :func:`architecture_overrides` / :func:`fit_profile`: from a pipeline (or a dict of components).
* :func:`profile_overrides`: for a training family of :func:`te_align.tiny.pipelines.build_pipeline`.
* :func:`tiny_profile_overrides`: for the tiny-demo preset's model folder (:func:`te_align.tiny.pipelines.build_tiny_sd3`),
  read from its configs and tokenizers without loading a weight.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

__all__ = [
    "DEMO_PROFILE",
    "PROFILES",
    "architecture_overrides",
    "fit_profile",
    "profile_overrides",
    "tiny_profile_overrides",
]

#: Training family (:func:`te_align.tiny.pipelines.build_pipeline`) -> the bundled profile it fits.
PROFILES = {"sd15": "sd15", "sdxl": "sdxl", "sd3": "sd35-large", "flux": "flux-dev", "flux-schnell": "flux-schnell"}

#: The bundled profile of the demo's tiny SD3 model.
DEMO_PROFILE = "sd35-large"

# T5 alone: the tiny chroma training pipeline (te_align.tiny.pipelines.build_pipeline) and the shapes-world base
PROFILES["chroma"] = "chroma"


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def architecture_overrides(profile: AlignmentProfile, components: Any) -> dict[str, Any]:
    """Overrides (dotted path -> value) that fit ``profile`` to a pipeline's (or dict's) components."""

    def get(name: str) -> Any:
        return components[name] if isinstance(components, dict) else getattr(components, name)

    out: dict[str, Any] = {}
    for slot in profile.slots:
        base = f"slots.{slot.name}"
        if slot.tokenizer_only:  # no encoder: only the tokenizer's special-token ids can differ
            _fit_token_ids(out, base, slot, get(slot.tokenizer_subfolder))
            continue
        cfg = _text_config(get(slot.encoder_subfolder).config)
        width = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None)
        layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "num_layers", None)
        out[f"{base}.encoder.hidden_size"] = width
        out[f"{base}.encoder.num_layers"] = layers
        if slot.encoder.projection_dim is not None:
            out[f"{base}.encoder.projection_dim"] = get(slot.encoder_subfolder).config.projection_dim
        if slot.encoder.vocab_size is not None:
            out[f"{base}.encoder.vocab_size"] = cfg.vocab_size
        if slot.encoder.max_position_embeddings is not None:
            out[f"{base}.encoder.max_position_embeddings"] = cfg.max_position_embeddings
        out[f"{base}.encoder.dtype"] = "float32"
        _fit_token_ids(out, base, slot, get(slot.tokenizer_subfolder))
    return out


def _fit_token_ids(out: dict[str, Any], base: str, slot: Any, tok: Any) -> None:
    for kind in ("pad", "bos", "eos"):
        if getattr(slot.tokenizer, f"{kind}_token_id") is not None:
            token = getattr(slot.tokenizer, f"{kind}_token")
            tid = tok.convert_tokens_to_ids(token) if token is not None else getattr(tok, f"{kind}_token_id")
            if tid is not None and tid != getattr(slot.tokenizer, f"{kind}_token_id"):
                out[f"{base}.tokenizer.{kind}_token_id"] = tid


def fit_profile(profile: AlignmentProfile, components: Any, **overrides: Any) -> AlignmentProfile:
    """``profile`` with architecture numbers taken from the tiny components (plus ``overrides``)."""
    merged = architecture_overrides(profile, components)
    merged.update(overrides)
    return profile.with_overrides(merged)


@functools.cache
def _family_overrides(family: str) -> dict[str, Any]:
    from te_align.profiles import profile as _profile
    from te_align.tiny.encoders import family_components

    components = family_components("flux" if family.startswith("flux") else family)
    return architecture_overrides(_profile(PROFILES[family]), components)


def profile_overrides(family: str) -> dict[str, Any]:
    """Overrides that fit the bundled profile of ``family`` (:data:`PROFILES`) to the tiny encoders.

    The encoders are built once per process for this; every call returns a fresh dict.
    """
    return dict(_family_overrides(family))


def _folder_components(folder: Path, profile: AlignmentProfile) -> dict[str, Any]:
    """The tokenizers of ``profile``'s slots from a diffusers folder, and each encoder's config (no weights)."""
    import transformers

    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    out: dict[str, Any] = {}
    for slot in profile.slots:
        _, tok_cls = index[slot.tokenizer_subfolder]
        out[slot.tokenizer_subfolder] = getattr(transformers, tok_cls).from_pretrained(str(folder / slot.tokenizer_subfolder))
        if not slot.tokenizer_only:
            _, enc_cls = index[slot.encoder_subfolder]
            config_cls = getattr(transformers, enc_cls).config_class
            out[slot.encoder_subfolder] = SimpleNamespace(config=config_cls.from_pretrained(str(folder / slot.encoder_subfolder)))
    return out


def tiny_profile_overrides(model: str | Path) -> dict[str, Any]:
    """Overrides that fit the bundled :data:`DEMO_PROFILE` to the demo model's encoders (architecture numbers only).

    Read from the folder's encoder configs and tokenizers: nothing is built or loaded twice.
    """
    from te_align.profiles import profile as _profile

    profile = _profile(DEMO_PROFILE)
    return architecture_overrides(profile, _folder_components(Path(model), profile))
