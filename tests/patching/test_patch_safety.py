"""Patch safety (issue 15): keep-changed never deletes an original, one lock per tree, state-file paths stay
inside the tree, re-plan keeps the user's edits, refusals that fit the tree (no git hint without git), full disk
and read-only file systems, damaged state files, missing paths. Trees in the shape of sd-scripts, the kohya_ss
GUI and ai-toolkit come from tools/fault_campaign.py (the same builders the campaign sweeps)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from te_align import _atomic
from te_align.cli import main
from te_align.patching import FileChange, Plan, apply, revert, sha256_file, status
from te_align.patching.transaction import STATE_DIR, revert_report
from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
campaign = load_script("tools/fault_campaign.py")  # tools/ is not a package: the campaign's tree builders


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("te-align: error: "), err
    return lines[0]


@pytest.fixture
def kohya(tmp_path: Path) -> Path:
    return campaign.fake_kohya(tmp_path / "sd-scripts")


@pytest.fixture
def toolkit(tmp_path: Path) -> Path:
    return campaign.fake_ai_toolkit(tmp_path / "ai-toolkit")


# ------------------------------------------------------------------------------ 1: keep-changed
def test_keep_changed_keeps_the_original_a_kept_kohya_drop_in_runs(kohya):
    pristine = (kohya / "train_network.py").read_bytes()
    other = (kohya / "flux_train_network.py").read_bytes()
    assert _cli("patch", str(kohya))[0] == 0
    edited = (kohya / "train_network.py").read_bytes() + b"# my change\n"
    (kohya / "train_network.py").write_bytes(edited)
    rc, out, _ = _cli("unpatch", str(kohya), "--keep-changed")
    assert rc == 0
    assert "kept te_align_originals/train_network.py (the original that train_network.py runs)" in out
    assert (kohya / "train_network.py").read_bytes() == edited
    assert (kohya / "te_align_originals" / "train_network.py").read_bytes() == pristine
    assert (kohya / "flux_train_network.py").read_bytes() == other  # the others are restored
    assert not (kohya / "te_align_originals" / "flux_train_network.py").exists()
    assert not (kohya / STATE_DIR).exists()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TE_ALIGN": "off"}
    run = subprocess.run([sys.executable, "train_network.py", "a"], cwd=kohya, capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "train_network.py ['a']", run.stderr


def test_keep_changed_on_a_manifest_of_an_older_te_align(kohya):
    """Manifests written before ``original_of`` existed: the copy holding the original is found by its bytes."""
    pristine = (kohya / "train_network.py").read_bytes()
    assert _cli("patch", str(kohya))[0] == 0
    m_path = kohya / STATE_DIR / "manifest.json"
    m = json.loads(m_path.read_text())
    for e in m["files"].values():
        e.pop("original_of", None)
    m_path.write_text(json.dumps(m))
    (kohya / "train_network.py").write_bytes(b"# edited\n")
    assert _cli("unpatch", str(kohya), "--keep-changed")[0] == 0
    assert (kohya / "te_align_originals" / "train_network.py").read_bytes() == pristine
    assert not (kohya / "train_network.py.te-align-original").exists()


def test_keep_changed_keeps_ai_toolkit_original_run(toolkit):
    pristine = (toolkit / "run.py").read_bytes()
    assert _cli("patch", str(toolkit))[0] == 0
    (toolkit / "run.py").write_bytes((toolkit / "run.py").read_bytes() + b"# mine\n")
    rc, out, _ = _cli("unpatch", str(toolkit), "--keep-changed")
    assert rc == 0 and "kept te_align_original_run.py" in out
    assert (toolkit / "te_align_original_run.py").read_bytes() == pristine
    assert not (toolkit / "extensions" / "te_align").exists() and not (toolkit / STATE_DIR).exists()


def test_keep_changed_without_a_copy_keeps_the_backup_beside_the_file(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "a.py").write_bytes(b"original a\n")
    apply(Plan(root, "test", "1", (FileChange("a.py", b"patched\n", sha256_file(root / "a.py")),)))
    (root / "a.py").write_bytes(b"edited\n")
    result = revert_report(root, keep_changed=True)
    assert dict(result.kept) == {
        "a.py": "changed since te-align patched it",
        "a.py.te-align-original": "the original of a.py, which no other file holds",
    }
    assert (root / "a.py.te-align-original").read_bytes() == b"original a\n"
    assert (root / "a.py").read_bytes() == b"edited\n" and not (root / STATE_DIR).exists()


# ------------------------------------------------------------------------------ 2: lock
def test_a_second_command_refuses_while_the_tree_is_locked(kohya):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from te_align.patching.transaction import lock\n"
         "with lock(sys.argv[1]):\n    print('locked', flush=True); sys.stdin.readline()", str(kohya)],
        env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        for cmd in (["patch"], ["unpatch"], ["status"]):
            r = subprocess.run([sys.executable, "-m", "te_align", cmd[0], str(kohya)], capture_output=True, text=True,
                               env={**env, "TE_ALIGN_LOCK_WAIT": "0.3"}, timeout=120)  # fmt: skip
            assert r.returncode == 2, r.stderr
            line = _error_line(r.stderr)
            assert "another te-align command (patch, unpatch or status) is working on" in line and "wait for it" in line
        assert holder.poll() is None  # refused while the holder still held the lock
        assert not (kohya / STATE_DIR).exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # once it is gone (even killed: the lock goes with the process) the tree is free
    killer = subprocess.Popen([sys.executable, "-c", "import os, sys, signal; from te_align.patching.transaction import lock\n"
                               "with lock(sys.argv[1]):\n    os.kill(os.getpid(), signal.SIGKILL)", str(kohya)], env=env)  # fmt: skip
    killer.wait(timeout=30)
    assert _cli("status", str(kohya))[0] == 0


def test_two_patches_at_once_wait_for_each_other(kohya):
    before = campaign.snapshot(kohya)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TE_ALIGN_LOCK_WAIT": "60"}
    for profile in ([], ["--profile", "flux-dev"]):
        procs = [subprocess.Popen([sys.executable, "-m", "te_align", "patch", str(kohya), *p], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for p in ([], profile)]  # fmt: skip
        results = [(p.wait(timeout=120), p.communicate()) for p in procs]
        assert all(rc == 0 for rc, _ in results), results
        st = status(kohya)
        assert st.patched and not st.changed
        revert(kohya)
        assert campaign.snapshot(kohya) == before


# ------------------------------------------------------------------------------ 3: paths from state files
def _outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "victim.py").write_text("do not touch\n")
    return d


@pytest.mark.parametrize("how", ["dotdot", "absolute", "backup-dotdot", "created-dirs", "backup-link", "folder-link"])
def test_state_file_paths_must_stay_inside_the_tree(kohya, tmp_path, how):
    outside = _outside(tmp_path)
    assert _cli("patch", str(kohya))[0] == 0
    m_path = kohya / STATE_DIR / "manifest.json"
    m = json.loads(m_path.read_text())
    entry = m["files"]["train_network.py"]
    if how == "dotdot":
        m["files"]["../outside/victim.py"] = entry
    elif how == "absolute":
        m["files"][str(outside / "victim.py")] = entry
    elif how == "backup-dotdot":
        entry["backup"] = "../../outside/victim.py"
    elif how == "created-dirs":
        m["files"]["te_align_originals/train_network.py"]["created_dirs"] = ["../outside"]
    elif how == "backup-link":
        shutil.rmtree(kohya / STATE_DIR / "backup")
        os.symlink(outside, kohya / STATE_DIR / "backup")
    else:
        shutil.rmtree(kohya / "te_align_originals")
        os.symlink(outside, kohya / "te_align_originals")
    m_path.write_text(json.dumps(m))
    before = campaign.snapshot(kohya)
    for cmd in ("unpatch", "status", "patch"):
        rc, _, err = _cli(cmd, str(kohya))
        line = _error_line(err)
        assert rc == 2 and ("outside the tree" in line or "symbolic link" in line), line
    assert sorted(p.name for p in outside.iterdir()) == ["victim.py"] and (outside / "victim.py").read_text() == "do not touch\n"
    assert campaign.snapshot(kohya) == before


def test_journal_paths_must_stay_inside_the_tree(kohya, tmp_path):
    outside = _outside(tmp_path)
    assert _cli("patch", str(kohya))[0] == 0
    body = {"op": "apply", "state_existed": True, "dirs": [], "files": [{"path": "../outside/victim.py", "existed": False}]}
    (kohya / STATE_DIR / "journal.json").write_text(json.dumps(body))
    rc, _, err = _cli("status", str(kohya))
    assert rc == 2 and "outside the tree" in _error_line(err)
    assert (outside / "victim.py").read_text() == "do not touch\n"


# ------------------------------------------------------------------------------ 6: a tree patched already
def test_patching_a_patched_tree_says_one_line_and_lists_no_plan(kohya, toolkit):
    for root, trainer in ((kohya, "kohya"), (toolkit, "ai-toolkit")):
        assert _cli("patch", str(root))[0] == 0
        before = sha256_file(root / STATE_DIR / "manifest.json")
        for extra in ((), ("--dry-run",)):
            assert _cli("patch", str(root), *extra) == (
                0, f"{trainer} at {root}: already patched with this plan: nothing to do\n", "")
        assert sha256_file(root / STATE_DIR / "manifest.json") == before
        rc, out, _ = _cli("patch", str(root), "--profile", "flux-dev", "--dry-run")  # another plan: listed in full
        assert rc == 0 and "  profile: flux-dev" in out and "replace " in out and out.endswith("dry run: nothing changed\n")


# ------------------------------------------------------------------------------ 7: re-plan, refusals
def test_replan_with_an_edited_original_keeps_the_edit(kohya):
    pristine_flux = (kohya / "flux_train_network.py").read_bytes()
    assert _cli("patch", str(kohya))[0] == 0
    kept = kohya / "te_align_originals" / "train_network.py"
    edited = kept.read_bytes() + b"print('my edit')\n"
    kept.write_bytes(edited)
    rc, out, _ = _cli("status", str(kohya))
    assert rc == 1 and "changed   te_align_originals/train_network.py" in out.replace("changed  ", "changed   ")
    rc, _, err = _cli("patch", str(kohya))
    assert rc == 2 and "--replan" in _error_line(err)
    assert _cli("patch", str(kohya), "--replan")[0] == 0
    assert kept.read_bytes() == edited  # the drop-in runs the user's edit
    assert not status(kohya).changed
    assert _cli("unpatch", str(kohya))[0] == 0
    assert (kohya / "train_network.py").read_bytes() == edited  # as the message promised: the edit is the new original
    assert (kohya / "flux_train_network.py").read_bytes() == pristine_flux
    assert not (kohya / "te_align_originals").exists()


def test_replan_with_an_edited_ai_toolkit_original(toolkit):
    assert _cli("patch", str(toolkit))[0] == 0
    orig = toolkit / "te_align_original_run.py"
    edited = orig.read_bytes() + b"# edit\n"
    orig.write_bytes(edited)
    assert _cli("patch", str(toolkit), "--replan")[0] == 0
    assert orig.read_bytes() == edited
    assert _cli("unpatch", str(toolkit))[0] == 0
    assert (toolkit / "run.py").read_bytes() == edited and not orig.exists()


def test_an_edited_drop_in_is_changed_since_patch_not_a_git_checkout(kohya, toolkit):
    for root, drop_in in ((kohya, "train_network.py"), (toolkit, "run.py")):
        pristine = (root / drop_in).read_bytes()
        assert _cli("patch", str(root))[0] == 0
        (root / drop_in).write_bytes((root / drop_in).read_bytes() + b"# my line\n")
        rc, _, err = _cli("patch", str(root))
        line = _error_line(err)
        assert rc == 2 and f"changed since te-align patched them: {drop_in}" in line and "--replan" in line
        assert "git" not in line
        # --replan writes a fresh drop-in; the original stays the original (never the edited drop-in)
        assert _cli("patch", str(root), "--replan")[0] == 0
        assert not status(root).changed
        assert _cli("unpatch", str(root))[0] == 0
        assert (root / drop_in).read_bytes() == pristine


@pytest.mark.parametrize("trainer", ["kohya", "ai-toolkit"])
def test_state_folder_deleted_patch_refuses_without_git_hint(kohya, toolkit, trainer):
    root, hint = (kohya, "cp ") if trainer == "kohya" else (toolkit, "mv ")
    assert _cli("patch", str(root))[0] == 0
    shutil.rmtree(root / STATE_DIR)
    before = campaign.snapshot(root)
    rc, _, err = _cli("patch", str(root))
    line = _error_line(err)
    assert rc == 2 and "holds no manifest" in line and hint in line and "git" not in line, line
    assert campaign.snapshot(root) == before  # the shim is never recorded as "the original"


def test_unknown_sd_scripts_version_without_git_does_not_say_git_checkout_this_tree(kohya):
    (kohya / "library" / "strategy_flux.py").write_text("X = 1\n")
    rc, _, err = _cli("patch", str(kohya))
    line = _error_line(err)
    assert rc == 2 and "is not a git checkout" in line and f"git -C {kohya}" not in line


def test_empty_sd_scripts_in_a_kohya_ss_gui_that_is_not_a_git_clone(tmp_path):
    gui = tmp_path / "kohya_ss"
    (gui / "kohya_gui").mkdir(parents=True)
    (gui / "sd-scripts").mkdir()
    rc, _, err = _cli("patch", str(gui))
    line = _error_line(err)
    assert rc == 2 and "sd-scripts submodule is empty" in line and "not a git checkout" in line and "git -C" not in line


# ------------------------------------------------------------------------------ 8: full disk, read-only, damaged state
def _fault(monkeypatch, at: int, mode: str) -> None:
    monkeypatch.setenv("TE_ALIGN_FAULT_AT", str(at))
    monkeypatch.setenv("TE_ALIGN_FAULT_MODE", mode)
    _atomic.reset_fault_counter()


@pytest.mark.parametrize("mode,words", [("enospc", "no space left on the device holding"), ("erofs", "folder is read-only")])
@pytest.mark.parametrize("cmd", ["patch", "re-patch", "unpatch"])
def test_full_disk_and_read_only_file_system_are_one_line_and_recoverable(kohya, monkeypatch, mode, words, cmd):
    if cmd != "patch":
        assert _cli("patch", str(kohya))[0] == 0
    argv = {"patch": ["patch"], "re-patch": ["patch", "--profile", "flux-dev"], "unpatch": ["unpatch"]}[cmd]
    before = campaign.snapshot(kohya)
    for at in (1, 9, 23, 40):
        _fault(monkeypatch, at, mode)
        rc, _, err = _cli(argv[0], str(kohya), *argv[1:])
        monkeypatch.delenv("TE_ALIGN_FAULT_AT")
        line = _error_line(err)
        assert rc == 2 and words in line and str(kohya) in line, line
        if mode == "enospc":
            assert "free at least" in line or "free some space" in line
        if "journalled" in line or "leftovers" in line:  # nothing could be written, not even the rollback
            assert f"run 'te-align status {kohya}'" in line
            assert _cli("status", str(kohya))[0] == 0  # once the file system is writable again
        assert campaign.snapshot(kohya) == before, campaign.differences(before, campaign.snapshot(kohya))


def test_status_on_a_read_only_tree_with_an_interrupted_patch(kohya, monkeypatch):
    before = campaign.snapshot(kohya)
    _atomic.FSYNC, fsync = False, _atomic.FSYNC
    try:
        r = campaign.run_cli(["patch", str(kohya)], fault_at=30)
        assert r.killed
        _fault(monkeypatch, 1, "erofs")
        rc, _, err = _cli("status", str(kohya))
        line = _error_line(err)
        assert rc == 2 and "interrupted te-align operation" in line and "read-only" in line and f"te-align status {kohya}" in line
        monkeypatch.delenv("TE_ALIGN_FAULT_AT")
        rc, out, _ = _cli("status", str(kohya))
        assert rc == 0 and "recovered from an interrupted 'apply'" in out and "not patched" in out
        assert campaign.snapshot(kohya) == before
    finally:
        _atomic.FSYNC = fsync


def test_read_only_folder_by_permissions(kohya):
    if os.geteuid() == 0:
        pytest.skip("running as root: permission bits do not stop root (the EROFS injection tests cover read-only trees)")
    before = campaign.snapshot(kohya)
    os.chmod(kohya, 0o555)
    try:
        rc, _, err = _cli("patch", str(kohya))
    finally:
        os.chmod(kohya, 0o755)
    assert rc == 2 and "folder is read-only" in _error_line(err)
    assert campaign.snapshot(kohya) == before


@pytest.mark.parametrize(
    "damage",
    ["{}", "[]", "null", "truncated", "files-list", "entry-string", "sha-int", "mode-string", "missing-backup", "no-manifest", "deep"],
)
def test_damaged_state_files_are_unreadable_with_the_way_out(kohya, damage):
    assert _cli("patch", str(kohya))[0] == 0
    m_path = kohya / STATE_DIR / "manifest.json"
    m = json.loads(m_path.read_text())
    first = m["files"]["train_network.py"]
    text = {"{}": "{}", "[]": "[]", "null": "null", "truncated": m_path.read_text()[:60], "deep": "[" * 50000 + "]" * 50000}.get(damage)
    if damage == "files-list":
        m["files"] = []
    elif damage == "entry-string":
        m["files"]["train_network.py"] = "x"
    elif damage == "sha-int":
        first["patched_sha256"] = 1
    elif damage == "mode-string":
        first["original_mode"] = "644"
    elif damage == "missing-backup":
        (kohya / STATE_DIR / first["backup"]).unlink()
    if damage == "no-manifest":
        m_path.unlink()
    else:
        m_path.write_text(text if text is not None else json.dumps(m))
    before = campaign.snapshot(kohya)
    for cmd in ("status", "unpatch", "patch"):
        rc, _, err = _cli(cmd, str(kohya))
        line = _error_line(err)
        assert rc == 2 and "te-align state file is unreadable" in line and "the originals are in" in line, line
        assert "Traceback" not in err
    assert campaign.snapshot(kohya) == before


def test_a_damaged_journal_is_unreadable(kohya):
    assert _cli("patch", str(kohya))[0] == 0
    for body in ("{}", '{"op": "apply", "files": [{"pa', '{"op": "apply", "state_existed": true, "files": [{"path": "a", "existed": true}]}'):
        (kohya / STATE_DIR / "journal.json").write_text(body)
        rc, _, err = _cli("status", str(kohya))
        assert rc == 2 and "te-align state file is unreadable" in _error_line(err)


# ------------------------------------------------------------------------------ 14: missing paths
def test_status_unpatch_patch_on_a_missing_path_or_a_file(tmp_path):
    (tmp_path / "file.py").write_text("x\n")
    for cmd in ("status", "unpatch", "patch"):
        rc, out, err = _cli(cmd, str(tmp_path / "nonexistent"))
        assert rc == 2 and "no such folder" in _error_line(err) and "not patched" not in out
        rc, out, err = _cli(cmd, str(tmp_path / "file.py"))
        assert rc == 2 and "not a folder" in _error_line(err)


# ------------------------------------------------------------------------------ 15: an edit after a killed command
@pytest.mark.parametrize("cmd", ["patch", "unpatch"])
def test_a_file_edited_after_a_killed_patch_or_unpatch_is_never_rolled_over(kohya, cmd):
    """``patch`` and ``unpatch`` journal the bytes they write to each file (``new_sha256``), as ``check --fix``
    does: after a kill, a file holding neither its bytes from before the command nor the ones it wrote (someone
    edited it since) makes the recovery refuse, in one line naming the file, before it touches anything; once
    the file holds its bytes from before again (its copy in the journal), the recovery rolls everything back."""
    if cmd == "unpatch":
        assert _cli("patch", str(kohya))[0] == 0
    before = campaign.snapshot(kohya)
    start = {p.name: p.read_bytes() for p in kohya.glob("*.py")}  # before the command
    log = kohya.parent / "ops.log"
    assert campaign.run_cli([cmd, str(kohya)], log=log).rc == 0  # where its file operations are (from 1)
    assert _cli("unpatch" if cmd == "patch" else "patch", str(kohya))[0] == 0  # undone: the same tree again
    assert campaign.same(before, campaign.snapshot(kohya), loose=True)  # loose: a manifest's patched_at aside
    target = kohya / "train_network.py"
    ops = [line.split(" ", 2) for line in log.read_text(encoding="utf-8").splitlines()]
    renamed = [int(n) for n, op, path in ops if op == "rename" and path == str(target)]
    assert len(renamed) == 1
    killed = campaign.run_cli([cmd, str(kohya)], fault_at=renamed[0] + 1)  # just after it was written
    assert killed.killed and not killed.error_lines
    journal = kohya / STATE_DIR / "journal.json"
    copy = kohya / STATE_DIR / "journal-data" / "train_network.py"
    assert copy.read_bytes() == start["train_network.py"] and target.read_bytes() != copy.read_bytes()
    entries = {e["path"]: e for e in json.loads(journal.read_text(encoding="utf-8"))["files"]}
    assert entries["train_network.py"]["new_sha256"] == sha256_file(target)  # the bytes the command wrote
    assert entries["train_network.py"]["sha256"] == sha256_file(copy)
    target.write_bytes(b"# my edit, made after te-align was killed\n")
    op = {"patch": "apply", "unpatch": "revert"}[cmd]
    expected = (f"te-align: error: {target}: holds neither its bytes from before the interrupted te-align {op} nor "
                f"the ones it wrote; nothing rolled back: restore its bytes from before (its copy {copy}) or keep "
                f"the file as it is, then delete {journal}")
    edited = campaign.snapshot(kohya)
    for again in ("status", "unpatch", "patch"):
        rc, out, err = _cli(again, str(kohya))
        assert (rc, out, _error_line(err)) == (2, "", expected)
        assert campaign.snapshot(kohya) == edited  # nothing touched
    target.write_bytes(copy.read_bytes())  # the way out the line names
    rc, out, _ = _cli("status", str(kohya))
    assert rc == 0 and f"recovered from an interrupted '{op}'" in out
    assert campaign.same(before, campaign.snapshot(kohya), loose=True)
