"""The README's set-up commands and CI stay in step."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_test_command():
    blocks = _bash_blocks((ROOT / "README.md").read_text())
    test_cmd = blocks[0]
    assert "pytest" in test_cmd and "pip install" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci


def test_readme_main_job_is_a_real_command(tmp_path, monkeypatch):
    from te_align.cli import main

    blocks = _bash_blocks((ROOT / "README.md").read_text())
    main_job = blocks[1]
    assert main_job.startswith("te-align ")
    # `te-align demo` writes into the current folder; the suite runs it short (the README runs the full default)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TE_ALIGN_DEMO_STEPS", "2")
    monkeypatch.setenv("TE_ALIGN_DEMO_SEEDS", "1")
    assert main(main_job.split()[1:]) == 0
    if main_job.split()[1] == "demo":
        assert (tmp_path / "te-align-demo" / "ab" / "report.html").is_file()


def test_changelog_has_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and "### Added" in text


def test_wheel_ships_the_drop_in_files(tmp_path):
    """A non-editable install must be able to patch: the wheel carries patches/ as te_align/_patches."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"  # build a copy, so no build/ folder appears in the working tree
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("te_align", "patches"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("te_align-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(ROOT / "patches").as_posix() for p in (ROOT / "patches").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert shipped, "patches/ is empty"
    missing = sorted(s for s in shipped if f"te_align/_patches/{s}" not in names)
    assert not missing, missing
    assert "te_align/profiles/data/profiles/sd35-large.toml" in names
