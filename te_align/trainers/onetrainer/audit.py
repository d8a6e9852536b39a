"""Nerogar/OneTrainer config JSON (TrainConfig).

Facts read at Nerogar/OneTrainer@23df3832e8f213d64c337e39f9365ba46e99fed0; ``source`` gives file:line at that
commit. BaseConfig.from_dict reads known keys only and ignores the rest silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from te_align.audit import rules
from te_align.audit.findings import Edit, Finding
from te_align.audit.models import _families as bundled_families
from te_align.audit.models import assumption, guess_model
from te_align.audit.parsed import (
    CacheSpec,
    CaptionSource,
    KeyLines,
    Parsed,
    dropout_form_finding,
    expect_mapping,
    reason,
    unknown_key_finding,
)
from te_align.audit.readers import NotChecked, RawConfig, UnreadableConfig, known_keys
from te_align.audit.rules import Context, Rule, Trainer, no_fix_set
from te_align.profiles.registry import bundled_name
from te_align.trainers.onetrainer import names

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

#: OneTrainer has no setting for hard-coded encoding; its launch scripts run te-align's hooks once patched.
NOT_SETTABLE = (
    "not settable in OneTrainer (hard-coded): run it through te-align with `te-align patch ONETRAINER_CHECKOUT`"
)

_MM = "modules/model"

# ------------------------------------------------------------------------------------ converters
def _ot_skip(base: int) -> tuple[Callable[[Any, Context], Any], Callable[[Any, Context], Any]]:
    # OneTrainer encode_clip: hidden_states[default_layer - layer_skip]; default_layer -1 (SD1/2) or -2 (SDXL/SD3).
    names = {-1: "last", -2: "penultimate"}

    def to(v: Any, ctx: Context) -> Any:
        idx = base - (rules.int_or_none(v) or 0)
        return names.get(idx, idx)

    def back(p: Any, ctx: Context) -> Any:
        idx = {"last": -1, "penultimate": -2}.get(p, p)
        if not isinstance(idx, int) or idx > base:
            raise LookupError
        return base - idx

    return to, back


def _ot_nullable_len(v: Any, ctx: Context) -> Any:
    # OneTrainer Flux: null -> tokenizer_2.model_max_length (512 for the T5-XXL tokenizer).
    n = rules.int_or_none(v)
    return 512 if n is None else n


rules.register("ot_skip_last", *_ot_skip(-1), "int")
rules.register("ot_skip_penultimate", *_ot_skip(-2), "int")
rules.register("ot_nullable_len", _ot_nullable_len, rules.CONVERTERS["same"].back, "int")


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
    # ---- PixArt-Σ (PixArtAlphaModel.encode_text)
    Rule("t5.tokenizer.max_length", ("pixart",), None, 120,
         "T5 max_length hard-coded to 120 (the 300 for PixArt-Σ is commented out 'for performance reasons')",
         f"{_MM}/PixArtAlphaModel.py:190-202"),
    Rule("t5.tokenizer.text_cleaning", ("pixart",), None, "none",
         "captions go to the T5 tokenizer as they are: no PixArt caption cleaning and no lower-casing",
         f"{_MM}/PixArtAlphaModel.py:196-202"),
    Rule("t5.masks.encoder", ("pixart",), None, True, "the tokenizer mask goes into T5",
         f"{_MM}/PixArtAlphaModel.py:205-216"),
    Rule("t5.encoder.layer", ("pixart", "chroma"), "text_encoder_layer_skip", 0,
         "hidden_states[-1 - layer_skip] (encode_t5 default_layer=-1)",
         f"{_MM}/PixArtAlphaModel.py:209-216; {_MM}/ChromaModel.py:210-219", convert="ot_skip_last"),
    # ---- Sana (SanaModel.encode_text)
    Rule("gemma.tokenizer.max_length", ("sana",), None, 300, "Gemma max_length 300", f"{_MM}/SanaModel.py:144-152"),
    Rule("gemma.tokenizer.system_prompt", ("sana",), None, None,
         "the caption is tokenized alone: no complex-human instruction in front (and no BOS + last-299 window)",
         f"{_MM}/SanaModel.py:144-152"),
    Rule("gemma.tokenizer.text_cleaning", ("sana",), None, "none", "captions are not lower-cased",
         f"{_MM}/SanaModel.py:144-152"),
    Rule("gemma.masks.encoder", ("sana",), None, True, "the tokenizer mask goes into Gemma",
         f"{_MM}/SanaModel.py:156-167"),
    Rule("gemma.encoder.layer", ("sana",), "text_encoder_layer_skip", 0,
         "hidden_states[-1 - layer_skip] (encode_gemma default_layer=-1)", f"{_MM}/SanaModel.py:160-167",
         convert="ot_skip_last"),
    # ---- Chroma (ChromaModel.encode_text)
    Rule("t5.masks.encoder", ("chroma",), None, True, "the mask (real tokens + one pad token) goes into T5",
         f"{_MM}/ChromaModel.py:200-219"),
    Rule("t5.masks.denoiser_extra_pad_tokens", ("chroma",), None, 1,
         "the mask keeps the real tokens plus one pad token (mask_indices <= seq_lengths)",
         f"{_MM}/ChromaModel.py:200-203"),
)

#: FLUX.2 dev's system message as OneTrainer writes it: a space after "object" where diffusers has a newline.
FLUX2_SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured responses focusing "
                        "on object relationships, object attribution and actions without speculation.")
#: What "no key fixes this" says for the model types te-align's OneTrainer hooks do not encode.
NOT_HOOKED = ("not settable in OneTrainer (hard-coded), and te-align's OneTrainer hooks do not encode this model type: "
              "the fix is a change to OneTrainer's code")
_F2 = f"{_MM}/Flux2Model.py"
_SEQ = "modules/util/config/TrainConfig.py:1152"
_F2L = "modules/dataLoader/Flux2BaseDataLoader.py"  # the training path (mgds Tokenize + Encode*Text)

NEW_RULES: tuple[Rule, ...] = (
    # ---- FLUX.2 (model_type FLUX_2): dev (Mistral) or klein (Qwen3) by the transformer's head count
    Rule("mistral.tokenizer.system_prompt", ("flux2",), None, FLUX2_SYSTEM_MESSAGE,
         "MISTRAL_SYSTEM_MESSAGE has a space after 'object' where diffusers' SYSTEM_MESSAGE has a newline: other "
         "tokens in every prompt's system turn", f"{_F2}:25,151-157; {_F2L}:43-44"),
    Rule("mistral.tokenizer.max_length", ("flux2",), "text_encoder_sequence_length", 512,
         "text_encoder_sequence_length (default 512) is the tokenizer's max_length over the whole chat text, "
         "padding='max_length', truncation", f"{_F2}:158-165; {_F2L}:43; {_SEQ}"),
    Rule("mistral.encoder.layer", ("flux2",), None, (10, 20, 30),
         "hidden_states MISTRAL_HIDDEN_STATES_LAYERS [10, 20, 30] concatenated on the width", f"{_F2}:26,194-197; {_F2L}:46-49"),
    Rule("qwen3.tokenizer.max_length", ("flux2-klein",), "text_encoder_sequence_length", 512,
         "text_encoder_sequence_length (default 512): tokenizer max_length, padding='max_length', truncation",
         f"{_F2}:176-183; {_F2L}:51; {_SEQ}"),
    Rule("qwen3.tokenizer.enable_thinking", ("flux2-klein",), None, False,
         "apply_chat_template(add_generation_prompt=True, enable_thinking=False)", f"{_F2}:166-174; {_F2L}:52"),
    Rule("qwen3.encoder.layer", ("flux2-klein",), None, (9, 18, 27),
         "hidden_states QWEN3_HIDDEN_STATES_LAYERS [9, 18, 27] concatenated on the width", f"{_F2}:27,194-197; {_F2L}:54-55"),
    # ---- Z-Image (model_type Z_IMAGE)
    Rule("qwen3.tokenizer.max_length", ("z-image",), None, 512, "PROMPT_MAX_LENGTH 512, padding='max_length'",
         f"{_MM}/ZImageModel.py:24,129-134; modules/dataLoader/ZImageBaseDataLoader.py:38"),
    Rule("qwen3.encoder.layer", ("z-image",), None, -2, "hidden_states[-2]",
         f"{_MM}/ZImageModel.py:147; modules/dataLoader/ZImageBaseDataLoader.py:42"),
    Rule("qwen3.tokenizer.enable_thinking", ("z-image",), None, True,
         "apply_chat_template(add_generation_prompt=True, enable_thinking=True)", f"{_MM}/ZImageModel.py:120-126; modules/dataLoader/ZImageBaseDataLoader.py:39"),
)
_K2 = f"{_MM}/Krea2Model.py"
_K2L = "modules/dataLoader/Krea2BaseDataLoader.py"  # mgds Tokenize(suffix_text=...) + EncodeQwenText(cumsum positions)
#: Krea 2's template as OneTrainer writes it: PROMPT_TEMPLATE_PREFIX + the caption + PROMPT_TEMPLATE_SUFFIX.
KREA2_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                  "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{prompt}"
                  "<|im_end|>\n<|im_start|>assistant\n")
_ID = f"{_MM}/IdeogramModel.py"
_IDL = "modules/dataLoader/IdeogramBaseDataLoader.py"  # mgds Tokenize(apply_chat_template=...) + EncodeIdeogramText
#: The Qwen3-VL chat template's rendering of one user message with the generation prompt (what apply_chat_template
#: gives for [{"role": "user", "content": [{"type": "text", "text": caption}]}], add_generation_prompt=True).
IDEOGRAM_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"

NEW_RULES += (
    # ---- Krea 2 (model_type KREA_2): Krea2Model.encode_text (sampling) and the data loader's mgds modules (training)
    Rule("qwen.tokenizer.template", ("krea2",), None, KREA2_TEMPLATE,
         "PROMPT_TEMPLATE_PREFIX + caption, PROMPT_TEMPLATE_SUFFIX tokenized alone", f"{_K2}:29-34,151-161; {_K2L}:48-50"),
    Rule("qwen.tokenizer.max_length", ("krea2",), None, 512,
         "PROMPT_MAX_LENGTH 512: prefix + caption padded to 512 + 34 - 5 tokens (padding='max_length', truncation)",
         f"{_K2}:35-40,151-157; {_K2L}:48-49"),
    Rule("qwen.tokenizer.suffix_after_padding", ("krea2",), None, True,
         "the suffix's 5 tokens are concatenated after the padded block ([prefix | caption | PAD | suffix])",
         f"{_K2}:158-163; {_K2L}:46-50"),
    Rule("qwen.tokenizer.drop_start_tokens", ("krea2",), None, 34, "PROMPT_TEMPLATE_CROP_START 34 positions dropped",
         f"{_K2}:35-36,184-185; {_K2L}:53"),
    Rule("qwen.encoder.position_ids", ("krea2",), None, "real_tokens",
         "position_ids = (mask.cumsum(-1) - 1).clamp(min=0) on the 3 M-RoPE axes (cumsum_position_ids=True in training)",
         f"{_K2}:167-175; {_K2L}:53"),
    Rule("qwen.encoder.layer", ("krea2",), None, (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),
         "TEXT_ENCODER_SELECT_LAYERS (2, 5, ..., 35) of hidden_states", f"{_K2}:24,181-183; {_K2L}:52"),
    Rule("qwen.encoder.layer_combine", ("krea2",), None, "stack",
         "stacked per token (batch, sequence, layers, width); flattened for the cache and unflattened before the "
         "transformer", f"{_K2}:181-186,216-221"),
    Rule("qwen.masks.denoiser", ("krea2",), None, True,
         "the padding is pruned per caption and the bool mask of the real tokens goes to the transformer (text tokens "
         "sit at the RoPE origin, so moving the suffix next to the caption changes nothing the transformer sees)",
         f"{_K2}:191-222; {_K2L}:54,99"),
    # ---- Ideogram 4 (model_type IDEOGRAM_4): IdeogramModel.encode_text (sampling), mgds Tokenize + EncodeIdeogramText
    Rule("qwen.tokenizer.template", ("ideogram4",), None, IDEOGRAM_TEMPLATE,
         "apply_chat_template([{'role': 'user', 'content': [{'type': 'text', ...}]}], add_generation_prompt=True)",
         f"{_ID}:114-121; {_IDL}:40-45"),
    Rule("qwen.tokenizer.max_length", ("ideogram4",), None, 2048, "PROMPT_MAX_LENGTH 2048, padding='max_length'",
         f"{_ID}:5,123-130; {_IDL}:42"),
    Rule("qwen.tokenizer.truncation", ("ideogram4",), None, True,
         "truncation=True: a caption over 2048 tokens is cut to 2048 where the pipeline refuses it (only such "
         "captions differ)", f"{_ID}:123-130; {_IDL}:40-45 (mgds Tokenize: truncation=True)", severity="info"),
    Rule("qwen.tokenizer.padding_side", ("ideogram4",), None, "left",
         "tokenized right-padded with position ids arange(L), so the real tokens sit at 0..n-1 as in the pipeline's "
         "left-padded layout (causal attention: the padding after them is never seen), padding zeroed, then each "
         "caption's features are moved to the end of the text block ([pad][text][image], the pipeline's layout)",
         f"{_ID}:136-164; {_IDL}:37-39"),
    Rule("qwen.encoder.position_ids", ("ideogram4",), None, "real_tokens",
         "position_ids arange from 0 at the first (real) token", f"{_ID}:136-138"),
    Rule("qwen.encoder.layer", ("ideogram4",), None, (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 35),
         "Ideogram4Pipeline._get_text_encoder_hidden_states: the pipeline's own decoder-layer taps",
         f"{_ID}:139; {_IDL}:46-50"),
    Rule("qwen.encoder.layer_taps", ("ideogram4",), None, "decoder_layers",
         "the pipeline's _get_text_encoder_hidden_states taps decoder-layer outputs (the last before the final norm)",
         f"{_ID}:139"),
    Rule("qwen.encoder.layer_combine", ("ideogram4",), None, "interleave",
         "stack(dim=0).permute(1, 2, 3, 0).reshape: width-major, layer fastest", f"{_ID}:141-143"),
    Rule("qwen.masks.zero_padded", ("ideogram4",), None, True, "padding positions multiplied by the mask",
         f"{_ID}:148-149"),
)
RULES = RULES + NEW_RULES  # one table (te_align.audit.reach counts RULES)

SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "hidream", "qwen-image", "pixart", "sana", "anima", "flux2",
             "flux2-klein", "z-image", "krea2", "ideogram4")
#: Families where a text encoder's dropout_probability > 0 raises NotImplementedError (OneTrainer issue 957).
_NO_DROPOUT = {"qwen-image": f"{_MM}/QwenModel.py:138-139", "flux2": f"{_F2}:199-200",
               "flux2-klein": f"{_F2}:199-200", "z-image": f"{_MM}/ZImageModel.py:149-150",
               "krea2": f"{_K2}:188-189", "ideogram4": f"{_ID}:145-146"}

#: Where a text-encoder part's dropout_probability zeroes the embeddings (a dropped caption = zeros).
_DROPOUT_SOURCE = {
    "sd1": f"{_MM}/StableDiffusionModel.py:272-277", "sd2": f"{_MM}/StableDiffusionModel.py:272-277",
    "sdxl": f"{_MM}/StableDiffusionXLModel.py:298-309", "chroma": f"{_MM}/ChromaModel.py:227-232",
    "pixart": f"{_MM}/PixArtAlphaModel.py:225-231", "sana": f"{_MM}/SanaModel.py:176-182",
}

_CACHE = CacheSpec(("text/**/*.pt",), "folder = sha256 of the concept settings; no length, layer skip or mask",
                   "modules/dataLoader/mixin/DataLoaderText2ImageMixin.py:335-352",
                   '"clear_cache_before_training": true (with "latent_caching": true) or delete <cache_dir>/text')
CACHES = {f: _CACHE for f in SUPPORTED}

_PARTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4", "transformer", "unet", "prior",
          "decoder", "vae", "effnet_encoder", "decoder_text_encoder", "decoder_vqgan", "unconditional_transformer")


def guess_profile(values: dict[str, Any]) -> tuple[str | None, str]:
    """The bundled profile a config trains: its model_type (the one model-type table,
    :mod:`te_align.trainers.onetrainer.names`), the variant from the transformer override's or base model's files or
    names. Where nothing decides between two profiles of a family, the reason carries the assumption."""
    mt = names.model_type_name(values.get("model_type"))
    prof, _ = names.profile_of(mt)
    if prof is None:
        return None, f"model_type {mt!r}"
    if mt == "FLUX_2":  # dev or klein: OneTrainer asks the transformer (num_attention_heads == 48 is dev)
        for key in ("transformer.model_name", "base_model_name"):
            path = values.get(key)
            by, detail, decided = guess_model(path)
            if by in ("flux2-dev", "flux2-klein-4b", "flux2-klein-9b") and decided:
                return by, f"model_type {mt!r} and {key} {path!r}{detail}"
        # no guess: `check` asks for --profile (a dev profile on a klein model would check other slots)
        return None, (f"model_type {mt!r} (OneTrainer tells FLUX.2 dev from klein by the transformer's head count, "
                      f"{_F2}:204-208, and base_model_name {values.get('base_model_name')!r} does not say which: "
                      "flux2-dev, flux2-klein-4b or flux2-klein-9b)")
    for key in ("transformer.model_name", "base_model_name"):
        path = values.get(key)
        by, detail, decided = guess_model(path)
        if by and decided and bundled_name(by) is None:  # a version te-align has no profile for: never prof
            return by, f"model_type {mt!r} and {key} {path!r}{detail}"
        if by and decided and _same_family(by, prof):
            return by, f"model_type {mt!r} and {key} {path!r}{detail}"
    said = assumption(prof, "base_model_name or transformer.model_name (their names or files)")
    return prof, (reason(f"model_type {mt!r}; {prof} assumed", said) if said else f"model_type {mt!r}")


def _same_family(a: str, b: str) -> bool:
    fams = bundled_families()
    return (fams.get(a) or a) == (fams.get(b) or b)  # a profile not bundled is its own family here


_MARKERS = ("training_method", "base_model_name", "text_encoder_2_sequence_length", "concept_file_name", "__version")


def _is_concepts_file(data: Any) -> bool:
    """OneTrainer's concepts file (``concept_file_name``): a JSON list of concepts, each with ``path`` and its
    ``image`` / ``text`` settings."""
    return (isinstance(data, list) and bool(data) and all(isinstance(d, dict) and "path" in d for d in data)
            and any("image" in d or "text" in d or "balancing" in d for d in data))


def detect(raw: RawConfig) -> int | None:
    """A OneTrainer config: JSON with ``model_type`` and one of OneTrainer's own keys; or its concepts file."""
    if raw.fmt == "json" and _is_concepts_file(raw.data):
        return 60
    if raw.fmt != "json" or not isinstance(raw.data, dict):
        return None
    keys = {str(k).lstrip("-") for k in raw.data}
    return 85 if "model_type" in keys and any(k in keys for k in _MARKERS) else None


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    if raw.fmt == "json" and _is_concepts_file(raw.data):
        raise NotChecked("not checked: a OneTrainer concepts file names no model; check the training config that uses "
                         "it (concept_file_name) — the model is set there", file=raw.file)
    if not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a JSON object", file=raw.file)
    valid = known_keys("onetrainer", "te_align.trainers.onetrainer")
    legacy = {}
    for entry in valid.get("legacy", ()):
        name, _, below = entry.partition(" ")
        legacy[name] = int(below) if below.isdigit() else 0
    version = raw.data.get("__version")
    version = version if isinstance(version, int) and not isinstance(version, bool) else None
    lines = KeyLines(raw.text)
    values: dict[str, Any] = {}
    findings = []
    for k, v in raw.data.items():
        values[k] = v
        if k not in valid["top"]:
            # keys an older config version had: the config migration consumes them (TrainConfig.__migration_N)
            if k in legacy and (version is None or version < legacy[k]):
                continue
            findings.append(unknown_key_finding(
                k, valid["top"], trainer="OneTrainer: modules/util/config/BaseConfig.py:66", line=lines(k),
                behaviour="OneTrainer reads known keys only and ignores this one silently"))
        elif k in _PARTS and v is not None:
            for pk, pv in expect_mapping(v, k, raw.file, lines).items():
                values[f"{k}.{pk}"] = pv
                if pk not in valid["part"]:
                    findings.append(unknown_key_finding(
                        pk, valid["part"], trainer="OneTrainer: modules/util/config/TrainConfig.py:295",
                        line=lines(pk), section=k,
                        behaviour="OneTrainer reads known keys only and ignores this one silently"))
    prof, reason = guess_profile(values)
    mt = str(values.get("model_type") or "")
    if mt in names.NO_PROFILE:
        return Parsed(Trainer("onetrainer", RULES, no_fix_set, str), values, None, reason, False, None, findings,
                      SUPPORTED, not_checked=f"not checked: te-align has no profile for {names.NO_PROFILE[mt]} "
                                            f"(OneTrainer model_type {mt!r})")
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

    def after(profile: AlignmentProfile, ctx: Context) -> list[Finding]:
        out: list[Finding] = []
        for part in ("text_encoder", "text_encoder_2"):
            key = f"{part}.dropout_probability"
            rate = values.get(key)
            if profile.family in _NO_DROPOUT and _positive(rate):
                what = "Qwen" if profile.family == "qwen-image" else profile.family
                out.append(Finding(
                    kind="unused-value", severity="error", setting=key, effective=rate, key=key,
                    message=f"{key} = {rate}: OneTrainer raises NotImplementedError for {what} caption dropout",
                    fix=fix_set(key, 0.0), trainer_source=f"OneTrainer: {_NO_DROPOUT[profile.family]}",
                    line=lines("dropout_probability")))
            elif profile.family in _DROPOUT_SOURCE:
                out += dropout_form_finding(
                    profile, rate, "zeros", key=key, trainer="OneTrainer",
                    source=f"{_DROPOUT_SOURCE[profile.family]} (a dropped caption's embeddings are multiplied by 0)",
                    line=lines("dropout_probability"),
                    fix=f"{fix_set(key, 0.0)} (OneTrainer cannot drop captions as an encoded \"\")")
        out += unread_lr_findings(values, lambda part: _line_in_part(raw.text, part, "learning_rate"))
        return out

    hooked = names.profile_of(mt)[1] if mt else True
    trainer = Trainer("onetrainer", RULES, fix_set, fix_remove, lambda key: lines(key.rsplit(".", 1)[-1]),
                      not_settable=NOT_SETTABLE if hooked or mt == "ANIMA" else NOT_HOOKED)
    srcs = caption_sources(raw.data, raw.file)
    return Parsed(trainer, values, prof, reason, cached, None, findings, SUPPORTED, after=after,
                  assumed=getattr(reason, "assumed", ""), caption_sources=srcs,
                  model_paths=[values["base_model_name"]] if isinstance(values.get("base_model_name"), str) else [])


#: OneTrainer's captions, read at Nerogar/OneTrainer@23df383 (with Nerogar/mgds@3a6994a): the concepts are the
#: config's "concepts", else the JSON file concept_file_name (default "training_concepts/concepts.json",
#: modules/util/config/TrainConfig.py:982-987,1051); an enabled concept's images are its path's files, sub-folders
#: only with include_subdirectories (default false; ConceptConfig.py:186-192,
#: modules/dataLoader/mixin/DataLoaderText2ImageMixin.py:70-72); text.prompt_source "sample" (the default,
#: ConceptConfig.py:109) reads IMAGE.txt (:78), each line stripped, empty lines dropped, one line chosen per step
#: (mgds src/mgds/pipelineModules/LoadMultipleTexts.py:25-50; DataLoaderText2ImageMixin.py:105-113); with
#: text.enable_tag_shuffling the line is split at tag_delimiter (default ","), tags stripped, empty ones dropped, and
#: joined with the delimiter and a space (mgds ShuffleTags.py:40-47; DataLoaderText2ImageMixin.py:234;
#: ConceptConfig.py:111-113).
CAPTION_SOURCE = ("Nerogar/OneTrainer@23df383 modules/dataLoader/mixin/DataLoaderText2ImageMixin.py:70-113, "
                  "Nerogar/mgds@3a6994a src/mgds/pipelineModules/LoadMultipleTexts.py:25-50")


def caption_sources(data: Any, file: str) -> list[CaptionSource]:
    """The enabled training concepts' folders with OneTrainer's caption reading ("sample" prompts); a concept whose
    prompts come from elsewhere is named, not read."""
    concepts = data.get("concepts") if isinstance(data, dict) else None
    if not isinstance(concepts, list):
        name = data.get("concept_file_name", "training_concepts/concepts.json") if isinstance(data, dict) else None
        concepts = _concepts_file(name, file) if isinstance(name, str) else []
    out: list[CaptionSource] = []
    for c in concepts:
        if not (isinstance(c, dict) and isinstance(c.get("path"), str) and c["path"]) or c.get("enabled") is False:
            continue
        if str(c.get("type", "STANDARD")).upper().endswith("VALIDATION"):
            continue
        text_section = c.get("text")
        text: dict[str, Any] = text_section if isinstance(text_section, dict) else {}
        source = text.get("prompt_source", "sample")
        if source != "sample":
            why = {"filename": "the captions are the image file names",
                   "concept": f"one prompt file for the whole concept ({text.get('prompt_path', '')})"}.get(
                str(source), "not a caption file per image")
            out.append(CaptionSource(folder=c["path"], source=CAPTION_SOURCE, skip=f"prompt_source {source!r}: {why}"))
            continue
        shuffle = text.get("enable_tag_shuffling") is True
        delimiter = text.get("tag_delimiter", ",")
        delimiter = delimiter if isinstance(delimiter, str) and delimiter else ","
        out.append(CaptionSource(folder=c["path"], extension=".txt", each_line=True,
                                 recursive=c.get("include_subdirectories") is True,
                                 rejoin=(delimiter, delimiter + " ") if shuffle else None, rejoin_strip=True,
                                 rejoin_drop_empty=True, length_invariant=("enable_tag_shuffling",) if shuffle else (),
                                 source=CAPTION_SOURCE))
    return out


def _concepts_file(name: str, config_file: str) -> list[Any]:
    """The concepts JSON OneTrainer reads (relative to where OneTrainer runs; te-align also tries beside the
    config); [] when it is not here or not readable."""
    from pathlib import Path

    for p in (Path(name), Path(config_file).parent / name):
        if p.is_file():
            try:
                data = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError, RecursionError):
                return []
            return data if isinstance(data, list) else []
    return []


#: Where OneTrainer reads a model part's learning_rate: only for a part it trains (read at 23df383).
PART_LR_SOURCE = ("modules/modelSetup/BaseModelSetup.py:185-195 (_create_model_part_parameters returns before the "
                  "part's parameter group when its train is false); modules/util/NamedParameterGroup.py:40 (a "
                  "learning_rate of null takes the global learning_rate)")


def _line_in_part(text: str, part: str, key: str) -> int | None:
    """The line of ``"key":`` inside the ``"part": {`` object of a OneTrainer JSON (None: not found)."""
    import re

    start = re.search(rf'"{re.escape(part)}"\s*:\s*\{{', text)
    hit = re.search(rf'"{re.escape(key)}"\s*:', text[start.end():]) if start else None
    return text.count("\n", 0, start.end() + hit.start()) + 1 if start and hit else None


def unread_lr_findings(values: dict[str, Any], line: Any) -> list[Finding]:
    """A text encoder's learning_rate given while its ``train`` is false: OneTrainer makes no parameter group for
    that encoder, so nothing trains at the rate."""
    out: list[Finding] = []
    for part in ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4"):
        key, lr = f"{part}.learning_rate", values.get(f"{part}.learning_rate")
        if lr is None or _on(values.get(f"{part}.train", True)):
            continue
        out.append(Finding(
            kind="unused-value", severity="warning", setting=key, effective=lr, key=key, line=line(part),
            message=(f"{key} = {lr} is not read: {part}.train is false, so OneTrainer trains no {part} and nothing "
                     "trains at this rate"),
            fix=f'remove "{key}" (or set "{part}": {{"train": true}} to train it at this rate)',
            trainer_source=f"OneTrainer: {PART_LR_SOURCE}", edit=Edit(key, remove=True)))
    return out


def _positive(v: Any) -> bool:
    try:
        return float(v) > 0
    except (TypeError, ValueError):
        return False


def _on(v: Any) -> bool:
    return bool(v) and v not in ("false", "False", "0")
