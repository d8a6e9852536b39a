"""tdrussell/diffusion-pipe: the training TOML (``deepspeed train.py --deepspeed --config CONFIG``; ``[model] type``)
and the dataset TOML it names (``dataset = 'dataset.toml'``: ``[[directory]]``, ``caption_prefix``, …).

diffusion-pipe encodes captions once, before training: each text encoder's embeddings are cached (HF ``datasets``
shards in ``<directory>/cache/<model>/…/text_embeddings_<i>``) unless ``[model] cache_text_embeddings = false``.
The cache's fingerprint hashes the text encoder's index and the captions only (utils/dataset.py:85-97,178-199): a
changed model variant or encoding setting reuses stale embeddings.

Every fact below was read at tdrussell/diffusion-pipe@8f83dbf25d03219df705570ec03e62be04bc402f; ``source`` gives
file:line at that commit. Most model classes call the diffusers pipeline's own encode functions (``models/<type>.py``
``get_call_text_encoder_fn``); what differs from the official pipeline is named below. The keys diffusion-pipe
reads are bundled in ``data/diffusion-pipe.txt`` (``python tools/gen_audit_keys.py diffusion-pipe CHECKOUT``
regenerates it); it reads most keys with ``.get`` and ignores the rest silently. The keys it reads with
``config['key']`` on every run (no default: a missing one stops it with a KeyError) are bundled there too, per model
type (``[required.<type>]``), with an example value from its docs.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from te_align._safetensors import read_header
from te_align.audit import rules
from te_align.audit.findings import Edit, Finding
from te_align.audit.models import assumption, profile_from_files
from te_align.audit.parsed import (
    CacheSpec,
    CaptionSource,
    KeyLines,
    Parsed,
    checkout_commit,
    emit_key_table,
    unknown_key_finding,
)
from te_align.audit.readers import (
    ConfigSyntaxError,
    NotChecked,
    RawConfig,
    UnreadableConfig,
    known_keys,
    load,
    read_text,
)
from te_align.audit.rules import Context, Rule, Trainer
from te_align.errors import TeAlignError
from te_align.profiles import profile as resolve
from te_align.trainers.diffusion_pipe import names, semantics

COMMIT = "8f83dbf25d03219df705570ec03e62be04bc402f"
#: diffusion-pipe's captions (at 8f83dbf): the directory's own files (path.glob('*'), utils/dataset.py:628), an
#: image's caption is IMAGE.txt (:646-658), read whole and
#: stripped (:751-753), with the directory's caption_prefix (else the dataset's, :734) put before it as is, no space
#: (:48-57, :763).
CAPTION_SOURCE = "tdrussell/diffusion-pipe@8f83dbf utils/dataset.py:48-57,628,646-658,734,751-763"
NAME = "diffusion-pipe"
#: The system prompt te-align's lumina2 profile (diffusers' Lumina2Pipeline) puts in front of a caption.
LUMINA_START = " <Prompt Start> "


# ------------------------------------------------------------------------------------ converters
def _lumina_system(v: Any, ctx: Context) -> Any:
    # caption_prefix "SYSTEM <Prompt Start> " is the template with that system prompt; "" is no system prompt
    prefix = v if isinstance(v, str) else ""
    return prefix[: -len(LUMINA_START)] if prefix.endswith(LUMINA_START) else (prefix or None)


def _lumina_system_back(p: Any, ctx: Context) -> Any:
    return p + LUMINA_START if isinstance(p, str) and p else rules.REMOVE


def _lumina_template(v: Any, ctx: Context) -> Any:
    prefix = v if isinstance(v, str) else ""
    if prefix.endswith(LUMINA_START):
        return "{system_prompt} <Prompt Start> {prompt}"
    return prefix.replace("{", "{{").replace("}", "}}") + "{prompt}"


rules.register("dp_lumina_system", _lumina_system, _lumina_system_back, "str")
def _lumina_template_back(p: Any, ctx: Context) -> Any:
    if p == "{system_prompt} <Prompt Start> {prompt}":
        return "SYSTEM" + LUMINA_START
    raise LookupError


rules.register("dp_lumina_template", _lumina_template, _lumina_template_back, "str")

_M = "models"
RULES: tuple[Rule, ...] = (
    # ---- FLUX.1: the diffusers FluxPipeline's own encode functions, T5 at their default length
    Rule("t5.tokenizer.max_length", ("flux",), None, 512,
         "get_call_text_encoder_fn calls FluxPipeline._get_t5_prompt_embeds without max_sequence_length (diffusers' "
         "default 512, for dev and schnell)", f"{_M}/flux.py:307-322"),
    Rule("t5.masks.encoder", ("flux",), None, False, "T5 runs without the attention mask (as the pipeline)",
         f"{_M}/flux.py:317-318"),
    Rule("clip_l.encoder.pooled", ("flux",), None, "pooler_output", "CLIPTextModel pooler_output (as the pipeline)",
         f"{_M}/flux.py:309-313"),
    # ---- SDXL: encoded live from its own token ids (no cache), both encoders with the CLIP-L tokenizer
    Rule("clip_l.tokenizer.padding", ("sdxl",), None, "longest",
         "captions are tokenized with padding='longest' and no truncation; each 75-token chunk gets BOS and EOS but is "
         "not padded to 77, so the UNet sees as many text tokens as the batch's longest caption",
         f"{_M}/sdxl.py:581-589,745-765"),
    Rule("clip_g.tokenizer.padding", ("sdxl",), None, "longest",
         "CLIP-G gets the same ids (padding='longest', no padding to 77)", f"{_M}/sdxl.py:542-543,581-589,740"),
    Rule("clip_l.tokenizer.truncation", ("sdxl",), None, False,
         "no truncation: a caption longer than 75 tokens is encoded in 75-token chunks concatenated to a longer "
         "sequence", f"{_M}/sdxl.py:581-589,751-781"),
    Rule("clip_g.tokenizer.pad_token", ("sdxl",), None, "<|endoftext|>",
         "tokenizer_2 is replaced by the CLIP-L tokenizer: CLIP-G pads with <|endoftext|> and a literal '!' stays text "
         "(the diffusers tokenizer_2 pads with '!' and turns every '!' into the pad id 0)", f"{_M}/sdxl.py:390-393",
         captions="bang"),
    Rule("clip_l.encoder.layer", ("sdxl",), None, "penultimate", "hidden_states[-2] of both encoders",
         f"{_M}/sdxl.py:773-774"),
    Rule("clip_g.encoder.pooled", ("sdxl",), None, "text_embeds", "pooled = output[0] of text_encoder_2 (first chunk)",
         f"{_M}/sdxl.py:769-771"),
    # ---- SD3 / SD3.5: the diffusers StableDiffusion3Pipeline's own encode functions
    Rule("t5.tokenizer.max_length", ("sd3",), None, 256,
         "StableDiffusion3Pipeline._get_t5_prompt_embeds without max_sequence_length (diffusers' default 256)",
         f"{_M}/sd3.py:101-105"),
    Rule("clip_l.encoder.layer", ("sd3",), None, "penultimate", "_get_clip_prompt_embeds (hidden_states[-2])",
         f"{_M}/sd3.py:80-99"),
    Rule("clip_g.tokenizer.pad_token", ("sd3",), None, "!", "the diffusers folder's tokenizer_2 (pad '!')",
         f"{_M}/sd3.py:36"),
    # ---- Chroma: its own T5 call, 512 tokens, the mask into T5 and (plus one padding token) into the transformer
    Rule("t5.tokenizer.max_length", ("chroma",), None, 512, "max_sequence_length = 512, padding max_length",
         f"{_M}/chroma.py:200-209"),
    Rule("t5.masks.encoder", ("chroma",), None, True, "the tokenizer mask goes into T5", f"{_M}/chroma.py:219"),
    Rule("t5.masks.denoiser_extra_pad_tokens", ("chroma",), None, 1,
         "the transformer attends to the real tokens plus one padding token (modify_mask_to_attend_padding(…, 1))",
         f"{_M}/chroma.py:389-403"),
    # ---- Lumina 2: the caption as it is, or with the dataset's caption_prefix in front
    Rule("gemma.tokenizer.system_prompt", ("lumina2",), "caption_prefix", "",
         "the caption goes to Gemma with only the dataset's caption_prefix in front; a prefix ending in "
         "'<Prompt Start> ' is the system prompt (unset: no system prompt)",
         f"{_M}/lumina_2.py:115-136; utils/dataset.py:48-57,733-763", convert="dp_lumina_system"),
    Rule("gemma.tokenizer.template", ("lumina2",), "caption_prefix", "",
         "the text before the caption is the dataset's caption_prefix", "utils/dataset.py:48-57,733-763",
         convert="dp_lumina_template",
         fix="caption_prefix = \"<system prompt> <Prompt Start> \" in the dataset TOML (the system prompt: see "
             "gemma.tokenizer.system_prompt)"),
    Rule("gemma.tokenizer.max_length", ("lumina2",), None, 256, "max_length=256, padding max_length",
         f"{_M}/lumina_2.py:119-125"),
    Rule("gemma.encoder.layer", ("lumina2",), None, "penultimate", "hidden_states[-2]", f"{_M}/lumina_2.py:131-135"),
    Rule("gemma.masks.encoder", ("lumina2",), None, True, "the tokenizer mask goes into Gemma", f"{_M}/lumina_2.py:131-134"),
    # ---- HiDream: the diffusers HiDreamImagePipeline's CLIP and T5 functions; Llama at prepare_inputs
    Rule("t5.tokenizer.max_length", ("hidream",), None, 128,
         "HiDreamImagePipeline._get_t5_prompt_embeds without max_sequence_length (diffusers' default 128)",
         f"{_M}/hidream.py:173-180"),
    Rule("llama.tokenizer.max_length", ("hidream",), "max_llama3_sequence_length", 128,
         "[model] max_llama3_sequence_length (default 128), padding max_length", f"{_M}/hidream.py:194-203"),
    # ---- Wan: its own copy of the Wan T5 (text_len 512, the reference's cleaning), zero-padded to text_len
    Rule("t5.tokenizer.max_length", ("wan",), None, 512, "text_len = 512", f"{_M}/wan/configs.py:11; {_M}/wan/t5.py:580"),
    Rule("t5.tokenizer.text_cleaning", ("wan",), None, "wan", "clean='whitespace' (ftfy, html.unescape, whitespace)",
         f"{_M}/wan/t5.py:580"),
    Rule("t5.masks.repad", ("wan",), None, "max_length", "each output is zero-padded to text_len",
         f"{_M}/wan/wan.py:319-330,494-496"),
    # ---- Qwen-Image: its own _get_qwen_prompt_embeds (the diffusers one, without the cut to 512)
    Rule("qwen.tokenizer.max_length", ("qwen-image",), None, 1024,
         "_get_qwen_prompt_embeds keeps up to tokenizer_max_length = 1024 tokens after the 34-token template prefix "
         "(the pipeline's __call__ keeps 512)", f"{_M}/qwen_image.py:332-384", captions="over512"),
    Rule("qwen.masks.repad", ("qwen-image",), None, "batch_longest",
         "each caption's real tokens are cached and padded to the batch's longest with the mask",
         f"{_M}/qwen_image.py:394-412"),
    # ---- AuraFlow: AuraFlowPipeline.encode_prompt with [model] max_sequence_length (required)
    Rule("t5.tokenizer.max_length", ("auraflow",), "max_sequence_length", 256,
         "[model] max_sequence_length goes to AuraFlowPipeline.encode_prompt (required; 768 for Pony-V7)",
         f"{_M}/auraflow.py:28,99-103; docs/supported_models.md:439"),
)

_QE = ("qwen-image-edit",)
#: diffusion-pipe's Edit template (models/qwen_image.py:184-185), the same for every version.
EDIT_TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                 "objects, background), then explain how the user's text instruction should alter or modify the image. "
                 "Generate a new image that meets the user's requirements while maintaining consistency with the "
                 "original input where appropriate.<|im_end|>\n<|im_start|>user\n"
                 "<|vision_start|><|image_pad|><|vision_end|>{prompt}<|im_end|>\n<|im_start|>assistant\n")

RULES += (
    # ---- Qwen-Image-Edit (type 'qwen_image' with control_path): one recipe for every version
    Rule("qwen.tokenizer.template", _QE, None, EDIT_TEMPLATE,
         "every Edit version is encoded with the original Edit template (the control image's vision tokens inline, "
         "no 'Picture N: ')", f"{_M}/qwen_image.py:184,356-360"),
    Rule("qwen.images.prefix", _QE, None, "", "no 'Picture N: ' prefix: one control image per caption, inside the "
         "template", f"{_M}/qwen_image.py:356-364"),
    Rule("qwen.images.area", _QE, None, 1024 * 1024,
         "each control image is scaled to a 1024x1024 area for Qwen2.5-VL (vlm_image_size = 1024) for every Edit "
         "version (2509/2511 use 384x384)", f"{_M}/qwen_image.py:187-188,314-330"),
    Rule("qwen.images.resize", _QE, None, "scale",
         "ImageOps.scale by 1024 / sqrt(h * w): the exact area, sides not rounded to multiples of 32 as the "
         "pipeline's calculate_dimensions does", f"{_M}/qwen_image.py:329-330", severity="warning"),
    Rule("qwen.images.resample", _QE, None, "bicubic", "ImageOps.scale's default filter (BICUBIC); the pipeline "
         "resizes with LANCZOS", f"{_M}/qwen_image.py:330", severity="warning"),
    Rule("qwen.tokenizer.drop_start_tokens", _QE, None, 64, "prompt_template_encode_start_idx_edit = 64",
         f"{_M}/qwen_image.py:185,358,382"),
    Rule("qwen.tokenizer.padding", _QE, None, "longest", "the processor pads to the batch's longest (padding=True)",
         f"{_M}/qwen_image.py:365-370"),
    Rule("qwen.encoder.layer", _QE, None, -1, "hidden_states[-1]", f"{_M}/qwen_image.py:380"),
    Rule("qwen.masks.repad", _QE, None, "batch_longest",
         "each caption's real tokens are cached and padded to the batch's longest with the mask",
         f"{_M}/qwen_image.py:381-382,394-412"),
)

SUPPORTED = ("flux", "sdxl", "sd3", "chroma", "lumina2", "hidream", "wan", "qwen-image", "auraflow", "hunyuanimage",
             "anima", "qwen-image-edit")
_COMFY = ("text encoding runs in its ComfyUI submodule (ComfyPipeline, models/base.py:541; ComfyUI pinned at "
          "9a9fdb10), whose code te-align has not read")
#: Families diffusion-pipe trains that te-align has no rules for, and why (te_align.audit.reach).
NOT_CHECKED = {f: _COMFY for f in ("z-image", "flux2", "flux2-klein", "krea2", "ideogram4", "ltx2")}
#: diffusion-pipe has no setting for its hard-coded encoding; te-align's hooks replace it where they reach.
NOT_SETTABLE = ("not settable in diffusion-pipe (hard-coded): run it with te-align's hooks (`te-align patch "
                "DIFFUSION_PIPE_CHECKOUT`), then cache again (the hooks' fingerprint forces it)")
NOT_HOOKED = "not settable in diffusion-pipe (hard-coded), and te-align's hooks do not reach this model type yet"

_CACHE = CacheSpec(("text_embeddings_*/metadata.db",), "the text encoder's index and the captions (HF datasets "
                   "fingerprint), no model or encoding setting", "utils/dataset.py:85-97,178-199; utils/cache.py:38-60",
                   "regenerate_cache = true (or --regenerate_cache), or delete <directory>/cache")
CACHES = {f: _CACHE for f in (*SUPPORTED, "qwen-image-edit")}
#: What te-align's hooks add to the text-embedding cache's fingerprint arguments.
FINGERPRINT_TAG = "te-align:"


# ------------------------------------------------------------------------------------ keys
@functools.cache
def valid_keys() -> dict[str, frozenset[str]]:
    """The keys diffusion-pipe reads, by section: ``top``, ``model``, ``dataset``, ``directory``."""
    return {k: v for k, v in known_keys("diffusion-pipe", "te_align.trainers.diffusion_pipe").items() if not k.startswith("required")}


@functools.cache
def required_keys() -> dict[str, dict[str, tuple[Any, str]]]:
    """Keys read without a default, by table: ``""`` (the training TOML's top level) and each ``[model] type``;
    each key -> (an example value, where it is read). From the bundled ``[required]`` / ``[required.<type>]``
    sections (lines ``key = VALUE  # file:line``)."""
    from te_align import _toml as tomllib

    out: dict[str, dict[str, tuple[Any, str]]] = {}
    for section, lines in known_keys("diffusion-pipe", "te_align.trainers.diffusion_pipe").items():
        if section != "required" and not section.startswith("required."):
            continue
        table = out.setdefault(section.partition(".")[2], {})
        for line in lines:
            key, _, rest = line.partition(" = ")
            value, _, where = rest.partition(" @ ")
            table[key] = (tomllib.loads(f"v = {value}")["v"], where)
    return out


def _missing_keys(data: dict[str, Any], model: dict[str, Any], mt_name: str, profile: str | None) -> list[Finding]:
    """A key diffusion-pipe reads with ``config['key']`` (no default) that the config lacks: it stops with a
    KeyError before training starts. The example value is the profile's where a rule maps the key to it."""
    out: list[Finding] = []
    req = required_keys()
    for table, have in (("", data), *([(mt_name, model)] if mt_name else [])):
        for key, (example, source) in sorted(req.get(table, {}).items()):
            if key in have:
                continue
            given = _profile_example(key, profile)
            said = f"the {profile} profile's value" if given is not None else "an example value"
            example = example if given is None else given
            where = "[model] " if table else ""
            out.append(Finding(
                kind="missing-key", severity="error", setting=f"model.{key}" if table else key, key=key,
                message=(f"{where}{key} is missing: diffusion-pipe reads it without a default"
                         f"{f' for [model] type {mt_name!r}' if table else ''} ({source}) and stops with "
                         f"KeyError: '{key}'"),
                fix=(f"add a [{key}] table (e.g. {_toml(example)[1:-1]})" if isinstance(example, dict) else
                     f"add {key} = {_toml(example)}{' to [model]' if table else ''} ({said})"),
                trainer_source=f"diffusion-pipe: {source}"))
    return out


def _profile_example(key: str, profile: str | None) -> Any:
    """The value of ``key`` that gives ``profile``'s setting (where a rule reads the key), else None."""
    if profile is None:
        return None
    prof = resolve(profile)
    for rule in RULES:
        if rule.key == key and rule.path is not None and rule.applies(prof.name, prof.family):
            try:
                value = rules.CONVERTERS[rule.convert].back(prof.get(f"slots.{rule.path}"), Context(values={},
                                                            profile_name=prof.name))
            except LookupError:
                continue
            return None if value is rules.REMOVE else value
    return None


def _toml(v: Any) -> str:
    """A TOML literal (one line)."""
    if isinstance(v, str):
        return f"'{v}'" if "'" not in v and "\n" not in v else json.dumps(v, ensure_ascii=False)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


# ------------------------------------------------------------------------------------ reading
def detect(raw: RawConfig) -> int | None:
    """A training TOML (``[model] type`` and ``dataset``/``output_dir``) or a dataset TOML (``[[directory]]``)."""
    if raw.fmt != "toml" or not isinstance(raw.data, dict):
        return None
    model = raw.data.get("model")
    if isinstance(model, dict) and "type" in model and any(k in raw.data for k in ("dataset", "output_dir", "epochs")):
        return 100
    directory = raw.data.get("directory")
    if isinstance(directory, list) and any(isinstance(d, dict) and "path" in d for d in directory):
        return 80
    return None


def _directories(dataset: dict[str, Any]) -> list[Any]:
    """A dataset TOML's ``[[directory]]`` entries (none when it has no list of them)."""
    directory = dataset.get("directory")
    return directory if isinstance(directory, list) else []


def _dataset(path: Any, config_file: str) -> tuple[dict[str, Any] | None, str | None]:
    """The dataset TOML a training TOML names (relative to the working folder, as train.py opens it, else to the
    training TOML's folder or one above it: the shipped examples name ``examples/dataset.toml``, relative to the
    checkout that train.py runs in)."""
    if not isinstance(path, str) or not path:
        return None, None
    here = Path(config_file).resolve().parent
    for candidate in (Path(path), *(folder / path for folder in [here, *here.parents][:4])):
        if candidate.is_file():
            raw = load(str(candidate))
            if raw.fmt != "toml" or not isinstance(raw.data, dict):
                raise UnreadableConfig("dataset: expected a TOML table", file=str(candidate))
            return raw.data, str(candidate)
    return None, None


#: Model-file name patterns that decide a family's variant (lower-cased name; first match wins). A name that only
#: says the family ("flux", "sd3") decides nothing.
VARIANT_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "flux": ((r"schnell", "flux-schnell"), (r"(?<![a-z])dev(?![a-z])", "flux-dev")),
    "sd3": ((r"3[._-]?5.{0,12}large|35l\b", "sd35-large"), (r"3[._-]?5.{0,12}medium|35m\b", "sd35-medium"),
            (r"sd[._-]?3[._-]medium|(?<![.\d])3[._-]medium", "sd3-medium")),
}


def _variant(mt: names.ModelType, model: dict[str, Any]) -> tuple[str, str, bool]:
    """(profile, why, only assumed) from every signal the model's files carry: the file names, a diffusers folder's
    transformer config (``guidance_embeds``), a single-file checkpoint's keys (``guidance_in``, as flux.py:114-119)."""
    import re

    assert mt.profile is not None
    patterns = VARIANT_NAMES.get(mt.type)
    if patterns is None:
        return mt.profile, f"[model] type {mt.type!r}", False
    for key in names.MODEL_FILES:
        value = model.get(key)
        if not isinstance(value, str):
            continue
        name = value.lower()
        for pattern, profile in patterns:
            if re.search(pattern, name):
                return profile, f"[model] type {mt.type!r} and {key} {value!r}", False
    if mt.type == "flux":
        signal = _flux_guidance(model)
        if signal is not None:
            has, where = signal
            return ("flux-dev" if has else "flux-schnell"), f"[model] type 'flux' and {where}", False
    for key in names.MODEL_FILES:  # a diffusers folder's configs, a checkpoint's tensor names
        found = profile_from_files(model.get(key))
        if found is not None and found[0] in dict(patterns).values():
            return found[0], f"[model] type {mt.type!r} and {key} {model[key]!r} (its files: {found[1]})", False
    return mt.profile, f"[model] type {mt.type!r}", True


def _flux_guidance(model: dict[str, Any]) -> tuple[bool, str] | None:
    """Whether the FLUX.1 transformer has a guidance embedder (dev) — read from the files, or None."""
    folder = model.get("diffusers_path")
    if isinstance(folder, str):
        cfg = Path(folder) / "transformer" / "config.json"
        if cfg.is_file():
            try:
                data = json.loads(cfg.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            if isinstance(data.get("guidance_embeds"), bool):
                return data["guidance_embeds"], f"{cfg} guidance_embeds = {str(data['guidance_embeds']).lower()}"
    path = model.get("transformer_path")
    if isinstance(path, str) and path.endswith((".safetensors", ".sft")) and Path(path).is_file():
        try:
            keys = read_header(path).tensors
        except (OSError, TeAlignError):
            return None
        has = any(k.startswith("guidance_in") or ".guidance_in." in k for k in keys)
        return has, f"transformer_path {path!r} {'has' if has else 'has no'} guidance_in weights (flux.py:114-119)"
    return None


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    if not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a TOML table", file=raw.file)
    lines = KeyLines(raw.text)
    keys = valid_keys()
    findings: list[Finding] = []
    if "model" not in raw.data and isinstance(raw.data.get("directory"), list):
        raise NotChecked("not checked: a diffusion-pipe dataset config names no model; check the training config that "
                         "names it (dataset = '…') — the model is set there", file=raw.file)
    model = raw.data.get("model")
    if not isinstance(model, dict):
        raise ConfigSyntaxError(raw.file, lines("model"), None, "wrong type/value for model: expected a [model] table")
    src = "diffusion-pipe: train.py and models/*.py read keys with .get"
    for k in raw.data:
        if k not in keys["top"]:
            findings.append(unknown_key_finding(k, keys["top"], trainer=src, line=lines(k),
                                                behaviour="diffusion-pipe never reads this key"))
    for k in model:
        if k not in keys["model"]:
            findings.append(unknown_key_finding(k, keys["model"], trainer=src, line=lines(k), section="model",
                                                behaviour="diffusion-pipe never reads this key"))
    dataset, dataset_file = _dataset(raw.data.get("dataset"), raw.file)
    dirs: list[str] = []
    srcs: list[CaptionSource] = []
    values: dict[str, Any] = dict(model)
    if dataset is not None and dataset_file is not None:
        dlines = KeyLines(read_text(dataset_file))
        for k in dataset:
            if k not in keys["dataset"]:
                findings.append(unknown_key_finding(k, keys["dataset"], trainer="diffusion-pipe: utils/dataset.py",
                                                    line=dlines(k), behaviour="diffusion-pipe never reads this key"))
        directories = _directories(dataset)
        prefixes = {str(d.get("caption_prefix", dataset.get("caption_prefix", ""))) for d in directories if isinstance(d, dict)}
        for i, d in enumerate(directories):
            if not isinstance(d, dict):
                continue
            if isinstance(d.get("path"), str):
                dirs.append(d["path"])
                prefix = d.get("caption_prefix", dataset.get("caption_prefix", ""))
                srcs.append(CaptionSource(folder=d["path"], extension=".txt", joiner="", recursive=False,
                                          prefix=prefix if isinstance(prefix, str) else "", source=CAPTION_SOURCE))
            for k in d:
                if k not in keys["directory"]:
                    findings.append(unknown_key_finding(k, keys["directory"], trainer="diffusion-pipe: utils/dataset.py",
                                                        line=dlines(k), section=f"directory[{i}]",
                                                        behaviour="diffusion-pipe never reads this key"))
        if len(prefixes) > 1:
            findings.append(Finding(kind="note", severity="info", setting="caption_prefix", message=(
                f"the directories use different caption_prefix values ({len(prefixes)}); checked with the first")))
        first = next((d for d in directories if isinstance(d, dict)), {})
        if "caption_prefix" in first or "caption_prefix" in dataset:
            values["caption_prefix"] = first.get("caption_prefix", dataset.get("caption_prefix"))
    elif isinstance(raw.data.get("dataset"), str):
        findings.append(Finding(kind="note", severity="info", setting="dataset", message=(
            f"dataset {raw.data['dataset']!r} not found (relative to the working folder or {Path(raw.file).parent}): "
            "its caption_prefix and captions are not checked")))
    mt_name = str(model.get("type") or "")
    mt = names.BY_TYPE.get(mt_name)
    findings += semantics.te_path_findings(model, mt_name, lines)
    trainer = _trainer(raw, lines, mt)
    cached = bool(model.get("cache_text_embeddings", True)) and mt_name != "sdxl"
    if mt is not None and mt.comfy_line:
        findings += _missing_keys(raw.data, model, mt_name, None)
        return Parsed(trainer, values, None, f"[model] type {mt_name!r}", cached, None, findings, SUPPORTED,
                      not_checked=comfy_reason(mt))
    control = dataset is not None and any(isinstance(d, dict) and "control_path" in d for d in _directories(dataset))
    if mt is not None and mt.type == "qwen_image" and control:
        edit = _qwen_edit(raw, model, values, trainer, cached, findings, dirs, lines)
        edit.caption_sources = srcs
        return edit
    if mt is None or mt.profile is None:
        findings += _missing_keys(raw.data, model, mt_name, None)
        what = mt.display if mt else mt_name
        return Parsed(trainer, values, None, f"[model] type {mt_name!r}", cached, None, findings, SUPPORTED,
                      not_checked=f"not checked: te-align has no profile for {what} (diffusion-pipe [model] type "
                                  f"{mt_name!r})")
    diffusers_path = model.get("diffusers_path")
    prof, reason, assumed = _variant(mt, model)
    findings += _missing_keys(raw.data, model, mt_name, prof)
    said = ""
    if assumed:
        said = assumption(prof, "the [model] file names or their files")
        if mt.type == "sd3" and said:
            said += "; every bundled SD3 profile encodes the same way"
        reason = f"{reason}; {prof} assumed" if said else reason
    if mt.type == "wan" and str(model.get("ckpt_path") or "").lower().find("2.2") >= 0:
        findings.append(Finding(kind="note", severity="info", setting="profile", message=(
            "Wan 2.2 is checked with the wan21 profile: diffusers' WanPipeline encodes both with the same umT5-XXL at "
            "512 tokens")))
    if mt.type == "sdxl":
        findings.append(Finding(kind="note", severity="info", setting="text-encoder cache", message=(
            "diffusion-pipe encodes SDXL captions at every step (no text-embedding cache, models/sdxl.py:426-428)")))
    return Parsed(trainer, values, prof, reason, cached, None, findings, SUPPORTED, guess_is_default=False,
                  caption_dirs=dirs, caption_sources=srcs, assumed=said,
                  # the pipeline's from_pretrained(diffusers_path) loads its tokenizers (models/flux.py:194 at 8f83dbf)
                  model_paths=[diffusers_path] if isinstance(diffusers_path, str) else [])


def comfy_reason(mt: names.ModelType) -> str:
    """Why a ComfyPipeline model type is not checked."""
    return (f"not checked: diffusion-pipe's [model] type {mt.type!r} ({mt.display}) is a ComfyPipeline "
            f"(models/{mt.module}.py:{mt.comfy_line}, models/base.py:541): its captions are encoded by ComfyUI's text "
            f"encoders (comfy.sd.load_clip, models/base.py:575-591) from the ComfyUI submodule pinned at "
            f"{names.COMFYUI_COMMIT[:8]}, whose code te-align has not read, so what it does is not known")


NO_EDIT_FIX = ("not settable in diffusion-pipe (hard-coded in models/qwen_image.py), and te-align's hooks leave the "
               "Edit image prompts unmodified: there is no fix in config")


def _edit_version(model: dict[str, Any]) -> tuple[str | None, str]:
    """The Qwen-Image-Edit version the model files' names say (diffusion-pipe has no key for it), and which key."""
    from te_align.audit.rules import guess_from_name

    for key in names.MODEL_FILES:
        value = model.get(key)
        guess = guess_from_name(value) if isinstance(value, str) else None
        if guess is not None and guess.startswith("qwen-image-edit"):
            return guess, f"{key} {value!r}"
    return None, ""


def _qwen_edit(raw: RawConfig, model: dict[str, Any], values: dict[str, Any], trainer: Trainer, cached: bool,
               findings: list[Finding], dirs: list[str], lines: KeyLines) -> Parsed:
    """[model] type 'qwen_image' with a control_path: Qwen-Image-Edit, every version through the original Edit
    template and a 1024x1024-area VL image (models/qwen_image.py:184-188,314-330,356-364)."""
    from te_align.audit.check import _refuse_unbundled
    from te_align.profiles.registry import bundled_names

    if not isinstance(raw.data, dict):  # parse read it as a table
        raise UnreadableConfig("expected a TOML table", file=raw.file)
    findings += _missing_keys(raw.data, model, "qwen_image", None)
    why = "[model] type 'qwen_image' with a dataset directory that has control_path (Qwen-Image-Edit)"
    version, said = _edit_version(model)
    if version is None:
        return Parsed(trainer, values, None, why, cached, None, findings, SUPPORTED, not_checked=(
            f"not checked: {why}, and diffusion-pipe has no key for the Edit version: the model files' names "
            f"({', '.join(k for k in names.MODEL_FILES if isinstance(model.get(k), str)) or 'none given'}) do not say "
            f"which; pass --profile {'|'.join(names.QWEN_EDIT_PROFILES)}"))
    why = f"{why} and {said}"
    uncond = raw.data.get("uncond_fraction")
    if isinstance(uncond, (int, float)) and not isinstance(uncond, bool) and uncond > 0:
        findings.append(Finding(
            kind="deviation", severity="warning", setting="empty_prompt", effective="T2I template, no image",
            profile="Edit template with the control image", key="uncond_fraction", line=lines("uncond_fraction"),
            source="code: huggingface/diffusers 0.42.1 src/diffusers/pipelines/qwenimage/pipeline_qwenimage_edit.py:"
                   "689-696 (the negative prompt is encoded with the image)",
            message=(f"uncond_fraction = {uncond:g}: the unconditional embedding is '' encoded with no control image, "
                     "so through the text-to-image template (34 tokens dropped), where the Edit pipelines encode "
                     "the negative prompt with the Edit template and the image"),
            fix="uncond_fraction = 0 (diffusion-pipe has no Edit-form unconditional embedding)",
            edit=Edit("uncond_fraction", 0),
            trainer_source="diffusion-pipe: utils/dataset.py:911-916; models/qwen_image.py:344-347"))
    if version not in bundled_names():
        try:
            _refuse_unbundled(version, why, raw.file)
        except NotChecked as e:
            return Parsed(trainer, values, None, why, cached, None, findings, SUPPORTED, not_checked=e.reason)
    from te_align.audit.rules import family_of

    trainer.rules = tuple(r for r in trainer.rules if "qwen-image" not in r.families)  # the T2I rows
    trainer.not_settable = NO_EDIT_FIX
    return Parsed(trainer, values, version, why, cached, None, findings, (*SUPPORTED, family_of(version)),
                  guess_is_default=False, caption_dirs=dirs)


def _trainer(raw: RawConfig, lines: KeyLines, mt: names.ModelType | None) -> Trainer:
    def fix_set(key: str, value: Any) -> str:
        where = "in the dataset TOML" if key == "caption_prefix" else "in [model]"
        return f"{key} = {json.dumps(value, ensure_ascii=False)} ({where})"

    def fix_remove(key: str) -> str:
        return f"remove {key}"

    return Trainer(NAME, RULES, fix_set, fix_remove, lines,
                   not_settable=NOT_SETTABLE if mt is not None and mt.hooked else NOT_HOOKED)


# ------------------------------------------------------------------------------------ the key table
def _config_keys(root: Path) -> dict[str, set[str]]:
    """Keys read with ``X.get('k')`` / ``X['k']`` where X names a config table, by section."""
    import ast

    sections = {"top": ("config",), "model": ("model_config", "config['model']", 'config["model"]'),
                "dataset": ("dataset_config",), "directory": ("directory_config",)}
    out: dict[str, set[str]] = {k: set() for k in sections}
    files = [root / "train.py", *sorted((root / "models").rglob("*.py")), *sorted((root / "utils").glob("*.py"))]
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            continue
        for node in ast.walk(tree):
            target = key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                target, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault", "pop")
                  and node.args and isinstance(node.args[0], ast.Constant)):
                target, key = node.func.value, node.args[0].value
            if target is None or not isinstance(key, str):
                continue
            text = ast.unparse(target).replace("self.", "")
            for section, spellings in sections.items():
                if text in spellings:
                    out[section].add(key)
    return out


def _unconditional_reads(tree: Any, spellings: tuple[str, ...]) -> dict[str, int]:
    """``X['key']`` reads (X spelled as one of ``spellings``) that run whenever their function runs: not inside one
    branch of an ``if`` (a key both branches read counts), a loop body, a ``try``, a lambda, the second operand of
    ``and``/``or`` or a later comprehension clause. ``if __name__ == '__main__':`` is a script's body and
    ``if is_main_process():`` runs on rank 0 of every run. key -> first line."""
    import ast

    def merge(*parts: dict[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in parts:
            for k, line in part.items():
                out[k] = min(line, out.get(k, line))
        return out

    def both(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {k: min(a[k], b[k]) for k in a.keys() & b.keys()}

    def block(nodes: list[Any]) -> dict[str, int]:
        return merge(*(reads(n) for n in nodes))

    def reads(node: Any) -> dict[str, int]:
        here: dict[str, int] = {}
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str) and ast.unparse(node.value) in spellings):
            here = {node.slice.value: node.lineno}
        if isinstance(node, ast.If):
            if "__name__" in ast.unparse(node.test) or ast.unparse(node.test) == "is_main_process()":
                return merge(reads(node.test), block(node.body))
            return merge(reads(node.test), both(block(node.body), block(node.orelse)) if node.orelse else {})
        if isinstance(node, ast.IfExp):
            return merge(reads(node.test), both(reads(node.body), reads(node.orelse)))
        if isinstance(node, ast.While):
            return reads(node.test)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            return reads(node.iter)
        if isinstance(node, ast.BoolOp):
            return reads(node.values[0])
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            return reads(node.generators[0].iter)
        if isinstance(node, (ast.Try, ast.Lambda, ast.Match)):
            return {}
        return merge(here, *(reads(n) for n in ast.iter_child_nodes(node)))

    return reads(tree)


def _defaulted(tree: Any, spellings: tuple[str, ...]) -> set[str]:
    """Keys given a default with ``X.setdefault('key', …)`` (train.py does that for several)."""
    import ast

    return {n.args[0].value for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "setdefault" and n.args
            and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
            and ast.unparse(n.func.value) in spellings}


def _example(value: Any, key: str) -> Any:
    """A documented value as an example: a file or folder path shortened to ``/path/to/<its name>``."""
    if isinstance(value, str) and "/" in value:
        return "/path/to/" + value.rstrip("/").rsplit("/", 1)[-1]
    return value


def _required(root: Path) -> dict[str, dict[str, tuple[Any, str]]]:
    """Keys read without a default: ``""`` (train.py's top level) and each profiled ``[model] type`` (its
    ``models/<module>.py``), with an example from examples/main_example.toml or the type's block in
    docs/supported_models.md."""
    import ast
    import re

    from te_align import _toml as tomllib

    model_names = ("self.model_config", "model_config", "config['model']", "self.config['model']")
    train = ast.parse((root / "train.py").read_text(encoding="utf-8"))
    defaulted = _defaulted(train, ("config", "model_config", "config['model']"))
    main = tomllib.loads((root / "examples" / "main_example.toml").read_text(encoding="utf-8"))
    docs: dict[str, dict[str, Any]] = {}
    text = (root / "docs" / "supported_models.md").read_text(encoding="utf-8")
    for body in re.findall(r"^```[^\n`]*\n(.*?)^```", text, re.S | re.M):
        try:
            model = tomllib.loads(body).get("model")
        except tomllib.TOMLDecodeError:
            continue
        if isinstance(model, dict) and isinstance(model.get("type"), str):
            docs.setdefault(model["type"], model)
    out: dict[str, dict[str, tuple[Any, str]]] = {"": {}}
    for key, line in _unconditional_reads(train, ("config",)).items():
        if key not in defaulted and key in main and key != "model":  # no [model]: an unreadable config already
            value = main[key]
            if isinstance(value, dict):  # a table: its type names it
                value = {k: v for k, v in value.items() if k == "type"}
            out[""][key] = (_example(value, key), f"train.py:{line}")
    model_train = {k: line for k, line in _unconditional_reads(train, model_names[1:]).items() if k not in defaulted}
    for mt in names.TYPES:
        if mt.profile is None:
            continue
        path = root / "models" / (mt.module.replace(".", "/") + ".py")
        found = {k: line for k, line in _unconditional_reads(ast.parse(path.read_text(encoding="utf-8")),
                                                             model_names).items() if k not in defaulted}
        table: dict[str, tuple[Any, str]] = {}
        for key, line in sorted({**{k: -1 for k in model_train}, **found}.items()):
            where = f"models/{mt.module.replace('.', '/')}.py:{line}" if key in found else f"train.py:{model_train[key]}"
            example = docs.get(mt.type, {}).get(key, main["model"].get(key) if key != "type" else mt.type)
            if example is not None:
                table[key] = (_example(example, key), where)
        out[mt.type] = table
    return out


def _main(argv: list[str] | None = None) -> int:
    """``python -m te_align.trainers.diffusion_pipe.audit CHECKOUT [--write] [--commit SHA]``: the bundled key table."""
    args = sys.argv[1:] if argv is None else argv
    if not args or not (Path(args[0]) / "train.py").is_file() or not (Path(args[0]) / "models").is_dir():
        print("usage: python -m te_align.trainers.diffusion_pipe.audit DIFFUSION_PIPE_CHECKOUT [--write]", file=sys.stderr)
        return 2
    root = Path(args[0])
    commit = checkout_commit(root, args)
    lines = [f"# Generated by `python tools/gen_audit_keys.py diffusion-pipe CHECKOUT --write` from "
             f"tdrussell/diffusion-pipe@{commit}.",
             "# Keys diffusion-pipe reads (config.get / config[...] in train.py, models/, utils/), by table."]
    for section, keys in _config_keys(root).items():
        lines.append(f"[{section}]")
        lines += sorted(keys)
    lines += ["# Keys read with config['key'] on every run (no default: KeyError when missing), as",
              "# `key = example @ file:line`: [required] the training TOML's top level, [required.<type>] its [model]."]
    for section, table in _required(root).items():
        lines.append(f"[required{'.' + section if section else ''}]")
        lines += [f"{key} = {_toml(value)} @ {where}" for key, (value, where) in sorted(table.items())]
    return emit_key_table(lines, args, Path(__file__).with_name("data") / "diffusion-pipe.txt")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
