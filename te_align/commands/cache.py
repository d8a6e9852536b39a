"""``te-align cache info | clear`` over an embedding-cache folder (headers only; no torch)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from te_align._lazy import lazy_module
from te_align.errors import CacheError, TeAlignError
from te_align.profiles import bundled, profile

if TYPE_CHECKING:
    from te_align.encoding.cache.admin import CacheInfo

# Lazy: what only one command needs, loaded when it runs (the CLI's other commands stay cold).
_cache_admin = lazy_module("te_align.encoding.cache.admin")
_paths = lazy_module("te_align._paths")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="what an embedding cache folder holds (info), or clear it (clear)")
    cs = p.add_subparsers(dest="cache_command", metavar="SUBCOMMAND", required=True)

    info = cs.add_parser("info", help="entries, size, profiles and corrupt files in a cache folder")
    info.add_argument("directory", metavar="DIR")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=cmd_info)

    clear = cs.add_parser("clear", help="delete cache entries (all, or one profile's)")
    clear.add_argument("directory", metavar="DIR")
    clear.add_argument("--profile", metavar="NAME", help="only entries of this profile (name or alias)")
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    clear.set_defaults(func=cmd_clear)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # pragma: no cover


def _open_cache(directory: str, command: str) -> CacheInfo:
    d = _paths.check_dir(Path(directory), CacheError, what="folder")
    info = _cache_admin.scan(d)
    if not info.is_cache:
        # te-align train's cache folder (data.cache_dir, OUTPUT/cache): text embeddings in text/, latents in latents/
        text = d / "text"
        if text.is_dir() and _cache_admin.scan(text).is_cache:
            raise CacheError(f"te-align train's cache folder: its text-embedding cache is {text} (te-align cache "
                             f"{command} {text}); latents/ holds image latents, which te-align cache does not read",
                             file=directory)
        if (d / "latents").is_dir():
            raise CacheError("te-align train's cache folder with image latents only (latents/): no text-embedding "
                             "cache (text/) was written there, and te-align cache reads only that", file=directory)
        raise CacheError("does not look like a te-align cache (no marker file, no te-align entries)", file=directory)
    return info


def _current_fingerprint(name: str) -> str | None:
    try:
        return bundled(name).fingerprint()
    except TeAlignError:
        return None


def cmd_info(args: argparse.Namespace) -> int:
    info = _open_cache(args.directory, args.cache_command)
    rows = []
    for g in info.profiles:
        current = _current_fingerprint(g.profile)
        rows.append(
            {"profile": g.profile, "fingerprint": g.fingerprint, "entries": g.entries, "bytes": g.bytes,
             "bundled_fingerprint": current, "current": None if current is None else current == g.fingerprint,
             "overrides": g.overrides}
        )
    if args.json:
        data = info.to_dict()
        data["profiles"] = rows
        print(json.dumps(data, indent=2))
        return 0
    print(f"te-align cache {info.directory}")
    print(f"  {info.entries} entries, {human_bytes(info.bytes)}, {info.text_encoders} text-encoder weight set(s)")
    if rows:
        w = max(len(r["profile"]) for r in rows)
        for r in rows:
            note = ""
            if r["current"] is False and r["overrides"]:
                shown = ", ".join(r["overrides"][:3]) + (" …" if len(r["overrides"]) > 3 else "")
                note = f"  (overridden profile: {shown}; bundled {r['profile']} is {r['bundled_fingerprint']})"
            elif r["current"] is False:
                note = f"  (stale: bundled {r['profile']} is now {r['bundled_fingerprint']})"
            elif r["current"] is None:
                note = "  (not a bundled profile)"
            print(f"  {r['profile']:<{w}}  {r['fingerprint']}  {r['entries']:>7} entries  {human_bytes(r['bytes']):>9}{note}")
    print(f"  corrupt files: {len(info.corrupt)}")
    for path in info.corrupt[:20]:
        print(f"    {path}")
    if len(info.corrupt) > 20:
        print(f"    … and {len(info.corrupt) - 20} more")
    if info.temp_files:
        print(f"  unfinished temp files: {info.temp_files}")
    return 0


def _confirm(question: str) -> bool:
    if sys.stdin is None or not sys.stdin.isatty():
        raise CacheError(f"{question} — not confirmed; pass --yes")
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_clear(args: argparse.Namespace) -> int:
    info = _open_cache(args.directory, args.cache_command)
    names: list[str] = []
    fps: list[str] = []
    if args.profile:
        recorded = {g.profile for g in info.profiles}
        try:
            p = profile(args.profile)
            names, fps = [p.name], [p.fingerprint()]
        except TeAlignError:
            if args.profile not in recorded:
                raise
            names = [args.profile]
        selected = [g for g in info.profiles if g.profile in names or g.fingerprint in fps]
        what = f"profile {names[0]}" + (f" (fingerprint {fps[0]})" if fps else "")
    else:
        selected = list(info.profiles)
        what = "all profiles"
    count = sum(g.entries for g in selected)
    size = sum(g.bytes for g in selected)
    extra = 0 if args.profile else len(info.corrupt)
    if count == 0 and extra == 0:
        print(f"no entries to delete for {what} in {info.directory} ({info.entries} entries kept)")
        return 0
    if not args.yes:
        question = f"delete {count} entries ({human_bytes(size)}) of {what} from {info.directory}"
        if extra:
            question += f" and {extra} corrupt file(s)"
        if not _confirm(question + "?"):
            print("nothing deleted")
            return 1
    res = _cache_admin.clear(args.directory, profile_names=names, fingerprints=fps)
    line = f"deleted {res.removed} entries ({human_bytes(res.bytes)}) of {what} from {info.directory}"
    if res.corrupt_removed:
        line += f", and {res.corrupt_removed} corrupt file(s)"
    if res.temp_removed:
        line += f", and {res.temp_removed} stale temp file(s)"
    if res.kept:
        line += f"; {res.kept} other entries kept"
    print(line)
    return 0
