"""kohya-ss/sd-scripts: ``--config_file`` TOML (sections flattened, keys = argparse dest names) plus
extra CLI args.

Every fact below was read at kohya-ss/sd-scripts@48d368fa557731ad0488c07304dfeba8c07910eb;
``source`` gives file:line at that commit.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align.audit import rules
from te_align.audit.cachefiles import CacheScan, npz_record, scan
from te_align.audit.findings import NOT_SETTABLE, Finding
from te_align.audit.models import assumption, guess_model
from te_align.audit.parsed import (
    CacheSpec,
    CaptionSource,
    KeyLines,
    Parsed,
    dropout_form_finding,
    flatten_sections,
    reason,
    resolve_cli_abbrevs,
    resolve_script_options,
    script_options,
    typed_names,
    unknown_key_finding,
)
from te_align.audit.parsed import parse_cli as _parse_cli
from te_align.audit.readers import NotChecked, RawConfig, UnreadableConfig, known_keys
from te_align.audit.rules import ByProfile, Context, Rule, Trainer, family_of
from te_align.trainers.kohya import names as kohya_table
from te_align.trainers.kohya import semantics

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile


# ------------------------------------------------------------------------------------ converters
def _sd_clip_skip(v: Any, ctx: Context) -> Any:
    # sd-scripts: clip_skip N = hidden_states[-N] + final LN; None/0/1 = last_hidden_state.
    n = rules.int_or_none(v)
    if n is None or n <= 1:
        return "last"
    return "penultimate" if n == 2 else -n


def _sd_clip_skip_back(p: Any, ctx: Context) -> Any:
    if p == "last":
        return rules.REMOVE
    if p == "penultimate":
        return 2
    if isinstance(p, int) and p < 0:
        return -p
    raise LookupError


def _sd_tokens(v: Any, ctx: Context) -> Any:
    # sd-scripts --max_token_length None/75 -> 77; 150/225 -> BOS + n*75 + EOS (chunked).
    n = rules.int_or_none(v)
    return 77 if n is None or n <= 75 else n + 2


def _sd_tokens_back(p: Any, ctx: Context) -> Any:
    if p == 77:
        return rules.REMOVE
    if isinstance(p, int) and p in (152, 227):
        return p - 2
    raise LookupError


rules.register("sd_clip_skip", _sd_clip_skip, _sd_clip_skip_back, "int")
rules.register("sd_tokens", _sd_tokens, _sd_tokens_back, "int")


_SD = ("sd1", "sd2")
_CLIP_SLOTS = {"sd1": "clip_l", "sd2": "clip_h"}

#: The sd-scripts table: one row per (families, profile path) or per accepted-but-unused key.
RULES: tuple[Rule, ...] = (
    # ---- SD 1.x / 2.x (train_network.py)
    Rule("clip_l.encoder.layer", ("sd1",), "clip_skip", None,
         "clip_skip N takes hidden_states[-N] + final layer norm (1 or unset = last layer)",
         "library/strategy_sd.py:73-78; library/train_util.py:4020", convert="sd_clip_skip"),
    Rule("clip_h.encoder.layer", ("sd2",), "clip_skip", None,
         "clip_skip N takes hidden_states[-N] + final layer norm of the 23-layer SD2 encoder",
         "library/strategy_sd.py:73-78; library/train_util.py:4020,4421-4422", convert="sd_clip_skip"),
    Rule("clip_l.tokenizer.max_length", ("sd1",), "max_token_length", None,
         "max_token_length 150/225 tokenizes to 152/227 and encodes 75-token chunks wrapped in BOS/EOS",
         "library/strategy_sd.py:22-37; library/strategy_base.py:236-272; library/train_util.py:3902",
         convert="sd_tokens"),
    Rule("clip_h.tokenizer.max_length", ("sd2",), "max_token_length", None,
         "max_token_length 150/225 tokenizes to 152/227 and encodes 75-token chunks wrapped in BOS/EOS",
         "library/strategy_sd.py:22-37; library/strategy_base.py:236-272; library/train_util.py:3902",
         convert="sd_tokens"),
    # ---- SDXL (sdxl_train_network.py)
    Rule("clip_l.encoder.layer", ("sdxl",), None, "penultimate",
         "TE1 uses hidden_states[11] (penultimate, no final LN), hard-coded",
         "library/strategy_sdxl.py:127-128"),
    Rule("clip_g.encoder.layer", ("sdxl",), None, "penultimate",
         "TE2 uses hidden_states[-2] (no final LN), hard-coded", "library/strategy_sdxl.py:131-132"),
    Rule(None, ("sdxl",), "clip_skip", None,
         "SDXL ignores clip_skip (warning 'clip_skip will be unexpected')",
         "library/sdxl_train_util.py:350-352; sdxl_train_network.py:81-82", convert="sd_clip_skip",
         honoured="never", asks="clip_l.encoder.layer"),
    Rule("clip_l.tokenizer.max_length", ("sdxl",), "max_token_length", None,
         "max_token_length 150/225 encodes BOS/EOS-wrapped 75-token chunks (pooled from chunk 1)",
         "library/strategy_sdxl.py:28-38,143-167; library/train_util.py:3902", convert="sd_tokens"),
    Rule("clip_g.tokenizer.max_length", ("sdxl",), "max_token_length", None,
         "max_token_length 150/225 encodes BOS/EOS-wrapped 75-token chunks (pooled from chunk 1)",
         "library/strategy_sdxl.py:28-38,143-167; library/train_util.py:3902", convert="sd_tokens"),
    Rule("clip_g.tokenizer.pad_token", ("sdxl",), None, "<|endoftext|>",
         "CLIP-G loads the laion tokenizer and only sets pad_token_id = 0, so a literal '!' stays an "
         "ordinary token (the diffusers tokenizer_2 turns every '!' into the pad id 0)",
         "library/strategy_sdxl.py:18-31 (pad_token_id = 0 at :26)", captions="bang"),
    # ---- SD3 / SD3.5 (sd3_train_network.py)
    Rule("t5.tokenizer.max_length", ("sd3",), "t5xxl_max_token_length", 256,
         "T5 length (default 256)", "library/sd3_train_utils.py:188-192; library/strategy_sd3.py:34-48"),
    Rule("clip_l.masks.encoder", ("sd3",), "apply_lg_attn_mask", False,
         "the CLIP-L/G mask reaches the encoders only on the cached path: encode_tokens defaults to False "
         "and the live path passes no flag (the default-False bug)",
         "library/strategy_sd3.py:75-90,333-340; train_network.py:434-439; library/sd3_train_utils.py:194",
         convert="bool", honoured="cached"),
    Rule("clip_g.masks.encoder", ("sd3",), "apply_lg_attn_mask", False,
         "the CLIP-L/G mask reaches the encoders only on the cached path: encode_tokens defaults to False "
         "and the live path passes no flag (the default-False bug)",
         "library/strategy_sd3.py:75-90,333-340; train_network.py:434-439; library/sd3_train_utils.py:194",
         convert="bool", honoured="cached"),
    Rule("t5.masks.encoder", ("sd3",), "apply_t5_attn_mask", False,
         "the T5 mask reaches T5 only on the cached path: encode_tokens defaults to False and the live "
         "path passes no flag (the default-False bug); embeddings are never zeroed",
         "library/strategy_sd3.py:75-90,192-197,333-340; train_network.py:434-439; library/sd3_train_utils.py:199",
         convert="bool", honoured="cached"),
    Rule("clip_l.encoder.layer", ("sd3",), None, "penultimate", "CLIP-L hidden_states[-2], no final LN",
         "library/strategy_sd3.py:130-141"),
    Rule("clip_g.encoder.layer", ("sd3",), None, "penultimate", "CLIP-G hidden_states[-2], no final LN",
         "library/strategy_sd3.py:130-141"),
    Rule("clip_g.tokenizer.pad_token", ("sd3",), None, "<|endoftext|>",
         "CLIP-G loads the laion tokenizer and only sets pad_token_id = 0, so a literal '!' stays an "
         "ordinary token (the diffusers tokenizer_2 turns every '!' into the pad id 0)",
         "library/strategy_sd3.py:21-32", captions="bang"),
    Rule("clip_l.train_dropout", ("sd3",), "clip_l_dropout_rate", 0.0,
         "per-encoder caption dropout (zeroed embeddings)", "library/sd3_train_utils.py:204-209",
         severity="info"),
    Rule("clip_g.train_dropout", ("sd3",), "clip_g_dropout_rate", 0.0,
         "per-encoder caption dropout (zeroed embeddings)", "library/sd3_train_utils.py:210-215",
         severity="info"),
    Rule("t5.train_dropout", ("sd3",), "t5_dropout_rate", 0.0,
         "per-encoder caption dropout (zeroed embeddings)", "library/sd3_train_utils.py:216-221",
         severity="info"),
    Rule(None, ("sd3",), "max_token_length", None,
         "SD3 ignores max_token_length (it logs 'max_token_length is not used')",
         "sd3_train_network.py:57-58", convert="sd_tokens", honoured="never"),
    Rule(None, ("sd3",), "clip_skip", None, "SD3 does not use clip_skip", "library/strategy_sd3.py:130-141",
         convert="sd_clip_skip", honoured="never"),
    # ---- FLUX.1 dev / schnell, Chroma (flux_train_network.py)
    Rule("t5.tokenizer.max_length", ("flux",), "t5xxl_max_token_length", ByProfile({"flux-schnell": 256, "*": 512}),
         "T5 length; unset = 256 when the checkpoint has no guidance embedder (schnell), else 512",
         "flux_train_network.py:162-180; library/flux_train_utils.py:636-641"),
    Rule("t5.tokenizer.max_length", ("chroma",), "t5xxl_max_token_length", 512,
         "T5 length; unset = 512 for Chroma", "flux_train_network.py:162-180; library/flux_train_utils.py:636-641"),
    Rule("t5.masks.encoder", ("flux", "chroma"), "apply_t5_attn_mask", False,
         "apply_t5_attn_mask passes the tokenizer mask into T5 (live and cached)",
         "library/strategy_flux.py:55-60,75-76; library/flux_train_utils.py:643-646", convert="bool"),
    Rule("t5.masks.denoiser", ("flux", "chroma"), "apply_t5_attn_mask", False,
         "apply_t5_attn_mask also key-masks the text tokens in the double and single blocks",
         "flux_train_network.py:359-377; library/flux_models.py:715-726,815-833", convert="bool"),
    Rule("t5.masks.denoiser_extra_pad_tokens", ("chroma",), None, 1,
         "Chroma attends to the real tokens + EOS + one pad token (attn_padding=1)",
         "library/chroma_models.py:664-705"),
    Rule(None, ("flux", "chroma"), "max_token_length", None,
         "FLUX ignores max_token_length (warning at start)", "flux_train_network.py:74-75",
         convert="sd_tokens", honoured="never"),
    Rule(None, ("flux", "chroma"), "clip_skip", None, "FLUX ignores clip_skip (warning at start)",
         "flux_train_network.py:74-75", convert="sd_clip_skip", honoured="never"),
    # ---- Lumina-Image 2.0 (lumina_train_network.py)
    Rule("gemma.tokenizer.system_prompt", ("lumina2",), "system_prompt", "",
         "the prompt gets '<system_prompt> <Prompt Start> ' in front only when system_prompt is non-empty; "
         "the default \"\" adds nothing at all",
         "library/strategy_lumina.py:35-39; library/lumina_train_util.py:1082-1087", convert="nonempty"),
    Rule("gemma.tokenizer.max_length", ("lumina2",), "gemma2_max_token_length", 256,
         "Gemma-2 length (unset = 256)", "library/strategy_lumina.py:41-44; library/lumina_train_util.py:1036-1042"),
    Rule("gemma.encoder.layer", ("lumina2",), None, "penultimate", "Gemma-2 hidden_states[-2]",
         "library/strategy_lumina.py:95-123"),
    # ---- Anima (anima_train_network.py). Both tokenizers pad to max_length (the official pipeline pads to
    # the batch's longest): equivalent for the denoiser (padded positions are zero and masked), no row.
    Rule("qwen.tokenizer.max_length", ("anima",), "qwen3_max_token_length", 512,
         "Qwen3 token length (unset = 512)", "library/strategy_anima.py:53-61; library/anima_train_utils.py:82-87"),
    Rule("t5.tokenizer.max_length", ("anima",), "t5_max_token_length", 512,
         "T5 token length of the LLM adapter's query tokens, and the number of text rows the DiT sees "
         "(unset = 512; the official conditioner always pads to 512)",
         "library/strategy_anima.py:63-68; library/anima_train_utils.py:88-93; library/anima_models.py:1345-1371"),
    # ---- HunyuanImage-2.1 (hunyuan_image_train_network.py): module constants, no flags
    Rule("qwen.tokenizer.max_length", ("hunyuanimage",), None, 1024,
         "Qwen2.5-VL keeps up to 1024 tokens after the 34-token template prefix (TOKENIZER_MAX_LENGTH; the "
         "official pipeline keeps 1000)", "library/hunyuan_image_text_encoder.py:503,514-529"),
    Rule("qwen.tokenizer.padding", ("hunyuanimage",), None, "longest",
         "Qwen2.5-VL tokens are padded to the batch's longest caption (padding=True); masked in the DiT, so "
         "only the sequence length (and float noise) differs", "library/hunyuan_image_text_encoder.py:528",
         severity="info"),
    Rule("byt5.tokenizer.text_transform", ("hunyuanimage",), None, "quoted_text without '...'",
         "ByT5 glyph text leaves out '...' spans (the single-quote pattern is commented out): single-quoted text "
         "gets zero ByT5 embeddings, where the official pipeline renders it (and apostrophe spans)",
         "library/hunyuan_image_text_encoder.py:617-631", severity="warning"),
)

SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "lumina2", "anima", "hunyuanimage")

#: Text-encoder output caches per family: file suffix, what the reuse check compares, source.
CACHES = {
    "sdxl": CacheSpec(("*_te_outputs.npz",), "key names only",
                      "library/strategy_sdxl.py:238-254", "delete the *_te_outputs.npz files"),
    "sd3": CacheSpec(("*_sd3_te.npz",), "key names and apply_lg_attn_mask / apply_t5_attn_mask, not the T5 length",
                     "library/strategy_sd3.py:275-309", "delete the *_sd3_te.npz files"),
    "flux": CacheSpec(("*_flux_te.npz",), "key names and apply_t5_attn_mask, not the T5 length or model type",
                      "library/strategy_flux.py:107-134", "delete the *_flux_te.npz files"),
    "lumina2": CacheSpec(("*_lumina_te.npz",), "key names only (not the system prompt or length)",
                         "library/strategy_lumina.py:170-197", "delete the *_lumina_te.npz files"),
}
CACHES["anima"] = CacheSpec(("*_anima_te.npz",), "key names only (not the Qwen3 / T5 lengths)",
                            "library/strategy_anima.py:171-195", "delete the *_anima_te.npz files")
CACHES["hunyuanimage"] = CacheSpec(("*_hi_te.npz",), "key names only (not the Qwen length, padding or glyph rules)",
                                   "library/strategy_hunyuan_image.py:83-120", "delete the *_hi_te.npz files")
CACHES["chroma"] = CACHES["flux"]


#: Cached TE output files (``*<suffix>``) -> (the array whose shape records the length, the profile path it is)
#: (library/strategy_flux.py:107-194, strategy_sd3.py:256-381, strategy_sdxl.py:222-306, strategy_lumina.py:147-281).
NPZ_LENGTH = {
    "_flux_te.npz": ("t5_out", "t5.tokenizer.max_length"),
    "_sd3_te.npz": ("t5_out", "t5.tokenizer.max_length"),
    "_te_outputs.npz": ("hidden_state1", "clip_l.tokenizer.max_length"),
    "_lumina_te.npz": ("hidden_state", "gemma.tokenizer.max_length"),
}
#: The mask flags SD3 / FLUX cache files store as 0-d bool arrays.
NPZ_FLAGS = ("apply_t5_attn_mask", "apply_lg_attn_mask")


def scan_cache(directory: str, profile: AlignmentProfile) -> CacheScan:
    """sd-scripts' ``*_te*.npz`` files in ``directory``, read from their headers (te_align.audit.cachefiles)."""
    from functools import partial

    return scan(directory, [(f"*{suffix}", partial(npz_record, array=arr, flags=NPZ_FLAGS), ppath)
                            for suffix, (arr, ppath) in NPZ_LENGTH.items()])


def toml_literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(str(v), ensure_ascii=False)


def parse_cli(args: list[str]) -> tuple[dict[str, Any], str | None]:
    """``--key value`` / ``--key=value`` / ``--flag`` -> values; a ``*.py`` positional is the script."""
    values, script, _ = _parse_cli(args)
    return values, script


def flatten(data: dict[str, Any]) -> dict[str, Any]:
    """read_config_from_file flattens every section into one namespace (library/train_util.py:4700-4764)."""
    return flatten_sections(data)


def guess_profile(values: dict[str, Any], script: str | None) -> tuple[str | None, str]:
    """The bundled profile an sd-scripts run trains, and why we think so: the script (or the network_module a
    config names), its variant flags, the model path's files (what sd-scripts itself analyses: a FLUX.1 checkpoint
    without guidance_in is schnell) or name. Where nothing decides between two profiles of a family, the reason
    carries the assumption (:func:`te_align.audit.parsed.reason`)."""
    path = values.get("pretrained_model_name_or_path")
    by_name, files, decided = guess_model(path)
    named = f" and pretrained_model_name_or_path {path!r}{files}"
    arch = kohya_table.script_arch(script)
    why = f"script {script}"
    if arch is None:
        arch = kohya_table.network_arch(values.get("network_module"))
        why = f"network_module {values.get('network_module')!r}"
    if arch is not None:  # the script's architecture (te_align.trainers.kohya), its variant from the flags
        fam = kohya_table.profile_name(arch)
        if values.get("model_type") == "chroma" and kohya_table.profile_name(arch, "chroma") != fam:
            return kohya_table.profile_name(arch, "chroma"), f"{why} with model_type = \"chroma\""
        if values.get("v2") and kohya_table.profile_name(arch, "v2") != fam:
            return kohya_table.profile_name(arch, "v2"), f"{why} with v2 = true"
        if by_name and decided and by_name != fam and family_of(by_name) == family_of(fam):
            return by_name, f"{why}{named}"
        return fam, why if by_name == fam and decided else _assumed(why, fam, arch)
    if values.get("model_type") == "chroma":
        return "chroma", 'model_type = "chroma" (flux_train_network.py)'
    if any(k in values for k in ("system_prompt", "gemma2", "gemma2_max_token_length")):
        return "lumina2", "Lumina keys (system_prompt / gemma2*) (lumina_train_network.py)"
    if any(k in values for k in ("qwen3", "qwen3_max_token_length", "t5_max_token_length", "llm_adapter_path", "t5_tokenizer_path")):
        return "anima", "Anima keys (qwen3 / llm_adapter_path / *_max_token_length) (anima_train_network.py)"
    if any(k in values for k in ("byt5", "fp8_vl")):
        return "hunyuanimage-2.1", "HunyuanImage keys (byt5 / fp8_vl) (hunyuan_image_train_network.py)"
    if any(k in values for k in ("apply_lg_attn_mask", "clip_g", "clip_g_dropout_rate", "t5_dropout_rate")):
        if by_name and decided and by_name.startswith("sd3"):
            return by_name, f"SD3 keys (clip_g / apply_lg_attn_mask) (sd3_train_network.py){named}"
        return "sd35-large", _assumed("SD3 keys (clip_g / apply_lg_attn_mask) (sd3_train_network.py)", "sd35-large",
                                      "sd3")
    if any(k in values for k in ("t5xxl", "ae", "t5xxl_max_token_length", "apply_t5_attn_mask")):
        if decided and by_name in ("flux-schnell", "flux-dev"):
            return by_name, f"FLUX keys (t5xxl / ae) (flux_train_network.py){named}"
        return "flux-dev", _assumed("FLUX keys (t5xxl / ae) (flux_train_network.py)", "flux-dev", "flux")
    if values.get("v2"):
        return "sd21", "v2 = true (train_network.py)"
    if by_name:
        said = f"pretrained_model_name_or_path {path!r}{files}"
        return by_name, said if decided else _assumed(said, by_name, family_of(by_name))
    model = f"pretrained_model_name_or_path {path!r} (a model te-align does not know by name{files})" if isinstance(
        path, str) else "no pretrained_model_name_or_path"
    return None, (f"{model} and no training script: name the script after --, as sd-scripts runs it "
                  "(te-align check CONFIG -- sdxl_train_network.py)")


def _assumed(why: str, prof: str, arch: str) -> str:
    """``why`` with the assumption it rests on when ``prof`` has siblings nothing in the config told apart."""
    said = assumption(prof, "pretrained_model_name_or_path (its name or files)")
    if arch == "sd3" and said:
        said += "; every bundled SD3 profile encodes the same way"
    return reason(f"{why}; {prof} assumed" if said else why, said)


def caption_dirs(values: dict[str, Any]) -> list[str]:
    """train_data_dir and the image_dir of every subset of a dataset_config TOML (when the files exist)."""
    dirs = [values["train_data_dir"]] if isinstance(values.get("train_data_dir"), str) else []
    data = _dataset_config(values)
    if data is not None:
        dirs += [sub["image_dir"] for _, sub in _subsets(data) if isinstance(sub.get("image_dir"), str)]
    return dirs


#: sd-scripts' caption handling, read at kohya-ss/sd-scripts@48d368f: a subset's caption_extension, caption_prefix,
#: caption_suffix, enable_wildcard, shuffle_caption and keep_tokens come from the subset, else its dataset, else
#: [general], else the command line (library/config_util.py:408-463); caption_extension defaults to ".caption"
#: (library/config_util.py:99, library/train_util.py:4493); a caption is the file's first line, stripped, or with
#: enable_wildcard one of its non-empty lines, stripped (library/train_util.py:1946-1967,839-842); the prefix and
#: suffix are joined with a space first (library/train_util.py:822-826); with shuffle_caption,
#: caption_tag_dropout_rate or token_warmup_step the caption is split at caption_separator (default ","), each tag
#: stripped, and joined with ", " (library/train_util.py:867-915, config_util.py:59); the shuffle and keep_tokens
#: reorder tags and keep the count; a subset's images are the image_dir's own files, no sub-folders
#: (library/train_util.py:1999,2847-2856).
CAPTION_SOURCE = ("kohya-ss/sd-scripts@48d368f library/train_util.py:822-915,1946-1967, library/config_util.py:"
                  "408-463")

#: Where sd-scripts loads each slot's tokenizer from, per family (hub ids; under --tokenizer_cache_dir as
#: ID with "/" replaced by "_", library/strategy_base.py:54-71, except Lumina's, which takes it as a hub cache,
#: strategy_lumina.py:30-32): library/strategy_sd.py:17-18, strategy_sdxl.py:18-19, strategy_sd3.py:21-23,
#: strategy_flux.py:19-20, strategy_lumina.py:23 (at 48d368f).
TOKENIZER_IDS: dict[str, dict[str, str]] = {
    "sd1": {"clip_l": "openai/clip-vit-large-patch14"},
    "sdxl": {"clip_l": "openai/clip-vit-large-patch14", "clip_g": "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k"},
    "sd3": {"clip_l": "openai/clip-vit-large-patch14", "clip_g": "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k",
            "t5": "google/t5-v1_1-xxl"},
    "flux": {"clip_l": "openai/clip-vit-large-patch14", "t5": "google/t5-v1_1-xxl"},
    "lumina2": {"gemma": "google/gemma-2-2b"},
}


def caption_sources(values: dict[str, Any]) -> list[CaptionSource]:
    """The caption folders sd-scripts reads with its caption handling: train_data_dir with the command line's, and
    every dataset_config subset's image_dir with the subset's (falling back as sd-scripts does)."""
    def pick(key: str, tables: list[Any], default: Any) -> Any:
        for t in tables:
            v = t.get(key) if isinstance(t, dict) else None
            if v is not None:
                return v
        return default

    def source(folder: str, tables: list[Any], recursive: bool = False) -> CaptionSource:
        ext = pick("caption_extension", tables, ".caption")
        ext = ext if isinstance(ext, str) and ext else ".caption"
        keep = pick("keep_tokens", tables, 0)
        wildcard = pick("enable_wildcard", tables, False) is True
        shuffle = pick("shuffle_caption", tables, False) is True
        rate, warm = pick("caption_tag_dropout_rate", tables, 0), pick("token_warmup_step", tables, 0)
        tags = shuffle or (_number(rate) and rate > 0) or (_number(warm) and warm > 0)
        sep = pick("caption_separator", tables, ",")
        same = tuple(x for x, on in (("shuffle_caption", shuffle),
                                     (f"keep_tokens = {keep}", isinstance(keep, int) and keep > 0),
                                     ("enable_wildcard: one line and each {a|b} choice is picked per step (each line "
                                      "counted here, the prefix and suffix on every line)", wildcard)) if on)
        prefix, suffix = pick("caption_prefix", tables, ""), pick("caption_suffix", tables, "")
        return CaptionSource(folder=folder, extension=ext if ext.startswith(".") else f".{ext}",
                             prefix=prefix if isinstance(prefix, str) else "",
                             suffix=suffix if isinstance(suffix, str) else "",
                             first_line=not wildcard, each_line=wildcard,
                             rejoin=(sep if isinstance(sep, str) and sep else ",", ", ") if tags else None,
                             rejoin_strip=True, affix_first=True,
                             recursive=recursive, length_invariant=same, source=CAPTION_SOURCE)

    # train_data_dir's sub-folders are its subsets (library/config_util.py:607-640): read below it
    out = [source(values["train_data_dir"], [values], True)] if isinstance(values.get("train_data_dir"), str) else []
    data = _dataset_config(values)
    if data is not None:
        general = data.get("general") if isinstance(data.get("general"), dict) else {}
        out += [source(sub["image_dir"], [sub, ds, general, values]) for ds, sub in _subsets(data)
                if isinstance(sub.get("image_dir"), str)]
    return out


def templates(values: dict[str, Any], family: str) -> dict[str, str]:
    """What sd-scripts wraps a caption in, per slot, where its effective values do not say it: Lumina 2's
    f"{system_prompt} <Prompt Start> " before the caption only when system_prompt is non-empty
    (kohya-ss/sd-scripts@48d368f library/strategy_lumina.py:35-39)."""
    if family != "lumina2":
        return {}
    sp = values.get("system_prompt")
    return {"gemma": "{system_prompt} <Prompt Start> {prompt}" if isinstance(sp, str) and sp else "{prompt}"}


def tokenizer_paths(values: dict[str, Any], family: str) -> dict[str, list[str]]:
    """Per slot, where sd-scripts loads its tokenizer: under tokenizer_cache_dir first, then the hub id."""
    cache = values.get("tokenizer_cache_dir") if family != "lumina2" else None
    out: dict[str, list[str]] = {}
    for slot, repo in TOKENIZER_IDS.get(family, {}).items():
        out[slot] = ([str(Path(cache) / repo.replace("/", "_"))] if isinstance(cache, str) and cache else []) + [repo]
    return out


def _dataset_config(values: dict[str, Any]) -> dict[str, Any] | None:
    """The dataset_config TOML the config names, as a table ({} when unreadable); None when it names none that exists."""
    cfg = values.get("dataset_config")
    if not (isinstance(cfg, str) and cfg.endswith(".toml") and Path(cfg).is_file()):
        return None
    from te_align import _toml as tomllib

    try:
        return tomllib.loads(Path(cfg).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return {}


def _subsets(data: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(dataset, subset) of every table-shaped subset of a dataset_config."""
    return [(ds, sub) for ds in (data.get("datasets") if isinstance(data.get("datasets"), list) else [])
            if isinstance(ds, dict) and isinstance(ds.get("subsets"), list)
            for sub in ds["subsets"] if isinstance(sub, dict)]


#: Where sd-scripts' Anima text-encoder cache keeps the caption dropout rate (read at 48d368f).
ANIMA_DROPOUT_SOURCE = ("library/strategy_anima.py:171-195 (the reuse check only asks that a caption_dropout_rate "
                        "array be present, :189), :197-204 (the cached rate is what training uses), :235-244 (written "
                        "at caching time); anima_train_network.py:347-355")


def subset_dropout_rates(values: dict[str, Any]) -> list[tuple[str, float]]:
    """(image folder, caption_dropout_rate) of every subset sd-scripts builds: a dataset_config's subsets take the
    rate from the subset, else its dataset, else [general], else the command line (library/config_util.py:408-440);
    train_data_dir takes the command line's (default 0.0, library/train_util.py:4651)."""
    def rate(*tables: Any) -> float:
        for t in tables:
            v = t.get("caption_dropout_rate") if isinstance(t, dict) else None
            if _number(v):
                return float(v)
        return 0.0

    out: list[tuple[str, float]] = []
    data = _dataset_config(values)
    if data is not None:
        general = data.get("general") if isinstance(data.get("general"), dict) else {}
        out += [(sub["image_dir"], rate(sub, ds, general, values)) for ds, sub in _subsets(data)
                if isinstance(sub.get("image_dir"), str)]
    elif isinstance(values.get("train_data_dir"), str):
        out.append((values["train_data_dir"], rate(values)))
    return out


def subset_values(values: dict[str, Any], key: str) -> list[tuple[str, Any, bool]]:
    """(subset, value, whether the dataset_config gave it) of ``key`` for every subset sd-scripts builds: from the
    subset, else its dataset, else [general], else the command line / config (library/config_util.py:430-433)."""
    data = _dataset_config(values)
    if data is None:
        return [(str(values.get("train_data_dir") or "train_data_dir"), values.get(key), False)]
    general = data.get("general") if isinstance(data.get("general"), dict) else {}
    out: list[tuple[str, Any, bool]] = []
    for i, (ds, sub) in enumerate(_subsets(data)):
        where = sub["image_dir"] if isinstance(sub.get("image_dir"), str) else f"subset {i + 1}"
        table = next((t for t in (sub, ds, general) if key in t), None)
        out.append((where, table[key], True) if table is not None else (where, values.get(key), False))
    return out


def anima_dropout_cache_findings(values: dict[str, Any], line: Any) -> list[Finding]:
    """sd-scripts' Anima disk cache bakes each subset's caption_dropout_rate into every ``*_anima_te.npz`` and keeps
    a file whose rate differs from the config's: a changed rate does nothing until the files are deleted."""
    from te_align.audit.cachefiles import UNREADABLE, npz_scalar

    out: list[Finding] = []
    subsets = subset_dropout_rates(values)
    set_where = "caption_dropout_rate" in values or any(r > 0 for _, r in subsets)
    seen = 0
    for folder, want in subsets:
        root = Path(folder)
        files = sorted(root.rglob("*_anima_te.npz")) if root.is_dir() else []
        seen += len(files)
        baked: dict[float, int] = {}
        for f in files:
            try:
                got = npz_scalar(f, "caption_dropout_rate")
            except UNREADABLE:
                continue
            if got is not None:
                baked[got] = baked.get(got, 0) + 1
        want32 = struct.unpack("<f", struct.pack("<f", want))[0]
        stale = {r: c for r, c in baked.items() if r != want32}
        if stale:
            made = ", ".join(f"{c} with {r:g}" for r, c in sorted(stale.items()))
            out.append(Finding(
                kind="stale-cache", severity="error", setting="caption_dropout_rate", effective=want,
                key="caption_dropout_rate", line=line("caption_dropout_rate"),
                message=(f"{sum(stale.values())} of {len(files)} cached *_anima_te.npz files in {folder} hold another "
                         f"caption_dropout_rate ({made}) than this config gives the subset ({want:g}): sd-scripts "
                         "reuses them (its check only asks that the rate is stored, not that it is the same) and "
                         "drops captions at the cached rate, so the new rate does nothing"),
                fix=f"delete the *_anima_te.npz files in {folder} (sd-scripts caches them again with the new rate)",
                trainer_source=f"sd-scripts: {ANIMA_DROPOUT_SOURCE}"))
    if not seen and set_where:
        out.append(Finding(
            kind="note", severity="info", setting="caption_dropout_rate", key="caption_dropout_rate",
            line=line("caption_dropout_rate"),
            message=("sd-scripts writes each subset's caption_dropout_rate into every cached *_anima_te.npz and "
                     "reuses a file whatever rate it holds: changing caption_dropout_rate later does nothing until "
                     "the cache is made again (te-align found no *_anima_te.npz in the image folders to compare)"),
            fix="after changing caption_dropout_rate, delete the *_anima_te.npz files next to the images",
            trainer_source=f"sd-scripts: {ANIMA_DROPOUT_SOURCE}"))
    return out


def make_after(values: dict[str, Any], line: Any, fix_zero: Any, raw: RawConfig, script: str | None = None) -> Any:
    """Caption dropout (caption_dropout_rate / caption_dropout_every_n_epochs: the caption becomes "" and is
    encoded) against the profile's empty-prompt rule."""

    def after(profile: AlignmentProfile, ctx: Context) -> list:
        out = []
        for key in ("caption_dropout_rate", "caption_dropout_every_n_epochs"):
            rate = values.get(key)
            if key == "caption_dropout_every_n_epochs" and rate:
                rate = 1.0 / float(rate) if _number(rate) and float(rate) > 0 else None
            if ctx.cached and key == "caption_dropout_rate" and _number(rate) and float(rate) > 0 and (
                    profile.family not in ("anima", "sd1", "sd2")) and (
                    profile.family != "lumina2" or str(script or "").endswith("lumina_train.py")):
                out.append(Finding(
                    kind="unused-value", severity="error", setting=key, effective=rate, key=key, line=line(key),
                    message=(f"{key} = {rate} with cached text-encoder outputs: sd-scripts stops at start ('when "
                             "caching Text Encoder output, either caption_dropout_rate, … cannot be used')"),
                    fix=f"{fix_zero(key)}, or turn text-encoder output caching off",
                    trainer_source="sd-scripts: library/train_util.py:1102-1113; sdxl_train_network.py:34-37; "
                                   "sd3_train_network.py:48-51; flux_train_network.py:65-68"))
                continue
            out += dropout_form_finding(
                profile, rate, "encode", key=key, trainer="sd-scripts",
                source="library/train_util.py:821-837 process_caption (a dropped caption becomes '')",
                line=line(key), fix=f"{fix_zero(key)} (sd-scripts cannot drop captions as zeros)")
        if profile.family == "anima" and values.get("cache_text_encoder_outputs_to_disk"):
            out += anima_dropout_cache_findings(values, line)
        untrained = ctx.cached and profile.family not in ("sd1", "sd2") and not semantics.trains_te(values, script)
        out += semantics.epoch_dropout_findings(values, subset_values(values, "caption_dropout_every_n_epochs"), line,
                                                untrained, fix_zero)
        if ctx.cached:
            out += semantics.cache_caption_findings(profile.family, script, values,
                                                    lambda key: subset_values(values, key), line, untrained)
        return out

    return after


def _number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return not isinstance(v, bool)


def not_settable(script: str | None) -> str:
    """"use te-align patch" only where te-align's patch replaces the script (te_align.trainers.kohya.SCRIPTS)."""
    if script in kohya_table.SCRIPTS and not kohya_table.SCRIPTS[script][1]:
        return f"not settable: hard-coded in sd-scripts, and te-align patch does not cover {script}"
    return NOT_SETTABLE


def make_trainer(raw: RawConfig, cli_keys: set[str], script: str | None = None,
                 written: dict[str, str] | None = None) -> Trainer:
    def fix_set(key: str, value: Any) -> str:
        if key in cli_keys or raw.fmt != "toml":
            return f"--{key}" if value is True else f"--{key} {value if not isinstance(value, str) else json.dumps(value)}"
        return f"{key} = {toml_literal(value)}"

    def fix_remove(key: str) -> str:
        return f"remove --{key}" if key in cli_keys or raw.fmt == "cmdline" else f"remove {key} from {raw.file}"

    if raw.fmt == "cmdline":
        from te_align.audit.cmdline import arg_line

        text, short = raw.text, written or {}  # an option written abbreviated: the line of its prefix
        return Trainer("kohya", RULES, fix_set, fix_remove, lambda key: arg_line(text, short.get(key, key)) if key else None,
                       not_settable=not_settable(script))
    lines = KeyLines(raw.text)
    return Trainer("kohya", RULES, fix_set, fix_remove, lambda key: lines(key) if key not in cli_keys else None,
                   not_settable=not_settable(script))


def unknown_keys(keys: dict[str, int | None], trainer: str = "sd-scripts") -> list:
    valid = known_keys("kohya", "te_align.trainers.kohya")[""]
    out = []
    for key, line in keys.items():
        if key not in valid:
            out.append(unknown_key_finding(
                key, valid, trainer=f"{trainer}: library/train_util.py:4700-4764", line=line,
                behaviour="sd-scripts puts every TOML key into the argument namespace and never reads this one",
            ))
    return out


def detect(raw: RawConfig) -> int | None:
    """An sd-scripts TOML: a key of sd-scripts' argument namespace at the top or in a section (a weak sign: every
    more specific reader wins)."""
    if raw.fmt == "cmdline":  # the script name decides: one of sd-scripts' own (names.SCRIPTS)
        data = raw.data if isinstance(raw.data, dict) else {}
        return 100 if data.get("script") in kohya_table.SCRIPTS else None
    if raw.fmt != "toml" or not isinstance(raw.data, dict):
        return None
    if is_dataset_config(raw.data) or is_gui_settings(raw.data):
        return 10
    flat = {str(k).lstrip("-") for k in raw.data}
    for v in raw.data.values():
        if isinstance(v, dict):
            flat.update(v)
    return 10 if flat & known_keys("kohya", "te_align.trainers.kohya")[""] else None


def is_dataset_config(data: dict[str, Any]) -> bool:
    """An sd-scripts dataset config (``--dataset_config``: ``[general]`` and ``[[datasets]]`` with
    ``[[datasets.subsets]]``, library/config_util.py), not a training config."""
    datasets = data.get("datasets")
    return (isinstance(datasets, list) and bool(datasets) and set(data) <= {"general", "datasets"}
            and all(isinstance(d, dict) for d in datasets))


#: The tables of kohya_ss's own GUI settings file (bmaltais/kohya_ss `config example.toml`, copied to config.toml:
#: the defaults of the GUI's fields by tab; kohya_gui/class_gui_config.py reads it).
GUI_SETTINGS_TABLES = frozenset({
    "settings", "server", "model", "folders", "configuration", "accelerate_launch", "basic", "advanced",
    "dataset_preparation", "huggingface", "samples", "sdxl", "wd14_caption", "metadata",
})
#: Tables only that file has (an sd-scripts config may name a section [model] or [sdxl], never these).
_GUI_ONLY = frozenset({"settings", "server", "folders", "configuration", "accelerate_launch", "dataset_preparation",
                       "wd14_caption"})
GUI_SETTINGS = ("not a training config: this is kohya_ss's GUI settings file (config.toml: the defaults of the GUI's "
                "fields and folders); check the training config it saves instead (the .json of the GUI's Save, or "
                "the config_lora-*.toml it writes to the output folder)")


def is_gui_settings(data: dict[str, Any]) -> bool:
    """kohya_ss's GUI settings file: only tables, all of them the GUI's, at least one that only it has."""
    return (bool(data) and set(data) <= GUI_SETTINGS_TABLES and bool(set(data) & _GUI_ONLY)
            and all(isinstance(v, dict) for v in data.values()))


def _command_values(raw: RawConfig, extra_args: list[str]) -> tuple[RawConfig, list[str], dict[str, Any]]:
    """A command line (``accelerate launch flux_train_network.py ARGS``) as the TOML it may name by
    ``--config_file`` (or none) plus its arguments, the way sd-scripts reads them: read_config_from_file loads the
    TOML, then parses the command line over it (library/train_util.py:4700-4764). Also the info notes."""
    data = raw.data if isinstance(raw.data, dict) else {}
    args = [str(a) for a in data.get("args", [])]  # type: ignore[union-attr]
    words = [str(data.get("script") or ""), *args, *extra_args]
    cli, script, order = _parse_cli(words)
    _resolve_options(cli, order, script, typed_names(args), {}, lambda key: None)
    config = cli.get("config_file")
    table: dict[str, Any] = {}
    notes: dict[str, Any] = {}
    if isinstance(config, str) and config:
        path = Path(config if config.endswith(".toml") else config + ".toml")
        if not path.is_absolute() and not path.is_file():
            path = Path(raw.file).parent / path
        if path.is_file():
            from te_align.audit.readers import load

            loaded = load(str(path))
            if isinstance(loaded.data, dict):
                table = loaded.data
        else:
            notes["config_file"] = config
    return RawConfig(raw.file, "cmdline", raw.text, table), words, notes


#: The generated table of each script's argparse options (tools/gen_audit_keys.py kohya-options).
OPTIONS = "kohya-options"


def _resolve_options(cli: dict[str, Any], order: list[str], script: str | None, typed: dict[str, str],
                     written: dict[str, str], line: Any) -> list[Finding]:
    """Abbreviated options renamed to the ones the script's own parser reads them as (its setup_parser, read by
    tools/argparse_options.py); without a script, against every option sd-scripts has."""
    if not order:
        return []
    table = script_options(__package__, OPTIONS, script)
    if table is None:
        return resolve_cli_abbrevs(cli, order, known_keys("kohya", "te_align.trainers.kohya")[""], line=line,
                                   trainer="sd-scripts: argparse (allow_abbrev)")
    found, short = resolve_script_options(cli, order, table, typed=typed, line=line,
                                          trainer=f"sd-scripts: {script} setup_parser (argparse)")
    written.update(short)
    return found


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    notes: dict[str, Any] = {}
    if raw.fmt == "cmdline":
        raw, extra_args, notes = _command_values(raw, extra_args)
    if not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a TOML table", file=raw.file)
    if is_gui_settings(raw.data):
        raise NotChecked(GUI_SETTINGS, status="not-training", file=raw.file)
    if is_dataset_config(raw.data):
        raise NotChecked("not checked: an sd-scripts dataset config names no model; check the training config or "
                         "command line that uses it (--dataset_config) — the model is set there", file=raw.file)
    values = flatten(raw.data)
    cli, script, order = _parse_cli(extra_args)
    if raw.fmt == "cmdline":
        from te_align.audit.cmdline import arg_line

        text = raw.text
        lines: Any = lambda key: arg_line(text, key)  # noqa: E731
        findings = unknown_keys({k: None for k in values}, "sd-scripts (--config_file)")
    else:
        lines = KeyLines(raw.text)
        findings = unknown_keys({k: lines(k) for k in values})
    written: dict[str, str] = {}  # options written abbreviated: full name -> the prefix (their lines)
    if raw.fmt == "cmdline":
        lines = lambda key: arg_line(text, written.get(key, key))  # noqa: E731
    findings += _resolve_options(cli, order, script, typed_names(extra_args), written,
                                 lines if raw.fmt == "cmdline" else (lambda key: None))
    findings += unknown_keys({k: (lines(k) if raw.fmt == "cmdline" else None) for k in cli
                              if k not in values or raw.fmt == "cmdline"})
    if notes.get("config_file"):
        findings.append(Finding(kind="note", severity="info", setting="config_file", message=(
            f"--config_file {notes['config_file']} is not here: only the command line is checked (sd-scripts reads "
            "that TOML under it)"), fix="check the TOML too: te-align check CONFIG.toml"))
    values.update(cli)
    if script is None and isinstance(values.get("script"), str):
        script = values["script"].rsplit("/", 1)[-1]
    prof, reason = guess_profile(values, script)
    cached = bool(values.get("cache_text_encoder_outputs") or values.get("cache_text_encoder_outputs_to_disk"))
    trainer = make_trainer(raw, set(cli) if raw.fmt != "cmdline" else set(), script, written)
    key_line = lambda key: lines(key) if key not in cli or raw.fmt == "cmdline" else None  # noqa: E731
    after = make_after(values, key_line, lambda key: f"remove --{key}" if key in cli else f"{key} = 0", raw, script)
    findings += semantics.lr_findings(values, script, key_line, set(cli))
    return Parsed(trainer, values, prof, reason, cached, None, findings, SUPPORTED, after=after,
                  caption_dirs=caption_dirs(values), caption_sources=caption_sources(values),
                  model_paths=[values["pretrained_model_name_or_path"]] if isinstance(
                      values.get("pretrained_model_name_or_path"), str) else [],
                  tokenizer_paths=tokenizer_paths(values, family_of(prof) if prof else ""),
                  templates=templates(values, family_of(prof) if prof else ""),
                  guess_is_default=script is None and reason.startswith(
                      "pretrained_model_name_or_path"), assumed=getattr(reason, "assumed", ""))
