"""ostris/ai-toolkit job YAML (``config.process[0]``).

Facts read at ostris/ai-toolkit@27a03a91f23eb1b757d5ec2e80ee3e129cfcc350; ``source`` gives file:line at that
commit. Config classes read known keys with ``kwargs.get`` and ignore the rest silently
(jobs/process/BaseSDTrainProcess.py:107-166). ai-toolkit has no key for any T5/LLM length, clip skip or
system prompt.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from te_align.audit import rules
from te_align.audit.cachefiles import CacheScan, safetensors_record, scan
from te_align.audit.findings import Finding
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
from te_align.audit.readers import ConfigSyntaxError, NotChecked, RawConfig, UnreadableConfig, known_keys
from te_align.audit.rules import ByProfile, Context, Rule, Trainer, no_fix_set
from te_align.profiles.registry import bundled_name
from te_align.trainers.ai_toolkit import names as aitk_table

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

_TT = "toolkit/train_tools.py"
#: What "no key fixes this" says for the newer families: te-align's ai-toolkit hooks do not encode them.
NOT_SETTABLE = ("not settable: hard-coded in ai-toolkit (no config key), and te-align's ai-toolkit hooks do not "
                "encode this model; the fix is a change to ai-toolkit's code")
_SDM = "toolkit/stable_diffusion_model.py"

# ------------------------------------------------------------------------------------ converters
def _aitk_pixart_len(v: Any, ctx: Context) -> Any:
    # ai-toolkit: arch pixart -> 300 if is_pixart_sigma else 120; arch pixart_sigma -> the generic T5 branch's 256.
    if ctx.values.get("model._pixart_route") == "pixart_sigma":
        return 256
    return 300 if rules.truthy(v) else 120


def _aitk_pixart_len_back(p: Any, ctx: Context) -> Any:
    if p == 300:
        return True
    raise LookupError


def _aitk_pixart_zero(v: Any, ctx: Context) -> Any:
    return ctx.values.get("model._pixart_route") == "pixart_sigma"


def _aitk_pixart_denoiser(v: Any, ctx: Context) -> Any:
    return ctx.values.get("model._pixart_route") != "pixart_sigma"


rules.register("aitk_pixart_len", _aitk_pixart_len, _aitk_pixart_len_back, "bool")
rules.register("aitk_pixart_zero", _aitk_pixart_zero, rules.bool_back, "bool")
rules.register("aitk_pixart_denoiser", _aitk_pixart_denoiser, rules.bool_back, "bool")


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
    Rule(None, ("*",), "train.text_encoder_lr", None,
         "TrainConfig stores it and nothing reads it: a text-encoder LoRA (train.train_text_encoder) and a full "
         "text-encoder fine-tune train at train.lr, so the text encoder does not train at this rate",
         "toolkit/config_modules.py:383 (stored, never read); jobs/process/BaseSDTrainProcess.py:2024-2027 (network "
         "text_encoder_lr = train.lr), :2146-2151 (fine-tune text_encoder_lr = train.lr)", honoured="never"),
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
         "extensions_built_in/diffusion_models/qwen_image/qwen_image.py:371-387", captions="over512"),
    Rule("t5.tokenizer.max_length", ("wan",), None, 512, "pipeline.encode_prompt(max_sequence_length=512)",
         "toolkit/models/wan21/wan21.py:605-615"),
    # ---- PixArt. ai-toolkit's arch decides the route (toolkit/config_modules.py:634-640,775-809): arch "pixart"
    # (or is_pixart) -> encode_prompts_pixart with 300 tokens when is_pixart_sigma, else 120, and the mask to the
    # transformer; arch "pixart_sigma" (or is_pixart_sigma alone) is not "is_pixart" (the property compares the arch,
    # toolkit/stable_diffusion_model.py:266-267), so encode_prompt takes its generic T5 branch: 256 tokens, padded
    # outputs zeroed, no mask to the transformer. Neither cleans captions.
    Rule("t5.tokenizer.max_length", ("pixart",), "model.is_pixart_sigma", False,
         "arch pixart: 300 tokens with is_pixart_sigma, else 120; arch pixart_sigma: the generic T5 branch's 256",
         f"{_SDM}:2442-2449,2502-2510; {_TT}:425-450", convert="aitk_pixart_len",
         fix='model.arch: "pixart" with {set}', also=(("model.arch", "pixart"),)),
    Rule("t5.tokenizer.text_cleaning", ("pixart",), None, "none",
         "captions go to the T5 tokenizer as they are: no PixArt caption cleaning and no lower-casing",
         f"{_TT}:425-450"),
    Rule("t5.masks.encoder", ("pixart",), None, True, "the tokenizer mask goes into T5", f"{_TT}:459-464"),
    Rule("t5.masks.zero_padded", ("pixart",), "model.is_pixart_sigma", False,
         "arch pixart_sigma: the generic T5 branch multiplies padded outputs by 0", f"{_SDM}:2502-2520",
         convert="aitk_pixart_zero", fix='model.arch: "pixart" with model.is_pixart_sigma: true'),
    Rule("t5.masks.denoiser", ("pixart",), "model.is_pixart_sigma", False,
         "arch pixart passes the mask to the transformer as encoder_attention_mask; the generic T5 branch returns "
         "no mask", f"{_SDM}:2096,2130-2134,2513-2519", convert="aitk_pixart_denoiser",
         fix='model.arch: "pixart" with model.is_pixart_sigma: true'),
    # ---- AuraFlow (is_auraflow / arch auraflow): encode_prompts_auraflow
    Rule("t5.tokenizer.max_length", ("auraflow",), None, 256, "encode_prompts_auraflow(max_length=256)",
         f"{_SDM}:2455-2462; {_TT}:469-492"),
    Rule("t5.masks.encoder", ("auraflow",), None, True, "the tokenizer mask goes into the UMT5 encoder",
         f"{_TT}:502-503"),
    Rule("t5.masks.zero_padded", ("auraflow",), None, True, "padded outputs are multiplied by the mask (zeros)",
         f"{_TT}:504-505"),
)

_DM = "extensions_built_in/diffusion_models"
_F2 = f"{_DM}/flux2/src/pipeline.py"
#: FLUX.2 dev's system message as ai-toolkit's vendored pipeline writes it (a newline after "object", as diffusers).
FLUX2_SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured responses focusing "
                        "on object relationships, object\nattribution and actions without speculation.")

#: The newer families: each model class's get_prompt_embeds, read at the commit. These are checked by `te-align
#: check`; ai-toolkit has no key for any of them (the fix is a code change, not a config key).
NEW_RULES: tuple[Rule, ...] = (
    # FLUX.2 dev (arch flux2): the vendored Flux2Pipeline (flux2/src/pipeline.py), Mistral chat template
    Rule("mistral.tokenizer.max_length", ("flux2",), None, 512,
         "the vendored Flux2Pipeline.encode_prompt: apply_chat_template(padding='max_length', truncation=True, "
         "max_length=MAX_LENGTH 512)", f"{_F2}:40,112-120; {_DM}/flux2/flux2_model.py:466-472"),
    Rule("mistral.encoder.layer", ("flux2",), None, (10, 20, 30), "hidden_states OUTPUT_LAYERS_MISTRAL [10, 20, 30]",
         f"{_F2}:38,139-141"),
    Rule("mistral.tokenizer.system_prompt", ("flux2",), None, FLUX2_SYSTEM_MESSAGE,
         "SYSTEM_MESSAGE (with the newline after 'object') as the system turn", f"{_F2}:36-37,80-90"),
    # FLUX.2 klein (arch flux2_klein_4b / flux2_klein_9b): the same vendored pipeline's Qwen3 branch
    Rule("qwen3.tokenizer.max_length", ("flux2-klein",), None, 512,
         "tokenizer(text, padding='max_length', truncation=True, max_length=MAX_LENGTH 512)", f"{_F2}:40,172-178"),
    Rule("qwen3.encoder.layer", ("flux2-klein",), None, (9, 18, 27), "hidden_states OUTPUT_LAYERS_QWEN3 [9, 18, 27]",
         f"{_F2}:39,194-195"),
    Rule("qwen3.tokenizer.enable_thinking", ("flux2-klein",), None, False,
         "apply_chat_template(add_generation_prompt=True, enable_thinking=False)", f"{_F2}:164-171"),
    # Z-Image (arch zimage): diffusers' ZImagePipeline.encode_prompt with its defaults
    Rule("qwen3.tokenizer.max_length", ("z-image",), None, 512,
         "ZImagePipeline.encode_prompt(prompt, do_classifier_free_guidance=False) with its default "
         "max_sequence_length 512", f"{_DM}/z_image/z_image.py:406-414"),
    # Qwen-Image-Edit: the condition image is resized on the tensor (F.interpolate, bilinear) to the pipeline's area,
    # rounded to 32, then diffusers' encode_prompt builds the template
    Rule("qwen.images.area", ("qwen-image-edit",), None, ByProfile({"qwen-image-edit": 1024 * 1024, "*": 384 * 384}),
         "control images resized to the pipeline's area (original Edit: 1024*1024; plus: CONDITION_IMAGE_SIZE "
         "384*384) before encode_prompt",
         f"{_DM}/qwen_image/qwen_image_edit.py:184-205; {_DM}/qwen_image/qwen_image_edit_plus.py:196-219"),
    Rule("qwen.images.resample", ("qwen-image-edit",), None, "bilinear",
         "control images are resized as tensors with F.interpolate(mode='bilinear'); the pipelines resize PIL "
         "images with the image processor's lanczos",
         f"{_DM}/qwen_image/qwen_image_edit.py:199-201; {_DM}/qwen_image/qwen_image_edit_plus.py:210-212",
         severity="warning"),
)
_K2 = f"{_DM}/krea2"
_I4 = f"{_DM}/ideogram4"
_LTX = f"{_DM}/ltx2/ltx2.py"


def _aitk_krea2_len(v: Any, ctx: Context) -> Any:
    # model_kwargs.max_text_length (default 512): prefix + caption truncated at max_text_length + 34, no padding, then
    # the 5 suffix tokens: up to max_text_length + 5 positions after the prefix is dropped (the pipeline: 512 in all)
    n = rules.int_or_none(v)
    return (512 if n is None else n) + 5


def _aitk_krea2_len_back(p: Any, ctx: Context) -> Any:
    if not isinstance(p, int) or p <= 5:
        raise LookupError
    return p - 5


rules.register("aitk_krea2_len", _aitk_krea2_len, _aitk_krea2_len_back, "int")
rules.register("aitk_len_3072", lambda v, ctx: 3072 if rules.int_or_none(v) is None else rules.int_or_none(v),
               rules.CONVERTERS["same"].back, "int")

#: Krea 2's template as ai-toolkit's vendored text encoder writes it (prefix + caption; the suffix tokenized alone).
KREA2_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                  "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{prompt}"
                  "<|im_end|>\n<|im_start|>assistant\n")
IDEOGRAM_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
#: ai-toolkit's Ideogram caption rewrite (toolkit/ideogram_caption.py:303-319 digest_caption_string).
IDEOGRAM_DIGEST = "structured Ideogram JSON captions re-serialized (old format migrated, compact); other text as is"

NEW_RULES += (
    # Krea 2 (arch krea2): krea2.py get_prompt_embeds -> src/text_encoder.py encode_krea_prompt, one caption at a time
    Rule("qwen.tokenizer.template", ("krea2",), None, KREA2_TEMPLATE,
         "PROMPT_TEMPLATE_ENCODE_PREFIX + caption; PROMPT_TEMPLATE_ENCODE_SUFFIX tokenized alone and appended",
         f"{_K2}/src/text_encoder.py:28-33,72-76,104,114"),
    Rule("qwen.tokenizer.max_length", ("krea2",), "model.model_kwargs.max_text_length", None,
         "each caption is encoded alone at its own length: prefix + caption truncated at max_text_length + 34 "
         "(model_kwargs.max_text_length, default 512), then the 5 suffix tokens, so up to max_text_length + 5 "
         "positions remain after the prefix is dropped, where the pipeline keeps 512 in all (caption cut at 507 "
         "tokens)", f"{_K2}/krea2.py:189-191,744-755; {_K2}/src/text_encoder.py:103-112,114",
         convert="aitk_krea2_len", captions="over512"),
    Rule("qwen.tokenizer.drop_start_tokens", ("krea2",), None, 34, "PROMPT_TEMPLATE_ENCODE_START_IDX 34 dropped",
         f"{_K2}/src/text_encoder.py:36,135"),
    Rule("qwen.encoder.position_ids", ("krea2",), None, "real_tokens",
         "no padding at all (one caption at a time), so the raw positions are the real tokens' count, as the "
         "pipeline's cumsum positions", f"{_K2}/src/text_encoder.py:103-130"),
    Rule("qwen.encoder.layer", ("krea2",), None, (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),
         "SELECT_LAYERS (2, 5, ..., 35) of hidden_states", f"{_K2}/src/text_encoder.py:23,133"),
    Rule("qwen.encoder.layer_combine", ("krea2",), None, "stack",
         "torch.stack(dim=2): (sequence, layers, width) per caption, restored from the flattened cache at the model "
         "call", f"{_K2}/src/text_encoder.py:133; {_K2}/krea2.py:756-758"),
    # Ideogram 4 (arch ideogram4): ideogram4.py get_prompt_embeds, one caption at a time at its own length
    Rule("qwen.tokenizer.template", ("ideogram4",), None, IDEOGRAM_TEMPLATE,
         "apply_chat_template([{'role': 'user', 'content': [{'type': 'text', ...}]}], add_generation_prompt=True)",
         f"{_I4}/ideogram4.py:523-527"),
    Rule("qwen.tokenizer.text_cleaning", ("ideogram4",), None, IDEOGRAM_DIGEST,
         "digest_caption_string: a caption that is a structured Ideogram JSON caption is parsed, migrated to the "
         "current schema and re-serialized compact before encoding; plain text passes unchanged. The pipeline encodes "
         "the prompt as given, so only JSON captions written otherwise differ",
         f"{_I4}/ideogram4.py:519-522; toolkit/ideogram_caption.py:303-319", severity="info"),
    Rule("qwen.tokenizer.add_special_tokens", ("ideogram4",), None, False, "tokenizer(add_special_tokens=False)",
         f"{_I4}/ideogram4.py:527-532"),
    Rule("qwen.tokenizer.max_length", ("ideogram4",), "model.model_kwargs.max_text_length", 3072,
         "model_kwargs.max_text_length (default 3072) is where a caption is cut (truncation=True); the pipeline "
         "refuses captions over 2048 tokens, so captions of 2049-3072 tokens train on text inference cannot take",
         f"{_I4}/ideogram4.py:183-188,527-532", convert="aitk_len_3072", severity="warning"),
    Rule("qwen.tokenizer.truncation", ("ideogram4",), None, True,
         "truncation=True: a caption over max_text_length tokens is cut where the pipeline raises",
         f"{_I4}/ideogram4.py:527-532", severity="info"),
    Rule("qwen.encoder.position_ids", ("ideogram4",), None, "real_tokens",
         "pos = mask.cumsum - 1 over the caption's own tokens (no padding)", f"{_I4}/ideogram4.py:537-539"),
    Rule("qwen.encoder.layer", ("ideogram4",), None, (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 35),
         "QWEN3_VL_ACTIVATION_LAYERS (0, 3, ..., 33, 35)", f"{_I4}/src/transformer.py:40; {_I4}/src/pipeline.py:136-150"),
    Rule("qwen.encoder.layer_taps", ("ideogram4",), None, "decoder_layers",
         "the outputs of those decoder layers, driven one by one (the last before the final norm)",
         f"{_I4}/src/pipeline.py:108-150"),
    Rule("qwen.encoder.layer_combine", ("ideogram4",), None, "interleave",
         "stack(dim=0).permute(1, 2, 3, 0).reshape: width-major, layer fastest", f"{_I4}/src/pipeline.py:150-154"),
    # LTX-2 / 2.3 (arch ltx2, ltx2.3): ltx2.py get_prompt_embeds (Gemma 3), the connectors run at the model call
    Rule("gemma.tokenizer.max_length", ("ltx2",), None, 1024, "tokenizer(max_length=1024, truncation=True)",
         f"{_LTX}:1119-1127"),
    Rule("gemma.tokenizer.padding", ("ltx2",), None, "longest",
         "Gemma sees the batch padded to its longest caption only (padding='longest'; 'max_length' is commented "
         "out); the embeddings are then zero-padded on the left to 1024 with mask 0 (pad_embeds). The connectors "
         "normalise over the mask and replace masked positions with their registers, so only the masked positions' "
         "features differ (zeros, not Gemma's <pad> states)",
         f"{_LTX}:1119-1127,838-859,884", severity="info"),
    Rule("gemma.tokenizer.padding_side", ("ltx2",), None, "left", "tokenizer.padding_side = 'left'", f"{_LTX}:1113-1114"),
    Rule("gemma.tokenizer.text_cleaning", ("ltx2",), None, "strip", "[p.strip() for p in prompt]", f"{_LTX}:1118"),
    Rule("gemma.tokenizer.add_special_tokens", ("ltx2",), None, True, "add_special_tokens=True (<bos>)",
         f"{_LTX}:1119-1127"),
    Rule("gemma.encoder.layer", ("ltx2",), None, tuple(range(49)),
         "every hidden state (the embeddings and the 48 layers)", f"{_LTX}:1134-1140"),
    Rule("gemma.encoder.layer_combine", ("ltx2",), None, "interleave",
         "stack(dim=-1).flatten(2, 3): width-major, layer fastest", f"{_LTX}:1139-1143"),
    Rule("gemma.masks.denoiser", ("ltx2",), None, True, "the mask goes with the embeddings to the connectors",
         f"{_LTX}:1150-1155,1030-1042"),
)
RULES = RULES + NEW_RULES  # one table (te_align.audit.reach counts RULES)
#: FLUX.1 Kontext (arch flux_kontext): its own get_prompt_embeds; model.attn_masking is not read there.
KONTEXT_RULES: tuple[Rule, ...] = (
    Rule("t5.tokenizer.max_length", ("flux",), None, 512, "encode_prompts_flux(max_length=512)",
         f"{_DM}/flux_kontext/flux_kontext.py:354-362"),
    Rule("t5.masks.zero_padded", ("flux",), None, False, "encode_prompts_flux without attn_mask: padded T5 outputs "
         "are kept", f"{_DM}/flux_kontext/flux_kontext.py:357-362; {_TT}:569-572"),
)

SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "lumina2", "hidream", "qwen-image", "wan", "pixart", "auraflow",
             "flux2", "flux2-klein", "z-image", "qwen-image-edit", "krea2", "ideogram4", "ltx2")

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

def scan_cache(directory: str, profile: AlignmentProfile) -> CacheScan:
    """ai-toolkit's cached ``*.safetensors`` (``text_embed``, toolkit/prompt_utils.py:119-141), from their headers;
    the length is the profile's T5 slot's (else its last slot's)."""
    from functools import partial

    slot = "t5" if "t5" in profile.slot_names else profile.slot_names[-1]
    return scan(directory, [("*.safetensors", partial(safetensors_record, tensor="text_embed"),
                             f"{slot}.tokenizer.max_length")])


_SECTIONS = ("model", "train", "network", "save", "sample", "logging", "slider")

#: Jobs and process types that do not train (config/examples: extract, generate, mod_lora_scale; extension uids
#: of generators, captioners, dataset tools and the example merge extension).
NON_TRAINING_JOBS = {"extract": "extracts a LoRA", "generate": "generates images", "mod": "modifies a LoRA"}
NON_TRAINING_TYPES = {
    "example_merge_extension": "merges models (extensions/example)",
    "reference_generator": "generates images (extensions_built_in/advanced_generator)",
    "pure_lora_generator": "generates images (extensions_built_in/advanced_generator)",
    "batch_img2img": "generates images (extensions_built_in/advanced_generator)",
    "dataset_tools": "prepares datasets", "sync_from_collection": "prepares datasets", "super_tagger": "captions images",
    "AceStepCaptioner": "captions data", "Qwen3VLCaptioner": "captions data", "Qwen3OmniCaptioner": "captions data",
    "Ideogram4Captioner": "captions data",
}
#: Archs te-align has no profile for, by the name the model goes by.
NO_PROFILE = {"omnigen2": "OmniGen2", "flex2": "Flex.2", "hidream_e1": "HiDream-E1",
              "ltx2.5": "LTX-2.5, a Gemma 4 text encoder (the nearest te-align has, ltx2, is not used in its place)",
              "wan22_14b_i2v": "Wan 2.2 I2V A14B"}


def _process(data: Any, file: str) -> dict[str, Any]:
    cfg = data.get("config") if isinstance(data, dict) else None
    procs = cfg.get("process") if isinstance(cfg, dict) else None
    if not isinstance(procs, list) or not procs or not isinstance(procs[0], dict):
        raise UnreadableConfig("expected config.process[0] (an ai-toolkit job)", file=file)
    return procs[0]


def guess_profile(model: dict[str, Any]) -> tuple[str | None, str]:
    """The bundled profile a ``model:`` section trains: the trainer table's arch (or ``is_*`` flag), refined by
    ``name_or_path`` (a local folder's or checkpoint's files, else its name) and, for FLUX.1, by a training adapter
    (``assistant_lora_path``: ai-toolkit then treats the model as schnell). Where nothing decides between two
    profiles of a family, the reason carries the assumption (:func:`te_align.audit.parsed.reason`)."""
    path = model.get("name_or_path")
    by_name, files, decided = guess_model(path)
    arch = aitk_table.arch_name(model)
    if arch:
        prof = aitk_table.ARCHS[arch][0] if arch in aitk_table.ARCHS and arch not in NO_PROFILE else None
        prof = aitk_table.CHECK_ONLY.get(arch, prof)
        if prof is None:
            return None, f"model.arch {arch!r}"
        if arch == "pixart" and model.get("is_pixart_sigma"):
            return "pixart-sigma", "model.arch 'pixart' with is_pixart_sigma"
        why = f"model.arch {arch!r}"
        if arch == "qwen_image_edit_plus":  # 2509 and 2511 share the arch: the model's name says which
            named = by_name if by_name and by_name.startswith("qwen-image-edit-") else None
            if named:
                return named, f"{why} and model.name_or_path {path!r}{files}"
            return prof, reason(f"{why}; {prof} assumed", f"{prof} assumed: model.name_or_path {path!r} does not say "
                                "whether it is Qwen-Image-Edit-2509 or -2511 (pass --profile qwen-image-edit-2511 if "
                                "it is that)")
        if arch in aitk_table.CHECK_ONLY:  # the arch alone names the profile (not bundled: "not checked")
            return prof, why
    else:
        flagged = aitk_table.flag_arch(model)
        if flagged is None:
            if by_name:
                said = f"model.name_or_path {path!r}{files}"
                return by_name, said if decided else reason(f"{said}; {by_name} assumed", assumption(
                    by_name, "model.name_or_path (its name or files)"))
            return "sd15", "no model.arch or is_* flag (ai-toolkit defaults to sd1)"
        prof = aitk_table.ARCHS[flagged][0]
        why = f"model.{next(f for f, a in aitk_table.FLAGS if a == flagged)}"
    if by_name and decided and bundled_name(by_name) is None:  # a version te-align has no profile for: never prof
        return by_name, f"{why} and model.name_or_path {path!r}{files}"
    if by_name and decided and _family(by_name) == _family(prof):
        return by_name, f"{why} and model.name_or_path {path!r}{files}"
    adapter = model.get("assistant_lora_path")
    if _family(prof) == "flux" and adapter:
        return "flux-schnell", (f"{why} with model.assistant_lora_path {adapter!r}: a training adapter, ai-toolkit "
                                "treats the model as FLUX.1 schnell (toolkit/stable_diffusion_model.py:718-721)")
    if arch == "flex1" or "flex.1" in str(path or "").lower():
        return prof, why  # Flex.1 is trained at 512 T5 tokens like FLUX.1 dev (the Flex.1 note says so)
    said = assumption(prof, "model.name_or_path (its name or files) or model.assistant_lora_path")
    return prof, reason(f"{why}; {prof} assumed", said) if said else why




def _edit_plus_batch(model: dict[str, Any], values: dict[str, Any], cached: bool, lines: KeyLines) -> list[Finding]:
    """Qwen-Image-Edit-Plus with train.batch_size > 1 and text embeddings encoded during training: its
    get_prompt_embeds encodes, for each batch item, every caption of the batch with that item's control images
    (qwen_image_edit_plus.py:196-219); the edit-plus processor refuses more "Picture N" image places than images,
    so the step fails. Cached embeddings are encoded one caption at a time (toolkit/dataloader_mixins.py:2363)."""
    size = rules.int_or_none(values.get("train.batch_size")) or 1
    if aitk_table.arch_name(model) != "qwen_image_edit_plus" or size <= 1 or cached:
        return []
    return [Finding(
        kind="deviation", severity="warning", setting="train.batch_size", effective=size, key="train.batch_size",
        message=(f"train.batch_size = {size} with text embeddings encoded during training: ai-toolkit's "
                 "Qwen-Image-Edit-Plus get_prompt_embeds passes every caption of the batch with one item's control "
                 "images to encode_prompt, once per item, so the text has more image places than images and "
                 "encode_prompt's processor stops; with batch_size 1 or cached embeddings each caption is encoded "
                 "with its own images"),
        fix="train.cache_text_embeddings: true (each caption encoded alone with its own control images), or "
            "train.batch_size: 1",
        trainer_source=(f"{_DM}/qwen_image/qwen_image_edit_plus.py:196-219; "
                        "extensions_built_in/sd_trainer/SDTrainer.py:1749-1755; toolkit/dataloader_mixins.py:2363; "
                        "toolkit/config_modules.py:393,566"),
        line=lines("batch_size"))]


def pixart_route(model: dict[str, Any]) -> str | None:
    """ai-toolkit's own arch for a PixArt config (config_modules.py:775-809): "pixart" or "pixart_sigma"."""
    arch = aitk_table.arch_name(model)
    if arch:
        return arch if arch in ("pixart", "pixart_sigma") else None
    for flag, name in (("is_v2", None), ("is_v3", None), ("is_xl", None), ("is_pixart", "pixart"),
                       ("is_pixart_sigma", "pixart_sigma")):
        if model.get(flag):
            return name
    return None


def _no_profile(model: dict[str, Any]) -> str | None:
    """The model's name when te-align has no profile for it (Kontext, Qwen-Image-Edit, Flex.2, PixArt-α, …)."""
    arch = aitk_table.arch_name(model)
    if pixart_route(model) == "pixart" and not model.get("is_pixart_sigma") and "sigma" not in str(
            model.get("name_or_path") or "").lower():
        return "PixArt-α (model.is_pixart / arch pixart without is_pixart_sigma)"
    if arch and (arch in NO_PROFILE or arch not in aitk_table.ARCHS) and arch not in aitk_table.CHECK_ONLY:
        return f"{NO_PROFILE.get(arch, arch)} (model.arch {arch!r})"
    name = str(model.get("name_or_path") or "")
    low = name.lower()
    if "flex.2" in low or "flex2" in low:
        return f"Flex.2 (model.name_or_path {name!r})"
    return None


def _family(prof: str) -> str:
    return bundled_families().get(prof) or prof  # a profile not bundled is its own family here


def detect(raw: RawConfig) -> int | None:
    """An ai-toolkit job: ``config.process`` is a list."""
    cfg = raw.data.get("config") if isinstance(raw.data, dict) else None
    return 100 if isinstance(cfg, dict) and isinstance(cfg.get("process"), list) else None


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    proc = _process(raw.data, raw.file)
    job = str(raw.data.get("job") or "") if isinstance(raw.data, dict) else ""  # a dict: _process read it
    ptype = str(proc.get("type") or "")
    if job in NON_TRAINING_JOBS:
        raise NotChecked(f"not a training job: job: {job} {NON_TRAINING_JOBS[job]}; nothing to check",
                         status="not-training", file=raw.file)
    if ptype in NON_TRAINING_TYPES:
        raise NotChecked(f"not a training job: process type {ptype!r} {NON_TRAINING_TYPES[ptype]}; nothing to check",
                         status="not-training", file=raw.file)
    valid = known_keys("ai-toolkit", "te_align.trainers.ai_toolkit")
    findings = []
    values: dict[str, Any] = {}
    lines = KeyLines(raw.text)

    def unknown(key: str, section: str, keys: frozenset[str]) -> None:
        hint = MYTH_KEYS.get(key)
        findings.append(unknown_key_finding(
            key, keys, trainer="ai-toolkit: jobs/process/BaseSDTrainProcess.py:107-166 (kwargs.get)",
            line=lines(key), section=section,
            behaviour="ai-toolkit reads known keys with kwargs.get and ignores this one silently",
            hint=f"{hint}: not settable: use `te-align patch`" if hint else None,
        ))

    for key in proc:
        if key not in valid["process"]:
            unknown(key, "", valid["process"])
    for section in _SECTIONS:
        sec = expect_mapping(proc.get(section), section, raw.file, lines)
        for key, v in sec.items():
            values[f"{section}.{key}"] = v
            if section == "model" and key == "model_kwargs" and isinstance(v, dict):
                values.update({f"model.model_kwargs.{k}": kv for k, kv in v.items()})
            if key not in valid.get(section, frozenset()):
                unknown(key, section, valid.get(section, frozenset()))
    datasets = proc.get("datasets")
    if datasets is None:
        datasets = []
    elif not isinstance(datasets, list):
        raise ConfigSyntaxError(raw.file, lines("datasets"), None,
                                f"wrong type/value for datasets: expected a list of datasets, got {datasets!r:.60}")
    for i, ds in enumerate(datasets):
        if isinstance(ds, dict):
            for key in ds:
                if key not in valid["datasets"]:
                    unknown(key, f"datasets[{i}]", valid["datasets"])
    model = expect_mapping(proc.get("model"), "model", raw.file, lines)
    values["model._pixart_route"] = pixart_route(model)
    missing = _no_profile(model)
    if missing:
        return Parsed(Trainer("ai-toolkit", RULES, no_fix_set, str), values, None, "", False, None, findings, SUPPORTED,
                      not_checked=f"not checked: te-align has no profile for {missing}")
    prof, reason = guess_profile(model)
    if aitk_table.arch_name(model).startswith("wan22"):
        findings.append(Finding(kind="note", severity="info", setting="profile", message=(
            f"Wan 2.2 (model.arch {aitk_table.arch_name(model)!r}) is checked with the wan21 profile: diffusers' "
            "WanPipeline encodes both with the same umT5-XXL at 512 tokens")))
    if prof and prof.startswith("flux") and "flex.1" in str(model.get("name_or_path") or "").lower():
        findings.append(Finding(kind="note", severity="info", setting="profile", message=(
            "Flex.1 is checked as FLUX.1 (ai-toolkit runs it as flux: same T5 encoding, 512 tokens); "
            "te-align has no Flex.1 profile of its own")))
    cached = bool(values.get("train.cache_text_embeddings")) or any(
        isinstance(ds, dict) and ds.get("cache_text_embeddings") for ds in datasets)
    rates = [(f"datasets[{i}].caption_dropout_rate", ds.get("caption_dropout_rate")) for i, ds in enumerate(datasets)
             if isinstance(ds, dict) and ds.get("caption_dropout_rate")]
    if values.get("train.prompt_dropout_prob"):
        rates.append(("train.prompt_dropout_prob", values["train.prompt_dropout_prob"]))

    def after(profile: AlignmentProfile, ctx: Context) -> list[Finding]:
        if profile.family in ("sd3", "chroma", "hidream", "qwen-image", "wan"):  # prompt dropout dropped there
            rates_here = [r for r in rates if not r[0].startswith("train.")]
        else:
            rates_here = rates
        out = [f for key, rate in rates_here for f in dropout_form_finding(
            profile, rate, "encode", key=key, trainer="ai-toolkit",
            source="toolkit/dataloader_mixins.py:402-408,2245-2251 (a dropped caption becomes ''); "
                   f"{_TT}:437-441", line=lines(key.rsplit(".", 1)[-1]))]
        return out + _edit_plus_batch(model, values, cached, lines)

    def fix_set(key: str, value: Any) -> str:
        return f"{key}: {json.dumps(value)}"

    def fix_remove(key: str) -> str:
        return f"remove {key}" + (" (or set it to false)" if key.endswith("attn_masking") else "")

    table = KONTEXT_RULES if aitk_table.arch_name(model) == "flux_kontext" else RULES
    trainer = Trainer("ai-toolkit", table, fix_set, fix_remove, lambda key: lines(key.rsplit(".", 1)[-1]))
    if aitk_table.arch_name(model) in aitk_table.CHECK_ONLY:
        trainer.not_settable = NOT_SETTABLE
    dirs = [ds["folder_path"] for ds in datasets if isinstance(ds, dict) and isinstance(ds.get("folder_path"), str)]
    name_or_path = model.get("name_or_path")
    return Parsed(trainer, values, prof, reason, cached, None, findings, SUPPORTED,
                  guess_is_default=reason.startswith("no model.arch"), after=after, caption_dirs=dirs,
                  caption_sources=caption_sources(datasets, proc.get("trigger_word")),
                  model_paths=[name_or_path] if isinstance(name_or_path, str) else [],
                  assumed=getattr(reason, "assumed", ""))


#: ai-toolkit's caption handling, read at ostris/ai-toolkit@27a03a9: a dataset's caption_ext (default ".txt", a dot
#: added, toolkit/config_modules.py:941-944); the whole file read, not stripped (toolkit/dataloader_mixins.py:350-
#: 353, clean_caption returns it as is, :99-110); split at "," and joined with ", " (:411,434-435); the trigger word
#: (the dataset's, else the job's, jobs/process/BaseSDTrainProcess.py:135,168-169) replaces [trigger]/[name] or goes
#: first with a space (:436, toolkit/prompt_utils.py:715-745); shuffle_tokens reorders the tags (:431-432); the
#: folder is walked with its sub-folders, hidden ones pruned (toolkit/data_loader.py:437-441).
CAPTION_SOURCE = ("ostris/ai-toolkit@27a03a9 toolkit/dataloader_mixins.py:350-353,411-436, toolkit/prompt_utils.py:"
                  "715-745, toolkit/config_modules.py:941-944, toolkit/data_loader.py:437-441")


def caption_sources(datasets: list[Any], job_trigger: Any) -> list[CaptionSource]:
    """Each dataset's folder_path with ai-toolkit's caption handling."""
    out: list[CaptionSource] = []
    for ds in datasets:
        if not (isinstance(ds, dict) and isinstance(ds.get("folder_path"), str)):
            continue
        ext = ds.get("caption_ext", ".txt")
        ext = ext if isinstance(ext, str) and ext else ".txt"
        trigger = ds.get("trigger_word") if isinstance(ds.get("trigger_word"), str) else job_trigger
        out.append(CaptionSource(folder=ds["folder_path"], extension=ext if ext.startswith(".") else f".{ext}",
                                 strip=False, rejoin=(",", ", "),
                                 trigger=trigger if isinstance(trigger, str) else "",
                                 length_invariant=("shuffle_tokens",) if ds.get("shuffle_tokens") is True else (),
                                 source=CAPTION_SOURCE))
    return out
