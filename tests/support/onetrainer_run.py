"""A tiny real OneTrainer training run on CPU: model folder, captioned images and a LoRA config.

Run in the OneTrainer environment (``tools/onetrainer_env.sh``), with this repository on ``PYTHONPATH``::

    python -m tests.support.onetrainer_run build DIR FAMILY  # DIR/model, data, config.json, overrides.json, family,
                                                             # reference.safetensors (encode DIR DIR/reference...)
    python -m tests.support.onetrainer_run encode DIR OUT     # te_align.encode of every caption -> OUT (safetensors)

FAMILY is ``sd15``, ``sd3`` or ``flux`` (:data:`RUNS`). The model is :func:`te_align.tiny.pipelines.build_pipeline` (tiny
denoiser, VAE and text encoders with the real CLIP BPE tokenizer). ``overrides.json`` fits the bundled profile to
the tiny text encoders (their architecture numbers: :func:`te_align.tiny.fit.architecture_overrides`) plus the
run's ``extra`` overrides. The config keys are OneTrainer's (``modules/util/config/TrainConfig.py`` at 23df383).

``encode`` writes, per caption ``i``, the tensors OneTrainer's text cache entry holds for it, taken from
``te_align.encode``'s outputs (``i/<cache key>``; the layout is :func:`expected`), and each slot's tokens (and
mask, where OneTrainer caches one) from te-align's tokenization.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Captions, one image each (distinct, so that a cached entry is found by its tokens).
CAPTIONS = ("a red square on a white background", "a blue circle, highly detailed",
            "a green triangle in the corner", "two yellow dots")  # fmt: skip
SAMPLE_PROMPT = "a red square"
#: Written by ``build`` next to the model: :func:`encode`'s output.
REFERENCE = "reference.safetensors"
RESOLUTION = 32


@dataclass(frozen=True)
class Run:
    """One family's tiny run: OneTrainer's model type, te-align's profile (the one OneTrainer's hooks pick for
    that model type), the tiny pipeline, the trained part and the cache keys of each text encoder."""

    model_type: str
    profile: str
    pipeline: str
    denoiser: str
    #: profile slot -> OneTrainer's keys in a cached text entry: (tokens, tokens mask, hidden state, pooled
    #: output; each but the tokens None where OneTrainer caches none)
    cache_keys: dict[str, tuple[str, str | None, str | None, str | None]]
    extra: dict[str, Any] = field(default_factory=dict)
    #: a sample image after each step (OneTrainer's FLUX sampler assumes the real VAE's 8x downscaling and
    #: 16 latent channels, which the tiny VAE does not have)
    samples: bool = True


RUNS: dict[str, Run] = {
    # Penultimate CLIP layer (OneTrainer's default for SD 1.5 is the last): a profile choice OneTrainer's own
    # encoder does not make, so the hooked cache must differ from the unhooked one.
    "sd15": Run("STABLE_DIFFUSION_15", "sd15", "sd15", "unet",
                {"clip_l": ("tokens", None, "text_encoder_hidden_state", None)},
                {"slots.clip_l.encoder.layer": "penultimate"}),
    # SD3: OneTrainer tokenizes T5 at a hard-coded 77; the profile (StableDiffusion3Pipeline) at 256.
    "sd3": Run("STABLE_DIFFUSION_3", "sd3-medium", "sd3", "transformer",
               {"clip_l": ("tokens_1", "tokens_mask_1", "text_encoder_1_hidden_state", "text_encoder_1_pooled_state"),
                "clip_g": ("tokens_2", "tokens_mask_2", "text_encoder_2_hidden_state", "text_encoder_2_pooled_state"),
                "t5": ("tokens_3", "tokens_mask_3", "text_encoder_3_hidden_state", None)}),
    # FLUX.1-dev: OneTrainer tokenizes T5 at text_encoder_2_sequence_length (default 77); the profile at 512.
    "flux": Run("FLUX_DEV_1", "flux-dev", "flux", "transformer",
                {"clip_l": ("tokens_1", "tokens_mask_1", None, "text_encoder_1_pooled_state"),
                 "t5": ("tokens_2", "tokens_mask_2", "text_encoder_2_hidden_state", None)}, samples=False),
}  # fmt: skip


def overrides(family: str) -> dict[str, Any]:
    """Profile overrides: the tiny encoders' architecture and the run's extra choices."""
    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import architecture_overrides

    run = RUNS[family]
    comps = family_components(run.pipeline)
    return {**architecture_overrides(te_align.profile(run.profile), comps), **run.extra}


def config(root: Path, family: str) -> dict[str, Any]:
    """OneTrainer's TrainConfig (as JSON) for the tiny run: CPU, float32, LoRA on the denoiser, every text encoder
    frozen (so text is cached), a sample image after each step (where the run has samples)."""
    run = RUNS[family]
    part = {"weight_dtype": "FLOAT_32"}
    encoders = {name: {**part, "train": False} for name in ("text_encoder", "text_encoder_2", "text_encoder_3")[
        : len(run.cache_keys)]}  # fmt: skip
    return {
        "__version": 10,
        "training_method": "LORA", "model_type": run.model_type,
        "base_model_name": str(root / "model"), "output_model_destination": str(root / "out" / "lora.safetensors"),
        "output_model_format": "SAFETENSORS", "output_dtype": "FLOAT_32",
        "workspace_dir": str(root / "workspace"), "cache_dir": str(root / "cache"),
        "train_device": "cpu", "temp_device": "cpu", "train_dtype": "FLOAT_32", "fallback_train_dtype": "FLOAT_32",
        "resolution": str(RESOLUTION), "aspect_ratio_bucketing": False, "latent_caching": True,
        "clear_cache_before_training": False, "dataloader_threads": 1, "tensorboard": False,
        "epochs": 1, "batch_size": 2, "learning_rate": 1e-3, "learning_rate_warmup_steps": 0.0,
        "lora_rank": 2, "lora_alpha": 1.0, "layer_filter_preset": "full",
        run.denoiser: {**part, "train": True, "gradient_checkpointing": False},
        **encoders,
        "vae": part,
        "optimizer": {"optimizer": "ADAMW"},
        "concepts": [{"name": "tiny", "path": str(root / "data"), "seed": 1,
                      "image": {"enable_crop_jitter": False},
                      "text": {"prompt_source": "sample"}}],
        # one sample after every step: OneTrainer's sampler encodes its prompt through encode_text (text=...)
        "samples": [{"prompt": SAMPLE_PROMPT, "negative_prompt": "", "height": RESOLUTION, "width": RESOLUTION,
                     "diffusion_steps": 2, "cfg_scale": 2.0, "seed": 1}] if run.samples else [],
        "sample_after": 1, "sample_after_unit": "STEP", "backup_after_unit": "NEVER", "backup_before_save": False,
        "save_every_unit": "NEVER",
    }  # fmt: skip


def build(root: Path, family: str) -> None:
    import numpy
    from PIL import Image

    from te_align.tiny.pipelines import build_model_folder

    root.mkdir(parents=True, exist_ok=True)
    build_model_folder(RUNS[family].pipeline, root / "model")
    data = root / "data"
    data.mkdir(exist_ok=True)
    rng = numpy.random.default_rng(0)
    for i, caption in enumerate(CAPTIONS):
        pixels = rng.integers(0, 256, size=(RESOLUTION, RESOLUTION, 3), dtype=numpy.uint8)
        Image.fromarray(pixels).save(data / f"{i}.png")
        (data / f"{i}.txt").write_text(caption, encoding="utf-8")
    (root / "config.json").write_text(json.dumps(config(root, family), indent=2), encoding="utf-8")
    (root / "overrides.json").write_text(json.dumps(overrides(family), sort_keys=True), encoding="utf-8")
    (root / "family").write_text(family, encoding="utf-8")
    encode(root, root / REFERENCE)


def expected(family: str, prof: Any, out: Any, encoders: dict[str, Any]) -> dict[str, Any]:
    """One caption's cached text entry as te_align.encode's outputs give it (batch of one, batch dim dropped).

    SD 1.5: ``prompt_embeds`` is CLIP-L's hidden state. FLUX.1: ``prompt_embeds`` is T5's hidden state,
    ``pooled_prompt_embeds`` CLIP-L's pooled output. SD3 (``StableDiffusion3Pipeline``'s layout):
    ``prompt_embeds`` = [CLIP-L | CLIP-G hidden states side by side, zero-padded to T5's width ; T5's hidden
    states] along the tokens, ``pooled_prompt_embeds`` = [CLIP-L pooled | CLIP-G pooled].
    """
    pe = out["prompt_embeds"][0]
    run = RUNS[family]
    if family == "sd15":
        return {run.cache_keys["clip_l"][2]: pe}
    if family == "flux":
        return {run.cache_keys["t5"][2]: pe, run.cache_keys["clip_l"][3]: out["pooled_prompt_embeds"][0]}
    n_clip = prof.slot("clip_l").tokenizer.max_length
    w_l, w_g = (encoders[prof.slot(s).encoder_subfolder].config.hidden_size for s in ("clip_l", "clip_g"))
    p_l = encoders[prof.slot("clip_l").encoder_subfolder].config.projection_dim
    pooled = out["pooled_prompt_embeds"][0]
    keys = run.cache_keys
    return {keys["clip_l"][2]: pe[:n_clip, :w_l], keys["clip_g"][2]: pe[:n_clip, w_l:w_l + w_g],
            keys["t5"][2]: pe[n_clip:], keys["clip_l"][3]: pooled[:p_l], keys["clip_g"][3]: pooled[p_l:]}  # fmt: skip


def encode(root: Path, out: Path) -> None:
    """``te_align.encode`` of each caption alone (as OneTrainer caches it) by the fitted profile, with the model's
    own tokenizers and text encoders as OneTrainer loads them (float32): the expected cache entries, each slot's
    tokens and the profile's fingerprint."""
    import torch
    import transformers
    from safetensors.torch import save_file

    import te_align
    from te_align.encoding.core import tokenize_slot

    family = (root / "family").read_text(encoding="utf-8").strip()
    run = RUNS[family]
    prof = te_align.profile(run.profile, **json.loads((root / "overrides.json").read_text(encoding="utf-8")))
    index = json.loads((root / "model" / "model_index.json").read_text(encoding="utf-8"))
    toks, encs = {}, {}
    for slot in prof.slots:
        tok_cls, enc_cls = index[slot.tokenizer_subfolder][1], index[slot.encoder_subfolder][1]
        toks[slot.tokenizer_subfolder] = getattr(transformers, tok_cls).from_pretrained(
            str(root / "model"), subfolder=slot.tokenizer_subfolder)
        encs[slot.encoder_subfolder] = getattr(transformers, enc_cls).from_pretrained(
            str(root / "model"), subfolder=slot.encoder_subfolder, torch_dtype=torch.float32).eval()  # fmt: skip
    tensors = {}
    for i, caption in enumerate(CAPTIONS):
        with torch.no_grad():
            got = te_align.encode(prof, [caption], tokenizers=toks, text_encoders=encs)
        for key, value in expected(family, prof, got, encs).items():
            tensors[f"{i}/{key}"] = value.contiguous()
        for slot_name, (tokens_key, mask_key, _, _) in run.cache_keys.items():
            slot = prof.slot(slot_name)
            ids, mask = tokenize_slot(slot, toks[slot.tokenizer_subfolder], [caption])
            tensors[f"{i}/{tokens_key}"] = ids[0].contiguous()
            if mask_key is not None:
                tensors[f"{i}/{mask_key}"] = mask[0].contiguous()
    save_file(tensors, str(out), metadata={"fingerprint": prof.fingerprint(), "profile": prof.name, "family": family})


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "build" and sys.argv[3] in RUNS:
        build(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "encode":
        encode(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(f"usage: python -m tests.support.onetrainer_run build DIR {{{','.join(RUNS)}}} | encode DIR OUT")
