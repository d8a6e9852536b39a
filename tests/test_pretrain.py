"""Pretraining the tiny SD3-shaped world model (te_align.tiny.pretrain) at a tiny size."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from te_align.tiny import pretrain  # noqa: E402

TINY = pretrain.PretrainConfig(
    seed=3, train_size=48, vae_channels=(8, 16), vae_steps=4, vae_batch=8, width=32, layers=1, steps=4, batch=8,
    warmup=2, encode_batch=48,
)  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("pretrained")
    first = pretrain.pretrain(TINY, folder)
    second = pretrain.pretrain(TINY)
    return first, second, folder


def _state(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_two_runs_give_identical_weights(runs):
    first, second, _ = runs
    for name in ("transformer", "vae"):
        a, b = _state(getattr(first.pipeline, name)), _state(getattr(second.pipeline, name))
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    # training moved the weights away from their initialisation
    init = pretrain.new_transformer(TINY, 96, 80)
    assert not torch.equal(
        init.state_dict()["proj_out.weight"], first.pipeline.transformer.state_dict()["proj_out.weight"]
    )
    assert [r["loss"] for r in first.log if r["phase"] == "transformer"] == [
        r["loss"] for r in second.log if r["phase"] == "transformer"
    ]


def _vae_images(cfg):
    """The autoencoder's training images: the whole world (the denoiser's data leaves the held-out concept out)."""
    from te_align.tiny import world

    return [s.image for s in world.make_dataset(cfg.train_size, cfg.seed, image_size=cfg.image_size, tokenizer=False)]


def test_vae_scaling_factors_normalise_latents(runs):
    first, _, _ = runs
    lat = pretrain.encode_latents(first.pipeline.vae, _vae_images(TINY))
    assert abs(float(lat.mean())) < 1e-4 and abs(float(lat.std()) - 1.0) < 1e-3
    assert first.state["latents"].shape == (TINY.train_size, 4, 16, 16)
    # the denoiser's data never shows the held-out concept (pink)
    assert all(o.colour != "pink" for s in first.state["train"] for o in s.scene.objects)


def test_vae_callback_runs_periodically_and_leaves_the_weights_unchanged(runs):
    first, _, _ = runs
    train = first.state["train"]
    seen = []

    def probe(step, vae):
        seen.append(
            (step, torch.is_grad_enabled(), pretrain.vae_roundtrip_accuracy(vae, train[:2])["images"])
        )
        torch.randn(3)  # a callback that draws from the global RNG must not change training

    vae = pretrain.train_vae(TINY, _vae_images(TINY), callback=probe, callback_every=2)
    assert seen == [(2, False, 2.0), (4, False, 2.0)]
    ref = _state(first.pipeline.vae)
    got = _state(vae)
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    assert vae.config.scaling_factor == first.pipeline.vae.config.scaling_factor


def test_resumed_training_equals_one_run(runs):
    first, _, _ = runs
    st = first.state
    a = pretrain.train_transformer(TINY, st["latents"], st["table"], st["dropout"], stop_step=2)
    b = pretrain.train_transformer(TINY, st["latents"], st["table"], st["dropout"], transformer=a["transformer"], ema=a["ema"],
                            optimizer_state=a["optimizer_state"], start_step=2)  # fmt: skip
    ref = _state(first.pipeline.transformer)
    got = _state(b["ema"])
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_slot_dropout_matches_te_align_encode_per_sample(runs):
    import te_align

    first, _, _ = runs
    st = first.state
    drop = st["dropout"]
    assert drop.rates == {"clip_l": 0.464, "clip_g": 0.464, "t5": 0.464}
    captions = [s.caption for s in st["train"][:6]]
    flags = {"clip_l": [True, False, True, False, True, False], "clip_g": [False, False, True, True, False, True],
             "t5": [True, True, True, False, False, False]}  # fmt: skip
    ref = te_align.encode(
        st["profile"], captions, tokenizers=st["components"], text_encoders=st["components"], drop_slots=flags
    )
    got = drop.apply(st["table"].rows(torch.arange(6)), {k: torch.tensor(v) for k, v in flags.items()})
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    # sd35: CLIP-L and CLIP-G fill the first 77 rows side by side (then zero padding), T5 the next 256
    reg = drop.regions
    assert reg["clip_l"]["prompt_embeds"][:77, :32].all() and not reg["clip_l"]["prompt_embeds"][:, 32:].any()
    assert reg["clip_g"]["prompt_embeds"][:77, 32:80].all() and not reg["clip_g"]["prompt_embeds"][77:].any()
    assert reg["t5"]["prompt_embeds"][77:].all() and not reg["t5"]["prompt_embeds"][:77].any()
    assert not reg["t5"]["pooled_prompt_embeds"].any()


def test_saved_folder_loads_into_the_official_pipeline_and_samples(runs):
    _, _, folder = runs
    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    assert type(pipe.transformer).__name__ == "SD3Transformer2DModel"
    assert pipe.vae.config.scaling_factor != 1.0
    sizes = pretrain.model_sizes(pipe)
    assert sizes["transformer"]["params"] < 200_000
    samples = pretrain.heldout_set(2, style="short")
    result = pretrain.evaluate_pipeline(pipe, samples, steps=2, guidance=2.0)
    images = result["images"]
    assert len(images) == 2 and images[0].shape == (32, 32, 3) and images[0].dtype == np.uint8
    assert result["all"]["objects"] == sum(len(s.scene.objects) for s in samples)
    again = pretrain.evaluate_pipeline(pipe, samples, steps=2, guidance=2.0)["images"]
    assert all(np.array_equal(x, y) for x, y in zip(images, again, strict=True))


# Recorded from the SD3-only code (commit c543786, before PretrainConfig.family existed) with torch 2.13.0+cpu on
# x86_64, one thread: the family refactor must leave the SD3 path's RNG consumption and weights bit-identical.
SD3_REFERENCE = pretrain.PretrainConfig(
    seed=5, train_size=24, vae_channels=(8, 16), vae_steps=3, vae_batch=4, width=32, layers=1, steps=3, batch=4,
    warmup=2, encode_batch=24,
)  # fmt: skip
SD3_REFERENCE_SHA256 = {
    "transformer": "1652c875643be5238565ac3e9be0a904ddc8b89dac50df4199cc3bc9e8dded52",  # the saved EMA
    "raw": "2d54cf26c2653e3b054cbf1a98b1632eed13394dcd15019efd016c96184e590c",  # the trained weights
    "vae": "0292b8cfa1dbc3512fe0bb1ea064f36062660ef05f10115ea7bfeabc16f0e135",
}


def _sha256(module) -> str:
    import hashlib

    digest = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        digest.update(k.encode())
        digest.update(v.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_sd3_weights_are_bit_identical_to_the_recorded_reference():
    if torch.__version__ != "2.13.0+cpu":
        pytest.skip(f"reference hashes recorded with torch 2.13.0+cpu; this is torch {torch.__version__}")
    torch.set_num_threads(1)
    res = pretrain.pretrain(SD3_REFERENCE)
    assert (res.pipeline.vae.config.shift_factor, res.pipeline.vae.config.scaling_factor) == (0.057931, 2.772855)
    assert res.pipeline.transformer.proj_out.weight.flatten()[:4].tolist() == [
        -0.0059388685040175915, -0.07670241594314575, -0.16618317365646362, 0.11762692034244537,
    ]  # fmt: skip
    got = {"transformer": _sha256(res.pipeline.transformer), "raw": _sha256(res.state["transformer"]),
           "vae": _sha256(res.pipeline.vae)}  # fmt: skip
    assert got == SD3_REFERENCE_SHA256
