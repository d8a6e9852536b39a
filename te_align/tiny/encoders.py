"""Tiny random-weight text encoders and, per model family, the tokenizers and encoders a pipeline takes.

Used by ``te-align probe`` to run a trainer's real encoding code and :func:`te_align.encode` on the
same small models, by the demo's tiny SD3 model, and by the test suite.

Every factory builds a fresh model from a small config under a fixed seed (the global torch RNG is
forked, so callers' random state is untouched); two calls give bit-identical weights. Models are
float32 and in eval mode. Sizes keep the relations of the real models that the pipelines rely on
(hidden sizes differ between encoders so that a mixed-up concatenation changes shapes; SD3's T5 width is
larger than the two CLIP widths together, as 4096 > 768 + 1280).

``family_components(family)`` returns the tokenizers (:mod:`te_align.tiny.tokenizers`) and text encoders
under the component names of the diffusers 0.42.1 pipeline (classes as in the pipeline's ``__init__``
type hints, or the official ``model_index.json`` where the two disagree);
:func:`te_align.tiny.pipelines.build_pipeline_for_encoding` instantiates the real pipeline class with them.
"""

from __future__ import annotations

from typing import Any, Literal

import transformers

from te_align.tiny import tokenizers as tok
from te_align.tiny._seed import finish as _finish
from te_align.tiny._seed import seed_for as _seed_for
from te_align.tiny._seed import seeded as _seeded

__all__ = [
    "BYT5_D_MODEL",
    "CLIP_VARIANTS",
    "FAMILIES",
    "MODULAR_FAMILIES",
    "PIPELINE_CLASSES",
    "T5_D_MODEL",
    "byt5_encoder_model",
    "clip_text_model",
    "clip_text_model_with_projection",
    "family_components",
    "gemma2_model",
    "gemma3_model",
    "llama_for_causal_lm",
    "mistral3_text_encoder",
    "qwen2_5_vl_model",
    "qwen3_model",
    "qwen3_text_encoder",
    "qwen3_vl_model",
    "t5_encoder_model",
    "umt5_encoder_model",
]

ClipVariant = Literal["L", "H", "G"]

#: Tiny stand-ins for the three CLIP text towers (real values in the comments; official[...]).
#: L = OpenAI CLIP ViT-L/14 (768 wide, 12 layers, quick_gelu, projection 768),
#: H = OpenCLIP ViT-H/14 as in SD2.x (1024 wide, 23 layers, gelu, projection 512),
#: G = OpenCLIP ViT-bigG/14 (1280 wide, 32 layers, gelu, projection 1280).
CLIP_VARIANTS: dict[str, dict[str, Any]] = {
    "L": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "projection_dim": 32,
        "hidden_act": "quick_gelu",
    },
    "H": {
        "hidden_size": 40,
        "intermediate_size": 80,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "projection_dim": 24,
        "hidden_act": "gelu",
    },
    "G": {
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "projection_dim": 48,
        "hidden_act": "gelu",
    },
}

#: Family name -> diffusers pipeline class name.
PIPELINE_CLASSES: dict[str, str] = {
    "sd15": "StableDiffusionPipeline",
    "sd21": "StableDiffusionPipeline",
    "sdxl": "StableDiffusionXLPipeline",
    "sd3": "StableDiffusion3Pipeline",
    "flux": "FluxPipeline",
    "flux-kontext": "FluxKontextPipeline",
    "chroma": "ChromaPipeline",
    "pixart-sigma": "PixArtSigmaPipeline",
    "auraflow": "AuraFlowPipeline",
    "lumina2": "Lumina2Pipeline",
    "hidream": "HiDreamImagePipeline",
    "sana": "SanaPipeline",
    "qwen-image": "QwenImagePipeline",
    "qwen-image-edit": "QwenImageEditPipeline",
    "qwen-image-edit-plus": "QwenImageEditPlusPipeline",
    "hunyuanimage": "HunyuanImagePipeline",
    "wan21": "WanPipeline",
    "anima": "AnimaModularPipeline",
    "flux2": "Flux2Pipeline",
    "flux2-klein": "Flux2KleinPipeline",
    "z-image": "ZImagePipeline",
    "krea2": "Krea2Pipeline",
    "ideogram4": "Ideogram4Pipeline",
    "ltx2": "LTX2Pipeline",
}
#: Families whose official text encoding lives in a diffusers *modular* pipeline (diffusers.modular_pipelines).
MODULAR_FAMILIES: tuple[str, ...] = ("anima",)
FAMILIES: tuple[str, ...] = tuple(PIPELINE_CLASSES)

#: google/byt5-small's width, kept for the tiny ByT5: sd-scripts' HunyuanImage code fills prompts without
#: glyph text with zeros of this hard-coded width (library/hunyuan_image_text_encoder.py:603).
BYT5_D_MODEL = 1472

T5_D_MODEL = 96  # > CLIP-L (32) + CLIP-G (48), as T5-XXL 4096 > 768 + 1280 (SD3 pads CLIP to T5 width)


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def _round_up(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


# --------------------------------------------------------------------------------------------------
# encoder factories
# --------------------------------------------------------------------------------------------------


def _clip_config(variant: ClipVariant, max_position_embeddings: int) -> transformers.CLIPTextConfig:
    # bos 0 / eos 2 / pad 1 are the legacy values of every SD CLIP text config (official[...]
    # .text_encoder). eos_token_id == 2 makes CLIP pool at argmax(input_ids), i.e. the first 49407.
    return transformers.CLIPTextConfig(
        vocab_size=tok.CLIP_VOCAB_SIZE,
        max_position_embeddings=max_position_embeddings,
        layer_norm_eps=1e-5,
        attention_dropout=0.0,
        dropout=0.0,
        initializer_factor=1.0,
        initializer_range=0.02,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
        **CLIP_VARIANTS[variant],
    )


def clip_text_model(
    variant: ClipVariant = "L",
    max_position_embeddings: int = 77,
    seed: int | None = None,
    num_hidden_layers: int | None = None,
) -> transformers.CLIPTextModel:
    """Tiny ``CLIPTextModel`` (vocab 49408) of the given :data:`CLIP_VARIANTS` entry.

    ``num_hidden_layers`` replaces the variant's layer count, for code that reads a hidden state by
    absolute index (sd-scripts' SDXL reads CLIP-L ``hidden_states[11]``, the penultimate of 12).
    """
    config = _clip_config(variant, max_position_embeddings)
    tag = ""
    if num_hidden_layers is not None:
        config.num_hidden_layers = num_hidden_layers
        tag = f"-{num_hidden_layers}l"
    seed = _seed_for(f"clip-{variant}-{max_position_embeddings}{tag}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.CLIPTextModel(config))


def clip_text_model_with_projection(
    variant: ClipVariant = "G", max_position_embeddings: int = 77, seed: int | None = None
) -> transformers.CLIPTextModelWithProjection:
    """Tiny ``CLIPTextModelWithProjection`` (vocab 49408); ``text_embeds`` has ``projection_dim`` features."""
    seed = _seed_for(f"clip-proj-{variant}-{max_position_embeddings}") if seed is None else seed
    with _seeded(seed):
        return _finish(
            transformers.CLIPTextModelWithProjection(_clip_config(variant, max_position_embeddings))
        )


def _t5_family_config(
    config_cls: Any, vocab_size: int, d_model: int, eos_token_id: int, *, d_ff: int | None = None, num_heads: int = 4
) -> Any:
    """The shared tiny T5-family encoder config (gated-gelu, untied embeddings, relative buckets 32/128, pad 0)."""
    return config_cls(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=16,
        d_ff=2 * d_model if d_ff is None else d_ff,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=num_heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.1,
        layer_norm_epsilon=1e-6,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=eos_token_id,
        decoder_start_token_id=0,
    )


def t5_encoder_model(
    vocab_size: int, d_model: int = T5_D_MODEL, seed: int | None = None
) -> transformers.T5EncoderModel:
    """Tiny T5 v1.1 encoder (gated-gelu, untied embeddings, relative buckets 32/128, pad 0, eos 1),
    as ``google/t5-v1_1-xxl`` (official[...].text_encoder_3: d_model 4096, vocab 32128)."""
    config = _t5_family_config(transformers.T5Config, vocab_size, d_model, eos_token_id=1)
    seed = _seed_for(f"t5-{vocab_size}-{d_model}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.T5EncoderModel(config))


def umt5_encoder_model(
    vocab_size: int, d_model: int = 64, eos_token_id: int = 1, seed: int | None = None
) -> transformers.UMT5EncoderModel:
    """Tiny UMT5 encoder (per-layer relative attention bias, gated-gelu, pad 0).

    ``eos_token_id`` 1 for Wan's ``google/umt5-xxl``, 2 for AuraFlow's pile-T5 (official[fal/AuraFlow]
    .text_encoder, official).
    """
    config = _t5_family_config(transformers.UMT5Config, vocab_size, d_model, eos_token_id=eos_token_id)
    seed = _seed_for(f"umt5-{vocab_size}-{d_model}-{eos_token_id}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.UMT5EncoderModel(config))


def gemma2_model(vocab_size: int, seed: int | None = None) -> transformers.Gemma2Model:
    """Tiny ``Gemma2Model`` (gemma-2-2b layout: GQA, alternating sliding/full attention, soft-capping,
    bos 2 / eos 1 / pad 0). Three layers, so ``hidden_states[-2]`` (Lumina2) is an inner layer."""
    config = transformers.Gemma2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=4096,
        max_position_embeddings=8192,
        hidden_activation="gelu_pytorch_tanh",
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    seed = _seed_for(f"gemma2-{vocab_size}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.Gemma2Model(config))


def llama_for_causal_lm(
    vocab_size: int, bos_token_id: int, eos_token_ids: list[int], seed: int | None = None
) -> transformers.LlamaForCausalLM:
    """Tiny ``LlamaForCausalLM`` with the Llama-3.1 rope scaling (official[HiDream-ai/HiDream-I1-Full]
    .text_encoder_4). Eager attention: HiDream calls it with ``output_attentions=True``, which the SDPA
    path in transformers 5 cannot return (it warns and drops them)."""
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        # the hub config's spelling (rope_theta + rope_scaling): transformers 4.x reads only it, 5.x converts it
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_ids,
        attn_implementation="eager",
    )
    seed = _seed_for(f"llama-{vocab_size}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.LlamaForCausalLM(config))


def qwen2_5_vl_model(
    tokenizer: transformers.PreTrainedTokenizerBase, seed: int | None = None, num_hidden_layers: int = 2
) -> transformers.Qwen2_5_VLForConditionalGeneration:
    """Tiny ``Qwen2_5_VLForConditionalGeneration`` (text: 2 layers, GQA, M-RoPE sections [2, 3, 3] for
    head_dim 16 as [16, 24, 24] for 128; vision tower: 1 block of width 16). Special-token ids in the
    config are taken from ``tokenizer`` (real: vision_start 151652, image 151655, video 151656).
    ``num_hidden_layers`` changes the text layer count (HunyuanImage reads ``hidden_states[-3]``, which
    is the embedding output of a 2-layer model)."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tok.QWEN2_SPECIAL_TOKENS}
    config = transformers.Qwen2_5_VLConfig(
        text_config={
            "vocab_size": _round_up(len(tokenizer)),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-6,
            # the hub config's spelling: transformers 4.x reads only rope_scaling/rope_theta (rope_parameters is 5.x)
            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]},
            "rope_theta": 1000000.0,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 32,
            "fullatt_block_indexes": [0],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    tag = "" if num_hidden_layers == 2 else f"-{num_hidden_layers}l"
    seed = _seed_for(f"qwen2.5-vl-{len(tokenizer)}{tag}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.Qwen2_5_VLForConditionalGeneration(config))


#: Qwen2.5-VL's image preprocessing (Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json conventions, as
#: transformers' Qwen2VLImageProcessor defaults hold them): pixel bounds, 14-pixel patches, 2-frame temporal
#: patches, 2x2 merge, OpenAI CLIP mean and std. The Qwen-Image-Edit repos' processor folder was not read.
QWEN2_VL_IMAGE_PROCESSOR: dict[str, Any] = {
    "min_pixels": 56 * 56,
    "max_pixels": 28 * 28 * 1280 * 13,  # 12845056
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}


def qwen2_vl_processor(tokenizer: transformers.PreTrainedTokenizerBase) -> transformers.Qwen2VLProcessor:
    """A real ``Qwen2VLProcessor`` (the class QwenImageEditPipeline's ``processor`` is) over ``tokenizer`` with the
    :data:`QWEN2_VL_IMAGE_PROCESSOR` image processor and no video processor: encode_prompt passes images only, and
    transformers 5 cannot check a video processor's class without torchvision."""
    image_cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
    image_processor = image_cls(**QWEN2_VL_IMAGE_PROCESSOR)

    class _ImagesOnly(transformers.Qwen2VLProcessor):  # type: ignore[misc]
        @classmethod
        def get_attributes(cls) -> list[str]:
            return ["image_processor", "tokenizer"]

    try:
        return transformers.Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer)
    except (AttributeError, TypeError, ValueError):
        return _ImagesOnly(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)


def qwen3_model(tokenizer: transformers.PreTrainedTokenizerBase, seed: int | None = None) -> transformers.Qwen3Model:
    """Tiny ``Qwen3Model`` (Anima's text encoder, Qwen3-0.6B: 28 layers, width 1024, 16 heads, 8 KV heads,
    head_dim 128, QK-norm, rope theta 1e6, tied embeddings; kohya-ss/sd-scripts@48d368f
    configs/qwen3_06b/config.json): 2 layers, width 32, 4 heads, 2 KV heads, head_dim 8, vocabulary
    ``len(tokenizer)`` rounded up to 64, ``<|endoftext|>`` as bos/eos as in that config."""
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = transformers.Qwen3Config(
        vocab_size=_round_up(len(tokenizer)),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,  # the hub config's spelling, read by transformers 4.x and 5.x
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=eot,
    )
    seed = _seed_for(f"qwen3-{len(tokenizer)}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.Qwen3Model(config))


#: Qwen3-4B / Qwen3-8B (FLUX.2 klein 4B / 9B, Z-Image), kohya-ss/musubi-tuner@30c658c
#: src/musubi_tuner/zimage/zimage_utils.py:37-100 config copies: 36 layers, 32 heads, 8 KV heads, head_dim 128,
#: vocab 151936, max_position_embeddings 40960, rope theta 1e6, bfloat16; 4B: width 2560, feed-forward 9728, tied
#: embeddings; 8B: width 4096, feed-forward 12288, untied. The tiny ones keep the 36 layers (so FLUX.2 klein's
#: taps 9, 18, 27 and the 10, 20, 30 of the diffusers klein training script are inner layers, all different) and the
#: tying, with widths 16 (4B) and 24 (8B).
QWEN3_INSTRUCT_VARIANTS: dict[str, dict[str, Any]] = {
    "4B": {"hidden_size": 16, "intermediate_size": 32, "tie_word_embeddings": True},
    "8B": {"hidden_size": 24, "intermediate_size": 48, "tie_word_embeddings": False},
}


def qwen3_text_encoder(
    tokenizer: transformers.PreTrainedTokenizerBase,
    cls: Literal["Qwen3ForCausalLM", "Qwen3Model"] = "Qwen3ForCausalLM",
    variant: Literal["4B", "8B"] = "4B",
    seed: int | None = None,
) -> Any:
    """Tiny Qwen3-4B/8B text encoder (:data:`QWEN3_INSTRUCT_VARIANTS`) as ``Qwen3ForCausalLM`` (FLUX.2 klein's type
    hint) or ``Qwen3Model`` (Z-Image's tests and musubi-tuner load it as such): 36 layers of 2 heads (1 KV head) of
    8, vocabulary ``len(tokenizer)`` rounded up to 64, bos ``<|endoftext|>`` and eos ``<|im_end|>`` as the real
    configs (151643, 151645)."""
    v = QWEN3_INSTRUCT_VARIANTS[variant]
    config = transformers.Qwen3Config(
        vocab_size=_round_up(len(tokenizer)),
        hidden_size=v["hidden_size"],
        intermediate_size=v["intermediate_size"],
        num_hidden_layers=36,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=v["tie_word_embeddings"],
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    seed = _seed_for(f"qwen3-{variant}-{cls}-{len(tokenizer)}") if seed is None else seed
    with _seeded(seed):
        return _finish(getattr(transformers, cls)(config))


#: Mistral-Small-3.1 (FLUX.2 [dev]'s text encoder), kohya-ss/musubi-tuner@30c658c
#: src/musubi_tuner/flux_2/flux2_utils.py:525-575 config copy: Mistral3ForConditionalGeneration, text width 5120,
#: feed-forward 32768, 40 layers, 32 heads, 8 KV heads, head_dim 128, vocab 131072, max positions 131072, rope theta
#: 1e9, no sliding window, bfloat16; a Pixtral vision tower (width 1024, 24 layers, 16 heads, patch 14, image 1540),
#: spatial_merge_size 2, image_token_index 10. The tiny one keeps the 40 text layers (FLUX.2's taps 10, 20, 30 are
#: inner layers), the rope theta and the image token, with width 16 and a one-layer vision tower of width 8.
MISTRAL3_TEXT_LAYERS = 40


def mistral3_text_encoder(tokenizer: transformers.PreTrainedTokenizerBase, seed: int | None = None) -> Any:
    """Tiny ``Mistral3ForConditionalGeneration`` (:data:`MISTRAL3_TEXT_LAYERS` Mistral layers of 2 heads (1 KV
    head) of 8, vocabulary ``len(tokenizer)`` rounded up to 64, a tiny Pixtral vision tower as the class requires);
    bos / eos / pad / image token ids from ``tokenizer``."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<pad>", "[IMG]")}
    text = {
        "model_type": "mistral",
        "vocab_size": _round_up(len(tokenizer)),
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": MISTRAL3_TEXT_LAYERS,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
    }
    vision = {
        "model_type": "pixtral",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "head_dim": 4,
        "image_size": 28,
        "patch_size": 14,
        "num_channels": 3,
        "rope_theta": 10000.0,
    }
    config = transformers.Mistral3Config(
        text_config=text,
        vision_config=vision,
        image_token_index=ids["[IMG]"],
        spatial_merge_size=2,
        projector_hidden_act="gelu",
        multimodal_projector_bias=False,
        vision_feature_layer=-1,
    )
    seed = _seed_for(f"mistral3-{len(tokenizer)}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.Mistral3ForConditionalGeneration(config))


def qwen3_vl_model(
    tokenizer: transformers.PreTrainedTokenizerBase, num_hidden_layers: int = 36, seed: int | None = None
) -> transformers.Qwen3VLModel:
    """Tiny ``Qwen3VLModel`` (Krea 2 and Ideogram 4: Qwen3-VL-4B, text 36 layers, width 2560, 32 heads, 8 KV heads,
    head_dim 128, QK-norm, interleaved M-RoPE sections [24, 20, 20], rope theta 5e6; vision tower with deepstack).
    Text: ``num_hidden_layers`` layers (default 36, so every tapped index of both pipelines exists), width 32,
    2 heads of 16, 1 KV head, M-RoPE sections [3, 3, 2] for head_dim 16 (interleaved), vocabulary ``len(tokenizer)``
    rounded up to 64. Vision: 1 block of width 16, deepstack at block 0. Special-token ids from ``tokenizer``."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tok.QWEN2_SPECIAL_TOKENS}
    config = transformers.Qwen3VLConfig(
        text_config={
            "vocab_size": _round_up(len(tokenizer)),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6,
            # the hub config's spelling (rope_scaling + rope_theta), converted by transformers 5
            "rope_scaling": {"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True},
            "rope_theta": 5000000.0,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "tie_word_embeddings": True,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    seed = _seed_for(f"qwen3-vl-{len(tokenizer)}-{num_hidden_layers}l") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.Qwen3VLModel(config))


def gemma3_model(
    tokenizer: transformers.PreTrainedTokenizerBase, num_hidden_layers: int = 48, seed: int | None = None
) -> transformers.Gemma3ForConditionalGeneration:
    """Tiny ``Gemma3ForConditionalGeneration`` (LTX-2: Gemma 3 12B, text 48 layers, width 3840, 16 heads, 8 KV heads,
    head_dim 256, sliding window 1024 on five of every six layers, query_pre_attn_scalar 256; SigLIP vision tower).
    Text: ``num_hidden_layers`` layers (default 48, so ``hidden_states`` has the real 49 entries), width 32, 4 heads
    of 8, 2 KV heads, sliding window 1024, bos 2 / eos 1 / pad 0 as the tokenizer; vision: 1 layer of width 16."""
    config = transformers.Gemma3Config(
        text_config={
            "vocab_size": _round_up(len(tokenizer)),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 1024,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
        },
        mm_tokens_per_image=1,
        image_token_index=tokenizer.convert_tokens_to_ids("<mask>"),
    )
    seed = _seed_for(f"gemma3-{len(tokenizer)}-{num_hidden_layers}l") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.Gemma3ForConditionalGeneration(config))


def byt5_encoder_model(
    vocab_size: int, d_model: int = BYT5_D_MODEL, seed: int | None = None
) -> transformers.T5EncoderModel:
    """Tiny ByT5 encoder as a ``T5EncoderModel`` (google/byt5-small layout: gated-gelu, untied embeddings,
    relative buckets 32/128, pad 0, eos 1) of byt5-small's width 1472 but 2 layers, 2 heads of 16 and a
    feed-forward of 64 (real: 12 layers, 6 heads of 64, d_ff 3584)."""
    config = _t5_family_config(transformers.T5Config, vocab_size, d_model, eos_token_id=1, d_ff=64, num_heads=2)
    seed = _seed_for(f"byt5-{vocab_size}-{d_model}") if seed is None else seed
    with _seeded(seed):
        return _finish(transformers.T5EncoderModel(config))


# --------------------------------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------------------------------


def _t5_pair(
    cache_dir: tok.PathLike | None,
) -> tuple[transformers.T5TokenizerFast, transformers.T5EncoderModel]:
    t5_tok = tok.t5_tokenizer(cache_dir=cache_dir)
    return t5_tok, t5_encoder_model(_round_up(len(t5_tok), 128))


def family_components(family: str, cache_dir: tok.PathLike | None = None) -> dict[str, Any]:
    """Tokenizers and text encoders of ``family`` keyed by the diffusers component names.

    Fresh objects every call (deterministic weights, freshly loaded tokenizers). Families and classes
    (diffusers 0.42.1 ``__init__`` type hints; official ``model_index.json`` in the bundled official snapshots):

    * ``sd15``: CLIPTokenizer (pad ``<|endoftext|>``) + CLIPTextModel (L).
    * ``sd21``: CLIPTokenizer (pad ``!``) + CLIPTextModel (H).
    * ``sdxl``: CLIPTokenizer (pad eot) + CLIPTextModel (L); tokenizer_2 CLIPTokenizer (pad ``!``) +
      CLIPTextModelWithProjection (G).
    * ``sd3`` (SD3-medium, SD3.5-large/medium): CLIPTokenizer + CLIPTextModelWithProjection (L),
      CLIPTokenizer (pad ``!``) + CLIPTextModelWithProjection (G), T5TokenizerFast + T5EncoderModel.
    * ``flux`` (dev/schnell) and ``flux-kontext``: CLIPTokenizer + CLIPTextModel (L); T5TokenizerFast + T5EncoderModel.
    * ``chroma``: T5TokenizerFast + T5EncoderModel.
    * ``pixart-sigma``: T5Tokenizer + T5EncoderModel.
    * ``auraflow``: LlamaTokenizerFast (pile-T5; official model_index, the type hint says T5Tokenizer) +
      UMT5EncoderModel.
    * ``lumina2``: GemmaTokenizerFast (padding_side left, the pipeline forces right) + Gemma2Model.
    * ``hidream``: CLIP L and G with projection (128 positions: the pipeline feeds min(128, 218) tokens),
      T5Tokenizer + T5EncoderModel, PreTrainedTokenizerFast (Llama-3.1) + LlamaForCausalLM.
    * ``sana``: GemmaTokenizerFast (padding_side right) + Gemma2Model.
    * ``qwen-image``: Qwen2TokenizerFast + Qwen2_5_VLForConditionalGeneration.
    * ``qwen-image-edit``, ``qwen-image-edit-plus``: as ``qwen-image``, and ``processor`` a Qwen2VLProcessor
      (:func:`qwen2_vl_processor`) over the same tokenizer.
    * ``hunyuanimage``: Qwen2TokenizerFast + Qwen2_5_VLForConditionalGeneration with 4 text layers (so
      ``hidden_states[-3]`` is an inner layer); tokenizer_2 ByT5Tokenizer (byte level, no files) +
      T5EncoderModel (:func:`byt5_encoder_model`).
    * ``wan21``: T5TokenizerFast (umt5) + UMT5EncoderModel.
    * ``flux2``: the Mistral-Small-3.1 tekken tokenizer (a TokenizersBackend standing in for the PixtralProcessor,
      whose import needs torchvision) + Mistral3ForConditionalGeneration (40 text layers).
    * ``flux2-klein``: Qwen2TokenizerFast (Qwen3 instruct, real chat template) + Qwen3ForCausalLM (4B layout).
    * ``z-image``: Qwen2TokenizerFast (Qwen3 instruct, real chat template) + Qwen3Model (4B layout).
    * ``anima``: Qwen2TokenizerFast (Qwen3-0.6B-Base conventions) + Qwen3Model; ``t5_tokenizer``
      T5TokenizerFast (t5-v1_1 conventions) with no encoder: Anima's T5 ids go to the DiT's LLM adapter.
    """
    if family in ("sd15", "sd21"):
        pad, variant = ("<|endoftext|>", "L") if family == "sd15" else ("!", "H")
        return {
            "tokenizer": tok.clip_tokenizer(pad=pad, cache_dir=cache_dir),
            "text_encoder": clip_text_model(variant),
        }
    if family == "sdxl":
        return {
            "tokenizer": tok.clip_tokenizer(pad="<|endoftext|>", cache_dir=cache_dir),
            "text_encoder": clip_text_model("L"),
            "tokenizer_2": tok.clip_tokenizer(pad="!", cache_dir=cache_dir),
            "text_encoder_2": clip_text_model_with_projection("G"),
        }
    if family == "sd3":
        t5_tok, t5 = _t5_pair(cache_dir)
        return {
            "tokenizer": tok.clip_tokenizer(pad="<|endoftext|>", cache_dir=cache_dir),
            "text_encoder": clip_text_model_with_projection("L"),
            "tokenizer_2": tok.clip_tokenizer(pad="!", cache_dir=cache_dir),
            "text_encoder_2": clip_text_model_with_projection("G"),
            "tokenizer_3": t5_tok,
            "text_encoder_3": t5,
        }
    if family in ("flux", "flux-kontext"):
        t5_tok, t5 = _t5_pair(cache_dir)
        return {
            "tokenizer": tok.clip_tokenizer(pad="<|endoftext|>", cache_dir=cache_dir),
            "text_encoder": clip_text_model("L"),
            "tokenizer_2": t5_tok,
            "text_encoder_2": t5,
        }
    if family in ("chroma", "pixart-sigma"):
        t5_tok, t5 = _t5_pair(cache_dir)
        return {"tokenizer": t5_tok, "text_encoder": t5}
    if family == "auraflow":
        pile = tok.pile_t5_tokenizer(cache_dir=cache_dir)
        return {"tokenizer": pile, "text_encoder": umt5_encoder_model(_round_up(len(pile)), eos_token_id=2)}
    if family in ("lumina2", "sana"):
        gemma_tok = tok.gemma_tokenizer(
            padding_side="left" if family == "lumina2" else "right", cache_dir=cache_dir
        )
        return {"tokenizer": gemma_tok, "text_encoder": gemma2_model(len(gemma_tok))}
    if family == "hidream":
        t5_tok, t5 = _t5_pair(cache_dir)
        llama_tok = tok.llama3_tokenizer(cache_dir=cache_dir)
        eos_ids = [
            llama_tok.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
        ]
        return {
            "tokenizer": tok.clip_tokenizer(pad="<|endoftext|>", model_max_length=128, cache_dir=cache_dir),
            "text_encoder": clip_text_model_with_projection("L", max_position_embeddings=128),
            "tokenizer_2": tok.clip_tokenizer(pad="!", model_max_length=128, cache_dir=cache_dir),
            "text_encoder_2": clip_text_model_with_projection("G", max_position_embeddings=128),
            "tokenizer_3": t5_tok,
            "text_encoder_3": t5,
            "tokenizer_4": llama_tok,
            "text_encoder_4": llama_for_causal_lm(len(llama_tok), llama_tok.bos_token_id, eos_ids),
        }
    if family == "qwen-image":
        qwen_tok = tok.qwen2_tokenizer(cache_dir=cache_dir)
        return {"tokenizer": qwen_tok, "text_encoder": qwen2_5_vl_model(qwen_tok)}
    if family in ("qwen-image-edit", "qwen-image-edit-plus"):
        qwen_tok = tok.qwen2_tokenizer(cache_dir=cache_dir)
        return {"tokenizer": qwen_tok, "text_encoder": qwen2_5_vl_model(qwen_tok), "processor": qwen2_vl_processor(qwen_tok)}
    if family == "hunyuanimage":
        qwen_tok = tok.qwen2_tokenizer(cache_dir=cache_dir)
        byt5_tok = transformers.ByT5Tokenizer()
        return {
            "tokenizer": qwen_tok,
            "text_encoder": qwen2_5_vl_model(qwen_tok, num_hidden_layers=4),
            "tokenizer_2": byt5_tok,
            "text_encoder_2": byt5_encoder_model(len(byt5_tok)),
        }
    if family == "anima":
        qwen_tok = tok.qwen3_tokenizer(cache_dir=cache_dir)
        return {
            "tokenizer": qwen_tok,
            "text_encoder": qwen3_model(qwen_tok),
            "t5_tokenizer": tok.t5_tokenizer(cache_dir=cache_dir),
        }
    if family == "flux2":
        mistral_tok = tok.mistral_tekken_tokenizer(cache_dir=cache_dir)
        return {"tokenizer": mistral_tok, "text_encoder": mistral3_text_encoder(mistral_tok)}
    if family in ("flux2-klein", "z-image"):
        qwen_tok = tok.qwen3_instruct_tokenizer(cache_dir=cache_dir)
        cls = "Qwen3ForCausalLM" if family == "flux2-klein" else "Qwen3Model"
        return {"tokenizer": qwen_tok, "text_encoder": qwen3_text_encoder(qwen_tok, cls)}
    if family == "wan21":
        umt5_tok = tok.umt5_tokenizer(cache_dir=cache_dir)
        return {
            "tokenizer": umt5_tok,
            "text_encoder": umt5_encoder_model(_round_up(len(umt5_tok)), eos_token_id=1),
        }
    if family == "krea2":
        qwen_tok = tok.qwen2_tokenizer(cache_dir=cache_dir)
        return {"tokenizer": qwen_tok, "text_encoder": qwen3_vl_model(qwen_tok)}
    if family == "ideogram4":
        qwen_tok = tok.qwen3_vl_tokenizer(cache_dir=cache_dir)
        return {"tokenizer": qwen_tok, "text_encoder": qwen3_vl_model(qwen_tok)}
    if family == "ltx2":
        gemma_tok = tok.gemma_tokenizer(padding_side="left", cache_dir=cache_dir)
        return {"tokenizer": gemma_tok, "text_encoder": gemma3_model(gemma_tok)}
    raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
