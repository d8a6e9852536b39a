"""kohya-ss/musubi-tuner: a training or text-encoder caching command line (``accelerate launch
src/musubi_tuner/qwen_image_train_network.py ARGS``), its ``--config_file`` TOML (sections flattened into the argument
namespace, as sd-scripts does) and its ``--dataset_config`` TOML (``[general]`` + ``[[datasets]]``).

musubi-tuner encodes captions in a separate step: ``<arch>_cache_text_encoder_outputs.py`` writes every caption's
text-encoder output to ``*_<short>_te.safetensors`` in each dataset's ``cache_directory``, and training reads only
those files (its text encoder runs for sample prompts only). So the caching command line is the one whose settings
decide training; a training command line is checked as the caching step it needs.

Every fact below was read at kohya-ss/musubi-tuner@30c658c4f4b0bf05038b3346eff9670259b10fc7 (0.3.4); ``source``
gives file:line (under ``src/musubi_tuner/``) at that commit. The option names of every training and caching script
(each read from the argparse definitions its ``main`` reaches) and the dataset config's keys are bundled in
``data/musubi.txt`` (``python tools/gen_audit_keys.py musubi CHECKOUT --write`` regenerates it from a checkout).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._safetensors import read_header
from te_align.audit import rules
from te_align.audit.cachefiles import UNREADABLE, CacheScan
from te_align.audit.cmdline import arg_line
from te_align.audit.findings import Finding
from te_align.audit.models import guess_model
from te_align.audit.parsed import (
    CacheSpec,
    CaptionSource,
    KeyLines,
    Parsed,
    checkout_commit,
    emit_key_table,
    flatten_sections,
    parse_cli,
    resolve_cli_abbrevs,
    resolve_script_options,
    typed_names,
    unknown_key_finding,
)
from te_align.audit.parsed import script_options as parser_options
from te_align.audit.readers import MAX_BYTES, RawConfig, UnreadableConfig, known_keys, load, read_text
from te_align.audit.rules import Context, Rule, Trainer, family_of
from te_align.profiles.registry import bundled_names
from te_align.trainers.musubi import names

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

COMMIT = "30c658c4f4b0bf05038b3346eff9670259b10fc7"
NAME = "musubi"
_Q = "qwen_image/qwen_image_utils.py"
_W = "wan/modules"

#: The exact chat template musubi-tuner wraps a Qwen-Image caption in (qwen_image/qwen_image_utils.py:339).
QWEN_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                 "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
                 "<|im_start|>assistant\n")


# ------------------------------------------------------------------------------------ converters
def _fp8(v: Any, ctx: Context) -> Any:
    # --fp8_vl / --fp8_t5: the text encoder's weights in float8_e4m3fn (computed under bfloat16 autocast)
    return "float8_e4m3fn" if rules.truthy(v) else "bfloat16"


def _fp8_back(p: Any, ctx: Context) -> Any:
    if p == "bfloat16":
        return rules.REMOVE
    raise LookupError


rules.register("musubi_fp8", _fp8, _fp8_back, "bool")


# ------------------------------------------------------------------------------------ the table
RULES: tuple[Rule, ...] = (
    # ---- Qwen-Image: qwen_image_cache_text_encoder_outputs.py (every caption), qwen_image_train_network.py (samples)
    Rule("qwen.tokenizer.max_length", ("qwen-image",), None, 1024,
         "get_qwen_prompt_embeds keeps up to 1024 tokens after the 34-token template prefix (tokenizer_max_length = "
         "1024, hard-coded); the pipeline's __call__ keeps 512", f"{_Q}:338,351,366-373", captions="over512"),
    Rule("qwen.tokenizer.template", ("qwen-image",), None, QWEN_TEMPLATE, "the caption in Qwen-Image's chat template",
         f"{_Q}:339,350"),
    Rule("qwen.tokenizer.drop_start_tokens", ("qwen-image",), None, 34, "the 34 template-prefix tokens are dropped",
         f"{_Q}:340,370"),
    Rule("qwen.tokenizer.padding", ("qwen-image",), None, "longest", "tokenized with padding=True (the batch's longest)",
         f"{_Q}:351"),
    Rule("qwen.encoder.layer", ("qwen-image",), None, -1, "hidden_states[-1]", f"{_Q}:365"),
    Rule("qwen.masks.encoder", ("qwen-image",), None, True, "the tokenizer mask goes into Qwen2.5-VL", f"{_Q}:355-363"),
    Rule("qwen.masks.repad", ("qwen-image",), None, "batch_longest",
         "each caption's real tokens are cached alone (qwen_image_cache_text_encoder_outputs.py:98-101) and training "
         "pads them to the batch's longest", "qwen_image_train_network.py:513-518"),
    Rule("qwen.masks.denoiser", ("qwen-image",), None, True, "training hands the DiT the mask of the real tokens",
         "qwen_image_train_network.py:520-538"),
    Rule("qwen.encoder.dtype", ("qwen-image",), "fp8_vl", False,
         "--fp8_vl loads Qwen2.5-VL in float8_e4m3fn (run under bfloat16 autocast): every cached caption is encoded by "
         "a quantized text encoder", f"qwen_image_cache_text_encoder_outputs.py:130-133; {_Q}:353-356",
         convert="musubi_fp8", severity="warning"),
    # ---- Wan 2.1 / 2.2: wan_cache_text_encoder_outputs.py, wan_train_network.py (samples)
    Rule("t5.tokenizer.max_length", ("wan",), None, 512, "text_len = 512 for every Wan task",
         "wan/configs/shared_config.py:11; wan_cache_text_encoder_outputs.py:72-74"),
    Rule("t5.tokenizer.padding", ("wan",), None, "max_length", "padded to text_len", f"{_W}/tokenizers.py:50-57"),
    Rule("t5.tokenizer.text_cleaning", ("wan",), None, "wan",
         "clean='whitespace': ftfy.fix_text, html.unescape twice, whitespace runs collapsed",
         f"{_W}/t5.py:506; {_W}/tokenizers.py:12-21,73-80"),
    Rule("t5.masks.encoder", ("wan",), None, True, "the tokenizer mask goes into umT5", f"{_W}/t5.py:508-513"),
    Rule("t5.masks.repad", ("wan",), None, "max_length",
         "each output is cut to its tokens (t5.py:512-514) and the DiT zero-pads the context back to text_len",
         f"{_W}/model.py:872-874"),
    Rule("t5.encoder.dtype", ("wan",), "fp8_t5", False,
         "--fp8_t5 loads umT5 in float8_e4m3fn: every cached caption is encoded by a quantized text encoder",
         f"wan_cache_text_encoder_outputs.py:64-74; {_W}/t5.py:461,493-495", convert="musubi_fp8", severity="warning"),
)

_F2 = "flux_2/flux2_utils.py"
_ZI = "zimage/zimage_utils.py"
#: FLUX.2 dev's system message, newline after "object" kept (flux_2/flux2_utils.py:53-54).
FLUX2_SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured responses focusing "
                        "on object relationships, object\nattribution and actions without speculation.")


def _same_layer(v: Any, ctx: Context) -> Any:
    """``hidden_states[-2]``: the profile's own spelling of it (``penultimate`` or -2), read from the bundled profile."""
    from te_align.profiles.registry import _load_bundled, bundled_name

    name = bundled_name(ctx.profile_name)
    if name is not None:
        have = _load_bundled(name).get("slots.qwen3.encoder.layer")
        if have in ("penultimate", -2):
            return have
    return "penultimate"


rules.register("musubi_penultimate", _same_layer, rules.unsettable)

RULES += (
    # ---- FLUX.1 Kontext: flux_kontext_cache_text_encoder_outputs.py (checked with flux-dev: the same T5 + CLIP-L)
    Rule("t5.tokenizer.max_length", ("flux",), None, 512, "T5 length T5XXL_MAX_LENGTH = 512",
         "flux/flux_models.py:413; flux_kontext_cache_text_encoder_outputs.py:37-45"),
    Rule("t5.tokenizer.padding", ("flux",), None, "max_length", "T5 tokens padded to 512",
         "flux_kontext_cache_text_encoder_outputs.py:40"),
    Rule("t5.masks.encoder", ("flux",), None, False, "T5 runs with attention_mask=None",
         "flux_kontext_cache_text_encoder_outputs.py:49"),
    Rule("t5.masks.denoiser", ("flux",), None, False, "the DiT gets no text mask",
         "flux_kontext_train_network.py:352-361"),
    Rule("clip_l.tokenizer.max_length", ("flux",), None, 77, "CLIP-L pooled output at 77 tokens",
         "flux_kontext_cache_text_encoder_outputs.py:46,55-56"),
    # ---- FLUX.2 dev (Mistral-Small-3.1): flux_2_cache_text_encoder_outputs.py
    Rule("mistral.tokenizer.system_prompt", ("flux2",), None, FLUX2_SYSTEM_MESSAGE,
         "SYSTEM_MESSAGE (format_input's default), with the newline after \"object\"", f"{_F2}:53-54,674"),
    Rule("mistral.tokenizer.max_length", ("flux2",), None, 512, "MAX_LENGTH = 512 (padding=max_length, truncation)",
         f"{_F2}:51,627-636"),
    Rule("mistral.tokenizer.padding", ("flux2",), None, "max_length", "padded to 512", f"{_F2}:633"),
    Rule("mistral.tokenizer.text_cleaning", ("flux2",), None, "drop_img_tokens", "format_input removes \"[IMG]\"",
         f"{_F2}:692"),
    Rule("mistral.masks.encoder", ("flux2",), None, True, "the tokenizer mask goes into Mistral", f"{_F2}:640-647"),
    Rule("mistral.encoder.layer", ("flux2",), None, (10, 20, 30),
         "hidden_states 10, 20, 30 stacked and flattened per token", f"{_F2}:49,650-651"),
    # ---- FLUX.2 klein 4B / 9B (Qwen3)
    Rule("qwen3.tokenizer.enable_thinking", ("flux2-klein",), None, False,
         "apply_chat_template(..., add_generation_prompt=True, enable_thinking=False)", f"{_F2}:768-774"),
    Rule("qwen3.tokenizer.max_length", ("flux2-klein",), None, 512, "MAX_LENGTH = 512 (padding=max_length, truncation)",
         f"{_F2}:51,749,776-782"),
    Rule("qwen3.tokenizer.padding", ("flux2-klein",), None, "max_length", "padded to 512", f"{_F2}:779"),
    Rule("qwen3.encoder.layer", ("flux2-klein",), None, (9, 18, 27),
         "hidden_states 9, 18, 27 stacked and flattened per token", f"{_F2}:50,797-798"),
    # ---- Z-Image (Qwen3-4B): zimage_cache_text_encoder_outputs.py
    Rule("qwen3.tokenizer.enable_thinking", ("z-image",), None, True,
         "apply_chat_template(..., add_generation_prompt=True, enable_thinking=True)", f"{_ZI}:185-192"),
    Rule("qwen3.tokenizer.max_length", ("z-image",), None, 512,
         "DEFAULT_MAX_SEQUENCE_LENGTH = 512 (padding=max_length, truncation)",
         f"zimage/zimage_config.py:28; {_ZI}:195-201"),
    Rule("qwen3.encoder.layer", ("z-image",), None, "penultimate", "hidden_states[-2]", f"{_ZI}:207-218",
         convert="musubi_penultimate"),
    Rule("qwen3.masks.encoder", ("z-image",), None, True, "the tokenizer mask goes into Qwen3", f"{_ZI}:203-218"),
    Rule("qwen3.tokenizer.padding", ("z-image",), None, "max_length", "padded to 512", f"{_ZI}:195-201"),
    Rule("qwen3.masks.encoder_mask_dtype", ("z-image",), None, "bool", "the mask is cast with .bool()", f"{_ZI}:204"),
    Rule("qwen3.masks.repad", ("z-image",), None, "batch_longest",
         "each caption's real tokens are cached alone (zimage_cache_text_encoder_outputs.py:47-50); training pads "
         "them with zeros to the batch's longest (rounded up with the image to a multiple of 32) under a bool mask",
         "zimage_train_network.py:288-305"),
)

_EDIT_SYSTEM = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                "objects, background), then explain how the user's text instruction should alter or modify the image. "
                "Generate a new image that meets the user's requirements while maintaining consistency with the "
                "original input where appropriate.<|im_end|>\n<|im_start|>user\n")
#: musubi-tuner's Edit templates (qwen_image/qwen_image_utils.py:397-400): the original Edit's holds the vision
#: tokens; 2509/2511 write "Picture N: " and them before the prompt, once per image (:458-462).
EDIT_TEMPLATE = _EDIT_SYSTEM + "<|vision_start|><|image_pad|><|vision_end|>{prompt}<|im_end|>\n<|im_start|>assistant\n"
PLUS_TEMPLATE = _EDIT_SYSTEM + "{prompt}<|im_end|>\n<|im_start|>assistant\n"
PLUS_PREFIX = "Picture {n}: <|vision_start|><|image_pad|><|vision_end|>"
_EDIT = ("qwen-image-edit",)
_PLUS = {"qwen-image-edit-2509": PLUS_TEMPLATE, "qwen-image-edit-2511": PLUS_TEMPLATE}
#: How musubi-tuner resizes a control image for the VL encoder: to the 384x384-area bucket of 16-pixel steps nearest
#: in aspect (dataset/bucket.py:124-164, RESOLUTION_STEPS_QWEN_IMAGE_EDIT = 16 at :47), scaled to cover it (PIL
#: LANCZOS up, cv2 INTER_AREA down) and centre-cropped (dataset/media_utils.py:101-137).
MUSUBI_EDIT_RESIZE = "bucket_16_crop"

RULES += (
    # ---- Qwen-Image-Edit (original, 2509, 2511): qwen_image_cache_text_encoder_outputs.py --model_version edit*
    Rule("qwen.tokenizer.template", _EDIT, None, rules.ByProfile({**_PLUS, "*": EDIT_TEMPLATE}),
         "the Edit chat template of the version (the original Edit's holds the image's vision tokens)",
         f"{_Q}:397-400,464-466"),
    Rule("qwen.images.prefix", _EDIT, None, rules.ByProfile({**{k: PLUS_PREFIX for k in _PLUS}, "*": ""}),
         "2509/2511: 'Picture N: ' and the vision tokens per image before the prompt; the original Edit: none (its "
         "template holds one image, later images are ignored)", f"{_Q}:447-462"),
    Rule("qwen.images.area", _EDIT, None, 384 * 384,
         "every Edit version's control images go to Qwen2.5-VL at a 384x384 area (CONDITION_IMAGE_RESOLUTION, the "
         "2509/2511 size; the original Edit pipeline uses 1024x1024)",
         f"qwen_image_cache_text_encoder_outputs.py:43-61; {_Q}:904"),
    Rule("qwen.images.resize", _EDIT, None, MUSUBI_EDIT_RESIZE,
         "the control image is fitted to a 16-pixel bucket of the area nearest in aspect and centre-cropped (PIL "
         "LANCZOS up, cv2 INTER_AREA down), where the pipeline resizes it whole to multiples of 32 with LANCZOS: "
         "the VL encoder sees slightly different pixels", "qwen_image_cache_text_encoder_outputs.py:54-60; "
         "dataset/bucket.py:47,124-164; dataset/media_utils.py:101-137", severity="warning"),
    Rule("qwen.tokenizer.drop_start_tokens", _EDIT, None, 64, "the 64 template-prefix tokens are dropped", f"{_Q}:401,494"),
    Rule("qwen.tokenizer.padding", _EDIT, None, "longest", "the processor pads to the batch's longest (padding=True)",
         f"{_Q}:468"),
    Rule("qwen.encoder.layer", _EDIT, None, -1, "hidden_states[-1]", f"{_Q}:489"),
    Rule("qwen.masks.encoder", _EDIT, None, True, "the processor's mask goes into Qwen2.5-VL", f"{_Q}:468-486"),
    Rule("qwen.masks.repad", _EDIT, None, "batch_longest",
         "each caption's real tokens are cached alone and training pads them to the batch's longest",
         "qwen_image_cache_text_encoder_outputs.py:98-101; qwen_image_train_network.py:513-518"),
    Rule("qwen.masks.denoiser", _EDIT, None, True, "training hands the DiT the mask of the real tokens",
         "qwen_image_train_network.py:520-538"),
    Rule("qwen.encoder.dtype", _EDIT, "fp8_vl", False,
         "--fp8_vl loads Qwen2.5-VL in float8_e4m3fn (run under bfloat16 autocast) for every version the caching "
         "script serves, the Edit versions included: every cached caption is encoded by a quantized text encoder",
         "qwen_image_cache_text_encoder_outputs.py:130-133", convert="musubi_fp8", severity="warning"),
)

_K2 = "krea2/krea2_encoder.py"
_I4 = "ideogram4/ideogram4_utils.py"


def _krea2_te_dtype(v: Any, ctx: Context) -> Any:
    # krea2_cache_text_encoder_outputs.py --text_encoder_dtype: unset = bfloat16, else model_utils.str_to_dtype
    if v is None or v == "":
        return "bfloat16"
    name = str(v).lower().replace("torch.", "")
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(name, name)


def _bf16_back(p: Any, ctx: Context) -> Any:
    if p == "bfloat16":
        return rules.REMOVE
    raise LookupError


def _i4_cache_dtype(v: Any, ctx: Context) -> Any:
    # ideogram4_cache_text_encoder_outputs.py --text_cache_dtype (bf16, fp8_e4m3fn, float32; default bf16): the
    # encoder runs in bfloat16 either way; float32 holds its bf16 outputs exactly, fp8 rounds them
    return "float8_e4m3fn" if str(v) == "fp8_e4m3fn" else "bfloat16"


rules.register("musubi_krea2_te_dtype", _krea2_te_dtype, _bf16_back, "str")
rules.register("musubi_i4_cache_dtype", _i4_cache_dtype, _bf16_back, "choice:bf16,fp8_e4m3fn,float32")

#: Krea 2's template (krea2/krea2_encoder.py:187-188: the prefix, the caption, the suffix tokenized alone).
KREA2_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                  "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{prompt}"
                  "<|im_end|>\n<|im_start|>assistant\n")
#: Ideogram 4's: the Qwen3-VL chat template's rendering of one user message with the generation prompt.
IDEOGRAM_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"

RULES += (
    # ---- Krea 2 (Qwen3-VL-4B): krea2_cache_text_encoder_outputs.py -> Qwen3VLConditioner.forward
    Rule("qwen.tokenizer.template", ("krea2",), None, KREA2_TEMPLATE,
         "prompt_template_encode_prefix + caption; the suffix tokenized alone", f"{_K2}:187-196"),
    Rule("qwen.tokenizer.max_length", ("krea2",), None, 512,
         "TextEncoderConfig.max_length 512: prefix + caption padded to 512 + 34 - 5 (padding='max_length', truncation)",
         f"{_K2}:93,203-211"),
    Rule("qwen.tokenizer.suffix_after_padding", ("krea2",), None, True,
         "the suffix's tokens are concatenated after the padded block", f"{_K2}:195-200,212-213"),
    Rule("qwen.tokenizer.drop_start_tokens", ("krea2",), None, 34, "the 34 prefix positions are dropped",
         f"{_K2}:189,217-218"),
    Rule("qwen.encoder.position_ids", ("krea2",), None, "real_tokens",
         "no position_ids are passed: Qwen3VLModel builds them with get_rope_index, which for text-only input with a "
         "mask counts the real tokens (mask.cumsum - 1) under the transformers musubi-tuner pins (4.57.6, "
         "pyproject.toml:20); transformers 5 counts raw positions there, which would shift the suffix",
         f"{_K2}:214; pyproject.toml:20"),
    Rule("qwen.encoder.layer", ("krea2",), None, (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),
         "select_layers (2, 5, ..., 35) of hidden_states", f"{_K2}:94,216"),
    Rule("qwen.encoder.layer_combine", ("krea2",), None, "stack", "torch.stack(dim=2): (batch, sequence, layers, width)",
         f"{_K2}:216"),
    Rule("qwen.masks.denoiser", ("krea2",), None, True,
         "each caption's real tokens are cached alone and training pads them under a bool mask (text tokens sit at "
         "the RoPE origin, so dropping the padding changes nothing the DiT sees)",
         "krea2_cache_text_encoder_outputs.py:35-39; krea2_train_network.py:442-456"),
    Rule("qwen.encoder.dtype", ("krea2",), "text_encoder_dtype", None,
         "--text_encoder_dtype (unset = bfloat16) is the dtype Qwen3-VL runs in for every cached caption",
         "krea2_cache_text_encoder_outputs.py:49,62-66,79", convert="musubi_krea2_te_dtype", severity="warning"),
    # ---- Ideogram 4 (Qwen3-VL): ideogram4_cache_text_encoder_outputs.py -> encode_prompt_to_features, one caption
    # at a time at its own length (no padding; the transformer masks padding by segment ids)
    Rule("qwen.tokenizer.template", ("ideogram4",), None, IDEOGRAM_TEMPLATE,
         "apply_chat_template([{'role': 'user', 'content': [{'type': 'text', ...}]}], add_generation_prompt=True)",
         f"{_I4}:389-391"),
    Rule("qwen.tokenizer.add_special_tokens", ("ideogram4",), None, False, "tokenizer(text, add_special_tokens=False)",
         f"{_I4}:392"),
    Rule("qwen.tokenizer.max_length", ("ideogram4",), None, 2048,
         "IDEOGRAM4_MAX_TEXT_TOKENS 2048: a longer caption raises ValueError (no truncation)", f"{_I4}:102,393-396"),
    Rule("qwen.tokenizer.truncation", ("ideogram4",), None, False, "no truncation: over 2048 tokens raises",
         f"{_I4}:392-396"),
    Rule("qwen.encoder.position_ids", ("ideogram4",), None, "real_tokens",
         "positions arange from 0 over the caption's own tokens (no padding)", f"{_I4}:442-447"),
    Rule("qwen.encoder.layer", ("ideogram4",), None, (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 35),
         "QWEN3_VL_ACTIVATION_LAYERS (0, 3, ..., 33, 35)", f"ideogram4/constants.py:11; {_I4}:423-438"),
    Rule("qwen.encoder.layer_taps", ("ideogram4",), None, "decoder_layers",
         "the outputs of those decoder layers (driven one by one, the last before the final norm)", f"{_I4}:400-438"),
    Rule("qwen.encoder.layer_combine", ("ideogram4",), None, "interleave",
         "stack(dim=0).permute(1, 2, 3, 0).reshape: width-major, layer fastest", f"{_I4}:448-449"),
    Rule("qwen.encoder.dtype", ("ideogram4",), "text_cache_dtype", "bf16",
         "--text_cache_dtype fp8_e4m3fn rounds every cached caption's features to float8 (bf16 and float32 keep the "
         "bfloat16 encoder's values)", "ideogram4_cache_text_encoder_outputs.py:17-24,47,52-58,79",
         convert="musubi_i4_cache_dtype", severity="warning"),
)

SUPPORTED = ("qwen-image", "wan", "flux", "flux2", "flux2-klein", "z-image", "qwen-image-edit", "krea2", "ideogram4")
#: musubi-tuner has no setting for its hard-coded encoding; te-align's hooks replace it.
NOT_SETTABLE = ("not settable in musubi-tuner (hard-coded): run it with te-align's hooks (`te-align patch "
                "MUSUBI_TUNER_CHECKOUT`), then cache the text-encoder outputs again")
#: The same, for an architecture te-align's hooks do not cover (hooks.ENCODERS: Qwen-Image and Wan only).
NOT_SETTABLE_UNHOOKED = ("not settable in musubi-tuner (hard-coded), and te-align's hooks do not cover {what}: there "
                         "is no fix in config")

_CACHE_SOURCE = "cache_text_encoder_outputs.py:61-70,104-112; dataset/cache_io.py:487-532"
CACHES = {
    "qwen-image": CacheSpec(("*_qi_te.safetensors",), "the file's path only (--skip_existing keeps any file there; it "
                            "records the architecture and the caption, no encoder setting)", _CACHE_SOURCE,
                            "run qwen_image_cache_text_encoder_outputs.py again without --skip_existing"),
    "wan": CacheSpec(("*_wan_te.safetensors",), "the file's path only (--skip_existing keeps any file there; it "
                     "records the architecture and the caption, no encoder setting)", _CACHE_SOURCE,
                     "run wan_cache_text_encoder_outputs.py again without --skip_existing"),
}
_REUSE = ("the file's path only (--skip_existing keeps any file there; it records the architecture and the caption, "
          "no encoder setting)")
for _family, _globs, _script in (("qwen-image-edit", ("*_qie_te.safetensors",), "qwen_image"),
                                 ("flux", ("*_fk_te.safetensors",), "flux_kontext"),
                                 ("flux2", ("*_f2d_te.safetensors",), "flux_2"),
                                 ("flux2-klein", ("*_f2k4b_te.safetensors", "*_f2k9b_te.safetensors"), "flux_2"),
                                 ("z-image", ("*_zi_te.safetensors",), "zimage"),
                                 ("krea2", ("*_kr2_te.safetensors",), "krea2"),
                                 ("ideogram4", ("*_i4_te.safetensors",), "ideogram4")):  # dataset/architectures.py:8-27
    CACHES[_family] = CacheSpec(_globs, _REUSE, _CACHE_SOURCE,
                                f"run {_script}_cache_text_encoder_outputs.py again without --skip_existing")
#: The safetensors metadata keys te-align's hooks add to a cache file (profile name and fingerprint).
META_PROFILE = "te_align_profile"
META_FINGERPRINT = "te_align_fingerprint"


# ------------------------------------------------------------------------------------ keys
@functools.cache
def valid_keys() -> dict[str, frozenset[str]]:
    """The bundled option names per script (``[qwen_image_train_network]``…) and dataset-config keys
    (``[dataset]`` top level, ``[dataset.general]``, ``[dataset.image]``, ``[dataset.video]``)."""
    return known_keys("musubi", "te_align.trainers.musubi")


def _stem(script: str | None) -> str:
    return (script or "").replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")


def script_options(script: str | None) -> frozenset[str]:
    """The options of a script (every script's when it is not in the table: a ``--config_file`` TOML alone)."""
    keys = valid_keys()
    stem = _stem(script)
    if stem in keys:
        return keys[stem]
    return frozenset().union(*(v for k, v in keys.items() if not k.startswith("dataset")))


def te_cache_script(arch: names.Arch) -> str:
    """The script that caches an architecture's text-encoder outputs."""
    unprefixed = next((s for s, (p, k) in names.UNPREFIXED.items() if p == arch.prefix and k == names.TE_CACHE_KIND), None)
    return unprefixed or f"{arch.prefix}_{names.TE_CACHE_KIND}.py"


@functools.cache
def option_archs() -> dict[str, frozenset[str]]:
    """Option -> the architectures (script prefixes) whose scripts define it, from the key table. An option only one
    architecture's scripts have names that model (``--dit_high_noise``: Wan); ``--task`` is Wan's, HiDream-O1's,
    HunyuanVideo 1.5's and Kandinsky 5's, so it names none."""
    out: dict[str, set[str]] = {}
    for section, keys in valid_keys().items():
        found = names.script_arch(section + ".py")
        for key in keys if found else ():
            out.setdefault(key, set()).add(found[0].prefix)  # type: ignore[index]
    return {k: frozenset(v) for k, v in out.items()}


# ------------------------------------------------------------------------------------ reading
def detect(raw: RawConfig) -> int | None:
    """A musubi-tuner command line (its own script names), a dataset config (``[[datasets]]`` with
    ``image_directory`` / ``video_directory`` / ``cache_directory``…) or a ``--config_file`` TOML (``dit``, ``task``,
    a ``networks.lora_<arch>`` module)."""
    if raw.fmt == "cmdline":
        data = raw.data if isinstance(raw.data, dict) else {}
        script = str(data.get("script") or "")
        if script in names.UNPREFIXED and "tools/" in str(data.get("script_path") or "").replace("\\", "/"):
            return None  # sd-scripts' tools/cache_latents.py, tools/cache_text_encoder_outputs.py
        return 100 if names.script_arch(script) else None
    if raw.fmt != "toml" or not isinstance(raw.data, dict):
        return None
    if _is_dataset_config(raw.data):
        return 70
    flat = _flatten(raw.data)
    if "dit" in flat or "dit_high_noise" in flat:
        return 60
    # a network module alone: sd-scripts has modules of the same names (networks.lora_flux), and its configs name
    # the model by pretrained_model_name_or_path, an option musubi-tuner does not have (it names the DiT by --dit)
    if _network_arch(flat) is not None and "pretrained_model_name_or_path" not in flat:
        return 60
    return None


def _is_dataset_config(data: dict[str, Any]) -> bool:
    datasets = data.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        return False
    marks = valid_keys().get("dataset.image", frozenset()) | valid_keys().get("dataset.video", frozenset())
    marks -= valid_keys().get("dataset.general", frozenset())
    return any(isinstance(d, dict) and any(k in marks for k in d) for d in datasets)


def _flatten(data: dict[str, Any]) -> dict[str, Any]:
    """read_config_from_file: every section's keys into one namespace (training/parser_common.py:780-811)."""
    return flatten_sections(data)


def _network_arch(values: dict[str, Any]) -> names.Arch | None:
    module = str(values.get("network_module") or "")
    return next((a for a in names.ARCHS if a.network and module == a.network and module != "networks.lora"), None)


def _read_toml(path: str, what: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UnreadableConfig(f"{what}: no such file", file=path)
    if p.stat().st_size > MAX_BYTES:
        raise UnreadableConfig(f"{what} is larger than {MAX_BYTES} bytes", file=path)
    raw = load(path)
    if raw.fmt != "toml" or not isinstance(raw.data, dict):
        raise UnreadableConfig(f"{what}: expected a TOML table", file=path)
    return raw.data


def parse_args(args: list[str]) -> tuple[dict[str, Any], str | None, list[str]]:
    """``--key value`` / ``--key=value`` / ``--flag`` -> values, the script named among them (``*.py``), and the
    order the options were written in."""
    return parse_cli(args)


#: musubi-tuner's captions, read at kohya-ss/musubi-tuner@30c658c: a dataset's caption_extension, else [general]'s
#: (src/musubi_tuner/dataset/config_utils.py:227-238); the whole file, stripped
#: (src/musubi_tuner/dataset/datasources.py:241-246, :550-555 for videos); the folder's own images, no sub-folders
#: (dataset/media_utils.py:58-66).
CAPTION_SOURCE = ("kohya-ss/musubi-tuner@30c658c src/musubi_tuner/dataset/datasources.py:241-246, "
                  "dataset/config_utils.py:227-238")


def caption_sources(config: dict[str, Any]) -> list[CaptionSource]:
    """Each dataset's image_directory / video_directory with musubi-tuner's caption file reading."""
    general_section = config.get("general")
    general: dict[str, Any] = general_section if isinstance(general_section, dict) else {}
    out: list[CaptionSource] = []
    for ds in config.get("datasets", []) if isinstance(config.get("datasets"), list) else []:
        folder = (ds.get("image_directory") or ds.get("video_directory")) if isinstance(ds, dict) else None
        if not isinstance(folder, str):
            continue
        ext = ds.get("caption_extension") or general.get("caption_extension")
        out.append(CaptionSource(folder=folder, extension=ext if isinstance(ext, str) and ext else None,
                                 recursive=False, source=CAPTION_SOURCE))
    return out


def dataset_dirs(config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(caption folders, cache folders) of a dataset config: each dataset's ``image_directory`` /
    ``video_directory``, and its ``cache_directory`` (else the media folder: dataset/config_utils.py)."""
    media: list[str] = []
    caches: list[str] = []
    for ds in config.get("datasets", []) if isinstance(config.get("datasets"), list) else []:
        if not isinstance(ds, dict):
            continue
        folder = ds.get("image_directory") or ds.get("video_directory")
        if isinstance(folder, str):
            media.append(folder)
        cache = ds.get("cache_directory") or folder
        if isinstance(cache, str):
            caches.append(cache)
    return media, caches


def _cache_arch(caches: list[str]) -> tuple[names.Arch, str] | None:
    """The architecture whose ``*_<short>_te.safetensors`` files the cache folders hold (the most files wins)."""
    counts: dict[str, int] = {}
    for folder in caches:
        p = Path(folder)
        if not p.is_dir():
            continue
        for f in p.glob("*_te.safetensors"):
            short = f.name[: -len("_te.safetensors")].rsplit("_", 1)[-1]
            counts[short] = counts.get(short, 0) + 1
    if not counts:
        return None
    short = max(counts, key=lambda k: counts[k])
    arch = names.BY_SHORT.get(short) or (names.BY_SHORT["qi"] if short in names.QWEN_VARIANTS else None)
    return (arch, short) if arch else None


def guess(values: dict[str, Any], script: str | None, caches: list[str]) -> tuple[names.Arch | None, str, list[str]]:
    """The architecture a run trains, why, and the signals that disagree (every signal the run's files carry: the
    script, ``--network_module``, architecture-only options, the cache files, the model file's name)."""
    signals: list[tuple[names.Arch, str]] = []
    found = names.script_arch(script)
    if found:
        signals.append((found[0], f"script {script}"))
    net = _network_arch(values)
    if net is None and values.get("network_module") == "networks.lora":  # musubi-tuner's HunyuanVideo LoRA module
        net = names.BY_PREFIX["hv"]
    if net:
        signals.append((net, f"network_module {values.get('network_module')!r}"))
    # an option only one architecture's scripts have, where the script (if any) does not have it itself
    own = script_options(script) if found else frozenset()
    named: set[str] = set()
    for key in values:
        archs = option_archs().get(key, frozenset())
        if key in own or len(archs) != 1 or archs <= named:
            continue
        named |= archs
        arch = names.BY_PREFIX[next(iter(archs))]
        signals.append((arch, f"--{key} (an option only {arch.display}'s scripts have"
                              f"{f'; {script} does not' if found else ''})"))
    cached = _cache_arch(caches)
    if cached:
        signals.append((cached[0], f"cache files *_{cached[1]}_te.safetensors in the dataset's cache_directory"))
    dit = values.get("dit")
    by_name, detail, _ = guess_model(dit)
    bundled = set(bundled_names())
    by_dit = next((a for a in names.ARCHS if a.profile in bundled and by_name in bundled
                   and family_of(a.profile) == family_of(by_name)), None)  # type: ignore[arg-type]
    if by_dit:
        signals.append((by_dit, f"dit {dit!r}{detail}"))
    if not signals:
        return None, "", []
    arch, why = signals[0]
    others = [w for a, w in signals[1:] if a.prefix != arch.prefix]
    agree = [w for a, w in signals[1:] if a.prefix == arch.prefix]
    return arch, " and ".join([why, *agree[:1]]), others


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    findings: list[Finding] = []
    lines = KeyLines(raw.text)
    cli_lines: Callable[[str], int | None] = lambda key: None  # noqa: E731
    if raw.fmt == "cmdline":
        if not isinstance(raw.data, dict):
            raise UnreadableConfig("expected a musubi-tuner command line", file=raw.file)
        cmd_args = raw.data["args"]
        if not isinstance(cmd_args, list):  # the command-line reader's list of words
            raise UnreadableConfig("expected a musubi-tuner command line", file=raw.file)
        cmd_words: list[str] = [str(w) for w in cmd_args]
        words = [*cmd_words, *extra_args]
        values, _, order = parse_args(words)
        script: str | None = str(raw.data["script"])
        if not raw.data.get("from_argv"):
            text = raw.text
            cli_lines = lambda key: arg_line(text, key)  # noqa: E731
        file_values: dict[str, Any] = {}
        dataset: dict[str, Any] | None = None
        dataset_file = values.get("dataset_config")
        config_file = values.get("config_file")
    elif isinstance(raw.data, dict) and _is_dataset_config(raw.data):
        values, script, order = parse_args(list(extra_args))
        file_values, dataset, dataset_file, config_file = {}, raw.data, raw.file, values.get("config_file")
        findings += _dataset_findings(raw.data, raw.file, lines)
    elif isinstance(raw.data, dict):
        cli, script, order = parse_args(list(extra_args))
        file_values = _flatten(raw.data)
        values = {**file_values, **cli}
        dataset, dataset_file, config_file = None, values.get("dataset_config"), None
        if script is None and isinstance(values.get("script"), str):
            script = values["script"]
    else:
        raise UnreadableConfig("expected a TOML table", file=raw.file)
    if raw.fmt == "cmdline" or extra_args:  # argparse reads a unique prefix as its option (allow_abbrev)
        table = parser_options(__package__, "musubi-options", script)
        if table is None:
            findings += resolve_cli_abbrevs(values, order, script_options(script), line=cli_lines,
                                            trainer=f"musubi-tuner: {script or 'the script'} parse_args (argparse)")
        else:
            typed = typed_names([*cmd_words, *extra_args] if raw.fmt == "cmdline" else extra_args)
            found, short = resolve_script_options(values, order, table, typed=typed, line=cli_lines,
                                                  trainer=f"musubi-tuner: {script} main (argparse)")
            findings += found
            if raw.fmt == "cmdline" and not raw.data.get("from_argv"):  # type: ignore[union-attr]
                text = raw.text
                cli_lines = lambda key: arg_line(text, short.get(key, key))  # noqa: E731
        if raw.fmt == "cmdline":
            dataset_file, config_file = values.get("dataset_config"), values.get("config_file")
        elif dataset is None:
            dataset_file = values.get("dataset_config")
    if isinstance(config_file, str) and config_file:
        path = config_file if config_file.endswith(".toml") else config_file + ".toml"
        from_file = _flatten(_read_toml(path, "--config_file"))
        values = {**from_file, **values}  # the command line wins (read_config_from_file parses args into it)
    if dataset is None and isinstance(dataset_file, str) and Path(dataset_file).is_file():
        dataset = _read_toml(dataset_file, "--dataset_config")
        findings += _dataset_findings(dataset, dataset_file, KeyLines(read_text(dataset_file)))
    media, caches = dataset_dirs(dataset or {})
    valid = script_options(script)
    for key in file_values:
        if key not in valid and key not in ("script",):
            findings.append(unknown_key_finding(
                key, valid, trainer="musubi-tuner: training/parser_common.py:780-811", line=lines(key),
                behaviour="read_config_from_file puts every TOML key into the argument namespace and nothing reads "
                          "this one"))
    for key in order:
        if key not in valid:
            findings.append(unknown_key_finding(
                key, valid, trainer=f"musubi-tuner: {script or 'the script'} parse_args (argparse)", line=cli_lines(key),
                severity="error", behaviour="argparse stops with 'unrecognized arguments'"))
    arch, reason, others = guess(values, script, caches)
    script_found = names.script_arch(script)
    kind = script_found[1] if script_found else None
    for other in others:
        findings.append(Finding(kind="note", severity="info", setting="profile", message=(
            f"{other} names another model than {reason}; checked as {arch.display if arch else '-'}")))
    trainer = _trainer(raw, set(order), cli_lines, lines)
    if arch is not None and kind in names.LATENT_KINDS:
        return Parsed(trainer, values, None, reason, True, None, findings, SUPPORTED, not_checked_status="not-training",
                      not_checked=f"not checked: {script} caches {'pixels' if kind == 'cache_pixel' else 'latents'} only (no "
                                  "text encoder runs); the captions are "
                                  f"encoded by {te_cache_script(arch)}: check that command line")
    if arch is None and dataset is not None and raw.fmt != "cmdline":
        return Parsed(trainer, values, None, "the dataset config", True, None, findings, SUPPORTED, not_checked=(
            "not checked: a musubi-tuner dataset config names no model; check the caching command line that uses it "
            "(`te-align check DATASET.toml -- qwen_image_cache_text_encoder_outputs.py …`, or the command's own file)"))
    if arch is None:
        return Parsed(trainer, values, None,
                      "these settings (no script, network_module or cache files name a model; give the command line "
                      "after `--`, e.g. `-- qwen_image_cache_text_encoder_outputs.py --dataset_config …`)", True,
                      None, findings, SUPPORTED)
    target, version_key, known = names.version_profile(arch, values)
    if not known:
        findings.append(Finding(
            kind="wrong-value", severity="error", setting="model_version", effective=values.get("model_version"),
            key="model_version", line=cli_lines("model_version") if "model_version" in set(order) else lines("model_version"),
            message=(f"wrong type/value for model_version: {values.get('model_version')!r} is not a {arch.display} "
                     f"version musubi-tuner knows ({', '.join(_known_versions(arch))}); it stops at start"),
            trainer_source=_VERSION_SOURCE.get(arch.prefix, "")))
        return Parsed(trainer, values, None, reason, True, None, findings, SUPPORTED, not_checked=(
            f"not checked: {version_key} is no {arch.display} version musubi-tuner or te-align knows"))
    if target is None:
        return Parsed(trainer, values, None, reason, True, None, findings,
                      SUPPORTED, not_checked=f"not checked: te-align has no profile for {arch.display} ({reason})")
    if version_key:
        reason = f"{reason} and {version_key}"
    profile = _bundled(target)
    supported: tuple[str, ...] = SUPPORTED
    if profile in bundled_names():  # the family of a profile the script and version name (FLUX.2, Z-Image, Edit…)
        supported = (*SUPPORTED, family_of(profile))
    else:  # te-align does not bundle it: "not checked", naming the nearest (the key findings still count)
        return Parsed(trainer, values, None, reason, True, None, findings, SUPPORTED,
                      not_checked=unbundled_reason(profile, reason))
    if arch.prefix == "qwen_image" and profile != "qwen-image":  # Qwen-Image's text-to-image rows are not the Edit's
        trainer.rules = tuple(r for r in trainer.rules if "qwen-image" not in r.families)
    if arch.prefix not in ("qwen_image", "wan") or (profile != "qwen-image" and arch.prefix == "qwen_image"):
        trainer.not_settable = NOT_SETTABLE_UNHOOKED.format(what=names.QWEN_VERSIONS.get(
            names.qwen_version(values), arch.display) if arch.prefix == "qwen_image" else arch.display)
    if arch.prefix == "flux_kontext":
        findings.append(Finding(kind="note", severity="info", setting="profile", message=(
            "FLUX.1 Kontext is checked with the flux-dev profile: diffusers' FluxKontextPipeline encodes the prompt "
            "as FluxPipeline does (T5 at 512 without a mask, CLIP-L pooled at 77)")))
    task = str(values.get("task") or "")
    if arch.prefix == "wan" and task in names.WAN22_TASKS:
        findings.append(Finding(kind="note", severity="info", setting="profile", message=(
            f"Wan 2.2 (--task {task}) is checked with the wan21 profile: diffusers' WanPipeline encodes both with the "
            "same umT5-XXL at 512 tokens")))
    if kind == names.TE_CACHE_KIND and values.get("skip_existing"):
        findings.append(Finding(
            kind="note", severity="info", setting="skip_existing", key="skip_existing",
            line=cli_lines("skip_existing") if "skip_existing" in set(order) else lines("skip_existing"),
            message=("--skip_existing keeps every text-encoder cache file already there: it skips a caption whose "
                     "cache file name exists, and the name comes from the item's file name and the architecture "
                     "alone, so files encoded with another text encoder, length or template are kept as they are and "
                     "training reads them"),
            fix="after changing a text-encoder setting, cache once without --skip_existing",
            trainer_source="musubi-tuner: cache_text_encoder_outputs.py:60-69 (the existing files), :104-111 (skipped "
                           "by file name only); dataset/image_video_dataset.py:168-171 (the name)"))
    if kind in names.TRAIN_KINDS:
        findings.append(Finding(kind="note", severity="info", setting="text-encoder cache", message=(
            f"{script} reads the captions' text-encoder outputs from the cache that {te_cache_script(arch)} wrote "
            "(its text encoder runs for sample prompts only): the settings that decide training are that step's")))
    return Parsed(trainer, values, profile, reason, True, None, findings,
                  supported, guess_is_default=False, caption_dirs=media, extra={"cache_dirs": caches},
                  caption_sources=caption_sources(dataset or {}))


#: Where musubi-tuner reads --model_version (argparse / resolve_model_version_args).
_VERSION_SOURCE = {"qwen_image": f"musubi-tuner: {_Q}:1564-1582", "flux_2": f"musubi-tuner: {_F2}:116-118"}


def _known_versions(arch: names.Arch) -> list[str]:
    return list(names.QWEN_PROFILES if arch.prefix == "qwen_image" else names.FLUX2_PROFILES)


def unbundled_reason(name: str, why: str) -> str:
    """"not checked: te-align has no profile for NAME (why); the nearest it has, …" (check's own wording)."""
    from te_align.audit.check import _refuse_unbundled
    from te_align.audit.readers import NotChecked

    try:
        _refuse_unbundled(name, why, "")
    except NotChecked as e:
        return e.reason
    return f"not checked: te-align has no profile for {name} ({why})"


def _bundled(name: str) -> str:
    """The bundled profile a name or alias stands for (the name itself where te-align bundles none)."""
    if name in bundled_names():
        return name
    from te_align.profiles.registry import bundled_name

    return bundled_name(name) or name




def _dataset_findings(data: dict[str, Any], file: str, lines: KeyLines) -> list[Finding]:
    """Unknown keys of a dataset config: its voluptuous schema refuses them (dataset/config_utils.py:111-176)."""
    keys = valid_keys()
    out: list[Finding] = []
    src = "musubi-tuner: dataset/config_utils.py:111-176 (voluptuous Schema)"
    behaviour = "the dataset config's schema refuses unknown keys: musubi-tuner stops before caching or training"
    for k in data:
        if k not in keys["dataset"]:
            out.append(unknown_key_finding(k, keys["dataset"], trainer=src, line=lines(k), severity="error",
                                           behaviour=behaviour))
    general = data.get("general")
    for k in general if isinstance(general, dict) else {}:
        if k not in keys["dataset.general"]:
            out.append(unknown_key_finding(k, keys["dataset.general"], trainer=src, line=lines(k), section="general",
                                           severity="error", behaviour=behaviour))
    for i, ds in enumerate(data.get("datasets", []) if isinstance(data.get("datasets"), list) else []):
        if not isinstance(ds, dict):
            continue
        kind = "dataset.video" if "video_directory" in ds or "video_jsonl_file" in ds else "dataset.image"
        for k in ds:
            if k not in keys[kind]:
                out.append(unknown_key_finding(k, keys[kind], trainer=src, line=lines(k), section=f"datasets[{i}]",
                                               severity="error", behaviour=behaviour))
    return out


def _trainer(raw: RawConfig, cli_keys: set[str], cli_line: Callable[[str], int | None],
             lines: KeyLines) -> Trainer:
    def fix_set(key: str, value: Any) -> str:
        if raw.fmt == "toml" and key not in cli_keys:
            return f"{key} = {json.dumps(value)}"
        return f"--{key}" if value is True else f"--{key} {json.dumps(value) if isinstance(value, str) else value}"

    def fix_remove(key: str) -> str:
        return f"remove {key} from {raw.file}" if raw.fmt == "toml" and key not in cli_keys else f"remove --{key}"

    return Trainer(NAME, RULES, fix_set, fix_remove, lambda key: cli_line(key) if key in cli_keys else lines(key),
                   not_settable=NOT_SETTABLE)


# ------------------------------------------------------------------------------------ cache files
def cache_record(path: Path) -> dict[str, Any]:
    """What one ``*_te.safetensors`` file records: the longest text length of its tensors and te-align's
    fingerprint (``""``: none), from the header only."""
    header = read_header(path)
    rows = [t.shape[0] for name, t in header.tensors.items() if name.startswith("varlen_") and len(t.shape) >= 2]
    out: dict[str, Any] = {"fingerprint": (header.metadata or {}).get(META_FINGERPRINT, "")}
    if rows:
        out["rows"] = max(rows)
    return out


def scan_cache(directory: str, profile: AlignmentProfile) -> CacheScan:
    """musubi-tuner's ``*_te.safetensors`` in ``directory``: fingerprints (te-align's hooks stamp them) and, since
    every caption is cached at its own length, no one length to compare (the longest is reported as a note)."""
    from collections import Counter

    found = bad = 0
    fingerprints: Counter[str] = Counter()
    for f in Path(directory).rglob("*_te.safetensors"):
        found += 1
        try:
            rec = cache_record(f)
        except UNREADABLE:
            bad += 1
            continue
        fingerprints[rec["fingerprint"]] += 1
    return CacheScan(found, Counter(), bad, "", fingerprints)


# ------------------------------------------------------------------------------------ the key table
def _argparse_options(root: Path, script: str) -> set[str]:
    """Options of a script's parser, read from the source: every ``add_argument("--name")`` (and its ``dest``) in the
    functions its ``main`` calls, followed through the script's own functions and the functions it imports (``from m import f``,
    ``import m`` + ``m.f``)."""
    import ast

    pkg = root / "src"
    modules: dict[str, ast.Module] = {}

    def module(name: str) -> ast.Module | None:
        if name not in modules:
            path = pkg.joinpath(*name.split("."))
            path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
            try:
                modules[name] = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError):
                modules[name] = None  # type: ignore[assignment]
        return modules[name]

    def scope(name: str) -> tuple[dict[str, ast.FunctionDef], dict[str, str], dict[str, tuple[str, str]]]:
        tree = module(name)
        funcs, mods, names_ = {}, {}, {}
        for node in tree.body if tree else []:
            if isinstance(node, ast.FunctionDef):
                funcs[node.name] = node
            elif isinstance(node, ast.Import):
                for a in node.names:
                    mods[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    target = f"{node.module}.{a.name}"
                    if module(target) is not None:
                        mods[a.asname or a.name] = target
                    else:
                        names_[a.asname or a.name] = (node.module, a.name)
        return funcs, mods, names_

    out: set[str] = set()
    seen: set[tuple[str, str]] = set()
    start = "musubi_tuner." + script.removesuffix(".py")
    todo = [(start, "main")]
    while todo:
        mod, fn_name = todo.pop()
        if (mod, fn_name) in seen:
            continue
        seen.add((mod, fn_name))
        funcs, mods, names_ = scope(mod)
        fn = funcs.get(fn_name)
        if fn is None:
            if fn_name in names_:
                todo.append(names_[fn_name])
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "add_argument":
                for a in node.args:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                        out.add(a.value[2:].replace("-", "_"))
                for k in node.keywords:  # dest: the name a --config_file TOML key sets (--dino_loss_no_norm)
                    if k.arg == "dest" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str):
                        out.add(k.value.value)
            elif isinstance(f, ast.Name):
                if f.id in funcs:
                    todo.append((mod, f.id))
                elif f.id in names_:
                    todo.append(names_[f.id])
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in mods:
                todo.append((mods[f.value.id], f.attr))
    return out


def _schema_keys(root: Path) -> dict[str, set[str]]:
    """The dataset config's keys: the dict literals of ConfigSanitizer (dataset/config_utils.py)."""
    import ast

    tree = ast.parse((root / "src" / "musubi_tuner" / "dataset" / "config_utils.py").read_text(encoding="utf-8"))
    tables: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    tables[t.id] = {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    general = tables["DATASET_ASCENDABLE_SCHEMA"]
    return {"dataset": {"general", "datasets"}, "dataset.general": set(general),
            "dataset.image": general | tables["IMAGE_DATASET_DISTINCT_SCHEMA"],
            "dataset.video": general | tables["VIDEO_DATASET_DISTINCT_SCHEMA"]}


def scripts(root: Path) -> list[str]:
    """Every training and caching script of a checkout (``src/musubi_tuner/*.py`` that :func:`names.script_arch`
    knows)."""
    return sorted(f.name for f in (root / "src" / "musubi_tuner").glob("*.py") if names.script_arch(f.name))


def key_table(root: Path) -> dict[str, set[str]]:
    """The bundled key table of a checkout: one section per training / caching script (its argparse options) and the
    dataset config's sections."""
    out = {script[:-3]: _argparse_options(root, script) for script in scripts(root)}
    out.update(_schema_keys(root))
    return out


def _main(argv: list[str] | None = None) -> int:
    """``python -m te_align.trainers.musubi.audit CHECKOUT [--write] [--commit SHA]``: the bundled key table from a checkout."""
    import re

    args = sys.argv[1:] if argv is None else argv
    if not args or not (Path(args[0]) / "src" / "musubi_tuner").is_dir():
        print("usage: python -m te_align.trainers.musubi.audit MUSUBI_TUNER_CHECKOUT [--write]", file=sys.stderr)
        return 2
    root = Path(args[0])
    known = set(scripts(root))
    unknown = sorted(f.name for f in (root / "src" / "musubi_tuner").glob("*.py")
                     if re.search(r"(?:^|_)(?:train|cache_[a-z_]+)\w*\.py$", f.name) and f.name not in known)
    if unknown:  # a new architecture: add it to names.ARCHS (its scripts then get their own section)
        print(f"not in names.ARCHS / names.KINDS (no section): {', '.join(unknown)}", file=sys.stderr)
    lines = [f"# Generated by `python tools/gen_audit_keys.py musubi CHECKOUT --write` from kohya-ss/musubi-tuner@"
             f"{checkout_commit(root, args)}.",
             "# Options of every training and caching script (argparse names, one section per script, read from the",
             "# add_argument calls its main reaches), and the keys of the dataset config (voluptuous schema of",
             "# dataset/config_utils.py)."]
    for section, keys in key_table(root).items():
        lines.append(f"[{section}]")
        lines += sorted(keys)
    return emit_key_table(lines, args, Path(__file__).with_name("data") / "musubi.txt")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
