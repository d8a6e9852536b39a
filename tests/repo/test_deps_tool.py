"""tools/deps.py: the lowest job pins each direct dependency to a release that exists (no network here: the
index's version lists are given)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import deps  # noqa: E402

#: setuptools' releases around the test extra's bound, as the index lists them (newest first): 77.0.0 was never
#: released, so ``setuptools==77`` (the literal bound) cannot be installed.
SETUPTOOLS = ["80.0.0", "78.1.1", "78.0.1", "77.0.3", "77.0.1", "76.1.0", "76.0.0"]


@pytest.mark.parametrize(("spec", "versions", "want"), [
    (">=77", SETUPTOOLS, "77.0.1"),
    (">=5.12,<5.24", ["5.24.0", "5.23.0", "5.13.0rc1", "5.12.0", "5.11.0"], "5.12.0"),
    (">=0.22.1", ["0.23.0", "0.22.2", "0.22.1", "0.22.0"], "0.22.1"),
    (">=2.6", ["2.13.0+cpu", "2.13.0", "2.7.0", "2.6.0", "2.5.1"], "2.6.0"),
    (">=3", ["2.1", "2.0"], None),
])
def test_lowest_release_is_one_the_index_has(spec, versions, want):
    assert deps.lowest_release(spec, versions) == want


def test_every_declared_range_parses_and_has_a_lower_bound():
    reqs = deps.direct_requirements()
    assert reqs["setuptools"] == ">=77" and reqs["transformers"] == ">=5.12,<5.24"
    for name, spec in reqs.items():
        assert deps.lower_bound(spec) is not None, name
        assert deps.lowest_release(spec, [deps.lower_bound(spec)]) is not None, name  # the bound is in its range


def test_pins_say_where_they_leave_the_literal_bound(monkeypatch):
    index = {"setuptools": SETUPTOOLS}
    monkeypatch.setattr(deps, "_index_versions", lambda python, name: index.get(name, []))
    log: list[str] = []
    pins = deps.lowest_pins(Path("python"), log)
    assert pins["setuptools"] == "77.0.1"
    assert "setuptools: '>=77' starts at release 77.0.1 (77 itself is not released)" in log
    assert pins["torch"] == "2.6"  # not listed: the bound itself, said in the log
    assert any(line.startswith("torch: the index lists no release in '>=2.6' (index unreachable?)") for line in log)
