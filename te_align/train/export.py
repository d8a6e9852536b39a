"""LoRA outputs: the diffusers format (``pipe.load_lora_weights``) and the kohya / ComfyUI key format.

Diffusers format: keys ``unet.<module>.lora_A.weight`` / ``transformer.…`` / ``text_encoder.…``
written by the pipeline class's own ``save_lora_weights`` (with its adapter metadata, so alpha
survives), then stamped with ``te_align.*`` metadata.

Kohya format: ``<name>.lora_down.weight`` / ``.lora_up.weight`` / ``.alpha``, as kohya sd-scripts
saves it and ComfyUI / A1111 / diffusers read it:

- SD1/SD2/SDXL UNet (``networks/lora.py``): ``lora_unet_<diffusers module with _>``; text encoders
  ``lora_te_`` (one encoder) or ``lora_te1_`` / ``lora_te2_`` with ``text_model_`` module names.
- Flux (``networks/lora_flux.py``): ``lora_unet_`` + the module names of the original (BFL) Flux
  model, ``double_blocks_{i}_img_attn_qkv``, ``single_blocks_{i}_linear1`` and so on; see
  :func:`flux_modules`. Chroma the same: sd-scripts trains it with ``networks/lora_flux.py`` and its
  ``library/chroma_models.py`` keeps Flux's block names (``double_blocks.{i}.img_attn.qkv``,
  ``single_blocks.{i}.linear1``); its approximator (``distilled_guidance_layer``) has no name here.
- SD3/3.5 (``networks/lora_sd3.py``): ``lora_unet_`` + the original MMDiT names,
  ``joint_blocks_{i}_x_block_attn_qkv``, ``joint_blocks_{i}_context_block_mlp_fc1`` and so on;
  see :func:`sd3_modules`.

Diffusers splits some of the original fused layers (Flux/SD3 ``qkv``, Flux single-block
``linear1`` = q, k, v and the MLP input) into separate modules, each with its own LoRA. A fused
kohya module holds them the way sd-scripts' ``split_qkv`` networks save them: ``lora_down`` is the
parts' downs stacked along the rank dimension, ``lora_up`` the block-diagonal of the parts' ups
(rank = sum of the parts' ranks), and ``alpha`` scaled by the same factor as the rank, because
every reader (sd-scripts, ComfyUI, diffusers' kohya converter) applies ``alpha / rank`` with the
fused rank. A part that was not trained gets an all-zero block of the same rank, so every fused
module is uniformly block-diagonal (what diffusers' converter splits back exactly). The fusion is
exact: ``up @ down`` of the fused module equals the parts' ``up_i @ down_i`` stacked.

:func:`kohya_to_diffusers` maps a kohya file back (splitting fused modules) given the model's module
names; :func:`kohya_to_pipeline_state` gives a state dict that ``pipe.load_lora_weights`` takes for
any family (diffusers itself has no reader for the SD3 kohya layout, and its Flux reader assumes
full-size Flux for ``linear1``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from te_align import kohya_lora
from te_align._types import JSONObject, JSONValue
from te_align.metadata import stamp, stamp_keys
from te_align.train._io import _umask, write_atomic, writing
from te_align.train.config import TrainError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

    from te_align.profiles import AlignmentProfile

def lora_state_dicts(models: Mapping[str, torch.nn.Module]) -> dict[str, dict[str, torch.Tensor]]:
    """Component name -> peft-format LoRA state dict (``<module>.lora_A.weight``), float32 CPU copies."""
    from peft.utils import get_peft_model_state_dict

    out = {}
    for name, model in models.items():
        sd = get_peft_model_state_dict(model)
        out[name] = {k: v.detach().float().cpu().contiguous() for k, v in sd.items()}
    return out


def _adapter_metadata(model: torch.nn.Module) -> JSONValue:
    cfg = model.peft_config["default"].to_dict()
    return json.loads(json.dumps(cfg, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


def save_diffusers_lora(
    pipeline_cls: type[DiffusionPipeline],
    models: Mapping[str, torch.nn.Module],
    path: str | os.PathLike[str],
    *,
    profile: AlignmentProfile,
    extra: JSONObject,
) -> Path:
    """Write the LoRA in diffusers format with te_align metadata; whole file or nothing."""
    target = Path(path)
    from diffusers.utils import convert_state_dict_to_diffusers

    layers = lora_state_dicts(models)
    kwargs: dict[str, object] = {}
    for name, sd in layers.items():
        # denoisers in peft format (lora_A / lora_B): diffusers converts a denoiser state dict to peft only
        # when its first key is not lora_A, so the partly renamed (lora.down) dict it would otherwise get,
        # with to_q/to_k/to_v/to_out.0 renamed and other modules not, silently loses those layers
        kwargs[f"{name}_lora_layers"] = sd if name in kohya_lora.DENOISER_PREFIX else convert_state_dict_to_diffusers(sd)
        kwargs[f"{name}_lora_adapter_metadata"] = _adapter_metadata(models[name])
    with writing(target):
        tmp = Path(tempfile.mkdtemp(prefix=".lora-", dir=target.parent))
        try:
            pipeline_cls.save_lora_weights(str(tmp), weight_name="lora.safetensors", safe_serialization=True, **kwargs)
            # safetensors creates files 0600; the LoRA gets what open() gives (0666 & ~umask), like the kohya file
            os.chmod(tmp / "lora.safetensors", 0o666 & ~_umask())
            stamp(tmp / "lora.safetensors", target, profile=profile, extra=extra)
            os.chmod(target, 0o666 & ~_umask())
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


#: What te-align <= 0.x wrote for SD3/Flux transformers (diffusers module names); still read.
_LEGACY_TRANSFORMER_PREFIX = "lora_transformer"
#: Families whose kohya denoiser names are the original (non-diffusers) model's.
ORIGINAL_LAYOUT_FAMILIES = ("sd3", "flux", "chroma")


def kohya_prefix(component: str, n_text_encoders: int) -> str:
    """The kohya tensor-name prefix of a component (the format: :mod:`te_align.kohya_lora`)."""
    found = kohya_lora.prefix(component, n_text_encoders)
    if found is not None:
        return found
    raise TrainError(f"no kohya prefix for component '{component}'")


# ------------------------------------------------------------------------ original-layout module tables
@dataclass(frozen=True)
class KohyaModule:
    """One kohya module of an original-layout denoiser and the diffusers modules it covers.

    ``parts`` are in the order of the fused layer's output rows; ``split`` says how its output rows
    divide among them (``equal``: equal thirds for ``qkv``; ``linear1``: Flux single block, q/k/v
    of the input width, then the MLP); ``swap``: the output halves are (shift, scale) in the
    original model and (scale, shift) in diffusers (final ``AdaLayerNormContinuous`` layers).
    """

    name: str
    parts: tuple[str, ...]
    split: str = "equal"
    swap: bool = False


def _indices(names: Iterable[str], head: str) -> list[int]:
    found = set()
    for n in names:
        if n.startswith(head):
            rest = n[len(head) :].split(".", 1)[0]
            if rest.isdigit():
                found.add(int(rest))
    return sorted(found)


def _present(table: list[KohyaModule], names: set[str]) -> list[KohyaModule]:
    return [m for m in table if all(p in names for p in m.parts)]


def flux_modules(module_names: Iterable[str]) -> list[KohyaModule]:
    """The kohya modules of a diffusers ``FluxTransformer2DModel`` with these module names.

    Names are those of sd-scripts ``library/flux_models.py`` (``Flux``: ``double_blocks``
    ``DoubleStreamBlock`` img/txt ``_mod.lin``, ``_attn.qkv``, ``_attn.proj``, ``_mlp.0``, ``_mlp.2``;
    ``single_blocks`` ``SingleStreamBlock`` ``linear1``, ``linear2``, ``modulation.lin``;
    ``img_in``, ``txt_in``, ``time_in`` / ``vector_in`` / ``guidance_in`` ``MLPEmbedder``
    ``in_layer`` / ``out_layer``, ``final_layer`` ``linear`` / ``adaLN_modulation.1``), joined with
    ``_`` under ``lora_unet`` as ``networks/lora_flux.py`` names them.
    """
    names = set(module_names)
    table: list[KohyaModule] = []
    for i in _indices(names, "transformer_blocks."):
        b = f"transformer_blocks.{i}."
        d = f"double_blocks_{i}_"
        table += [
            KohyaModule(d + "img_attn_qkv", (b + "attn.to_q", b + "attn.to_k", b + "attn.to_v")),
            KohyaModule(d + "img_attn_proj", (b + "attn.to_out.0",)),
            KohyaModule(d + "img_mlp_0", (b + "ff.net.0.proj",)),
            KohyaModule(d + "img_mlp_2", (b + "ff.net.2",)),
            KohyaModule(d + "img_mod_lin", (b + "norm1.linear",)),
            KohyaModule(d + "txt_attn_qkv", (b + "attn.add_q_proj", b + "attn.add_k_proj", b + "attn.add_v_proj")),
            KohyaModule(d + "txt_attn_proj", (b + "attn.to_add_out",)),
            KohyaModule(d + "txt_mlp_0", (b + "ff_context.net.0.proj",)),
            KohyaModule(d + "txt_mlp_2", (b + "ff_context.net.2",)),
            KohyaModule(d + "txt_mod_lin", (b + "norm1_context.linear",)),
        ]
    for i in _indices(names, "single_transformer_blocks."):
        b = f"single_transformer_blocks.{i}."
        s = f"single_blocks_{i}_"
        table += [
            KohyaModule(s + "linear1", (b + "attn.to_q", b + "attn.to_k", b + "attn.to_v", b + "proj_mlp"), split="linear1"),
            KohyaModule(s + "linear2", (b + "proj_out",)),
            KohyaModule(s + "modulation_lin", (b + "norm.linear",)),
        ]
    e = "time_text_embed."
    table += [
        KohyaModule("img_in", ("x_embedder",)),
        KohyaModule("txt_in", ("context_embedder",)),
        KohyaModule("time_in_in_layer", (e + "timestep_embedder.linear_1",)),
        KohyaModule("time_in_out_layer", (e + "timestep_embedder.linear_2",)),
        KohyaModule("vector_in_in_layer", (e + "text_embedder.linear_1",)),
        KohyaModule("vector_in_out_layer", (e + "text_embedder.linear_2",)),
        KohyaModule("guidance_in_in_layer", (e + "guidance_embedder.linear_1",)),
        KohyaModule("guidance_in_out_layer", (e + "guidance_embedder.linear_2",)),
        KohyaModule("final_layer_linear", ("proj_out",)),
        KohyaModule("final_layer_adaLN_modulation_1", ("norm_out.linear",), swap=True),
    ]
    return _present(table, names)


def sd3_modules(module_names: Iterable[str]) -> list[KohyaModule]:
    """The kohya modules of a diffusers ``SD3Transformer2DModel`` with these module names.

    Names are those of sd-scripts ``library/sd3_models.py`` (``MMDiT``: ``joint_blocks`` of
    ``context_block`` / ``x_block`` ``SingleDiTBlock`` with ``attn.qkv``, ``attn.proj``,
    ``attn2.qkv`` / ``attn2.proj`` (SD3.5M), ``mlp.fc1``, ``mlp.fc2``, ``adaLN_modulation.1``;
    ``x_embedder.proj``, ``context_embedder``, ``t_embedder.mlp.0/2``, ``y_embedder.mlp.0/2``,
    ``final_layer.linear`` / ``.adaLN_modulation.1``), joined with ``_`` under ``lora_unet`` as
    ``networks/lora_sd3.py`` names them. The last block's context half is ``pre_only`` (its
    modulation is (shift, scale), diffusers' ``AdaLayerNormContinuous`` is (scale, shift)).
    """
    names = set(module_names)
    blocks = _indices(names, "transformer_blocks.")
    table: list[KohyaModule] = []
    for i in blocks:
        b = f"transformer_blocks.{i}."
        x = f"joint_blocks_{i}_x_block_"
        c = f"joint_blocks_{i}_context_block_"
        table += [
            KohyaModule(x + "attn_qkv", (b + "attn.to_q", b + "attn.to_k", b + "attn.to_v")),
            KohyaModule(x + "attn_proj", (b + "attn.to_out.0",)),
            KohyaModule(x + "attn2_qkv", (b + "attn2.to_q", b + "attn2.to_k", b + "attn2.to_v")),
            KohyaModule(x + "attn2_proj", (b + "attn2.to_out.0",)),
            KohyaModule(x + "mlp_fc1", (b + "ff.net.0.proj",)),
            KohyaModule(x + "mlp_fc2", (b + "ff.net.2",)),
            KohyaModule(x + "adaLN_modulation_1", (b + "norm1.linear",)),
            KohyaModule(c + "attn_qkv", (b + "attn.add_q_proj", b + "attn.add_k_proj", b + "attn.add_v_proj")),
            KohyaModule(c + "attn_proj", (b + "attn.to_add_out",)),
            KohyaModule(c + "mlp_fc1", (b + "ff_context.net.0.proj",)),
            KohyaModule(c + "mlp_fc2", (b + "ff_context.net.2",)),
            KohyaModule(c + "adaLN_modulation_1", (b + "norm1_context.linear",), swap=i == blocks[-1]),
        ]
    e = "time_text_embed."
    table += [
        KohyaModule("x_embedder_proj", ("pos_embed.proj",)),
        KohyaModule("context_embedder", ("context_embedder",)),
        KohyaModule("t_embedder_mlp_0", (e + "timestep_embedder.linear_1",)),
        KohyaModule("t_embedder_mlp_2", (e + "timestep_embedder.linear_2",)),
        KohyaModule("y_embedder_mlp_0", (e + "text_embedder.linear_1",)),
        KohyaModule("y_embedder_mlp_2", (e + "text_embedder.linear_2",)),
        KohyaModule("final_layer_linear", ("proj_out",)),
        KohyaModule("final_layer_adaLN_modulation_1", ("norm_out.linear",), swap=True),
    ]
    return _present(table, names)


def original_modules(family: str, module_names: Iterable[str]) -> list[KohyaModule]:
    if family in ("flux", "chroma"):
        return flux_modules(module_names)
    if family == "sd3":
        return sd3_modules(module_names)
    raise TrainError(f"no original-layout kohya names for family '{family}'")


def _swap_halves(up: torch.Tensor) -> torch.Tensor:
    import torch

    a, b = up.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def _split_rows(mod: KohyaModule, out_dim: int, in_dim: int) -> list[int]:
    n = len(mod.parts)
    if mod.split == "linear1":
        return [in_dim] * 3 + [out_dim - 3 * in_dim]
    if out_dim % n:
        raise TrainError(f"kohya module '{mod.name}' has {out_dim} output rows, not divisible into {n} parts")
    return [out_dim // n] * n


def _fuse(
    mod: KohyaModule, sd: Mapping[str, torch.Tensor], alpha: float, out_dims: Mapping[str, int]
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(down, up, alpha) of one kohya module from its parts' peft LoRAs (see the module docstring)."""
    import torch

    present = [p for p in mod.parts if f"{p}.lora_A.weight" in sd]
    downs = {p: sd[f"{p}.lora_A.weight"] for p in present}
    ups = {p: sd[f"{p}.lora_B.weight"] for p in present}
    if len(mod.parts) == 1:
        p = mod.parts[0]
        up = _swap_halves(ups[p]) if mod.swap else ups[p]
        return downs[p].contiguous(), up.contiguous(), alpha
    ranks = {p: downs[p].shape[0] for p in present}
    r0 = ranks[present[0]]
    scale = alpha / r0
    like = downs[present[0]]
    blocks_down, blocks_up = [], []
    for p in mod.parts:
        if p in present:
            d, u = downs[p], ups[p]
            if ranks[p] != r0:  # keep alpha/rank of this part under the one fused alpha
                u = u * ((alpha / ranks[p]) / scale)
        else:
            if p not in out_dims:
                raise TrainError(f"cannot fuse kohya module '{mod.name}': the output width of untrained '{p}' is unknown")
            d = torch.zeros((r0, *like.shape[1:]), dtype=like.dtype)
            u = torch.zeros((out_dims[p], r0, *ups[present[0]].shape[2:]), dtype=like.dtype)
        blocks_down.append(d)
        blocks_up.append(u)
    rank = sum(d.shape[0] for d in blocks_down)
    up = torch.zeros((sum(u.shape[0] for u in blocks_up), rank, *blocks_up[0].shape[2:]), dtype=like.dtype)
    row = col = 0
    for u in blocks_up:
        up[row : row + u.shape[0], col : col + u.shape[1]] = u
        row += u.shape[0]
        col += u.shape[1]
    return torch.cat(blocks_down, dim=0).contiguous(), up, scale * rank


def _text_encoder_module(module: str) -> str:
    # transformers 5 CLIPTextModel has no text_model level; kohya names keep it
    return module if module.startswith("text_model.") else "text_model." + module


def to_kohya(
    layers: Mapping[str, Mapping[str, torch.Tensor]],
    alphas: Mapping[str, float],
    n_text_encoders: int,
    *,
    family: str = "",
    out_dims: Mapping[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """Diffusers-format LoRA state dicts (per component) -> one kohya-format state dict.

    ``family`` ``sd3`` / ``flux`` / ``chroma`` writes the transformer under the original model's names (fusing
    split layers); ``out_dims`` (transformer module -> output width) sizes the zero blocks of fused
    parts that were not trained. Other families keep diffusers module names (``lora_unet_…``).
    """
    import torch

    out: dict[str, torch.Tensor] = {}
    for comp, sd in layers.items():
        for key in sd:
            if not key.endswith((".lora_A.weight", ".lora_B.weight")):
                raise TrainError(f"unexpected LoRA key '{key}' in component '{comp}'")
        prefix = kohya_prefix(comp, n_text_encoders)
        if comp == "transformer" and family in ORIGINAL_LAYOUT_FAMILIES:
            trained = {k[: -len(".lora_A.weight")] for k in sd if k.endswith(".lora_A.weight")}
            names = set(out_dims or ()) | trained
            covered: set[str] = set()
            for mod in original_modules(family, names):
                if not trained.intersection(mod.parts):
                    continue
                down, up, alpha = _fuse(mod, sd, float(alphas[comp]), out_dims or {})
                base = f"{prefix}_{mod.name}"
                out[f"{base}.lora_down.weight"] = down
                out[f"{base}.lora_up.weight"] = up
                out[f"{base}.alpha"] = torch.tensor(alpha)
                covered.update(mod.parts)
            missing = sorted(trained - covered)
            if missing:
                raise TrainError(f"no kohya ({family}) name for LoRA module(s) {', '.join(missing)}", key="lora.target_modules")
            continue
        for key, value in sd.items():
            part, new = (".lora_A.weight", "lora_down.weight") if key.endswith(".lora_A.weight") else (".lora_B.weight", "lora_up.weight")
            module = key[: -len(part)]
            if comp.startswith("text_encoder"):
                module = _text_encoder_module(module)
            base = f"{prefix}_{module.replace('.', '_')}"
            out[f"{base}.{new}"] = value.contiguous()
            out[f"{base}.alpha"] = torch.tensor(float(alphas[comp]))
    return out


def _unfuse(
    mod: KohyaModule, down: torch.Tensor, up: torch.Tensor, alpha: float
) -> list[tuple[str, torch.Tensor, torch.Tensor, float]]:
    """(part, down, up, alpha) of a kohya module; the inverse of :func:`_fuse`.

    A uniformly block-diagonal ``up`` splits into the parts' own LoRAs (rank / n each, and parts
    whose down and up blocks are all zero are dropped); any other fused LoRA gives every part the
    whole down and its rows of up (the same product, at the fused rank).
    """
    import torch

    rank = down.shape[0]
    if mod.swap:
        up = _swap_halves(up)
    if len(mod.parts) == 1:
        return [(mod.parts[0], down, up, alpha)]
    rows = _split_rows(mod, up.shape[0], down.shape[1])
    n = len(mod.parts)
    starts = [sum(rows[:j]) for j in range(n)]
    if rank % n == 0:
        r = rank // n
        mask = torch.ones(up.shape[:2], dtype=torch.bool)
        for j in range(n):
            mask[starts[j] : starts[j] + rows[j], j * r : (j + 1) * r] = False
        magnitude = up.reshape(up.shape[0], up.shape[1], -1).abs().amax(dim=2)
        if not magnitude[mask].any():
            parts = []
            for j, p in enumerate(mod.parts):
                d = down[j * r : (j + 1) * r]
                u = up[starts[j] : starts[j] + rows[j], j * r : (j + 1) * r]
                if d.any() or u.any():
                    parts.append((p, d.contiguous(), u.contiguous(), alpha * r / rank))
            return parts
    return [(p, down, up[starts[j] : starts[j] + rows[j]].contiguous(), alpha) for j, p in enumerate(mod.parts)]


def _modules_of(
    state: Mapping[str, torch.Tensor],
) -> dict[str, dict[str, torch.Tensor]]:
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        base, _, kind = key.partition(".")
        if kind not in ("alpha", "lora_down.weight", "lora_up.weight"):
            raise TrainError(f"unexpected kohya key '{key}'")
        grouped.setdefault(base, {})[kind] = value
    for base, parts in grouped.items():
        if "lora_down.weight" not in parts or "lora_up.weight" not in parts:
            raise TrainError(f"kohya module '{base}' lacks its lora_down or lora_up weight")
    return grouped


def _kohya_modules(
    state: Mapping[str, torch.Tensor], module_names: Mapping[str, Iterable[str]], n_text_encoders: int, family: str
) -> dict[str, list[tuple[str, torch.Tensor, torch.Tensor, float]]]:
    """Component -> (diffusers module, down, up, alpha) for every kohya module of ``state``."""
    names = {c: list(v) for c, v in module_names.items()}
    prefixes = {kohya_prefix(c, n_text_encoders): c for c in names}
    if "transformer" in names:
        prefixes.setdefault(_LEGACY_TRANSFORMER_PREFIX, "transformer")
    ordered = sorted(prefixes.items(), key=lambda kv: -len(kv[0]))
    lookup: dict[str, dict[str, str]] = {}
    for c, ms in names.items():
        table = lookup.setdefault(c, {})
        for m in ms:
            table[m.replace(".", "_")] = m
            if c.startswith("text_encoder"):
                table.setdefault(_text_encoder_module(m).replace(".", "_"), m)
    original: dict[str, KohyaModule] = {}
    if family in ORIGINAL_LAYOUT_FAMILIES and "transformer" in names:
        original = {m.name: m for m in original_modules(family, names["transformer"])}
    out: dict[str, list[tuple[str, torch.Tensor, torch.Tensor, float]]] = {}
    for base, parts in _modules_of(state).items():
        hit = next(((p, c) for p, c in ordered if base.startswith(p + "_")), None)
        if hit is None:
            raise TrainError(f"kohya key '{base}' has no known prefix ({', '.join(prefixes)})")
        prefix, comp = hit
        flat = base[len(prefix) + 1 :]
        down, up = parts["lora_down.weight"], parts["lora_up.weight"]
        alpha = float(parts["alpha"]) if "alpha" in parts else float(down.shape[0])
        if comp == "transformer" and prefix != _LEGACY_TRANSFORMER_PREFIX and original:
            mod = original.get(flat)
            if mod is None:
                raise TrainError(f"kohya key '{base}' names no module of the {family} transformer")
            out.setdefault(comp, []).extend(_unfuse(mod, down, up, alpha))
            continue
        module = lookup[comp].get(flat)
        if module is None:
            raise TrainError(f"kohya key '{base}' names no module of {comp}")
        out.setdefault(comp, []).append((module, down, up, alpha))
    return out


def kohya_to_diffusers(
    state: Mapping[str, torch.Tensor], module_names: Mapping[str, Iterable[str]], n_text_encoders: int, *, family: str = ""
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, float]]:
    """Inverse of :func:`to_kohya`: per-component peft-format state dicts and alphas.

    ``module_names`` maps each component to its module names (``unet.named_modules()`` names), which
    resolves the ``_`` / ``.`` ambiguity of kohya keys; ``family`` ``sd3`` / ``flux`` / ``chroma`` reads the
    original-layout transformer names (splitting fused modules). One alpha per component is
    returned (the commonest); a module whose ``alpha / rank`` differs from ``that alpha / its rank``
    (as peft would scale it) has the ratio folded into its ``lora_B``, so the product is kept.
    """
    from collections import Counter

    layers: dict[str, dict[str, torch.Tensor]] = {}
    alphas: dict[str, float] = {}
    for comp, mods in _kohya_modules(state, module_names, n_text_encoders, family).items():
        alpha = Counter(a for _, _, _, a in mods).most_common(1)[0][0]
        alphas[comp] = alpha
        sd = layers.setdefault(comp, {})
        for module, down, up, a in mods:
            if a != alpha:
                up = up * (a / alpha)
            sd[f"{module}.lora_A.weight"] = down
            sd[f"{module}.lora_B.weight"] = up
    return layers, alphas


def kohya_to_pipeline_state(
    state: Mapping[str, torch.Tensor], module_names: Mapping[str, Iterable[str]], n_text_encoders: int, *, family: str = ""
) -> dict[str, torch.Tensor]:
    """A kohya state dict as ``pipe.load_lora_weights`` takes it: ``<component>.<module>.lora_A.weight``.

    The ``alpha / rank`` scale is folded into ``lora_A`` (as diffusers' own kohya converters do),
    so the result loads at scale 1 in every pipeline.
    """
    out: dict[str, torch.Tensor] = {}
    for comp, mods in _kohya_modules(state, module_names, n_text_encoders, family).items():
        for module, down, up, alpha in mods:
            scale = alpha / down.shape[0]
            out[f"{comp}.{module}.lora_A.weight"] = down * scale if scale != 1.0 else down
            out[f"{comp}.{module}.lora_B.weight"] = up
    return out


#: sd-scripts' network module per family (``ss_network_module``).
_NETWORK_MODULE = {"flux": "networks.lora_flux", "chroma": "networks.lora_flux", "sd3": "networks.lora_sd3"}


def _out_dims(model: torch.nn.Module) -> dict[str, int]:
    """Module name -> output width of every Linear / Conv2d of a (peft-wrapped) model."""
    import torch

    dims: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and ".lora_" not in f".{name}" and "base_layer" not in name:
            dims[name] = int(module.weight.shape[0])
        elif hasattr(module, "get_base_layer") and isinstance(module.get_base_layer(), (torch.nn.Linear, torch.nn.Conv2d)):
            dims[name] = int(module.get_base_layer().weight.shape[0])
    return dims


def save_kohya_lora(
    models: Mapping[str, torch.nn.Module],
    path: str | os.PathLike[str],
    *,
    n_text_encoders: int,
    profile: AlignmentProfile,
    extra: JSONObject,
    base_model: str = "",
    family: str = "",
) -> Path:
    """Write the kohya/ComfyUI-format file with ss_* network keys and te_align metadata.

    ``family`` ``sd3`` / ``flux`` / ``chroma`` writes the layout of sd-scripts' ``networks/lora_sd3.py`` /
    ``networks/lora_flux.py`` (original module names, fused ``qkv`` / ``linear1``).
    """
    from safetensors.torch import save

    layers = lora_state_dicts(models)
    alphas = {c: float(m.peft_config["default"].lora_alpha) for c, m in models.items()}
    ranks = {c: int(m.peft_config["default"].r) for c, m in models.items()}
    out_dims = _out_dims(models["transformer"]) if family in ORIGINAL_LAYOUT_FAMILIES and "transformer" in models else None
    state = to_kohya(layers, alphas, n_text_encoders, family=family, out_dims=out_dims)
    first = next(iter(models))
    meta = {
        "ss_network_module": _NETWORK_MODULE.get(family, "networks.lora"),
        "ss_network_dim": str(ranks[first]),
        "ss_network_alpha": str(alphas[first]),
        "ss_sd_model_name": base_model,
        "ss_training_comment": "trained with te-align",
    }
    meta.update(stamp_keys(profile, extra))
    return write_atomic(path, save(state, metadata=meta))


__all__ = [
    "KohyaModule",
    "flux_modules",
    "kohya_prefix",
    "kohya_to_diffusers",
    "kohya_to_pipeline_state",
    "lora_state_dicts",
    "original_modules",
    "save_diffusers_lora",
    "save_kohya_lora",
    "sd3_modules",
    "to_kohya",
]
