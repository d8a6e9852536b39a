"""Reading trainer config files: TOML / JSON / YAML with exact syntax-error positions, key lines,
the bundled lists of valid keys, and telling the trainer from a file's shape. No torch."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

# MAX_BYTES, overlaid, overlay_text, read_text and the config and error types are re-exported: callers read them
# here.
from te_align.audit.raw import MAX_BYTES as MAX_BYTES
from te_align.audit.raw import ConfigSyntaxError as ConfigSyntaxError
from te_align.audit.raw import RawConfig as RawConfig
from te_align.audit.raw import UnreadableConfig as UnreadableConfig
from te_align.audit.raw import overlaid as overlaid
from te_align.audit.raw import overlay_text as overlay_text
from te_align.audit.raw import read_bounded
from te_align.audit.raw import read_text as read_text
from te_align.errors import TeAlignError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from te_align._types import JSONObject, JSONValue
    from te_align.trainers.api import CheckParts

# The format modules load() dispatches to (cmdline, envfile) are imported there, when a file needs them.


class NotChecked(TeAlignError):
    """A readable config that te-align cannot check: no profile for its model, or not a training job.

    ``status`` is ``not-checked`` or ``not-training`` (exit code 3)."""

    def __init__(self, message: str, *, status: str = "not-checked", file: str | None = None) -> None:
        self.status = status
        self.reason = message
        super().__init__(message, file=file)


#: Limit on the nesting depth ``check`` reads (a 100k-deep YAML used to crash the interpreter).
MAX_DEPTH = 64


_TOML_POS = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def load(path: str, at_line: int | None = None, scripts: re.Pattern[str] | None = None) -> RawConfig:
    """Parse a config file; raise :class:`ConfigSyntaxError` with file, line and column. ``at_line``: in a file of
    several command lines, the one that starts at this line (default: the last). ``scripts``: the training scripts
    whose command lines are read (:func:`te_align.audit.cmdline.script_pattern`; None: a command-line file is
    refused, as where a trainer's reader loads a file its config names)."""
    p = Path(path)
    if not p.is_file():
        raise UnreadableConfig("no such file" if not p.exists() else "not a file", file=path)
    suffix = config_suffix(p)
    from te_align.audit import cmdline

    if suffix == ".env" or p.name.lower() in (".env", *(f".env{x}" for x in EXAMPLE_SUFFIXES)):
        from te_align.audit import envfile  # KEY=VALUE lines (a trainer's config.env)

        return envfile.load(path)
    if suffix in cmdline.SUFFIXES or (not suffix and p.is_file()):  # a training command line (diffusers scripts)
        if scripts is None:
            raise UnreadableConfig("a command-line file; expected a config file (.toml, .json, .yaml)", file=path)
        return cmdline.load(path, scripts, at_line)
    parsers = {".toml": ("toml", _parse_toml), ".json": ("json", _parse_json), ".yaml": ("yaml", _parse_yaml),
               ".yml": ("yaml", _parse_yaml)}
    if suffix not in parsers:
        raise UnreadableConfig(f"unknown config format '{suffix or p.name}'; expected .toml, .json, .yaml, .yml or "
                               f"an env file (.env) (or a command line in .sh/.txt/.bat; each also as {'/'.join(EXAMPLE_SUFFIXES)})",
                               file=path)
    text = read_bounded(path, "config")
    fmt, parse = parsers[suffix]
    _check_depth(path, text, fmt)
    try:
        data = parse(path, text)
    except RecursionError:
        raise ConfigSyntaxError(path, None, None, f"nested deeper than {MAX_DEPTH} levels") from None
    return RawConfig(path, fmt, text, data)


#: Suffixes of a trainer's example config (``config.json.example``): the file is read by the extension before it.
EXAMPLE_SUFFIXES = (".example", ".sample", ".dist")

#: The name te-align gives the backup of a file it changed (``check --fix``, ``patch``, ``unpatch --keep-changed``):
#: ``NAME.te-align-original`` (te_align.patching.transaction.KEPT_ORIGINAL_SUFFIX, kept equal by a test).
BACKUP_SUFFIX = ".te-align-original"


def backup_of(p: str | Path) -> str | None:
    """The file ``p`` is te-align's backup of (``a.toml.te-align-original`` -> ``a.toml``), or None."""
    name = str(p)
    return name[: -len(BACKUP_SUFFIX)] if name.endswith(BACKUP_SUFFIX) and len(Path(name).name) > len(BACKUP_SUFFIX) else None


def config_suffix(p: Path) -> str:
    """The extension that tells a config's format, lower case: ``config.json.example`` -> ``.json``; te-align's
    backup ``config.toml.te-align-original`` reads as the file it backs up (``.toml``)."""
    original = backup_of(p)
    if original is not None:
        p = Path(original)
    suffixes = [x.lower() for x in p.suffixes]
    if len(suffixes) >= 2 and suffixes[-1] in EXAMPLE_SUFFIXES:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def _check_depth(path: str, text: str, fmt: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` before any parser sees it (brackets outside strings;
    YAML block indentation levels; TOML dotted table headers)."""
    depth = 0
    quote = ""
    line = 1
    escaped = False
    for ch in text:
        if ch == "\n":
            line += 1
            if fmt != "json" and quote:  # YAML/TOML basic strings do not span lines (multi-line ones are rare)
                quote = ""
            continue
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'" and (fmt != "json" or ch == '"'):
            quote = ch
        elif ch == "#" and fmt != "json":
            quote = "\n"  # a comment runs to the end of the line
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigSyntaxError(path, line, None, f"nested deeper than {MAX_DEPTH} levels")
        elif ch in "]}":
            depth = max(0, depth - 1)
    if fmt == "yaml":
        stack = [-1]
        for n, raw in enumerate(text.splitlines(), 1):
            stripped = raw.lstrip(" -")
            if not stripped or stripped.startswith("#"):
                continue
            indent = len(raw) - len(stripped)
            while stack and indent <= stack[-1]:
                stack.pop()
            stack.append(indent)
            if len(stack) + raw[:indent].count("-") > MAX_DEPTH + 1:
                raise ConfigSyntaxError(path, n, None, f"nested deeper than {MAX_DEPTH} levels")
    elif fmt == "toml":
        for n, raw in enumerate(text.splitlines(), 1):
            s = raw.strip()
            if s.startswith("[") and s.count(".") > MAX_DEPTH:
                raise ConfigSyntaxError(path, n, None, f"nested deeper than {MAX_DEPTH} levels")


def _parse_toml(path: str, text: str) -> JSONObject:
    from te_align import _toml as tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POS.search(msg)
        if m:
            raise ConfigSyntaxError(path, int(m.group(1)), int(m.group(2)), msg[: m.start()]) from None
        raise ConfigSyntaxError(path, None, None, msg) from None


def _parse_json(path: str, text: str) -> JSONValue:
    try:
        data: JSONValue = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigSyntaxError(path, e.lineno, e.colno, e.msg) from None
    return data


def _parse_yaml(path: str, text: str) -> JSONValue:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data: JSONValue = yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        context = getattr(e, "context", None)
        msg = f"{context}: {problem}" if context else str(problem)
        if mark is not None:
            raise ConfigSyntaxError(path, mark.line + 1, mark.column + 1, msg) from None
        raise ConfigSyntaxError(path, None, None, msg) from None
    return data


def key_line(text: str, key: str) -> int | None:
    """1-based line of the first ``key = …`` / ``"key": …`` / ``key: …`` in ``text``."""
    pat = re.compile(r'^\s*(?:-\s*)?["\']?' + re.escape(key) + r'["\']?\s*[=:]', re.M)
    m = pat.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


# ---------------------------------------------------------------------------------- valid keys
@functools.cache
def known_keys(name: str, package: str) -> dict[str, frozenset[str]]:
    """The bundled list of valid keys of a ``check`` dialect (``data/<name>.txt`` in ``package``, its trainer's
    folder: each trainer reads its own), by section (``""`` when it has none)."""
    res = resources.files(package).joinpath("data", f"{name}.txt")
    sections: dict[str, set[str]] = {}
    current = ""
    for raw in res.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        sections.setdefault(current, set()).add(line)
    return {k: frozenset(v) for k, v in sections.items()}


# ------------------------------------------------------------------------------ trainer shape
def detect_trainer(raw: RawConfig, candidates: Sequence[CheckParts]) -> CheckParts:
    """Tell the config language from the file's shape: each candidate's reader scores it (the highest wins, the
    candidates' order breaks ties), or raise :class:`UnreadableConfig`."""
    best: tuple[int, CheckParts] | None = None
    for parts in candidates:
        score = parts.reader.detect(raw)
        if score and (best is None or score > best[0]):
            best = (score, parts)
    if best is not None:
        return best[1]
    files = [c.name for c in candidates if not c.command_line]
    if raw.fmt != "cmdline" and not _trainer_keys(raw.data, candidates):
        raise NotChecked(f"not a trainer config: no key in it is one a trainer te-align checks reads "
                         f"({', '.join(files)}); nothing to check", status="not-training", file=raw.file)
    if raw.fmt != "cmdline" and not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a table/object at the top level", file=raw.file)
    raise UnreadableConfig(f"cannot tell which trainer this config is for; pass --trainer {'|'.join(files)}",
                           file=raw.file)


def _keys(data: JSONValue) -> Iterator[str]:
    """Every key of ``data``, at every depth (lists included), without the leading dashes of a CLI-style key."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield str(k).lstrip("-")
            yield from _keys(v)
    elif isinstance(data, list):
        for v in data:
            yield from _keys(v)


def _trainer_keys(data: JSONValue, dialects: Sequence[CheckParts]) -> set[str]:
    """The keys of ``data`` some trainer reads (by the dialects' bundled key lists). Only keys of a trainer's own
    shape count (``learning_rate``, ``t5xxl-max-length``): a plain word such as ``name`` or ``version`` is a
    key of every kind of file."""
    known: set[str] = set()
    for d in dialects:
        try:
            lists = known_keys(d.name, d.package)
        except (FileNotFoundError, ModuleNotFoundError):  # a plug-in dialect without a bundled key list
            continue
        for keys in lists.values():
            known |= keys
    return {k for k in _keys(data) if k in known and ("_" in k.strip("_") or "-" in k)}
