"""The import graph: no circle between te_align modules, no heavy imports on the torch-free commands,
no single-letter module aliases.

The graph is read statically (``ast``) from every ``te_align/**.py``: an edge is an import executed
when the module is imported — at module level, in class bodies, in ``try``/``if`` blocks — so imports
inside functions (lazy on purpose) and under ``if TYPE_CHECKING:`` (type-only) are not edges. An
import names the module it loads (``from te_align.a import b`` is an edge to ``te_align.a.b`` when that
is a module, else to ``te_align.a``); the implicit initialisation of parent packages is not an edge.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "diffusers")


# ------------------------------------------------------------------------------------------ graph
def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]):
    """The import statements that run when a module body runs (not in functions, not type-only)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _import_time_statements(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _import_time_statements(node.body)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it is imported."""
    modules = _modules(root, package)

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        for node in _import_time_statements(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            deps |= {m for m in map(owner, targets) if m and m != name}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (each holds an import circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_te_align_modules():
    graph = import_graph(ROOT, "te_align")
    assert len(graph) > 50 and graph["te_align.train.loop"]  # the walk found the package and its edges
    found = cycles(graph)
    detail = ["; ".join(f"{v} -> {', '.join(sorted(graph[v] & set(c)))}" for v in c) for c in found]
    assert not found, "import circles:\n" + "\n".join(detail)


def test_the_graph_sees_real_circles_and_ignores_type_only_and_lazy_ones(tmp_path: Path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
        "def f():\n    from pkg import c\n"
    )
    (pkg / "c.py").write_text("from pkg import a\n")  # a -> c only type-only / lazily: no circle
    (pkg / "sub" / "b.py").write_text("try:\n    from ..d import D\nexcept ImportError:\n    pass\nB = 1\n")
    (pkg / "d.py").write_text("class D:\n    from pkg.sub import b\n")  # sub.b <-> d at import time
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == set() and graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.d", "pkg.sub.b"]]


# ------------------------------------------------------------------------------ cold commands
COLD_COMMANDS = {
    "--help": ["--help"],
    "profile show": ["profile", "show", "sd35-large"],
    "check": ["check", str(Path("examples") / "kohya" / "sdxl_typo.toml")],
}


@pytest.mark.parametrize("name", sorted(COLD_COMMANDS))
def test_torch_free_commands_import_no_torch(name: str):
    """The real entry point in a fresh interpreter; ``-X importtime`` lists every module it imported."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "te_align", *COLD_COMMANDS[name]],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert out.returncode in (0, 1), out.stderr[-2000:]  # check exits 1 when it finds a deviation
    imported = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", out.stderr, re.M)}
    assert "te_align" in imported and len(imported) > 10  # the trace is there
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def _imported(args: list[str], cwd: Path) -> tuple[int, set[str]]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "te_align", *args], capture_output=True,
                         text=True, cwd=cwd)
    pattern = r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)"
    return out.returncode, {m.group(1).split(".")[0] for m in re.finditer(pattern, out.stderr, re.M)}


def test_check_imports_the_fix_libraries_only_for_fix(tmp_path: Path):
    """``check`` alone imports neither tomlkit nor ruamel.yaml; ``check --fix`` (and ``--diff``) import them,
    and still no torch."""
    rc, plain = _imported(["check", str(ROOT / "examples" / "ai-toolkit" / "flux_schnell_lora.yaml")], ROOT)
    assert rc == 1 and "te_align" in plain
    assert not plain & {"tomlkit", "ruamel"}, sorted(plain & {"tomlkit", "ruamel"})
    config = tmp_path / "flux_schnell_lora.toml"
    config.write_bytes((ROOT / "examples" / "kohya" / "flux_schnell_lora.toml").read_bytes())
    rc, fixing = _imported(["check", str(config), "--fix", "--no-backup"], ROOT)
    assert rc == 0 and "tomlkit" in fixing
    assert not fixing & set(HEAVY), sorted(fixing & set(HEAVY))


# ---------------------------------------------------------------------------------- aliases
def test_no_single_letter_module_aliases():
    found = []
    for folder in ("te_align", "tests", "tools", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found += [f"{path.relative_to(ROOT)}:{node.lineno}: as {a.asname}" for a in node.names
                              if a.asname and len(a.asname.rstrip("_")) == 1]  # fmt: skip
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------ the core alone
def _core_only(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The te-align CLI where no extra is installed (tests/support/no_extras.py: torch, transformers, diffusers,
    numpy, … all fail to import as they do when missing)."""
    return subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "no_extras.py"), *args],
                          capture_output=True, text=True, cwd=cwd)


def test_the_core_commands_run_without_any_extra(tmp_path: Path):
    """--help, profile show, check, and patch / status / unpatch of an sd-scripts and an ai-toolkit tree: all of
    them with no torch, transformers or diffusers importable (the hooks' modules are read by patch)."""
    from tests.patching.test_patch_safety import campaign

    assert _core_only("--help").returncode == 0
    shown = _core_only("profile", "show", "sd35-large")
    assert shown.returncode == 0 and "sd35-large" in shown.stdout, shown.stderr
    checked = _core_only("check", str(ROOT / "examples" / "kohya" / "sdxl_typo.toml"))
    assert checked.returncode == 1 and checked.stderr == "", checked.stderr
    for tree in (campaign.fake_kohya(tmp_path / "sd-scripts"), campaign.fake_ai_toolkit(tmp_path / "ai-toolkit")):
        before = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*"))
        for args in (["patch", str(tree), "--no-install"], ["status", str(tree)], ["unpatch", str(tree)]):
            out = _core_only(*args)
            assert out.returncode == 0, (args, out.stderr)
            assert "Traceback" not in out.stderr
        assert sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")) == before


@pytest.mark.parametrize(("args", "extra"), [
    (["demo", "--out", "demo"], "train"),
    (["probe", "--trainer", "sd-scripts", "--profile", "sdxl"], "encode"),
    (["ab", "list"], "train"),  # it printed the presets it could read, then the error
])
def test_a_command_that_needs_an_extra_says_which_in_one_line(tmp_path: Path, args: list[str], extra: str):
    out = _core_only(*args, cwd=tmp_path)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("te-align: error: te-align "), out.stderr
    assert out.stdout == ""
    assert f'pip install "te-align[{extra}]"' in lines[0] or "pip install ./world" in lines[0], lines[0]
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_demo_without_the_world_package_says_so_in_one_line_first(tmp_path: Path):
    """With the encode extra but not te-align-world (`pip install ".[encode]"`), `te-align demo` printed its two
    opening lines, then the error: it says only the one line, and writes nothing."""
    import importlib.util

    if importlib.util.find_spec("diffusers") is None:
        pytest.skip("diffusers is not installed (the core alone): demo names the train extra first")
    code = ("import sys\n"
            "sys.modules['te_align_world'] = None  # as where te-align-world is not installed\n"
            "from te_align.cli import main\n"
            "sys.exit(main(['demo', '--out', 'demo']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert out.stderr == ("te-align: error: the world bases are the te-align-world package, which is not installed in "
                          f"this Python ({sys.executable}); from a te-align clone: pip install ./world \".[train]\"\n")
    assert not list(tmp_path.iterdir())


def test_the_api_names_the_extra_it_needs():
    """``te_align.encode`` where torch is missing raises an ImportError whose message names the pip install (a
    TeAlignError too, so the CLI prints it as one line); profiles still work."""
    code = ("import te_align\n"
            "assert te_align.profile('sd15').name == 'sd15'\n"
            "try:\n    te_align.encode('sd15', 'a cat')\n"
            "except ImportError as e:\n    print(type(e).__name__, isinstance(e, te_align.TeAlignError), e)\n")
    out = _core_only("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingExtra True te_align.encoding.core needs torch, which is not installed")
    assert 'pip install "te-align[encode]"' in out.stdout
