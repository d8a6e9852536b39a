"""Writers for the model files the profile-source tests need: diffusers-format folders and
``.safetensors`` checkpoints with the real key names (nothing is downloaded).

Checkpoints whose shapes matter (a 49408 x 768 token embedding, a 32128 x 4096 T5 table) are written
as *sparse* files: a genuine header, then a data section of the right length made with ``truncate``,
so they take almost no disk space. Files whose shapes do not matter go through
``safetensors.numpy.save_file`` with tiny arrays.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from te_align.profiles.model import AlignmentProfile, SlotSpec

Shapes = dict[str, tuple[int, ...]]

_T5_STYLE = ("T5EncoderModel", "UMT5EncoderModel")


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ diffusers folders
def encoder_config(slot: SlotSpec) -> dict[str, Any]:
    """A text_encoder/config.json stating the slot's encoder values (T5 configs use d_model/num_layers)."""
    e = slot.encoder
    if e.cls in _T5_STYLE:
        cfg: dict[str, Any] = {"architectures": [e.cls], "model_type": "t5", "d_model": e.hidden_size, "num_layers": e.num_layers}
    else:
        cfg = {"architectures": [e.cls], "hidden_size": e.hidden_size, "num_hidden_layers": e.num_layers}
    for key in ("projection_dim", "max_position_embeddings", "vocab_size"):
        if getattr(e, key) is not None:
            cfg[key] = getattr(e, key)
    cfg["torch_dtype"] = e.dtype
    return cfg


def tokenizer_files(slot: SlotSpec) -> dict[str, dict[str, Any]]:
    """tokenizer_config.json + special_tokens_map.json (+ vocab.json) stating the slot's tokenizer values."""
    t = slot.tokenizer
    is_clip = t.cls.startswith("CLIP")
    tc: dict[str, Any] = {"tokenizer_class": t.cls, "model_max_length": t.max_length if is_clip else 512}
    sm: dict[str, Any] = {}
    vocab: dict[str, int] = {}
    for kind in ("pad", "bos", "eos"):
        tok, tid = getattr(t, f"{kind}_token"), getattr(t, f"{kind}_token_id")
        if tok is None:
            continue
        tc[f"{kind}_token"] = tok
        sm[f"{kind}_token"] = {"content": tok, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
        if tid is not None:
            vocab[tok] = tid
    files = {"tokenizer_config.json": tc, "special_tokens_map.json": sm}
    if vocab:
        files["vocab.json"] = vocab
    return files


def transformer_config(profile_name: str) -> dict[str, Any] | None:
    """The transformer/config.json values that tell variants apart (diffusers class names)."""
    if profile_name.startswith(("sd3", "sd35")):
        depth = 38 if profile_name == "sd35-large" else 24
        dual = list(range(13)) if profile_name == "sd35-medium" else []
        return {"_class_name": "SD3Transformer2DModel", "num_layers": depth, "dual_attention_layers": dual,
                "joint_attention_dim": 4096, "pooled_projection_dim": 2048}
    if profile_name.startswith("flux"):
        return {"_class_name": "FluxTransformer2DModel", "guidance_embeds": profile_name == "flux-dev",
                "num_layers": 19, "num_single_layers": 38}
    return None


def diffusers_folder(
    root: Path,
    profile: AlignmentProfile,
    *,
    class_name: str | None = None,
    transformer: dict[str, Any] | None = None,
    encoder_changes: dict[str, dict[str, Any]] | None = None,
    tokenizer_changes: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Write a diffusers-format folder whose configs state ``profile``'s values (plus the given changes).

    ``encoder_changes`` / ``tokenizer_changes`` map a subfolder name to keys replaced (None deletes) in
    its config.json / tokenizer_config.json.
    """
    index: dict[str, Any] = {"_class_name": class_name or profile.pipeline, "_diffusers_version": "0.35.0"}
    for slot in profile.slots:
        index[slot.tokenizer_subfolder] = ["transformers", slot.tokenizer.cls]
        index[slot.encoder_subfolder] = ["transformers", slot.encoder.cls]
        cfg = encoder_config(slot)
        for k, v in (encoder_changes or {}).get(slot.encoder_subfolder, {}).items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        write_json(root / slot.encoder_subfolder / "config.json", cfg)
        for fname, data in tokenizer_files(slot).items():
            if fname == "tokenizer_config.json":
                for k, v in (tokenizer_changes or {}).get(slot.tokenizer_subfolder, {}).items():
                    if v is None:
                        data.pop(k, None)
                    else:
                        data[k] = v
            write_json(root / slot.tokenizer_subfolder / fname, data)
    tcfg = transformer if transformer is not None else transformer_config(profile.name)
    if tcfg is not None:
        index["transformer"] = ["diffusers", tcfg["_class_name"]]
        write_json(root / "transformer" / "config.json", tcfg)
    write_json(root / "model_index.json", index)
    return root


# ---------------------------------------------------------------------------- safetensors files
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8}


def write_sparse_safetensors(
    path: Path, shapes: Shapes, *, dtype: str = "BF16", metadata: dict[str, str] | None = None
) -> Path:
    """A structurally valid .safetensors file with the given shapes and all-zero data (sparse on disk)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for key, shape in shapes.items():
        n = math.prod(shape) * _ITEMSIZE[dtype]
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)
    return path


def write_numpy_safetensors(path: Path, keys: list[str]) -> Path:
    """A small real .safetensors file (safetensors.numpy) holding a 1-element tensor per key."""
    import numpy as np
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.zeros((1,), dtype=np.float16) for k in keys}, str(path))
    return path


# --------------------------------------------------------------------- checkpoint key layouts
DM = "model.diffusion_model."


def unet_keys(context_dim: int, *, prefix: str = DM, in_channels: int = 4) -> Shapes:
    """An LDM UNet's identifying tensors (input_blocks.N.1 = the first cross-attention of a level)."""
    keys: Shapes = {f"{prefix}input_blocks.0.0.weight": (320, in_channels, 3, 3)}
    if context_dim >= 1280:  # SDXL (and its refiner): the first level has no attention
        keys[f"{prefix}input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight"] = (640, context_dim)
        keys[f"{prefix}label_emb.0.0.weight"] = (1280, 2816)
    else:
        keys[f"{prefix}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"] = (320, context_dim)
        keys[f"{prefix}input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight"] = (320, context_dim)
        keys[f"{prefix}output_blocks.11.0.skip_connection.weight"] = (320, 640, 1, 1)
    return keys


def hf_clip_keys(prefix: str, *, hidden: int, layers: int, vocab: int = 49408, positions: int = 77,
                 projection: int | None = None) -> Shapes:
    """A transformers-layout CLIP text model under ``prefix`` (which ends in ``text_model.``)."""
    keys: Shapes = {
        f"{prefix}embeddings.token_embedding.weight": (vocab, hidden),
        f"{prefix}embeddings.position_embedding.weight": (positions, hidden),
        f"{prefix}final_layer_norm.weight": (hidden,),
    }
    for i in range(layers):
        keys[f"{prefix}encoder.layers.{i}.mlp.fc1.weight"] = (1, 1)
    if projection is not None:
        keys[prefix[: -len("text_model.")] + "text_projection.weight"] = (projection, hidden)
    return keys


def open_clip_keys(prefix: str, *, width: int, layers: int, vocab: int = 49408, positions: int = 77,
                   projection: int | None = None) -> Shapes:
    """An OpenCLIP text tower under ``prefix`` (SD 2.x cond_stage_model.model., SDXL embedders.1.model.)."""
    keys: Shapes = {
        f"{prefix}token_embedding.weight": (vocab, width),
        f"{prefix}positional_embedding": (positions, width),
        f"{prefix}ln_final.weight": (width,),
    }
    for i in range(layers):
        keys[f"{prefix}transformer.resblocks.{i}.mlp.c_proj.bias"] = (width,)
    if projection is not None:
        keys[f"{prefix}text_projection"] = (width, projection)
    return keys


def t5_keys(prefix: str = "text_encoders.t5xxl.transformer.", *, d_model: int = 4096, layers: int = 24,
            vocab: int = 32128) -> Shapes:
    keys: Shapes = {f"{prefix}shared.weight": (vocab, d_model)}
    for i in range(layers):
        keys[f"{prefix}encoder.block.{i}.layer.0.SelfAttention.q.weight"] = (1, 1)
    return keys


def mmdit_keys(depth: int, *, dual: range | tuple[int, ...] = (), prefix: str = DM) -> Shapes:
    keys: Shapes = {f"{prefix}pos_embed": (1, 36864 if depth == 24 and not dual else 147456, 64 * depth)}
    for i in range(depth):
        keys[f"{prefix}joint_blocks.{i}.x_block.mlp.fc1.weight"] = (1, 1)
        keys[f"{prefix}joint_blocks.{i}.context_block.adaLN_modulation.1.bias"] = (6 * 64 * depth,)
    for i in dual:
        keys[f"{prefix}joint_blocks.{i}.x_block.attn2.qkv.weight"] = (1, 1)
    return keys


def flux_keys(*, guidance: bool, prefix: str = "", img_in: int = 64) -> Shapes:
    keys: Shapes = {f"{prefix}img_in.weight": (3072, img_in)}
    for i in range(19):
        keys[f"{prefix}double_blocks.{i}.img_attn.norm.key_norm.scale"] = (128,)
    for i in range(38):
        keys[f"{prefix}single_blocks.{i}.linear1.weight"] = (1, 1)
    if guidance:
        keys[f"{prefix}guidance_in.in_layer.weight"] = (3072, 256)
        keys[f"{prefix}guidance_in.in_layer.bias"] = (3072,)
    return keys


def chroma_keys(prefix: str = "") -> Shapes:
    keys = flux_keys(guidance=False, prefix=prefix)
    keys[f"{prefix}distilled_guidance_layer.in_proj.weight"] = (5120, 64)
    keys[f"{prefix}distilled_guidance_layer.in_proj.bias"] = (5120,)
    return keys
