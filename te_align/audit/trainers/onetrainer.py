"""Nerogar/OneTrainer config JSON (TrainConfig).

Facts read at Nerogar/OneTrainer@23df3832e8f213d64c337e39f9365ba46e99fed0; ``source`` gives file:line at that
commit. BaseConfig.from_dict reads known keys only and ignores the rest silently.
"""

from __future__ import annotations

import json
from typing import Any

from te_align.audit.readers import RawConfig, UnreadableConfig, key_line, known_keys
from te_align.audit.rules import Rule, Trainer, guess_from_name
from te_align.audit.trainers import CacheSpec, Parsed, unknown_key_finding

_MM = "modules/model"

RULES: tuple[Rule, ...] = (
    Rule("clip_l.encoder.layer", ("sd1",), "text_encoder_layer_skip", 0,
         "hidden_states[-1 - layer_skip] + final LN (layer_skip = diffusers clip_skip)",
         f"{_MM}/StableDiffusionModel.py:254-262; modules/util/config/TrainConfig.py:1151", convert="ot_skip_last"),
    Rule("clip_h.encoder.layer", ("sd2",), "text_encoder_layer_skip", 0,
         "hidden_states[-1 - layer_skip] + final LN (layer_skip = diffusers clip_skip)",
         f"{_MM}/StableDiffusionModel.py:254-262; modules/util/config/TrainConfig.py:1151", convert="ot_skip_last"),
    Rule("clip_l.encoder.layer", ("sdxl", "sd3"), "text_encoder_layer_skip", 0,
         "hidden_states[-2 - layer_skip], no final LN",
         f"{_MM}/StableDiffusionXLModel.py:261-282; {_MM}/StableDiffusion3Model.py:307-344", convert="ot_skip_penultimate"),
    Rule("clip_g.encoder.layer", ("sdxl", "sd3"), "text_encoder_2_layer_skip", 0,
         "hidden_states[-2 - layer_skip], no final LN",
         f"{_MM}/StableDiffusionXLModel.py:261-282; {_MM}/StableDiffusion3Model.py:307-344", convert="ot_skip_penultimate"),
    Rule("t5.tokenizer.max_length", ("sd3",), None, 77,
         "all three SD3 tokenizers, T5 included, use max_length=77 (hard-coded)",
         f"{_MM}/StableDiffusion3Model.py:279,290,301; modules/dataLoader/StableDiffusion3BaseDataLoader.py:35,47-49"),
    Rule("t5.masks.zero_padded", ("sd3", "flux", "hidream"), "transformer.attention_mask", False,
         "transformer.attention_mask only zeroes padded T5 outputs (no mask reaches the transformer)",
         f"{_MM}/StableDiffusion3Model.py:385-388; {_MM}/FluxModel.py:301-302; "
         "modules/modelSetup/BaseFluxSetup.py:200; modules/util/config/TrainConfig.py:308", convert="bool"),
    Rule("t5.tokenizer.max_length", ("flux",), "text_encoder_2_sequence_length", 77,
         "FLUX T5 length: default 77 (null = the tokenizer's 512)",
         f"{_MM}/FluxModel.py:253; modules/util/config/TrainConfig.py:1162", convert="ot_nullable_len"),
    Rule("t5.masks.encoder", ("hidream",), None, False, "HiDream T5 runs without the attention mask",
         f"{_MM}/HiDreamModel.py:344-352"),
    Rule("t5.tokenizer.max_length", ("hidream",), None, 128, "128 tokens for all four encoders",
         f"{_MM}/HiDreamModel.py:276,286,296,307"),
    Rule("qwen.tokenizer.max_length", ("qwen-image",), None, 512, "max_length 512 + 34 template tokens, cropped",
         f"{_MM}/QwenModel.py:109-136"),
)

SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "hidream", "qwen-image", "pixart", "sana")

_CACHE = CacheSpec(("text/**/*.pt",), "folder = sha256 of the concept settings; no length, layer skip or mask",
                   "modules/dataLoader/mixin/DataLoaderText2ImageMixin.py:335-352",
                   '"clear_cache_before_training": true (with "latent_caching": true) or delete <cache_dir>/text')
CACHES = {f: _CACHE for f in SUPPORTED}

_TYPES = (
    ("STABLE_DIFFUSION_15", "sd15"), ("STABLE_DIFFUSION_2", "sd21"), ("STABLE_DIFFUSION_35", "sd35-large"),
    ("STABLE_DIFFUSION_3", "sd3-medium"), ("STABLE_DIFFUSION_XL", "sdxl"), ("FLUX_DEV", "flux-dev"),
    ("FLUX_FILL_DEV", "flux-dev"), ("CHROMA", "chroma"), ("HI_DREAM", "hidream"), ("QWEN", "qwen-image"),
    ("PIXART_SIGMA", "pixart-sigma"), ("SANA", "sana"),
)
_PARTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4", "transformer", "unet", "prior",
          "decoder", "vae", "effnet_encoder", "decoder_text_encoder", "decoder_vqgan", "unconditional_transformer")


def guess_profile(values: dict[str, Any]) -> tuple[str | None, str]:
    mt = str(values.get("model_type") or "STABLE_DIFFUSION_15")
    path = values.get("base_model_name")
    for prefix, prof in _TYPES:
        if mt.startswith(prefix):
            by = guess_from_name(path)
            if by and by != prof and _same_family(by, prof):
                return by, f"model_type {mt!r} and base_model_name {path!r}"
            return prof, f"model_type {mt!r}"
    return None, f"model_type {mt!r}"


def _same_family(a: str, b: str) -> bool:
    from te_align.audit.rules import family_of

    return family_of(a) == family_of(b)


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    if not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a JSON object", file=raw.file)
    valid = known_keys("onetrainer")
    values: dict[str, Any] = {}
    findings = []
    for k, v in raw.data.items():
        values[k] = v
        if k not in valid["top"]:
            findings.append(unknown_key_finding(
                k, valid["top"], trainer="OneTrainer: modules/util/config/BaseConfig.py:66", line=key_line(raw.text, k),
                behaviour="OneTrainer reads known keys only and ignores this one silently"))
        elif k in _PARTS and isinstance(v, dict):
            for pk, pv in v.items():
                values[f"{k}.{pk}"] = pv
                if pk not in valid["part"]:
                    findings.append(unknown_key_finding(
                        pk, valid["part"], trainer="OneTrainer: modules/util/config/TrainConfig.py:295",
                        line=key_line(raw.text, pk), section=k,
                        behaviour="OneTrainer reads known keys only and ignores this one silently"))
    prof, reason = guess_profile(values)
    te_trained = any(_on(values.get(f"{p}.train", p != "transformer")) for p in ("text_encoder", "text_encoder_2"))
    cleared = _on(values.get("clear_cache_before_training", True)) and _on(values.get("latent_caching", True))
    # Text is cached only when no text encoder is trained; the cache is cleared at start by default
    # (modules/trainer/GenericTrainer.py:92-93 clears only when latent_caching is on as well).
    cached = not te_trained and not cleared

    def fix_set(key: str, value: Any) -> str:
        if "." in key:
            part, sub = key.split(".", 1)
            return f'"{part}": {{"{sub}": {json.dumps(value)}}}'
        return f'"{key}": {json.dumps(value)}'

    def fix_remove(key: str) -> str:
        return fix_set(key, False) if key.endswith("attention_mask") else f"remove \"{key}\""

    trainer = Trainer("onetrainer", RULES, fix_set, fix_remove, lambda key: key_line(raw.text, key.rsplit(".", 1)[-1]))
    return Parsed(trainer, values, prof, reason, cached, None, findings, SUPPORTED)


def _on(v: Any) -> bool:
    return bool(v) and v not in ("false", "False", "0")
