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


def test_no_module_rebinds_its_lazy_handle_name() -> None:
    """A ``def _folder`` below ``_folder = lazy_module(...)`` silently replaces the handle (CI caught one)."""
    import ast
    from pathlib import Path

    clashes = []
    for path in sorted((Path(__file__).resolve().parents[2] / "te_align").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        handles = {
            t.id
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "lazy_module"
            for t in node.targets if isinstance(t, ast.Name)
        }  # fmt: skip
        bound = [
            n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ] + [t.id for n in tree.body if isinstance(n, ast.Assign) and not (isinstance(n.value, ast.Call)
             and getattr(n.value.func, "id", "") == "lazy_module") for t in n.targets if isinstance(t, ast.Name)]  # fmt: skip
        clashes += [f"{path.name}: {name}" for name in sorted(handles & set(bound))]
    assert clashes == []
