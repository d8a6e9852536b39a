"""The one ``.safetensors`` header reader (and writer), with the one size limit.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (tensor
names -> dtype, shape and data offsets, plus an optional ``__metadata__`` table of strings), then
the tensor bytes. Profile sources read checkpoint headers, :mod:`te_align.metadata` reads and
rewrites LoRA headers, the embedding cache and the audit read cache-file headers: all of them
through :func:`read_header` / :func:`parse_header`, which check what the safetensors library
checks (a sane length, a JSON object, string metadata, dtypes whose sizes match their shapes, and
tensor data that exactly tiles the rest of the file). No tensor is loaded; this module imports no
torch (nor numpy, nor the safetensors package).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from te_align.errors import TeAlignError

if TYPE_CHECKING:
    from te_align._types import JSONValue

#: Headers larger than this are refused, as the safetensors library refuses them.
MAX_HEADER_BYTES = 100_000_000

#: Bytes per element of the safetensors dtypes (sub-byte float formats are not size-checked).
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


class SafetensorsError(TeAlignError):
    """A file that is not a readable safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a header."""

    dtype: str
    shape: tuple[int, ...]
    #: Byte range of the tensor inside the data section (after the header).
    data_offsets: tuple[int, int]


@dataclass(frozen=True)
class Header:
    """The parsed header of a safetensors file (no tensor data)."""

    #: The file as named in messages.
    path: str
    header_len: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    #: Byte offset of the tensor data (8 + header_len) and its length.
    data_start: int
    data_len: int
    #: The header JSON object as read (tensor entries and ``__metadata__``, in file order).
    raw: dict[str, JSONValue] = field(repr=False, default_factory=dict)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape."""
        return {k: t.shape for k, t in self.tensors.items()}


def parse_header(data: bytes, file_size: int, *, label: str = "<bytes>",
                 error: type[TeAlignError] = SafetensorsError) -> Header:
    """Parse and validate a header from the first bytes of a file (at least ``8 + N`` of them).

    Raises ``error`` as one line, ``LABEL: not a valid safetensors file: …``.
    """

    def bad(msg: str) -> TeAlignError:
        return error(f"not a valid safetensors file: {msg}", file=label)

    if file_size < 8 or len(data) < 8:
        raise bad(f"only {file_size} bytes, too short for the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES:
        raise bad(f"a header of {n} bytes is over the {MAX_HEADER_BYTES // 1_000_000} MB limit")
    if n == 0 or 8 + n > file_size or len(data) < 8 + n:
        raise bad(f"header length {n} does not fit the {file_size}-byte file (truncated?)")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = getattr(e, "pos", getattr(e, "start", "?"))
        raise bad(f"the header is not valid JSON ({e.__class__.__name__} at byte {where})") from None
    if not isinstance(header, dict):
        raise bad(f"expected a JSON object as header, got {type(header).__name__}")
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise bad("__metadata__ must map strings to strings")
    data_len = file_size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise bad(f"tensor '{key}' has no description")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise bad(f"tensor '{key}' has no dtype")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise bad(f"tensor '{key}' has a bad shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise bad(f"tensor '{key}' has bad data_offsets {offsets!r}")
        if dtype in DTYPE_SIZES:
            numel = 1
            for d in shape:
                numel *= d
            if offsets[1] - offsets[0] != numel * DTYPE_SIZES[dtype]:
                raise bad(
                    f"tensor '{key}' ({dtype} {shape}) does not fit its {offsets[1] - offsets[0]} bytes"
                )
        tensors[key] = TensorInfo(dtype, tuple(shape), (offsets[0], offsets[1]))
    end = 0
    for key, t in sorted(tensors.items(), key=lambda kv: kv[1].data_offsets):
        if t.data_offsets[0] != end:
            raise bad(
                f"tensor '{key}' starts at {t.data_offsets[0]}, expected {end} (overlapping or gapped data)"
            )
        end = t.data_offsets[1]
    if end != data_len:
        raise bad(
            f"tensor data is {data_len} bytes but the header describes {end} (truncated or padded file)"
        )
    return Header(label, n, tensors, dict(meta), 8 + n, data_len, header)


def read_header(path: str | os.PathLike[str], *, label: str | None = None,
                error: type[TeAlignError] = SafetensorsError) -> Header:
    """Read and validate only the header of a safetensors file (``label`` names it in messages)."""
    name = str(path) if label is None else label
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            first = f.read(8)
            if len(first) == 8:
                (n,) = struct.unpack("<Q", first)
                if 0 < n <= MAX_HEADER_BYTES and 8 + n <= size:
                    first += f.read(n)
    except FileNotFoundError:
        raise error("no such file", file=name) from None
    except IsADirectoryError:
        raise error("is a folder, not a .safetensors file", file=name) from None
    except OSError as e:
        raise error(f"cannot read: {e.strerror}", file=name) from None
    return parse_header(first, size, label=name, error=error)


def encode_header(header: dict[str, object]) -> bytes:
    """Length + header JSON, padded with spaces so the tensor data starts at a multiple of 8 bytes."""
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body


__all__ = [
    "DTYPE_SIZES",
    "MAX_HEADER_BYTES",
    "Header",
    "SafetensorsError",
    "TensorInfo",
    "encode_header",
    "parse_header",
    "read_header",
]
