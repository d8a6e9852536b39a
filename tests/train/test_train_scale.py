"""``te-align train`` at real scale, tested at tiny scale on CPU: frozen-weight dtype defaults, ``model.quantize``,
text encoders / VAE freed after caching, and the ``--estimate`` memory model (against measured peaks on CPU and
against parameter counts of real SD3.5 Large / FLUX.1 dev / SDXL configs built on the meta device)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from te_align.tiny.fit import PROFILES, profile_overrides
from te_align.train import TrainError, config_from_dict, train
from te_align.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = {"sd15": "StableDiffusionPipeline", "sdxl": "StableDiffusionXLPipeline", "sd3": "StableDiffusion3Pipeline",
             "flux": "FluxPipeline"}  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Any:
    """accelerate keeps one process-wide state; these tests train with and without bf16 in one process."""
    from accelerate.state import AcceleratorState, PartialState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()


def make_config(family: str, folder: Path, data_dir: Path, out: Path, **sections: dict[str, Any]) -> TrainConfig:
    raw: dict[str, Any] = {
        "model": {"path": str(folder), "profile": PROFILES[family], "profile_overrides": profile_overrides(family)},
        "data": {"path": str(data_dir), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 3, "learning_rate": 1e-3, "checkpoint_every": 0, "batch_size": 2},
        "output": {"dir": str(out), "kohya": False},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)


def load(family: str, folder: Path) -> Any:
    import diffusers

    pipe = getattr(diffusers, PIPELINES[family]).from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ------------------------------------------------------------------------------------------ dtype
def test_frozen_weights_default_to_the_mixed_precision_dtype_and_lora_stays_float32(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path
) -> None:
    from te_align.metadata import read
    from te_align.train.models import weight_dtype_name

    folder = tiny_model_folder("sd3")
    cfg = make_config("sd3", folder, squares_dataset, tmp_path / "o", train={"mixed_precision": "bf16", "max_steps": 2})
    assert cfg.model.dtype == "auto" and weight_dtype_name(cfg.model, "bf16") == "bfloat16"
    assert weight_dtype_name(cfg.model, "fp16") == "float16" and weight_dtype_name(cfg.model, "no") == "float32"
    pipe = load("sd3", folder)
    result = train(cfg, pipeline=pipe)
    base = {p.dtype for n, p in pipe.transformer.named_parameters() if "lora_" not in n}
    lora = {p.dtype for n, p in pipe.transformer.named_parameters() if "lora_" in n}
    assert base == {torch.bfloat16} and lora == {torch.float32}
    assert all(torch.isfinite(torch.tensor(v)) for _, v in result.losses)
    record = json.loads((tmp_path / "o" / "train_config.json").read_text())
    assert record["weight_dtype"] == "bfloat16" and record["quantize"] == "none"
    meta = read(result.lora_path)["te_align"]
    assert meta["te_align.extra.weight_dtype"] == "bfloat16" and meta["te_align.extra.quantize"] == "none"
    # an explicit model.dtype wins over the mixed-precision default
    explicit = make_config("sd3", folder, squares_dataset, tmp_path / "e", train={"mixed_precision": "bf16", "max_steps": 1},
                           model={"dtype": "float32"})  # fmt: skip
    pipe = load("sd3", folder)
    train(explicit, pipeline=pipe)
    assert {p.dtype for p in pipe.transformer.parameters()} == {torch.float32}
    with pytest.raises(TrainError, match=r"key 'model.dtype'.*expected auto, float32"):
        make_config("sd3", folder, squares_dataset, tmp_path / "x", model={"dtype": "int8"})


# -------------------------------------------------------------------------------------- quantize
@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_bitsandbytes_quantization_is_refused_on_cpu_naming_the_alternative(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path, kind: str
) -> None:
    cfg = make_config("flux", tiny_model_folder("flux"), squares_dataset, tmp_path / "o", model={"quantize": kind})
    with pytest.raises(TrainError) as info:
        train(cfg)
    line = str(info.value)
    assert "\n" not in line and "model.quantize" in line and "needs a CUDA GPU" in line and 'quantize = "fp8"' in line
    assert not (tmp_path / "o").exists()  # refused before anything was loaded or written
    with pytest.raises(TrainError, match=r"key 'model.quantize'.*one of"):
        make_config("flux", tiny_model_folder("flux"), squares_dataset, tmp_path / "o", model={"quantize": "int4"})


def test_fp8_base_stores_float8_weights_and_trains_lora_in_float32(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path
) -> None:
    """fp8 storage computed in float32 is exactly the float32 model with float8-rounded weights: the first loss
    (LoRA B = 0) is identical; the LoRA init is a float32 draw (not rounded to float8)."""
    import te_align
    from te_align.train.models import big_text_encoders

    folder = tiny_model_folder("flux")
    sections: dict[str, Any] = {"train": {"max_steps": 3}, "data": {"latent_sample": "mean"},
                                "model": {"quantize": "fp8", "free_encoders": False}}  # fmt: skip
    pipe = load("flux", folder)
    result = train(make_config("flux", folder, squares_dataset, tmp_path / "q", **sections), pipeline=pipe)
    stored: dict[str, list[str]] = {}
    for comp in ("transformer", "text_encoder_2"):
        linears = {n: m for n, m in getattr(pipe, comp).named_modules() if isinstance(m, torch.nn.Linear)}
        stored[comp] = [n.removesuffix(".base_layer") for n, m in linears.items() if m.weight.dtype == torch.float8_e4m3fn]
        # every attention / feed-forward weight is float8; norms, embedders, proj_out and T5's wo are not (diffusers'
        # and transformers' own keep lists); LoRA layers are float32
        plain = {n for n, m in linears.items() if "lora_" not in n and m.weight.dtype != torch.float8_e4m3fn}
        assert all(("norm" in n or "embed" in n or n == "proj_out" or n.endswith(".wo")) for n in plain), plain
        assert {m.weight.dtype for n, m in linears.items() if "lora_" in n} <= {torch.float32}
    assert len(stored["transformer"]) > 20 and len(stored["text_encoder_2"]) >= 4
    lora = [m for n, m in pipe.transformer.named_modules() if isinstance(m, torch.nn.Linear) and "lora_A" in n]
    # LoRA A drawn in float32: float8 has 3 mantissa bits, so a draw rounded to it would equal its own rounding
    a = torch.cat([m.weight.flatten() for m in lora])
    assert not torch.equal(a, a.to(torch.float8_e4m3fn).float())
    assert big_text_encoders(te_align.profile(PROFILES["flux"])) == ["text_encoder_2"]
    record = json.loads((tmp_path / "q" / "train_config.json").read_text())
    assert record["quantize"] == "fp8" and "float8_e4m3fn" in record["quantize_backend"]

    ref_pipe = load("flux", folder)
    for comp, names in stored.items():
        modules = dict(getattr(ref_pipe, comp).named_modules())
        for n in names:  # layerwise casting stores the weight and the bias in float8
            for prm in modules[n].parameters():
                prm.data = prm.data.to(torch.float8_e4m3fn).float()
    sections["model"] = {"free_encoders": False}
    ref = train(make_config("flux", folder, squares_dataset, tmp_path / "r", **sections), pipeline=ref_pipe)
    assert result.losses[0] == ref.losses[0]
    assert all(torch.isfinite(torch.tensor(v)) for _, v in result.losses)
    weights = load_file(str(result.lora_path))
    assert weights and all(v.dtype == torch.float32 for v in weights.values())


# -------------------------------------------------------------------------------- freed encoders
def test_encoders_and_vae_freed_after_caching_give_the_same_run(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tiny_model_folder("sd3")
    sections: dict[str, Any] = {
        "train": {"max_steps": 5},
        "data": {"caption_dropout": 0.3, "encoder_dropout": {"t5": 0.5, "clip_l": 0.3}, "random_flip": True},
    }
    kept_pipe, freed_pipe = load("sd3", folder), load("sd3", folder)
    kept = train(make_config("sd3", folder, squares_dataset, tmp_path / "k", **sections, model={"free_encoders": False}),
                 pipeline=kept_pipe)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="te_align.train"):
        freed = train(make_config("sd3", folder, squares_dataset, tmp_path / "f", **sections), pipeline=freed_pipe)
    names = ["text_encoder", "text_encoder_2", "text_encoder_3", "vae"]
    assert all(getattr(freed_pipe, n) is None for n in names)
    assert all(getattr(kept_pipe, n) is not None for n in names)
    assert "text encoders freed after caching" in caplog.text and "VAE freed after caching" in caplog.text
    assert freed.losses == kept.losses and len(freed.losses) == 5
    a, b = load_file(str(kept.lora_path)), load_file(str(freed.lora_path))
    assert all(torch.equal(a[k], b[k]) for k in a)
    record = json.loads((tmp_path / "f" / "train_config.json").read_text())
    assert record["residency"]["freed"] == names


def test_encoders_stay_where_captions_are_encoded_live_or_sampled(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tiny_model_folder("sd15")
    pipe = load("sd15", folder)
    with caplog.at_level(logging.INFO, logger="te_align.train"):
        train(make_config("sd15", folder, squares_dataset, tmp_path / "s", train={"max_steps": 1},
                          data={"shuffle_tags": True}), pipeline=pipe)  # fmt: skip
    assert pipe.text_encoder is not None and pipe.vae is None
    assert "text encoders kept in memory: captions are encoded live every step: tags are shuffled" in caplog.text
    caplog.clear()
    pipe = load("sd15", folder)
    with caplog.at_level(logging.INFO, logger="te_align.train"):
        train(make_config("sd15", folder, squares_dataset, tmp_path / "p", train={"max_steps": 1},
                          sample={"prompts": ["a red square"], "steps": 1}), pipeline=pipe)  # fmt: skip
    assert pipe.text_encoder is not None and pipe.vae is not None
    assert "text encoders kept in memory after caching: sampling (sample.prompts) uses them on cpu" in caplog.text
    assert (tmp_path / "p" / "samples" / "step-00000001" / "00-seed0.png").is_file()


# -------------------------------------------------------------------------------------------- estimate
def test_real_size_configs_built_on_meta_have_the_published_parameter_counts() -> None:
    """FLUX.1-dev 11,901,408,320 (transformer) + T5-XXL encoder 4,762,310,656, SDXL UNet 2,567,463,684 + CLIP-G
    694,659,840: the published counts; SD3.5 Large: 8.06B ("8.1 billion parameters" in its model card)."""
    import te_align
    from te_align.train.estimate import build_meta, component_specs

    counts: dict[str, dict[str, int]] = {}
    for repo, profile in (("black-forest-labs/FLUX.1-dev", "flux-dev"), ("stabilityai/stable-diffusion-xl-base-1.0", "sdxl"),
                          ("stabilityai/stable-diffusion-3.5-large", "sd35-large")):  # fmt: skip
        cfg = config_from_dict({"model": {"path": repo, "profile": profile}, "data": {"path": "d"}})
        specs = component_specs(cfg, te_align.profile(profile))
        counts[repo] = {a: sum(p.numel() for p in build_meta(c, conf).parameters()) for a, (c, conf) in specs.items()}
    assert counts["black-forest-labs/FLUX.1-dev"] == {
        "transformer": 11_901_408_320, "vae": 83_819_683, "text_encoder": 123_060_480, "text_encoder_2": 4_762_310_656}
    sdxl = counts["stabilityai/stable-diffusion-xl-base-1.0"]
    assert sdxl["unet"] == 2_567_463_684 and sdxl["text_encoder_2"] == 694_659_840 and sdxl["vae"] == 83_653_863
    sd35 = counts["stabilityai/stable-diffusion-3.5-large"]
    assert sd35["transformer"] == 8_056_627_520 and sd35["text_encoder_3"] == 4_762_310_656
    assert sd35["text_encoder"] == 123_650_304 and sd35["text_encoder_2"] == 694_659_840


@pytest.mark.parametrize("quantize", ["none", "fp8"])
def test_estimated_weights_are_the_bytes_the_loaded_model_holds(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path, quantize: str
) -> None:
    import te_align
    from te_align.train.estimate import estimate
    from te_align.train.models import load_pipeline, prepare_frozen

    folder = tiny_model_folder("flux")
    cfg = make_config("flux", folder, squares_dataset, tmp_path / "o", train={"mixed_precision": "bf16"},
                      model={"quantize": quantize})  # fmt: skip
    est = estimate(cfg, device="cpu", options=False)
    profile = te_align.profile(PROFILES["flux"], **profile_overrides("flux"))
    pipe = load_pipeline(cfg.model, profile, dtype_name="bfloat16")
    prepare_frozen(cfg.model, profile, pipe, torch.device("cpu"), torch.bfloat16)
    held = {a: sum(p.numel() * p.element_size() for p in getattr(pipe, a).parameters())
            for a in ("transformer", "text_encoder", "text_encoder_2", "vae")}  # fmt: skip
    lines = {x.what.split(" ")[0]: x.bytes for x in est.lines_caching if x.what.endswith(("weights", ")")) and "weights" in x.what}
    assert lines == held
    assert est.params["transformer"] == sum(p.numel() for p in pipe.transformer.parameters())


def test_traced_activations_on_meta_equal_a_real_cpu_forward(tiny_model_folder: Callable[[str], Path]) -> None:
    """What the meta trace counts is what autograd keeps on a real CPU forward of the same denoiser with LoRA (CPU
    SDPA is a fused kernel too: it keeps q, k, v, output and log-sum-exp)."""
    from peft import LoraConfig

    import te_align
    from te_align.train.estimate import build_meta, saved_activations
    from te_align.train.models import FAMILIES, SD3_TARGETS, denoise

    folder = tiny_model_folder("sd3")
    conf = json.loads((folder / "transformer" / "config.json").read_text())
    meta = build_meta("SD3Transformer2DModel", conf)
    real = load("sd3", folder).transformer
    for m in (meta, real):
        m.requires_grad_(False)
        m.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=SD3_TARGETS))
        for n, p in m.named_parameters():
            if "lora_" in n:
                p.requires_grad_(True)
    family = FAMILIES["sd3"]
    del te_align
    traced = saved_activations(meta, family, batch=2, latent_hw=(8, 8), text_len=20, compute_dtype=torch.float32,
                               checkpointing=False)  # fmt: skip
    seen: dict[int, int] = {}
    keep: list[Any] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.nn.Parameter) or (t.requires_grad and t.is_leaf):
            return t
        base = t._base if t._base is not None else t
        if id(base) not in seen:
            seen[id(base)] = base.numel() * base.element_size()
            keep.append(base)
        return t

    cond = {"prompt_embeds": torch.randn(2, 20, conf["joint_attention_dim"]),
            "pooled_prompt_embeds": torch.randn(2, conf["pooled_projection_dim"])}  # fmt: skip
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = denoise(family, real, torch.randn(2, conf["in_channels"], 8, 8), torch.full((2,), 500.0), cond)
    assert traced == sum(seen.values()) + out.numel() * 4


def test_estimate_refuses_naming_the_settings_that_fit(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path
) -> None:
    from te_align.train.estimate import estimate, refusal

    cfg = make_config("sd3", tiny_model_folder("sd3"), squares_dataset, tmp_path / "o", data={"resolution": 128})
    full = estimate(cfg, device="cpu", options=True)
    assert set(full.options) == {"train.gradient_checkpointing = true", 'model.quantize = "fp8"',
                                 'model.quantize = "fp8" + gradient_checkpointing', 'train.mixed_precision = "bf16"',
                                 "train.batch_size = 1"}  # int8 / nf4 are offered on CUDA only  # fmt: skip
    best, (low, _) = min(full.options.items(), key=lambda x: x[1][0])
    assert low < full.peak("device")
    import dataclasses

    tight = dataclasses.replace(full, available=(low + full.peak("device")) // 2)
    assert not tight.fits
    line = refusal(tight)
    assert "\n" not in line and "these would fit: " in line and best in line
    assert "on cpu but" in line
    # the CLI: the report on stdout, the refusal as one line on stderr, exit 1; nothing is trained or written
    toml = tmp_path / "c.toml"
    toml.write_text(f'[model]\npath = "{tiny_model_folder("sd3")}"\nprofile = "{PROFILES["sd3"]}"\n[data]\npath = "{squares_dataset}"\nresolution = 64\n'
                    f'[output]\ndir = "{tmp_path / "cli"}"\n', encoding="utf-8")  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "te_align", "train", str(toml), "--estimate", "--memory", "0.01"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                                                              "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert "peak:" in out.stdout and "DOES NOT FIT" in out.stdout
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("te-align: the run needs about")
    assert not (tmp_path / "cli").exists()


def test_loading_phase_counts_the_file_of_the_largest_converted_component(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path
) -> None:
    """A component loaded in another dtype than its file's holds the memory-mapped file and the converted copy at
    once; the loading phase puts the largest such file on top of every component's weights as loaded."""
    from te_align.train.estimate import estimate, stored_bytes

    folder = tiny_model_folder("flux")  # saved in float32
    files = {a: sum(t.numel() * t.element_size() for f in (folder / a).glob("*.safetensors") for t in load_file(str(f)).values())
             for a in ("transformer", "vae", "text_encoder", "text_encoder_2")}  # fmt: skip
    assert {a: stored_bytes(folder / a) for a in files} == {a: {"float32": b} for a, b in files.items()}
    bf16 = estimate(make_config("flux", folder, squares_dataset, tmp_path / "o", train={"mixed_precision": "bf16"}),
                    device="cpu", options=False)  # fmt: skip
    mapped = [x for x in bf16.lines_loading if "file pages" in x.what]
    largest = max((a for a in files if a != "vae"), key=lambda a: files[a])  # the VAE loads in bfloat16 too, but is small
    assert [(x.what.split(" ")[0], x.bytes) for x in mapped] == [(largest, files[largest])]
    loaded = {x.what.split(" ")[0]: x.bytes for x in bf16.lines_loading if "(loaded in bfloat16)" in x.what}
    assert loaded == {x.what.split(" ")[0]: x.bytes for x in bf16.lines_caching if x.what.split(" ")[0] in files and "weights" in x.what}
    assert bf16.peak() == max(sum(x.bytes for x in lines) for lines in bf16.phases().values())
    # loaded in the files' own dtype: memory-mapped, no second copy
    fp32 = estimate(make_config("flux", folder, squares_dataset, tmp_path / "o", train={"mixed_precision": "no"}),
                    device="cpu", options=False)  # fmt: skip
    assert not [x for x in fp32.lines_loading if "file pages" in x.what]


_HEAP_PROBE = """
import os, sys, torch
from te_align.train.estimate import steady_cpu_heap
if sys.argv[1] == "steady":
    assert steady_cpu_heap()
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
big = torch.ones(2**22)  # 16 MiB mapped on its own; freeing it raises glibc's dynamic threshold to 16 MiB
del big
blocks = [torch.ones(2**19) for _ in range(64)]  # 64 x 2 MiB
before = rss()
del blocks[::2]  # 64 MiB freed in the middle of the heap
print(before - rss())
"""


def test_steady_cpu_heap_returns_freed_tensors_to_the_os() -> None:
    """With glibc's dynamic mmap threshold freed 2 MiB tensors stay resident (in the heap); with the trainer's
    fixed threshold each has its own mapping and the resident set drops by what was freed."""
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    freed = {}
    for mode in ("default", "steady"):
        out = subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        freed[mode] = int(out.stdout.split()[-1])
    assert freed["default"] < 8 * 2**20 and freed["steady"] >= 60 * 2**20, freed


_PEAK_PROBE = """
import json, resource, sys
import te_align.train.loop  # imported before the estimate reads the runtime's resident set, as a train run has it
from te_align.train import load_config, train
from te_align.train.estimate import estimate
cfg = load_config(sys.argv[1])
def peak():  # VmHWM: this process's own peak (ru_maxrss starts at the parent's resident set at the fork)
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
est = estimate(cfg, device="cpu", options=False)
train(cfg)
print(json.dumps({"estimate": est.peak(), "peak": peak(), "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def test_estimate_is_within_15_percent_of_the_measured_peak_on_cpu(
    tmp_path: Path, tiny_model_folder: Callable[[str], Path], squares_dataset: Path
) -> None:
    """The --estimate peak against the peak resident set of a fresh process training the tiny Flux model (float32
    files loaded in bfloat16); the medium size is benchmarks/speed/bench_train_scale.py's (numbers in its docstring)."""
    folder = tiny_model_folder("flux")
    toml = tmp_path / "c.toml"
    overrides = ", ".join(f'"{k}" = {json.dumps(v)}' for k, v in profile_overrides("flux").items())
    toml.write_text(f'[model]\npath = "{folder}"\nprofile = "{PROFILES["flux"]}"\nprofile_overrides = {{ {overrides} }}\n'
                    f'[data]\npath = "{squares_dataset}"\nresolution = 64\nbucket_step = 16\n'
                    f'[train]\nmax_steps = 2\nmixed_precision = "bf16"\ndevice = "cpu"\ncheckpoint_every = 0\n'
                    f'[output]\ndir = "{tmp_path / "o"}"\nkohya = false\n'
                    '[logging]\nprogress = false\ntensorboard = false\nloss_plot = false\n', encoding="utf-8")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", _PEAK_PROBE, str(toml)], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                              "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.85 <= got["estimate"] / got["peak"] <= 1.15, got
