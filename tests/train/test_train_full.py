"""A full fine-tune without LoRA (``lora.rank = 0`` with ``train.full_modules``): real tiny diffusers / transformers
models saved as diffusers folders, CPU, no network."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from te_align.tiny.fit import PROFILES, profile_overrides
from te_align.train import TrainError, config_from_dict, train
from te_align.train.checkpoint import load_checkpoint


def _raw(model: Path, data: Path, out: Path, **train_section: Any) -> dict[str, Any]:
    return {
        "model": {"path": str(model), "profile": PROFILES["sd15"], "profile_overrides": profile_overrides("sd15")},
        "data": {"path": str(data), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "lora": {"rank": 0},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "full_modules": [""], "checkpoint_every": 1, "batch_size": 2,
                  **train_section},
        "output": {"dir": str(out)},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    }  # fmt: skip


def _pipe(folder: Path) -> Any:
    import diffusers

    import te_align.encoding.projected  # noqa: F401  (a swapped folder's text encoder class)

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def sd15(tiny_model_folder: Callable[[str], Path]) -> Path:
    return tiny_model_folder("sd15")


@pytest.fixture(scope="module")
def swapped(sd15: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from te_align.swap import swap
    from te_align.tiny import tokenizers
    from te_align.tiny.encoders import t5_encoder_model

    tok = tokenizers.t5_tokenizer()
    enc = t5_encoder_model((len(tok) + 127) // 128 * 128)
    out = tmp_path_factory.mktemp("swap") / "sd15-t5"
    swap(str(sd15), enc, str(out), tokenizer=tok, profile="sd15", profile_overrides=profile_overrides("sd15"),
         captions=["a red square", "a blue circle"], reset="all", seed=5)  # fmt: skip
    return out


def test_rank_zero_is_a_full_fine_tune_of_the_full_modules_only(sd15: Path, squares_dataset: Path, tmp_path: Path) -> None:
    raw = _raw(sd15, squares_dataset, tmp_path / "o")
    pipe = _pipe(sd15)
    before = {k: v.detach().clone() for k, v in pipe.unet.state_dict().items()}
    result = train(config_from_dict(raw), pipeline=pipe)
    assert result.steps == 2 and result.lora_path is None and result.kohya_path is None
    names = {p.name for p in (tmp_path / "o").iterdir()}
    assert "lora.safetensors" not in names and "lora_kohya.safetensors" not in names  # no empty LoRA file
    assert "lora_full.safetensors" in names and "lora_projection.safetensors" not in names
    now = pipe.unet.state_dict()
    assert not any("lora_" in k or "base_layer" in k for k in now)  # no adapter was added
    params = {n for n, _ in pipe.unet.named_parameters()}
    # AdamW's decoupled weight decay moves every trained weight, so "changed" is exactly "trained"
    assert {k for k in before if not torch.equal(before[k], now[k])} == params
    saved = load_file(str(tmp_path / "o" / "lora_full.safetensors"))
    assert set(saved) == {f"unet.{n}" for n in params}
    assert all(torch.equal(saved[f"unet.{n}"], now[n]) for n in params)
    with safe_open(str(tmp_path / "o" / "lora_full.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["te_align.profile"] == "sd15" and meta["te_align.extra.rank"] == "0"
    state = load_checkpoint(result.last_checkpoint)
    assert set(state["params"]) == {f"unet.{n}" for n in params}
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == [1e-3]  # one group: the full weights
    assert state["state"]["run"]["rank"] == 0 and state["state"]["run"]["target_modules"] == []


def test_rank_zero_on_a_swapped_model_trains_the_unet_and_the_projection(swapped: Path, squares_dataset: Path,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    raw = _raw(swapped, squares_dataset, tmp_path / "o", projection_lr=1e-2, full_lr=3e-4)
    del raw["model"]["profile"], raw["model"]["profile_overrides"]  # the swapped folder carries its own profile
    pipe = _pipe(swapped)
    t5_before = {k: v.detach().clone() for k, v in pipe.text_encoder.encoder.state_dict().items()}
    proj_before = pipe.text_encoder.projection.weight.detach().clone()
    result = train(config_from_dict(raw), pipeline=pipe)
    assert result.profile_name == "sd15-t5-swap" and result.lora_path is None
    names = sorted(p.name for p in (tmp_path / "o").iterdir() if p.suffix == ".safetensors")
    assert names == ["lora_full.safetensors", "lora_projection.safetensors"]
    assert all(torch.equal(t5_before[k], v) for k, v in pipe.text_encoder.encoder.state_dict().items())
    assert not torch.equal(proj_before, pipe.text_encoder.projection.weight)
    proj = load_file(str(tmp_path / "o" / "lora_projection.safetensors"))
    assert torch.equal(proj["text_encoder.projection.weight"], pipe.text_encoder.projection.weight)
    state = load_checkpoint(result.last_checkpoint)
    params = {n for n, _ in pipe.unet.named_parameters()}
    assert set(state["params"]) == {f"unet.{n}" for n in params} | {"text_encoder.projection.weight",
                                                                      "text_encoder.projection.bias"}  # fmt: skip
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == [1e-2, 3e-4]  # projection, full weights


def test_rank_zero_resumed_equals_an_uninterrupted_run(swapped: Path, squares_dataset: Path, tmp_path: Path) -> None:
    def config(name: str) -> Any:
        raw = _raw(swapped, squares_dataset, tmp_path / name, max_steps=4, checkpoint_every=2)
        del raw["model"]["profile"], raw["model"]["profile_overrides"]
        raw["data"]["caption_dropout"] = 0.3
        return config_from_dict(raw)

    whole = train(config("whole"))
    stopped = train(config("part"), stop_after=3)
    assert stopped.steps == 3 and stopped.lora_path is None
    resumed = train(config("part"), resume=True)
    assert resumed.steps == 4 and resumed.losses == whole.losses
    for name in ("lora_full.safetensors", "lora_projection.safetensors"):
        a, b = load_file(str(tmp_path / "whole" / name)), load_file(str(tmp_path / "part" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    # a folder holding a rank-0 run's outputs is a previous run
    with pytest.raises(TrainError, match=r"holds a previous run \(3 checkpoints, lora_full.safetensors, "
                                         r"lora_projection.safetensors\)"):  # fmt: skip
        train(config("part"))
    # a LoRA run cannot resume a full fine-tune's checkpoint
    raw = _raw(swapped, squares_dataset, tmp_path / "part", max_steps=6)
    del raw["model"]["profile"], raw["model"]["profile_overrides"]
    raw["lora"] = {"rank": 2}
    with pytest.raises(TrainError, match=r"cannot resume: the checkpoint was trained with lora.rank = 0, this config has 2"):
        train(config_from_dict(raw), resume=True)


def test_rank_zero_needs_full_modules_and_says_so() -> None:
    base: dict[str, Any] = {"model": {"path": "m"}, "data": {"path": "d"}}
    with pytest.raises(TrainError) as e:
        config_from_dict({**base, "lora": {"rank": 0}})
    assert str(e.value) == ("key 'lora.rank': 0 trains no denoiser LoRA, so train.full_modules must name the weights to "
                            "train in full (e.g. [\"\"] for the whole denoiser); or set lora.rank >= 1")  # fmt: skip
    with pytest.raises(TrainError, match=r"key 'lora.rank': must be >= 1 \(or 0 with train.full_modules: no denoiser "
                                         r"LoRA\), got -1"):  # fmt: skip
        config_from_dict({**base, "lora": {"rank": -1}, "train": {"full_modules": [""]}})
    with pytest.raises(TrainError, match=r"key 'lora.target_modules': set, but lora.rank = 0 adds no denoiser LoRA"):
        config_from_dict({**base, "lora": {"rank": 0, "target_modules": ["to_q"]}, "train": {"full_modules": [""]}})
    with pytest.raises(TrainError, match=r"key 'lora.text_encoder_rank': must be >= 1 when lora.rank = 0"):
        config_from_dict({**base, "lora": {"rank": 0, "text_encoders": ["clip_l"]}, "train": {"full_modules": [""]}})
    cfg = config_from_dict({**base, "lora": {"rank": 0}, "train": {"full_modules": ["attn2"]}})
    assert cfg.lora.rank == 0 and cfg.train.full_modules == ["attn2"]


def test_swapped_model_with_encoder_dropout_encodes_the_same_with_and_without_freeing_encoders(
        swapped: Path, squares_dataset: Path, tmp_path: Path) -> None:  # fmt: skip
    """A dropped slot of a swapped model is encoded on demand when the encoders stay loaded (``model.free_encoders =
    false``), and from the pre-filled variants when they are freed: the same conditioning, the same run."""

    def run(name: str, free: bool) -> Any:
        raw = _raw(swapped, squares_dataset, tmp_path / name, max_steps=3, checkpoint_every=0)
        del raw["model"]["profile"], raw["model"]["profile_overrides"]
        raw["model"]["free_encoders"] = free
        raw["data"]["encoder_dropout"] = {"t5": 0.5}
        return train(config_from_dict(raw))

    kept, freed = run("kept", False), run("freed", True)
    assert kept.losses == freed.losses and len(kept.losses) == 3
