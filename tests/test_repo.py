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


def test_readme_main_job_is_a_real_command():
    from te_align.cli import main

    blocks = _bash_blocks((ROOT / "README.md").read_text())
    main_job = blocks[1]
    assert main_job.startswith("te-align ")
    assert main(main_job.split()[1:]) == 0


def test_changelog_has_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and "### Added" in text
