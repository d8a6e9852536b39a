"""Reference encoding by an alignment profile.

Submodules that need torch (``core``, ``loading``) are imported on first use, so that importing
``te_align.encoding.cache.admin`` or ``te_align.encoding.conditioning`` for a CLI command stays light.
"""

from __future__ import annotations

from te_align._lazy import lazy_exports

_EXPORTS = {
    "Conditioning": "te_align.encoding.conditioning",
    "EncodeOptions": "te_align.encoding.core",
    "count_tokens": "te_align.encoding.core",
    "encode": "te_align.encoding.core",
    "encode_slot": "te_align.encoding.core",
    "encode_uncond": "te_align.encoding.core",
    "long_prompt_chunks": "te_align.encoding.core",
    "parse_prompt_weights": "te_align.encoding.weights",
    "sample_dropout": "te_align.encoding.core",
    "tokenize_length": "te_align.encoding.core",
    "tokenize_slot_weighted": "te_align.encoding.weights",
    "weight_hidden_states": "te_align.encoding.weights",
    "load_text_encoders": "te_align.encoding.loading",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
