"""bghira/SimpleTuner ``config.json`` / ``config.toml`` (keys with or without the leading ``--``).

Facts read at bghira/SimpleTuner@bc8e6ab7738ce457a2ed8eb2d26cadd91c6442cb (AGPL: facts only, no code;
``source`` gives file:line at that commit). Config keys become ``--KEY VALUE`` and argparse rejects unknown ones,
so an unknown key stops training (error). ``check_user_config`` rewrites ``tokenizer_max_length`` per model.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from te_align.audit import rules
from te_align.audit.findings import Finding
from te_align.audit.models import _families as bundled_families
from te_align.audit.models import assumption, guess_model
from te_align.audit.parsed import (
    CacheSpec,
    CaptionSource,
    KeyLines,
    Parsed,
    dropout_form_finding,
    reason,
    unknown_key_finding,
)
from te_align.audit.readers import NotChecked, RawConfig, UnreadableConfig, known_keys
from te_align.audit.rules import ByProfile, Context, Rule, Trainer
from te_align.profiles.registry import bundled_name
from te_align.trainers.simpletuner import envfile

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

_M = "simpletuner/helpers/models"

# ------------------------------------------------------------------------------------ converters
def _st_sd3_len(v: Any, ctx: Context) -> Any:
    # SimpleTuner SD3 check_user_config: default 154, capped at 154 unless i_know_what_i_am_doing.
    n = rules.int_or_none(v)
    if n is None:
        return 154
    if n > 154 and not rules.truthy(ctx.values.get("i_know_what_i_am_doing")):
        return 154
    return n


def _st_padding(v: Any, ctx: Context) -> Any:
    return v == "zero"


def _st_padding_back(p: Any, ctx: Context) -> Any:
    return "zero" if p else rules.REMOVE


def _st_flux_len(v: Any, ctx: Context) -> Any:
    # SimpleTuner Flux check_user_config: forces 512, then 256 when model_flavour == "schnell".
    return 256 if ctx.values.get("model_flavour") == "schnell" else 512


def _st_aura_len(v: Any, ctx: Context) -> Any:
    # SimpleTuner AuraFlow check_user_config: unset/0 = 120 (pony: 768), capped there unless i_know_what_i_am_doing.
    cap = 768 if ctx.values.get("model_flavour") == "pony" else 120
    n = rules.int_or_none(v)
    if not n:
        return cap
    if n > cap and not rules.truthy(ctx.values.get("i_know_what_i_am_doing")):
        return cap
    return n


#: What SimpleTuner passes as Sana's instruction when the key is unset (its own text, not the pipeline's).
ST_SANA_DEFAULT = "SimpleTuner's own 10-line instruction (field_registry/sana.py:14-27)"


def _st_sana_instruction(v: Any, ctx: Context) -> Any:
    # SimpleTuner _normalize_sana_complex_instruction: a list or text -> non-empty lines, each stripped;
    # the pipeline joins them with "\n". None/"None"/"" -> no instruction.
    if v is None:
        return ST_SANA_DEFAULT
    if isinstance(v, list):
        lines = [str(x).strip() for x in v if x not in (None, "", "None") and str(x).strip()]
    elif isinstance(v, str):
        if v.strip() in ("", "None"):
            return None
        lines = [line.strip() for line in v.splitlines() if line.strip()]
    else:
        return v
    return "\n".join(lines) if lines else None


_same = rules.CONVERTERS["same"].back
rules.register("st_sd3_len", _st_sd3_len, _same, "int")
rules.register("st_padding", _st_padding, _st_padding_back, "choice:unmodified,zero")
rules.register("st_flux_len", _st_flux_len)
rules.register("st_aura_len", _st_aura_len, _same, "int")
rules.register("st_sana_instruction", _st_sana_instruction)


#: SimpleTuner's switch that lifts its SD3 T5 cap also bypasses its other built-in safety limits: ``check --fix`` writes
#: it only with ``--allow-unsafe-keys`` (te_align.audit.policy).
UNSAFE: tuple[tuple[str, str], ...] = ((
    "i_know_what_i_am_doing",
    "bypasses SimpleTuner's built-in safety limits wherever it is read, not only the T5 length cap (its help: 'Unlock "
    "experimental overrides and bypass built-in safety limits', simpletuner_sdk/server/services/field_registry/"
    "sections/advanced.py:16-30; read in 24 places of 10 files under simpletuner/helpers at bghira/SimpleTuner@bc8e6ab)",
),)

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
         fix='"{key}": {value}, "i_know_what_i_am_doing": true', also=(("i_know_what_i_am_doing", True),), unsafe=UNSAFE),
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
         "encode_prompt without max_sequence_length (diffusers encode_prompt default 1024)", f"{_M}/qwen_image/model.py:507-549", captions="over512"),
    Rule("qwen.tokenizer.padding", ("qwen-image",), None, "max_length",
         "SimpleTuner replaces QwenImagePipeline._get_qwen_prompt_embeds: every caption padded to 1,024 tokens (after "
         "the 34-token template) and zero rows; the mask reaches the transformer, which masks them, so only the "
         "sequence length (cache size, attention cost) differs",
         "simpletuner/helpers/training/diffusers_overrides.py:618-689,878-884", severity="info"),
    Rule("t5.tokenizer.max_length", ("wan",), None, 512, "WanPipeline.encode_prompt default max_sequence_length=512",
         f"{_M}/wan/model.py:1377-1398"),
    # ---- PixArt-Σ (model_family "pixart"): pipeline.encode_prompt with clean_caption=True
    Rule("t5.tokenizer.max_length", ("pixart",), None, 300,
         "tokenizer_max_length is forced to 300 and passed as max_sequence_length", f"{_M}/pixart/model.py:239-246,679-681"),
    Rule("t5.tokenizer.text_cleaning", ("pixart",), None, "pixart", "encode_prompt(clean_caption=True)",
         f"{_M}/pixart/model.py:239-246"),
    Rule("t5.masks.zero_padded", ("pixart",), "t5_padding", "unmodified", 't5_padding "zero" multiplies padded T5 outputs by 0',
         f"{_M}/pixart/model.py:248-250", convert="st_padding"),
    # ---- Sana: pipeline.encode_prompt(clean_caption=False, max_sequence_length=300, complex_human_instruction=…)
    Rule("gemma.tokenizer.max_length", ("sana",), None, 300, "max_sequence_length=300 (tokenizer_max_length is ignored)",
         f"{_M}/sana/model.py:151-158,264-265"),
    Rule("gemma.tokenizer.text_cleaning", ("sana",), None, "lower",
         "clean_caption=False: the pipeline still lower-cases and strips the caption", f"{_M}/sana/model.py:151-158"),
    Rule("gemma.tokenizer.system_prompt", ("sana",), "sana_complex_human_instruction", None,
         "the complex-human instruction SimpleTuner passes: by default its own 10-line text (not the pipeline's), and "
         "any value has each line stripped, so the final 'User Prompt: ' loses its space",
         f"{_M}/field_registry/sana.py:7-27; simpletuner/helpers/configuration/cmd_args.py:355-390; {_M}/sana/model.py:157",
         convert="st_sana_instruction"),
    # ---- AuraFlow: pipeline.encode_prompt(max_sequence_length=tokenizer_max_length)
    Rule("t5.tokenizer.max_length", ("auraflow",), "tokenizer_max_length", None,
         "AuraFlow T5 length: unset = 120 (768 for the pony flavour), capped there unless i_know_what_i_am_doing",
         f"{_M}/auraflow/model.py:256-263,387-399", convert="st_aura_len",
         fix='"{key}": {value}, "i_know_what_i_am_doing": true', also=(("i_know_what_i_am_doing", True),), unsafe=UNSAFE),
)

#: FLUX.2 dev's system message as SimpleTuner writes it: a space after "object" where diffusers has a newline.
FLUX2_SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured responses focusing "
                        "on object relationships, object attribution and actions without speculation.")
_F2 = f"{_M}/flux2/model.py"


def _st_flux2_layers(v: Any, ctx: Context) -> Any:
    # custom_text_encoder_intermediary_layers: a JSON array (or list) of hidden_states indices; unset = the flavour's
    # own layers (dev (10, 20, 30), klein (9, 18, 27)).
    if v is None or v == "":
        return (9, 18, 27) if str(ctx.values.get("model_flavour") or "klein-9b").startswith("klein") else (10, 20, 30)
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return v
    return tuple(v) if isinstance(v, list) else v


def _st_flux2_layers_back(p: Any, ctx: Context) -> Any:
    if p == _st_flux2_layers(None, ctx):
        return rules.REMOVE
    if not isinstance(p, (list, tuple)):
        raise LookupError
    return json.dumps(list(p))


def _st_len_or_512(v: Any, ctx: Context) -> Any:
    return rules.int_or_none(v) or 512  # `getattr(config, "tokenizer_max_length", None) or 512`


def _st_len_or_512_back(p: Any, ctx: Context) -> Any:
    return rules.REMOVE if p == 512 else p


rules.register("st_flux2_layers", _st_flux2_layers, _st_flux2_layers_back)
rules.register("st_len_or_512", _st_len_or_512, _st_len_or_512_back, "int")

NEW_RULES: tuple[Rule, ...] = (
    # ---- FLUX.2 (model_family flux2; model_flavour dev, klein-4b, klein-9b)
    Rule("mistral.tokenizer.system_prompt", ("flux2",), None, FLUX2_SYSTEM_MESSAGE,
         "SYSTEM_MESSAGE has a space after 'object' where diffusers' has a newline: other tokens in every prompt's "
         "system turn", f"{_F2}:52,604-618"),
    Rule("mistral.tokenizer.max_length", ("flux2",), None, 512,
         "apply_chat_template(padding='max_length', truncation=True, max_length=MAX_SEQUENCE_LENGTH 512)",
         f"{_F2}:54,726-738"),
    Rule("qwen3.tokenizer.max_length", ("flux2-klein",), None, 512,
         "tokenizer(padding='max_length', truncation=True, max_length=MAX_SEQUENCE_LENGTH 512)", f"{_F2}:54,682-689"),
    Rule("qwen3.tokenizer.enable_thinking", ("flux2-klein",), None, False,
         "apply_chat_template(add_generation_prompt=True, enable_thinking=False)", f"{_F2}:676-682"),
    Rule(None, ("flux2", "flux2-klein"), "tokenizer_max_length", None,
         "tokenizer_max_length is set back to 512 for FLUX.2", f"{_F2}:1297-1299", honoured="never"),
    Rule("mistral.encoder.layer", ("flux2",), "custom_text_encoder_intermediary_layers", None,
         "custom_text_encoder_intermediary_layers (unset = OUTPUT_LAYERS [10, 20, 30]) picks the hidden_states stacked "
         "per token", f"{_F2}:53,632-656,751-754", convert="st_flux2_layers"),
    Rule("qwen3.encoder.layer", ("flux2-klein",), "custom_text_encoder_intermediary_layers", None,
         "custom_text_encoder_intermediary_layers (unset = KLEIN_OUTPUT_LAYERS (9, 18, 27)) picks the hidden_states "
         "stacked per token", f"{_F2}:57,632-656,705-708", convert="st_flux2_layers"),
    # ---- Z-Image (model_family z_image)
    Rule("qwen3.tokenizer.max_length", ("z-image",), "tokenizer_max_length", None,
         "tokenizer_max_length (unset = 512), padding='max_length', truncation", f"{_M}/z_image/model.py:285-292",
         convert="st_len_or_512"),
    Rule("qwen3.encoder.layer", ("z-image",), None, -2, "hidden_states[-2]", f"{_M}/z_image/model.py:296-301"),
    Rule("qwen3.tokenizer.enable_thinking", ("z-image",), None, True,
         "apply_chat_template(add_generation_prompt=True, enable_thinking=True)", f"{_M}/z_image/model.py:276-282"),
    # ---- Qwen-Image-Edit (model_family qwen_image, model_flavour edit-v1/-v2/-v2+/-v3): the pipeline's encode_prompt
    # with the prompt images SimpleTuner hands it
    Rule("qwen.images.area", ("qwen-image-edit",), None,
         ByProfile({"qwen-image-edit": "the conditioning image's own size", "*": 384 * 384}),
         "edit-v2/v2+/v3 resize the prompt images to the CONDITION_IMAGE_SIZE (384*384) area, multiples of 32, "
         "LANCZOS; edit-v1 hands the prompt image to QwenImageEditPipeline.encode_prompt as loaded, not resized to "
         "the 1024*1024 area the pipeline's __call__ gives its processor, which matches only where the conditioning "
         "images are already about 1024*1024 pixels",
         f"{_M}/qwen_image/model.py:489-494,531-547,577-591", severity="warning"),
)
#: What ideogram_auto_json (default true) does to every caption before encoding.
IDEOGRAM_AUTO_JSON = "rewritten into Ideogram 4's structured JSON caption (maybe_convert_prompt_to_ideogram_json)"


def _st_auto_json(v: Any, ctx: Context) -> Any:
    return IDEOGRAM_AUTO_JSON if v is None or rules.truthy(v) else "none"


def _st_auto_json_back(p: Any, ctx: Context) -> Any:
    if p == "none":
        return False
    raise LookupError


rules.register("st_ideogram_auto_json", _st_auto_json, _st_auto_json_back, "bool")

KREA2_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                  "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{prompt}"
                  "<|im_end|>\n<|im_start|>assistant\n")
IDEOGRAM_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
_K2 = f"{_M}/krea2"
_ID = f"{_M}/ideogram"
_LX = f"{_M}/ltxvideo2"

NEW_RULES = (
    *NEW_RULES,
    # ---- Krea 2 (model_family krea2, flavours raw / turbo): the vendored Krea2Pipeline.encode_prompt with its defaults
    Rule("qwen.tokenizer.template", ("krea2",), None, KREA2_TEMPLATE,
         "prompt_template_encode_prefix + caption; the suffix tokenized alone", f"{_K2}/pipeline.py:229-233,276-285"),
    Rule("qwen.tokenizer.max_length", ("krea2",), None, 512,
         "encode_prompt without max_sequence_length (default 512): prefix + caption padded to 512 + 34 - 5",
         f"{_K2}/model.py:198-221; {_K2}/pipeline.py:237-241,276-283,310-317"),
    Rule(None, ("krea2", "ideogram4"), "tokenizer_max_length", None,
         "tokenizer_max_length is never passed to Krea 2's or Ideogram 4's encoding",
         f"{_K2}/model.py:198-221; {_ID}/model.py:275-350", honoured="never"),
    Rule("qwen.tokenizer.suffix_after_padding", ("krea2",), None, True,
         "the suffix's tokens are concatenated after the padded block", f"{_K2}/pipeline.py:285-288"),
    Rule("qwen.tokenizer.drop_start_tokens", ("krea2",), None, 34, "the 34 prefix positions are dropped",
         f"{_K2}/pipeline.py:234,306-307"),
    Rule("qwen.encoder.position_ids", ("krea2",), None, "real_tokens", "position_ids = (mask.cumsum - 1).clamp(min=0)",
         f"{_K2}/pipeline.py:290-301"),
    Rule("qwen.encoder.layer", ("krea2",), None, (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35),
         "text_encoder_select_layers (default 2, 5, ..., 35)", f"{_K2}/pipeline.py:211-214,304"),
    Rule("qwen.encoder.layer_combine", ("krea2",), None, "stack", "torch.stack(dim=2)", f"{_K2}/pipeline.py:304"),
    # ---- Ideogram 4 (model_family ideogram, flavours fp8 / nf4): IdeogramModel._encode_prompts
    Rule("qwen.tokenizer.text_cleaning", ("ideogram4",), "ideogram_auto_json", True,
         "ideogram_auto_json (default true) rewrites every caption, plain text included, into Ideogram 4's structured "
         "JSON caption before encoding (a dropped, empty caption too); the pipeline encodes the prompt as given, so "
         "prompts at inference must be written the same way",
         f"{_ID}/model.py:321-326; {_ID}/prompting.py:151-165; {_M}/field_registry/ideogram.py:10-25",
         convert="st_ideogram_auto_json", severity="warning"),
    Rule("qwen.tokenizer.template", ("ideogram4",), None, IDEOGRAM_TEMPLATE,
         "apply_chat_template([{'role': 'user', 'content': [{'type': 'text', ...}]}], add_generation_prompt=True)",
         f"{_ID}/model.py:327-328"),
    Rule("qwen.tokenizer.add_special_tokens", ("ideogram4",), None, False, "tokenizer(text, add_special_tokens=False)",
         f"{_ID}/model.py:329"),
    Rule("qwen.tokenizer.max_length", ("ideogram4",), None, 2048, "a caption over 2048 tokens raises ValueError",
         f"{_ID}/model.py:332-334"),
    Rule("qwen.tokenizer.truncation", ("ideogram4",), None, False, "no truncation", f"{_ID}/model.py:329-334"),
    Rule("qwen.tokenizer.padding_side", ("ideogram4",), None, "left",
         "the batch is right-padded with id 0 to its longest caption, positions arange(n) per caption: the real "
         "tokens' features equal the pipeline's left-padded ones (causal attention never sees the padding after them), "
         "and padding is zeroed", f"{_ID}/model.py:336-349"),
    Rule("qwen.encoder.position_ids", ("ideogram4",), None, "real_tokens", "positions arange from 0 per caption",
         f"{_ID}/model.py:341-345"),
    Rule("qwen.encoder.layer", ("ideogram4",), None, (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 35),
         "QWEN3_VL_ACTIVATION_LAYERS (0, 3, ..., 33, 35)", f"{_ID}/constants.py:11; {_ID}/pipeline.py:813-827"),
    Rule("qwen.encoder.layer_taps", ("ideogram4",), None, "decoder_layers",
         "the outputs of those decoder layers, driven one by one (the last before the final norm)",
         f"{_ID}/pipeline.py:813-827"),
    Rule("qwen.encoder.layer_combine", ("ideogram4",), None, "interleave",
         "stack(dim=0).permute(1, 2, 3, 0).reshape: width-major, layer fastest", f"{_ID}/pipeline.py:848-850"),
    Rule("qwen.masks.zero_padded", ("ideogram4",), None, True, "padding positions multiplied by the mask",
         f"{_ID}/pipeline.py:852-855; {_ID}/model.py:348"),
    # ---- LTX-2 / 2.3 (model_family ltxvideo2): the vendored LTX2Pipeline.encode_prompt (Gemma 3)
    Rule("gemma.tokenizer.max_length", ("ltx2",), None, 1024,
         "check_user_config sets tokenizer_max_length to 1024; encode_prompt(max_sequence_length=1024)",
         f"{_LX}/model.py:1535-1537,1705-1709"),
    Rule(None, ("ltx2",), "tokenizer_max_length", None, "tokenizer_max_length is set back to 1024 for LTX-2",
         f"{_LX}/model.py:1535-1537", honoured="never"),
    Rule("gemma.tokenizer.padding_side", ("ltx2",), None, "left", "tokenizer.padding_side = 'left'",
         f"{_LX}/pipeline_ltx2.py:465"),
    Rule("gemma.tokenizer.text_cleaning", ("ltx2",), None, "strip", "[p.strip() for p in prompt]",
         f"{_LX}/pipeline_ltx2.py:469"),
    Rule("gemma.tokenizer.padding", ("ltx2",), None, "max_length", "padding='max_length', truncation=True",
         f"{_LX}/pipeline_ltx2.py:470-476"),
    Rule("gemma.encoder.layer", ("ltx2",), None, tuple(range(49)), "every hidden state, stacked on the last dim",
         f"{_LX}/pipeline_ltx2.py:483-487"),
    Rule("gemma.encoder.layer_combine", ("ltx2",), None, "interleave", "stack(dim=-1) then flatten(2): layer fastest",
         f"{_LX}/pipeline_ltx2.py:487,430"),
    Rule("gemma.masks.zero_padded", ("ltx2",), None, True,
         "the vendored pipeline is an older copy of diffusers': its encode_prompt already normalises each layer over "
         "the mask (x8) and zeroes the padding (_pack_text_embeds), which diffusers 0.42.1 does in the connectors in "
         "__call__. The cached embeddings are therefore normalised, not the raw hidden states the profile describes; "
         "te-align did not compare the vendored connectors",
         f"{_LX}/pipeline_ltx2.py:370-433,488-496", severity="info"),
)
RULES = RULES + NEW_RULES  # one table (te_align.audit.reach counts RULES)

SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "lumina2", "hidream", "qwen-image", "wan", "pixart",
             "auraflow", "sana", "flux2", "flux2-klein", "z-image", "qwen-image-edit", "krea2", "ideogram4", "ltx2")

#: SimpleTuner has no setting for hard-coded encoding and te-align cannot patch it.
NOT_SETTABLE = "not settable in SimpleTuner (hard-coded; te-align has no SimpleTuner patch)"
#: Families te-align's SimpleTuner hooks encode (te_align.trainers.simpletuner.hooks.FAMILIES; a test keeps them equal).
HOOKED = ("sd1", "sd2", "sdxl", "sd3", "flux", "pixart", "chroma", "auraflow", "sana", "lumina2", "hidream",
          "qwen-image", "wan")
#: The fix where the hooks apply: they run in-process (no SimpleTuner file is changed), enabled by the environment.
HOOKS_FIX = ('not settable in SimpleTuner (hard-coded); run SimpleTuner with te-align\'s hooks: '
             'eval "$(python -m te_align.hooks.simpletuner env)", then `simpletuner train` or `simpletuner server` '
             'in that shell')

#: model_family values te-align has no profile for, by the model's name (simpletuner/helpers/models/<family>).
NO_PROFILE = {
    "z_image_omni": "Z-Image Omni", "kolors": "Kolors",
    "deepfloyd": "DeepFloyd IF", "cosmos": "Cosmos", "cosmos2image": "Cosmos-Predict2", "cosmos3": "Cosmos 3",
    "ltxvideo": "LTX-Video", "hunyuanvideo": "HunyuanVideo", "sanavideo": "SANA-Video",
    "wan_s2v": "Wan 2.2 S2V", "omnigen": "OmniGen", "stable_cascade": "Stable Cascade", "ace_step": "ACE-Step",
    "ernie": "ERNIE-Image", "kandinsky5-image": "Kandinsky 5 Image",
    "kandinsky5-video": "Kandinsky 5 Video", "longcat_image": "LongCat-Image", "longcat_video": "LongCat-Video",
    "mageflow": "MageFlow", "minimaxh3": "MiniMax H3", "minimaxmusic": "MiniMax Music", "heartmula": "HeartMuLa",
    "infinitetalk": "InfiniteTalk", "zlab_i1": "Z-Lab I1", "boogu_image": "Boogu Image", "anima": "Anima (SimpleTuner)",
}

_CACHE = CacheSpec(("*.pt",), "file name = md5(caption) + model family; no length, padding, flavour or mask",
                   "simpletuner/helpers/caching/text_embeds.py:139-181,528-545",
                   "delete the text-embed cache folder (cache_dir_text / the text_embeds backend's cache_dir); with "
                   "te-align's hooks (python -m te_align.hooks.simpletuner env) the cache key carries the profile "
                   "fingerprint and stale files are re-encoded")
CACHES = {f: _CACHE for f in SUPPORTED}

_FAMILY = {
    "sd1x": "sd15", "sd2x": "sd21", "sdxl": "sdxl", "sd3": "sd35-large", "flux": "flux-dev", "chroma": "chroma",
    "lumina2": "lumina2", "hidream": "hidream", "qwen_image": "qwen-image", "wan": "wan21",
    "pixart_sigma": "pixart-sigma", "pixart": "pixart-sigma", "auraflow": "auraflow", "sana": "sana",
    "flux2": "flux2-klein-9b", "z_image": "z-image", "z-image": "z-image", "krea2": "krea2", "ideogram": "ideogram4",
    "ltxvideo2": "ltx2",
}
#: model_flavour -> profile where the flavour names the model (FLUX.2: flux2/model.py:149-154, default klein-9b;
#: Qwen-Image's edit flavours: qwen_image/model.py:74-90). A flavour of these families not listed is "not checked".
_FLAVOURS: dict[str, dict[str, str | None]] = {
    "flux2": {"dev": "flux2-dev", "klein-4b": "flux2-klein-4b", "klein-9b": "flux2-klein-9b"},
    "qwen_image": {"edit-v1": "qwen-image-edit", "edit-v2": "qwen-image-edit-2509", "edit-v2+": "qwen-image-edit-2509",
                   "edit-v3": "qwen-image-edit-2511", "v1.0": None, "v2.0": None},  # None: the path decides
    # LTX-2 (ltxvideo2/model.py:193-201,740-753): 2.0 and 2.3 encode with Gemma 3 as LTX2Pipeline does
    "ltxvideo2": {"dev": "ltx2", "dev-fp4": "ltx2", "dev-fp8": "ltx2", "2": "ltx2", "2.0": "ltx2", "2.3-dev": "ltx2",
                  "2.3-distilled": "ltx2"},
    "krea2": {"raw": "krea2", "turbo": "krea2"},  # krea2/model.py:46-50
    "ideogram": {"fp8": "ideogram4", "nf4": "ideogram4"},  # ideogram/model.py:46-50
}
#: Flavours of a family that use another text encoder, which te-align has no profile for (the nearest named).
_OTHER_ENCODER = {("ltxvideo2", f): "LTX-2.5 (a Gemma 4 text encoder, ltxvideo2/model.py:363-376)"
                  for f in ("2.5", "2.5-dev", "2.5-distilled")}


#: SimpleTuner's default flavour where a family has several profiles (the flavour it loads when the config names
#: neither a flavour nor a model path; simpletuner/helpers/models/common.py:1214-1228): flux/model.py:89 "krea"
#: (FLUX.1 Krea dev), sd3/model.py:135 "medium" (SD3.5 medium).
_DEFAULT_FLAVOUR = {"flux": ("krea", "flux-dev"), "sd3": ("medium", "sd35-medium")}


def guess_profile(values: dict[str, Any]) -> tuple[str | None, str]:
    """The bundled profile a config trains: model_family, the variant from model_flavour, else from the files or
    name of pretrained_model_name_or_path (what SimpleTuner loads instead of the flavour's repository), else
    SimpleTuner's default flavour. Where nothing decides between two profiles of a family, the reason carries the
    assumption."""
    fam = str(values.get("model_family") or "")
    flavour = str(values.get("model_flavour") or "")
    path = values.get("pretrained_model_name_or_path")
    prof = _FAMILY.get(fam)
    if prof is None:
        return None, f"model_family {fam!r}"
    if (fam, flavour.lower()) in _OTHER_ENCODER:
        raise NotChecked(f"not checked: te-align has no profile for {_OTHER_ENCODER[(fam, flavour.lower())]} "
                         f"(SimpleTuner model_family {fam!r} model_flavour {flavour!r}); the nearest it has, {prof}, is "
                         "not used in its place")
    if fam in _FLAVOURS and flavour:
        if flavour not in _FLAVOURS[fam]:
            # the nearest: the newest listed flavour sharing the longest prefix with it (named, never used)
            best = max(reversed(_FLAVOURS[fam]), key=lambda f: _shared(f, flavour))
            near = (_FLAVOURS[fam][best] or prof) if _shared(best, flavour) >= 3 else None
            raise NotChecked(f"not checked: te-align has no profile for SimpleTuner model_family {fam!r} model_flavour "
                             f"{flavour!r}" + (f"; the nearest it has, {near}, is not used in its place" if near else ""))
        if _FLAVOURS[fam][flavour]:
            return _FLAVOURS[fam][flavour], f"model_family {fam!r}, model_flavour {flavour!r}"
    if fam == "flux2":
        return prof, "model_family 'flux2', model_flavour 'klein-9b' (SimpleTuner's default)"
    if fam == "flux" and flavour:
        prof = "flux-schnell" if flavour == "schnell" else "flux-dev"
        return prof, f"model_family \"flux\", model_flavour {flavour!r}"
    if fam == "sd3" and flavour:
        by = guess_model(flavour.replace("large", "3.5-large").replace("medium", "3.5-medium")).profile
        if by and _same_family(by, prof):
            return by, f"model_family {fam!r} and model_flavour {flavour!r}"
    by, detail, decided = guess_model(path)
    if by and decided and bundled_name(by) is None:  # a version te-align has no profile for: never prof
        return by, f"model_family {fam!r} and pretrained_model_name_or_path {path!r}{detail}"
    if by and decided and _same_family(by, prof):
        return by, f"model_family {fam!r} and pretrained_model_name_or_path {path!r}{detail}"
    if fam in _DEFAULT_FLAVOUR and not flavour:
        default, dprof = _DEFAULT_FLAVOUR[fam]
        if not path:
            return dprof, f"model_family {fam!r}, model_flavour {default!r} (SimpleTuner's default)"
        said = assumption(dprof, "model_flavour or pretrained_model_name_or_path (its name or files)")
        return dprof, reason(f"model_family {fam!r}; {dprof} assumed", said)
    if by and _same_family(by, prof):
        return by, f"model_family {fam!r} and pretrained_model_name_or_path {path!r}"
    return prof, f"model_family {fam!r}"


def _shared(a: str, b: str) -> int:
    """How many leading characters two names share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _same_family(a: str, b: str) -> bool:
    fams = bundled_families()
    return (fams.get(a) or a) == (fams.get(b) or b)  # a profile not bundled is its own family here


#: Keys of a data backend entry (``--data_backend_config``, multidatabackend.json) besides ``id`` and ``type``.
_BACKEND_KEYS = ("instance_data_dir", "dataset_type", "cache_dir_vae", "caption_strategy", "cache_dir")


def _is_backend_config(data: Any) -> bool:
    """SimpleTuner's data backend config: a JSON list of backends, each with ``id`` and ``type``."""
    return (isinstance(data, list) and bool(data) and all(isinstance(d, dict) and "id" in d and "type" in d for d in data)
            and any(k in d for d in data for k in _BACKEND_KEYS))


def detect(raw: RawConfig) -> int | None:
    """A SimpleTuner config: a ``model_family`` key (with or without the leading ``--``); or its data backend
    config."""
    if raw.fmt == "json" and _is_backend_config(raw.data):
        return 60
    if raw.fmt == "env":  # config.env: SimpleTuner's env backend (te_align.trainers.simpletuner.envfile)
        return 95
    if raw.fmt == "cmdline" or not isinstance(raw.data, dict):
        return None
    return 95 if "model_family" in {str(k).lstrip("-") for k in raw.data} else None


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    if raw.fmt == "json" and _is_backend_config(raw.data):
        raise NotChecked("not checked: a SimpleTuner data backend config names no model; check the config.json that "
                         "uses it (data_backend_config) — the model is set there", file=raw.file)
    if not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a JSON object / TOML table", file=raw.file)
    keys = known_keys("simpletuner", "te_align.trainers.simpletuner")
    valid = keys[""]
    ignored = keys.get("ignored", frozenset())
    lines: Any = KeyLines(raw.text)
    values: dict[str, Any] = {}
    findings = []
    data = raw.data
    if raw.fmt == "env":
        lines, findings = _env_lines(raw)
        data = envfile.read_env(raw.text)[0]
    for k, v in data.items():
        key = str(k).lstrip("-").replace("-", "_")
        values[key] = v
        if key in valid or key in ignored:
            continue
        # the loader drops null and "false" values before argparse (cli_utils.py:190-226); argparse accepts a
        # unique prefix of an option (allow_abbrev)
        if v is None or (isinstance(v, str) and v.strip().lower() == "false"):
            continue
        if len([name for name in valid if name.startswith(key)]) == 1:
            continue
        findings.append(unknown_key_finding(
            key, valid, trainer="SimpleTuner: simpletuner/helpers/configuration/cli_utils.py:190-226, cmd_args.py:546-557,668",
            line=lines(str(k)), severity="error",
            behaviour="SimpleTuner turns it into --KEY and argparse stops with 'unrecognized arguments'",
        ))
    fam = str(values.get("model_family") or "")
    if fam in NO_PROFILE or (fam and fam not in _FAMILY):
        name = NO_PROFILE.get(fam, fam)
        return Parsed(Trainer("simpletuner", RULES, str, str), values, None, f"model_family {fam!r}", True, None,
                      findings, SUPPORTED,
                      not_checked=f"not checked: te-align has no profile for {name} (SimpleTuner model_family {fam!r})")
    prof, reason = guess_profile(values)
    flavour = str(values.get("model_flavour") or "")
    if fam == "wan" and ("2.2" in flavour or flavour.startswith("animegen")):
        findings.append(Finding(kind="note", severity="info", setting="profile", message=(
            f"Wan 2.2 (model_flavour {flavour!r}) is checked with the wan21 profile: diffusers' WanPipeline encodes "
            "both with the same umT5-XXL at 512 tokens")))

    def fix_set(key: str, value: Any) -> str:
        if raw.fmt == "env":
            var = next((v for v, a in envfile.ENV_TO_ARGS.items() if a == f"--{key}"), None)
            val = ("true" if value else "false") if isinstance(value, bool) else value
            return f"export {var}={val}" if var else f'add --{key}={val} to TRAINER_EXTRA_ARGS'
        return f"{key} = {json.dumps(value)}" if raw.fmt == "toml" else f'"{key}": {json.dumps(value)}'

    def fix_remove(key: str) -> str:
        return f"remove {key}"

    def after(profile: AlignmentProfile, ctx: Context) -> list[Finding]:
        key = "caption_dropout_probability"
        rate = values.get(key, 0.1)
        return dropout_form_finding(
            profile, rate, "encode", key=key + ("" if key in values else " (default 0.1)"), trainer="SimpleTuner",
            source="simpletuner/helpers/training/collate.py:613-621 (a dropped caption becomes '' and is encoded); "
                   "default 0.1 at simpletuner/simpletuner_sdk/server/services/field_registry/sections/advanced.py:"
                   "1183-1190",
            line=lines(key), fix=f'{fix_set(key, 0.0)} (SimpleTuner cannot drop captions as zeros)')

    # Qwen-Image's edit flavours encode the caption with its image: the hooks leave them to SimpleTuner
    hooked = prof is not None and _family(prof) in HOOKED and not (fam == "qwen_image" and flavour.startswith("edit"))
    trainer = Trainer("simpletuner", RULES, fix_set, fix_remove, lambda key: lines(key),
                      not_settable=HOOKS_FIX if hooked else NOT_SETTABLE)
    # SimpleTuner always encodes captions through its text-embed cache (TextEmbeddingCache).
    sources = caption_sources(values)  # reads the data_backend_config JSON once
    return Parsed(trainer, values, prof, reason, True, None, findings, SUPPORTED, after=after,
                  caption_dirs=[s.folder for s in sources if not s.skip], assumed=getattr(reason, "assumed", ""),
                  caption_sources=sources,
                  model_paths=[values["pretrained_model_name_or_path"]] if isinstance(
                      values.get("pretrained_model_name_or_path"), str) else [])


def _family(prof: str) -> str:
    return bundled_families().get(prof) or prof


def _env_lines(raw: RawConfig) -> tuple[Any, list[Finding]]:
    """A config.env's option lines and notes: lines SimpleTuner's loader does not read as ``KEY=VALUE`` (one note
    naming file and line; the rest is checked) and variables that set the environment only."""
    _, at, skipped, env_only = envfile.read_env(raw.text)
    notes = [Finding(kind="note", severity="info", setting="config.env", line=n, message=(
        f"{raw.file}:{n}: shell syntax beyond KEY=VALUE / export ({text[:60]!r}): SimpleTuner's env loader does not "
        "run it (env_file.py:149-188 reads KEY=VALUE lines only); checked without it (partial)"),
        trainer_source=f"{envfile.SOURCE}:149-188") for n, text in skipped]
    if env_only:
        notes.append(Finding(kind="note", severity="info", setting="config.env", message=(
            f"{', '.join(env_only[:8])}{' …' if len(env_only) > 8 else ''}: not in SimpleTuner's env_to_args_map: "
            "they set the environment only, no option"), trainer_source=f"{envfile.SOURCE}:3-135"))
    return (lambda key: at.get(str(key).lstrip("-").replace("-", "_")) if key else None), notes


#: SimpleTuner's captions, read at bghira/SimpleTuner@bc8e6ab: a backend's caption_strategy, else the config's
#: (simpletuner/helpers/data_backend/factory.py:620-626), default "filename" (simpletuner_sdk/server/services/
#: field_registry/sections/data.py:86-93, the argparse default through helpers/configuration/cmd_args.py:430);
#: "textfile" reads IMAGE.txt as is, each non-empty line a caption unless
#: disable_multiline_split, instance_prompt + " " before it with prepend_instance_prompt (helpers/prompts.py:397-430;
#: the backend's key, else the config's, factory.py:3505-3506,3576).
CAPTION_SOURCE = ("bghira/SimpleTuner@bc8e6ab simpletuner/helpers/prompts.py:397-430, helpers/data_backend/factory.py:"
                  "620-626,3505-3506,3576")


def caption_sources(values: dict[str, Any]) -> list[CaptionSource]:
    """The local image backends' folders with SimpleTuner's caption strategy: "textfile" folders read as SimpleTuner
    reads them; the others named, not read (their captions are not the folder's text files)."""
    path = values.get("data_backend_config")
    out: list[CaptionSource] = []
    for b in _backends(path):
        folder = b["instance_data_dir"]
        strategy = b.get("caption_strategy", values.get("caption_strategy") or "filename")
        if strategy != "textfile":
            out.append(CaptionSource(folder=folder, source=CAPTION_SOURCE, skip=(
                f"caption_strategy {strategy!r}: SimpleTuner does not take these captions from .txt files")))
            continue
        prepend = b.get("prepend_instance_prompt", values.get("prepend_instance_prompt"))
        prompt = b.get("instance_prompt", values.get("instance_prompt"))
        out.append(CaptionSource(folder=folder, extension=".txt", strip=False,
                                 each_line=not b.get("disable_multiline_split", False),
                                 prefix=prompt if prepend is True and isinstance(prompt, str) else "",
                                 source=CAPTION_SOURCE))
    return out


def _backends(path: Any) -> list[dict[str, Any]]:
    """The local image backends of the data_backend_config JSON (when it exists and is readable)."""
    from pathlib import Path

    if not isinstance(path, str) or not path.endswith(".json") or not Path(path).is_file():
        return []
    try:
        if Path(path).stat().st_size > 1 << 20:
            return []
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return []
    return [b for b in (data if isinstance(data, list) else []) if isinstance(b, dict)
            and b.get("type", "local") == "local" and b.get("dataset_type", "image") == "image"
            and isinstance(b.get("instance_data_dir"), str)]


