"""Reading a training command line: ``accelerate launch train_*.py ARGS…`` from a shell/batch/text file or
from argv. No torch. Which scripts count as training scripts is each trainer reader's ``scripts`` pattern
(:class:`te_align.trainers.Dialect`).

What a command line gives :func:`te_align.audit.check.check_file`: a :class:`~te_align.audit.readers.RawConfig`
with ``fmt == "cmdline"`` and ``data = {"script": "train_dreambooth_lora_sd3.py", "args": [...],
"launcher": "accelerate launch"}``. The script's own arguments are the words after the script; launcher options
(``accelerate launch --mixed_precision fp16``, ``torchrun --nproc_per_node 2``) come before it and are not the
script's. Shell continuations (``\\``, ``^``, PowerShell's backtick), comments and simple variables
(``export MODEL_NAME="…"`` then ``$MODEL_NAME`` / ``${MODEL_NAME}`` / ``%MODEL_NAME%``) are resolved the way a
shell would for these plain forms; anything fancier is left as written.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from te_align.audit.raw import ConfigSyntaxError, RawConfig, UnreadableConfig, read_bounded

if TYPE_CHECKING:  # pragma: no cover
    from te_align._types import JSONObject, JSONValue

#: File suffixes read as a command line (besides a file with no suffix).
SUFFIXES = (".sh", ".bash", ".zsh", ".txt", ".cmd", ".bat", ".ps1", ".command")


@functools.cache
def script_pattern(scripts: str) -> re.Pattern[str]:
    """A training script's name in a command line: ``scripts``, the alternation of every ``check`` reader's
    script names (:attr:`te_align.trainers.api.CheckLanguages.scripts`, handed down by the caller), compiled once."""
    return re.compile(r"(?:^|[\\/\s\"'])(" + scripts + r")\b")


_ASSIGN = re.compile(r"^\s*(?:export\s+|set\s+|\$env:)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$", re.I)
#: ``set "NAME=value"`` (cmd.exe: the quotes hold the whole assignment).
_SET_QUOTED = re.compile(r'^\s*set\s+"([A-Za-z_][A-Za-z0-9_]*)=(.*)"\s*$', re.I)
#: ``python -m package.module``: a module run as a script (read as ``package/module.py``).
_MODULE = re.compile(r"(?:^|\s)-m\s+((?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*))(?=\s|$)")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)|%([A-Za-z_][A-Za-z0-9_]*)%")


def load(path: str, scripts: re.Pattern[str], at_line: int | None = None) -> RawConfig:
    """A command-line file as a :class:`RawConfig` (``fmt="cmdline"``); one clear error when it holds none."""
    p = Path(path)
    if not p.is_file():
        raise UnreadableConfig("no such file" if not p.exists() else "not a file", file=path)
    text = read_bounded(path)
    return parse_text(text, path, scripts, at_line)


def from_argv(argv: list[str], scripts: re.Pattern[str], label: str = "<command line>") -> RawConfig:
    """A command line given as words (``te-align check -- accelerate launch train_x.py --flag …``)."""
    text = shlex.join(argv)
    argv = _modules_as_scripts(list(argv), scripts)
    script_at = _script_index(argv, scripts)
    if script_at is None:
        raise UnreadableConfig("no training script (train_*.py) in the command line", file=label)
    return RawConfig(label, "cmdline", text, {**_data(argv, script_at), "from_argv": True})


def parse_text(text: str, file: str, scripts: re.Pattern[str], at_line: int | None = None) -> RawConfig:
    """Find the (last) line that runs a training script, or the one that starts at ``at_line``; split it into
    words as a shell would. ``data["commands"]`` lists the first line of every command in the file."""
    found = commands(text, file, scripts)
    if not found:
        other = _first_python_script(text)
        if other is not None:
            raise UnreadableConfig(f"{other[1]} is not a training or caching script te-align reads (e.g. "
                                   "`accelerate launch flux_train_network.py …`, `accelerate launch "
                                   "train_dreambooth_lora_sd3.py …`); nothing checked", file=f"{file}:{other[0]}")
        raise UnreadableConfig("no training command line in this file (expected a line running train_*.py or another "
                               "training script, e.g. `accelerate launch flux_train_network.py …` or "
                               "`accelerate launch train_dreambooth_lora_sd3.py --max_sequence_length 256 …`)",
                               file=file)
    chosen = found[-1] if at_line is None else next((c for c in found if c[0] == at_line), found[-1])
    first, words = chosen
    at = _script_index(words, scripts)
    if at is None:
        raise UnreadableConfig(f"line {first} names a training script only inside another word", file=file)
    return RawConfig(file, "cmdline", text, {**_data(words, at), "line": first,
                                             "commands": [c[0] for c in found]})


_PY_SCRIPT = re.compile(r"(?:^|[\s\"'])([^\s\"'=]*?([A-Za-z0-9_.-]+\.py))(?=[\s\"']|$)")


def _first_python_script(text: str) -> tuple[int, str] | None:
    """(line, script name) of the first command that runs some ``.py`` file, for the error of a file whose commands
    run no script te-align reads."""
    for first, _, line in _logical(text):
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "REM ", "rem ", "::")):
            m = _PY_SCRIPT.search(stripped)
            if m:
                return first, m.group(2)
    return None


def commands(text: str, file: str, scripts: re.Pattern[str]) -> list[tuple[int, list[str]]]:
    """Every command in the text that runs a training or caching script: (its first line, its words), with the
    variables set before it (``export X=…``, ``X=…``, ``set X=…``, ``set "X=…"``, ``$env:X = …``) expanded."""
    variables: dict[str, str] = {}
    windows = Path(file).suffix.lower() in (".bat", ".cmd", ".ps1")  # backslashes are path separators there
    found: list[tuple[int, list[str]]] = []
    for first, _, line in _logical(text):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "REM ", "rem ", "::", "@REM ", "@rem ")):
            continue
        runs = _runs_script(stripped, scripts)
        q = _SET_QUOTED.match(stripped)
        if q and not runs:
            variables[q.group(1)] = q.group(2)
            continue
        m = _ASSIGN.match(stripped)
        if m and not runs:
            variables[m.group(1)] = _unquote(_expand(m.group(2), variables))
            continue
        if not runs:
            continue
        try:
            words = _split(_expand(stripped, variables), windows)
        except ValueError as e:
            raise ConfigSyntaxError(file, first, None, f"cannot split the command line: {e}") from None
        found.append((first, _modules_as_scripts(words, scripts)))
    return found


def assignment(line: str, scripts: re.Pattern[str]) -> tuple[str, int, int] | None:
    """A line that sets a variable (as :func:`commands` reads it): (its name, the start and end of its value as
    written in the line, quotes included), or None."""
    stripped = line.rstrip("\r\n")
    if _runs_script(stripped.strip(), scripts):
        return None
    q = _SET_QUOTED.match(stripped)
    if q:
        return q.group(1), q.start(2), q.end(2)
    m = _ASSIGN.match(stripped)
    return (m.group(1), m.start(2), m.end(2)) if m else None


def _runs_script(line: str, scripts: re.Pattern[str]) -> bool:
    if scripts.search(line):
        return True
    m = _MODULE.search(line)
    return bool(m and scripts.search(" " + m.group(2) + ".py"))


def _modules_as_scripts(words: list[str], scripts: re.Pattern[str]) -> list[str]:
    """``python -m package.script_name ARGS`` -> ``python package/script_name.py ARGS``."""
    for i, w in enumerate(words[:-1]):
        if w == "-m" and scripts.search(" " + words[i + 1].rsplit(".", 1)[-1] + ".py"):
            return [*words[:i], words[i + 1].replace(".", "/") + ".py", *words[i + 2:]]
    return words


def _logical(text: str) -> list[tuple[int, int, str]]:
    """The text's logical lines: (first physical line, last physical line, joined text), 1-based; a line
    ending in a continuation (``\\``, ``^``, a backtick) goes on with the next."""
    logical: list[tuple[int, int, str]] = []
    buf, start, n = "", 0, 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf:
            start = n
        cont = line.endswith(("\\", "^", "`")) and not line.endswith(("\\\\",))
        buf += (line[:-1] if cont else line) + (" " if cont else "")
        if not cont:
            logical.append((start, n, buf))
            buf = ""
    if buf:
        logical.append((start, n, buf))
    return logical


def command_lines(text: str, scripts: re.Pattern[str], at_line: int | None = None) -> tuple[int, int] | None:
    """The physical lines (1-based, first and last) of the training command :func:`parse_text` reads: the last
    logical line that runs a training script, or the one that starts at ``at_line`` (None: there is none)."""
    found = None
    for first, last, line in _logical(text):
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "REM ", "rem ", "::")) and _runs_script(stripped, scripts):
            found = (first, last)
            if first == at_line:
                break
    return found


def _script_index(words: list[str], scripts: re.Pattern[str]) -> int | None:
    for i, w in enumerate(words):
        name = w.replace("\\", "/").rsplit("/", 1)[-1]
        if name.endswith(".py") and scripts.search(" " + name):
            return i
    return None


def _data(words: list[str], at: int) -> JSONObject:
    args: list[JSONValue] = list(words[at + 1:])
    return {
        "script": words[at].replace("\\", "/").rsplit("/", 1)[-1],
        "script_path": words[at],
        "launcher": " ".join(w for w in words[:at] if not w.startswith("-"))[:80],
        "args": args,
    }


def _split(line: str, windows: bool) -> list[str]:
    if not windows:
        return shlex.split(line, comments=True, posix=True)
    lex = shlex.shlex(line, posix=False, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = ""
    words = []
    for w in lex:
        if len(w) >= 2 and w[0] == w[-1] and w[0] in "\"'":
            w = w[1:-1]
        words.append(w.replace('="', "=").rstrip('"') if '="' in w else w)
    return words


def _unquote(v: str) -> str:
    try:
        parts = shlex.split(v, comments=True)
    except ValueError:
        return v
    return parts[0] if len(parts) == 1 else v


def _expand(line: str, variables: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return variables[name] if name in variables else m.group(0)

    return _VAR.sub(sub, line)


def arg_line(text: str, flag: str) -> int | None:
    """1-based line of the first ``--flag`` (``--flag=…`` / ``--flag …``) in the text."""
    m = re.search(r"(?:^|\s)--" + re.escape(flag) + r"(?=[\s=]|$)", text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else None
