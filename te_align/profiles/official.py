"""Bundled snapshots of the official configs (model_index and component configs) per model repo.

Each snapshot records one Hugging Face repo's official files, every value a
``{"value", "source", "status"}`` leaf (see ``tools/snapshot_official.py``). They back the tests
that keep bundled profiles equal to the official configs. No network, no torch.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from typing import Any

from te_align.errors import ProfileNotFound, closest

_OFFICIAL_DIR = "data/official"


def _filename(repo: str) -> str:
    org, _, name = repo.strip().partition("/")
    return f"{org}--{name}.json"


@functools.cache
def _files() -> dict[str, Any]:
    root = resources.files("te_align.profiles").joinpath(_OFFICIAL_DIR)
    if not root.is_dir():
        return {}
    return {p.name: p for p in root.iterdir() if p.name.endswith(".json")}


@functools.cache
def _load(filename: str) -> dict[str, Any]:
    data = json.loads(_files()[filename].read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        # a packaging bug, not user input
        raise ValueError(f"te_align/profiles/{_OFFICIAL_DIR}/{filename} is not a JSON object")
    return data


@functools.cache
def _index() -> dict[str, str]:
    """Lower-cased repo id or alias -> file name."""
    table: dict[str, str] = {}
    for filename in sorted(_files()):
        data = _load(filename)
        for rid in (data.get("repo", ""), *data.get("aliases", [])):
            if isinstance(rid, str) and rid:
                table.setdefault(rid.lower(), filename)
    return table


def official_repos() -> list[str]:
    """Repo ids that have a bundled official-config snapshot, sorted."""
    return sorted(_load(f)["repo"] for f in _files())


def official_snapshot(repo: str) -> dict[str, Any]:
    """The bundled official-config snapshot of a Hugging Face repo id (or a repo alias it records).

    Returns a fresh copy of the snapshot document: ``repo``, ``snapshot`` (where it was generated
    from), ``model_index``, ``components`` (``text_encoder``, ``tokenizer_2``, ...),
    ``pipeline_defaults`` and training notes, each value a ``{value, source, status}`` leaf.
    Raises :class:`~te_align.errors.ProfileNotFound` for a repo without a snapshot.
    """
    filename = _filename(repo)
    if filename not in _files():
        filename = _index().get(repo.strip().lower(), "")
    if not filename:
        known = official_repos()
        raise ProfileNotFound(
            f"no bundled official-config snapshot for '{repo}'{closest(repo, known)}; snapshots: {', '.join(known)}"
        )
    return copy.deepcopy(_load(filename))
