"""Shipped world bases (te_align.tiny.bases): shipping (tools/ship_base.py), hash checks on every load, the
materialized diffusers folder, and the loader whose plain call samples at the base's settings."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))  # tools/ is not installed
import ship_base  # noqa: E402

from te_align.tiny import bases, world  # noqa: E402


def _shared(pipe: Any, family: str) -> dict[str, Any]:
    """A shared encoder set (CLIP-L and CLIP-G with projection, T5) that contains ``pipe``'s text encoders."""
    from te_align.tiny.encoders import family_components

    sd3 = family_components("sd3")
    if family == "sd3":
        return {"clip_l": pipe.text_encoder, "clip_g": pipe.text_encoder_2, "t5": pipe.text_encoder_3}
    clip_l = transformers.CLIPTextModelWithProjection(pipe.text_encoder.config)
    clip_l.text_model.load_state_dict({k.removeprefix("text_model."): v for k, v in pipe.text_encoder.state_dict().items()})
    return {"clip_l": clip_l.eval(), "clip_g": sd3["text_encoder_2"], "t5": pipe.text_encoder_2}


def _ship(tiny_model_folder: Any, tmp_path: Path, name: str) -> tuple[Any, Path]:
    family = {"sd3": "sd3", "flux": "flux-schnell"}[name]
    cls = diffusers.StableDiffusion3Pipeline if name == "sd3" else diffusers.FluxPipeline
    pipe = cls.from_pretrained(str(tiny_model_folder(family)))
    root = tmp_path / "world"
    ship_base.ship_pipeline(pipe, name, root, encoders=_shared(pipe, name), vae=pipe.vae, world="simple",
                            held_out="colour=pink", pretrain={"steps": 1})  # fmt: skip
    return pipe, root


def test_shipped_base_loads_as_the_official_pipeline_with_its_settings(tiny_model_folder: Any, tmp_path: Path) -> None:
    pipe, root = _ship(tiny_model_folder, tmp_path, "sd3")
    info = bases.base_info("sd3", root)
    assert (info["profile"], info["world"], info["held_out"], info["denoiser_class"]) == (
        "sd35-large", "simple", "colour=pink", "SD3Transformer2DModel")
    assert info["sampling"] == {"num_inference_steps": 16, "guidance_scale": 4.0, "height": 32, "width": 32}
    assert sorted({f.split("/")[0] for f in info["files"]}) == ["encoders", "sd3", "vae"]
    assert not (root / "sd3" / "tokenizer").exists() and info["profile_overrides"]
    loaded = bases.load("sd3", cache_dir=tmp_path / "cache", source=root)
    assert isinstance(loaded, diffusers.StableDiffusion3Pipeline) and type(loaded).__name__ == "StableDiffusion3Pipeline"
    assert loaded.call_defaults == info["sampling"]
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(loaded, name).state_dict()
        assert set(mine) == set(theirs)
        for k, v in mine.items():
            assert theirs[k].dtype == torch.float32 and torch.equal(theirs[k], v.half().float()), (name, k)
    assert loaded.tokenizer_3.model_max_length == pipe.tokenizer_3.model_max_length
    # the plain call samples at the base's size and settings, and equals the explicit call
    calls = []
    handle = loaded.transformer.register_forward_hook(lambda m, a, kw, out: calls.append(kw["hidden_states"].shape),
                                                      with_kwargs=True)  # fmt: skip
    img = loaded("a red circle at the top left", generator=torch.Generator().manual_seed(0), output_type="np").images[0]
    handle.remove()
    assert img.shape == (32, 32, 3) and len(calls) == 16 and calls[0][0] == 2  # 16 steps, CFG: cond + uncond
    explicit = diffusers.StableDiffusion3Pipeline.from_pretrained(str(tmp_path / "cache"))
    explicit.set_progress_bar_config(disable=True)
    ref = explicit("a red circle at the top left", num_inference_steps=16, guidance_scale=4.0, height=32, width=32,
                   generator=torch.Generator().manual_seed(0), output_type="np").images[0]  # fmt: skip
    assert (img == ref).all()
    # a saved copy names the official class
    loaded.save_pretrained(str(tmp_path / "copy"))
    assert json.loads((tmp_path / "copy" / "model_index.json").read_text())["_class_name"] == "StableDiffusion3Pipeline"
    # the world package's loader is this one
    assert world.base("sd3", cache_dir=tmp_path / "cache", source=root).call_defaults == info["sampling"]


def test_flux_base_plain_call_pads_t5_to_the_profile_length(tiny_model_folder: Any, tmp_path: Path) -> None:
    _, root = _ship(tiny_model_folder, tmp_path, "flux")
    loaded = bases.load("flux", cache_dir=tmp_path / "cache", source=root)
    assert isinstance(loaded, diffusers.FluxPipeline)
    seen = []
    handle = loaded.transformer.register_forward_hook(
        lambda m, a, kw, out: seen.append((kw["encoder_hidden_states"].shape, kw["hidden_states"].shape)), with_kwargs=True)
    img = loaded("a red circle", generator=torch.Generator().manual_seed(0), output_type="np").images[0]
    handle.remove()
    # flux-schnell's 256 T5 tokens (a plain FluxPipeline call pads to 512) and 32 px (a plain call renders 256 px);
    # true classifier-free guidance: each of the 16 steps runs the prompt and the empty negative
    assert img.shape == (32, 32, 3) and len(seen) == 32
    assert seen[0][0][1] == 256 and seen[0][1][1] == (32 // 2 // 2) ** 2


def test_altered_shipped_file_is_one_line_and_altered_cache_is_rebuilt(tiny_model_folder: Any, tmp_path: Path) -> None:
    _, root = _ship(tiny_model_folder, tmp_path, "sd3")
    cache = tmp_path / "cache"
    out = bases.materialize("sd3", cache_dir=cache, source=root)
    assert bases.materialize("sd3", cache_dir=cache, source=root) == out  # reused
    cached = out / "transformer" / "diffusion_pytorch_model.safetensors"
    data = bytearray(cached.read_bytes())
    data[-1] ^= 1
    cached.write_bytes(bytes(data))
    assert bases.materialize("sd3", cache_dir=cache, source=root) == out  # rebuilt from the shipped files
    assert cached.read_bytes() != bytes(data)
    shipped = root / "vae" / "diffusion_pytorch_model.safetensors"
    data = bytearray(shipped.read_bytes())
    data[-1] ^= 1
    shipped.write_bytes(bytes(data))
    with pytest.raises(bases.BaseError, match=r"SHA-256 .* differs from the recorded .*: the shipped file was altered; "
                                               r"reinstall te-align") as err:  # fmt: skip
        bases.load("sd3", cache_dir=tmp_path / "cache2", source=root)
    assert "\n" not in str(err.value) and str(shipped) in str(err.value)
    assert not (tmp_path / "cache2").exists()


def test_shipping_refuses_parts_that_are_not_the_shared_ones(tiny_model_folder: Any, tmp_path: Path) -> None:
    pipe, root = _ship(tiny_model_folder, tmp_path, "sd3")
    other = _shared(pipe, "sd3")
    other["t5"] = transformers.T5EncoderModel(pipe.text_encoder_3.config)
    with pytest.raises(SystemExit, match="text_encoder_3 differs from the shared t5 encoder"):
        ship_base.ship_pipeline(pipe, "sd3", root, encoders=other, vae=pipe.vae, world="simple", held_out="",
                                pretrain={})  # fmt: skip


def test_unshipped_or_unknown_base_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(bases.BaseError, match="the sdxl world base is not shipped"):
        bases.base_info("sdxl", tmp_path)
    with pytest.raises(bases.BaseError, match="the chroma world base is not shipped"):
        bases.load("chroma", source=tmp_path)  # a world data root without it
    with pytest.raises(bases.BaseError, match="no world base 'sd9'; known: sd3, flux, sdxl, sd15, chroma, klein"):
        bases.load("sd9")
