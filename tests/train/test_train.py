"""``te-align train`` on tiny random diffusers models saved as real diffusers folders (CPU, no network)."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from te_align.tiny.datasets import make_squares_dataset
from te_align.tiny.fit import PROFILES, profile_overrides
from te_align.train import TrainError, config_from_dict, load_config, train
from te_align.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = {"sd15": "StableDiffusionPipeline", "sdxl": "StableDiffusionXLPipeline", "sd3": "StableDiffusion3Pipeline",
             "flux": "FluxPipeline"}  # fmt: skip


@pytest.fixture(scope="module")
def models(tiny_model_folder: Callable[[str], Path]) -> dict[str, Path]:
    return {f: tiny_model_folder(f) for f in PIPELINES}


@pytest.fixture(scope="module")
def dataset(squares_dataset: Path) -> Path:
    return squares_dataset


def make_config(family: str, model: Path, data_dir: Path, out: Path, **sections: dict[str, Any]) -> TrainConfig:
    raw: dict[str, Any] = {
        "model": {"path": str(model), "profile": PROFILES[family], "profile_overrides": profile_overrides(family)},
        "data": {"path": str(data_dir), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 3, "learning_rate": 1e-3, "checkpoint_every": 0, "batch_size": 2},
        "output": {"dir": str(out)},
        "logging": {"progress": False},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)


def _pipeline(family: str, folder: Path) -> Any:
    import diffusers

    pipe = getattr(diffusers, PIPELINES[family]).from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _render(pipe: Any) -> np.ndarray:
    return pipe("a red square", num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np",
                height=32, width=32).images  # fmt: skip


# --------------------------------------------------------------------------------------------- config
def test_config_errors_name_the_key_and_the_closest_valid_one(tmp_path: Path) -> None:
    base = {"model": {"path": "m"}, "data": {"path": "d"}}
    with pytest.raises(TrainError, match=r"key 'train.learning_rat'.*did you mean: learning_rate"):
        config_from_dict({**base, "train": {"learning_rat": 1e-4}})
    with pytest.raises(TrainError, match=r"key 'train.batch_size': expected an integer, got '2'"):
        config_from_dict({**base, "train": {"batch_size": "2"}})
    with pytest.raises(TrainError, match=r"key 'trian'.*did you mean: train"):
        config_from_dict({**base, "trian": {}})
    with pytest.raises(TrainError, match=r"key 'resolution'.*belongs under \[data\]"):
        config_from_dict({**base, "resolution": 512})
    with pytest.raises(TrainError, match=r"key 'train.mixed_precision'.*one of"):
        config_from_dict({**base, "train": {"mixed_precision": "bf61"}})
    with pytest.raises(TrainError, match=r"key 'model.path'.*missing"):
        config_from_dict({"data": {"path": "d"}})
    with pytest.raises(TrainError, match=r"key 'data.caption_dropout'"):
        config_from_dict({**base, "data": {"path": "d", "caption_dropout": 1.5}})
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\npath=1", encoding="utf-8")
    with pytest.raises(TrainError, match="not valid TOML"):
        load_config(bad)


def test_example_configs_validate(tmp_path: Path) -> None:
    examples = sorted((ROOT / "examples" / "train").glob("*.toml"))
    assert examples
    for path in examples:
        cfg = load_config(path)
        assert cfg.model.path and cfg.data.path
        # --check scans the dataset too: the example next to a dataset folder of its own
        copy = tmp_path / path.name
        copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
        make_squares_dataset(tmp_path / Path(cfg.data.path).name, n=2)
        out = subprocess.run([sys.executable, "-m", "te_align", "train", str(copy), "--check"], capture_output=True, text=True)
        if cfg.train.device.startswith("cuda") and not torch.cuda.is_available():
            # a GPU example (flux_dev_estimate.toml): --check refuses it here, as the run would
            assert out.returncode == 2 and "key 'train.device': 'cuda' is not available" in out.stderr, out.stderr
            continue
        assert out.returncode == 0, out.stderr
        assert "ok" in out.stdout and "2 images" in out.stdout
        out = subprocess.run([sys.executable, "-m", "te_align", "train", str(path), "--check"], capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "dataset folder does not exist" in out.stderr


def test_cli_reports_config_errors_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npath = "x"\n[data]\npath = "d"\n[train]\nbatchsize = 2\n', encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "te_align", "train", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "train.batchsize" in out.stderr and "batch_size" in out.stderr


# ---------------------------------------------------------------------------------------------- data
def test_bad_datasets(tmp_path: Path, models: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(TrainError, match="dataset folder does not exist"):
        train(make_config("sd15", models["sd15"], tmp_path / "nope", tmp_path / "o"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainError, match="no images"):
        train(make_config("sd15", models["sd15"], tmp_path / "empty", tmp_path / "o"))
    data = make_squares_dataset(tmp_path / "d", n=3)
    (data / "img01.txt").unlink()
    (data / "broken.png").write_bytes(b"not an image")
    from te_align.train.config import DataConfig
    from te_align.train.data import scan

    with caplog.at_level(logging.WARNING, logger="te_align.train"):
        report = scan(DataConfig(path=str(data)))
    assert len(report.items) == 3
    assert [p.name for p, _ in report.unreadable] == ["broken.png"]
    assert [p.name for p in report.missing_captions] == ["img01.png"]
    assert "broken.png" in caplog.text and "img01.png" in caplog.text


def test_repeat_folders_buckets_and_tag_shuffle(tmp_path: Path) -> None:
    from te_align.train.config import DataConfig
    from te_align.train.data import (
        BatchOrder,
        assign_bucket,
        make_buckets,
        process_caption,
        scan,
        step_generator,
    )

    make_squares_dataset(tmp_path / "3_a", n=2)
    make_squares_dataset(tmp_path / "b", n=1)
    items = scan(DataConfig(path=str(tmp_path))).items
    assert sorted(it.repeats for it in items) == [1, 3, 3]
    cfg = DataConfig(path=".", resolution=32, bucket_step=16, min_bucket=16, max_bucket=64)
    buckets = make_buckets(cfg, 8)
    assert (32, 32) in buckets and all(w * h <= 32 * 32 for w, h in buckets)
    assert assign_bucket((600, 200), buckets) == (48, 16)
    for it in items:
        it.bucket = assign_bucket(it.size, buckets)
    order = BatchOrder(items, 2, seed=1)
    assert order.epoch_batches(0) == BatchOrder(items, 2, seed=1).epoch_batches(0)
    for batch in order.epoch_batches(0):
        assert len({items[i].bucket for i in batch}) == 1
    shuf = DataConfig(path=".", shuffle_tags=True, keep_tokens=1)
    outs = {process_caption("first, b, c, d, e", shuf, step_generator(0, s)) for s in range(20)}
    assert len(outs) > 1 and all(o.startswith("first, ") for o in outs)
    with pytest.raises(TrainError, match=r"data\.bucket_step"):
        make_buckets(DataConfig(path=".", bucket_step=24), 16)


def test_model_that_does_not_match_the_profile(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    cfg = make_config("sd15", models["sd15"], dataset, tmp_path / "o")
    cfg.model.profile_overrides = {}
    with pytest.raises(TrainError, match=r"hidden size 32 but profile 'sd15'.*does not match"):
        train(cfg)
    cfg = make_config("sdxl", models["sd15"], dataset, tmp_path / "o")
    with pytest.raises(TrainError, match="StableDiffusionPipeline but profile 'sdxl'"):
        train(cfg)
    cfg.model.path = str(tmp_path / "missing-model")
    with pytest.raises(TrainError, match=r"model\.path"):
        train(cfg)


# ------------------------------------------------------------------------------------------- training
def test_loss_decreases(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    cfg = make_config("flux", models["flux"], dataset, tmp_path / "o",
                      train={"max_steps": 40, "learning_rate": 5e-3}, data={"latent_sample": "mean"})  # fmt: skip
    result = train(cfg)
    losses = [v for _, v in result.losses]
    assert len(losses) == 40
    assert np.mean(losses[-10:]) < 0.9 * np.mean(losses[:10]), losses
    assert (tmp_path / "o" / "loss.png").is_file()
    assert (tmp_path / "o" / "logs" / "train_log.csv").read_text().startswith("step,epoch,loss")
    # TensorBoard events hold the same losses
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in (tmp_path / "o").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events))
    acc.Reload()
    tag = next(t for t in acc.Tags()["scalars"] if "loss" in t)
    logged = [e.value for e in acc.Scalars(tag)]
    assert len(logged) == 40 and np.allclose(logged, losses, rtol=1e-6)


@pytest.mark.parametrize("family", list(PIPELINES))
def test_lora_loads_into_the_diffusers_pipeline_and_changes_its_output(
    tmp_path: Path, models: dict[str, Path], dataset: Path, family: str
) -> None:
    extra: dict[str, Any] = {}
    if family == "sdxl":
        extra["lora"] = {"text_encoders": ["clip_l"]}
    if family == "sd3":
        extra["data"] = {"encoder_dropout": {"all": "profile"}, "caption_dropout": 0.3}
    cfg = make_config(family, models[family], dataset, tmp_path / "o",
                      sample={"prompts": ["a red square"], "steps": 2, "every": 2}, **extra)  # fmt: skip
    result = train(cfg)
    assert result.lora_path is not None and result.kohya_path is not None
    from te_align.metadata import read

    meta = read(result.lora_path)
    assert meta["te_align"]["te_align.profile"] == PROFILES[family]
    assert meta["te_align"]["te_align.fingerprint"] == result.fingerprint
    assert meta["te_align"]["te_align.extra.profile_overrides"]
    assert sorted(p.name for p in (tmp_path / "o" / "samples").iterdir()) == ["step-00000002", "step-00000003"]

    pipe = _pipeline(family, models[family])
    before = _render(pipe)
    pipe.load_lora_weights(str(result.lora_path))
    after = _render(pipe)
    assert np.abs(before - after).max() > 0
    if family == "sd15":  # diffusers reads kohya keys for SD: same images as the diffusers-format file
        pipe.unload_lora_weights()
        pipe.load_lora_weights(str(result.kohya_path))
        np.testing.assert_array_equal(_render(pipe), after)


def test_kohya_export_round_trips(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    from te_align.metadata import read
    from te_align.train.export import kohya_to_diffusers

    cfg = make_config("sdxl", models["sdxl"], dataset, tmp_path / "o", train={"max_steps": 2},
                      lora={"text_encoders": ["clip_l", "clip_g"], "alpha": 8.0, "rank": 4})  # fmt: skip
    result = train(cfg)
    diff = load_file(str(result.lora_path))
    kohya = load_file(str(result.kohya_path))
    assert any(k.startswith("lora_te1_") for k in kohya) and any(k.startswith("lora_te2_") for k in kohya)
    pipe = _pipeline("sdxl", models["sdxl"])
    names = {c: [n for n, _ in getattr(pipe, c).named_modules()] for c in ("unet", "text_encoder", "text_encoder_2")}
    layers, alphas = kohya_to_diffusers(kohya, names, n_text_encoders=2)
    assert alphas == {"unet": 8.0, "text_encoder": 8.0, "text_encoder_2": 8.0}
    back = {f"{c}.{k}": v for c, sd in layers.items() for k, v in sd.items()}

    def peft_key(k: str) -> str:
        for old, new in ((".lora_linear_layer.down.", ".lora_A."), (".lora_linear_layer.up.", ".lora_B."),
                         (".lora.down.", ".lora_A."), (".lora.up.", ".lora_B.")):  # fmt: skip
            k = k.replace(old, new)
        return k

    saved = {peft_key(k): v for k, v in diff.items()}
    assert set(back) == set(saved)
    for k, v in saved.items():
        assert torch.equal(back[k], v), k
    meta = read(result.kohya_path)
    assert meta["te_align"]["te_align.profile"] == "sdxl"
    from te_align.metadata import read_header

    assert read_header(result.kohya_path).metadata["ss_network_dim"] == "4"


def test_resume_equals_an_uninterrupted_run(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    sections: dict[str, Any] = {
        "train": {"max_steps": 6, "checkpoint_every": 3, "gradient_accumulation": 2, "lr_scheduler": "cosine", "warmup_steps": 2},
        "data": {"shuffle_tags": True, "keep_tokens": 1, "caption_dropout": 0.2, "encoder_dropout": {"t5": 0.5},
                 "random_flip": True},
        "lora": {"dropout": 0.1},
    }  # fmt: skip
    full = train(make_config("sd3", models["sd3"], dataset, tmp_path / "full", **sections))
    part_cfg = make_config("sd3", models["sd3"], dataset, tmp_path / "part", **sections)
    stopped = train(part_cfg, stop_after=4)
    assert stopped.lora_path is None and stopped.steps == 4
    torch.manual_seed(12345)  # a resumed run must not depend on the global RNG it starts with
    resumed = train(part_cfg, resume=True)
    assert resumed.steps == 6
    a, b = load_file(str(full.lora_path)), load_file(str(resumed.lora_path))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [s for s, _ in resumed.losses] == [1, 2, 3, 4, 5, 6]
    assert resumed.losses == full.losses


def test_nan_loss_stops_with_the_last_good_checkpoint(tmp_path: Path, models: dict[str, Path], dataset: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from te_align.train import loop

    real = loop._micro_step
    calls = {"n": 0}

    def poisoned(*args: Any, **kw: Any) -> torch.Tensor:
        calls["n"] += 1
        loss = real(*args, **kw)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(loop, "_micro_step", poisoned)
    cfg = make_config("sd15", models["sd15"], dataset, tmp_path / "o", train={"max_steps": 5, "checkpoint_every": 2})
    with pytest.raises(TrainError, match=r"loss is nan at step 3.*step-00000002"):
        train(cfg)
    assert [p.name for p in (tmp_path / "o" / "checkpoints").iterdir() if not p.name.startswith(".")] == ["step-00000002"]
    assert not (tmp_path / "o" / "lora.safetensors").exists()


def test_cli_train_and_resume(tmp_path: Path, models: dict[str, Path], dataset: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[model]\npath = "{models["sd15"]}"\nprofile = "sd15"\n[model.profile_overrides]\n'
        + "".join(f'"{k}" = {v!r}\n' for k, v in profile_overrides("sd15").items())
        + f'[data]\npath = "{dataset}"\nresolution = 32\nbucket_step = 16\nmin_bucket = 16\nmax_bucket = 64\n'
        + '[train]\nmax_steps = 2\ncheckpoint_every = 1\n[output]\ndir = "out"\n[logging]\nprogress = false\n',
        encoding="utf-8",
    )
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "te_align.train", str(cfg)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "out" / "lora.safetensors").is_file()
    # te-align's own lines only: no diffusers "Loading pipeline components..." / transformers "Loading weights" bars
    assert [ln for ln in out.stderr.replace("\r", "\n").splitlines() if ln and not ln.startswith("te-align")] == []
    cfg.write_text(cfg.read_text().replace("max_steps = 2", "max_steps = 3"), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "te_align", "train", str(cfg), "--resume"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "3 steps" in out.stdout


def test_sdxl_flow_objective_with_long_prompt_chunk_buckets(tmp_path: Path, models: dict[str, Path]) -> None:
    data = make_squares_dataset(tmp_path / "d", n=4)
    long = ", ".join(f"tag{i}" for i in range(120))
    (data / "img00.txt").write_text(long, encoding="utf-8")
    (data / "img02.txt").write_text(long, encoding="utf-8")
    cfg = make_config("sdxl", models["sdxl"], data, tmp_path / "o", train={"max_steps": 2, "objective": "flow"},
                      data={"long_prompt_chunks": 3, "cache_text": False})  # fmt: skip
    result = train(cfg)
    assert result.steps == 2 and all(np.isfinite(v) for _, v in result.losses)
    import json

    info = json.loads((tmp_path / "o" / "train_config.json").read_text())
    assert info["objective"] == "flow"
    with pytest.raises(TrainError, match=r"train\.objective"):
        train(make_config("sd3", models["sd3"], data, tmp_path / "o3", train={"objective": "eps"}))


def test_adamw8bit_keeps_8_bit_state_and_resumes_exactly(tmp_path: Path, models: dict[str, Path], dataset: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """bitsandbytes' AdamW8bit runs on CPU (>= 0.48): its moments are uint8, and resume is exact with it too."""
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (it is in the [test] extra)")
    import bitsandbytes as bnb

    from te_align.train import run as run_module

    made: list[Any] = []
    real = run_module.make_optimizer

    def recording(*a: Any, **k: Any) -> Any:
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(run_module, "make_optimizer", recording)
    # rank 128 makes some LoRA matrices reach bitsandbytes' min_8bit_size (4096 elements); smaller ones keep
    # 32-bit moments by bitsandbytes' own rule
    sections: dict[str, Any] = {"train": {"max_steps": 4, "checkpoint_every": 2, "optimizer": "adamw8bit"},
                                "lora": {"rank": 128, "alpha": 128.0}}  # fmt: skip
    full = train(make_config("sd15", models["sd15"], dataset, tmp_path / "full", **sections))
    assert isinstance(made[0], bnb.optim.AdamW8bit)
    sizes = {id(s): p.numel() for p, s in made[0].state.items()}
    states = [(sizes[id(s)], s) for s in made[0].state.values() if "state1" in s]
    assert any(n >= 4096 for n, _ in states)
    for n, s in states:
        want = torch.uint8 if n >= 4096 else torch.float32
        assert s["state1"].dtype == want and s["state2"].dtype == want, n
    assert all(math.isfinite(v) for _, v in full.losses)
    part_cfg = make_config("sd15", models["sd15"], dataset, tmp_path / "part", **sections)
    train(part_cfg, stop_after=2)
    resumed = train(part_cfg, resume=True)
    a, b = load_file(str(full.lora_path)), load_file(str(resumed.lora_path))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed.losses == full.losses


@pytest.mark.parametrize("precision", ["no", "fp16"])
def test_direct_optimizer_step_matches_accelerate(precision: str) -> None:
    """Stepping the inner optimizer and torch's clip equals accelerate's wrappers bit for bit; with fp16 the
    wrappers (gradient scaler) are kept."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    from te_align.train.optim import direct_step

    def run(direct: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
        acc = Accelerator(cpu=True, mixed_precision="no")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt = acc.prepare(model, opt)
        params = list(model.parameters())
        step, clip = direct_step(acc, opt, params) if direct else (opt.step, lambda n: acc.clip_grad_norm_(params, n))
        for i in range(5):
            x = torch.randn(3, 8, generator=torch.Generator().manual_seed(i))
            acc.backward(model(x).pow(2).mean())
            clip(0.1)
            step()
            opt.zero_grad(set_to_none=True)
        return [p.detach().clone() for p in params]

    if precision == "no":
        assert all(torch.equal(a, b) for a, b in zip(run(True), run(False), strict=True))
        acc = Accelerator(cpu=True)
        opt = acc.prepare(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
        step, _ = direct_step(acc, opt, [])
        assert isinstance(opt, AcceleratedOptimizer) and step == opt.optimizer.step
    else:
        class Scaled:  # an AcceleratedOptimizer with a gradient scaler (fp16 on CUDA) keeps accelerate's step

            scaler = object()
            optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)

            def step(self) -> None:
                pass

        acc = Accelerator(cpu=True)
        wrapped = Scaled()
        step, _ = direct_step(acc, wrapped, [])
        assert step == wrapped.step


def test_text_memo_is_bounded_and_evicted_entries_come_back_from_the_disk_cache(
    tmp_path: Path, models: dict[str, Path], dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from te_align.train import text

    sections: dict[str, Any] = {"train": {"max_steps": 4}, "data": {"caption_dropout": 0.3}}
    full = train(make_config("sd3", models["sd3"], dataset, tmp_path / "a", **sections))
    sizes: list[int] = []
    real = text.TextSource._remember

    def recording(self: Any, key: Any, cond: Any) -> None:
        real(self, key, cond)
        sizes.append(len(self._memo))

    monkeypatch.setattr(text, "MEMO_BYTES", 1)  # keep one conditioning in memory at a time
    monkeypatch.setattr(text.TextSource, "_remember", recording)
    small = train(make_config("sd3", models["sd3"], dataset, tmp_path / "b", **sections))
    assert sizes and max(sizes) == 1
    a, b = load_file(str(full.lora_path)), load_file(str(small.lora_path))
    assert all(torch.equal(a[k], b[k]) for k in a) and small.losses == full.losses
