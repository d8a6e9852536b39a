"""Reference encoding by an alignment profile.

Submodules that need torch (``core``, ``loading``) are imported on first use, so that importing
``te_align.encoding.cache`` or ``te_align.encoding.conditioning`` for a CLI command stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Conditioning": "te_align.encoding.conditioning",
    "EncodeOptions": "te_align.encoding.core",
    "count_tokens": "te_align.encoding.core",
    "encode": "te_align.encoding.core",
    "encode_slot": "te_align.encoding.core",
    "encode_uncond": "te_align.encoding.core",
    "long_prompt_chunks": "te_align.encoding.core",
    "sample_dropout": "te_align.encoding.core",
    "tokenize_length": "te_align.encoding.core",
    "load_text_encoders": "te_align.encoding.loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'te_align.encoding' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
