"""diffusion-pipe's model types -> te-align's bundled profiles (torch-free).

Read at tdrussell/diffusion-pipe@8f83dbf25d03219df705570ec03e62be04bc402f: ``[model] type`` of the training TOML picks
the model class (``train.py:310-382``), one module per type under ``models/``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelType:
    """One ``[model] type``."""

    type: str
    #: ``models/<module>.py`` and its pipeline class
    module: str
    cls: str
    display: str
    #: te-align's bundled profile for it by default (None: none); the variant may follow the model's files
    profile: str | None
    #: te-align's hooks encode it (``hooks.FAMILIES``)
    hooked: bool = False
    #: a ``ComfyPipeline`` (models/base.py:541): its text encoders are ComfyUI's (``comfy.sd.load_clip``,
    #: models/base.py:575-591), from the ComfyUI submodule; the line of its class in ``models/<module>.py``
    comfy_line: int = 0


TYPES: tuple[ModelType, ...] = (
    ModelType("flux", "flux", "FluxPipeline", "FLUX.1", "flux-dev", True),
    ModelType("sdxl", "sdxl", "SDXLPipeline", "SDXL", "sdxl"),
    ModelType("sd3", "sd3", "SD3Pipeline", "SD3 / SD3.5", "sd35-large", True),
    ModelType("chroma", "chroma", "ChromaPipeline", "Chroma", "chroma", True),
    ModelType("lumina_2", "lumina_2", "Lumina2Pipeline", "Lumina-Image 2.0", "lumina2", True),
    ModelType("hidream", "hidream", "HiDreamPipeline", "HiDream-I1", "hidream"),
    ModelType("wan", "wan.wan", "WanPipeline", "Wan 2.1/2.2", "wan21"),
    ModelType("qwen_image", "qwen_image", "QwenImagePipeline", "Qwen-Image", "qwen-image", True),
    ModelType("auraflow", "auraflow", "AuraFlowPipeline", "AuraFlow", "auraflow", True),
    ModelType(
        "hunyuan_image", "hunyuan_image", "HunyuanImagePipeline", "HunyuanImage-2.1", "hunyuanimage-2.1"
    ),
    ModelType("anima", "cosmos_predict2", "CosmosPredict2Pipeline", "Anima", "anima"),
    ModelType("cosmos_predict2", "cosmos_predict2", "CosmosPredict2Pipeline", "Cosmos-Predict2", None),
    ModelType("ltx-video", "ltx_video", "LTXVideoPipeline", "LTX-Video", None),
    ModelType("hunyuan-video", "hunyuan_video", "HunyuanVideoPipeline", "HunyuanVideo", None),
    ModelType("cosmos", "cosmos", "CosmosPipeline", "Cosmos", None),
    ModelType("omnigen2", "omnigen2", "OmniGen2Pipeline", "OmniGen2", None),
    ModelType("z_image", "z_image", "ZImagePipeline", "Z-Image", None, comfy_line=17),
    ModelType("hunyuan_video_15", "hunyuan_video_15", "HunyuanVideo15Pipeline", "HunyuanVideo 1.5", None, comfy_line=17),
    ModelType("flux2", "flux2", "Flux2Pipeline", "FLUX.2", None, comfy_line=18),
    ModelType("ernie_image", "ernie_image", "ErnieImagePipeline", "ERNIE-Image", None, comfy_line=15),
    ModelType("ltx2", "ltx2", "LTX2Pipeline", "LTX-2", None, comfy_line=173),
    ModelType("ideogram4", "ideogram4", "Ideogram4Pipeline", "Ideogram 4", None, comfy_line=22),
    ModelType("krea2", "krea2", "Krea2Pipeline", "Krea 2", None, comfy_line=18),
    ModelType("minimax_h3", "minimax_h3", "MinimaxH3Pipeline", "MiniMax H3", None, comfy_line=195),
)
BY_TYPE = {t.type: t for t in TYPES}
#: The model-file keys of ``[model]`` whose names tell a model's variant (first that names one wins).
MODEL_FILES = ("diffusers_path", "transformer_path", "checkpoint_path", "ckpt_path", "transformer")
#: The ComfyUI submodule diffusion-pipe pins (``git ls-tree HEAD submodules/ComfyUI``); its code is not read by te-align.
COMFYUI_COMMIT = "9a9fdb10ed144ce760d9682cb247526ea23cc525"
#: Qwen-Image-Edit versions (the model's name) -> te-align's profile. diffusion-pipe has no key for the version: one
#: ``[model] type = 'qwen_image'`` trains every one, in Edit mode when a dataset directory has ``control_path``.
QWEN_EDIT_PROFILES = ("qwen-image-edit", "qwen-image-edit-2509", "qwen-image-edit-2511")
