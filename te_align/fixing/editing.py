"""Editing a trainer config's text for ``te-align check --fix``: set, add or remove one key (or command-line
flag) and keep every other byte.

A trainer's writer (:class:`te_align.trainers.api.ConfigWriter`) turns a finding's
:class:`~te_align.audit.findings.Edit` into :class:`Change` s (file, format, path inside the file, value);
:func:`apply` makes them:

TOML
    with tomlkit (comment-, order- and format-preserving; a literal ``'string'`` stays literal); a key new at
    the top level of a file with tables goes after the last top-level key (tomlkit would put it elsewhere);
YAML
    ruamel.yaml's round-trip loader finds the key and value positions, and only that span of the text is
    replaced (a dump would re-indent lists and move comments); quoting style kept;
JSON
    the member's span (found by a scanner over the text) is replaced; a new member copies the separator and
    indentation of the object's last one, so the file's indentation and key order stay;
command line
    the flag's value word is replaced, a flag removed with its value (and its line, when it stood alone on a
    continued line), a new flag goes on a line of its own before the command's last one (continued as the
    others).

Every result is parsed again and compared with the data the changes should give (:func:`expected_data`); an
edit that would give anything else is refused (:class:`CannotFix`), never written. tomlkit and ruamel.yaml are
imported here, when a fix is made, never by ``te-align check`` itself. No torch.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from te_align.audit import cmdline, readers
from te_align.audit.parsed import cli_scalar, parse_cli
from te_align.errors import TeAlignError

if TYPE_CHECKING:  # pragma: no cover
    from te_align._types import JSONValue

#: A path inside a config: mapping keys and list indices from the top (``("config", "process", 0, "model",
#: "k")``); for a command line, the flag's name alone (``("t5xxl_max_token_length",)``).
Path_ = tuple[str | int, ...]


class CannotFix(TeAlignError):
    """A fix that cannot be written: the reason, one line (the file and key are in it)."""


@dataclass(frozen=True)
class Change:
    """One edit of one file: set ``path`` to ``value`` (adding it where missing) or remove it (``remove``)."""

    file: str
    fmt: str  # "toml" | "json" | "yaml" | "cmdline"
    path: Path_
    value: object = None
    remove: bool = False
    #: The trainer's key, for messages (``model.t5_max_length``, ``--t5xxl_max_token_length``).
    key: str = ""
    #: Command lines: the prefixes of the option written in the file that the script's argparse reads as it
    #: (``t5xxl_max``); the edit writes the option in full there.
    spelled: tuple[str, ...] = ()
    #: Command lines: the first line of the command the change edits in a file of several (None: the last one).
    at_line: int | None = None

    def describe(self) -> str:
        """``key = value`` / ``removed key`` in the file's own spelling."""
        name = self.key or ".".join(str(p) for p in self.path)
        if self.fmt == "cmdline":
            name = f"--{name}" if not name.startswith("--") else name
            if self.remove:
                return f"removed {name}"
            if isinstance(self.value, (list, tuple)):  # an nargs="+" option
                return f"{name} " + " ".join(_shown(v) for v in self.value)
            return name if self.value is True else f"{name} {_shown(self.value)}"
        return f"removed {name}" if self.remove else f"{name} = {_shown(self.value)}"


def _shown(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)


# ------------------------------------------------------------------------------------ apply + verify
def apply(text: str, fmt: str, changes: Sequence[Change], file: str, scripts: re.Pattern[str] | None = None) -> str:
    """``text`` with ``changes`` made (all of one file and format); everything else byte for byte. ``scripts``: the
    training scripts whose command lines are read (:func:`te_align.audit.cmdline.script_pattern`; for a command
    line)."""
    if fmt == "toml":
        return _toml(text, changes, file)
    out = text
    if fmt == "cmdline":  # the last command first: an edit that adds or drops a line moves only the commands below
        changes = sorted(changes, key=lambda c: -(c.at_line if c.at_line is not None else 1 << 30))
    for c in changes:
        out = _cmdline(out, c, file, _scripts(scripts, file)) if fmt == "cmdline" else \
            {"json": _json, "yaml": _yaml}[fmt](out, c, file)
    return out


def _scripts(scripts: re.Pattern[str] | None, file: str) -> re.Pattern[str]:
    if scripts is None:
        raise CannotFix("a command line, and no training scripts to find its command by", file=file)
    return scripts


def expected_data(data: JSONValue, changes: Sequence[Change]) -> JSONValue:
    """The parsed config the changes should give (structured formats)."""
    out = copy.deepcopy(data)
    for c in changes:
        parent: object = out
        for p in c.path[:-1]:
            parent = parent[p]  # type: ignore[index]
        last = c.path[-1]
        if c.remove:
            if isinstance(parent, dict):
                parent.pop(last, None)
        else:
            parent[last] = c.value  # type: ignore[index]
    return out


def parse_text(text: str, fmt: str, file: str, scripts: re.Pattern[str] | None = None) -> JSONValue:
    """A config's text parsed as ``check`` parses it (line endings as Python reads files)."""
    plain = text.replace("\r\n", "\n")
    if fmt == "cmdline":
        return cmdline.parse_text(plain, file, _scripts(scripts, file)).data
    parse = {"toml": readers._parse_toml, "json": readers._parse_json, "yaml": readers._parse_yaml}[fmt]
    return parse(file, plain)


def verify(old_text: str, new_text: str, fmt: str, changes: Sequence[Change], file: str,
           scripts: re.Pattern[str] | None = None) -> None:
    """Refuse an edit whose text does not parse to exactly the data the changes should give."""
    if fmt == "cmdline" and any(c.at_line is not None for c in changes):
        _verify_commands(old_text, new_text, changes, file, _scripts(scripts, file))
        return
    old, new = parse_text(old_text, fmt, file, scripts), parse_text(new_text, fmt, file, scripts)
    if fmt == "cmdline":
        _verify_words(old, new, changes, file)
        return
    if new != expected_data(old, changes):
        keys = ", ".join(c.key or str(c.path[-1]) for c in changes)
        raise CannotFix(f"the edit of {keys} would change more than that key; nothing written "
                        "(please report this config)", file=file)


def _verify_commands(old_text: str, new_text: str, changes: Sequence[Change], file: str,
                     scripts: re.Pattern[str]) -> None:
    """A file of several commands: each command of the new text reads as the same command of the old one with
    its own changes made, and nothing else (the commands matched in order)."""
    old_plain, new_plain = old_text.replace("\r\n", "\n"), new_text.replace("\r\n", "\n")
    olds, news = cmdline.commands(old_plain, file, scripts), cmdline.commands(new_plain, file, scripts)
    if len(olds) != len(news):
        raise CannotFix("the edit would change which commands the file runs; nothing written (please report this "
                        "file)", file=file)
    for (old_first, _), (new_first, _) in zip(olds, news, strict=True):
        mine = [c for c in changes if c.at_line == old_first]
        _verify_words(cmdline.parse_text(old_plain, file, scripts, old_first).data,
                      cmdline.parse_text(new_plain, file, scripts, new_first).data, mine, file)


def _verify_words(old: JSONValue, new: JSONValue, changes: Sequence[Change], file: str) -> None:
    assert isinstance(old, dict) and isinstance(new, dict)
    before, _, _ = parse_cli(list(old["args"]))  # type: ignore[arg-type]
    after, _, _ = parse_cli(list(new["args"]))  # type: ignore[arg-type]
    want = dict(before)
    for c in changes:
        name = str(c.path[0])
        for short in c.spelled:  # the abbreviation is written in full now
            if short.replace("-", "_") in want:
                want[name] = want.pop(short.replace("-", "_"))
        if c.remove:
            want.pop(name, None)
        elif isinstance(c.value, (list, tuple)):  # an nargs="+" option: every word after the flag
            words = _list_words(list(new["args"]), name)  # type: ignore[arg-type]
            if words != [str(v) for v in c.value]:
                raise CannotFix(f"the edit of --{name} would not give it the values {' '.join(map(str, c.value))}; "
                                "nothing written (please report this file)", file=file)
            want[name] = cli_scalar(words[0]) if words else True
        else:
            want[name] = c.value if isinstance(c.value, bool) else cli_scalar(str(c.value))
    if after != want or old.get("script") != new.get("script"):
        keys = ", ".join(f"--{c.path[0]}" for c in changes)
        raise CannotFix(f"the edit of {keys} would change more of the command line than that; nothing "
                        "written (please report this file)", file=file)


def _list_words(args: list[str], name: str) -> list[str]:
    """The words after the last ``--name`` up to the next option (how argparse reads ``nargs="+"``)."""
    out: list[str] = []
    for i, a in enumerate(args):
        if a.replace("-", "_") == f"__{name}":
            out = []
            for w in args[i + 1:]:
                if w.startswith("--"):
                    break
                out.append(w)
    return out


def _nl(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


# ------------------------------------------------------------------------------------ TOML
def _toml(text: str, changes: Sequence[Change], file: str) -> str:
    import tomlkit
    from tomlkit.items import AoT, String, StringType, Table

    doc = tomlkit.parse(text)
    top_new: list[Change] = []
    has_tables = any(isinstance(v, (Table, AoT)) for v in doc.values())
    for c in changes:
        container: object = doc
        try:
            for p in c.path[:-1]:
                container = container[p]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            raise CannotFix(f"no [{'.'.join(str(p) for p in c.path[:-1])}] table for {c.key}; add it, then "
                            "run --fix again", file=file) from None
        last = c.path[-1]
        here = container  # a tomlkit Container, Table or InlineTable
        if c.remove:
            if last in here:  # type: ignore[operator]
                del here[last]  # type: ignore[attr-defined]
            continue
        if last in here:  # type: ignore[operator]
            old = here[last]  # type: ignore[index]
            kind = getattr(old, "type", None) or getattr(old, "_t", None)  # tomlkit < 0.13 names it _t
            literal = isinstance(old, String) and kind == StringType.SLL
            if literal and isinstance(c.value, str) and "'" not in c.value and "\n" not in c.value:
                here[last] = tomlkit.string(c.value, literal=True)  # type: ignore[index]
            else:
                here[last] = c.value  # type: ignore[index]
        elif len(c.path) == 1 and has_tables:
            top_new.append(c)
        else:
            here[last] = c.value  # type: ignore[index]
    out = tomlkit.dumps(doc)
    return _toml_top(out, top_new) if top_new else out


_HEADER = re.compile(r"^[ \t]*\[")


def _toml_top(text: str, adds: Sequence[Change]) -> str:
    """New top-level keys after the last top-level key (before the comments and blank lines above the first
    table)."""
    import tomlkit

    lines = text.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if _HEADER.match(line)), len(lines))
    at = first
    while at > 0 and (not lines[at - 1].strip() or lines[at - 1].lstrip().startswith("#")):
        at -= 1
    nl = _nl(text)
    new = "".join(tomlkit.dumps({str(c.path[0]): c.value}).rstrip("\n") + nl for c in adds)
    if at > 0 and not lines[at - 1].endswith("\n"):
        lines[at - 1] += nl
    return "".join(lines[:at]) + new + "".join(lines[at:])


# ------------------------------------------------------------------------------------ YAML
_YAML_PLAIN = re.compile(r"[A-Za-z_/][\w./@+-]*(?: [\w./@+-]+)*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def _yaml_scalar(value: object, old: str | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    s = str(value)
    if old is not None and old.startswith("'") and "\n" not in s:
        return "'" + s.replace("'", "''") + "'"
    plain = old is not None and not old.startswith(('"', "'"))
    if plain and _YAML_PLAIN.fullmatch(s) and s.lower() not in _YAML_WORDS:
        return s
    return json.dumps(s, ensure_ascii=False)


def _scalar_end(line: str, col: int) -> int:
    """Where a one-line scalar that starts at ``col`` ends (exclusive)."""
    if col >= len(line):
        return col
    q = line[col]
    if q == '"':
        i = col + 1
        while i < len(line):
            if line[i] == "\\":
                i += 2
                continue
            if line[i] == '"':
                return i + 1
            i += 1
        return -1
    if q == "'":
        i = col + 1
        while i < len(line):
            if line[i] == "'":
                if line[i + 1:i + 2] == "'":
                    i += 2
                    continue
                return i + 1
            i += 1
        return -1
    m = re.search(r"[ \t]#", line[col:])
    end = col + m.start() if m else len(line.rstrip("\r\n"))
    return len(line[:end].rstrip())


def _yaml(text: str, c: Change, file: str) -> str:
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    doc = YAML(typ="rt").load(text)
    parent = doc
    try:
        for p in c.path[:-1]:
            parent = parent[p]
    except (KeyError, IndexError, TypeError):
        raise CannotFix(f"no {'.'.join(str(p) for p in c.path[:-1])} section for {c.key}; add it, then run "
                        "--fix again", file=file) from None
    if not isinstance(parent, CommentedMap) or parent.fa.flow_style():
        raise CannotFix(f"{c.key}: its section is not a block mapping (a {{…}} flow mapping?); edit it "
                        "by hand", file=file)
    key = c.path[-1]
    lines = text.splitlines(keepends=True)
    if key in parent:
        kl, kc = parent.lc.key(key)
        vl, vc = parent.lc.value(key)
        if isinstance(parent[key], (dict, list)) or vl != kl:
            raise CannotFix(f"{c.key}: the value is not a one-line scalar; edit it by hand", file=file)
        line = lines[kl]
        end = _scalar_end(line, vc)
        if end < 0 or line[vc:vc + 1] in ("|", ">", "&", "*", "!"):
            raise CannotFix(f"{c.key}: the value is not a plain or quoted one-line scalar; edit it by hand",
                            file=file)
        if c.remove:
            if line[:kc].strip():  # the key shares its line with a list dash or another key
                raise CannotFix(f"{c.key}: the key starts a list item; remove it by hand", file=file)
            del lines[kl]
            return "".join(lines)
        lines[kl] = line[:vc] + _yaml_scalar(c.value, line[vc:end]) + line[end:]
        return "".join(lines)
    if c.remove:
        return text
    if not len(parent):
        raise CannotFix(f"{c.key}: its section is empty; add the key by hand", file=file)
    last = list(parent)[-1]
    kl, kc = parent.lc.key(last)
    end = kl
    for j in range(kl + 1, len(lines)):
        s = lines[j]
        stripped = s.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(s) - len(s.lstrip(" "))
        if indent > kc or (indent == kc and stripped.startswith("- ") and isinstance(parent[last], list)):
            end = j
            continue
        break
    nl = _nl(text)
    if not lines[end].endswith("\n"):
        lines[end] += nl
    lines.insert(end + 1, " " * kc + f"{key}: {_yaml_scalar(c.value, None)}{nl}")
    return "".join(lines)


# ------------------------------------------------------------------------------------ JSON
_WS = re.compile(r"[ \t\n\r]*")


@dataclass
class _Obj:
    open: int
    close: int
    keys: list[str]


def _json_scan(text: str) -> tuple[dict[Path_, tuple[int, int, int]], dict[Path_, _Obj]]:
    """Every member's (key start, value start, value end) and every object's braces and keys, by path."""
    from json.decoder import scanstring  # type: ignore[attr-defined]  # (not in typeshed)

    members: dict[Path_, tuple[int, int, int]] = {}
    objects: dict[Path_, _Obj] = {}
    dec = json.JSONDecoder()

    def ws(i: int) -> int:
        m = _WS.match(text, i)
        return m.end() if m else i

    def value(i: int, path: Path_) -> int:
        i = ws(i)
        ch = text[i]
        if ch == "{":
            obj = _Obj(i, -1, [])
            i = ws(i + 1)
            while text[i] != "}":
                kstart = i
                key, i = scanstring(text, i + 1)
                i = ws(i)
                vstart = ws(i + 1)
                vend = value(vstart, (*path, key))
                members[(*path, key)] = (kstart, vstart, vend)
                obj.keys.append(key)
                i = ws(vend)
                if text[i] == ",":
                    i = ws(i + 1)
            obj.close = i
            objects[path] = obj
            return i + 1
        if ch == "[":
            i, n = ws(i + 1), 0
            while text[i] != "]":
                i = ws(value(i, (*path, n)))
                n += 1
                if text[i] == ",":
                    i = ws(i + 1)
            return i + 1
        _, end = dec.raw_decode(text, i)
        return end

    value(0, ())
    return members, objects


def _json(text: str, c: Change, file: str) -> str:
    members, objects = _json_scan(text)
    new = json.dumps(c.value, ensure_ascii=False)
    if c.path in members:
        kstart, vstart, vend = members[c.path]
        if not c.remove:
            return text[:vstart] + new + text[vend:]
        obj = objects[c.path[:-1]]
        at = obj.keys.index(str(c.path[-1]))
        if at > 0:  # from the end of the member before it: its comma and line go with it
            prev_end = members[(*c.path[:-1], obj.keys[at - 1])][2]
            return text[:prev_end] + text[vend:]
        if len(obj.keys) > 1:
            nxt = members[(*c.path[:-1], obj.keys[1])][0]
            return text[:kstart] + text[nxt:]
        return text[:obj.open + 1] + text[obj.close:]
    if c.remove:
        return text
    parent = objects.get(c.path[:-1])
    if parent is None:
        raise CannotFix(f"no {'.'.join(str(p) for p in c.path[:-1])} object for {c.key}; add it, then run "
                        "--fix again", file=file)
    member = json.dumps(str(c.path[-1]), ensure_ascii=False) + ": " + new
    if not parent.keys:
        return text[:parent.open + 1] + member + text[parent.close:]
    last = members[(*c.path[:-1], parent.keys[-1])]
    if len(parent.keys) > 1:
        sep = text[members[(*c.path[:-1], parent.keys[-2])][2]:last[0]]
    else:
        sep = "," + text[parent.open + 1:last[0]]
    colon = re.match(r'"(?:[^"\\]|\\.)*"(\s*:\s*)', text[last[0]:])
    if colon:
        member = json.dumps(str(c.path[-1]), ensure_ascii=False) + colon.group(1) + new
    return text[:last[2]] + sep + member + text[last[2]:]


# ------------------------------------------------------------------------------------ command line
def _word(v: object, windows: bool = False) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    s = str(v)
    if windows:
        return f'"{s}"' if (not s or re.search(r"[\s&|<>^]", s)) else s
    return shlex.quote(s)


_VALUE = re.compile(r"""[ \t]*("(?:[^"\\]|\\.)*"|'[^']*'|[^\s\\^`]+)""")


def _cmdline(text: str, c: Change, file: str, scripts: re.Pattern[str]) -> str:
    span = cmdline.command_lines(text.replace("\r\n", "\n"), scripts, c.at_line)
    if span is None:
        raise CannotFix("no training command line in this file", file=file)
    windows = Path(file).suffix.lower() in (".bat", ".cmd", ".ps1")
    name = str(c.path[0])
    lines = text.splitlines(keepends=True)
    first, last = span[0] - 1, span[1] - 1
    spelled = "|".join([re.escape(name).replace("_", "[-_]"), *(re.escape(w) for w in c.spelled)])
    flag = re.compile(r"(?:(?<=\s)|^)--(?:" + spelled + r")(?=[\s=]|$)")
    hits = [(i, m) for i in range(first, last + 1) for m in flag.finditer(lines[i])]
    if not hits and c.remove:
        return text
    many = isinstance(c.value, (list, tuple))  # nargs="+": the values are separate words
    shown = (" ".join(_word(v, windows) for v in c.value) if isinstance(c.value, (list, tuple))
             else _word(c.value, windows))
    if not hits:
        new_flag = f"--{name}" if c.value is True else f"--{name} {shown}"
        if first == last:
            line = lines[first]
            body = line.rstrip("\r\n")
            m = re.search(r"\s+#", body) if not windows else None
            cut = m.start() if m else len(body.rstrip())
            lines[first] = body[:cut] + " " + new_flag + body[cut:] + line[len(body):]
        else:
            cont = lines[first].rstrip("\r\n").rstrip()[-1]
            tail = lines[last]
            indent = tail[: len(tail) - len(tail.lstrip(" \t"))] or "  "
            lines.insert(last, f"{indent}{new_flag} {cont}{_nl(text)}")
        return "".join(lines)
    for i, m in reversed(hits):  # every occurrence (argparse keeps the last; all of them are made the same)
        line = lines[i]
        after = m.end()
        val = None
        if line[after:after + 1] == "=":
            v = _VALUE.match(line, after + 1)
            val = (after, v.end() if v else after + 1)
        else:
            v = _VALUE.match(line, after)
            if v and not v.group(1).startswith("-") and v.group(1) not in ("\\", "^", "`"):
                val = (after, v.end())
                while many and (w := _VALUE.match(line, val[1])) and not w.group(1).startswith("-") \
                        and w.group(1) not in ("\\", "^", "`"):
                    val = (after, w.end())  # every value of an nargs="+" option on this line
        if val is not None and re.search(r"\$|%\w+%", line[val[0]:val[1]]) and not c.remove:
            if len(hits) > 1:
                raise CannotFix(f"--{name} is written {len(hits)} times and takes its value from a variable "
                                f"({line[val[0]:val[1]].strip(' =')}); set it by hand", file=file)
            return _set_variable("".join(lines), line[val[0]:val[1]].strip(" ="), name, c, file, windows, scripts)
        end = val[1] if val else after
        if c.remove:
            start = m.start()
            while start > 0 and line[start - 1] in " \t":
                start -= 1
            rest = line[:start] + line[end:]
            if not rest.strip() or re.fullmatch(r"[ \t]*[\\^`]?[ \t]*\r?\n?", rest):
                del lines[i]
            else:
                lines[i] = (rest if start else rest.lstrip(" \t"))
            continue
        head = line[:m.start()] + f"--{name}" if m.group(0)[2:] in c.spelled else line[:after]
        if c.value is True:
            lines[i] = head + line[end:]
        else:
            lines[i] = head + " " + shown + line[end:]
    return "".join(lines)


_REF = re.compile(r"""["']?(?:\$\{(\w+)\}|\$(\w+)|%(\w+)%)["']?""")


def _set_variable(text: str, ref: str, name: str, c: Change, file: str, windows: bool,
                  scripts: re.Pattern[str]) -> str:
    """``--name $VAR``: the value is set where the file sets ``VAR`` when that is its one setting and this its one
    use (``export VAR=…``, ``VAR=…``, ``set VAR=…``, ``set "VAR=…"``, ``$env:VAR = …``); else one line why not."""
    m = _REF.fullmatch(ref)
    if m is None:
        raise CannotFix(f"--{name} takes its value from a variable inside a longer word ({ref}); set it by hand",
                        file=file)
    var = m.group(1) or m.group(2) or m.group(3)
    lines = text.splitlines(keepends=True)
    sets = [i for i, ln in enumerate(lines) if (a := cmdline.assignment(ln, scripts)) and a[0] == var]
    uses = len(re.findall(r"\$\{" + var + r"\}|\$" + var + r"\b|%" + var + "%", text))
    uses -= sum(len(re.findall(r"\$\{" + var + r"\}|\$" + var + r"\b|%" + var + "%", lines[i])) for i in sets)
    if len(sets) != 1 or uses != 1:
        why = ("is not set in this file" if not sets else f"is set {len(sets)} times in this file" if len(sets) > 1
               else f"is used {uses} times in this file")
        raise CannotFix(f"--{name} takes its value from {ref}, which {why}; set it by hand (nothing written)",
                        file=file)
    i = sets[0]
    _, start, end = cmdline.assignment(lines[i], scripts)  # type: ignore[misc]
    old = lines[i][start:end]
    shown = str(c.value)
    if len(old) >= 2 and old[0] == old[-1] and old[0] in "\"'":
        new = old[0] + shown + old[0]
    else:
        new = _word(c.value, windows)
    lines[i] = lines[i][:start] + new + lines[i][end:]
    return "".join(lines)


def flag_words(words: str, name: str, value: object, remove: bool) -> str:
    """A string of command-line words (a GUI config's field of extra arguments) with ``--name`` set to
    ``value`` (added where missing) or removed."""
    parts = shlex.split(words)
    out: list[str] = []
    i, done = 0, False
    while i < len(parts):
        w = parts[i]
        flag, eq, _ = w.partition("=")
        if flag.replace("-", "_") == f"__{name}":
            has_value = not eq and i + 1 < len(parts) and not parts[i + 1].startswith("--")
            i += 2 if has_value else 1
            if not remove and not done:
                out += [f"--{name}"] if value is True else [f"--{name}", _word(value)]
                done = True
            continue
        out.append(shlex.quote(w))
        i += 1
    if not remove and not done:
        out += [f"--{name}"] if value is True else [f"--{name}", _word(value)]
    return " ".join(out)


# ------------------------------------------------------------------------------------ for the writers
def require_known(key: str, valid: frozenset[str] | set[str], file: str, trainer: str) -> None:
    """Refuse to write a key the trainer does not read (not in its bundled key list)."""
    if key not in valid:
        raise CannotFix(f"not a key {trainer} reads (not in te-align's list of its keys); --fix will "
                        "not write it", file=file, key=key)


def flat_paths(data: JSONValue, key: str) -> list[Path_]:
    """Where ``key`` is in a config whose tables a trainer flattens into one namespace: the top level and every
    table."""
    if not isinstance(data, dict):
        return []
    paths: list[Path_] = [(key,)] if key in data and not isinstance(data[key], dict) else []
    return paths + [(k, key) for k, v in data.items() if isinstance(v, dict) and key in v]


def flat_changes(file: str, fmt: str, data: JSONValue, key: str, value: object, remove: bool) -> list[Change]:
    """Set (every occurrence of) or remove a key of a flattened config; a new key goes to the top level when
    the file has top-level keys (or no tables), else into its first table."""
    paths = flat_paths(data, key)
    if remove or paths:
        return [Change(file, fmt, p, value, remove, key) for p in paths]
    tables = [k for k, v in data.items() if isinstance(v, dict)] if isinstance(data, dict) else []
    top = [k for k, v in data.items() if not isinstance(v, (dict, list))] if isinstance(data, dict) else []
    return [Change(file, fmt, (key,) if top or not tables else (tables[0], key), value, False, key)]


def flag_or_flat_toml_changes(raw: readers.RawConfig, key: str, value: object, remove: bool,
                              extra_args: Sequence[str], parse: Callable[[list[str]], tuple[dict[str, object], ...]],
                              known: Callable[[], None] | None = None) -> list[Change]:
    """A flag of a training command line, or a key of the ``--config_file`` TOML that the script reads flattened into
    its arguments. ``parse``: the trainer's command-line reader; ``known``:
    run before a TOML key is written (refuses a key the trainer does not read)."""
    if raw.fmt == "cmdline":
        data = raw.data if isinstance(raw.data, dict) else {}
        given = parse([str(w) for w in data.get("args", [])])[0]  # type: ignore[union-attr]
        if remove and key not in given and given.get("config_file"):
            raise CannotFix(f"set in --config_file {given['config_file']}: remove it there", file=raw.file, key=key)
        return flag_changes(raw, key, value, remove, extra_args)
    if key in parse(list(extra_args))[0]:
        raise CannotFix("given on the command line after `--`, which overrides the TOML: change it there",
                        file=raw.file, key=key)
    if known is not None:
        known()
    return flat_changes(raw.file, "toml", raw.data, key, value, remove)


def with_spellings(raw: readers.RawConfig, changes: list[Change], options: object) -> list[Change]:
    """``changes`` with, on each command-line change, the prefixes of its option the file writes (``options``: the
    script's :class:`~te_align.audit.parsed.ScriptOptions`, or None)."""
    from te_align.audit.parsed import written_prefixes

    data = raw.data if isinstance(raw.data, dict) else {}
    args = [str(w) for w in data.get("args", [])]  # type: ignore[union-attr]
    return [dataclasses.replace(c, spelled=written_prefixes(args, options, str(c.path[0])))  # type: ignore[arg-type]
            if c.fmt == "cmdline" else c for c in changes]


def flag_changes(raw: readers.RawConfig, key: str, value: object, remove: bool,
                 extra_args: Sequence[str]) -> list[Change]:
    """A flag of a training command line in a file (``accelerate launch SCRIPT ARGS``)."""
    if isinstance(raw.data, dict) and raw.data.get("from_argv"):
        raise CannotFix("the command line was given after `--`, not in a file: change it there",
                        file=raw.file, key=f"--{key}")
    if key in parse_cli(list(extra_args))[0]:
        raise CannotFix("given on te-align's command line after `--`, which overrides the file: change "
                        "it there", file=raw.file, key=f"--{key}")
    return [Change(raw.file, "cmdline", (key,), value, remove, key)]
