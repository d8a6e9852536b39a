"""The README's set-up commands and CI stay in step."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_wheel_ships_the_drop_in_files_presets_and_clip_bpe(tmp_path):
    """A non-editable install must be able to patch and run the demo: the wheel carries presets/ as te_align/_presets,
    every trainer folder's data, drop-in templates and boot files, and the CLIP BPE file."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"  # build a copy, so no build/ folder appears in the working tree
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("te_align", "presets"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("te_align-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    from te_align._shipped import SHIPPED

    assert SHIPPED == ("presets",)
    for folder in SHIPPED:
        files = {p.relative_to(ROOT / folder).as_posix() for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        assert files, f"{folder}/ is empty"
        missing = sorted(s for s in files if f"te_align/_{folder}/{s}" not in names)
        assert not missing, missing
    assert "te_align/_presets/tiny-demo.toml" in names
    trainers = ROOT / "te_align" / "trainers"
    package_data = {p.relative_to(ROOT).as_posix() for sub in ("data", "templates", "boot")
                    for p in trainers.glob(f"*/{sub}/**/*") if p.is_file() and "__pycache__" not in p.parts}
    assert len(package_data) > 10
    assert not sorted(package_data - names)
    assert "te_align/profiles/data/profiles/sd35-large.toml" in names
    assert {"te_align/tiny/data/bpe_simple_vocab_16e6.txt.gz", "te_align/tiny/data/LICENSE-CLIP-BPE.txt"} <= names
    # the licences travel in the wheel's metadata (PEP 639: Apache-2.0 for te-align, MIT for the CLIP vocabulary)
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert {f"{info}/licenses/LICENSE", f"{info}/licenses/te_align/tiny/data/LICENSE-CLIP-BPE.txt"} <= names
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0 AND MIT" in meta
    # the core is small: the world bases are a distribution of their own (world/), and no heavy library is required
    assert not [n for n in names if "te_align_world" in n or ("/world/" in n and n.endswith(".safetensors"))]
    required = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    core = sorted(r.split(">")[0].split(";")[0].strip() for r in required if "extra ==" not in r)
    assert core == ["packaging", "pyyaml", "ruamel.yaml", "toml", "tomli", "tomlkit"]
    assert "Requires-Python: >=3.10" in meta


def test_world_wheel_ships_every_base_file(tmp_path):
    """``world/`` builds the te-align-world wheel, and it carries every file of every shipped base."""
    import subprocess
    import sys
    import zipfile

    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(ROOT / "world")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("te_align_world-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    pkg = ROOT / "world" / "te_align_world"
    files = {f"te_align_world/{p.relative_to(pkg).as_posix()}" for p in pkg.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert len(files) > 30
    assert not sorted(files - names)


# ------------------------------------------------------------------------------ machine paths, citations
#: An absolute path on some machine (a user's or a CI box's folders); URLs do not match.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|tmp|root|home)/")
#: A citation of the project's research notes, which the package does not ship: shipped files cite the
#: upstream source instead (repo@commit file:line, or a bundled official snapshot).
NOTE_CITATION = re.compile(
    r"research/|\bresearch (?:notes?|sources|record|marks)\b|\(research\b"
    r"|\b(?:kohya|trainers|community|hf_configs)\.(?:md|json)\b|\bhf_configs\["
)
#: What the wheel ships or a user copies: the package (with the trainers' drop-in templates), presets and examples.
SHIPPED = ("te_align/", "presets/", "examples/", "world/")
TEXT_SUFFIXES = {".py", ".toml", ".json", ".md", ".txt", ".tmpl", ".yaml", ".yml", ".cfg", ".ini", ""}


def _repository_files() -> list[str]:
    import subprocess

    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout:
        return [p for p in out.stdout.split("\0") if p]
    skip = {".git", "__pycache__", "build", "dist", ".venv", "venv"}  # not a git checkout (e.g. an sdist)
    return [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file() and not skip & set(p.relative_to(ROOT).parts) and not p.name.endswith(".egg-info")
    ]


def _text(rel: str) -> str | None:
    path = ROOT / rel
    if path.suffix not in TEXT_SUFFIXES or not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def test_no_machine_paths_in_the_repository():
    found = []
    for rel in _repository_files():
        text = _text(rel)
        for n, line in enumerate((text or "").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "absolute machine paths:\n" + "\n".join(found)


def test_shipped_files_cite_upstream_sources_not_research_notes():
    import json

    found = []
    for rel in _repository_files():
        if not rel.startswith(SHIPPED):
            continue
        text = _text(rel)
        if text is None:
            continue
        if rel.startswith("te_align/profiles/data/official/"):
            # the snapshot header records the file the snapshot was compiled from (name and sha256);
            # every value's own "source" must still be something a user can open
            doc = json.loads(text)
            doc.pop("snapshot", None)
            text = json.dumps(doc, indent=0, ensure_ascii=False)
        for n, line in enumerate(text.splitlines(), 1):
            if NOTE_CITATION.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:140]}")
    assert not found, "citations of notes the package does not ship:\n" + "\n".join(found)


def test_the_checks_find_what_they_look_for():
    root = "/"  # kept apart so that this file does not hold a machine path itself
    assert MACHINE_PATH.search(f'RESEARCH = Path("{root}work/shared/research/hf_configs.json")')
    assert MACHINE_PATH.search(f"python -m venv {root}tmp/aitk-venv")
    assert not MACHINE_PATH.search("https://github.com/org/home/blob/main/x.py")
    for cited in ("research/trainers.md §5.2", "(research kohya.md §4.3)", "as the research notes it", "hf_configs[fal/AuraFlow]"):
        assert NOTE_CITATION.search(cited), cited
    assert not NOTE_CITATION.search("kohya-ss/sd-scripts@48d368f library/strategy_sdxl.py:26")
