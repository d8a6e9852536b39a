"""`te-align check` on every config a trainer checkout ships (tools/check_corpus.py): no traceback, and every exit 0
backed by a rule that ran. Each trainer needs its checkout in an environment variable and is skipped without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from te_align.checking import check_file
from tests.support.scripts import load_script

corpus = load_script("tools/check_corpus.py")


@pytest.mark.parametrize("trainer", sorted(corpus.ENV))
def test_shipped_configs_check_cleanly(trainer, tmp_path):
    var = corpus.ENV[trainer]
    root = os.environ.get(var)
    if not root:
        pytest.skip(f"set {var} to a {trainer} checkout to check its shipped configs")
    cases = corpus.FINDERS[trainer](Path(root), tmp_path)
    assert cases, f"no shipped configs found under {root}"
    for case in cases:
        r = check_file(case.path, trainer=case.trainer, extra_args=case.extra)
        assert r.exit_code in (0, 1, 2, 3), case.name
        if r.exit_code == 0:
            assert r.rules_ran, f"{case.name}: exit 0 without a rule that ran"
        if r.status in ("not-checked", "not-training"):
            assert r.reason, case.name
