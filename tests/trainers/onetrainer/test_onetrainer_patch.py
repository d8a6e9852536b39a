"""``te-align patch | status | unpatch`` on a copy of a real OneTrainer checkout (TE_ALIGN_ONETRAINER_DIR)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from te_align.parts import detect as detect_any
from te_align.parts import plan_for
from te_align.patching import apply, revert, status
from te_align.patching.transaction import STATE_DIR, PatchError
from te_align.trainers.onetrainer.patch import ORIGINALS, SCRIPTS, detect, static_problems

ENV = "TE_ALIGN_ONETRAINER_DIR"
ROOT = os.environ.get(ENV)
REPO = Path(__file__).resolve().parents[3]


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o7777)
            for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.relative_to(root).parts}  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    if not ROOT:
        pytest.skip(f"set {ENV} to a Nerogar/OneTrainer checkout")
    dst = tmp_path / "OneTrainer"
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(".git", "venv", "__pycache__", "workspace*", "models"))
    return dst


def test_other_folders_are_not_onetrainer(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text("print(1)\n")
    assert detect(tmp_path) is None


def test_patch_status_unpatch_restores_every_byte(checkout: Path) -> None:
    before = _tree(checkout)
    det = detect_any(checkout)
    assert det.trainer == "onetrainer" and det.root == checkout
    plan = plan_for(det, "sd35-large")
    scripts = [s for s, _ in SCRIPTS if (checkout / s).is_file()]
    assert {c.path for c in plan.changes} == {*scripts, *(f"{ORIGINALS}/{s}" for s in scripts),
                                              f"{ORIGINALS}/README.txt", f"{ORIGINALS}/.gitignore"}  # fmt: skip
    assert "scripts/train.py" in scripts and "scripts/train_ui_qt.py" in scripts
    res = apply(plan)
    assert not res.noop
    for s in scripts:
        drop_in = (checkout / s).read_bytes()
        assert drop_in.startswith(b"# te-align drop-in for OneTrainer's " + s.encode())
        assert b"_te_os.environ.setdefault(\"TE_ALIGN_PROFILE\", 'sd35-large')" in drop_in
        assert (checkout / ORIGINALS / s).read_bytes() == before[s][0]
    st = status(checkout)
    assert st.patched and not st.changed and st.manifest["trainer"] == "onetrainer"
    assert apply(plan_for(detect_any(checkout), "sd35-large")).noop  # re-running is a no-op
    revert(checkout)
    assert _tree(checkout) == before
    assert not (checkout / STATE_DIR).exists() and not (checkout / ORIGINALS).exists()


def test_changed_target_signature_is_refused(checkout: Path) -> None:
    f = checkout / "modules" / "model" / "SanaModel.py"
    f.write_text(f.read_text().replace("attention_mask: Tensor = None,", "mask: Tensor = None,", 1))
    assert static_problems(checkout) == [
        "modules.model.SanaModel.SanaModel.encode_text: signature changed: expected (self, train_device, batch_size, "
        "rand, text, tokens, text_encoder_layer_skip, text_encoder_dropout_probability, text_encoder_output, "
        "attention_mask), found (self, train_device, batch_size, rand, text, tokens, text_encoder_layer_skip, "
        "text_encoder_dropout_probability, text_encoder_output, mask)"
    ]
    with pytest.raises(PatchError, match="te-align's hook targets do not match"):
        plan_for(detect_any(checkout), None)


def _run(checkout: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_ALIGN")}
    extra = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(PYTHONPATH=os.pathsep.join(extra), OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run([sys.executable, "scripts/train.py"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def test_drop_in_installs_after_script_imports_and_te_align_off_skips(checkout: Path) -> None:
    apply(plan_for(detect_any(checkout), None))
    # the kept original replaced by a probe script (this copy only): what does the drop-in give it?
    (checkout / ORIGINALS / "scripts" / "train.py").write_text(
        "from util.import_util import script_imports\n"
        "script_imports()\n"
        "import te_align.trainers.onetrainer.hooks as hooks\n"
        "print('te-align hooks installed:', hooks.is_installed())\n"
    )
    off = _run(checkout, {"TE_ALIGN": "off"})
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip().endswith("te-align hooks installed: False")
    on = _run(checkout, {})
    importable = all(importlib.util.find_spec(m) is not None for m in ("mgds", "torchvision", "av"))
    if importable:  # a OneTrainer environment: every target installs once script_imports() put the checkout on sys.path
        assert on.returncode == 0, on.stderr
        assert on.stdout.strip().endswith("te-align hooks installed: True")
    else:  # here: one clear line naming what is missing, no traceback
        assert on.returncode == 1
        last = on.stderr.strip().splitlines()[-1]
        assert last.startswith("te-align: OneTrainer hooks not installed (trainer version unknown (no git)")
        assert "Traceback" not in on.stderr
