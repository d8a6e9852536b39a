"""The options of a training script's argparse parser, read from its source without importing it (maintainer tool).

``script_options(root, path, package_dir)`` follows the script's ``if __name__ == "__main__":`` block statement by
statement up to the first ``parser.parse_args()`` / ``parse_known_args()``, the way Python would run it for the
parser: it enters every function it calls that the checkout defines (the script's own, ``import m`` / ``from m import
f`` of the checkout's modules), binds their parameters, takes an ``if`` whose condition it can work out from them
(``if support_dreambooth:``) and records each ``add_argument`` (option strings and ``dest``) on the parser object it
reaches, in the order argparse registers them (``-h``/``--help`` first when ``add_help`` is on). ``allow_abbrev`` and
``add_help`` come from the ``ArgumentParser(...)`` call.

Anything it cannot work out exactly where the parser is involved (a condition it cannot evaluate around an
``add_argument``, an option string that is not a literal, a parser passed to a function outside the checkout, a
parent parser, another ``prefix_chars``) stops it with :class:`Inexact` naming the file and line: the table is exact
or not made. Code that never touches the parser (logging set-up, help strings built at run time) is skipped.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

_PARSE = ("parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args")


class Inexact(Exception):
    """The parser depends on something this reader cannot work out exactly."""


@dataclass
class Parser:
    allow_abbrev: bool = True
    actions: list[tuple[tuple[str, ...], str]] = field(default_factory=list)  # (option strings, dest) in order

    def add(self, strings: tuple[str, ...], dest: str | None, where: str) -> None:
        taken = {s for ss, _ in self.actions for s in ss}
        clash = [s for s in strings if s in taken]
        if clash:  # conflict_handler="error": argparse raises, the script never runs
            raise Inexact(f"{where}: {clash[0]} is added twice (argparse raises ArgumentError)")
        if dest is None:
            longs = [s for s in strings if s.startswith("--")]
            dest = (longs[0] if longs else strings[0]).lstrip("-").replace("-", "_")
        self.actions.append((strings, dest))


@dataclass
class Group:
    parser: Parser


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()


class _Captured(Exception):
    def __init__(self, parser: Parser) -> None:
        self.parser = parser


class _Return(Exception):
    def __init__(self, value: object) -> None:
        self.value = value


@dataclass
class _Module:
    name: str
    path: Path
    tree: ast.Module
    funcs: dict[str, ast.FunctionDef]
    modules: dict[str, str]  # alias -> module name
    names: dict[str, tuple[str, str]]  # alias -> (module, name)
    consts: dict[str, object]


class Reader:
    """Reads the modules of one checkout: ``package_dir`` is the folder module names are relative to."""

    def __init__(self, package_dir: Path) -> None:
        self.root = package_dir
        self.cache: dict[str, _Module | None] = {}
        self.depth = 0

    # ------------------------------------------------------------------ modules
    def _file(self, name: str) -> Path | None:
        p = self.root.joinpath(*name.split("."))
        if (p / "__init__.py").is_file():
            return p / "__init__.py"
        return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None

    def module(self, name: str, path: Path | None = None) -> _Module | None:
        if name in self.cache:
            return self.cache[name]
        path = path or self._file(name)
        if path is None:
            self.cache[name] = None
            return None
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        m = _Module(name, path, tree, {}, {}, {}, {})
        self.cache[name] = m
        package = name.rsplit(".", 1)[0] if "." in name else ""
        if path.name == "__init__.py":
            package = name
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                m.funcs[node.name] = node
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        m.modules[a.asname] = a.name
                    else:
                        m.modules[a.name.split(".")[0]] = a.name.split(".")[0]
                        m.modules[a.name] = a.name
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".") if package else []
                    parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for a in node.names:
                    full = f"{base}.{a.name}" if base else a.name
                    if self._file(full) is not None:
                        m.modules[a.asname or a.name] = full
                    else:
                        m.names[a.asname or a.name] = (base, a.name)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if isinstance(node.value, ast.Constant):
                    m.consts[node.targets[0].id] = node.value.value
        return m

    def function(self, mod: _Module, name: str) -> tuple[_Module, ast.FunctionDef] | None:
        if name in mod.funcs:
            return mod, mod.funcs[name]
        if name in mod.names:
            target = self.module(mod.names[name][0])
            return self.function(target, mod.names[name][1]) if target else None
        return None

    # ------------------------------------------------------------------ running
    def run_main(self, path: Path, name: str) -> Parser:
        mod = self.module(name, path)
        assert mod is not None
        block = next((n for n in mod.tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)), None)
        if block is None:
            raise Inexact(f"{path}: no `if __name__ == \"__main__\":` block")
        try:
            self._body(block.body, mod, {})
        except _Captured as c:
            return c.parser
        except _Return:
            pass
        raise Inexact(f"{path}: the main block parses no arguments")

    def _where(self, mod: _Module, node: ast.AST) -> str:
        return f"{mod.path}:{getattr(node, 'lineno', '?')}"

    def _touches(self, nodes: list[ast.AST], env: dict[str, object]) -> bool:
        """Whether code mentions a parser (a name bound to one, an add_argument, a parse call, a new parser)."""
        for top in nodes:
            for n in ast.walk(top):
                if isinstance(n, ast.Name) and isinstance(env.get(n.id), (Parser, Group)):
                    return True
                if isinstance(n, ast.Attribute) and n.attr in ("add_argument", "ArgumentParser", *_PARSE):
                    return True
                if isinstance(n, ast.Name) and n.id == "ArgumentParser":
                    return True
        return False

    def _body(self, stmts: list[ast.stmt], mod: _Module, env: dict[str, object]) -> None:
        for s in stmts:
            self._stmt(s, mod, env)

    def _stmt(self, s: ast.stmt, mod: _Module, env: dict[str, object]) -> None:
        if isinstance(s, ast.Expr):
            self._eval(s.value, mod, env)
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            value = self._eval(s.value, mod, env) if s.value is not None else UNKNOWN
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    env[t.id] = value
                elif isinstance(value, (Parser, Group)):
                    raise Inexact(f"{self._where(mod, s)}: a parser stored where this reader does not follow it")
        elif isinstance(s, ast.Return):
            raise _Return(self._eval(s.value, mod, env) if s.value is not None else None)
        elif isinstance(s, ast.If):
            cond = self._eval(s.test, mod, env)
            if isinstance(cond, _Unknown) or isinstance(cond, (Parser, Group)):
                if self._touches([*s.body, *s.orelse], env):
                    raise Inexact(f"{self._where(mod, s)}: `if {ast.unparse(s.test)}` decides parser code and "
                                  "cannot be worked out from the source")
                return
            self._body(s.body if cond else s.orelse, mod, env)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom,
                            ast.Pass, ast.Global, ast.Nonlocal)):
            return
        elif self._touches([s], env):
            raise Inexact(f"{self._where(mod, s)}: a {type(s).__name__} statement around parser code")

    def _eval(self, e: ast.expr, mod: _Module, env: dict[str, object]) -> object:
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Name):
            if e.id in env:
                return env[e.id]
            if e.id in mod.consts:
                return mod.consts[e.id]
            return UNKNOWN
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            v = self._eval(e.operand, mod, env)
            return UNKNOWN if isinstance(v, _Unknown) else not v
        if isinstance(e, ast.BoolOp):
            vals = [self._eval(v, mod, env) for v in e.values]
            if any(isinstance(v, _Unknown) for v in vals):
                return UNKNOWN
            return all(vals) if isinstance(e.op, ast.And) else any(vals)
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            a, b = self._eval(e.left, mod, env), self._eval(e.comparators[0], mod, env)
            if isinstance(a, _Unknown) or isinstance(b, _Unknown):
                return UNKNOWN
            op = e.ops[0]
            if isinstance(op, ast.Is):
                return a is b
            if isinstance(op, ast.IsNot):
                return a is not b
            if isinstance(op, ast.Eq):
                return a == b
            if isinstance(op, ast.NotEq):
                return a != b
            return UNKNOWN
        if isinstance(e, ast.Call):
            return self._call(e, mod, env)
        return UNKNOWN

    def _call(self, e: ast.Call, mod: _Module, env: dict[str, object]) -> object:
        f = e.func
        where = self._where(mod, e)
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            obj = self._eval(f.value, mod, env)
            if isinstance(obj, (Parser, Group)):
                return self._method(obj, f.attr, e, mod, env, where)
        if (isinstance(f, ast.Attribute) and f.attr == "ArgumentParser") or (
                isinstance(f, ast.Name) and f.id == "ArgumentParser"):
            return self._new_parser(e, mod, env, where)
        args = [self._eval(a, mod, env) for a in e.args]
        kwargs = {k.arg: self._eval(k.value, mod, env) for k in e.keywords if k.arg}
        target = None
        if isinstance(f, ast.Name):
            target = self.function(mod, f.id)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in mod.modules \
                and f.value.id not in env:
            other = self.module(mod.modules[f.value.id])
            target = self.function(other, f.attr) if other else None
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute):
            dotted = ast.unparse(f.value)
            if dotted in mod.modules:
                other = self.module(mod.modules[dotted])
                target = self.function(other, f.attr) if other else None
        passes_parser = any(isinstance(v, (Parser, Group)) for v in [*args, *kwargs.values()])
        if target is None:
            if passes_parser:
                raise Inexact(f"{where}: the parser goes to {ast.unparse(f)}, which this reader cannot follow")
            return UNKNOWN
        return self._enter(target[0], target[1], args, kwargs, where)

    def _enter(self, mod: _Module, fn: ast.FunctionDef, args: list[object], kwargs: dict[str, object],
               where: str) -> object:
        if self.depth > 40:
            raise Inexact(f"{where}: calls nested too deep")
        a = fn.args
        params = [*a.posonlyargs, *a.args]
        env: dict[str, object] = {}
        defaults = [self._eval(d, mod, {}) for d in a.defaults]
        for p, d in zip(params[len(params) - len(defaults):], defaults, strict=True):
            env[p.arg] = d
        for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            env[k.arg] = self._eval(d, mod, {}) if d is not None else UNKNOWN
        for p, v in zip(params, args[:len(params)], strict=False):
            env[p.arg] = v
        if len(args) > len(params) and any(isinstance(v, (Parser, Group)) for v in args[len(params):]):
            raise Inexact(f"{where}: the parser goes to *args of {fn.name}")
        for k, v in kwargs.items():
            env[k] = v
        for p in [*params, *a.kwonlyargs]:
            env.setdefault(p.arg, UNKNOWN)
        self.depth += 1
        try:
            self._body(fn.body, mod, env)
        except _Return as r:
            return r.value
        finally:
            self.depth -= 1
        return None

    def _new_parser(self, e: ast.Call, mod: _Module, env: dict[str, object], where: str) -> Parser:
        kw = {k.arg: k.value for k in e.keywords}
        if None in kw:
            raise Inexact(f"{where}: ArgumentParser(**…)")
        for bad in ("parents", "prefix_chars", "fromfile_prefix_chars", "conflict_handler"):
            if bad in kw:
                raise Inexact(f"{where}: ArgumentParser({bad}=…) is not read by this reader")
        flags = {}
        for name in ("allow_abbrev", "add_help"):
            v = self._eval(kw[name], mod, env) if name in kw else True
            if not isinstance(v, bool):
                raise Inexact(f"{where}: ArgumentParser({name}={ast.unparse(kw[name])}) is not a literal")
            flags[name] = v
        p = Parser(allow_abbrev=flags["allow_abbrev"])
        if flags["add_help"]:
            p.add(("-h", "--help"), "help", where)
        return p

    def _method(self, obj: Parser | Group, name: str, e: ast.Call, mod: _Module, env: dict[str, object],
                where: str) -> object:
        parser = obj.parser if isinstance(obj, Group) else obj
        if name == "add_argument":
            strings = []
            for a in e.args:
                v = self._eval(a, mod, env)
                if not isinstance(v, str):
                    raise Inexact(f"{where}: an option name that is not a literal ({ast.unparse(a)})")
                strings.append(v)
            dest = None
            for k in e.keywords:
                if k.arg is None:
                    raise Inexact(f"{where}: add_argument(**…)")
                if k.arg == "dest":
                    v = self._eval(k.value, mod, env)
                    if not isinstance(v, str):
                        raise Inexact(f"{where}: a dest that is not a literal")
                    dest = v
            if strings and not strings[0].startswith("-"):
                parser.actions.append(((), dest or strings[0]))  # a positional: no option string to abbreviate
                return None
            parser.add(tuple(strings), dest, where)
            return None
        if name in ("add_argument_group", "add_mutually_exclusive_group"):
            return Group(parser)
        if name in _PARSE:
            raise _Captured(parser)
        if name in ("set_defaults", "print_help", "print_usage", "format_help"):
            return None
        raise Inexact(f"{where}: parser.{name}(…) is not read by this reader")


def script_options(package_dir: Path, script: Path, module: str) -> Parser:
    """The parser a script's main block builds (``module``: its import name under ``package_dir``)."""
    return Reader(package_dir).run_main(script, module)


def default_dest(strings: tuple[str, ...]) -> str:
    longs = [s for s in strings if s.startswith("--")]
    return (longs[0] if longs else strings[0]).lstrip("-").replace("-", "_")


def render_section(name: str, parser: Parser) -> list[str]:
    """``[name]``, ``!allow_abbrev false`` where abbreviations are off, then one line per option in the parser's
    order: its option strings, and ``> dest`` where the dest is not argparse's default for them."""
    out = [f"[{name}]"]
    if not parser.allow_abbrev:
        out.append("!allow_abbrev false")
    for strings, dest in parser.actions:
        if not strings:
            continue
        line = " ".join(strings)
        out.append(line if dest == default_dest(strings) else f"{line} > {dest}")
    return out
