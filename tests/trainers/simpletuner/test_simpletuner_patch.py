"""``te-align patch | status | unpatch`` on a SimpleTuner checkout: a copy of a real checkout
(``TE_ALIGN_SIMPLETUNER_DIR``) gets the boot block in ``simpletuner/__init__.py``, a new SimpleTuner process then
runs hooked (pinned profile; ``TE_ALIGN=off`` not), and unpatch restores every byte of the tree."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from te_align.cli import main
from te_align.trainers.simpletuner import patch as planner

ENV = "TE_ALIGN_SIMPLETUNER_DIR"
ROOT = Path(__file__).resolve().parents[3]


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def checkout(tmp_path):
    src = os.environ.get(ENV)
    if not src:
        pytest.skip(f"{ENV} is not set (path of a bghira/SimpleTuner checkout)")
    if not (Path(src) / planner.INIT).is_file():
        pytest.skip(f"{ENV}={src} has no {planner.INIT}")
    dst = tmp_path / "SimpleTuner"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".te-align*", "__pycache__", ".git"))
    return dst


def test_patch_status_unpatch_restores_every_byte(checkout, capsys):
    before = tree(checkout)
    assert main(["patch", str(checkout), "--profile", "sd35-large"]) == 0
    out = capsys.readouterr().out
    assert f"simpletuner (checkout, version 4.8.0) at {checkout}" in out
    assert "replace simpletuner/__init__.py  (appends te-align's boot block)" in out
    init = (checkout / planner.INIT).read_bytes()
    original = (Path(os.environ[ENV]) / planner.INIT).read_bytes()
    assert init.startswith(original) and planner.BLOCK_MARK in init and b"_PINNED_PROFILE = 'sd35-large'" in init
    assert main(["status", str(checkout)]) == 0
    assert "intact   simpletuner/__init__.py" in capsys.readouterr().out
    assert main(["patch", str(checkout), "--profile", "sd35-large"]) == 0
    assert "already patched with this plan: nothing to do" in capsys.readouterr().out
    assert main(["unpatch", str(checkout)]) == 0
    assert tree(checkout) == before
    assert not (checkout / ".te-align").exists()


def test_patched_checkout_runs_hooked_in_a_new_process(checkout):
    assert main(["patch", str(checkout), "--profile", "sd35-large"]) == 0
    code = (
        "from te_align.probe import _stubs\n"
        "from te_align.trainers.simpletuner.probe import OPTIONAL_IMPORTS\n"
        "import diffusers, transformers\n"
        f"with _stubs.stub_missing(OPTIONAL_IMPORTS, [{str(checkout)!r}]):\n"
        "    import simpletuner.helpers.caching.text_embeds\n"
        "from te_align.trainers.simpletuner import hooks as st\n"
        "h = st.current()\n"
        "print(h is not None and h.is_installed, h.profile if h else None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TE_ALIGN", "TE_ALIGN_SIMPLETUNER", "TE_ALIGN_PROFILE")}
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), str(ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=checkout)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "True sd35-large"
    env["TE_ALIGN"] = "off"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=checkout)
    assert run.stdout.strip().splitlines()[-1] == "False None"
    assert main(["unpatch", str(checkout)]) == 0


def test_changed_since_and_block_without_manifest(checkout, capsys):
    init = checkout / planner.INIT
    assert main(["patch", str(checkout)]) == 0
    pulled = b'"""a newer SimpleTuner"""\n__version__ = "4.8.0"\n'
    init.write_bytes(pulled)  # e.g. git pull replaced the patched file
    assert main(["status", str(checkout)]) == 1
    assert "changed  simpletuner/__init__.py  (changed since it was patched" in capsys.readouterr().out
    assert main(["patch", str(checkout), "--replan"]) == 0
    assert init.read_bytes().startswith(pulled) and planner.BLOCK_MARK in init.read_bytes()
    assert main(["unpatch", str(checkout)]) == 0
    assert init.read_bytes() == pulled  # the new original comes back
    capsys.readouterr()
    init.write_bytes(pulled + planner.block(None))
    assert main(["patch", str(checkout)]) == 2
    out = capsys.readouterr()
    assert "holds te-align's block but" in out.out + out.err


def test_not_a_checkout_is_not_detected(tmp_path):
    (tmp_path / "simpletuner").mkdir()
    (tmp_path / planner.INIT).write_text('__version__ = "4.8.0"\n', encoding="utf-8")
    assert planner.detect(tmp_path) is None
