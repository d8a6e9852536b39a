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


def test_vae_scaling_factors_normalise_latents(runs):
    first, _, _ = runs
    lat = first.state["latents"]
    assert abs(float(lat.mean())) < 1e-4 and abs(float(lat.std()) - 1.0) < 1e-3
    assert lat.shape == (TINY.train_size, 4, 16, 16)


def test_vae_callback_runs_periodically_and_leaves_the_weights_unchanged(runs):
    first, _, _ = runs
    train = first.state["train"]
    seen = []

    def probe(step, vae):
        seen.append(
            (step, torch.is_grad_enabled(), pretrain.vae_roundtrip_accuracy(vae, train[:2])["images"])
        )
        torch.randn(3)  # a callback that draws from the global RNG must not change training

    vae = pretrain.train_vae(TINY, [s.image for s in train], callback=probe, callback_every=2)
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
