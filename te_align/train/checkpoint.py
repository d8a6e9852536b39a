"""Resumable checkpoints: trainable weights, optimizer, LR schedule, RNG states and the data position.

A checkpoint is a folder ``<output>/checkpoints/step-00000010/`` written file by file into a hidden
temp folder (each file with :func:`te_align._atomic.atomic_file`) and renamed into place only when
complete, so an interrupted save never corrupts or replaces the last good checkpoint. ``state.json``
is written last; a folder without it is not a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._atomic import fsync_dir
from te_align._paths import read_bytes
from te_align._types import JSONObject, JSONValue
from te_align.train._io import WriteError, write_atomic, writing
from te_align.train.config import TrainError

if TYPE_CHECKING:  # pragma: no cover
    import torch

_STEP_DIR = re.compile(r"^step-(\d+)$")
STATE_FORMAT = 1


def checkpoint_root(output_dir: str | os.PathLike[str]) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / "state.json").is_file():
            out.append((int(m.group(1)), d))
    return sorted(out)


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, object]:
    import numpy as np
    import torch

    state: dict[str, object] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _torch_bytes(obj: object) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def save_checkpoint(
    output_dir: str | os.PathLike[str],
    step: int,
    *,
    params: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: JSONObject,
    keep: int = 0,
    rng: dict[str, object] | None = None,
) -> Path:
    """Write ``step-NNNNNNNN`` atomically and prune to the newest ``keep`` (0 = keep all).

    ``rng``: the RNG states to store (default: this process's :func:`rng_state`); a data-parallel
    run passes its own state with every process's state under ``"ranks"``. ``state.json`` (written
    last) records the sha256 of every other file, so a damaged file is found on resume.
    A full disk or read-only folder raises :class:`~te_align.train._io.WriteError`; the newest
    complete checkpoint is never touched before the new one is complete.
    """
    root = checkpoint_root(output_dir)
    final = root / f"step-{step:08d}"
    with writing(root):
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:08d}.", suffix=".tmp", dir=root))
    try:
        _write_files(tmp, final, params, optimizer, scheduler, state, step, rng)
    except WriteError as e:  # name the checkpoint being written, not its temp folder (removed below)
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(e.message, file=str(final / Path(e.file or "").name)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep > 0:
        for _, d in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(d, ignore_errors=True)
    return final


def _write_files(
    tmp: Path,
    final: Path,
    params: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: JSONObject,
    step: int,
    rng: dict[str, object] | None,
) -> None:
    from safetensors.torch import save

    root = final.parent
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in params.items()}
    blobs = {
        "trainable.safetensors": save(tensors),
        "optimizer.pt": _torch_bytes(optimizer.state_dict()),
        "scheduler.pt": _torch_bytes(scheduler.state_dict()),
        "rng.pt": _torch_bytes(rng if rng is not None else rng_state()),
    }
    for name, blob in blobs.items():
        write_atomic(tmp / name, blob)
    payload = dict(state, format=STATE_FORMAT, step=step, files={k: _sha256(v) for k, v in blobs.items()})
    write_atomic(tmp / "state.json", json.dumps(payload, indent=1, sort_keys=True))
    with writing(final):
        if final.exists():
            old = root / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    fsync_dir(root)


class CheckpointError(TrainError):
    """A checkpoint folder that is missing, incomplete or damaged."""


def _check_state(state: JSONValue) -> JSONObject:
    if not isinstance(state, dict):
        raise ValueError(f"state.json holds {type(state).__name__}, expected a table")
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"state.json has no valid step (got {step!r})")
    pos = state.get("position")
    if not (isinstance(pos, dict) and set(pos) == {"epoch", "index"}
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pos.values())):
        raise ValueError(f"state.json has no valid data position (got {pos!r})")
    if not isinstance(state.get("fingerprint"), str):
        raise ValueError("state.json has no profile fingerprint")
    files = state.get("files", {})
    if not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        raise ValueError("state.json has a malformed file list")
    return state


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and verify a checkpoint folder: ``{"params", "optimizer", "scheduler", "rng", "state"}``.

    Every file is checked (its recorded sha256 where state.json has one, its structure otherwise):
    a truncated or garbage file, an empty RNG file or a ``state.json`` of ``{}`` raises
    :class:`CheckpointError` naming the file, never a ``KeyError`` or an unpickling traceback.
    """
    import io

    import torch
    from safetensors.torch import load

    d = Path(path)
    if not (d / "state.json").is_file():
        raise CheckpointError("not a te-align checkpoint folder (no state.json)", file=str(d), key="--resume")
    where = d / "state.json"
    try:
        try:
            state = _check_state(json.loads(read_bytes(where, CheckpointError).decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"state.json is not valid JSON ({type(e).__name__})") from None
        out: dict[str, Any] = {"state": state}
        for name, key in (("trainable.safetensors", "params"), ("optimizer.pt", "optimizer"),
                          ("scheduler.pt", "scheduler"), ("rng.pt", "rng")):
            where = d / name
            blob = read_bytes(where, CheckpointError)
            want = state.get("files", {}).get(name)
            if want is not None and _sha256(blob) != want:
                raise ValueError("its bytes do not match the sha256 recorded in state.json (damaged or replaced)")
            if not blob:
                raise ValueError("the file is empty")
            out[key] = load(blob) if key == "params" else torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
        where = d
        if not all(torch.is_tensor(v) for v in out["params"].values()):
            raise ValueError("trainable.safetensors holds non-tensors")
        bad = [k for k, v in out["params"].items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            where = d / "trainable.safetensors"
            raise ValueError(f"{len(bad)} tensors hold NaN or infinity (e.g. {bad[0]})")
        opt = out["optimizer"]
        if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)):
            where = d / "optimizer.pt"
            raise ValueError("not an optimizer state")
        if not (isinstance(out["scheduler"], dict) and "last_epoch" in out["scheduler"]):
            where = d / "scheduler.pt"
            raise ValueError("not a learning-rate schedule state")
        rng = out["rng"]
        if not (isinstance(rng, dict) and {"python", "numpy", "torch"} <= set(rng)):
            where = d / "rng.pt"
            raise ValueError("not an RNG state")
        return out
    except CheckpointError:
        raise
    except Exception as e:  # torch.load and safetensors raise many types for damaged files
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"damaged checkpoint file: {text}", file=str(where), key="--resume") from None


__all__ = ["CheckpointError", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint"]
