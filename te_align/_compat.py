"""Library pairs that do not work together, named with the two versions and the fix.

A new release of one library can demand a newer release of another than any that exists yet (transformers 5.24.0
demands peft >= 0.22.0 for adapters on its models, when the newest peft is 0.21.2). The library then fails deep
inside a call with a message that names neither the culprit nor a fix. te-align checks the pair before it uses it
and says which two versions clash and what to install, taking the range from te-align's own declared dependencies
(the ranges its test suite passed with).

The minimum peft each library demands is read from the library itself (``MIN_PEFT_VERSION``), so the check follows
new releases without a table to keep. Imports nothing heavy until a check runs.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import re

from te_align.errors import TeAlignError

#: library -> (module holding the constant, constant name): the minimum peft the library's adapter code demands.
PEFT_MINIMUM = {
    "transformers": ("transformers.integrations.peft", "MIN_PEFT_VERSION"),
    "diffusers": ("diffusers.utils.constants", "MIN_PEFT_VERSION"),
}


class IncompatibleEnvironment(TeAlignError):
    """Two installed libraries that do not work together (not a mistake in the user's config)."""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _key(v: str) -> tuple[int, ...]:
    """A release's numeric key (``5.24.0.dev0`` -> (5, 24, 0)); enough to order the minimums libraries declare."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0].split(".dev")[0].split("rc")[0])[:4])


def declared_range(dist: str, extra: str = "train") -> str:
    """te-align's own requirement on ``dist`` as installed (``transformers>=5.2,<5.24``), or ``dist``.

    The core's own requirement when it has one, else the ``extra`` one (the libraries te-align's trainer uses are
    the ``train`` extra's: the core uses them from the environment and requires none of them).
    """
    try:
        reqs = md.requires("te-align") or []
    except md.PackageNotFoundError:
        return dist
    found: dict[str, str] = {}
    for r in reqs:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*([^;]*)(?:;(.*))?", r)
        if not m or m.group(1).lower().replace("_", "-") != dist.lower():
            continue
        marker = (m.group(3) or "").replace(" ", "").replace("'", '"')
        where = "" if not marker else (extra if marker == f'extra=="{extra}"' else None)
        if where is not None:
            found.setdefault(where, f"{m.group(1)}{m.group(2).replace(' ', '')}")
    return found.get("", found.get(extra, dist))


def peft_minimum(library: str) -> str | None:
    """The minimum peft release ``library``'s adapter code demands (read from the installed library), or None."""
    if library not in PEFT_MINIMUM or _version(library) is None:
        return None
    module, name = PEFT_MINIMUM[library]
    try:
        minimum = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return minimum if isinstance(minimum, str) else None


def peft_conflict(*libraries: str) -> str | None:
    """A one-line explanation if one of ``libraries`` demands a newer peft than the installed one (the most
    demanding one is named), else None."""
    peft_version = _version("peft")
    if peft_version is None:
        return None
    short = [(lib, m) for lib in libraries if (m := peft_minimum(lib)) and _key(peft_version) < _key(m)]
    if not short:
        return None
    library, minimum = max(short, key=lambda x: _key(x[1]))
    return (f"{library} {_version(library)} needs peft >= {minimum} for LoRA adapters, but peft {peft_version} is "
            f"installed; fix: pip install \"{declared_range(library)}\" (the range te-align is tested with), or "
            f"a peft >= {minimum} once one is released")


def require_peft(*libraries: str) -> None:
    """Raise :class:`IncompatibleEnvironment` naming both versions and the fix if a library's peft pairing fails."""
    msg = peft_conflict(*libraries)
    if msg:
        raise IncompatibleEnvironment(msg)
