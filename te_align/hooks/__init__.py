"""Runtime hooks into trainers: the one lifecycle is in :mod:`te_align.hooks.base`; each trainer's targets and
wrappers live in its folder (``te_align/trainers/<package>/hooks``, see :mod:`te_align.trainers`).

``te_align.hooks.<package>`` is that trainer's hooks module under a short, stable name (``import
te_align.hooks.<package>``, ``python -m te_align.hooks.<package> …``; drop-ins written by earlier te-align
versions import it): the same module object, ``te_align.trainers.<package>.hooks`` (every trainer's hooks part
is its module ``hooks``: the registry refuses a spec naming another), found by that name, not in the registry.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

from te_align.hooks.base import ENV_SWITCH, OFF_WORDS, Hook, HookError, Target, hooks_disabled

__all__ = ["ENV_SWITCH", "OFF_WORDS", "Hook", "HookError", "Target", "hooks_disabled"]


def _real_name(fullname: str) -> str | None:
    """``te_align.hooks.<package>[.sub]`` -> the trainer's hooks module (None: not a trainer's hooks name)."""
    prefix = __name__ + "."
    if not fullname.startswith(prefix):
        return None
    head, _, tail = fullname[len(prefix):].partition(".")
    if head == "base":
        return None
    real = f"te_align.trainers.{head}.hooks"  # a trainer's hooks part is its module "hooks" (the registry checks it)
    try:
        if not head.isidentifier() or importlib.util.find_spec(real) is None:
            return None
    except ModuleNotFoundError:  # no such trainer package
        return None
    return f"{real}.{tail}" if tail else real


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, real: str) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.real)  # the trainer's module itself, not a copy

    def exec_module(self, module: ModuleType) -> None:
        return None

    def get_code(self, fullname: str) -> CodeType | None:  # ``python -m te_align.hooks.<package>`` (runpy)
        spec = importlib.util.find_spec(self.real)
        if spec is None or spec.loader is None:
            raise ImportError(self.real)
        return spec.loader.get_code(self.real)  # type: ignore[attr-defined]


class _Aliases(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        real = _real_name(fullname)
        if real is None:
            return None
        found = importlib.util.find_spec(real)
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), origin=found.origin,
                                              is_package=found.submodule_search_locations is not None)


if not any(isinstance(f, _Aliases) for f in sys.meta_path):
    sys.meta_path.insert(0, _Aliases())  # first: a submodule of an alias resolves to the trainer's own module


def __getattr__(name: str) -> ModuleType:
    real = _real_name(f"{__name__}.{name}")
    if real is None:
        raise AttributeError(name)
    return importlib.import_module(real)
