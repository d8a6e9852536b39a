"""Reading an env file (``KEY=VALUE`` lines, ``export`` and one pair of quotes dropped, ``KEY+=VALUE``
appending): a config language some trainers read. No torch. The trainer's reader maps the variables to its
options.

What it gives :func:`te_align.audit.check.check_file`: a :class:`~te_align.audit.readers.RawConfig` with
``fmt == "env"`` and ``data`` = the variables (``{"MODEL_FAMILY": "flux", …}``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from te_align.audit.raw import RawConfig, read_bounded

if TYPE_CHECKING:  # pragma: no cover
    from te_align._types import JSONObject

_LINE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(\+?=)(.*)$")


def load(path: str) -> RawConfig:
    """A ``config.env`` as a :class:`RawConfig` (``fmt="env"``)."""
    text = read_bounded(path)
    data: JSONObject = dict(variables(text)[0])
    return RawConfig(path, "env", text, data)


def variables(text: str) -> tuple[dict[str, str], dict[str, int], list[tuple[int, str]]]:
    """The variables (a value's words joined by one space), the line of each, and the lines that are not
    ``KEY=VALUE`` (shell syntax: ``if``, ``source``, ``$(…)``…) with their text."""
    lists: dict[str, list[str]] = {}
    at: dict[str, int] = {}
    skipped: list[tuple[int, str]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            skipped.append((n, line))
            continue
        key, op, value = m.group(1), m.group(2), m.group(3).strip()
        at.setdefault(key, n)
        if op == "+=":
            lists.setdefault(key, []).extend(value.strip('"').strip("'").strip().split())
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        lists[key] = value.split()
        if "$(" in value or "`" in value:
            skipped.append((n, line))
    return {k: " ".join(v) for k, v in lists.items() if v}, at, skipped
