"""Fault campaign for training, checkpoints, caches, LoRA files and the CLI readers (issue 15).

Runs a hostile-but-realistic user's cases against a te-align checkout as child processes and counts,
per class: cases, tracebacks, hangs, data-loss cases (a user file changed without a backup, a
checkpoint damaged, a run no longer resumable) and wrong outcomes (not the wanted one-line exit 2,
or a failure where the run should go on). Classes:

- ``config``: bad training configs, each with ``train --check`` and with the real run;
- ``paths``: missing paths, folders for files, symlink loops, named pipes, deeply nested files;
- ``dataset``: truncated images, captions in other encodings, odd dataset folders;
- ``checkpoint``: damaged newest checkpoints (resume must fall back), all damaged, changed configs;
- ``output``: a previous run in the output folder, ``--overwrite``, the LoRA file modes;
- ``disk``: full disks (a real tmpfs when this process may mount one, else ``RLIMIT_FSIZE``) and
  read-only folders during a run; after space is freed the run must resume;
- ``lora``: damaged or crafted LoRA files under ``inspect``;
- ``profile``: ``profile build -o`` over existing files and into the model, bad overrides, odd sources;
- ``api``: ``te_align.encode`` / ``te_align.profile`` with wrong types; ``ab --seeds 0``; ``cache info``.

Usage::

    python tools/fault_campaign_train.py                 # this checkout
    python tools/fault_campaign_train.py --repo OTHER    # another checkout (e.g. before the fixes)
    python tools/fault_campaign_train.py --only disk,config --json out.json

Every case runs in a fresh temp folder; nothing outside it is written (tmpfs mounts live there too
and are unmounted at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
TIMEOUT = 180


@dataclass
class Case:
    cls: str
    name: str
    #: te-align arguments, or ``["-c", code]`` for a Python snippet (``python -c``).
    argv: list[str]
    #: "ok": exit 0; "error": exit 2 with one ``te-align: error:`` line last; "any": no traceback is all.
    expect: str
    needle: str = ""
    #: Returns a description of lost or damaged user data, or None.
    check: Callable[[], str | None] | None = None
    #: Child-process set-up (a file-size limit).
    preexec: Callable[[], None] | None = None
    #: Run before / after the command (mount, remount, free space); ``after`` may return a data-loss text.
    before: Callable[[], None] | None = None
    after: Callable[[], str | None] | None = None


@dataclass
class Outcome:
    case: Case
    status: str  # pass | traceback | hang | data-loss | wrong
    detail: str = ""
    seconds: float = 0.0


@dataclass
class World:
    repo: Path
    root: Path
    model: Path
    data: Path
    overrides: dict[str, Any]
    can_mount: bool
    mounts: list[Path] = field(default_factory=list)
    counter: int = 0

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.repo), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip

    def fresh(self, name: str) -> Path:
        self.counter += 1
        d = self.root / f"{self.counter:03d}-{name.replace(' ', '_').replace('/', '_')[:40]}"
        d.mkdir()
        return d

    def py(self, code: str, timeout: int = TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=self.env(), timeout=timeout,
                              cwd=self.root)  # fmt: skip

    def te(self, *argv: str, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
        # cwd: the temp folder, so ``python -m`` imports the checkout on PYTHONPATH, not one in the caller's folder
        return subprocess.run([sys.executable, "-m", "te_align", *argv], capture_output=True, text=True, env=self.env(),
                              timeout=TIMEOUT, preexec_fn=preexec, cwd=self.root)  # fmt: skip

    # ------------------------------------------------------------------------------- tmpfs
    def mount(self, path: Path, size: str) -> bool:
        if not self.can_mount:
            return False
        path.mkdir(parents=True, exist_ok=True)
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode == 0
        if ok:
            self.mounts.append(path)
        return ok

    def remount(self, path: Path, opts: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{opts}", str(path)], capture_output=True, check=True)

    def unmount_all(self) -> None:
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        self.mounts.clear()


# ----------------------------------------------------------------------------------------- helpers
def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else ("-inf" if v == float("-inf") else repr(v)))
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def write_config(w: World, folder: Path, out_dir: Path | None = None, data_dir: Path | None = None,
                 **sections: dict[str, Any]) -> Path:  # fmt: skip
    raw: dict[str, dict[str, Any]] = {
        "model": {"path": str(w.model), "profile": "sd15"},
        "data": {"path": str(data_dir or w.data), "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "train": {"max_steps": 2, "learning_rate": 1e-3, "checkpoint_every": 1, "batch_size": 2, "device": "cpu"},
        "output": {"dir": str(out_dir or folder / "out")},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    }
    extra = dict(sections.pop("overrides", {}))
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    lines = []
    for name, values in raw.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    lines.append("[model.profile_overrides]")
    lines += [f'"{k}" = {toml_value(v)}' for k, v in {**w.overrides, **extra}.items()]
    path = folder / "config.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} if folder.exists() else {}


def checkpoints_intact(out: Path, expected: dict[str, bytes] | None = None) -> str | None:
    """Every checkpoint folder complete; no temp folder left; ``expected`` files unchanged."""
    root = out / "checkpoints"
    if not root.exists():
        return None
    for d in root.iterdir():
        if d.name.startswith(".step-"):
            return f"temp checkpoint folder left: {d.name}"
        if d.name.startswith("step-") and not all((d / n).is_file() for n in ("state.json", "trainable.safetensors",
                                                                              "optimizer.pt", "scheduler.pt", "rng.pt")):  # fmt: skip
            return f"incomplete checkpoint {d.name}"
    if expected is not None:
        now = snapshot(root)
        for k, v in expected.items():
            if now.get(k) != v:
                return f"checkpoint file {k} changed or lost"
    return None


# ------------------------------------------------------------------------------------------ classes
CONFIG_CASES: dict[str, tuple[dict[str, dict[str, Any]], str]] = {
    "unknown profile": ({"model": {"profile": "sd51"}}, "sd51"),
    "override out of range": ({"overrides": {"clip_l_max_length": 10**12}}, "max_length"),
    "override negative hidden size": ({"overrides": {"clip_l_hidden_size": -32}}, "hidden_size"),
    "override unknown dtype": ({"overrides": {"clip_l_dtype": "float99"}}, "dtype"),
    "negative seed": ({"train": {"seed": -1}}, "train.seed"),
    "seed out of range": ({"train": {"seed": 2**40}}, "train.seed"),
    "adam epsilon 0": ({"train": {"adam_epsilon": 0.0}}, "train.adam_epsilon"),
    "adam epsilon negative": ({"train": {"adam_epsilon": -1e-8}}, "train.adam_epsilon"),
    "empty tag separator": ({"data": {"tag_separator": "", "shuffle_tags": True}}, "data.tag_separator"),
    "caption extension without a name": ({"data": {"caption_extension": "."}}, "data.caption_extension"),
    "unknown device string": ({"train": {"device": "gpu0"}}, "train.device"),
    "fp16 on the cpu": ({"train": {"mixed_precision": "fp16"}}, "train.mixed_precision"),
    "absurd resolution": ({"data": {"resolution": 10**9}}, "data.resolution"),
    "nan learning rate": ({"train": {"learning_rate": float("nan")}}, "train.learning_rate"),
    "infinite learning rate": ({"train": {"learning_rate": float("inf")}}, "train.learning_rate"),
    "sample width 12": ({"sample": {"width": 12, "prompts": ["a"]}}, "sample.width"),
    "output name ..": ({"output": {"name": ".."}}, "output.name"),
    "output name with a slash": ({"output": {"name": "a/b"}}, "output.name"),
    "flow objective on sd15": ({"train": {"objective": "flow"}}, "train.objective"),
    "text-encoder LoRA on a missing slot": ({"lora": {"text_encoders": ["t5"]}}, "lora.text_encoders"),
    "encoder dropout on a missing slot": ({"data": {"encoder_dropout": {"t5": 0.5}}}, "data.encoder_dropout"),
    "missing dataset": ({"data": {"path": "/nonexistent-campaign-data"}}, "dataset folder"),
}


def config_cases(w: World) -> list[Case]:
    import torch  # only to know whether CUDA exists: the cuda case needs a machine without it

    cases = []
    cases_def = dict(CONFIG_CASES)
    if not torch.cuda.is_available():
        cases_def["cuda without CUDA"] = ({"train": {"device": "cuda"}}, "train.device")
    for mode in ("check", "run"):
        for name, (sections, needle) in cases_def.items():
            d = w.fresh(f"cfg-{mode}-{name}")
            cfg = write_config(w, d, **json.loads(json.dumps(sections)))
            argv = ["train", str(cfg)] + (["--check"] if mode == "check" else [])
            cases.append(Case("config", f"{mode}: {name}", argv, "error", needle))
    return cases


def path_cases(w: World) -> list[Case]:
    d = w.fresh("paths")
    fifo = d / "pipe.toml"
    os.mkfifo(fifo)
    fifo_st = d / "pipe.safetensors"
    os.mkfifo(fifo_st)
    fifo_dir = d / "pipe-dir"
    os.mkfifo(fifo_dir)
    loop = d / "loop.toml"
    loop.symlink_to(loop)
    loop_st = d / "loop.safetensors"
    loop_st.symlink_to(loop_st)
    loop_dir = d / "loopdir"
    loop_dir.symlink_to(loop_dir)
    deep_toml = d / "deep.toml"
    deep_toml.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    deep_json = d / "deep.json"
    deep_json.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    deep_prof = d / "deepprof.toml"
    deep_prof.write_text("x = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n", encoding="utf-8")
    bad_cfg_dir = w.fresh("cfg-data-is-file")
    data_file = bad_cfg_dir / "data.png"
    data_file.write_bytes(b"x")
    cfg_data_file = write_config(w, bad_cfg_dir, data_dir=data_file)
    out_file_dir = w.fresh("cfg-out-is-file")
    (out_file_dir / "out").write_text("x", encoding="utf-8")
    cfg_out_file = write_config(w, out_file_dir, out_dir=out_file_dir / "out")
    return [
        Case("paths", "train config missing", ["train", str(d / "missing.toml"), "--check"], "error", "no such config file"),
        Case("paths", "train config is a folder", ["train", str(d), "--check"], "error", "is a folder"),
        Case("paths", "train config is a FIFO", ["train", str(fifo), "--check"], "error", "named pipe"),
        Case("paths", "train config symlink loop", ["train", str(loop), "--check"], "error", "symlink loop"),
        Case("paths", "train config nested 100k deep", ["train", str(deep_toml), "--check"], "error", "nested too deeply"),
        Case("paths", "train data.path is a file", ["train", str(cfg_data_file), "--check"], "error", "data.path"),
        Case("paths", "train output.dir is a file", ["train", str(cfg_out_file), "--check"], "error", "output.dir"),
        Case("paths", "inspect missing", ["inspect", str(d / "missing.safetensors")], "error", "no such file"),
        Case("paths", "inspect a folder", ["inspect", str(d)], "error", "folder"),
        Case("paths", "inspect a FIFO", ["inspect", str(fifo_st)], "error", "named pipe"),
        Case("paths", "inspect a symlink loop", ["inspect", str(loop_st)], "error", "symlink loop"),
        Case("paths", "cache info missing", ["cache", "info", str(d / "nope")], "error", "no such folder"),
        Case("paths", "cache info FIFO", ["cache", "info", str(fifo_dir)], "error", "named pipe"),
        Case("paths", "cache info symlink loop", ["cache", "info", str(loop_dir)], "error", "symlink loop"),
        Case("paths", "profile show FIFO", ["profile", "show", str(fifo)], "error", "named pipe"),
        Case("paths", "profile show symlink loop", ["profile", "show", str(loop)], "error", "symlink loop"),
        Case("paths", "profile show JSON nested 100k deep", ["profile", "show", str(deep_json)], "error", "nested too deeply"),
        Case("paths", "profile show TOML nested 50k deep", ["profile", "show", str(deep_prof)], "error", "nested too deeply"),
        Case("paths", "profile show empty name", ["profile", "show", ""], "error", "empty profile source"),
    ]


def dataset_cases(w: World) -> list[Case]:
    from PIL import Image

    cases = []

    def data_copy(name: str) -> tuple[Path, Path]:
        d = w.fresh(f"data-{name}")
        data = d / "data"
        shutil.copytree(w.data, data)
        return d, data

    d, data = data_copy("truncated jpeg")
    Image.new("RGB", (48, 32), (10, 200, 30)).save(data / "photo.jpg", quality=95)
    raw = (data / "photo.jpg").read_bytes()
    (data / "photo.jpg").write_bytes(raw[: len(raw) // 2])
    (data / "photo.txt").write_text("a green photo", encoding="utf-8")
    cases.append(Case("dataset", "truncated JPEG is skipped", ["train", str(write_config(w, d, data_dir=data))], "ok"))
    d, data = data_copy("truncated png")
    raw = (next(data.glob("*.png"))).read_bytes()
    (data / "zz_cut.png").write_bytes(raw[: len(raw) // 2])
    cases.append(Case("dataset", "truncated PNG is skipped", ["train", str(write_config(w, d, data_dir=data))], "ok"))
    d, data = data_copy("utf16 caption")
    first = sorted(data.glob("*.txt"))[0]
    first.write_bytes("\ufeffa red square".encode("utf-16-le"))
    cases.append(Case("dataset", "UTF-16 caption with BOM is decoded", ["train", str(write_config(w, d, data_dir=data))], "ok"))
    d, data = data_copy("latin1 caption")
    sorted(data.glob("*.txt"))[0].write_bytes("caf\xe9 au lait".encode("latin-1"))
    cases.append(Case("dataset", "Latin-1 caption is refused", ["train", str(write_config(w, d, data_dir=data))], "error", "UTF-8"))
    d, data = data_copy("binary caption")
    sorted(data.glob("*.txt"))[0].write_bytes(bytes(range(256)))
    cases.append(Case("dataset", "binary caption is refused", ["train", str(write_config(w, d, data_dir=data))], "error", "caption"))
    d = w.fresh("data-empty")
    (d / "data").mkdir()
    cases.append(Case("dataset", "empty dataset", ["train", str(write_config(w, d, data_dir=d / "data"))], "error", "no images"))
    d, data = data_copy("symlink loop")
    (data / "loop").symlink_to(data)
    cases.append(Case("dataset", "symlink loop inside the dataset", ["train", str(write_config(w, d, data_dir=data))], "ok"))
    d, data = data_copy("not an image")
    (data / "fake.png").write_text("not a png", encoding="utf-8")
    cases.append(Case("dataset", "text file named .png is skipped", ["train", str(write_config(w, d, data_dir=data))], "ok"))
    return cases


def _base_run(w: World, name: str, steps: int = 2, **sections: dict[str, Any]) -> tuple[Path, Path]:
    """A finished run with checkpoints at every step; returns (config, output folder)."""
    d = w.fresh(name)
    sections.setdefault("train", {})
    sections["train"] = {"max_steps": steps, "checkpoint_every": 1, "checkpoints_keep": 0, **sections["train"]}
    cfg = write_config(w, d, **sections)
    done = w.te("train", str(cfg))
    if done.returncode != 0:
        raise RuntimeError(f"base run {name} failed: {done.stderr[-1500:]}")
    return cfg, d / "out"


def damage(kind: str, ckpt: Path) -> None:
    if kind == "truncated safetensors":
        f = ckpt / "trainable.safetensors"
        f.write_bytes(f.read_bytes()[:100])
    elif kind == "garbage optimizer":
        (ckpt / "optimizer.pt").write_bytes(b"\x80\x04garbage" * 50)
    elif kind == "empty rng":
        (ckpt / "rng.pt").write_bytes(b"")
    elif kind == "state.json {}":
        (ckpt / "state.json").write_text("{}", encoding="utf-8")
    elif kind == "state.json wrong types":
        (ckpt / "state.json").write_text('{"step": "two", "position": [], "fingerprint": 3}', encoding="utf-8")
    elif kind == "state.json garbage":
        (ckpt / "state.json").write_bytes(b"\x00\xff not json")
    elif kind == "flipped bit in weights":
        f = ckpt / "trainable.safetensors"
        data = bytearray(f.read_bytes())
        data[-5] ^= 0x10
        f.write_bytes(bytes(data))
    elif kind == "missing rng file":
        (ckpt / "rng.pt").unlink()
    elif kind == "scheduler is a list":
        import pickle

        (ckpt / "scheduler.pt").write_bytes(pickle.dumps([1, 2, 3]))
    else:
        raise ValueError(kind)


DAMAGES = ("truncated safetensors", "garbage optimizer", "empty rng", "state.json {}", "state.json wrong types",
           "state.json garbage", "flipped bit in weights", "missing rng file", "scheduler is a list")  # fmt: skip


def checkpoint_cases(w: World) -> list[Case]:
    _, out = _base_run(w, "ckpt-base", steps=2)
    cases = []
    for kind in DAMAGES:
        d = w.fresh(f"ckpt-{kind}")
        shutil.copytree(out, d / "out")
        c = write_config(w, d)
        damage(kind, d / "out" / "checkpoints" / "step-00000002")
        keep = {k: v for k, v in snapshot(d / "out" / "checkpoints").items() if k.startswith("step-00000001")}
        cases.append(Case("checkpoint", f"damaged newest: {kind}", ["train", str(c), "--resume", "--max-steps", "3"], "ok",
                          "previous intact checkpoint", check=lambda d=d, keep=keep: checkpoints_intact_keep(d / "out", keep)))  # fmt: skip
    d = w.fresh("ckpt-all-damaged")
    shutil.copytree(out, d / "out")
    c = write_config(w, d)
    for ck in (d / "out" / "checkpoints").iterdir():
        damage("empty rng", ck)
    cases.append(Case("checkpoint", "every checkpoint damaged", ["train", str(c), "--resume", "--max-steps", "3"], "error",
                      "damaged"))  # fmt: skip
    d = w.fresh("ckpt-explicit-damaged")
    shutil.copytree(out, d / "out")
    c = write_config(w, d)
    damage("garbage optimizer", d / "out" / "checkpoints" / "step-00000002")
    cases.append(Case("checkpoint", "explicit damaged checkpoint", ["train", str(c), "--resume",
                                                                     str(d / "out" / "checkpoints" / "step-00000002")],
                      "error", "optimizer.pt"))  # fmt: skip
    changes = {"rank changed": ({"lora": {"rank": 4}}, "error", "lora.rank"),
               "target modules changed": ({"lora": {"target_modules": ["to_q"]}}, "error", "target_modules"),
               "learning rate changed": ({"train": {"learning_rate": 5e-4}}, "ok", "train.learning_rate changed"),
               "batch size changed": ({"train": {"batch_size": 1}}, "ok", "train.batch_size changed"),
               "seed changed": ({"train": {"seed": 7}}, "ok", "train.seed changed"),
               "max steps below the checkpoint": ({"train": {"max_steps": 1}}, "ok", "nothing left to train")}  # fmt: skip
    for name, (sections, expect, needle) in changes.items():
        d = w.fresh(f"ckpt-{name}")
        shutil.copytree(out, d / "out")
        sections = json.loads(json.dumps(sections))
        sections.setdefault("train", {}).setdefault("max_steps", 3)
        c = write_config(w, d, **sections)
        cases.append(Case("checkpoint", f"resume with {name}", ["train", str(c), "--resume"], expect, needle,
                          check=lambda d=d: checkpoints_intact(d / "out")))  # fmt: skip
    return cases


def checkpoints_intact_keep(out: Path, keep: dict[str, bytes]) -> str | None:
    bad = checkpoints_intact(out)
    if bad:
        return bad
    now = snapshot(out / "checkpoints")
    lost = [k for k, v in keep.items() if now.get(k) != v]
    return f"intact checkpoint changed: {lost[0]}" if lost else None


def output_cases(w: World) -> list[Case]:
    cfg, out = _base_run(w, "out-base", steps=1)
    lora = out / "lora.safetensors"
    before = lora.read_bytes()
    umask = os.umask(0o022)
    os.umask(umask)

    def same_lora() -> str | None:
        return None if lora.read_bytes() == before else "the previous run's LoRA was overwritten without a backup"

    def modes() -> str | None:
        want = 0o666 & ~umask
        for f in (lora, out / "lora_kohya.safetensors"):
            if f.stat().st_mode & 0o777 != want:
                return f"{f.name} has mode {oct(f.stat().st_mode & 0o777)}, expected {oct(want)}"
        return None

    def moved() -> str | None:
        found = [p for p in out.iterdir() if p.name.startswith("replaced-")]
        if not found or (found[0] / "lora.safetensors").read_bytes() != before:
            return "the previous run's LoRA is gone (no replaced-* backup)"
        return None

    return [
        Case("output", "LoRA files get 0666 & ~umask", ["-c", "pass"], "any", check=modes),
        Case("output", "rerun into a previous run's folder", ["train", str(cfg)], "error", "previous run", check=same_lora),
        Case("output", "--check on a previous run's folder", ["train", str(cfg), "--check"], "error", "previous run",
             check=same_lora),
        Case("output", "--overwrite keeps the old run aside", ["train", str(cfg), "--overwrite"], "ok", check=moved),
    ]


def disk_cases(w: World) -> list[Case]:
    cases = []

    def limited(limit: int) -> Callable[[], None]:
        def pre() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return pre

    # RLIMIT_FSIZE: every file larger than the limit fails to write (EFBIG)
    for limit in (4_000, 60_000, 150_000):
        d = w.fresh(f"fsize-{limit}")
        cfg = write_config(w, d, train={"max_steps": 3, "checkpoint_every": 1})
        cases.append(Case("disk", f"file-size limit {limit} B during a fresh run", ["train", str(cfg)], "error", "cannot write",
                          preexec=limited(limit), check=lambda d=d: checkpoints_intact(d / "out"),
                          after=lambda cfg=cfg: _resumes(w, cfg)))  # fmt: skip
    cfg, out = _base_run(w, "fsize-resume-base", steps=1)
    keep = snapshot(out / "checkpoints")
    cases.append(Case("disk", "file-size limit while resuming", ["train", str(cfg), "--resume", "--max-steps", "3"], "error",
                      "--resume", preexec=limited(150_000), check=lambda out=out, keep=keep: checkpoints_intact(out, keep),
                      after=lambda cfg=cfg: _resumes(w, cfg, resume=True)))  # fmt: skip
    if not w.can_mount:
        return cases
    # a real full disk: the output folder on a small tmpfs; afterwards the tmpfs grows and the run must resume
    for size in ("48k", "160k", "420k", "800k"):
        d = w.fresh(f"tmpfs-{size}")
        mnt = d / "mnt"
        if not w.mount(mnt, size):
            continue
        cfg = write_config(w, d, out_dir=mnt / "out", train={"max_steps": 3, "checkpoint_every": 1, "checkpoints_keep": 0})
        cases.append(Case("disk", f"full tmpfs of {size} during a run", ["train", str(cfg)], "error", "no space left",
                          check=lambda mnt=mnt: checkpoints_intact(mnt / "out"),
                          after=lambda mnt=mnt, cfg=cfg: (w.remount(mnt, "size=64m"), _resumes(w, cfg))[1]))  # fmt: skip
    d = w.fresh("tmpfs-cache")
    mnt = d / "cache"
    if w.mount(mnt, "24k"):
        cfg = write_config(w, d, data={"cache_dir": str(mnt)})
        cases.append(Case("disk", "full cache folder", ["train", str(cfg)], "error", "cache", check=None))
    # read-only: a finished run's folder remounted read-only, then --resume with more steps
    d = w.fresh("tmpfs-ro")
    mnt = d / "mnt"
    if w.mount(mnt, "64m"):
        cfg = write_config(w, d, out_dir=mnt / "out", train={"max_steps": 1, "checkpoint_every": 1})
        first = w.te("train", str(cfg))
        if first.returncode == 0:
            keep = snapshot(mnt / "out")
            cases.append(Case("disk", "read-only output folder on --resume", ["train", str(cfg), "--resume", "--max-steps", "2"],
                              "error", "read-only", before=lambda mnt=mnt: w.remount(mnt, "ro"),
                              check=lambda mnt=mnt, keep=keep: None if snapshot(mnt / "out") == keep else "run folder changed",
                              after=lambda mnt=mnt, cfg=cfg: (w.remount(mnt, "rw"), _resumes(w, cfg, resume=True, steps=2))[1]))  # fmt: skip
    return cases


def _resumes(w: World, cfg: Path, *, resume: bool | None = None, steps: int | None = None) -> str | None:
    """After space is back the run must continue (``--resume`` when a checkpoint exists) and finish."""
    out = cfg.parent / "out"
    for line in cfg.read_text(encoding="utf-8").splitlines():
        if line.startswith("dir = "):
            out = Path(json.loads(line[6:]))
    has_ckpt = any((out / "checkpoints").glob("step-*")) if (out / "checkpoints").exists() else False
    argv = ["train", str(cfg)] + (["--resume"] if (resume or has_ckpt) else []) + (["--max-steps", str(steps)] if steps else [])
    again = w.te(*argv)
    if again.returncode != 0:
        return f"not resumable after freeing space: {again.stderr.strip().splitlines()[-1] if again.stderr.strip() else again.returncode}"
    return None


def lora_cases(w: World) -> list[Case]:
    d = w.fresh("lora")
    good = d / "good.safetensors"
    w.py(f"import torch; from safetensors.torch import save_file; save_file({{'lora_unet_a.lora_down.weight': torch.zeros(4, 4)}}, "
         f"{str(good)!r}, metadata={{'ss_training_comment': 'x'}})")  # fmt: skip
    raw = good.read_bytes()
    cases: list[Case] = []

    def add(name: str, data: bytes, expect: str = "error", needle: str = "") -> None:
        f = d / f"{name.replace(' ', '_')}.safetensors"
        f.write_bytes(data)
        cases.append(Case("lora", name, ["inspect", str(f)], expect, needle))

    add("truncated", raw[: len(raw) // 2], needle="not a valid safetensors file")
    add("empty file", b"", needle="too short")
    add("garbage", os.urandom(4096))
    add("huge header length", struct.pack("<Q", 2**62) + b"{}")
    body = ('{"t":{"dtype":"F32","shape":' + "[" * 60_000 + "]" * 60_000 + ',"data_offsets":[0,0]}}').encode()
    add("header nested 60k deep", struct.pack("<Q", len(body)) + body, needle="nested too deeply")

    def with_meta(meta: dict[str, str]) -> bytes:
        head = json.dumps({"__metadata__": meta, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        head += b" " * (-len(head) % 8)
        return struct.pack("<Q", len(head)) + head + b"\0\0\0\0"

    add("profile_json nested 100k deep", with_meta({"te_align.fingerprint": "x", "te_align.profile_json": "[" * 100_000 + "]" * 100_000}),
        needle="nested too deeply")  # fmt: skip
    f = d / "control.safetensors"
    f.write_bytes(with_meta({"ss_training_comment": "\x1b]0;owned\x07\x1b[2J\u202eexe", "ss_sd_model_name": "a\rb"}))
    cases.append(Case("lora", "control characters are escaped", ["inspect", str(f)], "ok", "\\x1b]0;owned",
                      check=lambda: None))  # fmt: skip
    return cases


def profile_cases(w: World) -> list[Case]:
    d = w.fresh("profile")
    made = w.py(f"import sys\nsys.path.insert(0, {str(w.repo)!r})\nfrom pathlib import Path\n"
                "from tests.support.files import diffusers_folder\nfrom te_align.profiles import bundled\n"
                f"diffusers_folder(Path({str(d / 'model')!r}), bundled('sd35-large'))\n")  # fmt: skip
    if made.returncode != 0:
        raise RuntimeError(made.stderr[-1500:])
    model = d / "model"
    index = model / "model_index.json"
    index_bytes = index.read_bytes()
    mine = d / "mine.toml"
    mine.write_text("# my notes\n", encoding="utf-8")

    def index_same() -> str | None:
        return None if index.read_bytes() == index_bytes else "the model's model_index.json was overwritten"

    def mine_same() -> str | None:
        return None if mine.read_text(encoding="utf-8") == "# my notes\n" else "an existing file was replaced without --force"

    def backup() -> str | None:
        bak = d / "mine.toml.bak"
        return None if bak.is_file() and bak.read_text(encoding="utf-8") == "# my notes\n" else "no backup of the replaced file"

    def no_folder() -> str | None:
        return "a missing folder was created" if (d / "newdir").exists() else None

    cases = [
        Case("profile", "build -o the model's model_index.json", ["profile", "build", str(model), "-o", str(index)], "error",
             "model", check=index_same),
        Case("profile", "build -o the model's model_index.json --force", ["profile", "build", str(model), "-o", str(index), "--force"],
             "error", "model", check=index_same),
        Case("profile", "build -o into the model folder", ["profile", "build", str(model), "-o", str(model / "p.toml")], "error",
             "model", check=lambda: "wrote into the model folder" if (model / "p.toml").exists() else None),
        Case("profile", "build -o an existing file", ["profile", "build", str(model), "-o", str(mine)], "error", "--force",
             check=mine_same),
        Case("profile", "build -o a missing folder", ["profile", "build", str(model), "-o", str(d / "newdir" / "p.toml")], "error",
             "does not exist", check=no_folder),
        Case("profile", "build -o an existing file --force", ["profile", "build", str(model), "-o", str(mine), "--force"], "ok",
             check=backup),
    ]  # fmt: skip
    for name, kv in (("t5_max_length=10**12", "t5_max_length=1000000000000"), ("negative hidden size", "t5_hidden_size=-4096"),
                     ("unknown dtype", "t5_dtype=float99"), ("zero layers", "clip_l_num_layers=0")):  # fmt: skip
        cases.append(Case("profile", f"override {name}", ["profile", "show", "sd35-large", "--set", kv], "error", "invalid override"))
    return cases


def api_cases(w: World) -> list[Case]:
    def snippet(body: str) -> list[str]:
        return ["-c", "import sys, te_align\nfrom te_align.errors import TeAlignError\ntry:\n" +
                "".join(f"    {line}\n" for line in body.splitlines()) +
                "except TeAlignError as e:\n    print(type(e).__name__ + ': ' + str(e), file=sys.stderr)\n"
                "    print('te-align: error: ' + type(e).__name__, file=sys.stderr)\n    sys.exit(2)\n"]  # fmt: skip

    enc = ("from te_align.tiny.pipelines import build_pipeline_for_encoding\nfrom te_align.tiny.fit import fit_profile\n"
           "pipe = build_pipeline_for_encoding('sd3')\np = fit_profile(te_align.profile('sd35-large'), pipe)\n")  # fmt: skip
    cases = [
        Case("api", "encode(None)", snippet(enc + "te_align.encode(p, None, pipeline=pipe)"), "error", "EncodingError"),
        Case("api", "encode([None])", snippet(enc + "te_align.encode(p, [None], pipeline=pipe)"), "error", "EncodingError"),
        Case("api", "encode with a lone surrogate", snippet(enc + "te_align.encode(p, ['a \\ud800 b'], pipeline=pipe)"), "error",
             "EncodingError"),
        Case("api", "encode with tokenizers as a list", snippet(enc + "te_align.encode(p, ['a'], tokenizers=[pipe.tokenizer], "
                                                                     "text_encoders={})"), "error", "EncodingError"),
        Case("api", "encode with a string as text encoder", snippet(
            enc + "toks = {'clip_l': pipe.tokenizer, 'clip_g': pipe.tokenizer_2, 't5': pipe.tokenizer_3}\n"
            "te_align.encode(p, ['a'], tokenizers=toks, text_encoders={'clip_l': 'x', 'clip_g': 'y', 't5': 'z'})"), "error",
             "EncodingError"),
        Case("api", "profile('')", snippet("te_align.profile('')"), "error", "ProfileError"),
        Case("api", "profile(None)", snippet("te_align.profile(None)"), "error", "ProfileError"),
        Case("api", "profile of a missing path", snippet("te_align.profile('/nonexistent/model')"), "error", "ProfileError"),
        Case("api", "ab run --seeds 0", ["ab", "run", "tiny-demo", "--seeds", "0", "--out", str(w.fresh("ab") / "o")], "error",
             "--seeds"),
    ]  # fmt: skip
    d = w.fresh("cache-overridden")
    w.py("import te_align, torch\nfrom te_align.encoding.cache.store import EmbeddingCache\nfrom te_align.encoding import Conditioning\n"
         f"p = te_align.profile('sd35-large', t5_max_length=77)\nc = EmbeddingCache({str(d / 'c')!r}, p, 'te', {{}})\n"
         "c.put('a', Conditioning({'prompt_embeds': torch.zeros(1, 2, 4)}, p.name, p.fingerprint(), [1]))\n")  # fmt: skip
    cases.append(Case("api", "cache info on an overridden profile's cache", ["cache", "info", str(d / "c")], "ok",
                      "overridden profile"))  # fmt: skip
    return cases


CLASSES: dict[str, Callable[[World], list[Case]]] = {
    "config": config_cases, "paths": path_cases, "dataset": dataset_cases, "checkpoint": checkpoint_cases,
    "output": output_cases, "disk": disk_cases, "lora": lora_cases, "profile": profile_cases, "api": api_cases,
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- run
def run_case(w: World, case: Case) -> Outcome:
    t0 = time.perf_counter()
    try:
        if case.before:
            case.before()
        if case.argv[:1] == ["-c"]:
            proc = subprocess.run([sys.executable, *case.argv], capture_output=True, text=True, env=w.env(), timeout=TIMEOUT,
                                  preexec_fn=case.preexec, cwd=w.root)  # fmt: skip
        else:
            proc = w.te(*case.argv, preexec=case.preexec)
    except subprocess.TimeoutExpired:
        return Outcome(case, "hang", f"no answer in {TIMEOUT} s", time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.strip()
    last = err.splitlines()[-1] if err else ""
    if "Traceback (most recent call last)" in proc.stderr or proc.returncode < 0:
        where = [ln for ln in err.splitlines() if ln and not ln.startswith(" ")][-1:] or [f"signal {-proc.returncode}"]
        return Outcome(case, "traceback", where[0][:200], seconds)
    loss = case.check() if case.check else None
    if not loss and case.after:
        loss = case.after()
    if loss:
        return Outcome(case, "data-loss", loss, seconds)
    if case.expect == "error":
        if proc.returncode != 2 or not last.startswith("te-align: error: ") or (case.needle and case.needle not in last):
            return Outcome(case, "wrong", f"exit {proc.returncode}: {(last or proc.stdout.strip()[-200:])[:240]}", seconds)
    elif case.expect == "ok":
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 or (case.needle and case.needle not in text):
            return Outcome(case, "wrong", f"exit {proc.returncode}: {last[:240]}", seconds)
    return Outcome(case, "pass", "", seconds)


def setup(repo: Path, root: Path) -> World:
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    code = (
        "import json\nfrom pathlib import Path\nfrom te_align.tiny.pipelines import build_model_folder\n"
        "from te_align.tiny.datasets import make_squares_dataset\nfrom te_align.tiny.fit import profile_overrides\n"
        f"build_model_folder('sd15', Path({str(root / 'model')!r}))\nmake_squares_dataset(Path({str(root / 'data')!r}), n=4)\n"
        "print(json.dumps(profile_overrides('sd15')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd=root)
    if out.returncode != 0:
        raise SystemExit(f"cannot build the tiny model and dataset with {repo}:\n{out.stderr[-2000:]}")
    overrides = json.loads(out.stdout.strip().splitlines()[-1])
    can_mount = False
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("mount"):
        probe = root / ".mount-probe"
        probe.mkdir()
        can_mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True).returncode == 0
        if can_mount:
            subprocess.run(["umount", str(probe)], capture_output=True)
        probe.rmdir()
    return World(repo, root, root / "model", root / "data", overrides, can_mount)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=HERE, help="te-align checkout to test (default: this one)")
    ap.add_argument("--only", default="", help="comma-separated classes: " + ", ".join(CLASSES))
    ap.add_argument("--json", type=Path, default=None, help="write every outcome here")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = ap.parse_args(argv)
    classes = [c for c in (args.only.split(",") if args.only else CLASSES) if c]
    unknown = [c for c in classes if c not in CLASSES]
    if unknown:
        ap.error(f"unknown class(es) {unknown}; choose from {', '.join(CLASSES)}")
    root = Path(tempfile.mkdtemp(prefix="te-align-campaign-"))
    w = setup(args.repo.resolve(), root)
    check = subprocess.run([sys.executable, "-c", "import te_align; print(te_align.__file__)"], capture_output=True, text=True,
                           env=w.env(), cwd=root)  # fmt: skip
    print(f"te_align imported from {check.stdout.strip()}")
    print(f"repo {w.repo}; temp {root}; tmpfs full-disk cases: {'yes' if w.can_mount else 'no (not root): file-size limits only'}")
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()
    try:
        for cls in classes:
            try:
                cases = CLASSES[cls](w)
            except RuntimeError as e:
                print(f"{cls}: set-up failed on this checkout: {str(e).strip().splitlines()[-1] if str(e).strip() else e}")
                continue
            for case in cases:
                o = run_case(w, case)
                outcomes.append(o)
                if o.status != "pass":
                    print(f"  [{o.status}] {cls}: {case.name}: {o.detail}", flush=True)
    finally:
        w.unmount_all()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    statuses = ("pass", "traceback", "hang", "data-loss", "wrong")
    print(f"\n{'class':<11}{'cases':>6}" + "".join(f"{s:>11}" for s in statuses))
    for cls in classes:
        mine = [o for o in outcomes if o.case.cls == cls]
        if mine:
            print(f"{cls:<11}{len(mine):>6}" + "".join(f"{sum(o.status == s for o in mine):>11}" for s in statuses))
    print(f"{'total':<11}{len(outcomes):>6}" + "".join(f"{sum(o.status == s for o in outcomes):>11}" for s in statuses))
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([{"class": o.case.cls, "case": o.case.name, "status": o.status, "detail": o.detail,
                                          "seconds": round(o.seconds, 2)} for o in outcomes], indent=1), encoding="utf-8")  # fmt: skip
    return 0 if all(o.status == "pass" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
