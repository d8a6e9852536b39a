"""The trainers te-align knows: one folder per trainer, one registry.

Each third-party trainer is a package ``te_align/trainers/<package>/`` whose ``__init__.py`` holds its
:class:`TrainerSpec` (``SPEC``), plain data and standard library only. The spec names the trainer's parts,
each a module of the same package:

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
detection, ``patch`` dispatch, ``probe``, ``matrix``, the docs) is derived from it here; the shared machinery
(:mod:`te_align.audit`, :mod:`te_align.hooks.base`, :mod:`te_align.patching`, :mod:`te_align.probe`) names no
trainer. A new trainer is one folder and one line in :data:`PACKAGES`.

Importing this module imports no trainer package; :func:`specs` imports each package's ``__init__`` (a spec,
nothing else), never a part.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from types import ModuleType

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

#: The parts a trainer package may have (each a module of the package, named in its spec).
PARTS = ("names", "hooks", "patch", "probe")


@dataclass(frozen=True)
class Dialect:
    """One config language ``te-align check`` reads for a trainer (``--trainer NAME``)."""

    #: The ``--trainer`` value (``kohya-gui``).
    name: str
    #: The module of the trainer package that reads it (``audit_gui``).
    module: str
    #: What it reads, for ``--help`` (``kohya_ss GUI JSON``).
    reads: str
    #: A regular expression over a script's file name: the training command lines this dialect reads
    #: (``accelerate launch SCRIPT ARGS`` in a .sh/.txt/.bat file or after ``te-align check --``).
    scripts: str = ""
    #: Reads command lines (else a command line that names one of ``scripts`` is refused with a pointer to the
    #: config file it should be given instead).
    command_line: bool = False


@dataclass(frozen=True)
class TrainerSpec:
    """What te-align has for one trainer: its names and which of the parts exist."""

    #: The trainer's name in te-align (``te-align patch --trainer``, ``probe --trainer``, matrix rows).
    name: str
    #: As its users call it (``kohya sd-scripts``).
    display_name: str
    #: The upstream repository (``owner/name``).
    repo: str
    #: Other names users type for it (``sd-scripts``, ``kohya_ss``).
    aliases: tuple[str, ...] = ()
    #: Words by which a profile's provenance names this trainer as a source (an alternative value a trainer
    #: uses is not a model or pipeline source).
    source_words: tuple[str, ...] = ()
    #: ``te-align check`` config languages.
    check: tuple[Dialect, ...] = ()
    #: Module names of the parts (None: the trainer has no such part).
    names: str | None = None
    hooks: str | None = None
    patch: str | None = None
    probe: str | None = None
    #: What ``te-align patch`` takes, for ``--help`` (``sd-scripts checkout or kohya_ss GUI folder``).
    patch_path: str = ""
    #: What ``te-align probe`` runs, for ``--help`` (``an sd-scripts checkout at --path or $TE_ALIGN_KOHYA_DIR``).
    probe_path: str = ""
    #: The environment variable naming a checkout of the trainer (probe, matrix, integration tests).
    env_dir: str | None = None
    #: The package (filled in from the folder by :func:`specs`).
    package: str = field(default="", compare=False)

    def part(self, part: str) -> ModuleType:
        """Import one of the trainer's parts (``hooks``, ``patch``, ``probe``, ``names``)."""
        name = getattr(self, part, None) if part in PARTS else None
        if not name:
            raise LookupError(f"{self.display_name} has no {part} in te-align")
        return importlib.import_module(f"{__name__}.{self.package}.{name}")

    def reader(self, dialect: str) -> ModuleType:
        """The module that reads one of the trainer's config languages."""
        for d in self.check:
            if d.name == dialect:
                return importlib.import_module(f"{__name__}.{self.package}.{d.module}")
        raise LookupError(f"{self.display_name} has no config language {dialect!r}")


@functools.cache
def specs() -> tuple[TrainerSpec, ...]:
    """Every trainer's spec, in :data:`PACKAGES` order."""
    out = []
    for package in PACKAGES:
        spec = importlib.import_module(f"{__name__}.{package}").SPEC
        out.append(spec if spec.package == package else _with_package(spec, package))
    return tuple(out)


def _with_package(spec: TrainerSpec, package: str) -> TrainerSpec:
    import dataclasses

    return dataclasses.replace(spec, package=package)


def names(part: str | None = None) -> tuple[str, ...]:
    """Trainer names, all or those that have ``part``."""
    return tuple(s.name for s in specs() if part is None or getattr(s, part, None))


def get(name: str) -> TrainerSpec:
    """The spec of a trainer by name, alias, package or ``check`` dialect name (case-insensitive)."""
    key = name.strip().lower()
    for s in specs():
        if key in (s.name, s.package, *(a.lower() for a in s.aliases), *(d.name for d in s.check)):
            return s
    raise LookupError(name)


def lookup(name: str, part: str | None = None) -> TrainerSpec | None:
    """:func:`get`, or None when no trainer (with ``part``) goes by that name."""
    try:
        s = get(name)
    except LookupError:
        return None
    return s if part is None or getattr(s, part, None) else None


def dialects() -> tuple[tuple[Dialect, TrainerSpec], ...]:
    """Every ``te-align check`` config language with its trainer, in registry order."""
    return tuple((d, s) for s in specs() for d in s.check)


def dialect(name: str) -> tuple[Dialect, TrainerSpec]:
    for d, s in dialects():
        if d.name == name:
            return d, s
    raise LookupError(name)


def source_words() -> tuple[str, ...]:
    """Every word by which provenance names a trainer (lower-case)."""
    return tuple(w.lower() for s in specs() for w in (s.name, *s.source_words))


__all__ = ["PACKAGES", "PARTS", "Dialect", "TrainerSpec", "dialect", "dialects", "get", "lookup", "names",
           "source_words", "specs"]
