"""Reference encoding by an alignment profile (imports torch)."""

from te_align.encoding.conditioning import Conditioning
from te_align.encoding.core import (
    EncodeOptions,
    count_tokens,
    encode,
    encode_slot,
    encode_uncond,
    sample_dropout,
)
from te_align.encoding.loading import load_text_encoders

__all__ = [
    "Conditioning",
    "EncodeOptions",
    "count_tokens",
    "encode",
    "encode_slot",
    "encode_uncond",
    "load_text_encoders",
    "sample_dropout",
]
