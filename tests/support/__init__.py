"""Offline test support: real-convention tokenizers, tiny text encoders and diffusers pipelines.

See :mod:`.tokenizers` and :mod:`.encoders`.
"""

from .encoders import (
    FAMILIES,
    PIPELINE_CLASSES,
    build_pipeline_for_encoding,
    clip_text_model,
    clip_text_model_with_projection,
    family_components,
    gemma2_model,
    llama_for_causal_lm,
    qwen2_5_vl_model,
    sd3_transformer,
    t5_encoder_model,
    umt5_encoder_model,
)
from .tokenizers import (
    clip_tokenizer,
    default_cache_dir,
    gemma_tokenizer,
    llama3_tokenizer,
    pile_t5_tokenizer,
    qwen2_tokenizer,
    t5_tokenizer,
    umt5_tokenizer,
)

__all__ = [
    "FAMILIES",
    "PIPELINE_CLASSES",
    "build_pipeline_for_encoding",
    "clip_text_model",
    "clip_text_model_with_projection",
    "clip_tokenizer",
    "default_cache_dir",
    "family_components",
    "gemma2_model",
    "gemma_tokenizer",
    "llama3_tokenizer",
    "llama_for_causal_lm",
    "pile_t5_tokenizer",
    "qwen2_5_vl_model",
    "qwen2_tokenizer",
    "sd3_transformer",
    "t5_encoder_model",
    "t5_tokenizer",
    "umt5_encoder_model",
    "umt5_tokenizer",
]
