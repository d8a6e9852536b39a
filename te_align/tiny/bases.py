"""Pretrained shapes-world base models shipped with te-align (float16, hash-checked).

A base is a real diffusers pipeline pretrained from scratch on :mod:`te_align.tiny.world` with exactly its
family's profile (:mod:`te_align.tiny.pretrain`). The package ships every neural component's config and
float16 weights (``te_align/tiny/data/bases/<name>/<component>/``), the scheduler config,
``model_index.json`` and ``base.json`` (what was trained how, its measured accuracy, and the SHA-256 of
every shipped file). The tokenizers are not shipped: they are the real-convention tiny tokenizers of
:func:`te_align.tiny.encoders.family_components`, rebuilt offline.

:func:`materialize` checks every hash, then writes a complete float32 diffusers folder into the user cache
(``$XDG_CACHE_HOME/te-align/world/<name>-<digest>``) that ``te-align train``, ``te-align ab run --model``
and the official pipelines load. :func:`ship` (maintainers) writes a base from a pretrained pipeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_align.errors import TeAlignError

__all__ = ["BASES", "BaseError", "BaseSpec", "base_dir", "base_info", "materialize", "ship"]

MANIFEST = "base.json"
FORMAT = 1
#: Components whose weights are shipped (every nn.Module of the pipeline); tokenizers are rebuilt.
_TOKENIZERS = ("tokenizer", "tokenizer_2", "tokenizer_3")


class BaseError(TeAlignError):
    """A shipped base that is missing, altered or cannot be built."""


@dataclass(frozen=True)
class BaseSpec:
    name: str
    family: str  # te_align.tiny.encoders.family_components family
    profile: str  # the bundled profile it was pretrained with
    pipeline: str  # the official diffusers pipeline class


#: The world bases te-align knows. A base whose files are not shipped yet is refused by :func:`materialize`.
BASES: dict[str, BaseSpec] = {
    "sd3": BaseSpec("sd3", "sd3", "sd35-large", "StableDiffusion3Pipeline"),
    "flux": BaseSpec("flux", "flux", "flux-schnell", "FluxPipeline"),
    "sdxl": BaseSpec("sdxl", "sdxl", "sdxl", "StableDiffusionXLPipeline"),
}


def base_dir(name: str) -> Path:
    """The shipped folder of base ``name`` (inside the installed package)."""
    if name not in BASES:
        raise BaseError(f"no world base {name!r}; known: {', '.join(BASES)}")
    return Path(__file__).resolve().parent / "data" / "bases" / name


def base_info(name: str, source: str | Path | None = None) -> dict[str, Any]:
    """``base.json`` of a shipped base (what was trained how, its metrics, file hashes); ``source`` reads a
    base written by :func:`ship` elsewhere."""
    path = (Path(source) if source is not None else base_dir(name)) / MANIFEST
    if not path.is_file():
        raise BaseError(f"the {name} world base is not shipped with this te-align (no {MANIFEST})", file=str(path))
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BaseError(f"unreadable ({e}); reinstall te-align", file=str(path)) from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or not isinstance(info.get("files"), dict):
        raise BaseError(f"not a format-{FORMAT} base manifest; reinstall te-align", file=str(path))
    return info


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verify(root: Path, info: dict[str, Any]) -> None:
    for rel, digest in sorted(info["files"].items()):
        path = root / rel
        if not path.is_file():
            raise BaseError("shipped file missing; reinstall te-align", file=str(path))
        got = _sha256(path)
        if got != digest:
            raise BaseError(f"SHA-256 {got[:12]}… differs from the recorded {digest[:12]}…: the file was altered; "
                            "reinstall te-align", file=str(path))  # fmt: skip


def _cache_root() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "te-align" / "world"


def materialize(name: str, cache_dir: str | Path | None = None, source: str | Path | None = None) -> Path:
    """A float32 diffusers folder of base ``name`` (hash-checked; built once per manifest into the cache).

    ``source``: a base folder written by :func:`ship` (default: the one shipped in the package)."""
    import torch

    info = base_info(name, source)
    root = Path(source) if source is not None else base_dir(name)
    spec = BASES[name]
    digest = hashlib.sha256(json.dumps(info["files"], sort_keys=True).encode()).hexdigest()[:16]
    dest = Path(cache_dir) if cache_dir is not None else _cache_root() / f"{name}-{digest}"
    marker = dest / ".te-align-base"
    if marker.is_file() and marker.read_text(encoding="utf-8").strip() == digest:
        return dest
    _verify(root, info)
    import diffusers

    from te_align.tiny.encoders import family_components

    tmp = dest.with_name(dest.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(root, tmp, ignore=shutil.ignore_patterns(MANIFEST, "__pycache__"))
        cls = getattr(diffusers, spec.pipeline)
        pipe = cls.from_pretrained(str(tmp), torch_dtype=torch.float32,
                                   **{k: v for k, v in family_components(spec.family).items() if k in _TOKENIZERS})  # fmt: skip
        shutil.rmtree(tmp)
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        (tmp / MANIFEST).write_text(json.dumps(info, indent=1, sort_keys=True), encoding="utf-8")
        (tmp / ".te-align-base").write_text(digest + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BaseError(f"cannot write the world base ({e.strerror or e}); free space or set XDG_CACHE_HOME",
                        file=str(dest)) from None  # fmt: skip
    return dest


def ship(pipe: Any, name: str, *, pretrain_config: dict[str, Any], metrics: dict[str, Any], notes: str = "",
         dest: str | Path | None = None) -> Path:  # fmt: skip
    """Write ``pipe`` as shipped base ``name`` (maintainers): float16 weights, configs, ``base.json``."""
    import copy

    import torch

    spec = BASES[name]
    out = Path(dest) if dest is not None else base_dir(name)
    if out.exists():
        shutil.rmtree(out)
    half = copy.deepcopy(pipe)
    for comp in half.components.values():
        if isinstance(comp, torch.nn.Module):
            comp.to(torch.float16)
    half.save_pretrained(str(out), safe_serialization=True)
    for tok in _TOKENIZERS:
        shutil.rmtree(out / tok, ignore_errors=True)
    files = {p.relative_to(out).as_posix(): _sha256(p) for p in sorted(out.rglob("*")) if p.is_file()}
    from te_align.tiny.fit import PROFILES, profile_overrides

    fitted = profile_overrides(next(k for k, v in PROFILES.items() if v == spec.profile))
    info = {"format": FORMAT, "name": name, "family": spec.family, "profile": spec.profile, "pipeline": spec.pipeline,
            "profile_overrides": fitted, "pretrain_config": pretrain_config, "metrics": metrics,
            "notes": notes, "files": files}  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return out
