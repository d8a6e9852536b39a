"""Stand-ins for a trainer's missing third-party imports, and an import sandbox.

A trainer's text-encoding code usually needs only torch and transformers, but the modules it lives in
import the whole application at the top (torchvision, OpenCV, another trainer's library vendored inside,
quantization libraries...). To run the *real* encode functions without those packages, a finder at
the end of ``sys.meta_path`` supplies an empty stand-in module for each named top-level package that
is not installed. Every attribute of a stand-in is a placeholder class: it can be imported, called,
subclassed, subscripted and used in annotations, so module-level code runs; calling into it does
nothing useful, and the encode paths the probe exercises never do.

:func:`sandbox` imports the trainer's packages from the folders it was given even where another copy of
them (another checkout, a trainer imported by hand) is already in ``sys.modules``, and undoes everything
afterwards: modules imported inside it, copies set aside, ``sys.path`` entries and the root logger's
handlers/level (some trainers configure logging at import) are restored, so a probe leaves the
interpreter as it found it.

Shared by :mod:`te_align.probe`, the trainers' probe adapters and the tests.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["StubFinder", "register_package_without_init", "sandbox", "stub_missing"]


class _StubType(type):
    """Metaclass of placeholder classes: unknown attributes are further placeholders."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}", cls.__module__)

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __iter__(cls) -> Iterator[Any]:
        return iter(())


class _Placeholder(metaclass=_StubType):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{type(self).__qualname__}.{name}", type(self).__module__)()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self


def _placeholder(qualname: str, module: str) -> type:
    cls = _StubType(qualname.rsplit(".", 1)[-1], (_Placeholder,), {"__module__": module, "__qualname__": qualname})
    return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(name, self.__name__)
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package: submodules are stand-ins too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _importing_file() -> str:
    """File of the code that started the current import (the first frame outside importlib)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen importlib") and "importlib" not in Path(name).parts[-2:-1] and name != __file__:
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class StubFinder(importlib.abc.MetaPathFinder):
    """Supplies stand-ins for ``names`` (top-level packages) and their submodules; put it last.

    Only imports made by code under one of ``roots`` get a stand-in: transformers and diffusers probe
    for optional packages (``find_spec("torchvision")``) and must keep seeing them as absent.
    """

    def __init__(self, names: Iterable[str], roots: Iterable[str | Path]) -> None:
        self.names = frozenset(names)
        self.roots = tuple(str(Path(r).resolve()) for r in roots)
        self.used: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        top = fullname.split(".", 1)[0]
        if top not in self.names:
            return None
        if "." not in fullname:  # a submodule of a stand-in is always a stand-in
            origin = _importing_file()
            if not any(origin.startswith(r) for r in self.roots):
                return None
        self.used.add(top)
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def _installed(name: str) -> bool:
    """``name`` imports as a real module. A module put into ``sys.modules`` by hand, whose spec has no loader and
    no package path (another tool's stand-in), is not one."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and (spec.loader is not None or spec.submodule_search_locations is not None)


@contextlib.contextmanager
def stub_missing(names: Iterable[str], roots: Iterable[str | Path]) -> Iterator[StubFinder]:
    """Within the block, each of ``names`` that is not installed imports as a stand-in for code under ``roots``.

    Where ``sys.modules`` already holds a stand-in for such a name (another tool's, put there by hand:
    :func:`te_align.integrations.comfyui.tiny.import_comfyui` leaves torchvision's, whose attributes fail on use),
    it is set aside for the block, so the trainer's code gets this block's stand-ins and not that one;
    it is put back afterwards.
    """
    missing = frozenset(n for n in names if not _installed(n))
    aside = {n: m for n, m in sys.modules.items() if n.split(".", 1)[0] in missing}
    for name in aside:
        del sys.modules[name]
    finder = StubFinder(missing, roots)
    sys.meta_path.append(finder)
    try:
        yield finder
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
        if aside:
            for name in [n for n in sys.modules if n.split(".", 1)[0] in missing]:
                del sys.modules[name]
            sys.modules.update(aside)


def register_package_without_init(name: str) -> types.ModuleType:
    """Put package ``name`` into ``sys.modules`` without running its ``__init__``.

    For packages whose ``__init__`` imports the whole application (its jobs, UI and vendored libraries);
    their submodules then import normally and are the real code.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    return module


def _under(where: str | Path, roots: tuple[str, ...]) -> bool:
    """``where`` is one of the (resolved) ``roots`` or inside one (``/a/trainer-old`` is not in ``/a/trainer``)."""
    resolved = os.path.realpath(where)
    return any(resolved == r or resolved.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _belongs(module: Any, roots: tuple[str, ...]) -> bool:
    if isinstance(module, _StubModule):
        return True
    where = getattr(module, "__file__", None)
    if where is None:
        where = next(iter(getattr(module, "__path__", None) or ()), None)
    return where is not None and _under(where, roots)


def _shadowed(root_dirs: tuple[str, ...], path: list[str]) -> list[str]:
    """Top-level names in ``sys.modules`` that ``path`` provides from under ``root_dirs`` as another copy.

    With ``path`` in front of ``sys.path`` a fresh import of such a name finds the trainer's own module
    (the checkout being probed), but ``import`` would return the copy already loaded (another checkout of
    the same trainer, say) and the probe would measure that code instead. The standard library is never
    shadowed (it is found first in practice: builtins, frozen modules, modules already imported).
    A namespace-package portion in ``path`` shadows only a namespace package (a regular package wins).
    """
    if not path or not root_dirs:
        return []
    names = []
    for name, module in list(sys.modules.items()):
        if "." in name or module is None or name in sys.stdlib_module_names:
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        except (ImportError, ValueError):
            continue
        if spec is None or _belongs(module, root_dirs):
            continue
        if spec.origin is not None and spec.has_location:
            where = [spec.origin]
        elif getattr(module, "__file__", None) is None:  # both namespace packages
            where = list(spec.submodule_search_locations or ())
        else:
            continue
        if any(_under(w, root_dirs) for w in where):
            names.append(name)
    return names


@contextlib.contextmanager
def sandbox(roots: Iterable[str | Path], path: Iterable[str] = ()) -> Iterator[None]:
    """Run a trainer's imports with ``path`` in front of ``sys.path``; restore everything after.

    Modules already in ``sys.modules`` that ``path`` provides from under ``roots`` but that were loaded
    from elsewhere (:func:`_shadowed`) are set aside for the block, so the trainer's code is imported
    from ``roots``; they are put back afterwards. Modules loaded from under ``roots`` (the trainer's code)
    and stand-ins are dropped again, so the next probe (or a test) imports a fresh copy; other libraries
    imported meanwhile (lazily loaded parts of diffusers, say) stay, because dropping them would create
    second copies of their classes.
    """
    root_dirs = tuple(os.path.realpath(r) for r in roots)
    path = list(path)
    saved_modules = dict(sys.modules)
    saved_path = list(sys.path)
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    for top in _shadowed(root_dirs, path):  # set aside; put back by the restore below
        for name in [n for n in saved_modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]
    for entry in reversed(path):
        sys.path.insert(0, entry)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for name in [n for n, m in sys.modules.items() if n not in saved_modules and _belongs(m, root_dirs)]:
            del sys.modules[name]
        for name, module in saved_modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
        sys.path[:] = saved_path
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        importlib.invalidate_caches()
