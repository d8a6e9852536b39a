"""The trainer contract: the parts a trainer package may have, its :class:`TrainerSpec`, and the pieces every
trainer shares.

This module is a low floor: it imports the standard library and :mod:`te_align.errors` only (the engine's
types are named for the type checker alone), so the registry (:mod:`te_align.trainers`) and every trainer's
spec can import it without pulling in the engine, and ``te-align --help`` stays light.

A trainer package ``te_align/trainers/<package>/`` holds ``SPEC`` (a :class:`TrainerSpec`) in its
``__init__.py`` and one module per part it has. Each part is typed by a Protocol here;
:meth:`TrainerSpec.part` and
:meth:`TrainerSpec.reader` import a part and check it against its Protocol, so a missing function or table is
one :class:`TrainerSpecError` naming the trainer, the part and what it lacks:

:class:`CheckDialect`
    one config language ``te-align check`` reads (``audit*.py``): ``RULES``, ``CACHES``, ``detect``,
    ``parse``;
:class:`HookPart`
    the runtime hook (``hooks``): targets and wrappers over the one lifecycle of :mod:`te_align.hooks.base`;
:class:`Patcher`
    ``te-align patch`` (``patch``): ``detect(path)`` and ``plan(detection, profile)``, templates in
    ``templates/``;
:class:`ProbePart`
    ``te-align probe`` / ``matrix`` (``probe``): ``ADAPTER`` and ``find(environ)``;
:class:`ConfigWriter`
    ``te-align check --fix`` for one config language (a dialect's ``writer``): ``place(raw, edit,
    extra_args)``, where in which file a finding's fix goes;
``names``
    the trainer's own model names -> bundled profiles (a table the other parts read; no fixed interface).

:class:`Registry` is the validated set of specs: names, aliases and dialect names are unique across trainers
and every part a spec names exists; a problem is one :class:`RegistryError` listing each.

Shared pieces: :func:`checkout` / :func:`find_checkout` (a checkout located by the trainer's one environment
variable, :attr:`TrainerSpec.env_dir`) and :func:`target_mismatch` (the message for a checkout whose hook
targets
differ from the source te-align was verified with). A hook's profiles are cached by
:meth:`te_align.hooks.base.Settings.profile`, once per source, for every trainer.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, cast, overload, runtime_checkable

from te_align._git import git_dir
from te_align.errors import TeAlignError

if TYPE_CHECKING:  # the engine's types, for annotations only (the engine never imports this package)
    from te_align.audit.findings import Edit
    from te_align.audit.parsed import Parsed
    from te_align.audit.readers import RawConfig
    from te_align.audit.rules import Rule
    from te_align.fixing.editing import Change
    from te_align.patching.trainers import Detection
    from te_align.patching.transaction import Plan
    from te_align.probe.adapter import Adapter
    from te_align.probe.matrix import Found

#: The module parts a trainer package may have (each named in its spec; ``check`` dialects are listed apart).
PARTS = ("names", "hooks", "patch", "probe")

F = TypeVar("F")


class TrainerSpecError(TeAlignError, TypeError):
    """A trainer part that does not have what its Protocol asks for."""


class RegistryError(TeAlignError, ValueError):
    """Specs that cannot be registered together (duplicate names, parts that do not exist, mistyped
    fields)."""


# ------------------------------------------------------------------------------------------------ the parts
@runtime_checkable
class CheckDialect(Protocol):
    """A ``check`` reader: its fact table, the cache files it knows, how it recognises and reads a config."""

    RULES: tuple[Rule, ...]
    CACHES: Mapping[str, object]

    def detect(self, raw: RawConfig) -> int | None:
        """How sure the reader is that ``raw`` is its config language (None or 0: not mine)."""

    def parse(self, raw: RawConfig, extra_args: list[str]) -> Parsed:
        """The config's values, profile guess and key findings."""


@runtime_checkable
class ConfigWriter(Protocol):
    """``te-align check --fix``: where a finding's fix (:class:`~te_align.audit.findings.Edit`) goes in a
    config of one dialect, in the trainer's own terms: the file (the config, or the dataset TOML it names),
    the path inside it and the value. The engine (:mod:`te_align.fixing.editing`) then edits the text, keeping
    everything else."""

    def place(self, raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
        """The changes that make ``edit`` (raise :class:`te_align.fixing.editing.CannotFix` with the reason: a
        key given on the command line, one this dialect has no place for, a value from a shell variable)."""


@runtime_checkable
class Patcher(Protocol):
    """``te-align patch``: recognise an installation, plan the drop-ins for it."""

    def detect(self, path: Path) -> Detection | None:
        """The installation at ``path`` when it is this trainer's (None: not mine)."""

    def plan(self, detection: Detection, profile: str | None) -> Plan:
        """The on-disk transaction that patches it."""


@runtime_checkable
class ProbePart(Protocol):
    """``te-align probe`` / ``matrix``: the adapter class and where installations are found."""

    ADAPTER: type[Adapter]

    def find(self, environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
        """(installations to probe, one line per installation that is not here)."""


class HookPart(Protocol):
    """The runtime hook: a module holding one :class:`te_align.hooks.base.Lifecycle`
    (``install`` / ``uninstall``)
    over :class:`te_align.hooks.base.Hook` subclasses that declare their targets."""

    __name__: str


def _has_lifecycle(module: ModuleType) -> bool:
    return any(type(v).__name__ == "Lifecycle" and type(v).__module__ == "te_align.hooks.base"
               for v in vars(module).values())


#: The Protocol each typed part is checked against when it loads (``hooks`` and ``names`` are checked apart).
_PROTOCOLS: dict[str, type] = {"check": CheckDialect, "writer": ConfigWriter, "patch": Patcher, "probe": ProbePart}
#: The run-time type of a Protocol's annotated table, by the annotation's head (``tuple[Rule, ...]`` -> tuple).
_TABLE_TYPES: dict[str, type] = {"tuple": tuple, "Mapping": Mapping, "type": type}


def _lacks(part: str, module: ModuleType) -> list[str]:
    """What ``module`` lacks of the Protocol of ``part``: each member it does not have (a method that is not
    callable, a table of another type, named "NAME as a TYPE"), in the Protocol's order."""
    if part == "hooks":
        return [] if _has_lifecycle(module) else ["a te_align.hooks.base.Lifecycle"]
    protocol = _PROTOCOLS.get(part)
    if protocol is None:  # names: a table the other parts read, no fixed interface
        return []
    out = []
    for name, annotation in vars(protocol).get("__annotations__", {}).items():
        kind = _TABLE_TYPES.get(str(annotation).split("[", 1)[0])
        if not hasattr(module, name):
            out.append(name)
        elif kind is not None and not isinstance(getattr(module, name), kind):
            out.append(f"{name} as a {'class' if kind is type else kind.__name__}")
    out += [name for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("_") and not callable(getattr(module, name, None))]
    return out


# ------------------------------------------------------------------------------------------------ the spec
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
    #: The repository whose configs it reads, when not the trainer's own (the kohya_ss GUI's JSON).
    repo: str = ""
    #: The environment variable naming a checkout of that repository, when not the trainer's own.
    env_dir: str = ""
    #: The module that writes fixes into this dialect's configs (a :class:`ConfigWriter`; "" : ``--fix``
    #: leaves its findings as they are).
    writer: str = ""


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
    #: What ``te-align probe`` runs, for ``--help`` (``an sd-scripts checkout at --path or $ENV``; ``$ENV``
    #: stands for :attr:`env_dir`, see :attr:`probe_help`).
    probe_path: str = ""
    #: The environment variable naming a checkout of the trainer (probe, matrix, integration tests): the one
    #: place it is written.
    env_dir: str | None = None
    #: The package (filled in from the folder by the registry).
    package: str = field(default="", compare=False)

    @property
    def probe_help(self) -> str:
        """:attr:`probe_path` with ``$ENV`` spelled out (``$TE_ALIGN_KOHYA_DIR``)."""
        return self.probe_path.replace("$ENV", f"${self.env_dir}")

    def module_path(self, module: str) -> str:
        return f"te_align.trainers.{self.package}.{module}"

    @overload
    def part(self, part: Literal["patch"]) -> Patcher: ...

    @overload
    def part(self, part: Literal["probe"]) -> ProbePart: ...

    @overload
    def part(self, part: Literal["hooks"]) -> HookPart: ...

    @overload
    def part(self, part: Literal["names"]) -> ModuleType: ...

    @overload
    def part(self, part: str) -> object: ...

    def part(self, part: str) -> object:
        """One of the trainer's parts (``hooks``, ``patch``, ``probe``, ``names``), typed by its Protocol: imported
        and checked against it the first time it loads."""
        name = getattr(self, part, None) if part in PARTS else None
        if not name:
            raise LookupError(f"{self.display_name} has no {part} in te-align")
        return _checked(self, part, importlib.import_module(self.module_path(name)))

    def reader(self, dialect: str) -> CheckDialect:
        """The reader of one of the trainer's config languages (a :class:`CheckDialect`)."""
        d = self._dialect(dialect)
        return cast("CheckDialect", _checked(self, "check", importlib.import_module(self.module_path(d.module))))

    def writer(self, dialect: str) -> ConfigWriter | None:
        """The :class:`ConfigWriter` of one of the trainer's config languages (None: it has none)."""
        d = self._dialect(dialect)
        if not d.writer:
            return None
        return cast("ConfigWriter", _checked(self, "writer", importlib.import_module(self.module_path(d.writer))))

    def _dialect(self, name: str) -> Dialect:
        for d in self.check:
            if d.name == name:
                return d
        raise LookupError(f"{self.display_name} has no config language {name!r}")

    def dialect_repo(self, dialect: Dialect) -> str:
        """The repository whose configs a dialect reads."""
        return dialect.repo or self.repo

    def dialect_env(self, dialect: Dialect) -> str | None:
        """The environment variable naming a checkout of the repository a dialect reads."""
        return dialect.env_dir or self.env_dir


_VERIFIED: set[str] = set()


def _checked(spec: TrainerSpec, part: str, module: ModuleType) -> ModuleType:
    """``module`` once it has what the Protocol of ``part`` asks for (checked once per module), else one
    :class:`TrainerSpecError` naming the trainer, the part and what it lacks."""
    if module.__name__ in _VERIFIED:
        return module
    lacks = _lacks(part, module)
    if lacks:
        raise TrainerSpecError(f"trainer {spec.name}: its {part} part {module.__name__} has no "
                               + ", ".join(lacks))
    _VERIFIED.add(module.__name__)
    return module


# ------------------------------------------------------------------------------------------------ the
# registry
def _exists(module: str) -> bool:
    """Whether a trainer package has the module (a file or a sub-package beside its ``__init__``), found without
    running it."""
    package, _, name = module.rpartition(".")
    try:
        folders = importlib.import_module(package).__path__
    except (ModuleNotFoundError, AttributeError):  # no such package
        return False
    return any(os.path.isfile(os.path.join(f, name + ".py"))
               or os.path.isfile(os.path.join(f, name, "__init__.py")) for f in folders)


def _spec_problems(spec: TrainerSpec) -> list[str]:
    out = []
    for attr in ("name", "display_name", "repo"):
        if not isinstance(getattr(spec, attr), str) or not getattr(spec, attr):
            out.append(f"{spec.package}: {attr} must be a non-empty string")
    for attr in ("aliases", "source_words", "check"):
        value = getattr(spec, attr)
        if not isinstance(value, tuple):
            out.append(f"{spec.package}: {attr} must be a tuple, not {type(value).__name__}")
    if isinstance(spec.check, tuple):
        out += [f"{spec.package}: check holds {d!r}, not a Dialect"
                for d in spec.check if not isinstance(d, Dialect)]
    modules = [(p, getattr(spec, p)) for p in PARTS if getattr(spec, p) is not None]
    modules += [(f"check {d.name}", d.module) for d in spec.check if isinstance(d, Dialect)]
    modules += [(f"writer {d.name}", d.writer) for d in spec.check if isinstance(d, Dialect) and d.writer]
    for what, module in modules:
        if not isinstance(module, str):
            out.append(f"{spec.package}: {what} must name a module, not {module!r}")
        elif not _exists(spec.module_path(module)):
            out.append(f"{spec.package}: {what} names {spec.module_path(module)}, which does not exist")
    if spec.hooks is not None and spec.hooks != "hooks":
        out.append(f"{spec.package}: hooks must be the module 'hooks' (te_align.hooks.{spec.package} is it), "
                   f"not {spec.hooks!r}")
    if spec.env_dir is not None and not (isinstance(spec.env_dir, str) and spec.env_dir.isupper()):
        out.append(f"{spec.package}: env_dir must be an environment variable name, not {spec.env_dir!r}")
    return out


@dataclass(frozen=True)
class CheckParts:
    """One config language's typed parts for ``te-align check`` and ``check --fix``, resolved once from the
    registry (:meth:`CheckLanguages.parts`) and handed down: the engine looks nothing up."""

    #: The ``--trainer`` value (``kohya-gui``).
    name: str
    #: Its reader.
    reader: CheckDialect
    #: Whether it reads command lines (:attr:`Dialect.command_line`).
    command_line: bool
    #: The package whose ``data/`` holds its bundled key list (``te_align.trainers.kohya``).
    package: str
    #: The config languages that read command lines (for the line that refuses one given to another).
    line_readers: tuple[str, ...]
    #: Every word by which a profile's provenance names a trainer (lower-case): such a source is a trainer's
    #: choice, not a model's.
    source_words: tuple[str, ...]
    spec: TrainerSpec = field(compare=False, repr=False)

    def writer(self) -> ConfigWriter | None:
        """Its :class:`ConfigWriter` (None: ``--fix`` leaves its findings as they are), loaded on first use."""
        return self.spec.writer(self.name)


class CheckLanguages:
    """The config languages ``te-align check`` reads, as the engine is handed them: the training scripts whose
    command lines they read, every ``--trainer`` value, and the :class:`CheckParts` of a config's language (the
    one ``--trainer`` names, or, for ``auto``, every candidate the engine scores)."""

    def __init__(self, registry: Registry, trainer: str = "auto") -> None:
        self._registry = registry
        #: ``auto`` or a ``--trainer`` value.
        self.trainer = trainer
        dialects = registry.dialects()
        #: Every ``--trainer`` value, in registry order.
        self.names: tuple[str, ...] = tuple(d.name for d, _ in dialects)
        #: A regular expression matching the name of a training script whose command line some language reads.
        self.scripts: str = "|".join(f"(?:{d.scripts})" for d, _ in dialects if d.scripts)

    def parts(self, name: str) -> CheckParts:
        """The parts of the language ``--trainer name`` reads (LookupError: no such language)."""
        dialect, spec = self._registry.dialect(name)
        return CheckParts(name=dialect.name, reader=spec.reader(dialect.name), command_line=dialect.command_line,
                          package=f"te_align.trainers.{spec.package}",
                          line_readers=tuple(d.name for d, _ in self._registry.dialects() if d.command_line),
                          source_words=self._registry.source_words(), spec=spec)

    def candidates(self) -> tuple[CheckParts, ...]:
        """Every language's parts, in registry order (``--trainer auto``: each reader scores the config)."""
        return tuple(self.parts(name) for name in self.names)


class Registry:
    """The trainers te-align knows, validated together: every list of trainers is read from here."""

    def __init__(self, specs: Iterable[TrainerSpec]) -> None:
        self._specs = tuple(specs)
        problems = [p for s in self._specs for p in _spec_problems(s)]
        owner: dict[str, str] = {}
        for s in self._specs:
            keys = {s.name.lower(), s.package, *(a.lower() for a in s.aliases)}
            keys |= {d.name.lower() for d in s.check if isinstance(d, Dialect)}
            for key in sorted(keys):
                if key in owner and owner[key] != s.package:
                    problems.append(f"{s.package}: the name {key!r} is already {owner[key]}'s")
                owner.setdefault(key, s.package)
        if problems:
            raise RegistryError("cannot register the trainers: " + "; ".join(problems))

    def specs(self) -> tuple[TrainerSpec, ...]:
        """Every trainer's spec, in registry order."""
        return self._specs

    def names(self, part: str | None = None) -> tuple[str, ...]:
        """Trainer names, all or those that have ``part``."""
        return tuple(s.name for s in self._specs if part is None or getattr(s, part, None))

    def get(self, name: str) -> TrainerSpec:
        """The spec of a trainer by name, alias, package or ``check`` dialect name (case-insensitive)."""
        key = name.strip().lower()
        for s in self._specs:
            if key in (s.name, s.package, *(a.lower() for a in s.aliases), *(d.name for d in s.check)):
                return s
        raise LookupError(name)

    def lookup(self, name: str, part: str | None = None) -> TrainerSpec | None:
        """:meth:`get`, or None when no trainer (with ``part``) goes by that name."""
        try:
            s = self.get(name)
        except LookupError:
            return None
        return s if part is None or getattr(s, part, None) else None

    def dialects(self) -> tuple[tuple[Dialect, TrainerSpec], ...]:
        """Every ``te-align check`` config language with its trainer, in registry order."""
        return tuple((d, s) for s in self._specs for d in s.check)

    def dialect(self, name: str) -> tuple[Dialect, TrainerSpec]:
        for d, s in self.dialects():
            if d.name == name:
                return d, s
        raise LookupError(name)

    def check_languages(self, trainer: str = "auto") -> CheckLanguages:
        """What ``te-align check --trainer TRAINER`` hands the engine (:class:`CheckLanguages`)."""
        return CheckLanguages(self, trainer)

    def source_words(self) -> tuple[str, ...]:
        """Every word by which provenance names a trainer (lower-case)."""
        return tuple(w.lower() for s in self._specs for w in (s.name, *s.source_words))

    def hooks_module(self, package: str) -> str | None:
        """The module path of a trainer package's hooks part (None: no such trainer or no hooks)."""
        for s in self._specs:
            if s.hooks and s.package == package:
                return s.module_path(s.hooks)
        return None


# ------------------------------------------------------------------------------------------------ shared
# pieces
def checkout(environ: Mapping[str, str], spec: TrainerSpec) -> str | None:
    """The checkout the trainer's environment variable names (None: unset or empty)."""
    return (environ.get(spec.env_dir) or None) if spec.env_dir else None


def find_checkout(environ: Mapping[str, str], spec: TrainerSpec, found: Callable[[str, str | None, str], F],
                  *, missing: str = "") -> tuple[list[F], list[str]]:
    """A probe part's ``find`` for a trainer located by its checkout alone: ``found(name, root, how)`` for the
    checkout the environment names, else one line saying which variable to set (``missing`` replaces the
    ``"<display name>: "`` lead when the trainer goes by another name there)."""
    root = checkout(environ, spec)
    if root:
        return [found(spec.name, root, f"{spec.env_dir}={root}")], []
    lead = missing or spec.display_name
    return [], [f"{lead}: {spec.env_dir} is not set (path of a {spec.repo} checkout)"]


def target_mismatch(name: str, version: str, root: Path | str, problems: Sequence[str],
                    supported: Iterable[str], how: str = "") -> str:
    """The one message for an installation whose hook targets do not match the source te-align was verified with:
    the targets that differ, the verified commit (``supported``'s first) and ``how`` to get it (by default: check
    it out, or a copy of it when ``root`` is not a git checkout)."""
    commit = next(iter(supported))[:7]
    if not how:
        how = "use " + (f"git -C {root} checkout {commit}" if git_dir(Path(root)) is not None
                        else f"a copy of {name} {commit}")
    return (f"unknown {name} version {version} at {root}: te-align's hook targets do not match "
            f"({'; '.join(problems)}). te-align was verified with {name} {commit}; {how} or upgrade te-align")


__all__ = ["PARTS", "CheckDialect", "CheckLanguages", "CheckParts", "ConfigWriter", "Dialect", "HookPart", "Patcher", "ProbePart", "Registry",
           "RegistryError",
           "TrainerSpec", "TrainerSpecError", "checkout", "find_checkout", "target_mismatch"]
