"""``te-align swap`` on the tiny SD 1.5 pipeline with a tiny T5 (real diffusers / transformers classes, CPU, no network)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import te_align
from te_align.cli import main
from te_align.swap import PROFILE_FILE, SwapError, swap
from te_align.tiny.fit import profile_overrides

SEED = 3
CAPTIONS = ["a red square", "two blue circles on a grey field", "", "a small green triangle at the top left"]


@pytest.fixture(scope="module")
def base(tiny_model_folder: Callable[[str], Path]) -> Path:
    return tiny_model_folder("sd15")


def _t5(vocab_size: int | None = None) -> tuple[Any, Any]:
    from te_align.tiny import tokenizers
    from te_align.tiny.encoders import t5_encoder_model

    tok = tokenizers.t5_tokenizer()
    return tok, t5_encoder_model(vocab_size or (len(tok) + 127) // 128 * 128)


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("t5") / "t5"
    tok, enc = _t5()
    enc.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def swapped(base: Path, t5_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    out = tmp_path_factory.mktemp("swap") / "sd15-t5"
    report, _ = swap(str(base), str(t5_dir), str(out), profile="sd15", profile_overrides=profile_overrides("sd15"),
                     captions=CAPTIONS, reset="cross", shift=True, seed=SEED)  # fmt: skip
    return report, out


def _pipe(folder: Path) -> Any:
    import diffusers

    import te_align.encoding.projected  # noqa: F401  (the swapped text encoder's class)

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ------------------------------------------------------------------------------------------ statistics
def test_measured_statistics_match_after_scaling(swapped: tuple[Any, Path], base: Path) -> None:
    from te_align.swap.measure import measure

    report, out = swapped
    # the target is the base model's conditioning over all 77 positions (SD 1.5's UNet gets no mask)
    base_pipe = _pipe(base)
    base_profile = te_align.profile("sd15", **profile_overrides("sd15"))
    target = measure(base_profile, CAPTIONS, pipeline=base_pipe)
    assert torch.equal(target.mean, report.target.mean) and torch.equal(target.std, report.target.std)
    assert target.positions == 77 * len(CAPTIONS)
    assert abs(float(report.before.std[0]) - float(target.std[0])) > 0.1  # the unscaled T5 is off
    # measured again on the written folder, the new conditioning has the target's statistics
    new = measure(te_align.profile(str(out)), CAPTIONS, pipeline=_pipe(out))
    assert float(new.std[0]) == pytest.approx(float(target.std[0]), rel=1e-6, abs=0)
    assert float(new.mean[0]) == pytest.approx(float(target.mean[0]), abs=1e-6)
    assert report.scale[0] == pytest.approx(float(target.std[0] / report.before.std[0]), rel=1e-12)


def test_channel_statistics_match_per_channel(base: Path, t5_dir: Path) -> None:
    report, _ = swap(str(base), str(t5_dir), None, profile="sd15", profile_overrides=profile_overrides("sd15"),
                     captions=CAPTIONS, reset="none", stats="channel", shift=True, seed=SEED)  # fmt: skip
    assert report.target.std.shape == (32,) and len(set(report.scale)) == 32
    torch.testing.assert_close(report.after.std, report.target.std, rtol=1e-6, atol=0)
    torch.testing.assert_close(report.after.mean, report.target.mean, rtol=0, atol=1e-6)
    assert report.reset_layers == []


def test_measured_positions_follow_the_mask_the_denoiser_gets() -> None:
    from te_align.swap.measure import attended_mask_output

    assert attended_mask_output(te_align.profile("sd15"), "prompt_embeds") is None  # the UNet sees every position
    assert attended_mask_output(te_align.profile("chroma"), "prompt_embeds") == "prompt_attention_mask"
    hunyuan = te_align.profile("hunyuanimage-2.1")
    assert attended_mask_output(hunyuan, "prompt_embeds") == "prompt_embeds_mask"
    assert attended_mask_output(hunyuan, "prompt_embeds_2") == "prompt_embeds_mask_2"


# ------------------------------------------------------------------------------------------ the folder
def test_swapped_folder_encodes_the_projection_of_t5_exactly(swapped: tuple[Any, Path], t5_dir: Path) -> None:
    import transformers

    report, out = swapped
    profile = te_align.profile(str(out))
    assert profile.name == "sd15-t5-swap" and profile.slot_names == ("t5",)
    slot = profile.slot("t5")
    assert (slot.encoder.cls, slot.encoder.hidden_size, slot.tokenizer.max_length) == ("ProjectedTextEncoder", 32, 77)
    assert profile.outputs == (("prompt_embeds", "t5.hidden"),)
    assert "replaced by" in profile.provenance_of("slots.t5").note
    note = profile.provenance_of("slots.t5.encoder").note
    assert note.startswith(f"output scale {report.scale[0]:.6g}, shift {report.shift[0]:.6g}: measured global statistics")
    assert f"over {77 * len(CAPTIONS)} attended positions" in note and profile.fingerprint() == report.profile.fingerprint()
    pipe = _pipe(out)
    cond = te_align.encode(profile, CAPTIONS, pipeline=pipe)

    t5 = transformers.T5EncoderModel.from_pretrained(str(t5_dir)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(t5_dir))
    ids = tok(CAPTIONS, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
    weights = load_file(str(out / "text_encoder" / "model.safetensors"))
    inner = pipe.text_encoder.encoder.state_dict()
    for name, tensor in t5.state_dict().items():  # the inner T5 is the given one, bit for bit
        assert torch.equal(inner[name], tensor), name
    with torch.no_grad():
        hidden = t5(input_ids=ids).last_hidden_state
        expected = torch.nn.functional.linear(hidden, weights["projection.weight"], weights["projection.bias"])
        expected = expected * torch.tensor(report.scale[0]) + torch.tensor(report.shift[0])
        assert torch.equal(cond["prompt_embeds"], expected)
        # and the stock diffusers pipeline encodes the same tensors
        embeds, _ = pipe.encode_prompt(CAPTIONS, "cpu", 1, False)
    assert torch.equal(embeds, cond["prompt_embeds"])
    assert torch.equal(weights["output_scale"], torch.full((32,), report.scale[0], dtype=torch.float32))
    record = json.loads((out / "te_align_swap.json").read_text(encoding="utf-8"))
    assert record["reset"] == "cross" and record["base_profile"] == "sd15" and record["captions"] == len(CAPTIONS)


def test_reset_layers_are_their_own_fresh_init_and_the_rest_is_byte_identical(swapped: tuple[Any, Path], base: Path) -> None:
    report, out = swapped
    old = load_file(str(base / "unet" / "diffusion_pytorch_model.safetensors"))
    new = load_file(str(out / "unet" / "diffusion_pytorch_model.safetensors"))
    assert old.keys() == new.keys()
    assert len(report.reset_layers) == 4 * 4 and all(".attn2." in n for n in report.reset_layers)
    reset = {f"{n}.{p}" for n in report.reset_layers for p in ("weight", "bias")}
    for key in old:
        if key not in reset:
            assert old[key].dtype == new[key].dtype and torch.equal(old[key], new[key]), key
    # the documented draws: manual_seed(seed), the projection (nn.Linear's init, bias zeroed), then each
    # reset layer in named_modules() order by its own init
    weights = load_file(str(out / "text_encoder" / "model.safetensors"))
    torch.manual_seed(SEED)
    projection = torch.nn.Linear(96, 32)
    assert torch.equal(weights["projection.weight"], projection.weight.detach())
    assert not weights["projection.bias"].any()
    for name in report.reset_layers:
        w = new[f"{name}.weight"]
        fresh = torch.nn.Linear(w.shape[1], w.shape[0], bias=f"{name}.bias" in new)
        assert torch.equal(w, fresh.weight.detach()), name
        assert not torch.equal(w, old[f"{name}.weight"])
        if fresh.bias is not None:
            assert torch.equal(new[f"{name}.bias"], fresh.bias.detach()), name
    for part in ("vae/diffusion_pytorch_model.safetensors",):
        a, b = load_file(str(base / part)), load_file(str(out / part))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("mode", "count", "pattern"), [("qk", 8, (".attn2.to_q", ".attn2.to_k")), ("all", 32, (".attn",))])
def test_reset_modes_pick_their_layers(base: Path, t5_dir: Path, mode: str, count: int, pattern: tuple[str, ...]) -> None:
    report, _ = swap(str(base), str(t5_dir), None, profile="sd15", profile_overrides=profile_overrides("sd15"),
                     captions=CAPTIONS[:1], reset=mode, seed=SEED)  # fmt: skip
    assert len(report.reset_layers) == count
    assert all(any(p in n for p in pattern) for n in report.reset_layers)


# ------------------------------------------------------------------------------------------ CLI
def _overrides() -> list[str]:
    return [f"--override={k}={v}" for k, v in profile_overrides("sd15").items()]


def test_cli_prints_the_statistics_before_and_after(base: Path, t5_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    captions = tmp_path / "captions.txt"
    captions.write_text("\n".join(CAPTIONS[:2]) + "\n", encoding="utf-8")
    out = tmp_path / "new"
    rc = main(["swap", str(base), "--encoder", str(t5_dir), "--out", str(out), "--profile", "sd15", *_overrides(),
               "--captions", str(captions), "--reset", "qk"])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "base model" in text and "before scaling" in text and "after scaling" in text
    assert "reset qk: 8 layers" in text and "154 positions of 2 captions" in text
    assert (out / PROFILE_FILE).is_file() and (out / "model_index.json").is_file()
    rc = main(["profile", "build", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"te-align: error: {out}: a model folder that carries its own profile (te_align_profile.toml, "
                               "written by te-align swap); te-align profile show reads it\n")  # fmt: skip


def test_report_measures_and_cites_the_study_and_writes_nothing(base: Path, t5_dir: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from te_align.swap.study import report_lines, summary

    captions = tmp_path / "captions.txt"
    captions.write_text("\n".join(CAPTIONS[:2]) + "\n", encoding="utf-8")
    before = sorted(tmp_path.rglob("*"))
    args = ["swap", str(base), "--encoder", str(t5_dir), "--report", "--profile", "sd15", *_overrides(),
            "--captions", str(captions)]  # fmt: skip
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["study"] == summary() and data["measured"]["out"] is None
    std = data["measured"]["target"]["std"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{base} (nothing written): ") and "base model" in text
    assert text.endswith("\n".join(report_lines(summary(), base_std=std)) + "\n")
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    err = _bad([*args[1:], "--out", str(tmp_path / "new")], capsys)
    assert "key '--out': --report writes nothing; leave out --out" in err
    err = _bad(args[1:4], capsys)
    assert "key '--out': give --out (the new model folder to write) or --report (measure and print only)" in err


@pytest.mark.parametrize("quiet", ["1", "0"])
def test_swap_hides_library_bars_only_when_quiet_and_leaves_them_as_they_were(
        quiet: str, base: Path, t5_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """diffusers' and transformers' loading bars are off while `te-align swap` runs, as in every command that loads a
    model (te_align/_quiet.py); TE_ALIGN_QUIET=0 shows them; either way the libraries' switches are back as they were."""
    import diffusers
    import transformers

    libs = (diffusers.utils.logging, transformers.utils.logging)
    monkeypatch.setenv("TE_ALIGN_QUIET", quiet)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    captions = tmp_path / "captions.txt"
    captions.write_text(CAPTIONS[0] + "\n", encoding="utf-8")
    for lib in libs:
        lib.enable_progress_bar()
    try:
        rc = main(["swap", str(base), "--encoder", str(t5_dir), "--report", "--profile", "sd15", *_overrides(),
                   "--captions", str(captions)])  # fmt: skip
        err = capsys.readouterr().err
        assert rc == 0, err
        assert [lib.is_progress_bar_enabled() for lib in libs] == [True, True]
        assert ("Loading pipeline components" in err) is (quiet == "0"), err
        assert (err == "") is (quiet == "1"), err
    finally:
        for lib in libs:
            lib.enable_progress_bar()


# ------------------------------------------------------------------------------------------ bad input
def _bad(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(["swap", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("te-align: error: "), err
    return err


def test_bad_input_is_one_line_each(base: Path, t5_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new"
    common = [str(base), "--encoder", str(t5_dir), "--profile", "sd15", "--captions", str(tmp_path / "c.txt")]
    (tmp_path / "c.txt").write_text("a red square\n", encoding="utf-8")
    err = _bad([*common, *_overrides(), "--out", str(out), "--reset", "crosss"], capsys)
    assert "key '--reset': unknown reset mode 'crosss'; expected one of none, cross, qk, all (did you mean: cross?)" in err
    err = _bad([*common, *_overrides(), "--out", str(out), "--stats", "pixel"], capsys)
    assert "key '--stats': unknown statistics mode 'pixel'; expected one of global, channel" in err
    (tmp_path / "exists").mkdir()
    err = _bad([*common, *_overrides(), "--out", str(tmp_path / "exists")], capsys)
    assert f"{tmp_path / 'exists'}: the output folder already exists" in err
    # the bundled sd15 profile says CLIP-L is 768 wide; the tiny UNet attends to 32
    err = _bad([*common, "--out", str(out)], capsys)
    assert "unet/config.json: key 'cross_attention_dim': the unet attends to width 32 but profile 'sd15' slot 'clip_l' gives 768" in err
    # a projection to start from of the wrong shape
    save_file({"weight": torch.zeros(32, 5), "bias": torch.zeros(32)}, str(tmp_path / "proj.safetensors"))
    err = _bad([*common, *_overrides(), "--out", str(out), "--projection", str(tmp_path / "proj.safetensors")], capsys)
    assert ("proj.safetensors: key 'weight': the projection weight has shape (32, 5) but the new encoder's width is 96 "
            "and the denoiser attends to 32: expected (32, 96)") in err  # fmt: skip
    # a tokenizer that does not fit the encoder: more tokens than its embedding table has rows
    small = tmp_path / "small-t5"
    tok, enc = _t5(vocab_size=64)
    enc.save_pretrained(str(small))
    capsys.readouterr()  # this test's own save shows transformers' bar (swap leaves the bars as it found them)
    err = _bad([str(base), "--encoder", str(small), "--tokenizer", str(t5_dir), "--profile", "sd15", *_overrides(),
                "--out", str(out)], capsys)  # fmt: skip
    assert f"{t5_dir}: key 'vocab_size': the tokenizer has {len(tok)} tokens but the encoder's vocab_size is 64" in err
    err = _bad([str(base), "--encoder", str(tmp_path / "nope"), "--profile", "sd15", *_overrides(), "--out", str(out)], capsys)
    assert "key '--encoder': expected a transformers text-encoder folder" in err
    # a prompt length past an encoder's absolute positions (a CLIP encoder has 77)
    from te_align.tiny.encoders import family_components

    clip = tmp_path / "clip"
    parts = family_components("sd15")
    parts["text_encoder"].save_pretrained(str(clip))
    parts["tokenizer"].save_pretrained(str(clip))
    capsys.readouterr()
    err = _bad([str(base), "--encoder", str(clip), "--profile", "sd15", *_overrides(), "--out", str(out), "--max-length",
                "100"], capsys)  # fmt: skip
    assert (f"{clip}/config.json: key 'max_position_embeddings': the new slot pads prompts to 100 tokens but the encoder "
            "has 77 positions (max_position_embeddings); expected --max-length <= 77") in err  # fmt: skip
    assert not out.exists()
    from te_align.commands.swap import RESET_CHOICES
    from te_align.swap import RESET_MODES

    assert RESET_CHOICES == RESET_MODES  # the CLI's copy (kept torch-free) of the modes


@pytest.mark.parametrize("fault_at", [1, 2, 4, 5])
def test_a_failed_write_leaves_no_folder(base: Path, t5_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         fault_at: int) -> None:  # fmt: skip
    from te_align._atomic import reset_fault_counter

    out = tmp_path / "new"
    monkeypatch.setenv("TE_ALIGN_FAULT_AT", str(fault_at))
    monkeypatch.setenv("TE_ALIGN_FAULT_MODE", "enospc")
    reset_fault_counter()
    with pytest.raises(SwapError, match=r"new: cannot write the swapped model: No space left on device; nothing was written"):
        swap(str(base), str(t5_dir), str(out), profile="sd15", profile_overrides=profile_overrides("sd15"),
             captions=CAPTIONS[:1], reset="cross", seed=SEED)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the folder nor its temporary folder


def test_a_killed_swap_leaves_no_folder_under_the_target_name(base: Path, t5_dir: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    out = tmp_path / "new"
    env = dict(os.environ, TE_ALIGN_FAULT_AT="3", TE_ALIGN_FAULT_MODE="kill", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "te_align", "swap", str(base), "--encoder", str(t5_dir), "--out", str(out),
                           "--profile", "sd15", *_overrides()], capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == -9, proc.stderr  # killed after the model files were written, before the rename
    assert not out.exists()
    (left,) = tmp_path.iterdir()  # the hidden temporary folder, never the target
    assert left.name.startswith(".new.swap-") and (left / "model_index.json").is_file()


# ------------------------------------------------------------------------------------------ training
def test_train_swapped_model_trains_the_projection_and_lora_only(swapped: tuple[Any, Path], squares_dataset: Path,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    from te_align.train import config_from_dict, train

    _, out = swapped
    cfg = config_from_dict({
        "model": {"path": str(out)},
        "data": {"path": str(squares_dataset), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "projection_lr": 1e-2, "checkpoint_every": 0, "batch_size": 2},
        "output": {"dir": str(tmp_path / "o"), "kohya": False},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    })  # fmt: skip
    pipe = _pipe(out)
    before = {k: v.detach().clone() for k, v in pipe.text_encoder.state_dict().items()}
    unet_before = {k: v.detach().clone() for k, v in pipe.unet.state_dict().items()}
    result = train(cfg, pipeline=pipe)
    assert result.profile_name == "sd15-t5-swap" and result.steps == 2
    after = pipe.text_encoder.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"projection.weight", "projection.bias"}
    unet_changed = {k for k, v in pipe.unet.state_dict().items() if k in unet_before and not torch.equal(unet_before[k], v)}
    assert unet_changed == set()  # the UNet's own weights: only its LoRA layers train
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in pipe.unet.state_dict().items())
    from te_align.metadata import read

    assert read(tmp_path / "o" / "lora_projection.safetensors")["te_align"]["te_align.profile"] == "sd15-t5-swap"
    saved = load_file(str(tmp_path / "o" / "lora_projection.safetensors"))
    assert torch.equal(saved["text_encoder.projection.weight"], after["projection.weight"])

    stamp = read(tmp_path / "o" / "lora.safetensors")["te_align"]
    assert stamp["te_align.profile"] == "sd15-t5-swap" and stamp["te_align.slots"] == "t5"
    assert stamp["te_align.fingerprint"] == te_align.profile(str(out)).fingerprint()
    record = json.loads((tmp_path / "o" / "train_config.json").read_text(encoding="utf-8"))
    assert record["config"]["train"]["projection_lr"] == 1e-2
    # the caption cache holds the T5 output before the projection, keyed by the swapped profile
    from te_align.metadata import read_header

    entries = sorted((tmp_path / "o" / "cache" / "text").rglob("*.safetensors"))
    captions = {p.read_text(encoding="utf-8") for p in squares_dataset.glob("*.txt")}
    assert len(entries) == len(captions) == 3  # one entry per distinct caption
    for entry in entries:
        head = read_header(entry)
        assert head.metadata["te_align.profile"] == "sd15-t5-swap"
        assert head.metadata["te_align.fingerprint"] == te_align.profile(str(out)).fingerprint()
        assert json.loads(head.metadata["te_align.options"])["stage"] == "before-projection"
        assert tuple(head.tensors["prompt_embeds"].shape) == (1, 77, 96)


@pytest.mark.parametrize("cache_text", [True, False])
def test_projection_over_cached_t5_output_equals_encoding_through_the_whole_encoder(
    swapped: tuple[Any, Path], squares_dataset: Path, tmp_path: Path, cache_text: bool
) -> None:
    from te_align.train import config_from_dict
    from te_align.train.swap import projection_models, text_source
    from te_align.train.text import TextSource

    _, out = swapped
    cfg = config_from_dict({"model": {"path": str(out)}, "data": {"path": str(squares_dataset), "cache_text": cache_text},
                            "output": {"dir": str(tmp_path)}})  # fmt: skip
    profile = te_align.profile(str(out))
    pipe = _pipe(out)
    models = projection_models(profile, pipe)
    source = text_source(cfg, profile, pipe, models, torch.device("cpu"), torch.float32, cache_dir=tmp_path / "text",
                         writer=True, base=TextSource)  # fmt: skip
    assert type(source).__name__ == "ProjectedTextSource" and source.trainable and source.use_cache == cache_text
    source.precache(CAPTIONS)
    cond = source.batch(CAPTIONS, torch.Generator().manual_seed(0))
    assert cond["prompt_embeds"].requires_grad  # the projection gets gradients
    with torch.no_grad():
        whole = te_align.encode(profile, CAPTIONS, pipeline=pipe)
    torch.testing.assert_close(cond["prompt_embeds"].detach(), whole["prompt_embeds"], rtol=0, atol=0)
    assert cond.fingerprint == profile.fingerprint()


def test_resumed_swap_training_equals_an_uninterrupted_run(swapped: tuple[Any, Path], squares_dataset: Path,
                                                           tmp_path: Path) -> None:  # fmt: skip
    from te_align.train import config_from_dict, train

    _, out = swapped

    def config(name: str) -> Any:
        return config_from_dict({
            "model": {"path": str(out)},
            "data": {"path": str(squares_dataset), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64,
                     "caption_dropout": 0.3},
            "train": {"max_steps": 4, "learning_rate": 1e-3, "projection_lr": 3e-3, "checkpoint_every": 2, "batch_size": 2},
            "output": {"dir": str(tmp_path / name), "kohya": False},
            "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
        })  # fmt: skip

    full = train(config("full"))
    stopped = train(config("part"), stop_after=3)
    assert stopped.steps == 3
    resumed = train(config("part"), resume=True)
    assert resumed.losses == full.losses
    for name in ("lora.safetensors", "lora_projection.safetensors"):
        a, b = load_file(str(tmp_path / "full" / name)), load_file(str(tmp_path / "part" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    from te_align.train.checkpoint import load_checkpoint

    state = load_checkpoint(resumed.last_checkpoint)
    assert {"text_encoder.projection.weight", "text_encoder.projection.bias"} <= set(state["params"])
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == [1e-3, 3e-3]  # per-group learning rates


def test_in_memory_swap_of_a_loaded_pipeline_for_benchmarks() -> None:
    """The API a benchmark calls: a loaded pipeline and encoder objects in, the swapped pipeline out, nothing written."""
    from te_align.tiny.pipelines import build_pipeline

    tok, enc = _t5()
    pipe = build_pipeline("sd15")
    profile = te_align.profile("sd15", **profile_overrides("sd15"))
    report, new = swap(None, enc, None, tokenizer=tok, pipeline=pipe, profile=profile, captions=CAPTIONS, reset="all",
                       seed=SEED)  # fmt: skip
    assert new is pipe and type(pipe.text_encoder).__name__ == "ProjectedTextEncoder" and pipe.tokenizer is tok
    assert len(report.reset_layers) == 32
    cond = te_align.encode(report.profile, CAPTIONS[:1], pipeline=pipe)
    assert cond["prompt_embeds"].shape == (1, 77, 32)
    with pytest.raises(SwapError, match=r"key '--base': give a base model, or an already loaded pipeline with its profile"):
        swap(None, enc, None, tokenizer=tok, pipeline=pipe)

    # with the mask into the new encoder: the profile and the diffusers pipeline (config.use_attention_mask) agree
    pipe = build_pipeline("sd15")
    report, _ = swap(None, enc, None, tokenizer=tok, pipeline=pipe, profile=profile, captions=CAPTIONS, reset="none",
                     encoder_mask=True)  # fmt: skip
    assert report.profile.slot("t5").masks.encoder and pipe.text_encoder.config.use_attention_mask
    with torch.no_grad():
        embeds, _ = pipe.encode_prompt(CAPTIONS, "cpu", 1, False)
    masked = te_align.encode(report.profile, CAPTIONS, pipeline=pipe)["prompt_embeds"]
    unmasked = te_align.encode(report.profile.with_overrides({"slots.t5.masks.encoder": False}), CAPTIONS,
                               pipeline=pipe)["prompt_embeds"]  # fmt: skip
    assert torch.equal(embeds, masked) and not torch.equal(masked, unmasked)


def test_full_modules_train_the_reset_cross_attention_in_full(swapped: tuple[Any, Path], squares_dataset: Path,
                                                              tmp_path: Path) -> None:  # fmt: skip
    from te_align.train import TrainError, config_from_dict, train
    from te_align.train.checkpoint import load_checkpoint

    report, out = swapped
    raw: dict[str, Any] = {
        "model": {"path": str(out)},
        "data": {"path": str(squares_dataset), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "projection_lr": 1e-2, "full_modules": [r"\.attn2\."],
                  "full_lr": 1e-5, "checkpoint_every": 1, "batch_size": 2},
        "output": {"dir": str(tmp_path / "o"), "kohya": False},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    }  # fmt: skip
    pipe = _pipe(out)
    unet_before = {k: v.detach().clone() for k, v in pipe.unet.state_dict().items()}
    result = train(config_from_dict(raw), pipeline=pipe)
    now = {k.replace(".base_layer.", "."): v for k, v in pipe.unet.state_dict().items() if "lora_" not in k}
    changed = {k for k in unet_before if not torch.equal(unet_before[k], now[k])}
    assert changed == {f"{n}.{p}" for n in report.reset_layers for p in ("weight", "bias") if f"{n}.{p}" in unet_before}
    saved = load_file(str(tmp_path / "o" / "lora_full.safetensors"))
    assert set(saved) == {f"unet.{k}" for k in changed}
    assert all(torch.equal(saved[f"unet.{k}"], now[k]) for k in changed)
    state = load_checkpoint(result.last_checkpoint)
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == [1e-3, 1e-2, 1e-5]  # LoRA, projection, full
    with pytest.raises(TrainError, match=r"key 'train.full_modules\[0\]': not a regular expression"):
        config_from_dict({**raw, "train": {"full_modules": ["attn2("]}})


def test_lora_on_the_new_encoder_trains_with_the_projection(swapped: tuple[Any, Path], squares_dataset: Path,
                                                            tmp_path: Path) -> None:  # fmt: skip
    from te_align.train import config_from_dict, train

    _, out = swapped
    cfg = config_from_dict({
        "model": {"path": str(out)},
        "data": {"path": str(squares_dataset), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "lora": {"text_encoders": ["t5"], "text_encoder_rank": 2},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "text_encoder_lr": 1e-3, "checkpoint_every": 0, "batch_size": 2},
        "output": {"dir": str(tmp_path / "o")},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    })  # fmt: skip
    pipe = _pipe(out)
    inner_before = {k: v.detach().clone() for k, v in pipe.text_encoder.encoder.state_dict().items()}
    proj_before = pipe.text_encoder.projection.weight.detach().clone()
    result = train(cfg, pipeline=pipe)
    assert result.steps == 2
    inner_now = {k.replace(".base_layer.", "."): v for k, v in pipe.text_encoder.encoder.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(inner_before[k], inner_now[k]) for k in inner_before)  # the T5 itself stays frozen
    lora = {k: v for k, v in pipe.text_encoder.state_dict().items() if "lora_B" in k}
    assert lora and all(".SelfAttention." in k for k in lora) and any(v.abs().sum() > 0 for v in lora.values())
    assert not torch.equal(proj_before, pipe.text_encoder.projection.weight)
    saved = load_file(str(tmp_path / "o" / "lora.safetensors"))
    assert any(k.startswith("text_encoder.") and ".SelfAttention.q." in k for k in saved)
    assert not (tmp_path / "o" / "cache" / "text").exists() or not any((tmp_path / "o" / "cache" / "text").rglob("*.safetensors"))


def test_single_file_base_with_its_configs(base: Path, t5_dir: Path, tmp_path: Path) -> None:
    from tests.train.test_train_export import ldm_unet_state

    source = _pipe(base)
    ckpt = tmp_path / "tiny-sd15-unet.safetensors"
    save_file(ldm_unet_state(source.unet), str(ckpt))
    report, _ = swap(str(ckpt), str(t5_dir), str(tmp_path / "new"), config=str(base), profile="sd15",
                     profile_overrides=profile_overrides("sd15"), captions=CAPTIONS[:2], reset="none")  # fmt: skip
    assert report.reset_layers == []
    want = source.unet.state_dict()
    got = load_file(str(tmp_path / "new" / "unet" / "diffusion_pytorch_model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert te_align.profile(str(tmp_path / "new")).name == "sd15-t5-swap"


def test_load_text_encoders_and_the_embedding_cache_work_on_the_swapped_folder(swapped: tuple[Any, Path],
                                                                               tmp_path: Path) -> None:  # fmt: skip
    from te_align.encoding.cache.keys import hash_text_encoders
    from te_align.encoding.cache.store import EmbeddingCache
    from te_align.encoding.loading import load_text_encoders

    _, out = swapped
    profile = te_align.profile(str(out))
    tokenizers, encoders = load_text_encoders(profile, out)
    assert type(encoders["t5"]).__name__ == "ProjectedTextEncoder"
    direct = te_align.encode(profile, CAPTIONS, tokenizers=tokenizers, text_encoders=encoders)
    cache = EmbeddingCache(tmp_path / "cache", profile, hash_text_encoders(encoders, tokenizers))
    first = cache.get_or_encode(CAPTIONS, lambda caps: te_align.encode(profile, caps, tokenizers=tokenizers,
                                                                          text_encoders=encoders))  # fmt: skip
    again = EmbeddingCache(tmp_path / "cache", profile, hash_text_encoders(encoders, tokenizers)).get_or_encode(
        CAPTIONS, lambda caps: pytest.fail("every caption is cached"))
    for i in range(len(CAPTIONS)):
        assert torch.equal(first[i]["prompt_embeds"][0], direct["prompt_embeds"][i])
        assert torch.equal(again[i]["prompt_embeds"], first[i]["prompt_embeds"])


def test_sd2_is_a_table_row_not_a_copy() -> None:
    """SD 2 (CLIP-H, width 40 in the tiny set) swaps through the same code as SD 1.5: only its FAMILIES row differs."""
    import diffusers

    from te_align.swap.families import FAMILIES
    from te_align.tiny.encoders import family_components
    from te_align.tiny.pipelines import tiny_unet, tiny_vae

    assert FAMILIES["sd2"].slot == "clip_h" and FAMILIES["sd2"].reset is FAMILIES["sd1"].reset
    unet = diffusers.UNet2DConditionModel.from_config({**tiny_unet().config, "cross_attention_dim": 40})
    pipe = diffusers.StableDiffusionPipeline(vae=tiny_vae(), unet=unet, scheduler=diffusers.DDPMScheduler(steps_offset=1, clip_sample=False), safety_checker=None,
                                             feature_extractor=None, requires_safety_checker=False,
                                             **family_components("sd21"))  # fmt: skip
    profile = te_align.profile("sd21", **{"slots.clip_h.encoder.hidden_size": 40})
    tok, enc = _t5()
    report, _ = swap(None, enc, None, tokenizer=tok, pipeline=pipe, profile=profile, captions=CAPTIONS, reset="qk")
    assert report.profile.name == "sd21-t5-swap" and report.profile.slot("t5").encoder.hidden_size == 40
    assert float(report.after.std[0]) == pytest.approx(float(report.target.std[0]), rel=1e-6)
    assert len(report.reset_layers) == 8


def test_estimate_reads_the_swapped_folder(swapped: tuple[Any, Path], squares_dataset: Path, tmp_path: Path) -> None:
    from te_align.train import config_from_dict
    from te_align.train.estimate import estimate

    _, out = swapped
    cfg = config_from_dict({
        "model": {"path": str(out)},
        "data": {"path": str(squares_dataset), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 2, "checkpoint_every": 0, "batch_size": 2, "device": "cpu"},
        "output": {"dir": str(tmp_path / "o"), "kohya": False},
    })  # fmt: skip
    est = estimate(cfg, options=False)
    t5 = json.loads((out / "text_encoder" / "config.json").read_text(encoding="utf-8"))
    pipe = _pipe(out)
    # the swapped encoder (T5 + projection) is counted parameter for parameter
    assert est.params["text_encoder"] == sum(p.numel() for p in pipe.text_encoder.parameters())
    assert t5["architectures"] == ["ProjectedTextEncoder"] and est.peak("device") > 0


def test_bad_input_of_the_issue_is_one_line_and_nothing_is_written(base: Path, t5_dir: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Issue 35's bad input: an encoder folder without weights, a base without cross-attention for the requested
    reset, a projection of the wrong width: one line naming it, nothing written."""
    import shutil

    import diffusers

    out = tmp_path / "new"
    # an encoder folder with its config but no weights
    bare = tmp_path / "t5-config-only"
    bare.mkdir()
    shutil.copy(t5_dir / "config.json", bare / "config.json")
    err = _bad([str(base), "--encoder", str(bare), "--tokenizer", str(t5_dir), "--profile", "sd15", *_overrides(),
                "--out", str(out)], capsys)  # fmt: skip
    assert err == (f"te-align: error: {bare}: key '--encoder': the encoder folder has config.json but no weights (expected "
                   "model.safetensors, sharded model-*.safetensors with their index, or pytorch_model.bin)\n")  # fmt: skip
    # a base whose UNet has no cross-attention: resetting it is refused; --reset none is not
    plain = tmp_path / "no-cross-attention"
    shutil.copytree(base, plain)
    cfg = json.loads((plain / "unet" / "config.json").read_text(encoding="utf-8"))
    blocks = len(cfg["block_out_channels"])
    unet = diffusers.UNet2DConditionModel(**{
        **{k: v for k, v in cfg.items() if not k.startswith("_")}, "down_block_types": ["DownBlock2D"] * blocks,
        "up_block_types": ["UpBlock2D"] * blocks, "mid_block_type": "UNetMidBlock2D"})  # fmt: skip
    shutil.rmtree(plain / "unet")
    unet.save_pretrained(str(plain / "unet"))
    for mode, what in (("cross", "cross-attention"), ("qk", "cross-attention query/key"), ("all", "attention")):
        err = _bad([str(plain), "--encoder", str(t5_dir), "--profile", "sd15", *_overrides(), "--out", str(out),
                    "--reset", mode], capsys)  # fmt: skip
        assert err.startswith(f"te-align: error: {plain}/unet/config.json: key '--reset': reset mode '{mode}' re-initialises "
                              f"the unet's {what} layers, but this UNet2DConditionModel has none (no layer name matches "), err
        assert err.endswith("expected a denoiser with text cross-attention, or --reset none\n"), err
    # a projection of the wrong width (the input side: 95 is not the new encoder's 96)
    save_file({"weight": torch.zeros(32, 95)}, str(tmp_path / "proj.safetensors"))
    err = _bad([str(base), "--encoder", str(t5_dir), "--profile", "sd15", *_overrides(), "--out", str(out), "--projection",
                str(tmp_path / "proj.safetensors")], capsys)  # fmt: skip
    assert err == (f"te-align: error: {tmp_path / 'proj.safetensors'}: key 'weight': the projection weight has shape (32, 95) "
                   "but the new encoder's width is 96 and the denoiser attends to 32: expected (32, 96)\n")  # fmt: skip
    assert not out.exists() and not any(p.name.startswith(".new") for p in tmp_path.iterdir())
    rc = main(["swap", str(plain), "--encoder", str(t5_dir), "--profile", "sd15", *_overrides(), "--out", str(out),
               "--reset", "none", "--captions", str(_captions(tmp_path))])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert (out / PROFILE_FILE).is_file()


def _captions(folder: Path) -> Path:
    path = folder / "captions.txt"
    path.write_text("\n".join(CAPTIONS[:2]) + "\n", encoding="utf-8")
    return path
