"""Kohya-format export for SD3 / Flux in sd-scripts' own layout, and single-file checkpoint loading.

The kohya files are checked by loading them into the diffusers pipeline (diffusers' own kohya Flux
converter where it can read the file, te-align's reader otherwise) and comparing the pipeline's
output with the diffusers-format file's. The fused modules are exact in math (block-diagonal up,
stacked down); the outputs agree to float rounding only because a fused module's alpha / rank is
folded into the weights by the readers instead of scaling the LoRA output (exact for the
power-of-two scales used here, so the tolerance is tight).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from te_align.train import train
from te_align.train.export import (
    flux_modules,
    kohya_to_diffusers,
    kohya_to_pipeline_state,
    sd3_modules,
    to_kohya,
)
from tests.train.test_train import PIPELINES, _pipeline, make_config

FLUX_DOUBLE = [f"transformer_blocks.0.{m}" for m in (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
    "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear",
    "norm1_context.linear")]  # fmt: skip
FLUX_GLOBAL = ["x_embedder", "context_embedder", "norm_out.linear", "time_text_embed.timestep_embedder.linear_1",
               "time_text_embed.guidance_embedder.linear_2", "time_text_embed.text_embedder.linear_1"]  # fmt: skip


@pytest.fixture(scope="module")
def models(tiny_model_folder: Callable[[str], Path]) -> dict[str, Path]:
    return {f: tiny_model_folder(f) for f in ("sd15", "sd3", "flux")}


@pytest.fixture(scope="module")
def dataset(squares_dataset: Path) -> Path:
    return squares_dataset


def _latents(pipe: Any) -> np.ndarray:
    out = pipe("a red square", num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="latent",
               height=32, width=32).images  # fmt: skip
    return out.float().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)


def _with_lora(family: str, folder: Path, lora: Any) -> np.ndarray:
    pipe = _pipeline(family, folder)
    pipe.load_lora_weights(lora)
    return _latents(pipe)


def _assert_same_output(a: np.ndarray, b: np.ndarray, base: np.ndarray) -> None:
    assert np.abs(a - base).max() > 1e-3  # the LoRA does something
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * max(1.0, float(np.abs(b).max())))


def _bases(kohya: dict[str, torch.Tensor]) -> set[str]:
    return {k.split(".", 1)[0] for k in kohya}


def _train(family: str, models: dict[str, Path], dataset: Path, out: Path, **lora: Any) -> Any:
    cfg = make_config(family, models[family], dataset, out, train={"max_steps": 2, "learning_rate": 1e-2},
                      lora={"rank": 4, "alpha": 8.0, **lora})  # fmt: skip
    result = train(cfg)
    from te_align.metadata import read

    assert read(result.kohya_path)["te_align"]["te_align.profile"] == read(result.lora_path)["te_align"]["te_align.profile"]
    return result


# ---------------------------------------------------------------------------------------------- flux
def test_flux_kohya_file_loads_with_diffusers_own_converter(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    # double blocks only: diffusers' converter splits single-block linear1 at full-size Flux widths, and writes
    # embedder / final-layer keys without the "transformer." prefix, so those go through te-align's reader below
    result = _train("flux", models, dataset, tmp_path / "o", target_modules=FLUX_DOUBLE)
    kohya = load_file(str(result.kohya_path))
    assert _bases(kohya) == {f"lora_unet_double_blocks_0_{n}" for n in (
        "img_attn_qkv", "img_attn_proj", "img_mlp_0", "img_mlp_2", "img_mod_lin", "txt_attn_qkv", "txt_attn_proj",
        "txt_mlp_0", "txt_mlp_2", "txt_mod_lin")}  # fmt: skip
    assert kohya["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"].shape == (12, 16)
    assert kohya["lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"].shape == (48, 12)
    assert float(kohya["lora_unet_double_blocks_0_img_attn_qkv.alpha"]) == 24.0
    base = _latents(_pipeline("flux", models["flux"]))
    want = _with_lora("flux", models["flux"], str(result.lora_path))
    got = _with_lora("flux", models["flux"], str(result.kohya_path))  # diffusers' kohya Flux converter
    _assert_same_output(got, want, base)


def test_flux_kohya_export_with_single_blocks_round_trips(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    from te_align.train.models import FLUX_TARGETS

    # default targets (single blocks' q/k/v too) and the embedders / final layer
    result = _train("flux", models, dataset, tmp_path / "o", target_modules=FLUX_TARGETS + FLUX_GLOBAL)
    kohya = load_file(str(result.kohya_path))
    assert "lora_unet_single_blocks_0_linear1.lora_down.weight" in kohya
    # q, k, v trained, proj_mlp padded with a zero block: rank 4 x 4 parts, alpha 8 x 4
    assert kohya["lora_unet_single_blocks_0_linear1.lora_up.weight"].shape == (3 * 16 + 64, 16)
    assert float(kohya["lora_unet_single_blocks_0_linear1.alpha"]) == 32.0
    assert not any(k.startswith("lora_transformer") for k in kohya)
    assert {"lora_unet_img_in", "lora_unet_txt_in", "lora_unet_final_layer_adaLN_modulation_1", "lora_unet_time_in_in_layer",
            "lora_unet_guidance_in_out_layer", "lora_unet_vector_in_in_layer"} <= _bases(kohya)  # fmt: skip
    pipe = _pipeline("flux", models["flux"])
    names = {"transformer": [n for n, _ in pipe.transformer.named_modules()]}
    layers, alphas = kohya_to_diffusers(kohya, names, 2, family="flux")
    assert alphas == {"transformer": 8.0}
    diff = {k.removeprefix("transformer."): v for k, v in load_file(str(result.lora_path)).items()}
    assert set(layers["transformer"]) == set(diff)
    for k, v in diff.items():
        assert torch.equal(layers["transformer"][k], v), k
    # diffusers' Flux converter splits linear1 with full-size Flux widths, so the tiny model goes through te-align's reader
    base = _latents(pipe)
    want = _with_lora("flux", models["flux"], str(result.lora_path))
    got = _with_lora("flux", models["flux"], kohya_to_pipeline_state(kohya, names, 2, family="flux"))
    _assert_same_output(got, want, base)


def test_flux_fusion_matches_diffusers_converter_at_full_size() -> None:
    from diffusers.loaders.lora_conversion_utils import _convert_kohya_flux_lora_to_diffusers

    gen = torch.Generator().manual_seed(0)
    h, mlp, r = 3072, 12288, 2
    names = [f"single_transformer_blocks.0.{m}" for m in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out", "norm.linear")]
    names += [f"transformer_blocks.0.attn.{m}" for m in ("to_q", "to_k", "to_v")] + ["norm_out.linear"]
    out_dims = dict.fromkeys(names, h) | {"single_transformer_blocks.0.proj_mlp": mlp, "norm_out.linear": 2 * h}
    trained = [n for n in names if not n.endswith("proj_mlp")]
    sd = {}
    for n in trained:
        sd[f"{n}.lora_A.weight"] = torch.randn(r, h + (mlp if n.endswith("proj_out") else 0), generator=gen)
        sd[f"{n}.lora_B.weight"] = torch.randn(out_dims[n], r, generator=gen)
    kohya = to_kohya({"transformer": sd}, {"transformer": 2.0 * r}, 2, family="flux", out_dims=out_dims)
    assert _bases(kohya) == {"lora_unet_single_blocks_0_linear1", "lora_unet_single_blocks_0_linear2",
                             "lora_unet_single_blocks_0_modulation_lin", "lora_unet_double_blocks_0_img_attn_qkv",
                             "lora_unet_final_layer_adaLN_modulation_1"}  # fmt: skip
    conv = _convert_kohya_flux_lora_to_diffusers(dict(kohya))
    # final layer: diffusers swaps the (shift, scale) halves back and applies no alpha there (and drops the prefix)
    assert torch.equal(conv["norm_out.linear.lora_B.weight"], sd["norm_out.linear.lora_B.weight"])
    assert torch.equal(conv["norm_out.linear.lora_A.weight"], sd["norm_out.linear.lora_A.weight"])
    for n in trained:
        if n == "norm_out.linear":
            continue
        down, up = conv[f"transformer.{n}.lora_A.weight"], conv[f"transformer.{n}.lora_B.weight"]
        assert down.shape == (r, sd[f"{n}.lora_A.weight"].shape[1]), n
        torch.testing.assert_close(up @ down, 2.0 * sd[f"{n}.lora_B.weight"] @ sd[f"{n}.lora_A.weight"], rtol=1e-6, atol=1e-5)
    assert not conv["transformer.single_transformer_blocks.0.proj_mlp.lora_B.weight"].any()


# ----------------------------------------------------------------------------------------------- sd3
def test_sd3_kohya_export_in_sd_scripts_layout(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    from te_align.train.models import SD3_TARGETS

    extra = ["norm1_context.linear", "norm_out.linear", "pos_embed.proj", "ff.net.0.proj", "norm1.linear"]
    result = _train("sd3", models, dataset, tmp_path / "o", target_modules=SD3_TARGETS + extra)
    kohya = load_file(str(result.kohya_path))
    assert _bases(kohya) == {f"lora_unet_{n}" for n in (
        "joint_blocks_0_x_block_attn_qkv", "joint_blocks_0_x_block_attn_proj", "joint_blocks_0_context_block_attn_qkv",
        "joint_blocks_0_x_block_mlp_fc1", "joint_blocks_0_x_block_adaLN_modulation_1",
        "joint_blocks_0_context_block_adaLN_modulation_1", "final_layer_adaLN_modulation_1", "x_embedder_proj")}  # fmt: skip
    assert kohya["lora_unet_joint_blocks_0_context_block_attn_qkv.lora_up.weight"].shape == (48, 12)
    assert float(kohya["lora_unet_joint_blocks_0_context_block_attn_qkv.alpha"]) == 24.0
    # the last block's context modulation and the final layer are (shift, scale) in the original layout
    diff = {k.removeprefix("transformer."): v for k, v in load_file(str(result.lora_path)).items()}
    up = diff["transformer_blocks.0.norm1_context.linear.lora_B.weight"]
    assert torch.equal(kohya["lora_unet_joint_blocks_0_context_block_adaLN_modulation_1.lora_up.weight"],
                       torch.cat([up[16:], up[:16]]))  # fmt: skip
    pipe = _pipeline("sd3", models["sd3"])
    names = {"transformer": [n for n, _ in pipe.transformer.named_modules()]}
    layers, alphas = kohya_to_diffusers(kohya, names, 3, family="sd3")
    assert alphas == {"transformer": 8.0}
    assert set(layers["transformer"]) == set(diff)
    for k, v in diff.items():
        assert torch.equal(layers["transformer"][k], v), k
    # diffusers has no reader for sd-scripts' SD3 layout: load through te-align's
    base = _latents(pipe)
    want = _with_lora("sd3", models["sd3"], str(result.lora_path))
    got = _with_lora("sd3", models["sd3"], kohya_to_pipeline_state(kohya, names, 3, family="sd3"))
    _assert_same_output(got, want, base)


def test_reader_splits_a_dense_fused_module_and_keeps_legacy_names() -> None:
    gen = torch.Generator().manual_seed(1)
    names = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_v",
             "transformer_blocks.0.attn.to_out.0"]  # fmt: skip
    assert [m.name for m in sd3_modules(names)] == ["joint_blocks_0_x_block_attn_qkv", "joint_blocks_0_x_block_attn_proj"]
    assert [m.name for m in flux_modules(names)] == ["double_blocks_0_img_attn_qkv", "double_blocks_0_img_attn_proj"]
    down, up = torch.randn(5, 16, generator=gen), torch.randn(48, 5, generator=gen)  # not block-diagonal
    state = {"lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight": down,
             "lora_unet_joint_blocks_0_x_block_attn_qkv.lora_up.weight": up,
             "lora_unet_joint_blocks_0_x_block_attn_qkv.alpha": torch.tensor(10.0),
             "lora_transformer_transformer_blocks_0_attn_to_out_0.lora_down.weight": down[:2],
             "lora_transformer_transformer_blocks_0_attn_to_out_0.lora_up.weight": up[:16, :2],
             "lora_transformer_transformer_blocks_0_attn_to_out_0.alpha": torch.tensor(4.0)}  # fmt: skip
    flat = kohya_to_pipeline_state(state, {"transformer": names}, 3, family="sd3")
    for j, part in enumerate(("to_q", "to_k", "to_v")):
        a, b = flat[f"transformer.transformer_blocks.0.attn.{part}.lora_A.weight"], flat[f"transformer.transformer_blocks.0.attn.{part}.lora_B.weight"]
        torch.testing.assert_close(b @ a, 2.0 * up[16 * j : 16 * (j + 1)] @ down)
    torch.testing.assert_close(flat["transformer.transformer_blocks.0.attn.to_out.0.lora_A.weight"], 2.0 * down[:2])


# --------------------------------------------------------------------------------------- single file
_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1", "norm2": "out_layers.0",
           "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}  # fmt: skip


def ldm_unet_state(unet: Any) -> dict[str, torch.Tensor]:
    """A diffusers UNet's weights in the original (LDM / A1111) single-file layout, ``model.diffusion_model.*``."""
    lpb = unet.config.layers_per_block
    out: dict[str, str] = {}

    def block(new: str, rest: list[str], resnet: bool) -> str:
        tail = ".".join(rest)
        if resnet:
            head, _, tail = tail.partition(".")
            tail = f"{_RESNET[head]}.{tail}"
        return f"{new}.{tail}"

    for k in unet.state_dict():
        p = k.split(".")
        if p[0] == "time_embedding":
            new = f"time_embed.{ {'linear_1': 0, 'linear_2': 2}[p[1]] }.{p[2]}"
        elif p[0] in ("conv_in", "conv_norm_out", "conv_out"):
            new = {"conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}[p[0]] + f".{p[1]}"
        elif p[0] == "down_blocks":
            i, kind = int(p[1]), p[2]
            if kind == "downsamplers":
                new = f"input_blocks.{1 + i * (lpb + 1) + lpb}.0.op.{p[-1]}"
            else:
                new = block(f"input_blocks.{1 + i * (lpb + 1) + int(p[3])}.{0 if kind == 'resnets' else 1}", p[4:], kind == "resnets")
        elif p[0] == "up_blocks":
            i, kind = int(p[1]), p[2]
            if kind == "upsamplers":
                slot = 2 if hasattr(unet.up_blocks[i], "attentions") else 1
                new = f"output_blocks.{i * (lpb + 1) + lpb}.{slot}.conv.{p[-1]}"
            else:
                new = block(f"output_blocks.{i * (lpb + 1) + int(p[3])}.{0 if kind == 'resnets' else 1}", p[4:], kind == "resnets")
        elif p[0] == "mid_block":
            index = 1 if p[1] == "attentions" else (0 if p[2] == "0" else 2)
            new = block(f"middle_block.{index}", p[3:], p[1] == "resnets")
        else:
            raise KeyError(k)
        out[k] = f"model.diffusion_model.{new}"
    sd = unet.state_dict()
    return {new: sd[k].contiguous() for k, new in out.items()}


def test_single_file_checkpoint_with_model_config(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    import te_align
    from te_align.train.models import load_pipeline

    source = _pipeline("sd15", models["sd15"])
    ckpt = tmp_path / "tiny-sd15-unet.safetensors"
    save_file(ldm_unet_state(source.unet), str(ckpt))
    cfg = make_config("sd15", ckpt, dataset, tmp_path / "o")
    cfg.model.config = str(models["sd15"])
    profile = te_align.profile("sd15").with_overrides(cfg.model.profile_overrides)
    pipe = load_pipeline(cfg.model, profile)
    assert type(pipe).__name__ == PIPELINES["sd15"]
    want, got = source.unet.state_dict(), pipe.unet.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    assert train(cfg).steps == 3  # and the trainer runs from it
