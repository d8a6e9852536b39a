"""The shared machinery of runtime hooks: declared targets, all-or-nothing install, clean uninstall.

Modelled on OpenTelemetry's instrumentors. A hook (one per trainer) declares every function or method
it replaces as a :class:`Target` (module path, qualified name, expected parameter names, and the
wrapper factory that builds its replacement from the original), and the trainer versions it was
verified with as data (:attr:`Hook.supported`). ``install``
first resolves and checks *every* target; if one is missing or its signature changed it refuses with
one message naming each problem and the detected trainer version, and changes nothing. Only then are
the replacements applied; a failure half-way restores what was already replaced. ``uninstall``
restores the originals. Both are idempotent. ``TE_ALIGN=off`` in the environment makes ``install`` a
logged no-op, which is how A/B runs get the trainer's unmodified behaviour.
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
from typing import Any, ClassVar

from te_align.errors import TeAlignError

logger = logging.getLogger("te_align")


def log_to_console() -> None:
    """Make te-align's INFO lines visible in a trainer that sets up no logging: a stdout handler
    on the ``te_align`` logger, only when neither it nor the root logger has one (idempotent)."""
    if logger.handlers or logging.getLogger().handlers:
        return
    import sys

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

#: Environment switch: any of :data:`OFF_WORDS` disables every hook.
ENV_SWITCH = "TE_ALIGN"
#: Profile overrides for every trainer's hooks, a JSON object (``{"t5_max_length": 512}``).
ENV_OVERRIDES = "TE_ALIGN_OVERRIDES"
#: The values of ``TE_ALIGN`` (case and surrounding spaces ignored) that turn te-align off: the one list,
#: also written into the drop-in scripts ``te-align patch`` installs (they must decide before importing te-align).
OFF_WORDS: tuple[str, ...] = ("off", "0", "false", "no", "disabled")


class HookError(TeAlignError):
    """A hook cannot be installed (missing or changed targets, unsupported version)."""


def env_overrides() -> dict[str, Any]:
    """``TE_ALIGN_OVERRIDES`` (a JSON object), or {}; anything else is one :class:`HookError` line."""
    import json

    raw = os.environ.get(ENV_OVERRIDES, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise HookError(f"{ENV_OVERRIDES} is not valid JSON ({e.msg}); expected an object such as '{{\"t5_max_length\": 512}}'") from None
    if not isinstance(data, dict):
        raise HookError(f"{ENV_OVERRIDES} must be a JSON object, got {type(data).__name__}")
    return data


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
    wrap: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass
class ResolvedTarget:
    target: Target
    owner: Any
    attr: str
    original: Any
    #: The attribute lives on ``owner`` itself (not inherited): uninstall puts it back, else deletes.
    own: bool = True

    def restore(self) -> None:
        if self.own:
            setattr(self.owner, self.attr, self.original)
        else:
            delattr(self.owner, self.attr)


def _unwrap_descriptor(value: Any) -> Any:
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def resolve(target: Target) -> ResolvedTarget:
    """Import and look up a target; raises HookError naming what is missing."""
    try:
        obj: Any = importlib.import_module(target.module)
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
    return ResolvedTarget(target, obj, attr, raw, own)


def mark_wrapper(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``functools.wraps`` plus a marker so a second install never wraps a wrapper."""
    functools.update_wrapper(wrapper, original)
    wrapper.__te_align_original__ = original  # type: ignore[attr-defined]
    return wrapper


def replacement(resolved: ResolvedTarget) -> Any:
    """What ``resolved``'s target puts in place of the original: ``target.wrap(original)``, descriptor kind kept."""
    wrap = resolved.target.wrap
    if wrap is None:
        raise HookError(f"{resolved.target.label}: the target names no wrapper")
    raw = resolved.original
    if isinstance(raw, (staticmethod, classmethod)):
        return type(raw)(wrap(raw.__func__))
    return wrap(raw)


@dataclass
class Hook:
    """Base class: subclasses set ``name`` and ``supported`` and implement ``targets``."""

    name: ClassVar[str] = "hook"
    #: The trainer versions (commit or version string) the targets were verified against -> label.
    supported: ClassVar[Mapping[str, str]] = {}

    installed: list[ResolvedTarget] = field(default_factory=list)
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

    def check(self) -> list[ResolvedTarget]:
        """Resolve every target; raise one HookError listing every problem (nothing is changed)."""
        resolved, problems = [], []
        for t in self.targets():
            try:
                resolved.append(resolve(t))
            except HookError as e:
                problems.append(e.message)
        if problems:
            raise HookError(
                f"{self.name} hooks not installed (trainer version {self.detect_version()}; verified with "
                f"{self.supported_versions() or 'n/a'}): " + "; ".join(problems)
            )
        return resolved

    def install(self) -> bool:
        """Install every replacement or none. Returns False when disabled by ``TE_ALIGN=off``."""
        with self._lock:
            if hooks_disabled():
                logger.info("te-align: %s hooks disabled by %s=%s", self.name, ENV_SWITCH, os.environ.get(ENV_SWITCH))
                return False
            if self.installed:
                return True
            resolved = self.check()
            done: list[ResolvedTarget] = []
            try:
                for r in resolved:
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
