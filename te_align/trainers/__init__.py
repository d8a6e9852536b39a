"""The trainers te-align knows: one folder per trainer, one registry.

Each third-party trainer is a package ``te_align/trainers/<package>/`` whose ``__init__.py`` holds its
:class:`~te_align.trainers.api.TrainerSpec` (``SPEC``), plain data and standard library only. The spec names
the trainer's parts, each a module of the same package, each typed by a Protocol of
:mod:`te_align.trainers.api`:

``names``
    the trainer's own model / architecture names -> te-align's bundled profiles (torch-free);
``check`` dialects (``audit`` modules)
    how ``te-align check`` reads one of the trainer's config languages: its fact table (``RULES``),
    ``detect(raw) -> score``, ``parse(raw, extra_args) -> Parsed``, ``CACHES`` (torch-free);
``hooks``
    the runtime hook: targets and wrappers over the one lifecycle of :mod:`te_align.hooks.base`;
``patch``
    ``detect(path) -> Detection | None`` and ``plan(detection, profile) -> Plan``, with the drop-in
    templates in the package's ``templates/`` folder (``te-align patch``);
``probe``
    ``ADAPTER`` (a :class:`te_align.probe.adapter.Adapter`) and ``find(environ)`` (``te-align probe`` and
    ``te-align matrix``).

:data:`PACKAGES` is the one list. Every other list of trainers (the CLI's choices, ``check --trainer auto``
detection, ``patch`` dispatch, ``probe``, ``matrix``, the docs, the maintainer tools) is derived from it here.

The registry is read at the top only: by ``commands/`` and the public API (:mod:`te_align.checking`,
:mod:`te_align.parts`), which resolve a trainer once into its typed parts (``registry().check_languages(name)``,
``spec.part("patch")``, ``spec.part("probe")``) and hand them down. The engine (:mod:`te_align.audit`,
:mod:`te_align.hooks`, :mod:`te_align.patching`, :mod:`te_align.probe`) never imports this package nor reads a
registry. A new trainer is one folder and one line in :data:`PACKAGES`.

Importing this module imports no trainer package; :func:`specs` imports each package's ``__init__`` (a spec,
nothing else), never a part, and validates them together (:class:`~te_align.trainers.api.Registry`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

from te_align.trainers.api import PARTS, Dialect, Registry, TrainerSpec

#: The trainer packages under ``te_align/trainers``, in the order every list shows them. One line per trainer.
PACKAGES: tuple[str, ...] = (
    "kohya",
    "ai_toolkit",
    "simpletuner",
    "onetrainer",
    "diffusers_examples",
    "musubi",
    "diffusion_pipe",
)


@functools.cache
def registry() -> Registry:
    """Every trainer's spec, read from :data:`PACKAGES` and validated together."""
    out = []
    for package in PACKAGES:
        spec = importlib.import_module(f"{__name__}.{package}").SPEC
        out.append(spec if spec.package == package else dataclasses.replace(spec, package=package))
    return Registry(out)


def specs() -> tuple[TrainerSpec, ...]:
    """Every trainer's spec, in :data:`PACKAGES` order."""
    return registry().specs()


#: ``specs.cache_clear()`` forgets the registry (tests that add a trainer folder call it).
specs.cache_clear = registry.cache_clear  # type: ignore[attr-defined]


def names(part: str | None = None) -> tuple[str, ...]:
    """Trainer names, all or those that have ``part``."""
    return registry().names(part)


def get(name: str) -> TrainerSpec:
    """The spec of a trainer by name, alias, package or ``check`` dialect name (case-insensitive)."""
    return registry().get(name)


def lookup(name: str, part: str | None = None) -> TrainerSpec | None:
    """:func:`get`, or None when no trainer (with ``part``) goes by that name."""
    return registry().lookup(name, part)


def dialects() -> tuple[tuple[Dialect, TrainerSpec], ...]:
    """Every ``te-align check`` config language with its trainer, in registry order."""
    return registry().dialects()


def dialect(name: str) -> tuple[Dialect, TrainerSpec]:
    return registry().dialect(name)


def source_words() -> tuple[str, ...]:
    """Every word by which provenance names a trainer (lower-case)."""
    return registry().source_words()


__all__ = ["PACKAGES", "PARTS", "Dialect", "Registry", "TrainerSpec", "dialect", "dialects", "get", "lookup",
           "names", "registry", "source_words", "specs"]
