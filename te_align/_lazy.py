"""Lazy package exports: names resolve to their submodule on first access (PEP 562).

Packages whose submodules import torch use this so that importing the package itself (for a CLI
command that needs no model) stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


def _import(name: str) -> ModuleType:
    """``importlib.import_module(name)``; a library of one of te-align's extras that is not installed raises
    :class:`te_align._extras.MissingExtra`, whose message names the ``pip install`` that adds it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        from te_align._extras import missing_extra

        err = missing_extra(e, name)
        if err is None:
            raise
        raise err from None


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` (a module path) on first use and
    caches the value in ``namespace`` (the package's ``globals()``)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(_import(module), name)
        namespace[name] = value
        return value

    return __getattr__


class LazyModule:
    """A module imported on first attribute access: the one module-level mark of a deferred import.

    ``_core = lazy_module("te_align.encoding.core")`` at the top of a module replaces every
    function-local ``from te_align.encoding.core import ...`` in it: the module named stays off the
    importing module's import time (so ``te-align --help``, ``profile show`` and ``check`` keep torch
    unloaded), and a reader sees at the top which modules are deferred and why.
    """

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def _load(self) -> ModuleType:
        module = self._module
        if module is None:
            module = _import(self._name)
            object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError(f"lazy module {self._name!r} is read-only")

    def __dir__(self) -> list[str]:
        return dir(self._load())

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy_module(name: str) -> Any:
    """A handle on module ``name`` that imports it on first use (see :class:`LazyModule`).

    Typed ``Any`` so attribute access reads like the module's own; declare the real type for
    readers and checkers with ``if TYPE_CHECKING: import name as handle`` beside it where it helps.
    """
    return LazyModule(name)
