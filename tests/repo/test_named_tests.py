"""Every test file the repository names exists: paths (``tests/<part>/test_<name>.py``) and modules
(``tests.<part>.test_<name>``) in the README, docs, CI, tools (the core job's list, the trainer environments' test
lists), the package's docstrings and the tests themselves. CHANGELOG.md and benchmarks/*.md are records: they may keep
a flat ``tests/test_<name>.py`` of a file that has since moved into its group (the name still finds it), never one of
a file that is gone."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: where the repository's text lives (the tracked top level, less lock/ and LICENSE)
PLACES = (".ci", "benchmarks", "docs", "examples", "presets", "te_align", "tests", "tools", "world",
          "CHANGELOG.md", "README.md", "pyproject.toml", "setup.py", ".pre-commit-hooks.yaml")
SUFFIXES = {"", ".py", ".md", ".toml", ".txt", ".sh", ".cfg", ".yaml", ".yml", ".json", ".jinja"}
PATH = re.compile(r"(?<![\w./-])tests/((?:\w+/)*)(test_\w+)\.py")
MODULE = re.compile(r"(?<![\w./-])tests\.((?:\w+\.)*)(test_\w+)\b")


def _records(rel: str) -> bool:
    return rel == "CHANGELOG.md" or (rel.startswith("benchmarks/") and rel.endswith(".md"))


def _texts() -> list[tuple[str, str]]:
    out = []
    for place in PLACES:
        top = ROOT / place
        found = [top] if top.is_file() else []
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__" and not d.endswith(".egg-info")]
            found += [Path(folder) / f for f in files]
        for path in found:
            if path.suffix not in SUFFIXES or path.stat().st_size > 2_000_000:
                continue
            try:
                out.append((path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                continue
    return out


def test_every_named_test_file_exists():
    tests = ROOT / "tests"
    groups = {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    where: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        where.setdefault(p.name, []).append(p.relative_to(ROOT).as_posix())
    wrong = []
    named = 0
    for rel, text in _texts():
        hits = [(m.group(1), m.group(2), m.group(0)) for m in PATH.finditer(text)]
        hits += [(m.group(1).replace(".", "/"), m.group(2), m.group(0)) for m in MODULE.finditer(text)]
        for folders, name, shown in hits:
            if folders and folders.split("/")[0] not in groups:
                continue  # an upstream project's tests (huggingface/diffusers tests/pipelines/...), not ours
            named += 1
            if (tests / folders / f"{name}.py").is_file():
                continue
            if not folders and _records(rel) and len(where.get(f"{name}.py", [])) == 1:
                continue  # a record naming the file before it moved into its group
            wrong.append(f"{rel}: {shown} (is {', '.join(where.get(f'{name}.py', [])) or 'nowhere'})")
    assert named > 50  # the README, tools/deps.py and tools/trainer_envs/ name dozens
    assert wrong == []


def test_test_modules_are_packages_with_unique_names():
    """Each folder of tests is a package (``tests.<part>.test_<name>``: cross-test imports and pytest's module
names agree),
    and a test file's name says what it tests wherever it is run from (no two alike)."""
    tests = ROOT / "tests"
    folders = {p.parent for p in tests.rglob("test_*.py")}
    assert sorted(f.relative_to(ROOT).as_posix() for f in folders if not (f / "__init__.py").is_file()) == []
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert sorted(p.name for p in tests.glob("test_*.py")) == []  # none left at the top: each is in its group


#: ``benchmarks/<study>/<file>`` as the README, docs, package, tools and tests name it; a placeholder (``<row>``,
#: ``{row}``, ``*``) ends the path at the folder before it
BENCH = re.compile(r"(?<![\w./-])benchmarks/[\w.-]+(?:/[\w.-]+)*")


def _bench_paths(text: str) -> list[str]:
    return [m.group(0).rstrip(".-") for m in BENCH.finditer(text)]


def test_every_named_benchmark_path_exists():
    """Every ``benchmarks/...`` path named outside the records exists (issue 48: the studies' folders moved; a
    reference that did not follow would point nowhere). CHANGELOG.md and benchmarks/**/*.md are records: they name the
    files where they were (benchmarks/README.md maps old to new)."""
    assert _bench_paths("see `benchmarks/effects/results/<row>/` and benchmarks/klein/bench_klein.md.") == [
        "benchmarks/effects/results", "benchmarks/klein/bench_klein.md"]
    wrong = []
    named = 0
    for rel, text in _texts():
        if _records(rel) or (rel.startswith("benchmarks/") and not rel.endswith(".py")):
            continue  # records, and a study's results (they name the files where they were when written)
        for path in _bench_paths(text):
            named += 1
            if not (ROOT / path).exists():
                wrong.append(f"{rel}: {path}")
    assert named > 50  # the README, docs/effects.md and the presets name dozens
    assert sorted(set(wrong)) == []
