"""The klein-shaped world base's parts: FLUX.2 [klein]'s recipe at tiny size (issue 49).

``Flux2KleinPipeline`` (diffusers >= 0.37) around

* a decoder-only **Qwen3 text encoder** (``transformers.Qwen3ForCausalLM``, the pipeline's type hint) of
  :data:`KLEIN_TEXT_LAYERS` layers, width 32, with the real-convention Qwen3 instruct tokenizer of
  :func:`te_align.tiny.tokenizers.qwen3_instruct_tokenizer` (its real chat template renders ``enable_thinking``
  as the real one does);
* a tiny ``Flux2Transformer2DModel`` reading the three stacked taps (``joint_attention_dim`` = 3 x 32), as the
  pipeline builds them (``hidden_states[9]``, ``[18]``, ``[27]`` side by side per token);
* an ``AutoencoderKLFlux2`` carrying the shared world autoencoder's weights (the same diffusers Encoder/Decoder; the
  class adds a non-affine BatchNorm over the 2 x 2 patchified latents whose running statistics the pipeline uses to
  normalise latents, :func:`set_latent_statistics`);
* ``FlowMatchEulerDiscreteScheduler`` with shift 1 and no dynamic shifting, as the flux and chroma bases (the ``mu``
  the pipeline always computes is then ignored).

**Depth.** The pipeline taps ``hidden_states[9, 18, 27]``; diffusers' klein training script defaults to
``[10, 20, 30]`` (diffusers #13445). ``hidden_states`` of an L-layer transformers Qwen3 has L + 1 entries and its
last one, ``hidden_states[L]``, is the output *after* the final RMSNorm (it equals ``last_hidden_state``;
``benchmarks/klein/bench_klein_steps.py`` checks it). In the real 36-layer Qwen3-4B/8B all six taps are raw residual
states of inner layers. The smallest depth that keeps that true for tap 30 is **31 layers** (32 hidden states): with
30 layers, tap 30 would be the final-normed output, a different kind of tensor from the raw states the official taps
are, which would make the deviation trivially different. No tap is remapped: the profile's ``layer`` list is used as
it is, so the official and deviating taps are the real indices.

Nothing here is trained: these are the parts' shapes and random initial weights (deterministic, the caller's RNG
untouched). The world base built from them is pretrained by the plan in ``benchmarks/klein/bench_klein.md``.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from te_align.tiny import tokenizers as tok
from te_align.tiny._seed import finish, seed_for, seeded

__all__ = [
    "KLEIN_PROFILE",
    "KLEIN_TEXT",
    "KLEIN_TEXT_LAYERS",
    "KLEIN_TRANSFORMER",
    "build_klein_pipeline",
    "klein_profile",
    "klein_scheduler",
    "klein_text_encoder",
    "klein_transformer",
    "klein_vae",
    "set_latent_statistics",
]

#: The bundled profile the klein base follows (4B: Qwen3-4B's tied embeddings; the 9B profile differs only in width).
KLEIN_PROFILE = "flux2-klein-4b"

#: 31 layers: the smallest depth where taps 9, 18, 27 and 10, 20, 30 are all raw inner-layer states (module doc).
KLEIN_TEXT_LAYERS = 31

#: The tiny Qwen3 text encoder (real Qwen3-4B in the comments, kohya-ss/musubi-tuner@30c658c
#: src/musubi_tuner/zimage/zimage_utils.py:37-67): width 32 (2560), feed-forward 64 (9728), 2 heads (32) of 16 (128)
#: with 1 KV head (8: grouped-query attention kept), QK-norm (the class's), rope theta 1e6, RMSNorm eps 1e-6, tied
#: embeddings (4B), max positions 40960.
KLEIN_TEXT: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}

#: The tiny Flux2Transformer2DModel: the flux base's 2 double- + 2 single-stream blocks of width 64 (2 heads of 32),
#: 32 input channels (the shared autoencoder's 8 latent channels patchified 2 x 2, as klein's 32 x 4 = 128), text
#: width 3 x 32 (the three stacked taps), 4-axis RoPE (t, h, w, l) of 8 each (sum = head width), no guidance
#: embedding (klein is guided by true CFG, or not at all when distilled).
KLEIN_TRANSFORMER: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 32,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": 32,
    "num_attention_heads": 2,
    "joint_attention_dim": 3 * KLEIN_TEXT["hidden_size"],
    "timestep_guidance_channels": 64,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (8, 8, 8, 8),
    "guidance_embeds": False,
}


def _round_up(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def _token_id(tokenizer: Any, token: str) -> int:
    return int(tokenizer.convert_tokens_to_ids(token))


def klein_text_encoder(
    tokenizer: transformers.PreTrainedTokenizerBase | None = None, *, num_hidden_layers: int = KLEIN_TEXT_LAYERS,
    seed: int | None = None,
) -> transformers.Qwen3ForCausalLM:
    """The tiny ``Qwen3ForCausalLM`` of :data:`KLEIN_TEXT` (random, float32, eval): vocabulary ``len(tokenizer)``
    rounded up to 64, bos ``<|endoftext|>`` and eos ``<|im_end|>`` as the real config."""
    tokenizer = tok.qwen3_instruct_tokenizer() if tokenizer is None else tokenizer
    config = transformers.Qwen3Config(
        vocab_size=_round_up(len(tokenizer)),
        num_hidden_layers=num_hidden_layers,
        bos_token_id=_token_id(tokenizer, "<|endoftext|>"),
        eos_token_id=_token_id(tokenizer, "<|im_end|>"),
        **KLEIN_TEXT,
    )
    seed = seed_for(f"klein-qwen3-{len(tokenizer)}-{num_hidden_layers}l") if seed is None else seed
    with seeded(seed):
        return finish(transformers.Qwen3ForCausalLM(config))


def klein_transformer(seed: int | None = None, **changes: Any) -> Any:
    """The tiny ``Flux2Transformer2DModel`` of :data:`KLEIN_TRANSFORMER` (``changes`` replace entries)."""
    import diffusers

    config = {**KLEIN_TRANSFORMER, **changes}
    with seeded(seed_for("klein-transformer") if seed is None else seed):
        model: Any = diffusers.Flux2Transformer2DModel(**config)
    return finish(model)


def klein_vae(vae: Any = None, latent_channels: int = 8) -> Any:
    """An ``AutoencoderKLFlux2`` with the weights of ``vae`` (an ``AutoencoderKL`` without quant convs, e.g. the
    shared world autoencoder) or, without one, random weights of the world autoencoder's shape ((16, 32), 8 latent
    channels). Its BatchNorm's running statistics start at mean 0, variance 1; :func:`set_latent_statistics` sets them."""
    import diffusers

    if vae is not None:
        cfg = dict(vae.config)
        latent_channels = cfg["latent_channels"]
        kw = {k: cfg[k] for k in ("in_channels", "out_channels", "down_block_types", "up_block_types",
                                  "block_out_channels", "layers_per_block", "act_fn", "norm_num_groups",
                                  "sample_size", "use_quant_conv", "use_post_quant_conv", "mid_block_add_attention")
              if k in cfg}  # fmt: skip
    else:
        kw = {"down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
              "block_out_channels": [16, 32], "layers_per_block": 1, "norm_num_groups": 8, "sample_size": 32,
              "use_quant_conv": False, "use_post_quant_conv": False}  # fmt: skip
    with seeded(seed_for("klein-vae")):
        out: Any = diffusers.AutoencoderKLFlux2(latent_channels=latent_channels, **kw)
    if vae is not None:
        missing, unexpected = out.load_state_dict(vae.state_dict(), strict=False)
        bn = {k for k in missing if k.startswith("bn.")}
        if set(missing) - bn or unexpected:
            raise ValueError(f"klein_vae: the autoencoder does not fit (missing {sorted(set(missing) - bn)}, "
                             f"unexpected {sorted(unexpected)})")  # fmt: skip
    return finish(out)


def set_latent_statistics(vae: Any, images: torch.Tensor) -> None:
    """Set ``vae.bn``'s running mean and variance to the per-channel statistics of the patchified posterior means
    of ``images`` (N, 3, H, W in [-1, 1]), which is what ``Flux2KleinPipeline`` normalises latents with (as a real
    VAE's BatchNorm tracks its training latents)."""
    import diffusers

    with torch.no_grad():
        latents = vae.encode(images).latent_dist.mode()
        patched = diffusers.Flux2KleinPipeline._patchify_latents(latents)
        vae.bn.running_mean.copy_(patched.mean(dim=(0, 2, 3)))
        vae.bn.running_var.copy_(patched.var(dim=(0, 2, 3), unbiased=False))


def klein_scheduler() -> Any:
    """Flow-matching Euler, shift 1, no dynamic shifting (the flux and chroma bases' sampling schedule)."""
    import diffusers

    return diffusers.FlowMatchEulerDiscreteScheduler(shift=1.0)


def build_klein_pipeline(
    text_encoder: Any = None, transformer: Any = None, vae: Any = None, tokenizer: Any = None
) -> Any:
    """The real ``Flux2KleinPipeline`` (``is_distilled=False``: true CFG against the encoded empty prompt) with
    the given or fresh tiny parts."""
    import diffusers

    tokenizer = tok.qwen3_instruct_tokenizer() if tokenizer is None else tokenizer
    pipe: Any = diffusers.Flux2KleinPipeline(
        scheduler=klein_scheduler(),
        vae=klein_vae() if vae is None else vae,
        text_encoder=klein_text_encoder(tokenizer) if text_encoder is None else text_encoder,
        tokenizer=tokenizer,
        transformer=klein_transformer() if transformer is None else transformer,
        is_distilled=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def klein_profile(pipe: Any, **overrides: Any) -> Any:
    """:data:`KLEIN_PROFILE` fitted to ``pipe``'s tiny text encoder (width, depth, vocabulary, token ids), with
    ``overrides`` (dotted path -> value, e.g. the world's window ``{"qwen3.max_length": 512}``)."""
    from te_align.profiles import profile
    from te_align.tiny.fit import fit_profile

    return fit_profile(profile(KLEIN_PROFILE), pipe, **overrides)
