"""The on-disk patch transaction: apply, no-op re-apply, status, byte-identical revert, crash recovery, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from te_align.patching import FileChange, PatchError, Plan, apply, revert, sha256_file, status
from te_align.patching.transaction import STATE_DIR


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o7777)
        for p in sorted(root.rglob("*"))
        if p.is_file() and STATE_DIR not in p.relative_to(root).parts
    }


@pytest.fixture
def install(tmp_path: Path) -> Path:
    root = tmp_path / "sd-scripts"
    (root / "library").mkdir(parents=True)
    (root / "train_network.py").write_bytes(b"print('train')\r\n# crlf kept\n")
    (root / "flux_train_network.py").write_text("print('flux')\n")
    os.chmod(root / "flux_train_network.py", 0o755)
    (root / "library" / "strategy_sd.py").write_text("X = 1\n")
    return root


def _plan(root: Path, tag: str = "v1", profile: str | None = "flux-dev") -> Plan:
    changes = []
    for rel in ("train_network.py", "flux_train_network.py"):
        changes.append(FileChange(rel, f"# te-align shim {tag} for {rel}\n".encode(), sha256_file(root / rel), note="shim"))
    changes.append(FileChange("te_align_original/README.txt", f"originals {tag}\n".encode(), None))
    return Plan(root, "kohya", "48d368f", tuple(changes), profile=profile)


def test_apply_status_noop_revert_restores_every_byte(install):
    before = _tree(install)
    plan = _plan(install)
    assert any("replace train_network.py" in line for line in plan.describe())
    res = apply(plan)
    assert not res.noop and set(res.written) == {"train_network.py", "flux_train_network.py", "te_align_original/README.txt"}
    assert (install / "train_network.py").read_text() == "# te-align shim v1 for train_network.py\n"
    assert (install / "flux_train_network.py").stat().st_mode & 0o777 == 0o755  # mode kept
    st = status(install)
    assert st.patched and not st.changed and st.manifest["profile"] == "flux-dev"
    assert apply(_plan(install)).noop  # re-running is a no-op
    assert (install / STATE_DIR / ".gitignore").read_text() == "*\n"
    restored = revert(install)
    assert restored == ["flux_train_network.py", "te_align_original/README.txt", "train_network.py"]
    assert _tree(install) == before
    assert not (install / STATE_DIR).exists()
    assert not status(install).patched


def test_repatch_with_new_content_keeps_the_first_originals(install):
    before = _tree(install)
    apply(_plan(install))
    second = Plan(install, "kohya", "48d368f", tuple(
        FileChange(c.path, c.content.replace(b"v1", b"v2"), sha256_file(install / c.path)) for c in _plan(install).changes
    ), profile="flux-schnell")  # fmt: skip
    assert not apply(second).noop
    assert b"v2" in (install / "train_network.py").read_bytes()
    assert status(install).manifest["profile"] == "flux-schnell"
    revert(install)
    assert _tree(install) == before


def test_changed_patched_file_is_never_overwritten_silently(install):
    apply(_plan(install))
    (install / "train_network.py").write_text("upstream update after git pull\n")
    st = status(install)
    assert [(f.path, f.state) for f in st.changed] == [("train_network.py", "changed")]
    with pytest.raises(PatchError, match=r"changed since te-align patched them: train_network.py; .*te-align patch .* --replan"):
        apply(_plan(install))
    with pytest.raises(PatchError, match="--keep-changed"):
        revert(install)
    # re-plan: the updated upstream file becomes the new original
    apply(_plan(install), replan=True)
    revert(install)
    assert (install / "train_network.py").read_text() == "upstream update after git pull\n"


def test_keep_changed_restores_the_rest(install):
    before = _tree(install)
    apply(_plan(install))
    (install / "flux_train_network.py").write_text("edited by hand\n")
    revert(install, keep_changed=True)
    after = _tree(install)
    assert after["flux_train_network.py"][0] == b"edited by hand\n"
    assert after["train_network.py"] == before["train_network.py"]


def test_plan_against_changed_file_is_refused(install):
    plan = _plan(install)
    (install / "train_network.py").write_text("changed after planning\n")
    with pytest.raises(PatchError, match=r"train_network\.py changed since the plan was made"):
        apply(plan)
    assert not (install / STATE_DIR).exists()


def test_newer_te_align_manifest_is_refused(install):
    apply(_plan(install))
    m = install / STATE_DIR / "manifest.json"
    data = json.loads(m.read_text())
    data["te_align_version"] = "99.0.0"
    m.write_text(json.dumps(data))
    with pytest.raises(PatchError, match=r"patched by te-align 99\.0\.0, newer than this te-align"):
        apply(_plan(install))
    with pytest.raises(PatchError, match=r"unpatch with te-align 99\.0\.0"):
        revert(install)


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i: unwritable even for root (who ignores permission bits)."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555 if on else 0o755)
        return True
    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


def test_read_only_folder_is_refused(install):
    before = _tree(install)
    if not _immutable(install, True):
        pytest.skip("cannot make a read-only folder here: chattr +i is not permitted")
    try:
        with pytest.raises(PatchError, match="folder is read-only"):
            apply(_plan(install))
    finally:
        _immutable(install, False)
    assert _tree(install) == before and not (install / STATE_DIR).exists()


def test_not_patched_revert_says_so(install):
    with pytest.raises(PatchError, match="is not patched by te-align"):
        revert(install)


@pytest.mark.parametrize("die_at", [3, 8, 15, 24, 33])
@pytest.mark.parametrize("first", [True, False])
def test_killed_mid_patch_recovers_to_a_consistent_state(install, die_at, first):
    """SIGKILL at the N-th file operation (TE_ALIGN_FAULT_AT); the next status() rolls back to the bytes before."""
    if not first:
        apply(_plan(install, "v1"))
    before = _tree(install)
    manifest_before = (install / STATE_DIR / "manifest.json").read_text() if not first else None
    child = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import te_align.patching.transaction as tx
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_patching import _plan
        tx.apply(_plan(Path({str(install)!r}), "v2"))
    """)
    env = {**os.environ, "TE_ALIGN_FAULT_AT": str(die_at), "TE_ALIGN_FAULT_MODE": "kill"}
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env)
    assert proc.returncode == -9, proc.stderr
    st = status(install)
    assert st.recovered, "nothing to recover after a kill mid-patch"
    assert _tree(install) == before
    assert not (install / STATE_DIR / "journal.json").exists()
    if first:
        assert not st.patched and not (install / STATE_DIR).exists()
    else:
        assert (install / STATE_DIR / "manifest.json").read_text() == manifest_before
        assert not st.changed


# ------------------------------------------------------------------------------ trainer versions
def test_git_head_reads_checkouts_submodules_and_packed_refs(tmp_path):
    """One git_head for the patch planner, the kohya hook and the probe: written the way git writes them."""
    from te_align._git import git_head

    a, b = "1" * 40, "2" * 40
    plain = tmp_path / "plain"
    (plain / ".git" / "refs" / "heads").mkdir(parents=True)
    (plain / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (plain / ".git" / "refs" / "heads" / "main").write_text(a + "\n")
    assert git_head(plain) == a
    (plain / ".git" / "refs" / "heads" / "main").unlink()
    (plain / ".git" / "packed-refs").write_text(f"# pack-refs with: peeled\n{b} refs/heads/main\n")
    assert git_head(plain) == b
    sub = tmp_path / "gui" / "sd-scripts"  # a submodule: .git is a file pointing into the parent's modules
    modules = tmp_path / "gui" / ".git" / "modules" / "sd-scripts"
    modules.mkdir(parents=True)
    sub.mkdir(parents=True)
    (sub / ".git").write_text("gitdir: ../.git/modules/sd-scripts\n")
    (modules / "HEAD").write_text(a + "\n")  # detached
    assert git_head(sub) == a
    assert git_head(tmp_path) is None


def test_read_version_and_dist_version(tmp_path):
    from te_align._git import dist_version, read_version

    (tmp_path / "version.py").write_text('# ai-toolkit\nVERSION = "0.12.26"\n')
    assert read_version(tmp_path / "version.py") == "0.12.26"
    assert read_version(tmp_path / "missing.py") is None
    meta = tmp_path / "ostris_ai_toolkit-0.2.7.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: ostris-ai-toolkit\nVersion: 0.2.7\n")
    assert dist_version(tmp_path, "ostris_ai_toolkit") == "0.2.7" and dist_version(tmp_path, "other") is None
