"""``te_align._lazy.lazy_module``: the module-level mark of a deferred import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from te_align._lazy import LazyModule, lazy_module


def test_handle_imports_on_first_attribute_and_only_then() -> None:
    code = (
        "import sys\n"
        "from te_align._lazy import lazy_module\n"
        "m = lazy_module('te_align.kohya_lora')\n"
        "print('te_align.kohya_lora' in sys.modules, repr(m))\n"
        "name = m.__name__\n"
        "print('te_align.kohya_lora' in sys.modules, name, repr(m))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "False <lazy module 'te_align.kohya_lora' (not loaded yet)>",
        "True te_align.kohya_lora <lazy module 'te_align.kohya_lora' (loaded)>",
    ]


def test_handle_reads_like_the_module_and_is_read_only() -> None:
    import te_align._dtypes as real

    m = lazy_module("te_align._dtypes")
    assert isinstance(m, LazyModule)
    assert m.dtype_name is real.dtype_name and "dtype_name" in dir(m)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        m.nope  # noqa: B018
    with pytest.raises(AttributeError, match="read-only"):
        m.dtype_name = None
    with pytest.raises(ModuleNotFoundError, match=r"te_align\.not_a_module"):
        lazy_module("te_align.not_a_module").anything  # noqa: B018
