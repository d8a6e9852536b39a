"""What cached text-encoder files record, read from headers only (no numpy, no torch).

The formats trainers cache in: ``.npz`` zip archives of ``.npy`` arrays (the array shapes give the sequence
length the outputs were made with; 0-d bool arrays hold flags) and ``.safetensors`` files (the header gives
each tensor's shape). Which file holds which tensor is the trainer reader's knowledge
(``scan_cache`` of a reader in ``te_align/trainers/<trainer>/``); :func:`scan` walks a folder with it.
"""

from __future__ import annotations

import ast
import struct
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from te_align._safetensors import read_header
from te_align.errors import TeAlignError


class CacheScan(NamedTuple):
    """What a folder of cached text-encoder files records."""

    #: Files found.
    found: int
    #: Recorded sequence lengths -> file count (empty where the files do not record one comparable length).
    lengths: Counter[int]
    #: Files that could not be read.
    bad: int
    #: The profile path the lengths stand for.
    path: str
    #: te-align profile fingerprints the files carry -> file count (``""``: no fingerprint: made without te-align's
    #: hooks); empty where the format has no place for one.
    fingerprints: Counter[str]


#: A record reader: a cache file -> what it records (``{"length": n, <flag>: bool, …}``); raises on a bad file.
Record = Callable[[Path], dict[str, int | bool | str]]
#: The errors a record reader raises for an unreadable file.
UNREADABLE = (OSError, ValueError, zipfile.BadZipFile, SyntaxError, TeAlignError)


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


def npz_record(path: Path, array: str | None, flags: Sequence[str] = ()) -> dict[str, int | bool | str]:
    """``{"length": L, <flag>: bool, …}`` of one ``.npz`` file: the second-to-last axis of ``array`` and the
    0-d boolean arrays named in ``flags``."""
    out: dict[str, int | bool | str] = {}
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        if array and f"{array}.npy" in names:
            with zf.open(f"{array}.npy") as f:
                header, _ = _npy_header(f.read(4096))
            shape: tuple[int, ...] = header.get("shape") or ()
            if len(shape) >= 2:
                out["length"] = int(shape[-2])
        for flag in flags:
            if f"{flag}.npy" in names:
                raw = zf.read(f"{flag}.npy")
                header, off = _npy_header(raw)
                if header.get("shape") == () and raw[off:off + 1]:
                    out[flag] = raw[off] != 0
    return out


def npz_scalar(path: Path, name: str) -> float | None:
    """The value of the 0-d float array ``name`` in one ``.npz`` file (None: absent, or not a 0-d float32/float64
    array), such as a rate a trainer stored beside the cached outputs."""
    with zipfile.ZipFile(path) as zf:
        if f"{name}.npy" not in set(zf.namelist()):
            return None
        raw = zf.read(f"{name}.npy")
    header, off = _npy_header(raw)
    fmt = {"<f4": "<f", "<f8": "<d", ">f4": ">f", ">f8": ">d"}.get(str(header.get("descr")))
    if header.get("shape") != () or fmt is None or len(raw) < off + struct.calcsize(fmt):
        return None
    return float(struct.unpack(fmt, raw[off:off + struct.calcsize(fmt)])[0])


def safetensors_record(
    path: Path, tensor: str | Callable[[str], bool], axis: int = -2
) -> dict[str, int | bool | str]:
    """``{"length": L}`` of one ``.safetensors`` file from its header: axis ``axis`` of ``tensor`` (a name, or a
    test over names: the first tensor that passes)."""
    tensors = read_header(path).tensors
    name = tensor if isinstance(tensor, str) else next((n for n in sorted(tensors) if tensor(n)), None)
    found = tensors.get(name) if name is not None else None
    shape = found.shape if found is not None else ()
    return {"length": int(shape[axis])} if len(shape) >= max(2, -axis) else {}


def scan(directory: str, kinds: Sequence[tuple[str, Record | None, str]]) -> CacheScan:
    """Walk ``directory`` for each ``(file pattern, record reader or None, profile path)``: files found, a counter
    of recorded sequence lengths, the unreadable count, the profile path the lengths stand for, and the te-align
    fingerprints the records name (a record's ``"fingerprint"``, ``""`` when it has none)."""
    root = Path(directory)
    lengths: Counter[int] = Counter()
    fingerprints: Counter[str] = Counter()
    found = bad = 0
    path_of = ""
    seen: set[Path] = set()
    for pattern, record, ppath in kinds:
        for f in root.rglob(pattern):
            if f in seen:
                continue
            seen.add(f)
            found += 1
            if record is None:
                continue
            try:
                rec = record(f)
            except UNREADABLE:
                bad += 1
                continue
            length = rec.get("length")
            if isinstance(length, int):  # a record's length is an int; bool (a flag) is never stored under it
                lengths[length] += 1
                path_of = path_of or ppath
            if "fingerprint" in rec:
                fingerprint = rec["fingerprint"]
                fingerprints[fingerprint if isinstance(fingerprint, str) else ""] += 1
    return CacheScan(found, lengths, bad, path_of, fingerprints)
