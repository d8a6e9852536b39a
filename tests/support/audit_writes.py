"""Run ``te-align train`` with an audit hook that records every file this process writes.

``python -m tests.support.audit_writes CONFIG.toml [args]`` (under ``accelerate launch``): paths
opened for writing, created folders and renames are collected and dumped as JSON to
``$TE_ALIGN_AUDIT_DIR/rank-$RANK.json`` at exit, so a test can check which process wrote what.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any

WRITTEN: set[str] = set()


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and len(args) >= 2 and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        if writing:
            WRITTEN.add(os.fsdecode(args[0]))
    elif event in ("os.mkdir", "os.rename", "os.remove", "shutil.rmtree") and args:
        if isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if event != "os.mkdir" or not os.path.exists(path):  # mkdir(exist_ok=True) of a folder that exists writes nothing
                WRITTEN.add(path)


def _dump(folder: Path, rank: str) -> None:
    (folder / f"rank-{rank}.json").write_text(json.dumps(sorted(WRITTEN)), encoding="utf-8")


def main() -> int:
    folder = Path(os.environ["TE_ALIGN_AUDIT_DIR"])
    atexit.register(_dump, folder, os.environ.get("RANK", "0"))
    sys.addaudithook(_hook)
    from te_align.cli import main as cli_main

    return cli_main(["train", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
