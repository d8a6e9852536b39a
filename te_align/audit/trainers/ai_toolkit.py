"""ostris/ai-toolkit job YAML (``config.process[0]``).

Facts read at ostris/ai-toolkit@27a03a91f23eb1b757d5ec2e80ee3e129cfcc350; ``source`` gives file:line at that
commit. Config classes read known keys with ``kwargs.get`` and ignore the rest silently
(jobs/process/BaseSDTrainProcess.py:107-166). ai-toolkit has no key for any T5/LLM length, clip skip or
system prompt.
"""

from __future__ import annotations

import json
from typing import Any

from te_align.audit.readers import RawConfig, UnreadableConfig, key_line, known_keys
from te_align.audit.rules import Rule, Trainer, guess_from_name
from te_align.audit.trainers import CacheSpec, Parsed, unknown_key_finding
from te_align.trainers import ai_toolkit as aitk_table

_TT = "toolkit/train_tools.py"
_SDM = "toolkit/stable_diffusion_model.py"

RULES: tuple[Rule, ...] = (
    Rule("clip_l.encoder.layer", ("sd1",), None, "last", "text_encoder(tokens)[0]; no clip-skip setting in training",
         f"{_TT}:379-399"),
    Rule("clip_h.encoder.layer", ("sd2",), None, "last", "text_encoder(tokens)[0]; no clip-skip setting in training",
         f"{_TT}:379-399"),
    Rule("clip_l.encoder.layer", ("sdxl",), None, "penultimate", "hidden_states[-2] for both encoders ('always penultimate')",
         f"{_TT}:234-270"),
    Rule("clip_g.encoder.layer", ("sdxl",), None, "penultimate", "hidden_states[-2] for both encoders ('always penultimate')",
         f"{_TT}:234-270"),
    Rule(None, ("sdxl",), "model.use_text_encoder_1", True, "encode_prompt forces both text encoders on",
         f"{_SDM}:2412-2413", honoured="never"),
    Rule(None, ("sdxl",), "model.use_text_encoder_2", True, "encode_prompt forces both text encoders on",
         f"{_SDM}:2412-2413", honoured="never"),
    Rule("t5.tokenizer.max_length", ("sd3",), None, 256,
         "encode_prompts_sd3 calls the diffusers pipeline's _get_t5_prompt_embeds without max_sequence_length "
         "(pipeline default 256)", f"{_TT}:325-374"),
    Rule(None, ("sd3", "chroma", "hidream", "qwen-image", "wan"), "train.prompt_dropout_prob", 0.0,
         "prompt dropout is dropped for SD3 and for every BaseModel architecture",
         f"{_TT}:325-374; toolkit/models/base_model.py:1108-1131", honoured="never"),
    Rule("t5.tokenizer.max_length", ("flux",), None, 512,
         "encode_prompt hard-codes max_length=512 for FLUX.1 dev and schnell", f"{_SDM}:2468-2476"),
    Rule("t5.masks.zero_padded", ("flux",), "model.attn_masking", False,
         "attn_masking multiplies the padded T5 outputs by 0 (nothing goes into T5 or the transformer)",
         f"{_TT}:569-572; toolkit/config_modules.py:690-692", convert="bool"),
    Rule(None, ("sd1", "sd2", "sdxl", "sd3", "chroma", "lumina2", "hidream", "qwen-image", "wan", "pixart", "auraflow"),
         "model.attn_masking", False, "ai-toolkit refuses to start: attn_masking is only supported with flux",
         "toolkit/config_modules.py:690-692", convert="bool", honoured="never", severity="error"),
    Rule("t5.tokenizer.max_length", ("chroma",), None, 512, "T5 at 512, padding max_length",
         "extensions_built_in/diffusion_models/chroma/chroma_model.py:380-416"),
    Rule("t5.masks.encoder", ("chroma",), None, False, "T5 runs without the attention mask (diffusers passes it)",
         "extensions_built_in/diffusion_models/chroma/chroma_model.py:405"),
    Rule("t5.masks.denoiser", ("chroma",), None, True, "the tokenizer mask goes to the transformer as txt_mask",
         "extensions_built_in/diffusion_models/chroma/chroma_model.py:357-360,410-415"),
    Rule("gemma.tokenizer.max_length", ("lumina2",), None, 256,
         "Lumina2Pipeline.encode_prompt(max_sequence_length=256)", f"{_SDM}:2484-2501"),
    Rule("t5.tokenizer.max_length", ("hidream",), None, 128, "_encode_prompt(max_sequence_length=128)",
         "extensions_built_in/diffusion_models/hidream/hidream_model.py:389-405"),
    Rule("llama.tokenizer.max_length", ("hidream",), None, 128, "_encode_prompt(max_sequence_length=128)",
         "extensions_built_in/diffusion_models/hidream/hidream_model.py:389-405"),
    Rule("qwen.tokenizer.max_length", ("qwen-image",), None, 1024,
         "QwenImagePipeline.encode_prompt without max_sequence_length (encode_prompt default 1024)",
         "extensions_built_in/diffusion_models/qwen_image/qwen_image.py:371-387"),
    Rule("t5.tokenizer.max_length", ("wan",), None, 512, "pipeline.encode_prompt(max_sequence_length=512)",
         "toolkit/models/wan21/wan21.py:605-615"),
)

SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "lumina2", "hidream", "qwen-image", "wan", "pixart", "auraflow")

#: Keys people add expecting a text-encoder setting that ai-toolkit does not have.
MYTH_KEYS = {
    "t5_max_length": "ai-toolkit has no T5 length setting (the CivitAI SD3.5 advice does nothing)",
    "t5xxl_max_token_length": "that is an sd-scripts option; ai-toolkit has no T5 length setting",
    "max_sequence_length": "ai-toolkit has no T5/LLM length setting",
    "max_token_length": "ai-toolkit has no token-length setting",
    "tokenizer_max_length": "that is a SimpleTuner option; ai-toolkit has no token-length setting",
    "clip_skip": "ai-toolkit has no clip-skip setting in training",
    "system_prompt": "ai-toolkit has no system-prompt setting",
    "apply_t5_attn_mask": "that is an sd-scripts option; ai-toolkit's model.attn_masking only zeroes padded T5 outputs (FLUX only)",
}

_CACHE = CacheSpec(("_t_e_cache/*.safetensors", "*.safetensors"),
                   "file name = md5 of caption + arch + text_embedding_version; no encoder setting",
                   "toolkit/dataloader_mixins.py:2120-2163,2309-2310", "delete the _t_e_cache folders")
CACHES = {f: _CACHE for f in SUPPORTED}

_SECTIONS = ("model", "train", "network", "save", "sample", "logging")


def _process(data: Any, file: str) -> dict[str, Any]:
    cfg = data.get("config") if isinstance(data, dict) else None
    procs = cfg.get("process") if isinstance(cfg, dict) else None
    if not isinstance(procs, list) or not procs or not isinstance(procs[0], dict):
        raise UnreadableConfig("expected config.process[0] (an ai-toolkit job)", file=file)
    return procs[0]


def guess_profile(model: dict[str, Any]) -> tuple[str | None, str]:
    """The bundled profile a ``model:`` section trains (the trainer table's arch, refined by name_or_path)."""
    path = model.get("name_or_path")
    by_name = guess_from_name(path)
    arch = aitk_table.arch_name(model)
    if arch:
        prof = aitk_table.ARCHS[arch][0] if arch in aitk_table.ARCHS else None
        if prof is None:
            return None, f"model.arch {arch!r}"
        if by_name and _family(by_name) == _family(prof):
            return by_name, f"model.arch {arch!r} and model.name_or_path {path!r}"
        return prof, f"model.arch {arch!r}"
    flagged = aitk_table.flag_arch(model)
    if flagged is not None:
        flag = next(f for f, a in aitk_table.FLAGS if a == flagged)
        prof = aitk_table.ARCHS[flagged][0]
        if by_name and _family(by_name) == _family(prof):
            return by_name, f"model.{flag} and model.name_or_path {path!r}"
        return prof, f"model.{flag}"
    if by_name:
        return by_name, f"model.name_or_path {path!r}"
    return "sd15", "no model.arch or is_* flag (ai-toolkit defaults to sd1)"


def _family(prof: str) -> str:
    from te_align.audit.rules import family_of

    return family_of(prof)


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    proc = _process(raw.data, raw.file)
    valid = known_keys("ai-toolkit")
    findings = []
    values: dict[str, Any] = {}

    def unknown(key: str, section: str, keys: frozenset[str]) -> None:
        hint = MYTH_KEYS.get(key)
        findings.append(unknown_key_finding(
            key, keys, trainer="ai-toolkit: jobs/process/BaseSDTrainProcess.py:107-166 (kwargs.get)",
            line=key_line(raw.text, key), section=section,
            behaviour="ai-toolkit reads known keys with kwargs.get and ignores this one silently",
            hint=f"{hint}: not settable: use `te-align patch`" if hint else None,
        ))

    for key in proc:
        if key not in valid["process"]:
            unknown(key, "", valid["process"])
    for section in _SECTIONS:
        sec = proc.get(section)
        if isinstance(sec, dict):
            for key, v in sec.items():
                values[f"{section}.{key}"] = v
                if key not in valid[section]:
                    unknown(key, section, valid[section])
    datasets = proc.get("datasets") if isinstance(proc.get("datasets"), list) else []
    for i, ds in enumerate(datasets):
        if isinstance(ds, dict):
            for key in ds:
                if key not in valid["datasets"]:
                    unknown(key, f"datasets[{i}]", valid["datasets"])
    model = proc.get("model") if isinstance(proc.get("model"), dict) else {}
    prof, reason = guess_profile(model)
    cached = bool(values.get("train.cache_text_embeddings")) or any(
        isinstance(ds, dict) and ds.get("cache_text_embeddings") for ds in datasets)

    def fix_set(key: str, value: Any) -> str:
        return f"{key}: {json.dumps(value)}"

    def fix_remove(key: str) -> str:
        return f"remove {key}" + (" (or set it to false)" if key.endswith("attn_masking") else "")

    trainer = Trainer("ai-toolkit", RULES, fix_set, fix_remove, lambda key: key_line(raw.text, key.rsplit(".", 1)[-1]))
    return Parsed(trainer, values, prof, reason, cached, None, findings, SUPPORTED)
