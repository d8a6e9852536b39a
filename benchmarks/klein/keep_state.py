"""Carry issue 49's runs from one session to the next: a session's machine keeps only what is committed.

    python benchmarks/klein/keep_state.py save ../runs encoders-klein-13a encoders-klein-13b   # at a session's end
    python benchmarks/klein/keep_state.py save ../runs encoders-klein-2 --skip work            # a finished set
    python benchmarks/klein/keep_state.py restore ../runs                                       # at the next one's start

``save`` copies each named run folder of RUNS (an encoder set, or a run still going with its ``checkpoint.pt``)
into the state folder beside this script (``state/NAME``), replacing what an earlier save kept there, and lists
what it kept; the caption cache (``cond-cache``) and anything over 64 MiB are left out (they are remade: the cache
from the encoder, bit for bit). ``restore`` copies every kept folder back into RUNS where RUNS does not have it
yet, so a run resumes from its last checkpoint with its own command. The runs are seeded and checkpointed: a
restored run goes on exactly as the lost one would have (``benchmarks/klein/same_log.py`` compares the logs).

Commands name RUNS relative to the repository root (``../runs``), so the folders a checkpoint records stay the same
from one machine to the next.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "benchmarks" / "klein" / "state"
LIMIT = 64 * 2**20
SKIP = frozenset({"cond-cache", "__pycache__"})


def _files(folder: Path, skip: frozenset[str]) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not skip & set(p.relative_to(folder).parts))


def save(runs: Path, names: list[str], state: Path = STATE, skip: tuple[str, ...] = ()) -> list[str]:
    """Copy each ``runs/NAME`` into ``state/NAME`` (whole, but the caption cache and the folders or files named in
    ``skip``); returns one line per folder kept."""
    lines = []
    for name in names:
        src = runs / name
        if not src.is_dir():
            raise SystemExit(f"keep_state.py save: {src} is not a run folder (expected a folder of {runs})")
        every = _files(src, SKIP | frozenset(skip))
        files = [p for p in every if p.stat().st_size <= LIMIT]
        left = [p for p in every if p.stat().st_size > LIMIT]
        tmp = state / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for p in files:
            dest = tmp / p.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
        tmp.mkdir(parents=True, exist_ok=True)
        old = state / name
        if old.exists():
            shutil.rmtree(old)
        tmp.rename(old)
        size = sum(p.stat().st_size for p in files)
        out = ", ".join(str(p.relative_to(src)) for p in left)
        kept = f"{name}: {len(files)} files, {size / 2**20:.1f} MiB kept"
        lines.append(kept + (f"; left out (over 64 MiB): {out}" if left else ""))
    return lines


def restore(runs: Path, state: Path = STATE) -> list[str]:
    """Copy every kept folder into ``runs`` where it is absent; returns one line per folder."""
    lines = []
    folders = sorted(p for p in state.iterdir() if p.is_dir() and not p.name.startswith(".")) if state.is_dir() else []
    for kept in folders:
        dest = runs / kept.name
        if dest.exists():
            lines.append(f"{kept.name}: {dest} is there already, left as it is")
            continue
        runs.mkdir(parents=True, exist_ok=True)
        tmp = runs / f".{kept.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(kept, tmp)
        tmp.rename(dest)
        lines.append(f"{kept.name}: restored into {dest}")
    return lines or [f"nothing kept in {state}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="keep run folders in the repository")
    s.add_argument("runs", type=Path)
    s.add_argument("names", nargs="+")
    s.add_argument("--skip", action="append", default=[], metavar="PART",
                   help="leave out files or folders of this name (a finished encoder set's work/ checkpoint)")
    r = sub.add_parser("restore", help="put the kept run folders back")
    r.add_argument("runs", type=Path)
    args = ap.parse_args(argv)
    lines = save(args.runs, args.names, skip=tuple(args.skip)) if args.cmd == "save" else restore(args.runs)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
