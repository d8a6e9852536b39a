"""bghira/SimpleTuner ``config.json`` / ``config.toml`` (keys with or without the leading ``--``).

Facts read at bghira/SimpleTuner@bc8e6ab7738ce457a2ed8eb2d26cadd91c6442cb (AGPL: facts only, no code;
``source`` gives file:line at that commit). Config keys become ``--KEY VALUE`` and argparse rejects unknown ones,
so an unknown key stops training (error). ``check_user_config`` rewrites ``tokenizer_max_length`` per model.
"""

from __future__ import annotations

import json
from typing import Any

from te_align.audit.readers import RawConfig, UnreadableConfig, key_line, known_keys
from te_align.audit.rules import Rule, Trainer, guess_from_name
from te_align.audit.trainers import CacheSpec, Parsed, unknown_key_finding

_M = "simpletuner/helpers/models"

RULES: tuple[Rule, ...] = (
    Rule("clip_l.encoder.layer", ("sd1",), None, "last", "StableDiffusionPipeline.encode_prompt without clip_skip",
         f"{_M}/sd1x/model.py:136"),
    Rule("clip_h.encoder.layer", ("sd2",), None, "last", "StableDiffusionPipeline.encode_prompt without clip_skip",
         f"{_M}/sd1x/model.py:136"),
    Rule(None, ("sd1", "sd2", "sdxl"), "tokenizer_max_length", None, "tokenizer_max_length is ignored (warning) for SD 1.x/2.x",
         f"{_M}/sd1x/model.py:315-316,387-388", honoured="never"),
    Rule("clip_l.encoder.layer", ("sdxl",), None, "penultimate", "hidden_states[-2], no final LN", f"{_M}/sdxl/model.py:168-238"),
    Rule("clip_g.encoder.layer", ("sdxl",), None, "penultimate", "hidden_states[-2], no final LN", f"{_M}/sdxl/model.py:168-238"),
    Rule("t5.tokenizer.max_length", ("sd3",), "tokenizer_max_length", None,
         "SD3 T5 length: unset = 154, and values above 154 are cut to 154 unless i_know_what_i_am_doing",
         f"{_M}/sd3/model.py:848-865", convert="st_sd3_len",
         fix='"{key}": {value}, "i_know_what_i_am_doing": true'),
    Rule("t5.masks.zero_padded", ("sd3", "flux", "chroma"), "t5_padding", "unmodified",
         't5_padding "zero" multiplies padded T5 outputs by 0',
         f"{_M}/sd3/model.py:440; {_M}/flux/model.py:516-517; "
         "simpletuner_sdk/server/services/field_registry/sections/advanced.py:640-656", convert="st_padding"),
    Rule("t5.tokenizer.max_length", ("flux",), None, None,
         "check_user_config forces 512, then 256 when model_flavour is schnell", f"{_M}/flux/model.py:1134-1149",
         convert="st_flux_len"),
    Rule(None, ("flux", "qwen-image", "wan"), "tokenizer_max_length", None,
         "tokenizer_max_length is ignored (FLUX: forced 512/256; Qwen-Image: never passed; Wan: never passed)",
         f"{_M}/flux/model.py:1134-1136; {_M}/qwen_image/model.py:507-549; {_M}/wan/model.py:1540-1542",
         honoured="never"),
    Rule("t5.masks.denoiser", ("flux",), "flux_attention_masked_training", False,
         "flux_attention_masked_training passes the T5 mask to the transformer",
         f"{_M}/field_registry/flux.py:102-117; {_M}/flux/model.py:813-822", convert="bool"),
    Rule("t5.tokenizer.max_length", ("chroma",), "tokenizer_max_length", 512, "Chroma T5 length (unset = 512)",
         f"{_M}/chroma/model.py:285-299"),
    Rule("gemma.tokenizer.max_length", ("lumina2",), "tokenizer_max_length", 256,
         "Lumina2 Gemma length (unset = 256, capped at 512)", f"{_M}/lumina2/model.py:330-339"),
    Rule("t5.tokenizer.max_length", ("hidream",), "tokenizer_max_length", 128, "HiDream length (unset = 128, capped at 128)",
         f"{_M}/hidream/model.py:833-845"),
    Rule("llama.tokenizer.max_length", ("hidream",), "tokenizer_max_length", 128, "HiDream length (unset = 128, capped at 128)",
         f"{_M}/hidream/model.py:833-845"),
    Rule("qwen.tokenizer.max_length", ("qwen-image",), None, 1024,
         "encode_prompt without max_sequence_length (diffusers encode_prompt default 1024)", f"{_M}/qwen_image/model.py:507-549"),
    Rule("t5.tokenizer.max_length", ("wan",), None, 512, "WanPipeline.encode_prompt default max_sequence_length=512",
         f"{_M}/wan/model.py:1377-1398"),
)

SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "lumina2", "hidream", "qwen-image", "wan", "pixart",
             "auraflow", "sana")

_CACHE = CacheSpec(("*.pt",), "file name = md5(caption) + model family; no length, padding, flavour or mask",
                   "simpletuner/helpers/caching/text_embeds.py:139-181,528-545",
                   "delete the text-embed cache folder (cache_dir_text / the text_embeds backend's cache_dir)")
CACHES = {f: _CACHE for f in SUPPORTED}

_FAMILY = {
    "sd1x": "sd15", "sd2x": "sd21", "sdxl": "sdxl", "sd3": "sd35-large", "flux": "flux-dev", "chroma": "chroma",
    "lumina2": "lumina2", "hidream": "hidream", "qwen_image": "qwen-image", "wan": "wan21",
    "pixart_sigma": "pixart-sigma", "auraflow": "auraflow", "sana": "sana",
}


def guess_profile(values: dict[str, Any]) -> tuple[str | None, str]:
    fam = str(values.get("model_family") or "")
    flavour = str(values.get("model_flavour") or "")
    path = values.get("pretrained_model_name_or_path")
    prof = _FAMILY.get(fam)
    if prof is None:
        return None, f"model_family {fam!r}"
    if fam == "flux":
        prof = "flux-schnell" if flavour == "schnell" else "flux-dev"
        return prof, f"model_family \"flux\", model_flavour {flavour or 'dev (default)'!r}"
    by = guess_from_name(flavour.replace("large", "3.5-large").replace("medium", "3.5-medium") if fam == "sd3" and flavour else None, path)
    if by and _same_family(by, prof):
        return by, f"model_family {fam!r} and " + (f"model_flavour {flavour!r}" if flavour else f"pretrained_model_name_or_path {path!r}")
    return prof, f"model_family {fam!r}"


def _same_family(a: str, b: str) -> bool:
    from te_align.audit.rules import family_of

    return family_of(a) == family_of(b)


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    if not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a JSON object / TOML table", file=raw.file)
    valid = known_keys("simpletuner")[""]
    values: dict[str, Any] = {}
    findings = []
    for k, v in raw.data.items():
        key = k.lstrip("-").replace("-", "_")
        values[key] = v
        if key not in valid:
            findings.append(unknown_key_finding(
                key, valid, trainer="SimpleTuner: helpers/configuration/json_file.py:61-95, cmd_args.py:546-557",
                line=key_line(raw.text, k), severity="error",
                behaviour="SimpleTuner turns it into --KEY and argparse stops with 'unrecognized arguments'",
            ))
    prof, reason = guess_profile(values)

    def fix_set(key: str, value: Any) -> str:
        return f"{key} = {json.dumps(value)}" if raw.fmt == "toml" else f'"{key}": {json.dumps(value)}'

    def fix_remove(key: str) -> str:
        return f"remove {key}"

    trainer = Trainer("simpletuner", RULES, fix_set, fix_remove, lambda key: key_line(raw.text, key))
    # SimpleTuner always encodes captions through its text-embed cache (TextEmbeddingCache).
    return Parsed(trainer, values, prof, reason, True, None, findings, SUPPORTED)
