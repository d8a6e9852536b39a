"""diffusion-pipe ``[model]`` text-encoder path keys that the config's ``[model] type`` never reads: diffusion-pipe
reads every key with ``.get`` or ``config['key']`` in the model type's own class and ignores the rest, so such a path
is silently not the encoder that is loaded.

Every fact was read at tdrussell/diffusion-pipe@8f83dbf25d03219df705570ec03e62be04bc402f (models/*.py), file:line
there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from te_align.audit.findings import Edit, Finding

#: The [model] keys that name a text encoder's weights in some model type.
TE_PATH_KEYS = ("text_encoder_path", "llm_path", "t5_path", "clip_path", "llama3_path", "byt5_path", "text_encoders",
                "text_encoder")

_COMFY = ((), "the [[model.text_encoders]] tables (ComfyPipeline, models/base.py:576-591)")
#: [model] type -> (the text-encoder path keys its class reads, where its text encoders come from).
READS: dict[str, tuple[tuple[str, ...], str]] = {
    "flux": ((), "diffusers_path (FluxPipeline.from_pretrained, models/flux.py:194)"),
    "chroma": ((), "diffusers_path (FluxPipeline.from_pretrained, models/chroma.py:143)"),
    "sd3": ((), "diffusers_path (models/sd3.py:35-46)"),
    "sdxl": ((), "checkpoint_path (models/sdxl.py:385-387)"),
    "ltx-video": ((), "diffusers_path / single_file_path (models/ltx_video.py:36-59)"),
    "omnigen2": ((), "diffusers_path (models/omnigen2.py:44)"),
    "hidream": (("llama3_path",), "llama3_path (models/hidream.py:55,75) and diffusers_path (:61,106)"),
    "auraflow": (("text_encoder_path",), "text_encoder_path (models/auraflow.py:43)"),
    "cosmos": (("text_encoder_path",), "text_encoder_path (models/cosmos.py:159)"),
    "cosmos_predict2": (("t5_path", "llm_path"), "t5_path, else llm_path (models/cosmos_predict2.py:225-249)"),
    "anima": (("t5_path", "llm_path"), "t5_path, else llm_path (models/cosmos_predict2.py:225-249)"),
    "hunyuan_image": (("text_encoder_path", "byt5_path"),
                      "text_encoder_path and byt5_path (models/hunyuan_image.py:73,86)"),
    "hunyuan-video": (("llm_path", "clip_path"),
                      "llm_path and clip_path, else ckpt_path's text_encoder folders (models/hunyuan_video.py:258,274)"),
    "lumina_2": (("llm_path",), "llm_path (models/lumina_2.py:56)"),
    "qwen_image": (("text_encoder_path",), "text_encoder_path, else diffusers_path/text_encoder "
                                           "(models/qwen_image.py:201-204)"),
    "wan": (("llm_path",), "llm_path, else ckpt_path's T5 checkpoint (models/wan/wan.py:179)"),
    "ltx2": (("text_encoder",), "text_encoder (comfy.sd.load_clip, models/ltx2.py:236-239)"),
    **{t: (("text_encoders",), _COMFY[1]) for t in ("z_image", "hunyuan_video_15", "flux2", "ernie_image",
                                                    "ideogram4", "krea2", "minimax_h3")},
}


def te_path_findings(model: dict[str, Any], mt_name: str, line: Callable[[str], int | None]) -> list[Finding]:
    """Each text-encoder path key of ``[model]`` this type never reads, and ``llm_path`` beside ``t5_path`` in the
    Cosmos-Predict2 class (Anima), which loads T5 when both are there."""
    if mt_name not in READS:
        return []
    reads, source = READS[mt_name]
    out: list[Finding] = []
    for key in TE_PATH_KEYS:
        if key not in model or key in reads:
            continue
        out.append(Finding(
            kind="unused-value", severity="warning", setting=f"model.{key}", effective=model[key], key=key,
            line=line(key),
            message=(f"[model] {key} is not read by type {mt_name!r}: its text encoders come from {source}, so the "
                     f"encoder {key} names is not the one loaded"),
            fix=f"remove {key} from [model] (and give the text encoder as type {mt_name!r} reads it)",
            trainer_source=f"diffusion-pipe: {source}", edit=Edit(key, remove=True)))
    if mt_name in ("anima", "cosmos_predict2") and "t5_path" in model and "llm_path" in model:
        keep = "llm_path" if mt_name == "anima" else "t5_path"
        drop = "t5_path" if keep == "llm_path" else "llm_path"
        out.append(Finding(
            kind="unused-value", severity="warning", setting="model.llm_path", effective=model["llm_path"],
            key="llm_path", line=line("llm_path"),
            message=("[model] llm_path is not read while t5_path is there: the Cosmos-Predict2 class loads the T5 of "
                     "t5_path as the text encoder (with the T5 tokenizer) and reaches llm_path only without it"
                     + (", so this Anima run encodes captions with T5, not Anima's Qwen3" if mt_name == "anima"
                        else "")),
            fix=f"remove {drop} from [model]",
            trainer_source="diffusion-pipe: models/cosmos_predict2.py:225-249", edit=Edit(drop, remove=True)))
    return out
