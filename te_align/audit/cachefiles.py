"""What trainers' cached text-encoder files record, read from headers only (no numpy, no torch).

sd-scripts ``*_te.npz`` files are zip archives of ``.npy`` arrays: the array shapes give the sequence
length the outputs were made with, and SD3/FLUX files store the mask flags as 0-d bool arrays
(library/strategy_flux.py:107-194, strategy_sd3.py:256-381, strategy_sdxl.py:222-306,
strategy_lumina.py:147-281 at 48d368fa). ai-toolkit ``_t_e_cache/*.safetensors`` store ``text_embed``
(toolkit/prompt_utils.py:119-141 at 27a03a9); the safetensors header gives its shape.
"""

from __future__ import annotations

import ast
import struct
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from te_align._safetensors import read_header
from te_align.errors import TeAlignError

#: sd-scripts cache suffix -> (array, profile path its sequence axis records)
NPZ_LENGTH = {
    "_flux_te.npz": ("t5_out", "t5.tokenizer.max_length"),
    "_sd3_te.npz": ("t5_out", "t5.tokenizer.max_length"),
    "_te_outputs.npz": ("hidden_state1", "clip_l.tokenizer.max_length"),
    "_lumina_te.npz": ("hidden_state", "gemma.tokenizer.max_length"),
}


def _npy_header(data: bytes) -> tuple[dict[str, Any], int]:
    if data[:6] != b"\x93NUMPY":
        raise ValueError("not an .npy array")
    major = data[6]
    if major == 1:
        (hlen,) = struct.unpack("<H", data[8:10])
        start = 10
    else:
        (hlen,) = struct.unpack("<I", data[8:12])
        start = 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    return header, start + hlen


def npz_record(path: Path) -> dict[str, Any]:
    """``{"length": L, "apply_t5_attn_mask": bool, …}`` for one sd-scripts cache file."""
    out: dict[str, Any] = {}
    suffix = next((s for s in NPZ_LENGTH if path.name.endswith(s)), None)
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        if suffix:
            arr, _ = NPZ_LENGTH[suffix]
            if f"{arr}.npy" in names:
                with zf.open(f"{arr}.npy") as f:
                    header, _ = _npy_header(f.read(4096))
                shape = header.get("shape") or ()
                if len(shape) >= 2:
                    out["length"] = int(shape[-2])
        for flag in ("apply_t5_attn_mask", "apply_lg_attn_mask"):
            if f"{flag}.npy" in names:
                raw = zf.read(f"{flag}.npy")
                header, off = _npy_header(raw)
                if header.get("shape") == () and raw[off:off + 1]:
                    out[flag] = raw[off] != 0
    return out


def safetensors_record(path: Path) -> dict[str, Any]:
    """``{"length": L}`` for one ai-toolkit cache file (its ``text_embed`` shape), from the header only."""
    tensor = read_header(path).tensors.get("text_embed")
    shape = tensor.shape if tensor is not None else ()
    return {"length": int(shape[-2])} if len(shape) >= 2 else {}


def scan(directory: str, trainer: str) -> tuple[int, Counter[int], int, str]:
    """Files found, a counter of recorded sequence lengths, unreadable count, and the profile path
    the lengths stand for."""
    root = Path(directory)
    lengths: Counter[int] = Counter()
    found = bad = 0
    path_of = ""
    if trainer in ("kohya", "kohya-gui"):
        for suffix, (_, ppath) in NPZ_LENGTH.items():
            for f in root.rglob(f"*{suffix}"):
                found += 1
                try:
                    rec = npz_record(f)
                except (OSError, ValueError, zipfile.BadZipFile, SyntaxError):
                    bad += 1
                    continue
                if "length" in rec:
                    lengths[rec["length"]] += 1
                    path_of = ppath
    elif trainer == "ai-toolkit":
        for f in root.rglob("*.safetensors"):
            found += 1
            try:
                rec = safetensors_record(f)
            except TeAlignError:
                bad += 1
                continue
            if "length" in rec:
                lengths[rec["length"]] += 1
    else:
        found = sum(1 for _ in root.rglob("*.pt"))
    return found, lengths, bad, path_of
