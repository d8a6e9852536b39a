"""A config file as ``check`` reads it: its text (bounded in size, or the text standing in for it while ``--fix``
re-checks a fix), :class:`RawConfig` and the errors of reading one. No torch.

The leaf that :mod:`te_align.audit.readers` (which tells the format and parses) and the format modules it
dispatches to (:mod:`~te_align.audit.cmdline`, :mod:`~te_align.audit.envfile`) share, so that their imports run one
way; :mod:`~te_align.audit.readers` re-exports every name here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from te_align.errors import TeAlignError

if TYPE_CHECKING:  # pragma: no cover
    from te_align._types import JSONValue


class ConfigSyntaxError(TeAlignError):
    """A config file that does not parse; carries the 1-based line and column."""

    def __init__(self, file: str, line: int | None, column: int | None, message: str) -> None:
        self.line = line
        self.column = column
        where = file if line is None else f"{file}:{line}:{column or 1}"
        super().__init__(f"{where}: syntax error: {message}")


class UnreadableConfig(TeAlignError):
    """A missing file, an unknown format or a file whose trainer cannot be told."""


#: Limit on the size of a file ``check`` reads.
MAX_BYTES = 8 * 1024 * 1024


@dataclass
class RawConfig:
    file: str
    fmt: str  # "toml" | "json" | "yaml"
    text: str
    data: JSONValue


#: Texts that stand in for files while ``check --fix`` re-checks a fix before writing it (resolved path ->
#: text); see :func:`overlaid`. Empty outside a re-check.
_OVERLAY: dict[str, str] = {}


@contextlib.contextmanager
def overlaid(texts: Mapping[str, str]) -> Iterator[None]:
    """Within the block, :func:`load` and :func:`read_text` read ``texts[path]`` instead of the file at
    ``path``: a config (and the dataset TOML it names) is checked as it would be after a fix, nothing
    written."""
    saved = dict(_OVERLAY)
    _OVERLAY.update({str(Path(p).resolve()): t for p, t in texts.items()})
    try:
        yield
    finally:
        _OVERLAY.clear()
        _OVERLAY.update(saved)


def overlay_text(path: str | Path) -> str | None:
    """The text standing in for ``path`` during a re-check (None: read the file)."""
    return _OVERLAY.get(str(Path(path).resolve())) if _OVERLAY else None


def read_text(path: str | Path) -> str:
    """A config file's text (UTF-8), or the text standing in for it during a re-check."""
    text = overlay_text(path)
    return Path(path).read_text(encoding="utf-8") if text is None else text


def read_bounded(path: str, what: str = "file") -> str:
    """:func:`read_text` of a file up to :data:`MAX_BYTES`, each failure one :class:`UnreadableConfig` line
    (``what``: the noun the size message uses, "config" or "file")."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_BYTES:
            raise UnreadableConfig(f"{what} is {size} bytes; te-align check reads {what}s up to {MAX_BYTES} bytes",
                                   file=path)
        return read_text(path)
    except UnicodeDecodeError as e:
        raise UnreadableConfig(f"not UTF-8 text ({e.reason} at byte {e.start})", file=path) from None
    except OSError as e:
        raise UnreadableConfig(f"cannot read: {e.strerror or e}", file=path) from None


__all__ = ["MAX_BYTES", "ConfigSyntaxError", "RawConfig", "UnreadableConfig", "overlaid", "overlay_text", "read_bounded",
           "read_text"]
