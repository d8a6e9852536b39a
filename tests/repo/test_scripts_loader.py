"""tests/support/scripts.py: the one loader the tests use for scripts in tools/ and benchmarks/ (not packages)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script, module_name

ROOT = Path(__file__).resolve().parents[2]


def test_a_script_is_executed_once_and_shared():
    first = load_script("tools/reach_table.py")
    assert first.__name__ == "te_align_script_tools_reach_table" == module_name("tools/reach_table.py")
    assert sys.modules[first.__name__] is first
    assert load_script("tools/reach_table.py") is first
    assert Path(first.__file__).resolve() == ROOT / "tools" / "reach_table.py"


def test_a_dataclass_in_a_script_finds_its_module():
    corpus = load_script("tools/check_corpus.py")  # its dataclasses look their module up in sys.modules
    assert sys.modules[corpus.Case.__module__] is corpus


def test_a_script_that_raises_is_not_kept(tmp_path: Path):
    script = tmp_path / "broken-tool.py"
    script.write_text("COUNT = 1\nraise RuntimeError('half loaded')\n", encoding="utf-8")
    name = module_name(str(script))
    with pytest.raises(RuntimeError, match="half loaded"):
        load_script(str(script))
    assert name not in sys.modules
    script.write_text("COUNT = 2\n", encoding="utf-8")
    try:
        assert load_script(str(script)).COUNT == 2
    finally:
        sys.modules.pop(name, None)


def test_no_test_loads_a_script_its_own_way():
    own = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").rglob("*.py"))
           if "spec_from_file_location" in p.read_text(encoding="utf-8")]
    assert own == ["tests/repo/test_scripts_loader.py", "tests/support/scripts.py"]
