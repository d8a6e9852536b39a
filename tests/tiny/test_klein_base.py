"""The klein-shaped world base's parts (te_align.tiny.klein, issue 49): te-align's encoding by the fitted
flux2-klein-4b profile equals Flux2KleinPipeline's own encode_prompt on them, the taps the design rests on, the
autoencoder carried over from the shared one, and the base loaded from a world data root (te_align.tiny.bases)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from te_align.tiny.pipelines import missing_pipeline  # noqa: E402

_REASON = missing_pipeline("flux2-klein")  # diffusers < 0.37 (the trainers' old environments) has no klein classes
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)

import diffusers  # noqa: E402

import te_align  # noqa: E402
from te_align.tiny import bases, klein  # noqa: E402

PROMPTS = ["a red square at the top left", "", "Cyan circle alone, " * 40, "far " * 600]


@pytest.fixture(scope="module")
def pipe():
    return klein.build_klein_pipeline()


def test_encoding_equals_the_pipelines_own(pipe) -> None:
    p = klein.klein_profile(pipe)
    q = p.slots[0]
    assert (q.encoder.num_layers, q.encoder.hidden_size, tuple(q.encoder.layer)) == (31, 32, (9, 18, 27))
    assert (q.tokenizer.max_length, q.tokenizer.enable_thinking, q.tokenizer.padding_side) == (512, False, "right")
    with torch.no_grad():
        embeds, ids = pipe.encode_prompt(PROMPTS, device="cpu")
    ours = te_align.encode(p, PROMPTS, pipeline=pipe)
    assert ours["prompt_embeds"].shape == embeds.shape == (4, 512, 96)
    assert torch.equal(ours["prompt_embeds"], embeds) and torch.equal(ours["text_ids"], ids)


def test_the_deviating_taps_are_other_inner_layers(pipe) -> None:
    """31 layers: hidden_states has 32 entries, the last is the final-normed output, so tap 30 is a raw inner state
    as in the real 36-layer Qwen3; the training script's (10, 20, 30) encode as the pipeline called with them, and
    each third of the width differs from the official tap's."""
    tok = pipe.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "a red square"}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    with torch.no_grad():
        out = pipe.text_encoder.model(**tok(text, return_tensors="pt"), output_hidden_states=True)
    assert len(out.hidden_states) == 32 and torch.equal(out.hidden_states[31], out.last_hidden_state)
    assert not torch.equal(out.hidden_states[30], out.last_hidden_state)
    p = klein.klein_profile(pipe)
    dev = p.with_overrides({"qwen3.layer": [10, 20, 30]})
    with torch.no_grad():
        ref, _ = pipe.encode_prompt(PROMPTS[:2], device="cpu", text_encoder_out_layers=(10, 20, 30))
    ours = te_align.encode(dev, PROMPTS[:2], pipeline=pipe)["prompt_embeds"]
    official = te_align.encode(p, PROMPTS[:2], pipeline=pipe)["prompt_embeds"]
    assert torch.equal(ours, ref)
    for k in range(3):
        assert not torch.equal(ours[..., 32 * k : 32 * (k + 1)], official[..., 32 * k : 32 * (k + 1)])


def test_the_shared_autoencoder_carries_over_with_its_latent_statistics() -> None:
    shared = diffusers.AutoencoderKL(
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[16, 32],
        layers_per_block=1, latent_channels=8, norm_num_groups=8, sample_size=32, use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()
    vae = klein.klein_vae(shared)
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        assert torch.equal(vae.encode(images).latent_dist.mode(), shared.encode(images).latent_dist.mode())
        z = shared.encode(images).latent_dist.mode()
        assert torch.equal(vae.decode(z).sample, shared.decode(z).sample)
    klein.set_latent_statistics(vae, images)
    patched = diffusers.Flux2KleinPipeline._patchify_latents(z)
    assert vae.bn.running_mean.shape == (32,)
    assert torch.allclose(vae.bn.running_mean, patched.mean(dim=(0, 2, 3)))
    assert torch.allclose(vae.bn.running_var, patched.var(dim=(0, 2, 3), unbiased=False))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_klein_base_in_a_world_root_loads_as_flux2kleinpipeline(pipe, tmp_path: Path) -> None:
    """A world data root holding a klein base (random weights, written here as tools/ship_base.py lays bases out):
    bases.load gives the official Flux2KleinPipeline with the shared autoencoder as an AutoencoderKLFlux2 carrying the
    recorded latent statistics, and its encoding equals te_align.encode by the base's own profile."""
    root = tmp_path / "world"
    shared_vae = diffusers.AutoencoderKL(
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[16, 32],
        layers_per_block=1, latent_channels=8, norm_num_groups=8, sample_size=32, use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()
    shared_vae.save_pretrained(str(root / "vae"))
    pipe.text_encoder.save_pretrained(str(root / "encoders" / "qwen3_klein"))
    pipe.transformer.save_pretrained(str(root / "klein" / "transformer"))
    pipe.scheduler.save_pretrained(str(root / "klein" / "scheduler"))
    files = {p.relative_to(root).as_posix(): _sha(p) for p in sorted(root.rglob("*")) if p.is_file()}
    bn = {"mean": [0.5] * 32, "var": [2.0] * 32}
    overrides = {k: v for k, v in klein.klein_profile(pipe).behaviour().items()
                 if k.endswith(("hidden_size", "num_layers", "vocab_size", "max_position_embeddings"))}
    info = {"format": bases.FORMAT, "name": "klein", "profile": "flux2-klein-4b", "denoiser_class": "Flux2Transformer2DModel",
            "files": files, "pretrain": {"vae_bn": bn}, "profile_overrides": {**overrides, "slots.qwen3.encoder.dtype": "float32"},
            "sampling": {"num_inference_steps": 2, "guidance_scale": 4.0, "height": 32, "width": 32}}  # fmt: skip
    (root / "klein" / "base.json").write_text(json.dumps(info), encoding="utf-8")
    assert bases.shipped(root) == ["klein"]
    loaded = bases.load("klein", cache_dir=tmp_path / "cache", source=root)
    assert type(loaded).__name__ == "Flux2KleinPipeline" and type(loaded.vae).__name__ == "AutoencoderKLFlux2"
    assert torch.equal(loaded.vae.bn.running_mean, torch.full((32,), 0.5))
    assert torch.equal(loaded.vae.bn.running_var, torch.full((32,), 2.0))
    profile = bases.base_profile("klein", root)
    with torch.no_grad():
        embeds, _ = loaded.encode_prompt(PROMPTS[:2], device="cpu")
    assert torch.equal(te_align.encode(profile, PROMPTS[:2], pipeline=loaded)["prompt_embeds"], embeds)
    # a plain call with the prompt first samples at the base's settings, though Flux2KleinPipeline takes `image` first
    image = loaded("a red square", generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (32, 32)
    same = loaded(prompt="a red square", generator=torch.Generator().manual_seed(0)).images[0]
    assert list(image.getdata()) == list(same.getdata())


@pytest.mark.parametrize(("override", "thinking", "raw", "side"), [
    ({"qwen3.enable_thinking": True}, True, False, "right"),  # enable_thinking flipped (Z-Image's value)
    ({"qwen3.template": "{prompt}"}, False, True, "right"),  # the chat template dropped: the caption alone
    ({"qwen3.padding_side": "left"}, False, False, "left"),  # padded on the other side
])  # fmt: skip
def test_the_rows_arm_a_encodings_are_profile_overrides(pipe, override, thinking, raw, side) -> None:
    """Each deviation the plan names is one profile override, and te_align.encode by it equals the pipeline's own
    steps done by hand the deviating way (template rendered with the flag or not at all, padding side, same taps)."""
    tok = pipe.tokenizer
    caption = "a red square at the top left"
    text = caption if raw else tok.apply_chat_template([{"role": "user", "content": caption}], tokenize=False,
                                                       add_generation_prompt=True, enable_thinking=thinking)
    assert ("<think>" in text) == (not thinking and not raw)
    tok.padding_side = side
    try:
        batch = tok([text], padding="max_length", truncation=True, max_length=512, return_tensors="pt")
    finally:
        tok.padding_side = "right"
    with torch.no_grad():
        out = pipe.text_encoder(**batch, output_hidden_states=True, use_cache=False)
    by_hand = torch.stack([out.hidden_states[k] for k in (9, 18, 27)], dim=1).permute(0, 2, 1, 3).reshape(1, 512, 96)
    p = klein.klein_profile(pipe)
    ours = te_align.encode(p.with_overrides(override), [caption], pipeline=pipe)["prompt_embeds"]
    assert torch.equal(ours, by_hand)
    assert not torch.equal(ours, te_align.encode(p, [caption], pipeline=pipe)["prompt_embeds"])
