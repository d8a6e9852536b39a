"""``te-align train`` under hostile but realistic input: bad configs (``--check`` rejects what the run
would), an output folder holding a previous run, damaged checkpoints and latent-cache entries, a
changed config on ``--resume``, broken images and captions in other encodings, and a full disk.

Each case ends in one line without a traceback (exit 2 on the command line), and no run loses work:
the checkpoints already written stay intact and resumable, and a resumed run is bit-identical to an
uninterrupted one. The full disk is a real file-size limit (``RLIMIT_FSIZE``) in a child process.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from te_align.cli import main
from te_align.tiny.datasets import make_squares_dataset
from te_align.tiny.fit import PROFILES, profile_overrides
from te_align.train import TrainError, config_from_dict, train
from tests.train.test_train import make_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sd15(tiny_model_folder: Callable[[str], Path]) -> Path:
    return tiny_model_folder("sd15")


@pytest.fixture(scope="module")
def dataset(squares_dataset: Path) -> Path:
    return squares_dataset


def write_config(path: Path, model_dir: Path, data_dir: Path, out: Path, **sections: dict[str, Any]) -> Path:
    """A TOML training config for the tiny sd15 model (``sections`` add or replace keys)."""
    raw: dict[str, dict[str, Any]] = {
        "model": {"path": str(model_dir), "profile": PROFILES["sd15"]},
        "data": {"path": str(data_dir), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "checkpoint_every": 1, "batch_size": 2, "device": "cpu"},
        "output": {"dir": str(out)},
        "logging": {"progress": False, "tensorboard": False},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)

    def value(v: Any) -> str:
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and v != v:
            return "nan"
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    extra_overrides = raw.pop("overrides", {})
    lines = []
    for name, values in raw.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {value(v)}" for k, v in values.items()]
    lines.append("[model.profile_overrides]")
    lines += [f'"{k}" = {value(v)}' for k, v in {**profile_overrides("sd15"), **extra_overrides}.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit code, stdout and the error line (the last line of stderr: progress logs come before it)."""
    code = main(list(argv))
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert "Traceback" not in out.err
    return code, out.out, (lines[-1] + "\n") if lines else ""


# ---------------------------------------------------------------------------------------- --check
CHECK_CASES: dict[str, tuple[dict[str, dict[str, Any]], str]] = {
    "unknown profile": ({"model": {"profile": "sd51"}}, "sd51"),
    "out-of-range override": ({"overrides": {"clip_l_max_length": 10**12}}, "max_length"),
    "negative seed": ({"train": {"seed": -1}}, "train.seed"),
    "seed too large": ({"train": {"seed": 2**40}}, "train.seed"),
    "adam epsilon 0": ({"train": {"adam_epsilon": 0.0}}, "train.adam_epsilon"),
    "empty tag separator": ({"data": {"tag_separator": ""}}, "data.tag_separator"),
    "extension without a name": ({"data": {"caption_extension": "."}}, "data.caption_extension"),
    "image extension as caption extension": ({"data": {"caption_extension": ".png"}}, "data.caption_extension"),
    "unknown device": ({"train": {"device": "gpu0"}}, "train.device"),
    "fp16 on the cpu": ({"train": {"mixed_precision": "fp16"}}, "train.mixed_precision"),
    "absurd resolution": ({"data": {"resolution": 10**9}}, "data.resolution"),
    "nan learning rate": ({"train": {"learning_rate": float("nan")}}, "train.learning_rate"),
    "infinite learning rate": ({"train": {"learning_rate": float("inf")}}, "train.learning_rate"),
    "sample width not a multiple of 8": ({"sample": {"width": 12}}, "sample.width"),
    "output name ..": ({"output": {"name": ".."}}, "output.name"),
    "flow objective on sd15": ({"train": {"objective": "flow"}}, "train.objective"),
    "text-encoder LoRA on a missing slot": ({"lora": {"text_encoders": ["t5"]}}, "lora.text_encoders"),
    "missing dataset": ({"data": {"path": "/nonexistent-t15-data"}}, "dataset folder does not exist"),
}


@pytest.mark.parametrize("case", sorted(CHECK_CASES))
def test_check_rejects_what_the_run_would_reject(case: str, tmp_path: Path, sd15: Path, dataset: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    sections, needle = CHECK_CASES[case]
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, tmp_path / "out", **sections)
    code, out, err = cli("train", str(cfg), "--check", capsys=capsys)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_check_needs_cuda_for_a_cuda_device(tmp_path: Path, sd15: Path, dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: a cuda device is available")
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, tmp_path / "out", train={"device": "cuda"})
    code, _, err = cli("train", str(cfg), "--check", capsys=capsys)
    assert code == 2 and "train.device" in err and "not available" in err


def test_check_passes_a_good_config_and_sizes_follow_the_model(tmp_path: Path, sd15: Path, dataset: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, tmp_path / "out")
    code, out, err = cli("train", str(cfg), "--check", capsys=capsys)
    assert code == 0, err
    assert "ok" in out and f"{len(list(dataset.glob('*.png')))} images" in out
    from te_align.train.preflight import check_sizes

    good = config_from_dict({"model": {"path": "m"}, "data": {"path": "d"}, "sample": {"width": 48}})
    check_sizes(good, 16)
    with pytest.raises(TrainError, match=r"sample\.width.*multiple of 16"):
        check_sizes(config_from_dict({"model": {"path": "m"}, "data": {"path": "d"}, "sample": {"width": 24}}), 16)


def test_config_paths_one_line_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "loop.toml"
    loop.symlink_to(loop)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    (tmp_path / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    cases = {tmp_path / "missing.toml": "no such config file", tmp_path: "is a folder", loop: "symlink loop",
             fifo: "named pipe", tmp_path / "deep.toml": "nested too deeply"}  # fmt: skip
    for path, needle in cases.items():
        code, _, err = cli("train", str(path), "--check", capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and needle in err, (path, err)


def test_hub_id_offline_and_not_cached_is_one_line_naming_what_to_do(tmp_path: Path, dataset: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A hub id with no network used to end in diffusers' "check the stacktrace above" with no stack trace shown."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    cfg = write_config(tmp_path / "c.toml", Path("someone/tiny-model"), dataset, tmp_path / "out",
                       model={"path": "someone/tiny-model", "profile": "sd15"})  # fmt: skip
    code, _out, err = cli("train", str(cfg), capsys=capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err == (
        "te-align: error: key 'model.path': 'someone/tiny-model' is a Hugging Face hub id, it is not in the local hub "
        f"cache ({tmp_path / 'empty-hub-cache'}), and HF_HUB_OFFLINE is set: download it once with network access "
        "(hf download someone/tiny-model), or set this key to a local diffusers folder or .safetensors file\n")
    assert "stacktrace" not in err and not (tmp_path / "out").exists()


def test_library_and_peft_versions_that_do_not_pair_are_named_with_the_fix(tmp_path: Path, sd15: Path,
                                                                         dataset: Path) -> None:
    """transformers 5.24 demands a peft newer than any released: the run must name both versions and the fix, not
    blame lora.target_modules. A real distribution record of an old peft, first on the path, makes the pairing
    fail exactly as such an install does (transformers' own check reads the same record)."""
    import transformers.integrations.peft as tp

    from te_align._compat import _key, peft_minimum

    major, minor = _key(tp.MIN_PEFT_VERSION)[:2]
    old = f"{major}.{minor - 1}.99"  # just below what transformers demands: the shape of the real failure
    assert _key(peft_minimum("diffusers")) <= _key(old)  # diffusers is content with it, as with the real peft
    shadow = tmp_path / "site"
    (shadow / f"peft-{old}.dist-info").mkdir(parents=True)
    (shadow / f"peft-{old}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: peft\nVersion: {old}\n")
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, tmp_path / "out", lora={"text_encoders": ["clip_l"]})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(ROOT)]), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "te_align", "train", str(cfg)], capture_output=True, text=True, env=env)
    import transformers

    from te_align._compat import declared_range

    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr == (
        f"te-align: error: transformers {transformers.__version__} needs peft >= {tp.MIN_PEFT_VERSION} for LoRA "
        f"adapters, but peft {old} is installed; fix: pip install \"{declared_range('transformers')}\" (the range "
        f"te-align is tested with), or a peft >= {tp.MIN_PEFT_VERSION} once one is released\n")
    assert "lora.target_modules" not in out.stderr and not (tmp_path / "out" / "checkpoints").exists()


# ------------------------------------------------------------------------------------ output folder
def test_previous_run_is_refused_overwrite_moves_it_and_loras_are_0644(tmp_path: Path, sd15: Path, dataset: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "o"
    first = train(make_config("sd15", sd15, dataset, out, train={"max_steps": 1, "checkpoint_every": 1}))
    umask = os.umask(0o022)
    os.umask(umask)
    for path in (first.lora_path, first.kohya_path):
        assert path is not None and (path.stat().st_mode & 0o777) == 0o666 & ~umask, path
    before = first.lora_path.read_bytes()  # type: ignore[union-attr]
    with pytest.raises(TrainError, match=r"holds a previous run \(1 checkpoint, lora.safetensors, lora_kohya.safetensors\)"):
        train(make_config("sd15", sd15, dataset, out, train={"max_steps": 1}))
    assert first.lora_path.read_bytes() == before  # type: ignore[union-attr]
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, out)
    code, _, err = cli("train", str(cfg), "--check", capsys=capsys)
    assert code == 2 and "--resume" in err and "--overwrite" in err
    second = train(make_config("sd15", sd15, dataset, out, train={"max_steps": 2, "checkpoint_every": 1}), overwrite=True)
    (moved,) = [p for p in out.iterdir() if p.name.startswith("replaced-")]
    assert (moved / "lora.safetensors").read_bytes() == before
    assert [p.name for p in (moved / "checkpoints").iterdir()] == ["step-00000001"]
    assert second.steps == 2 and sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]


def test_resume_of_a_finished_run_without_checkpoints_is_refused_before_loading(
        tmp_path: Path, sd15: Path, dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`te-align train CONFIG --resume` where the run finished and kept no checkpoint (train.checkpoint_every = 0, as
    the config `te-align demo` writes): one line that says so and what to do, before any model is loaded."""
    out = tmp_path / "o"
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, out, train={"max_steps": 1, "checkpoint_every": 0})
    assert cli("train", str(cfg), capsys=capsys)[0] == 0
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert main(["train", str(cfg), "--resume"]) == 2
    assert capsys.readouterr().err == (
        f"te-align: error: {out / 'checkpoints'}: key '--resume': no checkpoint to resume from in the output folder; "
        "the run there finished (lora.safetensors, lora_kohya.safetensors) and kept no checkpoint: --overwrite starts "
        "over (its files are moved into a replaced-<time>/ folder there), or choose another output.dir\n")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    with pytest.raises(TrainError, match=r"no checkpoint to resume from in the output folder$"):
        train(make_config("sd15", sd15, dataset, tmp_path / "empty", train={"max_steps": 1}), resume=True)
    assert not (tmp_path / "empty").exists()


# ------------------------------------------------------------------------------------------ resume
def _damage(kind: str, ckpt: Path) -> str:
    """Damage the checkpoint as ``kind`` says; returns the file the error must name."""
    if kind == "truncated safetensors":
        f = ckpt / "trainable.safetensors"
        f.write_bytes(f.read_bytes()[:100])
    elif kind == "garbage optimizer":
        f = ckpt / "optimizer.pt"
        f.write_bytes(b"\x80\x04garbage" * 50)
    elif kind == "empty rng":
        f = ckpt / "rng.pt"
        f.write_bytes(b"")
    elif kind == "state.json {}":
        f = ckpt / "state.json"
        f.write_text("{}", encoding="utf-8")
    elif kind == "flipped bit in the weights":
        f = ckpt / "trainable.safetensors"
        data = bytearray(f.read_bytes())
        data[-5] ^= 0x10
        f.write_bytes(bytes(data))
    else:  # pragma: no cover
        raise AssertionError(kind)
    return f.name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, sd15: Path, dataset: Path) -> dict[str, Any]:
    """An uninterrupted 6-step run and one stopped after 4 steps (checkpoints at 2 and 4)."""
    root = tmp_path_factory.mktemp("resume")
    sections: dict[str, Any] = {"train": {"max_steps": 6, "checkpoint_every": 2, "checkpoints_keep": 0, "lr_scheduler": "cosine"},
                                "data": {"caption_dropout": 0.2, "random_flip": True}, "lora": {"dropout": 0.1}}  # fmt: skip
    full = train(make_config("sd15", sd15, dataset, root / "full", **sections))
    train(make_config("sd15", sd15, dataset, root / "part", **sections), stop_after=4)
    return {"root": root, "sections": sections, "full": load_file(str(full.lora_path)), "losses": full.losses}


@pytest.mark.parametrize("kind", ["truncated safetensors", "garbage optimizer", "empty rng", "state.json {}",
                                  "flipped bit in the weights"])  # fmt: skip
def test_damaged_newest_checkpoint_resumes_from_the_previous_one_bit_identically(
    kind: str, runs: dict[str, Any], sd15: Path, dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "part"
    shutil.copytree(runs["root"] / "part", out)
    name = _damage(kind, out / "checkpoints" / "step-00000004")
    with caplog.at_level(logging.WARNING, logger="te_align.train"):
        resumed = train(make_config("sd15", sd15, dataset, out, **runs["sections"]), resume=True)
    assert f"step-00000004/{name}" in caplog.text or (kind == "state.json {}" and "step-00000004" in caplog.text)
    assert "previous intact checkpoint" in caplog.text and "step-00000002" in caplog.text
    got = load_file(str(resumed.lora_path))
    assert got.keys() == runs["full"].keys()
    for k in got:
        assert torch.equal(got[k], runs["full"][k]), k
    assert resumed.losses == runs["losses"]


def test_explicit_damaged_checkpoint_is_one_line(runs: dict[str, Any], tmp_path: Path, sd15: Path, dataset: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "part"
    shutil.copytree(runs["root"] / "part", out)
    for ckpt in (out / "checkpoints").iterdir():
        _damage("empty rng", ckpt)
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, out, train={"max_steps": 6, "checkpoint_every": 2})
    code, _, err = cli("train", str(cfg), "--resume", capsys=capsys)
    assert code == 2 and "every checkpoint is damaged" in err and "Traceback" not in err
    code, _, err = cli("train", str(cfg), "--resume", str(out / "checkpoints" / "step-00000004"), capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "step-00000004/rng.pt" in err and "damaged" in err


def test_changed_config_on_resume(runs: dict[str, Any], tmp_path: Path, sd15: Path, dataset: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    def copy() -> Path:
        out = tmp_path / f"part{len(list(tmp_path.iterdir()))}"
        shutil.copytree(runs["root"] / "part", out)
        return out

    def cfg(out: Path, **changes: dict[str, Any]) -> Any:
        sections = json.loads(json.dumps(runs["sections"]))
        for k, v in changes.items():
            sections.setdefault(k, {}).update(v)
        return make_config("sd15", sd15, dataset, out, **sections)

    with pytest.raises(TrainError, match=r"cannot resume: the checkpoint was trained with lora.rank = 16, this config has 4"):
        train(cfg(copy(), lora={"rank": 4}), resume=True)
    with pytest.raises(TrainError, match=r"lora.target_modules"):
        train(cfg(copy(), lora={"target_modules": ["to_q"]}), resume=True)
    out = copy()
    with caplog.at_level(logging.WARNING, logger="te_align.train"):
        result = train(cfg(out, train={"learning_rate": 5e-4, "batch_size": 1, "seed": 7}), resume=True)
    for needle in ("train.learning_rate changed from 0.001 to 0.0005", "train.batch_size changed", "train.seed changed"):
        assert needle in caplog.text
    rows = (out / "logs" / "train_log.csv").read_text().splitlines()[1:]
    lrs = {int(r.split(",")[0]): float(r.split(",")[3]) for r in rows}
    import math

    for step in (5, 6):  # cosine schedule over 6 steps with the new base rate (logged after the step's update)
        assert lrs[step] == pytest.approx(5e-4 * 0.5 * (1 + math.cos(math.pi * step / 6)), rel=1e-5), (step, lrs)
    assert result.steps == 6
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="te_align.train"):
        train(cfg(copy(), train={"max_steps": 3}), resume=True)
    assert "nothing left to train" in caplog.text


# ------------------------------------------------------------------------------------- latent cache
def test_latent_cache_bit_rot_is_re_encoded(tmp_path: Path, sd15: Path, dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    first = train(make_config("sd15", sd15, dataset, tmp_path / "a", data={"cache_dir": str(cache), "latent_sample": "mean"}))
    entries = sorted((cache / "latents").rglob("*.safetensors"))
    assert entries
    for entry in entries:  # flip high bits in the tensor bytes: without a digest this trains on garbage
        data = bytearray(entry.read_bytes())
        for i in range(len(data) - 64, len(data), 4):
            data[i + 3] ^= 0x7F
        entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="te_align.train"):
        second = train(make_config("sd15", sd15, dataset, tmp_path / "b", data={"cache_dir": str(cache), "latent_sample": "mean"}))
    assert caplog.text.count("is damaged") == len(entries) and "do not match their recorded digest" in caplog.text
    assert second.losses == first.losses


# ---------------------------------------------------------------------------------------- dataset
def test_truncated_jpeg_is_skipped_and_captions_are_decoded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from PIL import Image

    from te_align.train.config import DataConfig
    from te_align.train.data import scan

    data = make_squares_dataset(tmp_path / "d", n=3)
    Image.new("RGB", (64, 48), (200, 10, 10)).save(data / "photo.jpg", quality=95)
    whole = (data / "photo.jpg").read_bytes()
    (data / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    (data / "cut.txt").write_text("a cut photo", encoding="utf-8")
    (data / "img00.txt").write_bytes("\ufeffcafé, UTF-8 with BOM".encode())
    (data / "img01.txt").write_bytes("\ufeffcafé, UTF-16 LE".encode("utf-16-le"))
    (data / "img02.txt").write_bytes(b"\xfe\xff" + "café, UTF-16 BE".encode("utf-16-be"))
    with caplog.at_level(logging.WARNING, logger="te_align.train"):
        report = scan(DataConfig(path=str(data)))
    assert [p.name for p, _ in report.unreadable] == ["cut.jpg"] and "cut.jpg" in caplog.text
    captions = {it.path.name: it.caption for it in report.items}
    assert captions["img00.png"] == "café, UTF-8 with BOM"
    assert captions["img01.png"] == "café, UTF-16 LE"
    assert captions["img02.png"] == "café, UTF-16 BE"
    (data / "img00.txt").write_bytes("café latin-1".encode("latin-1"))
    (data / "img01.txt").write_bytes(b"\x00\x01\x02binary")
    with pytest.raises(TrainError, match=r"2 caption file\(s\) cannot be read.*img00.txt \(not UTF-8.*img01.txt \(holds control"):
        scan(DataConfig(path=str(data)))


# -------------------------------------------------------------------------------------- full disk
def _limited(limit: int) -> Callable[[], None]:
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def test_full_disk_during_a_checkpoint_is_one_line_and_the_run_resumes(tmp_path: Path, sd15: Path, dataset: Path) -> None:
    out = tmp_path / "o"
    cfg = write_config(tmp_path / "c.toml", sd15, dataset, out, train={"max_steps": 4, "checkpoint_every": 2})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "te_align", "train", str(cfg)]
    ok = subprocess.run([*cmd, "--max-steps", "2"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    step2 = {p.name: p.read_bytes() for p in (out / "checkpoints" / "step-00000002").iterdir()}
    limit = max(len(b) for n, b in step2.items() if n != "optimizer.pt") + 1000  # the optimizer state does not fit
    assert len(step2["optimizer.pt"]) > limit
    full = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=env, preexec_fn=_limited(limit))
    assert full.returncode == 2, full.stderr[-2000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "Traceback" not in full.stderr and last.startswith("te-align: error: ")
    assert "step-00000004/optimizer.pt" in last and "file too large" in last and "step-00000002 with --resume" in last
    assert {p.name: p.read_bytes() for p in (out / "checkpoints" / "step-00000002").iterdir()} == step2
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000002"]  # no temp folder left
    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "4 steps" in again.stdout, again.stderr[-2000:]


def test_full_disk_under_the_tensorboard_writer_is_one_line(tmp_path: Path) -> None:
    # TensorBoard writes its event file from a background thread; the error must surface as one line naming
    # the folder, like every other write of the run (the file-size limit makes the event file's write fail).
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from te_align.train.logs import RunLog\n"
        "from te_align.train import TrainError\n"
        "log = RunLog(Path(sys.argv[1]))\n"
        "try:\n"
        "    for step in range(1, 4):\n"
        "        log.log(step, 0, 0.5, 1e-4, 1.0, float(step))\n"
        "    log.close()\n"
        "except TrainError as e:\n"
        "    print('ONE LINE:', e)\n"
        "    sys.exit(2)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env,
                         preexec_fn=_limited(300))  # fmt: skip
    assert run.returncode == 2, (run.stdout + run.stderr)[-2000:]
    assert "Traceback" not in run.stderr
    line = run.stdout.strip().splitlines()[-1]
    assert line.startswith("ONE LINE: ") and str(tmp_path / "logs" / "tensorboard") in line and "file too large" in line
