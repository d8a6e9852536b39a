"""The one hook lifecycle: declared targets, verify, wrap all-or-nothing, uninstall; settings from the environment.

Modelled on OpenTelemetry's instrumentors. A trainer's hook (``te_align/trainers/<trainer>/hooks``) supplies only
its targets and wrappers: every function or method it replaces is a :class:`Target` (module path, qualified
name, expected parameter names, and the wrapper factory that builds its replacement from the original), and the
trainer versions it was verified with are data (:attr:`Hook.supported`). Everything else is here, once:

* :func:`settings` reads what the user asked for: the profile (an argument, else ``TE_ALIGN_PROFILE``, else
  each model's own) and the overrides (``TE_ALIGN_OVERRIDES`` under the arguments), resolved by the one way in
  (:mod:`te_align.profiles.overrides`), so every trainer's hooks read the same variables the same way;
* :class:`Lifecycle` is a trainer's one installed hook in the process: ``install`` logs and returns False under
  ``TE_ALIGN=off`` (how A/B runs get the trainer's unmodified behaviour), validates the settings before touching
  anything, is idempotent (the same options again: the new settings, no re-wrapping), logs what is active and
  the user's overrides once; ``uninstall`` restores every original;
* :meth:`Hook.install` locates and checks *every* target first; if one is missing or its signature changed it
  refuses with one message naming each problem and the detected trainer version, and changes nothing. Only then
  are the replacements applied; a failure half-way restores what was already replaced.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, TypeVar

from te_align.errors import ProfileError, TeAlignError
from te_align.profiles import AlignmentProfile
from te_align.profiles.overrides import env_overrides as read_env
from te_align.profiles.overrides import env_profile, merge, resolve

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

logger = logging.getLogger("te_align")

#: What a user names a profile by: a bundled name, alias, path or hub id, a profile object, or None (each model's
#: own, chosen by the hook).
ProfileSource = AlignmentProfile | str | None
_F = TypeVar("_F", bound=Callable[..., object])


def log_to_console() -> None:
    """Make te-align's INFO lines visible in a trainer that sets up no logging: a stdout handler
    on the ``te_align`` logger, only when neither it nor the root logger has one (idempotent).

    When the root logger has a handler but its level drops INFO, and no level was set for ``te_align``, the
    ``te_align`` logger is set to INFO so the lines reach that handler: a library's stray ``logging.debug()`` at
    import runs an implicit ``basicConfig()`` (WARNING) before any trainer code (torchao 0.10, which one trainer
    pins, does), and te-align's lines were then dropped."""
    if logger.handlers:
        return
    if logging.getLogger().handlers:
        if logger.level == logging.NOTSET and logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        return
    import sys

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

#: Environment switch: any of :data:`OFF_WORDS` disables every hook.
ENV_SWITCH = "TE_ALIGN"
#: Profile overrides for every trainer's hooks, a JSON object (``{"t5_max_length": 512}``), and the profile
#: (te_align.profiles.overrides reads both).
ENV_OVERRIDES = "TE_ALIGN_OVERRIDES"
ENV_PROFILE = "TE_ALIGN_PROFILE"
#: The values of ``TE_ALIGN`` (case and surrounding spaces ignored) that turn te-align off: the one list,
#: also written into the drop-in scripts ``te-align patch`` installs (they must decide before importing te-align).
OFF_WORDS: tuple[str, ...] = ("off", "0", "false", "no", "disabled")


class HookError(TeAlignError):
    """A hook cannot be installed (missing or changed targets, unsupported version)."""


def env_overrides() -> dict[str, object]:
    """``TE_ALIGN_OVERRIDES`` (a JSON object), or {}; anything else is one :class:`HookError` line."""
    try:
        return read_env()
    except ProfileError as e:
        raise HookError(e.message) from None


def hooks_disabled() -> bool:
    """``TE_ALIGN`` in the environment says off (one of :data:`OFF_WORDS`)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() in OFF_WORDS


@dataclass(frozen=True)
class Target:
    """One function or method a hook replaces.

    ``module`` is imported; ``qualname`` is looked up attribute by attribute (``Class.method``).
    ``params`` are the parameter names the replacement relies on, in order (``self`` included for
    methods); extra trailing parameters with defaults are tolerated, anything else is a changed
    signature. ``wrap`` builds the replacement: it is called with the original function (for a
    ``staticmethod`` / ``classmethod``, the function inside; the descriptor kind is kept) and returns
    what is put in its place (use :func:`mark_wrapper`).
    """

    module: str
    qualname: str
    params: tuple[str, ...] | None = None
    wrap: Callable[[object], object] | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass
class LocatedTarget:
    target: Target
    owner: object
    attr: str
    original: object
    #: The attribute lives on ``owner`` itself (not inherited): uninstall puts it back, else deletes.
    own: bool = True

    def restore(self) -> None:
        if self.own:
            setattr(self.owner, self.attr, self.original)
        else:
            delattr(self.owner, self.attr)


def _unwrap_descriptor(value: object) -> object:
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def locate(target: Target) -> LocatedTarget:
    """Import and look up a target; raises HookError naming what is missing."""
    try:
        obj: object = importlib.import_module(target.module)
    except Exception as e:  # any import failure means the target is unusable
        raise HookError(f"{target.label}: cannot import {target.module} ({type(e).__name__}: {e})") from None
    parts = target.qualname.split(".")
    for part in parts[:-1]:
        if not hasattr(obj, part):
            raise HookError(f"{target.label}: {part} not found")
        obj = getattr(obj, part)
    attr = parts[-1]
    if isinstance(obj, type):
        own = attr in obj.__dict__
        try:
            raw = inspect.getattr_static(obj, attr)
        except AttributeError:
            raw = None
    else:
        own = True
        raw = getattr(obj, attr, None)
    if raw is None:
        raise HookError(f"{target.label}: not found")
    if target.params is not None:
        fn = _unwrap_descriptor(raw)
        fn = getattr(fn, "__te_align_original__", fn)
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            raise HookError(f"{target.label}: signature cannot be read") from None
        names = [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        want = list(target.params)
        extra = sig.parameters
        if names[: len(want)] != want or any(
            extra[n].default is inspect.Parameter.empty for n in names[len(want) :]
        ):
            raise HookError(f"{target.label}: signature changed: expected ({', '.join(want)}), found ({', '.join(names)})")
    return LocatedTarget(target, obj, attr, raw, own)


def mark_wrapper(wrapper: _F, original: Callable[..., object]) -> _F:
    """``functools.wraps`` plus a marker so a second install never wraps a wrapper."""
    functools.update_wrapper(wrapper, original)
    wrapper.__te_align_original__ = original  # type: ignore[attr-defined]
    return wrapper


def replacement(located: LocatedTarget) -> object:
    """What ``located``'s target puts in place of the original: ``target.wrap(original)``, descriptor kind kept."""
    wrap = located.target.wrap
    if wrap is None:
        raise HookError(f"{located.target.label}: the target names no wrapper")
    raw = located.original
    if isinstance(raw, (staticmethod, classmethod)):
        return type(raw)(wrap(raw.__func__))
    return wrap(raw)


@dataclass
class Hook:
    """Base class: subclasses set ``name`` and ``supported`` and implement ``targets``."""

    name: ClassVar[str] = "hook"
    #: The trainer versions (commit or version string) the targets were verified against -> label.
    supported: ClassVar[Mapping[str, str]] = {}

    installed: list[LocatedTarget] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    # -- to implement -------------------------------------------------------------------------
    def targets(self) -> Sequence[Target]:
        """Every function or method replaced, each with its wrapper factory."""
        raise NotImplementedError

    @classmethod
    def supported_versions(cls) -> str:
        """The verified versions, for messages."""
        return "; ".join(cls.supported.values())

    def detect_version(self) -> str:
        """The installed trainer's version (or 'unknown')."""
        return "unknown"

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def is_installed(self) -> bool:
        return bool(self.installed)

    def check(self) -> list[LocatedTarget]:
        """Resolve every target; raise one HookError listing every problem (nothing is changed)."""
        located, problems = [], []
        for t in self.targets():
            try:
                located.append(locate(t))
            except HookError as e:
                problems.append(e.message)
        if problems:
            raise HookError(
                f"{self.name} hooks not installed (trainer version {self.detect_version()}; verified with "
                f"{self.supported_versions() or 'n/a'}): " + "; ".join(problems)
            )
        return located

    def install(self) -> bool:
        """Install every replacement or none. Returns False when disabled by ``TE_ALIGN=off``."""
        with self._lock:
            if hooks_disabled():
                logger.info("te-align: %s hooks disabled by %s=%s", self.name, ENV_SWITCH, os.environ.get(ENV_SWITCH))
                return False
            if self.installed:
                return True
            located = self.check()
            done: list[LocatedTarget] = []
            try:
                for r in located:
                    if getattr(_unwrap_descriptor(r.original), "__te_align_original__", None) is not None:
                        raise HookError(f"{r.target.label} is already wrapped by another te-align hook instance")
                    setattr(r.owner, r.attr, replacement(r))
                    done.append(r)
            except BaseException:
                for r in reversed(done):
                    r.restore()
                raise
            self.installed = done
            logger.info("te-align: %s hooks installed on %d targets", self.name, len(done))
            return True

    def uninstall(self) -> None:
        with self._lock:
            for r in reversed(self.installed):
                r.restore()
            self.installed = []

    # -- settings (set by Lifecycle before install; a hook reads its profiles through them) ---------------
    def configure(self, settings: Settings) -> None:
        """Take the user's settings (called before :meth:`install`, and again when they change while installed).

        A hook that keeps per-run state (cached profiles, logged lines) resets it here."""
        self.__dict__["settings"] = settings

    @property
    def user(self) -> Settings:
        """The settings :class:`Lifecycle` gave this hook (the environment's, when used on its own)."""
        found = self.__dict__.get("settings")
        if found is None:
            found = settings()
            self.__dict__["settings"] = found
        return found


# ------------------------------------------------------------------------------------------ settings
class Settings:
    """What the user asked a trainer's hooks for: a profile source (None: each model's own, chosen by the hook)
    and profile overrides, in layers (``TE_ALIGN_OVERRIDES`` first, explicit ones over it).

    :meth:`profile` resolves a source plus the overrides through the one way in
    (:func:`te_align.profiles.overrides.resolve`), once per source."""

    def __init__(
        self, profile: ProfileSource = None, layers: Sequence[tuple[str, Mapping[str, object]]] = ()
    ) -> None:
        self.source = profile
        self.layers = tuple((o, dict(m)) for o, m in layers if m)
        self.overrides, self.origins = merge(*self.layers)
        self._cache: dict[str | int, AlignmentProfile] = {}
        self._lock = threading.Lock()

    def profile(self, default: ProfileSource = None) -> AlignmentProfile:
        """The profile: the user's source (else ``default``, the hook's choice for the model) with the overrides."""
        source = self.source if self.source is not None else default
        if source is None:
            raise HookError(f"te-align: no profile for this call; set {ENV_PROFILE} or pass profile=")
        key = source if isinstance(source, str) else id(source)
        with self._lock:
            found = self._cache.get(key)
        if found is None:
            found = resolve(source, *self.layers)
            with self._lock:
                self._cache[key] = found
        return found

    def describe(self) -> str:
        """The overrides as one log line (``{"t5_max_length": 512}``), with where each came from."""
        import json

        return json.dumps(self.overrides, sort_keys=True, default=str) + "".join(
            f" [{o}]" for o in dict.fromkeys(self.origins.values()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        same = self.source is other.source or (isinstance(self.source, str) and self.source == other.source)
        return same and self.layers == other.layers

    __hash__ = None  # type: ignore[assignment]


def settings(
    profile: ProfileSource = None,
    overrides: Mapping[str, object] | None = None,
    *,
    origin: str = "install()",
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """The one reading of the environment for every trainer's hooks: ``profile`` (else ``TE_ALIGN_PROFILE``) and
    ``overrides`` over ``TE_ALIGN_OVERRIDES``. A named profile and the overrides are validated now, so a mistake
    is one :class:`HookError` line before anything is installed."""
    try:
        env = read_env(environ)
    except ProfileError as e:
        raise HookError(e.message) from None
    source = profile if profile is not None else env_profile(environ)
    if source is not None and not isinstance(source, (str, AlignmentProfile)):
        raise HookError(f"profile must be a name or an AlignmentProfile, got {type(source).__name__}")
    made = Settings(source, ((ENV_OVERRIDES, env), (origin, dict(overrides or {}))))
    if source is not None:
        made.profile()  # fail early with the registry's or the validator's message
    return made


# ------------------------------------------------------------------------------------------ lifecycle
class Lifecycle:
    """A trainer's one installed hook in this process (module-level ``install`` / ``uninstall`` use it).

    ``build(**options)`` makes the trainer's :class:`Hook`; ``console`` (optional) makes te-align's lines
    visible in trainers that configure no logging; ``check`` (optional) refuses trainer-specific override keys."""

    def __init__(self, trainer: str, build: Callable[..., Hook], *, console: Callable[[], None] | None = None,
                 check: Callable[[Mapping[str, object]], object] | None = None, runs: str = "") -> None:
        self.trainer = trainer
        self.runs = runs or trainer
        self.build = build
        self.console = console
        self.check = check
        self.hook: Hook | None = None
        self.options: dict[str, object] = {}
        self.lock = threading.RLock()

    def install(self, profile: ProfileSource = None, overrides: Mapping[str, object] | None = None, *,
                environ: Mapping[str, str] | None = None, **options: object) -> bool:
        """Install the trainer's hook (every target or none). False under ``TE_ALIGN=off``.

        Installed already with the same ``options``: takes the new settings and returns True (nothing is wrapped
        twice); with other options: uninstalls first."""
        if self.console is not None:
            self.console()
        if hooks_disabled():
            logger.info("te-align: %s hooks disabled by %s=%s; %s runs unmodified", self.trainer, ENV_SWITCH,
                        os.environ.get(ENV_SWITCH), self.runs)
            return False
        if self.check is not None:
            self.check({**env_overrides(), **dict(overrides or {})})
        user = settings(profile, overrides, environ=environ)
        with self.lock:
            hook = self.hook
            if hook is not None and hook.is_installed and options == self.options:
                if user != hook.user:
                    hook.configure(user)
                return True
            if hook is not None:
                hook.uninstall()
                self.hook = None
            hook = self.build(**options)
            hook.configure(user)
            hook.install()
            self.hook, self.options = hook, dict(options)
        logger.info("te-align: %s hooks active (%s)", self.trainer, type(hook).supported_versions())
        if user.overrides:
            logger.info("te-align: user overrides for %s: %s", self.trainer, user.describe())
        return True

    def uninstall(self) -> None:
        """Restore every replaced function (idempotent)."""
        with self.lock:
            if self.hook is not None:
                self.hook.uninstall()
            self.hook, self.options = None, {}

    def is_installed(self) -> bool:
        return self.hook is not None and self.hook.is_installed

    def current(self) -> Hook | None:
        return self.hook


# ------------------------------------------------------------------------------------------ activation
class _AfterImport:
    """A ``sys.meta_path`` finder that runs callbacks right after a module's first import (see :func:`after_import`)."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callable[[], None]]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        import importlib.util
        import sys

        if fullname not in self.waiting:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module  # type: ignore[union-attr]
        callbacks = self.waiting.pop(fullname)

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            for callback in callbacks:
                callback()

        loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        return spec


_AFTER = _AfterImport()


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Run ``callback`` right after ``module`` is imported for the first time (now, when it already is): how a
    trainer's hooks install in its own process exactly when their target module exists, without importing it early."""
    import sys

    if module in sys.modules:
        callback()
        return
    _AFTER.waiting.setdefault(module, []).append(callback)
    if _AFTER not in sys.meta_path:
        sys.meta_path.insert(0, _AFTER)
