"""Bundled profiles, aliases, and ``profile()`` dispatch over every profile source."""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path
from typing import Any

from te_align.errors import ProfileNotFound, closest
from te_align.profiles.model import AlignmentProfile

_PROFILE_DIR = "data/profiles"


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@functools.cache
def _bundled_files() -> dict[str, Any]:
    root = resources.files("te_align.profiles").joinpath(_PROFILE_DIR)
    return {p.name[: -len(".toml")]: p for p in root.iterdir() if p.name.endswith(".toml")}


@functools.cache
def _load_bundled(name: str) -> AlignmentProfile:
    import tomllib

    from te_align.profiles.serialize import profile_from_dict

    res = _bundled_files()[name]
    data = tomllib.loads(res.read_text(encoding="utf-8"))
    return profile_from_dict(data, file=f"te_align/profiles/{_PROFILE_DIR}/{name}.toml")


@functools.cache
def _alias_table() -> dict[str, str]:
    """Normalised name or alias -> bundled profile name."""
    table: dict[str, str] = {}
    for name in sorted(_bundled_files()):
        p = _load_bundled(name)
        for a in (p.name, *p.aliases):
            table.setdefault(_norm(a), name)
    return table


def bundled_names() -> list[str]:
    """Names of the bundled profiles, sorted."""
    return sorted(_bundled_files())


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


def profile(source: str | Path | AlignmentProfile, /, **overrides: Any) -> AlignmentProfile:
    """Resolve a profile from any source, then apply validated overrides.

    ``source`` may be a bundled name or alias (``"sd35-large"``, ``"flux-schnell"``), a profile file
    (``.toml`` / ``.json``), a diffusers-format model folder, a single-file ``.safetensors``
    checkpoint, or a Hugging Face hub repo id (config files only are downloaded).
    """
    if isinstance(source, AlignmentProfile):
        base = source
    else:
        base = _resolve(str(source))
    return base.with_overrides(overrides) if overrides else base


def _resolve(source: str) -> AlignmentProfile:
    key = _norm(source)
    if key in _alias_table():
        return _load_bundled(_alias_table()[key])
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if suffix in (".toml", ".json"):
        from te_align.profiles.serialize import load_profile_file

        return load_profile_file(path)
    if suffix in (".safetensors", ".sft"):
        from te_align.profiles.sources import from_single_file

        return from_single_file(path)
    if path.is_dir():
        from te_align.profiles.sources import from_folder

        return from_folder(path)
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source) and not path.exists():
        from te_align.profiles.sources import from_hub

        return from_hub(source)
    return bundled(source)  # raises ProfileNotFound with the closest names
