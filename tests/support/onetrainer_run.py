"""A tiny real OneTrainer training run on CPU: SD 1.5 model folder, captioned images and a LoRA config.

Run in the OneTrainer environment (``tools/onetrainer_env.sh``), with this repository on ``PYTHONPATH``::

    python -m tests.support.onetrainer_run build DIR      # DIR/model, DIR/data, DIR/config.json, DIR/overrides.json
    python -m tests.support.onetrainer_run encode DIR OUT  # te_align.encode of every caption -> OUT (safetensors)

The model is :func:`te_align.tiny.pipelines.build_pipeline` ("sd15": tiny UNet, VAE and CLIP text encoder with the
real CLIP BPE tokenizer). ``overrides.json`` fits the bundled ``sd15`` profile to the tiny text encoder (its
architecture numbers: :func:`te_align.tiny.fit.architecture_overrides`) plus :data:`EXTRA`, a layer choice that
differs from what OneTrainer does by default, so that a cached embedding equal to ``te_align.encode`` shows
te-align encoded it. The config keys are OneTrainer's (``modules/util/config/TrainConfig.py`` at 23df383).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: Captions, one image each (distinct, so that a cached entry is found by its tokens).
CAPTIONS = ("a red square on a white background", "a blue circle, highly detailed",
            "a green triangle in the corner", "two yellow dots")  # fmt: skip
#: Penultimate CLIP layer (OneTrainer's default for SD 1.5 is the last): a profile choice OneTrainer's own
#: encoder does not make, so the hooked cache must differ from the unhooked one.
EXTRA: dict[str, Any] = {"slots.clip_l.encoder.layer": "penultimate"}
SAMPLE_PROMPT = "a red square"
RESOLUTION = 32


def overrides() -> dict[str, Any]:
    """Profile overrides: the tiny encoder's architecture and :data:`EXTRA`."""
    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import architecture_overrides

    return {**architecture_overrides(te_align.profile("sd15"), family_components("sd15")), **EXTRA}


def config(root: Path) -> dict[str, Any]:
    """OneTrainer's TrainConfig (as JSON) for the tiny run: CPU, float32, LoRA on the UNet, text cached, a sample
    image after each step."""
    part = {"weight_dtype": "FLOAT_32"}
    return {
        "__version": 10,
        "training_method": "LORA", "model_type": "STABLE_DIFFUSION_15",
        "base_model_name": str(root / "model"), "output_model_destination": str(root / "out" / "lora.safetensors"),
        "output_model_format": "SAFETENSORS", "output_dtype": "FLOAT_32",
        "workspace_dir": str(root / "workspace"), "cache_dir": str(root / "cache"),
        "train_device": "cpu", "temp_device": "cpu", "train_dtype": "FLOAT_32", "fallback_train_dtype": "FLOAT_32",
        "resolution": str(RESOLUTION), "aspect_ratio_bucketing": False, "latent_caching": True,
        "clear_cache_before_training": False, "dataloader_threads": 1, "tensorboard": False,
        "epochs": 1, "batch_size": 2, "learning_rate": 1e-3, "learning_rate_warmup_steps": 0.0,
        "lora_rank": 2, "lora_alpha": 1.0, "layer_filter_preset": "full",
        "unet": {**part, "train": True, "gradient_checkpointing": False},
        "text_encoder": {**part, "train": False},
        "vae": part,
        "optimizer": {"optimizer": "ADAMW"},
        "concepts": [{"name": "tiny", "path": str(root / "data"), "seed": 1,
                      "image": {"enable_crop_jitter": False},
                      "text": {"prompt_source": "sample"}}],
        # one sample after every step: OneTrainer's sampler encodes its prompt through encode_text (text=...)
        "samples": [{"prompt": SAMPLE_PROMPT, "negative_prompt": "", "height": RESOLUTION, "width": RESOLUTION,
                     "diffusion_steps": 2, "cfg_scale": 2.0, "seed": 1}],
        "sample_after": 1, "sample_after_unit": "STEP", "backup_after_unit": "NEVER", "backup_before_save": False,
        "save_every_unit": "NEVER",
    }  # fmt: skip


def build(root: Path) -> None:
    import numpy
    from PIL import Image

    from te_align.tiny.pipelines import build_model_folder

    root.mkdir(parents=True, exist_ok=True)
    build_model_folder("sd15", root / "model")
    data = root / "data"
    data.mkdir(exist_ok=True)
    rng = numpy.random.default_rng(0)
    for i, caption in enumerate(CAPTIONS):
        pixels = rng.integers(0, 256, size=(RESOLUTION, RESOLUTION, 3), dtype=numpy.uint8)
        Image.fromarray(pixels).save(data / f"{i}.png")
        (data / f"{i}.txt").write_text(caption, encoding="utf-8")
    (root / "config.json").write_text(json.dumps(config(root), indent=2), encoding="utf-8")
    (root / "overrides.json").write_text(json.dumps(overrides(), sort_keys=True), encoding="utf-8")


def encode(root: Path, out: Path) -> None:
    """``te_align.encode`` of each caption alone (as OneTrainer caches it) by the fitted profile, with the model's
    own tokenizer and text encoder as OneTrainer loads them (float32); also the tokens and the fingerprint."""
    import torch
    from safetensors.torch import save_file
    from transformers import CLIPTextModel, CLIPTokenizer

    import te_align
    from te_align.encoding.core import tokenize_slot

    prof = te_align.profile("sd15", **json.loads((root / "overrides.json").read_text(encoding="utf-8")))
    tok = CLIPTokenizer.from_pretrained(str(root / "model"), subfolder="tokenizer")
    enc = CLIPTextModel.from_pretrained(str(root / "model"), subfolder="text_encoder", torch_dtype=torch.float32).eval()
    tensors = {}
    for i, caption in enumerate(CAPTIONS):
        with torch.no_grad():
            got = te_align.encode(prof, [caption], tokenizers={"tokenizer": tok}, text_encoders={"text_encoder": enc})
        tensors[f"prompt_embeds_{i}"] = got["prompt_embeds"][0].contiguous()
        tensors[f"tokens_{i}"] = tokenize_slot(prof.slot("clip_l"), tok, [caption])[0][0].contiguous()
    save_file(tensors, str(out), metadata={"fingerprint": prof.fingerprint(), "profile": prof.name})


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "encode":
        encode(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit("usage: python -m tests.support.onetrainer_run build DIR | encode DIR OUT")
