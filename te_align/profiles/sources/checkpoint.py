"""Profiles from single-file ``.safetensors`` checkpoints, read from the header only.

Tensor names and shapes tell the family and variant (UNet cross-attention width, MMDiT depth, FLUX
guidance embedder, ...); the text encoders a checkpoint embeds give widths, depths, vocabularies and
positions. Pickle checkpoints (``.ckpt``, ``.bin``, ``.pt``) are never opened.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from te_align import kohya_lora
from te_align._safetensors import Header, read_header
from te_align.errors import ProfileError
from te_align.profiles.model import AlignmentProfile
from te_align.profiles.sources.common import (
    BY_PROFILE,
    BuildReport,
    Collector,
    EncoderRole,
    bundled_base,
    log_report,
    profile_name,
)


def build_checkpoint(path: str | Path, shown: str | None = None) -> BuildReport:
    """The build report of a single-file checkpoint (``shown``: how messages name it)."""
    p = Path(path).expanduser()
    text = str(path) if shown is None else shown
    if not p.is_file():
        raise ProfileError("no such checkpoint file", file=text)
    h = read_header(p, label=text, error=ProfileError)
    if not h.tensors:
        raise ProfileError("the safetensors file holds no tensors", file=text)
    return _build(h, p, text)


def from_single_file(path: str | Path) -> AlignmentProfile:
    """The profile of a single-file ``.safetensors`` checkpoint, from its header (differences are logged once)."""
    report = build_checkpoint(path)
    log_report(report)
    return report.profile


_DM_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def _denoiser_keys(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The denoiser's tensors with the LDM / ComfyUI prefix removed (bare files pass through)."""
    for prefix in _DM_PREFIXES:
        found = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
        if found:
            return found
    return shapes


def _indices(keys: Iterable[str], pattern: str) -> set[int]:
    rx = re.compile(pattern)
    return {int(m.group(1)) for k in keys if (m := rx.match(k))}


_UNET_WIDTHS = {768: "sd15", 1024: "sd21", 2048: "sdxl"}
_UNET_TO_K = (
    re.compile(r"input_blocks\.\d+\.1\.transformer_blocks\.\d+\.attn2\.to_k\.weight$"),
    re.compile(r"down_blocks\.\d+\.attentions\.\d+\.transformer_blocks\.\d+\.attn2\.to_k\.weight$"),
)


def _detect_checkpoint(h: Header, label: str) -> tuple[str, str, list[str]]:
    """(bundled profile, reason, notes) for a checkpoint, from tensor names and shapes."""
    keys = h.shapes
    dm = _denoiser_keys(keys)
    notes: list[str] = []

    def has(*names: str) -> bool:
        return any(n in dm for n in names)

    # --- families te-align does not cover, checked first because they share key names with covered ones
    if has("single_stream_modulation.lin.weight", "early_stream_modulations.image.lin.weight"):
        raise ProfileError("this is a FLUX.2-type transformer; there is no bundled profile for it", file=label)
    if has("txt_in.text_norm.weight"):
        raise ProfileError("this is a Qwen-Image 2.x transformer; there is no bundled profile for it", file=label)

    # --- SD3 / SD3.5 MMDiT (original keys; diffusers keys below)
    joint = _indices(dm, r"joint_blocks\.(\d+)\.")
    if joint:
        dual = _indices(dm, r"joint_blocks\.(\d+)\.x_block\.attn2\.")
        return _sd3_variant(len(joint), bool(dual), "joint_blocks", label)

    # --- Chroma before FLUX: it has double_blocks too
    if any(k.startswith("distilled_guidance_layer.") for k in dm):
        return "chroma", "distilled_guidance_layer.* (Chroma's modulation approximator)", notes

    if _indices(dm, r"double_blocks\.(\d+)\.") and _indices(dm, r"single_blocks\.(\d+)\."):
        return _flux_variant(dm, has("guidance_in.in_layer.weight", "guidance_in.in_layer.bias"), "guidance_in.*", "img_in.weight", notes)

    blocks = _indices(dm, r"transformer_blocks\.(\d+)\.")
    if blocks and _indices(dm, r"single_transformer_blocks\.(\d+)\."):
        return _flux_variant(
            dm, has("time_text_embed.guidance_embedder.linear_1.weight"),
            "time_text_embed.guidance_embedder.*", "x_embedder.weight", notes,
        )
    if blocks and has("context_embedder.weight") and has("pos_embed.pos_embed"):
        dual = _indices(dm, r"transformer_blocks\.(\d+)\.attn2\.")
        return _sd3_variant(len(blocks), bool(dual), "transformer_blocks (diffusers SD3Transformer2DModel)", label)
    if has("txt_norm.weight") and any(k.startswith("transformer_blocks.0.img_mod.") for k in dm):
        notes.append("Qwen-Image-Edit checkpoints share this transformer; their prompt template differs from Qwen-Image's")
        return "qwen-image", "txt_norm + transformer_blocks.*.img_mod (Qwen-Image transformer)", notes

    # --- UNets: the cross-attention width tells SD 1.x / 2.x / XL apart
    for rx in _UNET_TO_K:
        for k, shape in dm.items():
            if rx.match(k) and len(shape) == 2:
                width = shape[1]
                if width == 1280:
                    raise ProfileError(
                        "an SDXL refiner UNet (cross-attention width 1280, OpenCLIP bigG only); there is no bundled profile for it",
                        file=label,
                    )
                if width not in _UNET_WIDTHS:
                    raise ProfileError(
                        f"a UNet with cross-attention width {width} matches no bundled profile "
                        "(768 = SD 1.x, 1024 = SD 2.x, 2048 = SDXL)",
                        file=label,
                    )
                name = _UNET_WIDTHS[width]
                inp = dm.get("input_blocks.0.0.weight") or dm.get("conv_in.weight")
                if inp is not None and len(inp) == 4 and inp[1] != 4:
                    notes.append(f"the UNet takes {inp[1]} input channels (inpainting / instruct variant); same text conditioning")
                return name, f"UNet cross-attention width {width} ({k} {list(shape)})", notes

    # --- text encoders alone still tell the SD families apart (e.g. a UNet saved under another prefix)
    if any(k.startswith("conditioner.embedders.1.model.") for k in keys):
        return "sdxl", "conditioner.embedders.1 (OpenCLIP bigG of SDXL)", notes
    if any(k.startswith("conditioner.embedders.0.model.") for k in keys):
        raise ProfileError("an SDXL refiner (OpenCLIP bigG only); there is no bundled profile for it", file=label)
    if any(k.startswith("cond_stage_model.model.") for k in keys):
        return "sd21", "cond_stage_model.model.* (OpenCLIP ViT-H of SD 2.x)", notes
    if any(k.startswith("cond_stage_model.transformer.") for k in keys):
        return "sd15", "cond_stage_model.transformer.* (CLIP ViT-L of SD 1.x)", notes

    # --- other transformers, original key names as diffusers' single-file loader knows them
    if all(k in dm for k in ("double_layers.0.attn.w2q.weight", "double_layers.0.attn.w1q.weight", "cond_seq_linear.weight", "t_embedder.mlp.0.weight")):
        return "auraflow", "double_layers.* + cond_seq_linear (AuraFlow MMDiT)", notes
    if has("double_stream_blocks.0.block.adaLN_modulation.1.bias"):
        return "hidream", "double_stream_blocks.* (HiDream-I1)", notes
    if has("cap_embedder.0.weight") and not has("layers.0.adaLN_modulation.0.weight"):
        return "lumina2", "cap_embedder.* (Lumina-Image 2.0 NextDiT)", notes
    if has("head.modulation"):
        pe = dm.get("patch_embedding.weight")
        if pe and pe[0] != 1536:
            notes.append(f"a {pe[0]}-wide Wan transformer (the bundled profile is Wan2.1 T2V 1.3B; the text conditioning is the same UMT5 recipe)")
        return "wan21", "head.modulation (Wan transformer)", notes

    raise ProfileError(_unrecognised(keys), file=label)


def _unrecognised(keys: dict[str, tuple[int, ...]]) -> str:
    names = list(keys)
    if any(kohya_lora.is_lora_tensor(k) for k in names):
        what = "it looks like a LoRA, which has no text-encoder recipe of its own"
    elif any(k.startswith(("text_model.", "encoder.block.", "transformer.resblocks.", "shared.")) for k in names):
        what = "it looks like a standalone text encoder; pass the model checkpoint or folder"
    elif any(k.startswith(("encoder.down.", "decoder.up.", "encoder.down_blocks.")) for k in names):
        what = "it looks like a VAE; pass the model checkpoint or folder"
    else:
        what = f"first tensors: {', '.join(names[:3])}"
    return (
        f"cannot tell which model this checkpoint holds from its {len(names)} tensor names ({what}); recognised: "
        "SD 1.x/2.x/XL UNets (model.diffusion_model.input_blocks.*), SD3/3.5 (joint_blocks.*), "
        "FLUX.1 (double_blocks.* / single_blocks.*), Chroma (distilled_guidance_layer.*), "
        "diffusers transformers (transformer_blocks.*), AuraFlow, HiDream, Lumina 2, Qwen-Image, Wan"
    )


def _sd3_variant(depth: int, dual: bool, what: str, label: str) -> tuple[str, str, list[str]]:
    reason = f"{depth} {what}" + (" with dual attention (x_block.attn2 / attn2)" if dual else "")
    if depth == 38 and not dual:
        return "sd35-large", reason, []
    if depth == 24 and dual:
        return "sd35-medium", reason, []
    if depth == 24:
        return "sd3-medium", reason, []
    raise ProfileError(
        f"an SD3 MMDiT with {reason} matches no bundled profile "
        "(24 = sd3-medium, 24 + dual attention = sd35-medium, 38 = sd35-large)",
        file=label,
    )


def _flux_variant(
    dm: dict[str, tuple[int, ...]], guidance: bool, guidance_keys: str, img_in: str, notes: list[str]
) -> tuple[str, str, list[str]]:
    if not guidance:
        return "flux-schnell", f"double/single blocks without {guidance_keys} (FLUX.1-schnell)", notes
    shape = dm.get(img_in)
    if shape is not None and len(shape) == 2 and shape[1] != 64:
        notes.append(f"{img_in} takes {shape[1]} channels (FLUX.1 Fill / Depth / Canny); same text conditioning as FLUX.1-dev")
    return "flux-dev", f"double/single blocks with {guidance_keys} (guidance-distilled FLUX.1-dev)", notes


# ---- text encoders embedded in a checkpoint: (role, key prefix, layout)
_EMBEDDED_TE: tuple[tuple[EncoderRole, str, Literal["hf-clip", "open-clip", "t5"]], ...] = (
    ("clip_l", "cond_stage_model.transformer.text_model.", "hf-clip"),
    ("clip_h", "cond_stage_model.model.", "open-clip"),
    ("clip_l", "conditioner.embedders.0.transformer.text_model.", "hf-clip"),
    ("clip_g", "conditioner.embedders.1.model.", "open-clip"),
    ("clip_l", "text_encoders.clip_l.transformer.text_model.", "hf-clip"),
    ("clip_g", "text_encoders.clip_g.transformer.text_model.", "hf-clip"),
    ("t5xxl", "text_encoders.t5xxl.transformer.", "t5"),
)


def _measure_te(
    shapes: dict[str, tuple[int, ...]], role: EncoderRole, prefix: str, layout: str, notes: list[str]
) -> dict[str, tuple[int, str]]:
    """Encoder values measurable from tensor shapes: field -> (value, evidence)."""
    sub = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
    found: dict[str, tuple[int, str]] = {}

    def shape_of(key: str, rank: int) -> tuple[int, ...] | None:
        s = sub.get(key)
        return s if s is not None and len(s) == rank else None

    if layout == "hf-clip":
        emb = shape_of("embeddings.token_embedding.weight", 2)
        pos = shape_of("embeddings.position_embedding.weight", 2)
        layers = _indices(sub, r"encoder\.layers\.(\d+)\.")
        layer_what = "encoder.layers.*"
        root = prefix[: -len("text_model.")]
        proj = shapes.get(root + "text_projection.weight")
        proj_dim = (proj[0], f"{root}text_projection.weight {list(proj)}") if proj and len(proj) == 2 else None
        emb_key, pos_key = "embeddings.token_embedding.weight", "embeddings.position_embedding.weight"
    elif layout == "open-clip":
        emb = shape_of("token_embedding.weight", 2)
        pos = shape_of("positional_embedding", 2)
        layers = _indices(sub, r"transformer\.resblocks\.(\d+)\.")
        layer_what = "transformer.resblocks.*"
        proj = sub.get("text_projection")
        proj_dim = (proj[1], f"{prefix}text_projection {list(proj)}") if proj and len(proj) == 2 and role != "clip_h" else None
        emb_key, pos_key = "token_embedding.weight", "positional_embedding"
    else:
        emb_key = "shared.weight" if "shared.weight" in sub else "encoder.embed_tokens.weight"
        emb = shape_of(emb_key, 2)
        pos = None
        pos_key = ""
        layers = _indices(sub, r"encoder\.block\.(\d+)\.")
        layer_what = "encoder.block.*"
        proj_dim = None
    if emb is not None:
        found["hidden_size"] = (emb[1], f"tensor {prefix}{emb_key} {list(emb)}")
        found["vocab_size"] = (emb[0], f"tensor {prefix}{emb_key} {list(emb)}")
    if pos is not None:
        found["max_position_embeddings"] = (pos[0], f"tensor {prefix}{pos_key} {list(pos)}")
    if layers:
        count = max(layers) + 1
        if role == "clip_h":
            notes.append(
                f"{prefix}: the checkpoint holds {count} OpenCLIP blocks; diffusers drops the last "
                f"(SD 2.x conditions on the penultimate one), leaving {count - 1} encoder layers"
            )
            found["num_layers"] = (count - 1, f"{count} {prefix}{layer_what} blocks, the last one unused")
        else:
            found["num_layers"] = (count, f"{count} {prefix}{layer_what} blocks")
    if proj_dim is not None:
        found["projection_dim"] = (proj_dim[0], f"tensor {proj_dim[1]}")
    return found


def _build(h: Header, path: Path, shown: str) -> BuildReport:
    shapes = h.shapes
    name, reason, notes = _detect_checkpoint(h, shown)
    base = bundled_base(name, reason)
    recipe = BY_PROFILE[name]
    out = Collector(base, status="inferred")
    for n in notes:
        out.note(n)
    arch = h.metadata.get("modelspec.architecture")
    if arch:
        out.note(f"__metadata__ modelspec.architecture is {arch!r}")
    subfolders = dict(recipe.encoders)
    seen = False
    for role, prefix, layout in _EMBEDDED_TE:
        if not any(k.startswith(prefix) for k in shapes):
            continue
        seen = True
        sub = subfolders.get(role)
        slot = next((s for s in base.slots if s.encoder_subfolder == sub), None) if sub else None
        if slot is None:
            out.note(f"the checkpoint also holds a text encoder under {prefix} that {base.name} does not use")
            continue
        measured_notes: list[str] = []
        measured = _measure_te(shapes, role, prefix, layout, measured_notes)
        for n in measured_notes:
            out.note(n)
        for fname, (value, evidence) in measured.items():
            if getattr(slot.encoder, fname) is None and fname != "hidden_size" and fname != "num_layers":
                continue
            out.found(f"slots.{slot.name}.encoder.{fname}", value, shown, evidence)
    if not seen:
        out.note("the checkpoint holds no text encoders; encoder values are the bundled ones")
    return out.apply(name=profile_name(path.stem), kind="single-file", source=shown, reason=reason, repo="")
