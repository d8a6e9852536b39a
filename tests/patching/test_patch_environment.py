"""``te-align patch`` installs te-align into the trainer's own Python environment (real venvs, real pip, offline).

The venvs are ``python -m venv --system-site-packages --without-pip``: pip and te-align's requirements come from the
test's own Python (no network); te-align itself is installed into the venv from a wheel of this te-align. Every
command must leave the trainer's tree and the venv's package list exactly as they were, or show what it added.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from te_align import _atomic
from te_align.patching import environment as envmod
from te_align.patching.transaction import ENV_JOURNAL, STATE_DIR, PatchError
from te_align.patching.wheel import build_wheel
from tests.patching.test_patch_safety import _cli, _error_line, campaign

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(os.name != "posix", reason="venv layout (bin/python) and kills are POSIX here"),
    pytest.mark.slow,  # real venvs and pip: ~2 s a command
]


@pytest.fixture(autouse=True)
def _install_on(monkeypatch):
    """conftest turns the environment step off for the rest of the suite; these tests are about it."""
    monkeypatch.delenv(envmod.NO_INSTALL_ENV, raising=False)
    old = _atomic.FSYNC
    _atomic.FSYNC = False
    yield
    _atomic.FSYNC = old


def _venv(folder: Path, *, system: bool = True) -> Path:
    args = [sys.executable, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system else []), str(folder)]
    subprocess.run(args, check=True, capture_output=True)
    return folder / "bin" / "python"


@pytest.fixture
def trainer(tmp_path: Path) -> Path:
    return campaign.fake_kohya(tmp_path / "sd-scripts")


@pytest.fixture
def venv(trainer: Path) -> Path:
    return _venv(trainer / "venv")


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and folder of the trainer's tree except its venv (checked through pip instead)."""
    out: dict[str, tuple[bytes, int]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] == "venv":
            continue
        out[rel.as_posix()] = (p.read_bytes() if p.is_file() else b"<dir>", p.stat().st_mode & 0o7777)
    return out


def _packages(py: Path, *, local: bool = True) -> dict[str, str]:
    return envmod.pip_list(py, local=local)


def _pip_freeze(py: Path) -> str:
    """pip's own view, to check te-align's package lister against at the start and end."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], env=env, capture_output=True, text=True,
                          check=True).stdout


def _imports(py: Path, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(py), "-c", "import json, te_align, te_align.hooks; print(json.dumps([te_align.__version__, te_align.__file__]))"],
                          cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ------------------------------------------------------------------------------ the wheel of te-align itself
def test_wheel_of_this_te_align_is_deterministic_and_complete(tmp_path):
    a, b = build_wheel(tmp_path / "a"), build_wheel(tmp_path / "b")
    assert a.path.name == b.path.name == f"te_align-{a.version}-py3-none-any.whl"
    assert a.path.read_bytes() == b.path.read_bytes()
    with zipfile.ZipFile(a.path) as z:
        names = z.namelist()
        info = f"te_align-{a.version}.dist-info"
        assert "te_align/__init__.py" in names and "te_align/hooks/__init__.py" in names
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        if (REPO / "presets").is_dir():
            assert any(n.startswith("te_align/_presets/") for n in names)
        meta = z.read(f"{info}/METADATA").decode()
        assert f"\nVersion: {a.version}\n" in meta and "Name: te-align\n" in meta
        assert "te-align = te_align.cli:main" in z.read(f"{info}/entry_points.txt").decode()
        record = {row.split(",")[0]: row.split(",")[1] for row in z.read(f"{info}/RECORD").decode().splitlines()}
        for name in names:
            if name != f"{info}/RECORD":
                digest = base64.urlsafe_b64encode(hashlib.sha256(z.read(name)).digest()).rstrip(b"=").decode()
                assert record[name] == f"sha256={digest}", name


# ------------------------------------------------------------------------------ patch, status, re-patch, unpatch
def test_patch_installs_te_align_in_the_venv_and_unpatch_gives_back_tree_and_packages(trainer, venv, tmp_path):
    tree, (every, local), freeze = _tree(trainer), envmod.packages(venv), _pip_freeze(venv)
    assert "te-align" not in local
    assert {envmod.canonical(line.split("==")[0]) for line in freeze.splitlines()} == set(every)

    rc, out, _ = _cli("patch", str(trainer), "--dry-run")
    assert rc == 0
    assert f"environment: {venv} (Python " in out and "install te-align" in out and "dry run: nothing changed" in out
    assert _tree(trainer) == tree and _packages(venv) == local

    rc, out, err = _cli("patch", str(trainer), "--no-index")  # offline: te-align comes from its own wheel
    assert rc == 0, err
    assert "added: te-align" in out and "no package the trainer had changed" in out
    assert "import te_align, te_align.hooks with" in out and ": ok (" in out
    version, where = _imports(venv, tmp_path)
    assert Path(where).is_relative_to(trainer / "venv")  # the venv's own copy, not this checkout
    after = _packages(venv)
    assert {n: v for n, v in after.items() if n not in local} == {"te-align": version}
    assert all(after[n] == v for n, v in local.items())
    every_after = _packages(venv, local=False)
    assert all(every_after.get(n) == v for n, v in every.items())

    # the installed te-align builds the same wheel from its installed files (the path a wheel install takes)
    rebuilt = subprocess.run([str(venv), "-c", f"from te_align.patching.wheel import build_wheel as b; print(b({str(tmp_path / 'w2')!r}).path)"],
                             cwd=tmp_path, capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert Path(rebuilt.stdout.strip()).read_bytes() == build_wheel(tmp_path / "w1").path.read_bytes()

    rc, out, _ = _cli("status", str(trainer))
    assert rc == 0 and f"environment: {venv}: te-align {version} installed (matches this te-align)" in out
    rc, out, _ = _cli("status", str(trainer), "--json")
    env = json.loads(out)["environment"]
    assert env["te_align_installed"] == version and env["matches"] and env["python"] == str(venv)

    envmod._uninstall(str(venv), ["te-align"])  # someone removed it: status says so, patch puts it back
    rc, out, _ = _cli("status", str(trainer))
    assert rc == 1 and "te-align is NOT installed in it" in out and ": run te-align patch" in out
    rc, out, _ = _cli("patch", str(trainer))
    assert rc == 0 and "added: te-align" in out and _imports(venv, tmp_path)[0] == version

    rc, out, _ = _cli("patch", str(trainer))  # same te-align, same plan: nothing to do, in one line each
    assert rc == 0 and out.count("nothing to do") == 2 and "pip" not in out

    rc, out, err = _cli("unpatch", str(trainer))
    assert rc == 0, err
    assert "environment: removed te-align from" in out and "its package list is as before patching" in out
    assert _tree(trainer) == tree
    assert envmod.packages(venv) == (every, local) and _pip_freeze(venv) == freeze


def test_no_venv_refuses_unless_no_install(trainer):
    tree = _tree(trainer)
    rc, _, err = _cli("patch", str(trainer))
    line = _error_line(err)
    assert rc == 2 and "no Python environment of the trainer found" in line
    assert f"{trainer}/venv" in line and f"{trainer}/.venv" in line and "--python" in line and "--no-install" in line
    assert _tree(trainer) == tree
    rc, out, _ = _cli("patch", str(trainer), "--no-install")
    assert rc == 0 and "environment" not in out
    rc, out, _ = _cli("status", str(trainer))
    assert "environment: not managed by te-align" in out


def _old_python() -> str | None:
    for exe in ("python3.9", "python3.8", "python3.7"):
        pyenv = os.path.expanduser(f"~/.pyenv/versions/*/bin/{exe}")
        found = next(iter(sorted(glob.glob(pyenv))), None) or shutil.which(exe)
        if found and "shims" not in found:
            return found
    return None


@pytest.mark.parametrize("case", ["two venvs", "old python", "no pip", "not writable", "bad --python"])
def test_refusals_are_one_line_and_change_nothing(trainer, tmp_path, case):
    py = _venv(trainer / "venv")
    args = ["patch", str(trainer)]
    undo = None
    if case == "two venvs":
        _venv(trainer / ".venv")
        expect = f"two Python environments found: {trainer}/venv and {trainer}/.venv; pick the trainer's with --python"
    elif case == "old python":
        old = _old_python()
        if old is None:
            pytest.skip("no Python older than 3.10 here")
        args += ["--python", old]
        expect = "te-align needs Python >=3.10"
    elif case == "no pip":
        py = _venv(tmp_path / "bare", system=False)
        args += ["--python", str(tmp_path / "bare")]
        expect = "has no pip"
    elif case == "not writable":
        site = next((trainer / "venv" / "lib").glob("python*/site-packages"))
        if os.geteuid() == 0:
            if subprocess.run(["chattr", "+i", str(site)], capture_output=True).returncode != 0:
                pytest.skip("cannot make site-packages read-only for root here (chattr +i not permitted)")
            undo = ["chattr", "-i", str(site)]
        else:
            site.chmod(0o555)
            undo = ["chmod", "755", str(site)]
        expect = "is not writable for this user"
    else:
        args += ["--python", str(tmp_path / "nowhere" / "python")]
        expect = "no such Python executable"
    tree, local = _tree(trainer), _packages(py)
    try:
        rc, _, err = _cli(*args)
    finally:
        if undo:
            subprocess.run(undo, check=True)
    assert rc == 2 and expect in _error_line(err), err
    assert _tree(trainer) == tree and _packages(py) == local
    assert not (trainer / STATE_DIR).exists()


def _tiny_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A one-module wheel (test data for pip --find-links)."""
    folder.mkdir(parents=True, exist_ok=True)
    mod, info = name.replace("-", "_"), f"{name.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{mod}.py": b"X = 1\n",
        f"{info}/METADATA": "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                     *(f"Requires-Dist: {r}\n" for r in requires)]).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return path


def test_missing_requirements_are_added_with_everything_pinned_and_removed_again(trainer, venv, tmp_path):
    links = tmp_path / "links"
    _tiny_wheel(links, "te-align-testdep", "1.0")
    _tiny_wheel(links, "te-align-clash", "1.0", requires=("toml==0.9.0",))  # would have to change toml
    options = envmod.PipOptions((str(links),), no_index=True)
    every, local = envmod.packages(venv)

    with pytest.raises(PatchError, match=r"te-align needs pip>=999 \(it has .*\).*never changes a package"):
        envmod.plan_environment(venv, None, options, extra_requirements=["pip>=999"])

    plan = envmod.plan_environment(venv, None, options, extra_requirements=["te-align-clash"])
    assert plan.add == ("te-align-clash",)
    with pytest.raises(PatchError, match=r"would need a change to a package the trainer has.*rolled back, nothing changed"):
        envmod.install(trainer, plan)
    assert envmod.packages(venv) == (every, local)
    assert not (trainer / STATE_DIR).exists()

    plan = envmod.plan_environment(venv, None, options, extra_requirements=["te-align-testdep>=1"])
    assert "add te-align's missing requirements: te-align-testdep>=1" in "\n".join(plan.describe())
    done = envmod.install(trainer, plan)
    assert done.record["added"] == {"te-align-testdep": "1.0"} and done.record["installed"]
    assert "added: te-align" in done.lines[0] and "te-align-testdep 1.0" in done.lines[0]
    assert set(_packages(venv)) - set(local) == {"te-align", "te-align-testdep"}
    lines = envmod.uninstall(done.record)
    assert "removed te-align, te-align-testdep" in lines[0] and "as before patching" in lines[0]
    assert _packages(venv) == local
    shutil.rmtree(trainer / STATE_DIR)  # the journal install() left for the commit that a patch would do


def _killed_patch(trainer: Path, at: int) -> None:
    env = {**os.environ, "TE_ALIGN_FAULT_AT": str(at), "TE_ALIGN_FAULT_MODE": "kill", "PYTHONPATH": str(REPO)}
    env.pop(envmod.NO_INSTALL_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "te_align", "patch", str(trainer)], env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stdout + proc.stderr


def test_install_killed_after_pip_is_rolled_back_by_the_next_unpatch_or_patch(trainer, venv, tmp_path, monkeypatch):
    tree, local = _tree(trainer), _packages(venv)
    # Where the install's fault points are: a logged run (file operations are counted from 1 per process).
    log = tmp_path / "ops.log"
    monkeypatch.setenv("TE_ALIGN_FAULT_LOG", str(log))
    _atomic.reset_fault_counter()
    assert _cli("patch", str(trainer))[0] == 0
    monkeypatch.delenv("TE_ALIGN_FAULT_LOG")
    ops = [line.split(" ", 2) for line in log.read_text().splitlines()]
    verify = next(int(n) for n, op, _ in ops if op == "verify")  # te-align is installed, nothing committed yet
    assert _cli("unpatch", str(trainer))[0] == 0 and _tree(trainer) == tree and _packages(venv) == local

    _killed_patch(trainer, verify)
    assert "te-align" in _packages(venv) and (trainer / STATE_DIR / ENV_JOURNAL).exists()
    rc, _, err = _cli("unpatch", str(trainer))  # recovers first; then there is nothing patched
    line = _error_line(err)
    assert rc == 2 and "rolled back an interrupted te-align install" in line and "is not patched by te-align" in line
    assert _tree(trainer) == tree and _packages(venv) == local

    _killed_patch(trainer, verify)
    rc, out, err = _cli("patch", str(trainer))
    assert rc == 0, err
    assert "rolled back an interrupted te-align install" in out and "its package list is as before" in out
    assert "added: te-align" in out
    assert _cli("unpatch", str(trainer))[0] == 0
    assert _tree(trainer) == tree and _packages(venv) == local
