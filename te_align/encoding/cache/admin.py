"""Whole-folder cache administration: :func:`scan` (``te-align cache info``) and :func:`clear`
(``te-align cache clear``). Reads entry headers only; imports no torch (the CLI stays light)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from te_align.encoding.cache.keys import ENTRY_FILE, HEX2, MARKER_NAME, TEMP_FILE, entry_meta

# Function-local te_align imports in this module: load what only one command needs when it runs.

#: Temp files older than this are removed by a full :func:`clear` (a crashed writer's leftovers).
STALE_TEMP_SECONDS = 3600.0


@dataclass
class ProfileEntries:
    profile: str
    fingerprint: str
    entries: int = 0
    bytes: int = 0
    #: Profile values overridden by the user when these entries were written (empty: none recorded).
    overrides: list[str] = field(default_factory=list)


@dataclass
class CacheInfo:
    """What :func:`scan` finds in a cache folder (headers only)."""

    directory: str
    exists: bool
    has_marker: bool
    entries: int = 0
    bytes: int = 0
    profiles: list[ProfileEntries] = field(default_factory=list)
    text_encoders: int = 0
    corrupt: list[str] = field(default_factory=list)
    temp_files: int = 0

    @property
    def is_cache(self) -> bool:
        """A te-align cache: has the marker file or at least one valid entry."""
        return self.exists and (self.has_marker or self.entries > 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["is_cache"] = self.is_cache
        return d


def _entry_files(directory: Path) -> Iterator[Path]:
    """Files laid out like entries (``ab/cd/abcd….safetensors``), nothing else."""
    for a in _scandir(directory):
        if not (a.is_dir(follow_symlinks=False) and HEX2.fullmatch(a.name)):
            continue
        for b in _scandir(Path(a.path)):
            if not (b.is_dir(follow_symlinks=False) and HEX2.fullmatch(b.name)):
                continue
            for f in _scandir(Path(b.path)):
                m = ENTRY_FILE.fullmatch(f.name)
                if m and f.is_file(follow_symlinks=False) and m.group(1).startswith(a.name + b.name):
                    yield Path(f.path)


def _temp_files(directory: Path) -> Iterator[Path]:
    for a in _scandir(directory):
        if a.is_dir(follow_symlinks=False) and HEX2.fullmatch(a.name):
            for b in _scandir(Path(a.path)):
                if b.is_dir(follow_symlinks=False) and HEX2.fullmatch(b.name):
                    for f in _scandir(Path(b.path)):
                        if TEMP_FILE.fullmatch(f.name) and f.is_file(follow_symlinks=False):
                            yield Path(f.path)


def _scandir(d: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(d) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def scan(directory: str | os.PathLike[str]) -> CacheInfo:
    """Count entries, bytes, per-profile entries and corrupt files in a cache folder (headers only)."""
    d = Path(directory)
    info = CacheInfo(str(d), d.is_dir(), (d / MARKER_NAME).is_file())
    if not info.exists:
        return info
    groups: dict[tuple[str, str], ProfileEntries] = {}
    encoders: set[str] = set()
    for path in _entry_files(d):
        meta = entry_meta(path)
        if meta is None:
            info.corrupt.append(str(path))
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        g = groups.setdefault(
            (meta["te_align.profile"], meta["te_align.fingerprint"]),
            ProfileEntries(meta["te_align.profile"], meta["te_align.fingerprint"]),
        )
        g.entries += 1
        g.bytes += size
        if "te_align.overrides" in meta and not g.overrides:
            try:
                recorded = json.loads(meta["te_align.overrides"])
            except (ValueError, RecursionError):
                recorded = None
            if isinstance(recorded, list) and all(isinstance(x, str) for x in recorded):
                g.overrides = recorded
        info.entries += 1
        info.bytes += size
        encoders.add(meta["te_align.text_encoders"])
    info.profiles = sorted(groups.values(), key=lambda g: (g.profile, g.fingerprint))
    info.text_encoders = len(encoders)
    info.temp_files = sum(1 for _ in _temp_files(d))
    return info


@dataclass
class ClearResult:
    removed: int = 0
    bytes: int = 0
    corrupt_removed: int = 0
    temp_removed: int = 0
    kept: int = 0


def clear(
    directory: str | os.PathLike[str],
    *,
    profile_names: Sequence[str] = (),
    fingerprints: Sequence[str] = (),
) -> ClearResult:
    """Delete cache entries in ``directory``; only files laid out and stamped as entries are touched.

    With no names and no fingerprints every entry goes, as do corrupt entry files and temp files a
    crashed writer left more than an hour ago. Otherwise only valid entries whose recorded profile
    name is in ``profile_names`` or whose fingerprint is in ``fingerprints`` are deleted.
    """
    d = Path(directory)
    selective = bool(profile_names or fingerprints)
    names, fps = set(profile_names), set(fingerprints)
    res = ClearResult()
    touched: set[Path] = set()
    for path in _entry_files(d):
        meta = entry_meta(path)
        if meta is None:
            if selective:
                continue
            if _unlink(path):
                res.corrupt_removed += 1
                touched.add(path.parent)
            continue
        if selective and meta["te_align.profile"] not in names and meta["te_align.fingerprint"] not in fps:
            res.kept += 1
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        if _unlink(path):
            res.removed += 1
            res.bytes += size
            touched.add(path.parent)
    if not selective:
        now = time.time()
        for tmp in _temp_files(d):
            try:
                if now - tmp.stat().st_mtime > STALE_TEMP_SECONDS and _unlink(tmp):
                    res.temp_removed += 1
                    touched.add(tmp.parent)
            except FileNotFoundError:
                continue
    for sub in sorted(touched, reverse=True):  # drop fan-out folders left empty (never anything else)
        for folder in (sub, sub.parent):
            try:
                folder.rmdir()
            except OSError:
                break
    return res


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError as e:  # a read-only or foreign folder: one line, the entries stay as they were
        from te_align.errors import CacheError

        raise CacheError(f"cannot delete: {e.strerror or e} (make the cache folder writable)", file=str(path)) from None


__all__ = ["STALE_TEMP_SECONDS", "CacheInfo", "ClearResult", "ProfileEntries", "clear", "scan"]
