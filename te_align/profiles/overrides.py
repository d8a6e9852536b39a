"""User overrides of profile values: the one way in, for every entry point.

A profile is a *source* (a bundled name, a profile file, a model folder, a checkpoint, a hub id: :func:`profile
<te_align.profiles.resolve.profile>`) plus *overrides*. Overrides reach te-align from

* Python keyword arguments: ``te_align.profile("flux-schnell", t5_max_length=512)``;
* config files: ai-toolkit's YAML ``te_align: overrides:``, ``te-align train``'s ``model.profile_overrides``,
  an A/B preset's ``model.profile_overrides``;
* the command line: ``--set KEY=VALUE`` (``profile show``, ``check``; ``swap --override``) — :func:`parse_set`;
* the environment: ``TE_ALIGN_OVERRIDES`` (a JSON object) for every trainer's hooks — :func:`env_overrides`;

and every one of them goes through :func:`resolve` (source + overrides, in layers where several apply: the
environment first, explicit arguments over it) and :func:`apply_overrides`: one key resolver (shorthand
``t5_max_length``, ``t5.max_length`` or the dotted path), one typed validator (each value checked against its
field's type hint by :mod:`te_align._schema`, then ranges, then the profile's cross-field rules) and a
``dataclasses.replace`` of the field, recorded in provenance with status ``override``. A mistake is one
:class:`~te_align.errors.ProfileError` line naming where the override came from, the key and what was expected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from te_align.errors import ProfileError
from te_align.profiles.edit import MAX_TOKENS as MAX_TOKENS  # re-exported, with the three below
from te_align.profiles.edit import _apply, apply_overrides, canonical_key, check_value, typed_value
from te_align.profiles.resolve import profile as load

if TYPE_CHECKING:
    from pathlib import Path

    from te_align._types import JSONValue
    from te_align.profiles.model import AlignmentProfile

#: Profile overrides for every trainer's hooks, a JSON object (``{"t5_max_length": 512}``).
ENV_OVERRIDES = "TE_ALIGN_OVERRIDES"
#: The profile every trainer's hooks use instead of the one they choose per model.
ENV_PROFILE = "TE_ALIGN_PROFILE"


# ------------------------------------------------------------------------------ the ways in
def parse_set(items: Iterable[str], *, origin: str = "--set") -> dict[str, JSONValue]:
    """``KEY=VALUE`` pairs (``--set``): values read as TOML scalars (512, true, "text", 0.5), else as strings."""
    from te_align import _toml as tomllib

    out: dict[str, JSONValue] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ProfileError(f"expected KEY=VALUE, got {item!r}", key=origin)
        text = raw.strip()
        if text.lower() in ("true", "false"):  # Python's True / False, as printed
            out[key.strip()] = text.lower() == "true"
            continue
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        except RecursionError:
            raise ProfileError(f"the value of {key.strip()} is nested too deeply", key=origin) from None
        out[key.strip()] = value
    return out


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, JSONValue]:
    """``TE_ALIGN_OVERRIDES`` (a JSON object), or {}; anything else is one :class:`ProfileError` line."""
    raw = (os.environ if environ is None else environ).get(ENV_OVERRIDES, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{ENV_OVERRIDES} is not valid JSON ({e.msg}); expected an object such as "
                           "'{\"t5_max_length\": 512}'") from None
    except RecursionError:
        raise ProfileError(f"{ENV_OVERRIDES} is nested too deeply") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{ENV_OVERRIDES} must be a JSON object, got {type(data).__name__}")
    return data


def env_profile(environ: Mapping[str, str] | None = None) -> str | None:
    """``TE_ALIGN_PROFILE`` (a profile source), or None."""
    value = (os.environ if environ is None else environ).get(ENV_PROFILE, "").strip()
    return value or None


def merge(*layers: tuple[str, Mapping[str, object] | None]) -> tuple[dict[str, object], dict[str, str]]:
    """Layers of overrides ``(origin, mapping)``, later ones winning: (the merged overrides, the origin of each)."""
    merged: dict[str, object] = {}
    origins: dict[str, str] = {}
    for origin, mapping in layers:
        if mapping is None:
            continue
        if not isinstance(mapping, Mapping):
            raise ProfileError(f"expected a table of profile overrides (key = value), got {type(mapping).__name__}",
                               file=origin or None)
        for k, v in mapping.items():
            merged.pop(k, None)  # keep the latest layer's order
            merged[k] = v
            origins[k] = origin
    return merged, origins


def resolve(
    source: str | Path | AlignmentProfile,
    *layers: tuple[str, Mapping[str, object] | None],
    env: bool = False,
    environ: Mapping[str, str] | None = None,
) -> AlignmentProfile:
    """The profile for ``source`` with overrides: the one function every entry point calls.

    ``layers`` are ``(origin, mapping)`` pairs, later ones winning (``("--set", {...})``,
    ``("config.process[0].te_align.overrides", {...})``); ``env=True`` puts ``TE_ALIGN_OVERRIDES`` first (the
    explicit layers win over it). An error names the origin of the key it is about."""
    if env:
        layers = (("TE_ALIGN_OVERRIDES", env_overrides(environ)), *layers)
    merged, origins = merge(*layers)
    base = load(source)
    if not merged:
        return base
    try:
        return _apply(base, merged)
    except ProfileError as e:
        origin = origins.get(e.key or "") if e.key else None
        if origin and not e.file:
            raise ProfileError(e.message, file=origin, key=e.key) from None
        raise


__all__ = [
    "ENV_OVERRIDES",
    "ENV_PROFILE",
    "apply_overrides",
    "canonical_key",
    "check_value",
    "env_overrides",
    "env_profile",
    "merge",
    "parse_set",
    "resolve",
    "typed_value",
]
