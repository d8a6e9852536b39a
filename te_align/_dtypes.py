"""The one table of floating-point dtype names: ``bf16`` / ``bfloat16``, ``fp16`` / ``float16``, ``fp32`` / ``float32``.

Profiles, the train config, the A/B runner and :func:`te_align.encode` name dtypes by these
strings; :func:`torch_dtype` turns one into a ``torch.dtype`` and :func:`dtype_name` turns a
``torch.dtype`` back into its canonical name. Importing this module imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Accepted name -> canonical name (the ``torch`` attribute).
DTYPE_NAMES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def canonical_dtype(name: str) -> str:
    """``"bf16"`` -> ``"bfloat16"``; raises ValueError naming the accepted names."""
    try:
        return DTYPE_NAMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"expected a dtype name ({', '.join(DTYPE_NAMES)}), got {name!r}") from None


def torch_dtype(value: str | torch.dtype) -> torch.dtype:
    """A ``torch.dtype`` from a name in :data:`DTYPE_NAMES` (a ``torch.dtype`` is returned as is)."""
    import torch

    if isinstance(value, torch.dtype):
        return value
    dtype: torch.dtype = getattr(torch, canonical_dtype(value))
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (any dtype, as torch names it)."""
    return str(dtype).removeprefix("torch.")


__all__ = ["DTYPE_NAMES", "canonical_dtype", "dtype_name", "torch_dtype"]
