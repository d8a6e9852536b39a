#!/usr/bin/env python
"""Write the bundled official-config snapshots from the research JSON.

    python tools/snapshot_official.py PATH/TO/hf_configs.json

Reads the research file (``{"_meta": ..., "models": {repo: {...}}, "cross_reference": ...}``,
every value a ``{"value", "source", "status"}`` leaf) and writes one file per model repo to
``te_align/profiles/data/official/<org>--<repo>.json``. Each file keeps the model's entry exactly
(model_index, every component config value, pipeline defaults, training notes, aliases, overall
status) and adds a ``snapshot`` header naming the research file and its ``_meta``. Nothing that is
a config value is dropped; files for repos no longer in the research are removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

OUT_DIR = Path(__file__).resolve().parent.parent / "te_align" / "profiles" / "data" / "official"
LEAF_KEYS = {"value", "source", "status"}


def snapshot_filename(repo: str) -> str:
    """``org/name`` -> ``org--name.json`` (the bundled file name)."""
    org, sep, name = repo.partition("/")
    if not sep or not org or not name or "/" in name:
        raise ValueError(f"not an org/name repo id: {repo!r}")
    return f"{org}--{name}.json"


def count_leaves(node: Any) -> int:
    """Number of ``{value, source, status}`` leaves under ``node``."""
    if isinstance(node, dict):
        if LEAF_KEYS <= node.keys():
            return 1
        return sum(count_leaves(v) for v in node.values())
    return 0


def build_snapshots(research: dict[str, Any], research_name: str, digest: str) -> dict[str, dict[str, Any]]:
    """Repo id -> snapshot document."""
    models = research.get("models")
    if not isinstance(models, dict) or not models:
        raise ValueError("the research JSON has no 'models' table")
    meta = research.get("_meta", {})
    out: dict[str, dict[str, Any]] = {}
    for repo, entry in models.items():
        if not isinstance(entry, dict):
            raise ValueError(f"models[{repo!r}] is not a table")
        doc: dict[str, Any] = {
            "repo": repo,
            "snapshot": {
                "generated_by": "tools/snapshot_official.py",
                "research_file": research_name,
                "research_sha256": digest,
                "meta": meta,
            },
        }
        for key, value in entry.items():
            if key in doc:
                raise ValueError(f"models[{repo!r}] has a reserved key {key!r}")
            doc[key] = value
        if count_leaves(doc) != count_leaves(entry):
            raise AssertionError(f"{repo}: leaves were lost")  # a bug in this script
        out[repo] = doc
    return out


def write_snapshots(snapshots: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for repo, doc in sorted(snapshots.items()):
        path = out_dir / snapshot_filename(repo)
        path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    keep = {p.name for p in written}
    for stale in out_dir.glob("*--*.json"):
        if stale.name not in keep:
            stale.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("research_json", type=Path, help="path to the research hf_configs.json")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default: {OUT_DIR})")
    args = parser.parse_args(argv)
    raw = args.research_json.read_bytes()
    research = json.loads(raw.decode("utf-8"))
    snapshots = build_snapshots(research, args.research_json.name, hashlib.sha256(raw).hexdigest())
    for path in write_snapshots(snapshots, args.out):
        print(f"wrote {path} ({count_leaves(json.loads(path.read_text(encoding='utf-8')))} leaves)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
