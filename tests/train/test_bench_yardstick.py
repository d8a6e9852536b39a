"""benchmarks/yardstick/bench_yardstick.py: the te-align config it builds does the diffusers example script's work (checked
against the script's own ``parse_args`` when ``TE_ALIGN_DIFFUSERS_EXAMPLES_DIR`` is set), its TOML reads back as
the same config, and its torchvision stand-in is the script's alone and transforms as torchvision documents."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from te_align import _toml as tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "yardstick"))

import bench_yardstick as yard  # noqa: E402

ENV = "TE_ALIGN_DIFFUSERS_EXAMPLES_DIR"
ARGS = argparse.Namespace(resolution=64, batch=2, rank=8, steps=30)


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_config_toml_reads_back_and_validates(family, tmp_path):
    from te_align.train import load_config

    raw = yard.te_align_config(family, tmp_path / "model", tmp_path / "data", tmp_path / "out", ARGS)
    path = tmp_path / "train.toml"
    path.write_text(yard.toml_text(raw), encoding="utf-8")
    assert tomllib.loads(path.read_text(encoding="utf-8")) == raw
    cfg = load_config(path)
    assert (cfg.lora.rank, cfg.lora.alpha, cfg.train.batch_size, cfg.train.max_steps) == (8, 8.0, 2, 30)
    assert cfg.model.profile == {"sd3": "sd35-large", "flux": "flux-dev"}[family]
    assert cfg.model.profile_overrides["slots.t5.encoder.hidden_size"] == 96


def test_t5_length_is_the_profiles():
    assert yard.t5_length("sd3") == 256
    assert yard.t5_length("flux") == 512


def test_steps_per_s_leaves_out_the_warmup():
    assert yard.steps_per_s([1.0, 2.0, 2.5, 3.0, 3.5], warmup=1) == 4 / 2.5
    assert yard.steps_per_s([1.0, 2.0, 2.5, 3.0, 3.5], warmup=3) == 2 / 1.0
    assert yard.steps_per_s([1.0, 2.0], warmup=2) != yard.steps_per_s([1.0, 2.0], warmup=2)  # nan: nothing timed


def test_top_level_imports_are_the_unconditional_ones(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os, numpy.linalg\nfrom torchvision.transforms import functional\nfrom . import x\n"
                      "if cond:\n    import wandb\ndef f():\n    import prodigyopt\n", encoding="utf-8")  # fmt: skip
    assert yard.top_level_imports(script) == ["os", "numpy", "torchvision"]


def test_standin_is_given_to_the_script_only(tmp_path):
    """``from torchvision import transforms`` in code run with :func:`script_import` gets the stand-in; a library's
    availability check (``find_spec``) still finds no torchvision."""
    import builtins

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: the stand-in's isolation is only observable without it")
    scope = {"__builtins__": dict(vars(builtins), __import__=yard.script_import("yardstick_torchvision"))}
    exec("from torchvision import transforms\nfrom torchvision.transforms.functional import crop\n"
         "import torchvision.transforms\nimport json\nfound = __import__('importlib.util').util.find_spec('torchvision')",
         scope)  # fmt: skip
    assert scope["transforms"].__name__ == "yardstick_torchvision.transforms"
    assert scope["crop"].__module__ == "yardstick_torchvision.transforms.functional"
    assert scope["torchvision"].__name__ == "yardstick_torchvision"
    assert scope["json"] is sys.modules["json"]
    assert scope["found"] is None and "torchvision" not in sys.modules


def test_standin_transforms_values():
    import torch
    from PIL import Image
    from yardstick_torchvision import transforms
    from yardstick_torchvision.transforms.functional import crop

    img = Image.new("RGB", (6, 4))
    img.putpixel((5, 3), (255, 0, 51))
    t = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5], [0.5])])(img)
    assert t.shape == (3, 4, 6) and t.dtype == torch.float32
    assert t[:, 3, 5].tolist() == [1.0, -1.0, pytest.approx(51 / 255 * 2 - 1)]
    assert t[:, 0, 0].tolist() == [-1.0, -1.0, -1.0]
    assert transforms.Resize(2, interpolation=transforms.InterpolationMode.BILINEAR)(img).size == (3, 2)
    assert transforms.Resize(4)(img) is img
    assert transforms.CenterCrop(4)(img).size == (4, 4)
    assert crop(img, 1, 2, 3, 4).getpixel((3, 2)) == (255, 0, 51)
    torch.manual_seed(0)
    for _ in range(20):
        top, left, h, w = transforms.RandomCrop(3).get_params(img, (3, 3))
        assert (h, w) == (3, 3) and 0 <= top <= 1 and 0 <= left <= 3
    assert transforms.RandomCrop(3).get_params(img, (4, 6)) == (0, 0, 4, 6)
    assert transforms.RandomHorizontalFlip(p=1.0)(img).getpixel((0, 3)) == (255, 0, 51)


def _script_args(family: str, tmp_path: Path):
    from te_align.probe import _stubs
    from te_align.trainers.diffusers_examples.probe import OPTIONAL_IMPORTS, load_script

    folder = yard.examples_dir(os.environ.get(ENV))
    if folder is None:
        pytest.skip(f"{ENV} is not set to a huggingface/diffusers checkout with examples/dreambooth")
    argv = yard.script_argv(family, tmp_path / "model", tmp_path / "images", tmp_path / "out", ARGS)
    with _stubs.sandbox([folder]), _stubs.stub_missing(OPTIONAL_IMPORTS, [folder]):
        module = load_script(folder.parent, "dreambooth", yard.SCRIPTS[family])
        return module.parse_args(argv)


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_script_and_config_do_the_same_work(family, tmp_path):
    """The script's own parse_args on the benchmark's command line against the te-align config: every setting
    that changes the work of a step or of the run."""
    from te_align.train import config_from_dict

    got = _script_args(family, tmp_path)
    cfg = config_from_dict(yard.te_align_config(family, tmp_path / "model", tmp_path / "data", tmp_path / "out", ARGS))
    t = cfg.train
    assert got.rank == cfg.lora.rank == 8 and cfg.lora.alpha == 8.0  # the scripts set lora_alpha = rank
    assert got.train_batch_size == t.batch_size and got.gradient_accumulation_steps == t.gradient_accumulation == 1
    assert got.max_train_steps == t.max_steps and got.resolution == cfg.data.resolution
    assert got.learning_rate == t.learning_rate and got.lr_scheduler == t.lr_scheduler and got.lr_warmup_steps >= 0
    assert got.optimizer.lower() == t.optimizer and not got.use_8bit_adam
    assert (got.adam_beta1, got.adam_beta2, got.adam_epsilon) == (t.adam_beta1, t.adam_beta2, t.adam_epsilon)
    assert got.adam_weight_decay == t.weight_decay and got.max_grad_norm == t.max_grad_norm
    assert got.mixed_precision == t.mixed_precision == "no" and cfg.model.dtype == "float32"
    assert got.seed == t.seed and got.max_sequence_length == yard.t5_length(family)
    assert got.cache_latents and cfg.data.cache_latents and cfg.data.latent_sample == "sample"
    assert got.weighting_scheme == "logit_normal" and (got.logit_mean, got.logit_std) == (0.0, 1.0) and t.flow_shift == 0
    assert not got.train_text_encoder and not cfg.lora.text_encoders
    assert not got.with_prior_preservation and got.validation_prompt is None and not cfg.sample.prompts
    assert got.checkpointing_steps > got.max_train_steps and t.checkpoint_every == 0
    assert not got.gradient_checkpointing and not t.gradient_checkpointing
    assert not got.random_flip and not cfg.data.random_flip and got.repeats == cfg.data.repeats == 1
    assert got.report_to == "tensorboard" and cfg.logging.tensorboard and cfg.logging.every == 1
    assert got.lora_layers is None and not cfg.lora.target_modules  # both: the scripts' default attention targets
    if family == "flux":  # the Flux script has its own --lora_alpha (default 4); SD3's is the rank
        assert got.guidance_scale == t.guidance == 1.0 and got.lora_alpha == cfg.lora.alpha


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_script_default_lora_targets_are_te_aligns(family):
    """The lists the scripts' main() assigns to ``target_modules`` without --lora_layers, read from their source."""
    import ast

    from te_align.train.models import FAMILIES

    folder = yard.examples_dir(os.environ.get(ENV))
    if folder is None:
        pytest.skip(f"{ENV} is not set to a huggingface/diffusers checkout with examples/dreambooth")
    tree = ast.parse((folder / yard.SCRIPTS[family]).read_text(encoding="utf-8"))
    lists = [[e.value for e in node.value.elts] for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and node.value.elts
             and all(isinstance(e, ast.Constant) for e in node.value.elts)
             and any(isinstance(x, ast.Name) and x.id == "target_modules" for x in node.targets)]  # fmt: skip
    assert len(lists) == 1
    assert sorted(lists[0]) == sorted(FAMILIES[family].default_targets)
