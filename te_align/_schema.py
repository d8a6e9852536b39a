"""Plain data (a TOML or JSON table) into typed dataclasses: the one validator.

Profiles, the training config and A/B presets are all dataclasses read from tables. :func:`build`
turns a table into one, checking every value against the field's type hint (``Literal``, unions,
``int`` / ``float`` / ``bool`` / ``str``, ``list``, ``tuple``, ``dict`` and nested dataclasses) and
filling in the defaults. A mistake raises the caller's error class (a :class:`~te_align.errors.TeAlignError`)
as one line naming the file, the dotted key and what was expected; an unknown key names the closest
valid ones::

    presets/x.toml: key 'eval.seeds': expected an integer, got '3'
    presets/x.toml: key 'eval.seed': unknown key (did you mean: seeds?)

Range checks and cross-field rules stay with each caller. This module imports no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

from te_align.errors import TeAlignError, closest

T = TypeVar("T")

#: A table key that was not given (``take`` without a default: the key is required).
MISSING = dataclasses.MISSING

_SCALARS: dict[object, tuple[str, str]] = {
    bool: ("true or false", "true/false values"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    type(None): ("nothing", "nothing"),
    Any: ("any value", "values"),
}


def join(key: str, name: str | int) -> str:
    """The dotted key of ``name`` inside ``key`` (``eval`` + ``seeds`` -> ``eval.seeds``; ``[i]`` for items)."""
    if isinstance(name, int):
        return f"{key}[{name}]"
    return f"{key}.{name}" if key else name


def type_name(tp: object) -> str:
    """What a type hint expects, in words (``an integer``, ``one of 'a' | 'b'``, ``a list of strings``)."""
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in get_args(tp))
    if origin in (list, tuple):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        if len(args) == 1 and args[0] in _SCALARS and args[0] is not Any:
            return f"a list of {_SCALARS[args[0]][1]}"
        if origin is tuple and len(args) > 1:
            return f"a list of {len(args)} values"
        return "a list"
    if origin is dict or tp is dict or dataclasses.is_dataclass(tp):
        return "a table"
    if tp in _SCALARS:
        return _SCALARS[tp][0]
    return getattr(tp, "__name__", str(tp))


@functools.cache
def hints(cls: type) -> dict[str, object]:
    """The resolved type hints of a dataclass (cached)."""
    return typing.get_type_hints(cls)


def check(
    value: object, tp: object, *, key: str, file: str | None = None, error: type[TeAlignError] = TeAlignError
) -> Any:
    """``value`` checked against the type hint ``tp`` (ints become floats where a float is expected).

    Lists become tuples where the hint is a tuple; tables become dataclasses where it is one.
    Raises ``error`` naming ``file`` and ``key`` when the value does not fit.
    """
    origin = get_origin(tp)

    def bad(hint: str = "") -> TeAlignError:
        return error(f"expected {type_name(tp)}, got {value!r}{hint}", file=file, key=key)

    if tp is Any:
        return value
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in get_args(tp)):
            return value
        hint = closest(value, [str(a) for a in get_args(tp)]) if isinstance(value, str) else ""
        raise bad(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return check(value, arg, key=key, file=file, error=error)
            except TeAlignError:
                continue
        raise bad()
    if tp is type(None):
        if value is None:
            return None
        raise bad()
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad()
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length: tuple[int, str]
            if len(value) != len(args):
                raise bad()
            items = [
                check(v, a, key=join(key, i), file=file, error=error)
                for i, (v, a) in enumerate(zip(value, args, strict=True))
            ]
        else:
            inner = args[0] if args else Any
            items = [check(v, inner, key=join(key, i), file=file, error=error) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad()
        kt, vt = get_args(tp) or (str, Any)
        out = {}
        for k, v in value.items():
            check(k, kt, key=join(key, str(k)), file=file, error=error)
            out[k] = check(v, vt, key=join(key, str(k)), file=file, error=error)
        return out
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key=key, file=file, error=error)  # type: ignore[arg-type]
    raise TypeError(f"unsupported type hint {tp!r} for {key}")  # a bug in a dataclass, not user input


def unknown_key(key: str, valid: Collection[str], *, file: str | None = None,
                error: type[TeAlignError] = TeAlignError) -> TeAlignError:
    """The error for an unknown key: the closest valid keys, else every valid key."""
    name = key.rpartition(".")[2]
    hint = closest(name, valid)
    message = f"unknown key{hint}" if hint else f"unknown key; valid keys: {', '.join(valid)}"
    return error(message, file=file, key=key)


def take(data: Mapping[str, object], name: str, tp: object, *, key: str = "", default: object = MISSING,
         file: str | None = None, error: type[TeAlignError] = TeAlignError) -> Any:
    """The checked value of one key of a table: ``default`` when it is absent, or an error when required."""
    where = join(key, name)
    if name not in data:
        if default is MISSING:
            raise error("missing (required)", file=file, key=where)
        return default
    return check(data[name], tp, key=where, file=file, error=error)


def build(cls: type[T], data: object, *, key: str = "", file: str | None = None,
          error: type[TeAlignError] = TeAlignError, exclude: Collection[str] = ()) -> T:
    """A ``cls`` instance from a table: every key checked, unknown keys refused, defaults filled in.

    ``key`` is the dotted key of the table itself (``""`` at the top of a file); ``exclude`` names
    fields a table may not set (the caller fills them in).
    """
    if not isinstance(data, dict):
        raise error(f"expected a table, got {data!r}", file=file, key=key or None)
    fields = [f for f in dataclasses.fields(cls) if f.name not in exclude]  # type: ignore[arg-type]
    names = [f.name for f in fields]
    for k in data:
        if k not in names:
            raise unknown_key(join(key, str(k)), names, file=file, error=error)
    types_ = hints(cls)
    values = {}
    for f in fields:
        required = f.default is MISSING and f.default_factory is MISSING
        if f.name in data or required:
            values[f.name] = take(data, f.name, types_[f.name], key=key, file=file, error=error)
    return cls(**values)


__all__ = ["MISSING", "build", "check", "hints", "join", "take", "type_name", "unknown_key"]
