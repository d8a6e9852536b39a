"""bmaltais/kohya_ss GUI saved configuration JSON (LoRA, DreamBooth, Finetune and Textual-Inversion tabs).

The GUI turns its fields into a flat sd-scripts TOML and picks the script from the tab and its model checkbox
(kohya_gui/lora_gui.py:1779-1792, dreambooth_gui.py:882-889, finetune_gui.py:1061-1072,
textual_inversion_gui.py:750-753, and the TOML at lora_gui.py:2147-2589, at bmaltais/kohya_ss@45088f04). This
module tells the tab from the file's keys, does the same translation for the text-encoder keys and then applies
the sd-scripts table, with fixes in GUI terms.
Note: the GUI pins sd-scripts 6721028c, newer than the 48d368fa the sd-scripts facts were read at.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from te_align.audit.parsed import KeyLines, Parsed, unknown_key_finding
from te_align.audit.readers import RawConfig, UnreadableConfig, known_keys
from te_align.audit.rules import Trainer, family_of, guess_from_name
from te_align.trainers.kohya import audit as kohya
from te_align.trainers.kohya import names as kohya_table

RULES = kohya.RULES
CACHES = kohya.CACHES
SUPPORTED = kohya.SUPPORTED
scan_cache = kohya.scan_cache

#: sd-scripts key -> (GUI field, families whose tab writes it) (lora_gui.py:2186-2192, 2244-2251, 2394-2399, 2499-2507).
GUI_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "clip_skip": ("clip_skip", ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma")),
    "max_token_length": ("max_token_length", ("sd1", "sd2", "sdxl", "sd3")),
    "t5xxl_max_token_length": ("t5xxl_max_token_length", ("flux", "chroma")),
    "apply_t5_attn_mask": ("apply_t5_attn_mask", ("flux",)),
    "system_prompt": ("lumina_system_prompt", ("lumina2",)),
    "gemma2_max_token_length": ("lumina_gemma2_max_token_length", ("lumina2",)),
    "qwen3_max_token_length": ("anima_qwen3_max_token_length", ("anima",)),
    "t5_max_token_length": ("anima_t5_max_token_length", ("anima",)),
    # SD3 per-encoder dropout (lora_gui.py:2362-2374)
    "clip_l_dropout_rate": ("sd3_clip_l_dropout_rate", ("sd3",)),
    "clip_g_dropout_rate": ("clip_g_dropout_rate", ("sd3",)),
    "t5_dropout_rate": ("sd3_t5_dropout_rate", ("sd3",)),
    "caption_dropout_rate": ("caption_dropout_rate", ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "lumina2",
                                                      "anima", "hunyuanimage")),
    # written into the TOML as int / bool (lora_gui.py:2182,2337)
    "caption_dropout_every_n_epochs": ("caption_dropout_every_n_epochs", ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma",
                                                                          "lumina2", "anima", "hunyuanimage")),
    "shuffle_caption": ("shuffle_caption", ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "lumina2", "anima",
                                            "hunyuanimage")),
}

#: Tabs: (keys only that tab writes, the model checkboxes in the order the tab tests them -> script, default script).
TABS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...], str]] = {
    "textual_inversion": (("token_string", "init_word", "num_vectors_per_token"),
                          (("sdxl", "sdxl_train_textual_inversion.py"),), "train_textual_inversion.py"),
    "finetune": (("train_dir", "image_folder", "sdxl_checkbox", "caption_metadata_filename", "latent_metadata_filename",
                  "create_caption", "create_buckets"),
                 (("sdxl_checkbox", "sdxl_train.py"), ("sd3_checkbox", "sd3_train.py"), ("flux1_checkbox", "flux_train.py"),
                  ("anima_checkbox", "anima_train.py"), ("lumina_checkbox", "lumina_train.py")), "fine_tune.py"),
    "lora": (("LoRA_type", "network_dim", "network_alpha", "text_encoder_lr", "unet_lr"), (), "train_network.py"),
    "dreambooth": ((), (("sdxl", "sdxl_train.py"), ("sd3_checkbox", "sd3_train.py"), ("flux1_checkbox", "flux_train.py")),
                   "train_db.py"),
}


TAB_FILES = {"lora": "lora_gui.py", "dreambooth": "dreambooth_gui.py", "finetune": "finetune_gui.py",
             "textual_inversion": "textual_inversion_gui.py"}
TAB_NAMES = {"lora": "LoRA", "dreambooth": "DreamBooth", "finetune": "Finetune", "textual_inversion": "Textual Inversion"}


def tab_of(g: dict[str, Any]) -> str:
    """The GUI tab that saved this file: the first tab whose own keys appear; DreamBooth otherwise."""
    for tab, (markers, _, _) in TABS.items():
        if any(k in g for k in markers):
            return tab
    return "dreambooth"

def _on(v: Any) -> bool:
    return v not in ("", False, None, 0, "0", "false", "False")


def to_sd_scripts(g: dict[str, Any], tab: str = "lora") -> tuple[dict[str, Any], str]:
    """The text-encoder part of the TOML the GUI writes for these fields, and the script it runs."""
    # the script of the first checked model box of the tab, and its sd-scripts architecture
    if tab == "lora":
        script = next((scr for box, scr in kohya_table.GUI_CHECKBOXES if _on(g.get(box))),
                      kohya_table.GUI_DEFAULT_SCRIPT)
    else:
        _, boxes, default = TABS[tab]
        script = next((scr for box, scr in boxes if _on(g.get(box))), default)
    arch = kohya_table.script_arch(script)
    flux, sd3, sdxl, lumina = arch == "flux", arch == "sd3", arch == "sdxl", arch == "lumina"
    anima, hunyuan = arch == "anima", arch == "hunyuan_image"
    chroma = flux and str(g.get("model_type") or "").lower() == "chroma"
    out: dict[str, Any] = {
        "pretrained_model_name_or_path": g.get("pretrained_model_name_or_path"),
        "v2": g.get("v2"),
        "cache_text_encoder_outputs": True if (
            (sdxl and _on(g.get("sdxl_cache_text_encoder_outputs")))
            or (flux and _on(g.get("flux1_cache_text_encoder_outputs")))
            or (sd3 and _on(g.get("sd3_cache_text_encoder_outputs")))
            or (lumina and _on(g.get("lumina_cache_text_encoder_outputs")))
            or (anima and _on(g.get("anima_cache_text_encoder_outputs")))
            or (hunyuan and _on(g.get("hunyuan_image_cache_text_encoder_outputs")))
        ) else None,
        "cache_text_encoder_outputs_to_disk": True if (
            (flux and _on(g.get("flux1_cache_text_encoder_outputs_to_disk")))
            or (sd3 and _on(g.get("sd3_cache_text_encoder_outputs_to_disk")))
            or (lumina and _on(g.get("lumina_cache_text_encoder_outputs_to_disk")))
            or (anima and _on(g.get("anima_cache_text_encoder_outputs_to_disk")))
            or (hunyuan and _on(g.get("hunyuan_image_cache_text_encoder_outputs_to_disk")))
        ) else None,
        "clip_skip": g.get("clip_skip") if _on(g.get("clip_skip")) and not (lumina or anima or hunyuan) else None,
        "max_token_length": _int(g.get("max_token_length")) if arch in ("sd", "sdxl", "sd3") else None,
        "model_type": "chroma" if chroma else None,
        "t5xxl_max_token_length": _int(g.get("t5xxl_max_token_length")) if flux else None,
        "apply_t5_attn_mask": True if chroma else (g.get("apply_t5_attn_mask") if flux else None),
        "gemma2_max_token_length": _int(g.get("lumina_gemma2_max_token_length")) if lumina and _on(g.get("lumina_gemma2_max_token_length")) else None,
        "system_prompt": g.get("lumina_system_prompt") if lumina and _on(g.get("lumina_system_prompt")) else None,
        # class_anima.py:138-149 (both 512 by default)
        "qwen3_max_token_length": _int(g.get("anima_qwen3_max_token_length")) if anima else None,
        "t5_max_token_length": _int(g.get("anima_t5_max_token_length")) if anima else None,
        "weighted_captions": g.get("weighted_captions"),
        "caption_dropout_rate": g.get("caption_dropout_rate"),
        "clip_l_dropout_rate": g.get("sd3_clip_l_dropout_rate") if sd3 else None,
        "clip_g_dropout_rate": g.get("clip_g_dropout_rate") if sd3 else None,
        "t5_dropout_rate": g.get("sd3_t5_dropout_rate") if sd3 else None,
        "caption_dropout_every_n_epochs": _int(g.get("caption_dropout_every_n_epochs")),
        "shuffle_caption": g.get("shuffle_caption"),
        # the LoRA tab trains no text-encoder LoRA when its text_encoder_lr is 0 and unet_lr is not, or for
        # HunyuanImage (resolve_network_train_flags, lora_gui.py:908-923,2108-2115)
        "network_train_unet_only": True if tab == "lora" and (hunyuan or (_num(g.get("text_encoder_lr")) == 0
                                                                        and _num(g.get("unet_lr")) not in (0, None)))
        else None,
    }
    # The GUI drops "", False and None (lora_gui.py:2558-2566), then appends additional_parameters (2592-2597).
    out = {k: v for k, v in out.items() if _on(v) or (isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0)}
    extra = g.get("additional_parameters")
    if isinstance(extra, str) and extra.strip():
        try:
            cli, _ = kohya.parse_cli(shlex.split(extra))
        except ValueError:
            cli = {}
        out.update(cli)
    return out, script


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


_MARKERS = ("LoRA_type", "model_list", "flux1_checkbox", "sd3_checkbox", "sdxl_cache_text_encoder_outputs",
            "additional_parameters", "lumina_checkbox")


def detect(raw: RawConfig) -> int | None:
    """A GUI JSON: one of the GUI's own fields (90), or a partial preset whose keys are almost all GUI fields
    (kohya_ss presets/finetune/*.json; 30)."""
    if raw.fmt != "json" or not isinstance(raw.data, dict):
        return None
    keys = {str(k).lstrip("-") for k in raw.data}
    if any(k in keys for k in _MARKERS):
        return 90
    if len(keys) >= 3:
        gui = frozenset().union(*known_keys("kohya-gui", "te_align.trainers.kohya").values())
        if sum(k in gui for k in keys) >= 0.8 * len(keys):
            return 30
    return None


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    g = raw.data
    if not isinstance(g, dict):
        raise UnreadableConfig("expected a JSON object", file=raw.file)
    tab = tab_of(g)
    keys = known_keys("kohya-gui", "te_align.trainers.kohya")
    valid = keys[tab] | keys.get("legacy", frozenset())
    lines = KeyLines(raw.text)
    gui_file = TAB_FILES[tab]
    other_tabs = {t: keys[t] for t in TAB_FILES if t != tab and t in keys}
    findings = []
    for k in g:
        if k in valid:
            continue
        owner = next((t for t, ks in other_tabs.items() if k in ks), None)
        if owner is not None:  # a real GUI field of another tab: no effect here, not a typo
            findings.append(unknown_key_finding(
                k, valid, trainer=f"kohya_ss: kohya_gui/{gui_file} open_configuration", line=lines(k), severity="info",
                behaviour=f"a {TAB_NAMES[owner]}-tab field; the {TAB_NAMES[tab]} tab does not read it (no effect)",
                hint="remove it (or load the file in the tab that uses it)"))
            continue
        findings.append(unknown_key_finding(
            k, valid, trainer=f"kohya_ss: kohya_gui/{gui_file} open_configuration", line=lines(k),
            behaviour=f"the GUI's {TAB_NAMES[tab]} tab ignores keys it does not know"))
    values, script = to_sd_scripts(g, tab)
    cli, _ = kohya.parse_cli(extra_args)
    values.update(cli)
    prof, reason = kohya.guess_profile(values, script)
    assumed = getattr(reason, "assumed", "")
    if prof is None:
        prof = guess_from_name(values.get("pretrained_model_name_or_path")) or "sd15"
        reason = f"no model checkbox checked ({script})"
    reason = f"{TAB_NAMES[tab]} tab, {reason}"

    def fix_set(key: str, value: Any) -> str:
        field, fams = GUI_FIELDS.get(key, ("", ()))
        fam = _family(prof)
        if field and fam in fams:
            return f'"{field}": {json.dumps(value, ensure_ascii=False)}'
        flag = f"--{key}" if value is True else f"--{key} {json.dumps(value) if isinstance(value, str) else value}"
        return f'add {flag} to "additional_parameters" (the GUI has no field for it)'

    def fix_remove(key: str) -> str:
        field, fams = GUI_FIELDS.get(key, ("", ()))
        if field and _family(prof) in fams:
            if key.endswith("dropout_rate") or key == "caption_dropout_every_n_epochs":
                return f'"{field}": 0'
            if key in ("clip_skip",):
                return f'"{field}": 1'
            if key == "max_token_length":
                return f'"{field}": 75'
            return f'"{field}": ' + ('false' if key in ("apply_t5_attn_mask", "shuffle_caption") else '""')
        return f'remove --{key} from "additional_parameters"'

    trainer = Trainer("kohya-gui", RULES, fix_set, fix_remove, lambda key: lines(GUI_FIELDS.get(key, (key,))[0]),
                      not_settable=kohya.not_settable(script))
    cached = bool(values.get("cache_text_encoder_outputs") or values.get("cache_text_encoder_outputs_to_disk"))
    after = kohya.make_after(values, lambda key: lines(GUI_FIELDS.get(key, (key,))[0]),
                             lambda key: f'"{GUI_FIELDS.get(key, (key,))[0]}": 0', raw, script)
    dirs = [g["train_data_dir"]] if isinstance(g.get("train_data_dir"), str) else []
    return Parsed(trainer, values, prof, f"kohya_ss GUI: {reason}", cached, None, findings, SUPPORTED, after=after,
                  caption_dirs=dirs + kohya.caption_dirs({"dataset_config": g.get("dataset_config")}), assumed=assumed)


def _family(prof: str | None) -> str:
    if not prof:
        return ""
    return family_of(prof)
