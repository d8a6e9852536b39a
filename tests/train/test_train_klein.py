"""``te-align train`` on FLUX.2 [klein] (issue 49): a tiny random klein world base (``tests/train/klein_world.py``)
trained with LoRA on the CPU, no network.

What the trainer hands ``Flux2Transformer2DModel`` in a training step is captured with a forward pre-hook on the real
model and compared, tensor for tensor, with what diffusers' own ``Flux2KleinPipeline`` steps give for the same image,
noise and time: ``_encode_vae_image`` (posterior mean, ``_patchify_latents``, BatchNorm statistics), ``prepare_latents``
(noise in the patchified shape, ``_pack_latents``, ``_prepare_latent_ids``) and ``encode_prompt`` (the stacked taps and
``_prepare_text_ids``). Samples by the profile equal the pipeline called with ``prompt=``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from te_align.tiny.pipelines import missing_pipeline  # noqa: E402

_REASON = missing_pipeline("flux2-klein")  # diffusers < 0.37 (the trainers' old environments) has no klein classes
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)

import diffusers  # noqa: E402
import numpy as np  # noqa: E402

from te_align.tiny import bases  # noqa: E402
from te_align.train import config_from_dict, train  # noqa: E402
from te_align.train.config import TrainConfig  # noqa: E402
from te_align.train.models import FAMILIES, KLEIN_TARGETS, latent_ids, pack_patches, patchify, unpatchify  # noqa: E402
from te_align.train.record import recording_draws  # noqa: E402
from tests.train.klein_world import write_klein_world  # noqa: E402

SIDE = 32
CAPTIONS = ["a red square at the top left", "a small blue circle in the center"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """(the base as a diffusers folder, its base.json)."""
    tmp = tmp_path_factory.mktemp("klein")
    root, info = write_klein_world(tmp / "world")
    return bases.materialize("klein", cache_dir=tmp / "cache", source=root), info


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("klein-data")
    for i, caption in enumerate(CAPTIONS):
        arr = np.full((SIDE, SIDE, 3), 235, dtype=np.uint8)
        arr[4 + 8 * i : 20 + 8 * i, 8:24] = [(220, 30, 30), (30, 30, 220)][i]
        Image.fromarray(arr).save(path / f"img{i:02d}.png")
        (path / f"img{i:02d}.txt").write_text(caption, encoding="utf-8")
    return path


def _pipe(folder: Path) -> Any:
    pipe = diffusers.Flux2KleinPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _config(folder: Path, info: dict[str, Any], data: Path, out: Path, free: bool = True, **train_: Any) -> TrainConfig:
    return config_from_dict({
        "model": {"path": str(folder), "profile": "flux2-klein-4b", "profile_overrides": info["profile_overrides"],
                  "free_encoders": free},
        "data": {"path": str(data), "resolution": SIDE, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64,
                 "latent_sample": "mean"},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "checkpoint_every": 0, "batch_size": 2, **train_},
        "output": {"dir": str(out), "kohya": False},
        "logging": {"progress": False, "loss_plot": False},
    })  # fmt: skip


@contextmanager
def _captured(model: torch.nn.Module) -> Iterator[list[dict[str, Any]]]:
    """Every forward call's keywords (tensors cloned)."""
    calls: list[dict[str, Any]] = []

    def hook(_m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        assert not args  # both callers pass keywords only
        calls.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def test_the_family_is_the_diffusers_klein_scripts() -> None:
    fam = FAMILIES["flux2-klein"]
    assert fam.flow_native and fam.patchified and not fam.packed and fam.patch == 2 and fam.mask_arg is None
    assert KLEIN_TARGETS[:5] == ["to_k", "to_q", "to_v", "to_out.0", "to_qkv_mlp_proj"]
    assert KLEIN_TARGETS[5:] == [f"single_transformer_blocks.{i}.attn.to_out" for i in range(24)]
    x = torch.arange(2 * 8 * 4 * 6, dtype=torch.float32).reshape(2, 8, 4, 6)
    assert torch.equal(patchify(x), diffusers.Flux2KleinPipeline._patchify_latents(x))
    assert torch.equal(unpatchify(patchify(x)), x)
    y = patchify(x)
    assert torch.equal(pack_patches(y), diffusers.Flux2KleinPipeline._pack_latents(y))
    assert torch.equal(latent_ids(2, 2, 3, torch.device("cpu")), diffusers.Flux2KleinPipeline._prepare_latent_ids(y))


def test_a_lora_step_changes_only_lora_weights_and_its_loss_is_exact(base, data, tmp_path: Path) -> None:
    folder, info = base
    losses = []
    for k in range(2):
        pipe = _pipe(folder)
        before = {name: {n: p.detach().clone() for n, p in getattr(pipe, name).named_parameters()}
                  for name in ("transformer", "text_encoder", "vae")}  # fmt: skip
        res = train(_config(folder, info, data, tmp_path / f"run{k}", free=False), pipeline=pipe)
        losses.append(res.losses)
        assert res.steps == 2 and len(res.losses) == 2 and all(np.isfinite(v) for _, v in res.losses)
        lora = {n: p for n, p in pipe.transformer.named_parameters() if "lora_" in n}
        # LoRA on every double block's q/k/v/out and every single block's fused projection and output (2 + 2 blocks)
        assert len(lora) == 2 * (2 * 4 + 2 * 2)
        assert all(p.abs().sum() > 0 for n, p in lora.items() if "lora_B" in n)  # gaussian init: B starts at zero
        for name, params in before.items():
            after = dict(getattr(pipe, name).named_parameters())
            for n, p in params.items():
                key = n if n in after else n.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
                assert torch.equal(after[key], p), (name, n)
        if k == 0:  # the diffusers-format file loads into the pipeline as trained (pipe.load_lora_weights)
            loaded = _pipe(folder)
            loaded.load_lora_weights(str(res.lora_path))
            got = {n.replace(".default_0.", ".default."): q for n, q in loaded.transformer.named_parameters() if "lora_" in n}
            assert sorted(got) == sorted(lora) and all(torch.equal(got[n], q) for n, q in lora.items())
    assert losses[0] == losses[1]


def test_a_training_step_feeds_the_transformer_what_the_pipelines_own_steps_give(base, data, tmp_path: Path) -> None:
    """Latents (posterior mean, patchified, normalised by the BatchNorm statistics), noise in the pipeline's shape,
    packing, image and text ids, the stacked taps of the templated caption, t in [0, 1], no guidance."""
    from te_align.train.data import Item, load_pixels

    folder, info = base
    pipe = _pipe(folder)
    ref = _pipe(folder)
    with _captured(pipe.transformer) as calls, recording_draws() as rec:
        train(_config(folder, info, data, tmp_path / "run", max_steps=1), pipeline=pipe)
    assert len(calls) == 1 and len(rec) == 1
    call, draw = calls[0], rec[0]
    files = sorted(data.glob("*.png"))
    order = draw["batch"]
    px = torch.stack([load_pixels(Item(files[i], CAPTIONS[i], 1, (SIDE, SIDE), (SIDE, SIDE)))[0] for i in order])
    with torch.no_grad():
        # one image at a time, as the trainer's latent store and the pipeline's prepare_image_latents encode them (a
        # batched convolution rounds differently)
        x0 = torch.cat([ref._encode_vae_image(px[i : i + 1], torch.Generator()) for i in range(2)])
        embeds, text_ids = ref.encode_prompt([CAPTIONS[i] for i in order], device="cpu")
    assert x0.shape == (2, 32, 8, 8) and draw["noise"].shape == x0.shape
    # the noise is drawn in the shape prepare_latents draws it in
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    packed, ids = ref.prepare_latents(2, 8, SIDE, SIDE, torch.float32, "cpu", g1)
    assert torch.equal(packed, pack_patches(torch.randn(2, 32, 8, 8, generator=g2)))
    t = draw["timesteps"]
    s = t.view(2, 1, 1, 1)
    assert torch.equal(call["hidden_states"], ref._pack_latents((1.0 - s) * x0 + s * draw["noise"]))
    assert torch.equal(call["img_ids"], ref._prepare_latent_ids(x0)) and torch.equal(ids, call["img_ids"])
    assert torch.equal(call["encoder_hidden_states"], embeds) and embeds.shape == (2, 512, 96)
    assert torch.equal(call["txt_ids"], text_ids)
    assert torch.equal(call["timestep"], t) and bool(((t > 0) & (t < 1)).all())  # the pipeline's timestep / 1000
    assert call["guidance"] is None


def test_validation_latents_are_the_pipelines_encoded_images(base, data) -> None:
    from te_align.ab.evaluate import load_val_latents
    from te_align.train.data import Item, load_pixels

    pipe = _pipe(base[0])
    files = sorted(data.glob("*.png"))
    px = torch.stack([load_pixels(Item(f, "", 1, (SIDE, SIDE), (SIDE, SIDE)))[0] for f in files])
    with torch.no_grad():
        assert torch.equal(load_val_latents(pipe, files, SIDE), pipe._encode_vae_image(px, torch.Generator()))


def test_samples_by_the_profile_are_the_pipeline_called_with_its_prompt(base) -> None:
    """Sampled as its users sample: ``Flux2KleinPipeline(prompt=...)``, true CFG 4 against "", equals the A/B's
    sampling by the base's profile (te_align.encode's conditioning handed over as embeddings)."""
    from te_align.ab.accuracy import sample_prompts
    from te_align.profiles.overrides import resolve

    pipe = _pipe(base[0])
    profile = resolve("flux2-klein-4b", ("base", base[1]["profile_overrides"]))
    ours = sample_prompts(pipe, profile, CAPTIONS, steps=2, guidance=4.0, size=SIDE, seed=0)
    with torch.no_grad():
        out = pipe(prompt=CAPTIONS, guidance_scale=4.0, num_inference_steps=2, height=SIDE, width=SIDE,
                   generator=[torch.Generator().manual_seed(i) for i in range(2)], output_type="np").images  # fmt: skip
    theirs = [np.clip(np.rint(im * 255), 0, 255).astype(np.uint8) for im in out]
    assert len(ours) == 2 and all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_the_memory_estimate_reads_the_klein_model(base, data, tmp_path: Path) -> None:
    """``--estimate`` on a klein run: the LoRA it counts is the one training adds, the text cache holds each caption's
    (512, 96) float32 taps, and the denoiser's activations are traced on the patchified latent (not refused)."""
    from te_align.train.estimate import estimate

    folder, info = base
    cfg = _config(folder, info, data, tmp_path / "est")
    est = estimate(cfg, device="cpu")
    pipe = _pipe(folder)
    train(_config(folder, info, data, tmp_path / "run", max_steps=1), pipeline=pipe)
    assert est.params["lora"] == sum(p.numel() for n, p in pipe.transformer.named_parameters() if "lora_" in n)
    cache = next(x for x in est.lines_training if x.what.startswith("text cache"))
    assert cache.bytes == len(CAPTIONS) * 512 * 96 * 4
    assert est.activations["saved"] > 0 and est.activations["transient"] > 0
