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
from typing import Any

from te_align._atomic import atomic_file, fsync_dir
from te_align.train.config import TrainError

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


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
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


def _torch_bytes(obj: Any) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_checkpoint(
    output_dir: str | os.PathLike[str],
    step: int,
    *,
    params: Mapping[str, Any],
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    keep: int = 0,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Write ``step-NNNNNNNN`` atomically and prune to the newest ``keep`` (0 = keep all).

    ``rng``: the RNG states to store (default: this process's :func:`rng_state`); a data-parallel
    run passes its own state with every process's state under ``"ranks"``.
    """
    from safetensors.torch import save

    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:08d}.", suffix=".tmp", dir=root))
    try:
        tensors = {k: v.detach().float().cpu().contiguous() for k, v in params.items()}
        with atomic_file(tmp / "trainable.safetensors", error=TrainError) as f:
            f.write(save(tensors))
        with atomic_file(tmp / "optimizer.pt", error=TrainError) as f:
            f.write(_torch_bytes(optimizer.state_dict()))
        with atomic_file(tmp / "scheduler.pt", error=TrainError) as f:
            f.write(_torch_bytes(scheduler.state_dict()))
        with atomic_file(tmp / "rng.pt", error=TrainError) as f:
            f.write(_torch_bytes(rng if rng is not None else rng_state()))
        payload = dict(state, format=STATE_FORMAT, step=step)
        with atomic_file(tmp / "state.json", "w", error=TrainError) as f:
            f.write(json.dumps(payload, indent=1, sort_keys=True))
        if final.exists():
            old = root / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep > 0:
        for _, d in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(d, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint folder: ``{"params", "optimizer", "scheduler", "rng", "state"}``."""
    import torch
    from safetensors.torch import load_file

    d = Path(path)
    if not (d / "state.json").is_file():
        raise TrainError("not a te-align checkpoint folder (no state.json)", file=str(d), key="--resume")
    try:
        state = json.loads((d / "state.json").read_text(encoding="utf-8"))
        return {
            "params": load_file(str(d / "trainable.safetensors")),
            "optimizer": torch.load(d / "optimizer.pt", map_location="cpu", weights_only=False),
            "scheduler": torch.load(d / "scheduler.pt", map_location="cpu", weights_only=False),
            "rng": torch.load(d / "rng.pt", map_location="cpu", weights_only=False),
            "state": state,
        }
    except (OSError, ValueError, RuntimeError) as e:
        raise TrainError(f"cannot read checkpoint: {e}", file=str(d), key="--resume") from None


__all__ = ["latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint"]
