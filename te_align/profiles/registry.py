"""The bundled profiles and their aliases (``profile()`` over every source is :mod:`te_align.profiles.resolve`)."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

from te_align.errors import ProfileNotFound, closest
from te_align.profiles.model import AlignmentProfile

# Function-local te_align imports in this module: would close an import loop at module level.

_PROFILE_DIR = "data/profiles"


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@functools.cache
def _bundled_files() -> dict[str, Any]:
    root = resources.files("te_align.profiles").joinpath(_PROFILE_DIR)
    return {p.name[: -len(".toml")]: p for p in root.iterdir() if p.name.endswith(".toml")}


@functools.cache
def _load_bundled(name: str) -> AlignmentProfile:
    from te_align import _toml as tomllib
    from te_align.profiles.serialize import profile_from_dict

    res = _bundled_files()[name]
    data = tomllib.loads(res.read_text(encoding="utf-8"))
    return profile_from_dict(data, file=f"te_align/profiles/{_PROFILE_DIR}/{name}.toml")


#: The first table header of a profile file: the top-level keys (name, aliases, ...) all come before it.
_FIRST_TABLE = re.compile(r"^\[", re.M)


def _header(name: str) -> dict[str, Any]:
    """The top-level keys of a bundled profile file, read without parsing its tables (the slots and the long
    provenance): what the alias table needs, at a fraction of a full load (``check`` resolves one profile)."""
    from te_align import _toml as tomllib

    text = _bundled_files()[name].read_text(encoding="utf-8")
    m = _FIRST_TABLE.search(text)
    return tomllib.loads(text[: m.start()] if m else text)


@functools.cache
def _alias_table() -> dict[str, str]:
    """Normalised name or alias -> bundled profile name."""
    table: dict[str, str] = {}
    for name in sorted(_bundled_files()):
        head = _header(name)
        for a in (head.get("name", name), *head.get("aliases", ())):
            table.setdefault(_norm(str(a)), name)
    return table


def bundled_names() -> list[str]:
    """Names of the bundled profiles, sorted."""
    return sorted(_bundled_files())


def bundled_name(name: str) -> str | None:
    """The bundled profile a name or alias stands for, or None."""
    return _alias_table().get(_norm(name))


def bundled(name: str) -> AlignmentProfile:
    """A bundled profile by name or alias (no overrides)."""
    key = _norm(name)
    table = _alias_table()
    if key not in table:
        raise ProfileNotFound(
            f"unknown profile '{name}'{closest(key, table)}; bundled profiles: {', '.join(bundled_names())}"
        )
    return _load_bundled(table[key])


def profiles() -> list[AlignmentProfile]:
    """Every bundled profile."""
    return [_load_bundled(n) for n in bundled_names()]
