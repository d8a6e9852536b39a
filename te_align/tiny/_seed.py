"""Deterministic construction of the tiny models: a seed per model name, the caller's RNG left untouched."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

import torch


def seed_for(name: str) -> int:
    """The fixed seed of the tiny model called ``name`` (CRC-32 of the name)."""
    return zlib.crc32(name.encode())


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with the global CPU torch RNG set to ``seed``, restoring the caller's state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def finish(model: torch.nn.Module) -> Any:
    """``model`` in eval mode, after checking that it was built in float32."""
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise AssertionError(f"{type(model).__name__} was not built in float32")
    return model.eval()
