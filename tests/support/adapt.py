"""Fit a bundled profile's architecture numbers to the tiny test encoders of a pipeline.

The behaviour fields (lengths, layers, masks, templates, outputs) stay exactly as bundled; only the
sizes that a tiny random model cannot share with the real one (hidden size, layer count, projection,
vocabulary, token ids of a small vocabulary, dtype) are overridden, the same way a user's folder
build adopts the values it reads.
"""

from __future__ import annotations

from typing import Any

from te_align.profiles import AlignmentProfile


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def architecture_overrides(profile: AlignmentProfile, components: Any) -> dict[str, Any]:
    """Overrides (dotted path -> value) that fit ``profile`` to a pipeline's (or dict's) components."""

    def get(name: str) -> Any:
        return components[name] if isinstance(components, dict) else getattr(components, name)

    out: dict[str, Any] = {}
    for slot in profile.slots:
        base = f"slots.{slot.name}"
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
        tok = get(slot.tokenizer_subfolder)
        for kind in ("pad", "bos", "eos"):
            if getattr(slot.tokenizer, f"{kind}_token_id") is not None:
                token = getattr(slot.tokenizer, f"{kind}_token")
                tid = tok.convert_tokens_to_ids(token) if token is not None else getattr(tok, f"{kind}_token_id")
                if tid is not None and tid != getattr(slot.tokenizer, f"{kind}_token_id"):
                    out[f"{base}.tokenizer.{kind}_token_id"] = tid
    return out


def fit_profile(profile: AlignmentProfile, components: Any, **overrides: Any) -> AlignmentProfile:
    """``profile`` with architecture numbers taken from the tiny components (plus ``overrides``)."""
    merged = architecture_overrides(profile, components)
    merged.update(overrides)
    return profile.with_overrides(merged)
