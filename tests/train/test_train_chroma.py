"""``te-align train`` on Chroma: a tiny real ``ChromaPipeline`` (tiny T5, ``ChromaTransformer2DModel``,
``AutoencoderKL``) saved as a diffusers folder (CPU, no network).

The transformer's forward keywords are captured with a forward pre-hook on the real model, in the
training step and in diffusers' own ``ChromaPipeline.__call__`` (0.42.1 pipelines/chroma/pipeline_chroma.py:
858-881), and compared tensor for tensor.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import te_align
from te_align.tiny.fit import profile_overrides
from te_align.train import TrainError, config_from_dict, train
from te_align.train.config import SampleConfig, TrainConfig
from te_align.train.models import CHROMA_TARGETS, FAMILIES, denoiser_mask_on

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "a red square, simple, flat"
#: The tiny VAE halves the side (two levels): 32 px -> 16 x 16 latents -> 8 x 8 = 64 packed image tokens.
SIDE, IMAGE_TOKENS, TEXT_TOKENS = 32, 64, 512


@pytest.fixture(scope="module")
def folder(tiny_model_folder: Callable[[str], Path]) -> Path:
    return tiny_model_folder("chroma")


@pytest.fixture(scope="module")
def one_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 32 x 32 image captioned :data:`PROMPT`."""
    from PIL import Image

    path = tmp_path_factory.mktemp("chroma-data")
    arr = np.full((SIDE, SIDE, 3), 235, dtype=np.uint8)
    arr[8:24, 8:24] = (220, 30, 30)
    Image.fromarray(arr).save(path / "img00.png")
    (path / "img00.txt").write_text(PROMPT, encoding="utf-8")
    return path


def _pipe(folder: Path) -> Any:
    import diffusers

    pipe = diffusers.ChromaPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _config(folder: Path, data: Path, out: Path, overrides: dict[str, Any] | None = None,
            **sections: dict[str, Any]) -> TrainConfig:  # fmt: skip
    raw: dict[str, Any] = {
        "model": {"path": str(folder), "profile": "chroma", "profile_overrides": {**profile_overrides("chroma"), **(overrides or {})}},
        "data": {"path": str(data), "resolution": SIDE, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 1, "learning_rate": 1e-3, "checkpoint_every": 0, "batch_size": 1},
        "output": {"dir": str(out)},
        "logging": {"progress": False},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)


@contextmanager
def _captured(model: torch.nn.Module) -> Iterator[list[dict[str, Any]]]:
    """Every forward call's keywords (tensors cloned), with ``grad`` = whether autograd was recording."""
    calls: list[dict[str, Any]] = []

    def hook(_m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        assert not args  # both callers pass keywords only
        calls.append({"grad": torch.is_grad_enabled(),
                      **{k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}})

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def _pipeline_calls(folder: Path) -> list[dict[str, Any]]:
    """What diffusers' ChromaPipeline hands its transformer for PROMPT (true CFG against "": two calls)."""
    pipe = _pipe(folder)
    with _captured(pipe.transformer) as calls:
        pipe(PROMPT, negative_prompt="", guidance_scale=4.0, num_inference_steps=1, height=SIDE, width=SIDE,
             generator=torch.Generator().manual_seed(0), output_type="latent")  # fmt: skip
    assert len(calls) == 2
    return calls


def _assert_same(a: dict[str, Any], b: dict[str, Any], keys: list[str]) -> None:
    for k in keys:
        if isinstance(b[k], torch.Tensor):
            assert isinstance(a[k], torch.Tensor) and a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def _expected_mask(folder: Path) -> torch.Tensor:
    """ChromaPipeline's mask for PROMPT, written out: the real tokens (with EOS) and one pad token, then the image."""
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(str(folder / "tokenizer"))(PROMPT).input_ids)
    mask = torch.zeros(1, TEXT_TOKENS + IMAGE_TOKENS)
    mask[0, : n + 1] = 1.0
    mask[0, TEXT_TOKENS:] = 1.0
    return mask


# --------------------------------------------------------------------------------------------- (a)
def test_training_step_gives_the_transformer_what_chroma_pipeline_gives_it(
    tmp_path: Path, folder: Path, one_image: Path
) -> None:
    ref_cond, ref_neg = _pipeline_calls(folder)
    # the pipeline's own conditioning, as the profile says: float mask (real tokens + 1 pad) + ones, no pooled/guidance
    assert set(ref_cond) == {"grad", "hidden_states", "timestep", "encoder_hidden_states", "txt_ids", "img_ids",
                             "attention_mask", "joint_attention_kwargs", "return_dict"}  # fmt: skip
    assert torch.equal(ref_cond["attention_mask"], _expected_mask(folder))
    assert ref_cond["attention_mask"].dtype == torch.float32
    assert ref_cond["encoder_hidden_states"].shape == (1, TEXT_TOKENS, 96)
    assert ref_cond["hidden_states"].shape == (1, IMAGE_TOKENS, 16)
    assert ref_cond["txt_ids"].shape == (TEXT_TOKENS, 3) and not ref_cond["txt_ids"].any()
    assert ref_cond["timestep"].tolist() == [1.0]  # sigma 1 of one step: the pipeline's t / 1000, t in [0, 1]

    pipe = _pipe(folder)
    with _captured(pipe.transformer) as calls:
        result = train(_config(folder, one_image, tmp_path / "o"), pipeline=pipe)
    assert result.steps == 1 and len(calls) == 1
    step = calls[0]
    assert step["grad"] and step["return_dict"] is False
    assert set(step) == set(ref_cond) - {"joint_attention_kwargs"}  # the pipeline's is {} (no LoRA scale, no IP-adapter)
    assert ref_cond["joint_attention_kwargs"] == {}
    # tensor for tensor: text states, text ids, image ids and the mask the pipeline builds (pipeline_chroma.py:545-561)
    _assert_same(step, ref_cond, ["encoder_hidden_states", "txt_ids", "img_ids", "attention_mask"])
    assert step["hidden_states"].shape == ref_cond["hidden_states"].shape and step["hidden_states"].dtype == torch.float32
    t = float(step["timestep"][0])
    assert step["timestep"].shape == (1,) and 0.0 < t < 1.0  # flow time as the pipeline's timestep / 1000
    record = json.loads((tmp_path / "o" / "train_config.json").read_text(encoding="utf-8"))
    assert record["family"] == "chroma" and record["objective"] == "flow" and record["denoiser_mask"] is True

    # sampling during training (te_align.train.sampling) hands the pipeline te-align's conditioning and negative:
    # every keyword of both transformer calls equals the pipeline's own for the same prompt and seed
    from te_align.train.sampling import sample_images

    fresh = _pipe(folder)
    profile = te_align.profile("chroma").with_overrides(profile_overrides("chroma"))
    with _captured(fresh.transformer) as sampled:
        sample_images(fresh, profile, SampleConfig(prompts=[PROMPT], steps=1, guidance_scale=4.0), tmp_path / "s", 0,
                      size=(SIDE, SIDE), device=torch.device("cpu"), dtype=torch.float32)  # fmt: skip
    assert len(sampled) == 2
    for got, want in zip(sampled, (ref_cond, ref_neg), strict=True):
        assert set(got) == set(want)
        _assert_same(got, want, sorted(set(want) - {"grad"}))


# --------------------------------------------------------------------------------------------- (b)
def test_cli_run_writes_a_lora_that_loads_into_chroma_pipeline_and_changes_its_output(
    tmp_path: Path, folder: Path, squares_dataset: Path
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[model]\npath = "{folder}"\nprofile = "chroma"\n[model.profile_overrides]\n'
        + "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in profile_overrides("chroma").items())
        + f'[data]\npath = "{squares_dataset}"\nresolution = 32\nbucket_step = 16\nmin_bucket = 16\nmax_bucket = 64\n'
        + '[train]\nmax_steps = 2\nbatch_size = 2\nlearning_rate = 1e-2\ncheckpoint_every = 0\n'
        + '[sample]\nprompts = ["a red square"]\nsteps = 2\nevery = 1\n[output]\ndir = "out"\n[logging]\nprogress = false\n',
        encoding="utf-8",
    )
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "te_align", "train", str(cfg)], capture_output=True, text=True, env=env,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "out"
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step-00000001", "step-00000002"]
    assert (run / "samples" / "step-00000002" / "00-seed0.png").is_file()

    lora = load_file(str(run / "lora.safetensors"))
    # diffusers / peft format under the pipeline's "transformer." prefix; every default target, no approximator
    modules = {k.removeprefix("transformer.").rsplit(".lora_", 1)[0] for k in lora}
    assert all(k.startswith("transformer.") for k in lora)
    assert modules == {f"transformer_blocks.0.{t}" for t in CHROMA_TARGETS} | {
        f"single_transformer_blocks.0.attn.{t}" for t in ("to_q", "to_k", "to_v")}
    from te_align.metadata import read

    meta = read(run / "lora.safetensors")["te_align"]
    assert meta["te_align.profile"] == "chroma"

    def render(pipe: Any) -> np.ndarray:
        return pipe("a red square", num_inference_steps=2, guidance_scale=4.0, height=SIDE, width=SIDE, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images  # fmt: skip

    pipe = _pipe(folder)
    before = render(pipe)
    pipe.load_lora_weights(str(run / "lora.safetensors"))
    loaded = {n.rsplit(".lora_", 1)[0] for n, _ in pipe.transformer.named_parameters() if ".lora_" in n}
    assert loaded == modules  # every trained module, none dropped by diffusers' key conversion
    after = render(pipe)
    assert np.abs(before - after).max() > 1e-3

    # the kohya file: sd-scripts' Flux/Chroma names (networks/lora_flux.py), back to the same images
    from te_align.metadata import read_header
    from te_align.train.export import kohya_to_pipeline_state

    kohya = load_file(str(run / "lora_kohya.safetensors"))
    assert {k.split(".")[0] for k in kohya} == {f"lora_unet_double_blocks_0_{n}" for n in (
        "img_attn_qkv", "img_attn_proj", "img_mlp_0", "img_mlp_2", "txt_attn_qkv", "txt_attn_proj", "txt_mlp_0",
        "txt_mlp_2")} | {"lora_unet_single_blocks_0_linear1"}  # fmt: skip
    assert read_header(run / "lora_kohya.safetensors").metadata["ss_network_module"] == "networks.lora_flux"
    plain = _pipe(folder)
    names = {"transformer": [n for n, _ in plain.transformer.named_modules()]}
    plain.load_lora_weights(kohya_to_pipeline_state(kohya, names, 1, family="chroma"))
    again = render(plain)
    np.testing.assert_allclose(again, after, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------- (c)
def test_denoiser_mask_off_trains_and_samples_the_transformer_without_the_mask(
    tmp_path: Path, folder: Path, one_image: Path
) -> None:
    sample = {"prompts": [PROMPT], "steps": 1, "guidance_scale": 4.0}
    runs = {}
    for name, overrides in (("on", {}), ("off", {"t5.masks.denoiser": False})):
        pipe = _pipe(folder)
        with _captured(pipe.transformer) as calls:
            train(_config(folder, one_image, tmp_path / name, overrides, sample=sample), pipeline=pipe)
        runs[name] = calls
        record = json.loads((tmp_path / name / "train_config.json").read_text(encoding="utf-8"))
        assert record["denoiser_mask"] is (name == "on")
    for name, calls in runs.items():
        # one training call, then the end-of-run sample: the prompt and its negative
        assert [c["grad"] for c in calls] == [True, False, False], name
    on, off = runs["on"], runs["off"]
    mask = _expected_mask(folder)
    assert torch.equal(on[0]["attention_mask"], mask) and on[0]["attention_mask"].dtype == torch.float32
    assert on[1]["attention_mask"].shape == mask.shape and on[2]["attention_mask"].shape == mask.shape
    # off: exactly the mask is gone, in training and in sampling; the step is otherwise the same step
    assert [c["attention_mask"] for c in off] == [None, None, None]
    _assert_same(off[0], on[0], ["hidden_states", "timestep", "encoder_hidden_states", "txt_ids", "img_ids"])
    assert set(off[0]) == set(on[0])
    # the override is part of the profile: fingerprint and LoRA stamp
    from te_align.metadata import read

    meta_on = read(tmp_path / "on" / "lora.safetensors")["te_align"]
    meta_off = read(tmp_path / "off" / "lora.safetensors")["te_align"]
    assert meta_on["te_align.fingerprint"] != meta_off["te_align.fingerprint"]
    assert meta_off["te_align.t5.masks.denoiser"] is False and meta_on["te_align.t5.masks.denoiser"] is True


def test_which_profiles_give_the_denoiser_a_mask() -> None:
    chroma = te_align.profile("chroma")
    assert denoiser_mask_on(chroma) is True
    assert denoiser_mask_on(chroma.with_overrides({"t5.masks.denoiser": False})) is False
    assert denoiser_mask_on(chroma.with_overrides({"t5_denoiser": False})) is False
    for name in ("flux-dev", "flux-schnell", "sd35-large", "sdxl", "sd15"):
        assert denoiser_mask_on(te_align.profile(name)) is False, name
    # a profile without a mask output: ChromaPipeline still gets the prompt_attention_mask it requires with
    # prompt_embeds (pipeline_chroma.py:460-465), all ones, which masks_as_trained keeps from the transformer
    from te_align.train.sampling import pipeline_kwargs

    emb = torch.ones(2, 5, 3, dtype=torch.float16)
    accepted = {"prompt_embeds", "prompt_attention_mask", "negative_prompt_embeds", "negative_prompt_attention_mask"}
    got = pipeline_kwargs({"prompt_embeds": emb, "text_ids": torch.zeros(5, 3)}, {"prompt_embeds": emb}, accepted)
    assert sorted(got) == sorted(accepted)
    for k in ("prompt_attention_mask", "negative_prompt_attention_mask"):
        assert got[k].dtype == torch.float16 and torch.equal(got[k], torch.ones(2, 5, dtype=torch.float16))
    assert sorted(pipeline_kwargs({"prompt_embeds": emb}, None, {"prompt_embeds"})) == ["prompt_embeds"]


def test_ab_validation_and_probe_sampling_follow_the_profile_mask(folder: Path) -> None:
    from te_align.ab import accuracy, evaluate

    pipe = _pipe(folder)
    chroma = FAMILIES["chroma"]
    profile = te_align.profile("chroma").with_overrides(profile_overrides("chroma"))
    off = profile.with_overrides({"t5.masks.denoiser": False})
    assert evaluate.resolve_objective(chroma, pipe, "auto") == "flow"
    cond = te_align.encode(profile, [PROMPT], pipeline=pipe)
    latents = torch.zeros(1, 4, 16, 16)
    noise = evaluate.fixed_noise(latents, 2, 0)
    losses = {}
    for name, prof in (("on", profile), ("off", off)):
        with _captured(pipe.transformer) as calls:
            losses[name] = evaluate.validation_loss(
                family=chroma, denoiser=pipe.transformer, latents=latents, noise=noise, timesteps=[0.25, 0.75],
                cond=cond, objective="flow", flow_shift_scale=1.0, denoiser_mask=denoiser_mask_on(prof),
            )  # fmt: skip
        assert len(calls) == 1 and calls[0]["timestep"].tolist() == [0.25, 0.75]
        got = calls[0]["attention_mask"]
        assert (got is None) if name == "off" else torch.equal(got, _expected_mask(folder).expand(2, -1))
    assert np.isfinite(losses["on"]) and losses["on"] != losses["off"]
    for prof, masked in ((profile, True), (off, False)):
        with _captured(pipe.transformer) as calls:
            accuracy.sample_prompts(pipe, prof, [PROMPT], steps=1, guidance=4.0, size=SIDE)
        assert len(calls) == 2 and all((c["attention_mask"] is not None) is masked for c in calls)


def test_ab_on_a_chroma_folder_with_a_mask_dropped_arm(tmp_path: Path, folder: Path, squares_dataset: Path) -> None:
    """The "mask dropped" row: arm A's preset overrides ``t5.masks.denoiser = false``, everything else as arm B."""
    from te_align.ab.preset import preset_from_dict
    from te_align.ab.runner import run_ab

    preset = preset_from_dict({
        "name": "chroma-mask-dropped", "profile": "chroma", "model": "",
        "description": "tiny Chroma: the transformer trained without the T5 mask against the pipeline's mask",
        "baseline": {"trainer": "ai-toolkit", "version": "test", "behaviour": "no T5 mask into the transformer",
                     "why": "ChromaPipeline gives the transformer the T5 mask (real tokens + one pad)",
                     "source": "diffusers 0.42.1 pipelines/chroma/pipeline_chroma.py:248-251,787-798,858-867",
                     "overrides": {"t5.masks.denoiser": False}},
        "train": {"data": {"resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
                  "lora": {"rank": 4, "alpha": 4.0}, "train": {"max_steps": 2, "batch_size": 2, "learning_rate": 1e-3}},
        "eval": {"every": 1, "resolution": 32, "sample_size": 32, "sample_steps": 2, "sample_seeds": [0],
                 "prompts": ["a red square"], "guidance_scale": 4.0},
    })  # fmt: skip
    result = run_ab(preset, model=folder, data=squares_dataset, seeds=1, out=tmp_path / "ab",
                    profile_overrides=profile_overrides("chroma"), report=False, say=lambda s: None)  # fmt: skip
    a, b = result.run(0, "A"), result.run(0, "B")
    assert [s for s, _ in a.val] == [0, 1, 2] and a.val[0] == b.val[0]  # the same base, scored with the mask
    assert a.val_own[0][1] != a.val[0][1]  # arm A's own validation: the base without the mask
    assert b.val_own == b.val
    # the conditioning tensors are the same: the arms differ only in what reaches the transformer
    assert result.divergence and all(d.prompts_differing == 0 for d in result.divergence)
    records = {arm: json.loads(next((tmp_path / "ab").rglob(f"*{arm}*/train_config.json")).read_text(encoding="utf-8"))
               for arm in ("A", "B")}  # fmt: skip
    assert records["A"]["denoiser_mask"] is False and records["B"]["denoiser_mask"] is True


# --------------------------------------------------------------------------------------------- (d)
def test_an_unsupported_family_is_refused_in_one_line(tmp_path: Path, folder: Path, one_image: Path) -> None:
    want = ("profile 'pixart-sigma' is a pixart model; te-align train supports SD1.5/SD2 (sd1, sd2), SDXL, "
            "SD3/3.5, Flux, Chroma and FLUX.2 [klein]")  # fmt: skip
    cfg = _config(folder, one_image, tmp_path / "o")
    cfg.model.profile, cfg.model.profile_overrides = "pixart-sigma", {}
    with pytest.raises(TrainError) as info:
        train(cfg)
    assert info.value.message == want and info.value.key == "model.profile"
    assert not (tmp_path / "o" / "lora.safetensors").exists()
    toml = tmp_path / "c.toml"
    toml.write_text(f'[model]\npath = "{folder}"\nprofile = "pixart-sigma"\n[data]\npath = "{one_image}"\n'
                    f'[output]\ndir = "{tmp_path / "o2"}"\n[logging]\nprogress = false\n', encoding="utf-8")  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "te_align", "train", str(toml)], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert want in out.stderr and "model.profile" in out.stderr


# ------------------------------------------------------------------------------------- model facts
def test_default_targets_exist_on_the_chroma_transformer_and_spare_the_approximator(folder: Path) -> None:
    from te_align.train.models import add_lora

    model = _pipe(folder).transformer
    names = [n for n, _ in model.named_modules()]
    for target in CHROMA_TARGETS:
        assert any(n == target or n.endswith("." + target) for n in names), target
    add_lora(model, rank=2, alpha=2.0, dropout=0.0, targets=FAMILIES["chroma"].default_targets, seed=0)
    adapted = {n.rsplit(".lora_", 1)[0] for n, _ in model.named_parameters() if ".lora_" in n}
    assert not any(n.startswith("distilled_guidance_layer") for n in adapted)
    assert len(adapted) == 15  # 12 double-block modules + the single block's q, k, v (it has no to_out)


def test_gradient_checkpointing_keeps_the_mask_in_single_blocks(folder: Path) -> None:
    from te_align.train.models import denoise, enable_gradient_checkpointing

    chroma = FAMILIES["chroma"]
    pipe = _pipe(folder)
    profile = te_align.profile("chroma").with_overrides(profile_overrides("chroma"))
    cond = dict(te_align.encode(profile, [PROMPT], pipeline=pipe))
    noisy = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.5])

    def run(model: torch.nn.Module) -> torch.Tensor:
        model.train()
        return denoise(chroma, model, noisy, t, cond)

    plain = run(_pipe(folder).transformer)
    stock = _pipe(folder).transformer
    stock.enable_gradient_checkpointing()
    # diffusers 0.42.1 checkpoints single blocks without attention_mask (transformer_chroma.py:589-594)
    assert not torch.equal(run(stock), plain)
    fixed = _pipe(folder).transformer
    enable_gradient_checkpointing(chroma, fixed)
    out = run(fixed)
    assert torch.equal(out, plain)
    out.sum().backward()  # the recomputation in backward gets the mask too (saved with the checkpoint's inputs)
