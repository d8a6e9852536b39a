"""Data-parallel training for real: ``accelerate launch --multi_gpu --num_processes 2`` on CPU (gloo).

Two processes with batch 1 must train exactly what one process with batch 2 trains on the same
global batches: the batch order is global and sharded (``BatchOrder.shard``), every random draw is
made for the whole global batch and sliced, and each shard's loss is weighted so that DDP's
all-reduce *mean* of the gradients is the gradient of the mean loss over the global batch. What is
not bit-identical is the floating-point summation order (two half-batches summed by the all-reduce
vs one batch of two inside the convolutions/attention): that gives ~1e-7 relative differences in
the gradients. Adam normalises each update to about ``learning_rate`` per step, so after a few
steps the LoRA weights agree to a small fraction of one step's update (measured 2.8e-5 after 2 and
4 steps at lr 1e-3, while lora_B moved by 2e-3 / 4e-3); the test allows 2.5e-4 (a quarter of one
step: elements whose gradient is near Adam's epsilon turn summation noise into update noise) and
losses to 1e-5 relative.

Also checked: only rank 0 writes files (an audit hook records every write of both processes), the
CSV log has each step once, the LoRA loads with diffusers and changes its output, and ``--resume``
under two processes continues to the same weights.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from te_align.tiny.datasets import make_squares_dataset
from te_align.tiny.fit import profile_overrides
from te_align.train import config_from_dict, train

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
LR = 1e-3


def _gloo_available() -> str | None:
    if shutil.which("accelerate") is None:
        return "the accelerate launcher is not on PATH"
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with the gloo backend is not available in this torch build"
    return None


pytestmark = pytest.mark.skipif(_gloo_available() is not None, reason=str(_gloo_available()))


def _raw(model: Path, data: Path, out: Path, cache: Path, batch: int) -> dict[str, Any]:
    return {
        "model": {"path": str(model), "profile": "sd15", "profile_overrides": profile_overrides("sd15")},
        "data": {
            "path": str(data), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64, "cache_dir": str(cache),
        },
        "train": {"max_steps": STEPS, "learning_rate": LR, "batch_size": batch, "checkpoint_every": 2},
        "output": {"dir": str(out)},
        "logging": {"progress": False, "tensorboard": False},
    }


def _toml(raw: dict[str, Any]) -> str:
    lines = []
    for section, values in raw.items():
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items() if k not in nested]
        for k, sub in nested.items():
            lines.append(f"[{section}.{k}]")
            lines += [f"{json.dumps(kk)} = {json.dumps(vv)}" for kk, vv in sub.items()]
    return "\n".join(lines) + "\n"


def _launch(config: Path, audit: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    audit.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TE_ALIGN_AUDIT_DIR=str(audit), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    # `--cpu --num_processes N` starts ONE process (accelerate's simple launcher; multi-CPU there needs
    # mpirun); `--multi_gpu` starts N processes with torchrun, which on a machine without CUDA train
    # on CPU with gloo.
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
        "-m", "tests.support.audit_writes", str(config), *extra,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _written(audit: Path, rank: int, under: Path) -> list[str]:
    paths = json.loads((audit / f"rank-{rank}.json").read_text(encoding="utf-8"))
    return [p for p in paths if Path(p).resolve().is_relative_to(under.resolve())]


def test_two_processes_equal_one_process_with_twice_the_batch(tmp_path: Path, tiny_model_folder: Callable[[str], Path]) -> None:
    model = tiny_model_folder("sd15")
    data = make_squares_dataset(tmp_path / "data" / "2_squares", n=4, sizes=((32, 32), (48, 32)))
    run = tmp_path / "run"  # everything the 2-process runs may write
    out2, cache2 = run / "out", run / "cache"

    # reference: one process, batch 2, 4 steps, checkpoints at 2 and 4
    ref = train(config_from_dict(_raw(model, data, tmp_path / "ref", tmp_path / "ref-cache", batch=2)))
    assert ref.steps == STEPS

    # two processes, batch 1: stop at step 2 (a finished run), then --resume to step 4
    raw = _raw(model, data, out2, cache2, batch=1)
    raw["sample"] = {"every": 2, "prompts": ["a red square"], "steps": 1}
    config = tmp_path / "ddp.toml"
    config.write_text(_toml(raw), encoding="utf-8")
    first = _launch(config, tmp_path / "audit1", "--max-steps", "2")
    second = _launch(config, tmp_path / "audit2", "--resume")
    for done in (first, second):
        assert done.stdout.count("LoRA: ") == 1  # only rank 0 saved (and reported) a LoRA
    assert "steps, profile sd15" in second.stdout

    # only rank 0 writes files (rank 1 neither writes outputs nor the latent/text caches)
    for audit in (tmp_path / "audit1", tmp_path / "audit2"):
        assert _written(audit, 1, run) == []
        assert any(p.endswith("train_log.csv") for p in _written(audit, 0, run))

    # the same weights as one process with twice the batch, after 2 steps and after resuming to 4
    for step in (2, 4):
        a = load_file(str(out2 / "checkpoints" / f"step-{step:08d}" / "trainable.safetensors"))
        b = load_file(str(tmp_path / "ref" / "checkpoints" / f"step-{step:08d}" / "trainable.safetensors"))
        assert a.keys() == b.keys()
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        moved = max(float(b[k].abs().max()) for k in b if "lora_B" in k)
        assert moved > LR  # lora_B starts at 0: it moved by about LR per step
        print(f"step {step}: max |2-process - 1-process| = {diff:.3g} (largest lora_B {moved:.3g})")
        assert diff < 0.25 * LR, f"step {step}: max |2-process - 1-process| = {diff:.3g}"
    lora2, lora1 = load_file(str(out2 / "lora.safetensors")), load_file(str(ref.lora_path))
    assert lora2.keys() == lora1.keys()
    assert all(torch.allclose(lora2[k], lora1[k], rtol=0, atol=0.25 * LR) for k in lora1)

    # one CSV row per step (no duplicates from rank 1, the resumed run continues the file), same losses
    with open(out2 / "logs" / "train_log.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert [s for s, _ in ref.losses] == list(range(1, STEPS + 1))
    for r, (_, want) in zip(rows, ref.losses, strict=True):
        assert float(r["loss"]) == pytest.approx(want, rel=1e-5)
    # samples written once per sampling step, by rank 0
    assert sorted(p.name for p in (out2 / "samples").iterdir()) == ["step-00000002", "step-00000004"]
    assert sorted(p.name for p in (out2 / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]

    # the saved LoRA loads with diffusers and changes the pipeline's output
    import diffusers

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(model))
    pipe.set_progress_bar_config(disable=True)

    def render() -> Any:
        return pipe("a red square", num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np",
                    height=32, width=32).images  # fmt: skip

    before = render()
    pipe.load_lora_weights(str(out2), weight_name="lora.safetensors")
    after = render()
    assert float(abs(after - before).max()) > 0


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_flow_families_two_processes_equal_one_process(tmp_path: Path, family: str, tiny_model_folder: Callable[[str], Path]) -> None:
    """The rectified-flow path (logit-normal timesteps, packed Flux latents, several text encoders with
    caption and per-encoder dropout drawn per global batch) is data-parallel exact in the same sense,
    and only rank 0 writes cache files."""
    profile = {"sd3": "sd35-large", "flux": "flux-dev"}[family]
    model = tiny_model_folder(family)
    data = make_squares_dataset(tmp_path / "data" / "2_squares", n=4, sizes=((32, 32),))

    def raw(out: Path, cache: Path, batch: int) -> dict[str, Any]:
        r = _raw(model, data, out, cache, batch)
        r["model"].update(profile=profile, profile_overrides=profile_overrides(family))
        r["train"]["checkpoint_every"] = 0
        r["data"].update(caption_dropout=0.25, encoder_dropout={"t5": 0.5}, random_flip=True)
        return r

    ref = train(config_from_dict(raw(tmp_path / "ref", tmp_path / "ref-cache", batch=2)))
    config = tmp_path / "ddp.toml"
    config.write_text(_toml(raw(tmp_path / "out", tmp_path / "cache", batch=1)), encoding="utf-8")
    _launch(config, tmp_path / "audit")
    # rank 1 writes nothing, not even text-cache entries for the dropped-caption patterns it meets
    assert _written(tmp_path / "audit", 1, tmp_path / "out") == [] and _written(tmp_path / "audit", 1, tmp_path / "cache") == []
    assert any("/text/" in p for p in _written(tmp_path / "audit", 0, tmp_path / "cache"))
    a, b = load_file(str(tmp_path / "out" / "lora.safetensors")), load_file(str(ref.lora_path))
    assert a.keys() == b.keys()
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"{family}: max |2-process - 1-process| = {diff:.3g} after {STEPS} steps")
    assert diff < 0.25 * LR
    with open(tmp_path / "out" / "logs" / "train_log.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    for r, (_, want) in zip(rows, ref.losses, strict=True):
        assert float(r["loss"]) == pytest.approx(want, rel=1e-5)
