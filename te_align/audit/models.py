"""What a model path a config names says about the model, read from its files (torch-free, headers and JSON only).

A training config often names a local folder or checkpoint whose name says nothing (``/models/my_finetune``). Its
files still do: a diffusers folder's ``model_index.json`` and component configs, a single-file checkpoint's tensor
names. :func:`profile_from_files` asks the same detectors ``te-align profile build`` uses
(:mod:`te_align.profiles.sources`), without building a profile. Readers use it as one more signal when names decide
nothing.

:func:`guess_model` is what readers call (files first, then the name); :func:`assumption` is what they say when no
signal decides between two bundled profiles of one family (FLUX.1 dev or schnell, which SD3), so that ``check`` never
reports a bare "aligned" on a guess.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from te_align._lazy import lazy_module
from te_align.audit.rules import guess_from_name
from te_align.errors import TeAlignError

# Lazy: read only when a config names a local model folder or checkpoint (``check`` stays cold otherwise).
_safetensors = lazy_module("te_align._safetensors")
_checkpoint_source = lazy_module("te_align.profiles.sources.checkpoint")
_folder_source = lazy_module("te_align.profiles.sources.folder")


@functools.lru_cache(maxsize=64)
def profile_from_files(path: object) -> tuple[str, str] | None:
    """(bundled profile, why) for a local diffusers folder or ``.safetensors`` checkpoint; None when ``path`` is not
    one, or its files name no model te-align profiles."""
    if not isinstance(path, str) or not path or len(path) > 4096:
        return None
    p = Path(path).expanduser()
    try:
        if p.is_dir() and (p / "model_index.json").is_file():
            return _folder(p, path)
        if p.is_file() and p.suffix.lower() in (".safetensors", ".sft"):
            return _checkpoint(p, path)
    except OSError:
        return None
    return None


def _folder(p: Path, shown: str) -> tuple[str, str] | None:
    tree = _folder_source.Tree.local(p, shown)
    try:
        index = tree.read("model_index.json") or {}
        name = index.get("_class_name")
        if not isinstance(name, str):
            return None
        profile, why = _folder_source._detect_folder(tree, index, name, p.name)
    except TeAlignError:
        return None
    return profile, why


def _checkpoint(p: Path, shown: str) -> tuple[str, str] | None:
    try:
        profile, why, _ = _checkpoint_source._detect_checkpoint(_safetensors.read_header(p), shown)
    except TeAlignError:
        return None
    return profile, why


class Guess(NamedTuple):
    """What model paths say: the bundled profile (None: nothing), how (" (its files: …)" when the files decided, ""
    for a name) and whether that decides between the profiles of its family (a name that says only "flux" does
    not tell FLUX.1 dev from schnell)."""

    profile: str | None
    detail: str
    decided: bool


#: Words in a model name that decide a variant among the profiles of its family (names match lower-cased).
VARIANT_WORDS: dict[str, str] = {
    "flux-schnell": r"schnell",
    "flux-dev": r"(?<![a-z])dev(?![a-z])",
    "sd35-large": r"3\.?5[-_ ]?l|large",
    "sd35-medium": r"3\.?5[-_ ]?m|medium",
    "sd3-medium": r"(?<![0-9.])3[-_ ]?m|medium",
    "flux2-klein-4b": r"(?<![0-9])4[-_ ]?b(?![a-z])",
    "flux2-klein-9b": r"(?<![0-9])9[-_ ]?b(?![a-z])",
}


def guess_model(*paths: Any) -> Guess:
    """The bundled profile model paths/ids a config names say: a local folder's or checkpoint's files first (they are
    what the trainer loads), then the names (:func:`te_align.audit.rules.guess_from_name`)."""
    import re

    for path in paths:
        found = profile_from_files(path)
        if found is not None:
            return Guess(found[0], f" (its files: {found[1]})", True)
    for path in paths:
        name = guess_from_name(path)
        if name is not None:
            word = VARIANT_WORDS.get(name)
            return Guess(name, "", not siblings(name) or (word is not None and bool(re.search(word, path.lower()))))
    return Guess(None, "", False)


@functools.lru_cache(maxsize=1)
def _families() -> dict[str, str]:
    """Bundled profile -> family, read from each profile file's ``family =`` line (no profile is built)."""
    import re
    from importlib import resources

    out: dict[str, str] = {}
    for f in resources.files("te_align.profiles").joinpath("data/profiles").iterdir():
        if f.name.endswith(".toml"):
            m = re.search(r'^family\s*=\s*"([^"]+)"', f.read_text(encoding="utf-8"), re.M)
            if m:
                out[f.name[:-5]] = m.group(1)
    return out


def siblings(profile: str) -> list[str]:
    """The other bundled profiles of ``profile``'s family (flux-dev -> [flux-schnell])."""
    fams = _families()
    fam = fams.get(profile)
    return sorted(p for p, f in fams.items() if f == fam and p != profile) if fam else []


def profiles_of(families: Iterable[str]) -> list[str]:
    """The bundled profiles of the given families, sorted."""
    wanted = set(families)
    return sorted(p for p, f in _families().items() if f in wanted)


def assumption(profile: str | None, what: str = "") -> str:
    """What ``check`` says when ``profile`` was picked without a signal that decides between it and the other
    profiles of its family ("" when it has none). ``what``: the signals that were looked at."""
    others = siblings(profile) if profile else []
    if not others:
        return ""
    where = what or "the config and the model's files"
    return (f"{profile} assumed: nothing in {where} tells it from {' or '.join(others)} "
            f"(pass --profile {others[0]} if the model is that)")


__all__ = ["Guess", "assumption", "guess_model", "profile_from_files", "profiles_of", "siblings"]
