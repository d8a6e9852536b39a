"""Print the shape of the ``te_align`` package: the numbers issue 36 tracks, before and after a change.

Maintainer script (standard library only, reads source, imports nothing of te_align)::

    python tools/shape_metrics.py [ROOT] [--json] [--loops] [--arrows] [--local] [--dups]

``ROOT`` is a checkout (default: the one this script is in); it reads ``ROOT/te_align``. Printed:

- ``lines``: lines of Python in ``te_align/``;
- ``function-local te_align imports``: ``import`` / ``from`` statements inside a function body whose target is
a
  ``te_align`` module (``importlib.import_module("te_align....")`` with a literal name counted too);
- ``lazy module handles``: module-level ``lazy_module("te_align....")`` declarations (``te_align/_lazy.py``), the
  one mark per module of an import deferred to keep torch off the CLI's cold path; they count as arrows below;
- ``Any tokens``: the name ``Any`` as a code token (comments and strings not counted);
- ``fmt: skip``: lines carrying ``# fmt: skip``;
- ``lines > 110 cols``;
- ``import loops between subpackages``: strongly connected groups (more than one node) of the graph whose
nodes are
  ``te_align``'s first-level packages and modules and whose arrows are every runtime import, module-level and
  function-local (imports under ``if TYPE_CHECKING:`` are not runtime and not counted);
- ``import loops between modules``: strongly connected groups of the graph whose nodes are ``te_align``'s modules
  (each ``.py`` file) and whose arrows are every runtime import: module-level, function-local, ``lazy_module``
  handles, ``importlib.import_module`` with a literal name and ``lazy_exports`` tables; relative imports are
  resolved, and ``from pkg import name`` points at module ``pkg.name`` where there is one (see
  :func:`module_edges`). ``--loops`` lists each loop's modules and the import lines inside it, the ones that close
  it;
- ``arrows engine -> trainers``: import statements in ``audit/``, ``hooks/``, ``patching/``, ``probe/`` (the
engine)
  whose target is ``te_align.trainers``; an import under ``if TYPE_CHECKING:`` is not one (the engine is typed by
  the trainer contract's Protocols, the parts it is handed, and never runs an import of it);
- ``duplicated-code pairs``: maximal runs of six or more identical code lines (stripped; blank lines, comments,
  imports and docstrings left out) found in two places of ``te_align/``, each pair of places once.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ENGINE = ("audit", "hooks", "patching", "probe")
DUP_LINES = 6


@dataclass
class Import:
    """One import statement: where it is, what it targets, whether it runs inside a function."""

    module: str
    line: int
    target: str
    local: bool
    type_only: bool
    lazy: bool = False  # a module-level ``lazy_module("te_align....")`` handle: imported on first use


@dataclass
class Source:
    path: Path
    module: str
    text: str
    tree: ast.Module
    imports: list[Import] = field(default_factory=list)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            mod = ".".join([*base, node.module] if node.module else base)
        else:
            mod = node.module or ""
        # ``from pkg import sub`` imports the submodule when there is one; the caller maps it to its node.
        return [f"{mod}.{a.name}" for a in node.names]
    if isinstance(node, ast.Call):
        name = _call_name(node)
        if name in ("import_module", "lazy_module") and node.args and isinstance(node.args[0], ast.Constant):
            value = node.args[0].value
            if isinstance(value, str):
                return [value]
    return []


def _walk(node: ast.AST, local: bool, type_only: bool) -> Iterator[tuple[ast.AST, bool, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.body:
                yield sub, local, True
                yield from _walk(sub, local, True)
            for sub in child.orelse:
                yield sub, local, type_only
                yield from _walk(sub, local, type_only)
            continue
        inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield child, local, type_only
        yield from _walk(child, inner, type_only)


def load(root: Path) -> list[Source]:
    out = []
    for path in sorted((root / "te_align").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        mod = module_name(root, path)
        src = Source(path, mod, text, ast.parse(text, str(path)))
        is_package = path.name == "__init__.py"
        for node, local, type_only in _walk(src.tree, False, False):
            for target in _targets(node, mod, is_package):
                if target == "te_align" or target.startswith("te_align."):
                    lazy = isinstance(node, ast.Call) and not local and _call_name(node) == "lazy_module"
                    src.imports.append(Import(mod, getattr(node, "lineno", 0), target, local, type_only, lazy))
        out.append(src)
    return out


def node_of(name: str, known: set[str]) -> str:
    """The first-level node (``te_align.audit``) of a module or of a name imported from a module."""
    parts = name.split(".")
    if len(parts) < 2:
        return "te_align"
    first = f"te_align.{parts[1]}"
    return first if first in known else "te_align"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def _lazy_exports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module) of each module named in a dict literal passed to ``lazy_exports(...)`` (PEP 562 exports)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) == "lazy_exports" and len(node.args) > 1:
            table = node.args[1]
            if isinstance(table, ast.Name):  # ``lazy_exports(__name__, _EXPORTS, globals())``: the module's own table
                found = [a.value for a in tree.body if isinstance(a, ast.Assign | ast.AnnAssign)
                         and any(isinstance(t, ast.Name) and t.id == table.id
                                 for t in (a.targets if isinstance(a, ast.Assign) else [a.target]))]
                table = found[0] if found else table
            if isinstance(table, ast.Dict):
                for v in table.values:
                    if isinstance(v, ast.Constant) and isinstance(v.value, str):
                        yield v.lineno, v.value


def resolve_module(target: str, modules: set[str]) -> str | None:
    """The ``te_align`` module an import target runs: ``a.b.name`` is module ``a.b.name`` when there is one
    (``from a.b import name`` of a submodule), else the longest prefix that is a module (``a.b``)."""
    parts = target.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        parts.pop()
    return None


def module_edges(sources: list[Source]) -> dict[tuple[str, str], list[Import]]:
    """Every runtime arrow between two ``te_align`` modules, with the import statements that draw it.

    Counted: module-level imports, function-local imports, ``lazy_module("...")`` handles,
    ``importlib.import_module`` with a literal name and the modules a ``lazy_exports`` table names (all run
    when the code that needs them does). Not counted: imports under ``if TYPE_CHECKING:`` (never run), and
    the parent packages Python runs before a submodule (``import a.b.c`` runs ``a/__init__`` and
    ``a/b/__init__``; every submodule would otherwise close a loop with a package that re-exports it).
    """
    modules = {s.module for s in sources}
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for s in sources:
        imports = list(s.imports)
        for line, target in _lazy_exports(s.tree):
            if target.startswith("te_align."):
                imports.append(Import(s.module, line, target, False, False, True))
        for i in imports:
            b = resolve_module(i.target, modules)
            if i.type_only or b is None or b == s.module:
                continue
            edges[(s.module, b)].append(i)
    return edges


def module_loops(sources: list[Source]) -> list[tuple[list[str], list[str]]]:
    """Module-level import loops: each strongly connected group of :func:`module_edges`' graph, with the
    import lines (``file:line -> target``) of the arrows inside the group, that is the lines that close it."""
    edges = module_edges(sources)
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    files = {s.module: s.module.replace(".", "/") + ("/__init__.py" if s.path.name == "__init__.py" else ".py")
             for s in sources}
    out = []
    for group in strongly_connected(graph):
        members = set(group)
        lines = sorted({
            f"{files[a]}:{i.line} -> {b}{' (function-local)' if i.local else ''}{' (lazy)' if i.lazy else ''}"
            for (a, b), imports in edges.items() if a in members and b in members for i in imports},
            key=lambda t: (t.split(":")[0], int(t.split(":")[1].split(" ")[0])))
        out.append((group, lines))
    return out


def _code_lines(src: Source) -> list[tuple[int, str]]:
    """(line number, stripped text) of each line that is code: no blank, comment, import or docstring lines."""
    skip: set[int] = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    out = []
    for n, line in enumerate(src.text.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#") and n not in skip:
            out.append((n, s))
    return out


def duplicate_pairs(sources: list[Source], size: int = DUP_LINES) -> list[tuple[str, int, str, int, int]]:
    """Maximal runs of ``size`` or more identical code lines in two places: (file, line, file, line, length)."""
    lines = {s.module: _code_lines(s) for s in sources}
    windows: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for mod, ls in lines.items():
        for i in range(len(ls) - size + 1):
            window = tuple(t for _, t in ls[i:i + size])
            if sum(len(t) > 3 for t in window) >= size // 2:  # not a run of closing brackets
                windows[window].append((mod, i))
    matches: set[tuple[str, int, str, int]] = set()
    for places in windows.values():
        if len(places) > 20:  # boilerplate repeated everywhere is not a copy of one function
            continue
        for a in range(len(places)):
            for b in range(a + 1, len(places)):
                (ma, ia), (mb, ib) = sorted((places[a], places[b]))
                if ma == mb and abs(ia - ib) < size:
                    continue
                matches.add((ma, ia, mb, ib))
    runs = []
    for ma, ia, mb, ib in sorted(matches):
        if (ma, ia - 1, mb, ib - 1) in matches:
            continue  # inside a run that started earlier
        n = 0
        while (ma, ia + n, mb, ib + n) in matches:
            n += 1
        runs.append((ma, lines[ma][ia][0], mb, lines[mb][ib][0], n + size - 1))
    return runs


def measure(root: Path) -> dict[str, object]:
    sources = load(root)
    known = {f"te_align.{s.module.split('.')[1]}" for s in sources if s.module.count(".") >= 1}
    any_tokens = 0
    fmt_skip = 0
    long_lines = 0
    total = 0
    for s in sources:
        total += len(s.text.splitlines())
        fmt_skip += s.text.count("# fmt: skip")
        long_lines += sum(len(line) > 110 for line in s.text.splitlines())
        for tok in tokenize.generate_tokens(io.StringIO(s.text).readline):
            any_tokens += tok.type == tokenize.NAME and tok.string == "Any"
    local = list({(i.module, i.line): i for s in sources for i in s.imports if i.local}.values())
    graph: dict[str, set[str]] = defaultdict(set)
    for s in sources:
        a = node_of(s.module, known)
        for i in s.imports:
            b = node_of(i.target, known)
            if not i.type_only and a != b:
                graph[a].add(b)
    loops = strongly_connected(graph)
    mod_loops = module_loops(sources)
    arrows = list({(i.module, i.line): i for s in sources for i in s.imports
                   if not i.type_only and s.module.split(".")[1:2] and s.module.split(".")[1] in ENGINE
                   and node_of(i.target, known) == "te_align.trainers"}.values())
    dups = duplicate_pairs(sources)
    return {
        "lines": total,
        "function-local te_align imports": len(local),
        "lazy module handles": sum(i.lazy for s in sources for i in s.imports),
        "Any tokens": any_tokens,
        "fmt: skip": fmt_skip,
        "lines > 110 cols": long_lines,
        "import loops between subpackages": len(loops),
        "import loops between modules": len(mod_loops),
        "arrows engine -> trainers": len(arrows),
        "duplicated-code pairs": len(dups),
        "_loops": loops,
        "_module_loops": mod_loops,
        "_arrows": [f"{i.module}:{i.line} -> {i.target}" for i in arrows],
        "_local": [f"{i.module}:{i.line} -> {i.target}" for i in local],
        "_dups": [f"{a}:{la} = {b}:{lb} ({n} lines)" for a, la, b, lb, n in dups],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]), help="a checkout")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--loops", action="store_true",
                    help="list the nodes of each import loop, and each module loop with the lines that close it")
    ap.add_argument("--arrows", action="store_true", help="list the engine's imports of te_align.trainers")
    ap.add_argument("--local", action="store_true", help="list the function-local te_align imports")
    ap.add_argument("--dups", action="store_true", help="list the duplicated-code pairs")
    args = ap.parse_args(argv)
    res = measure(Path(args.root))
    numbers = {k: v for k, v in res.items() if not k.startswith("_")}
    if args.json:
        print(json.dumps(numbers, indent=1))
    else:
        for k, v in numbers.items():
            print(f"{k:<36}{v:>8}")
    for flag, key in (("loops", "_loops"), ("arrows", "_arrows"), ("local", "_local"), ("dups", "_dups")):
        if getattr(args, flag):
            print(f"\n{flag}:")
            for item in res[key]:  # type: ignore[attr-defined]
                print(f"  {' '.join(item) if isinstance(item, list) else item}")
    if args.loops:
        print("\nmodule loops:")
        for group, lines in res["_module_loops"]:  # type: ignore[attr-defined]
            print(f"  {len(group)} modules: {' '.join(group)}")
            for line in lines:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
