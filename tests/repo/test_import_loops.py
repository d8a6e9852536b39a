"""Module-level import loops: ``tools/shape_metrics.py`` finds them with local and lazy imports counted, and
``te_align`` has none."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _metrics():
    return load_script("tools/shape_metrics.py")


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "te_align" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_local_lazy_relative_and_submodule_imports_close_loops(tmp_path):
    _tree(tmp_path, {
        "__init__.py": "",
        "pkg/__init__.py": "from te_align.pkg.a import A\n",
        "pkg/a.py": "from . import b\n\nA = 1\n",
        "pkg/b.py": "def f():\n    from te_align.pkg.a import A\n    return A\n",
        "pkg/d.py": "from te_align.pkg import A\n",  # a name of the package, not a module: no arrow back
        "lazy1.py": "from te_align._lazy import lazy_module\n\n_two = lazy_module('te_align.lazy2')\n",
        "lazy2.py": "import te_align.lazy1\n",
        "c.py": "from te_align import typed\n",
        "typed.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from te_align import c\n",
        "ex/__init__.py": """\
            from te_align._lazy import lazy_exports

            _EXPORTS = {"M": "te_align.ex.m"}
            __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
            HELPER = 1
            """,
        "ex/m.py": "from te_align.ex import HELPER\n\nM = HELPER\n",
        "i1.py": "import te_align.i2\n",
        "i2.py": "import importlib\n\ndef g():\n    return importlib.import_module('te_align.i1')\n",
    })
    m = _metrics()
    assert m.module_loops(m.load(tmp_path)) == [
        (["te_align.ex", "te_align.ex.m"],
         ["te_align/ex/__init__.py:3 -> te_align.ex.m (lazy)", "te_align/ex/m.py:1 -> te_align.ex"]),
        (["te_align.i1", "te_align.i2"],
         ["te_align/i1.py:1 -> te_align.i2", "te_align/i2.py:4 -> te_align.i1 (function-local)"]),
        (["te_align.lazy1", "te_align.lazy2"],
         ["te_align/lazy1.py:3 -> te_align.lazy2 (lazy)", "te_align/lazy2.py:1 -> te_align.lazy1"]),
        (["te_align.pkg.a", "te_align.pkg.b"],
         ["te_align/pkg/a.py:1 -> te_align.pkg.b", "te_align/pkg/b.py:2 -> te_align.pkg.a (function-local)"]),
    ]
    assert m.measure(tmp_path)["import loops between modules"] == 4


def test_te_align_has_no_module_level_import_loop():
    """7 loops at 2d98a53; the last (the environment step and the patch transaction recovered each other) went
    when the journal engine (te_align/patching/journal.py) was split from the patch on top of it: the engine
    imports no step, its caller hands it the environment step's recovery."""
    shape = _metrics().measure(ROOT)
    assert shape["_module_loops"] == []
    assert shape["import loops between modules"] == 0
