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
from typing import TYPE_CHECKING, Any, NamedTuple

from te_align._lazy import lazy_module
from te_align.audit.rules import NAI_WORDS, PONY_WORDS, guess_from_name
from te_align.errors import TeAlignError

if TYPE_CHECKING:  # pragma: no cover
    from te_align import _safetensors
    from te_align.profiles.sources import checkpoint as _checkpoint_source
    from te_align.profiles.sources import folder as _folder_source
else:
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
        header = _safetensors.read_header(p)
        profile, why, _ = _checkpoint_source._detect_checkpoint(header, shown)
    except TeAlignError:
        return None
    return _community(profile, why, header.metadata)


def _community(profile: str, why: str, metadata: dict[str, str]) -> tuple[str, str]:
    """The architecture's profile the tensors say, or a community base of that architecture that the checkpoint's
    own metadata names (``modelspec.title = "Pony Diffusion V6 XL"``)."""
    for key in NAME_METADATA:
        value = metadata.get(key)
        if not isinstance(value, str):
            continue
        named = guess_from_name(value)
        if named and named != profile and named in siblings(profile) and named in community_bases():
            return named, f"{why}; its metadata {key} = {value[:80]!r}"
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
    # an architecture's own base against the community bases of its family (sd15-nai, sdxl-pony)
    "sd15": r"(sd|stable[-_ ]?diffusion)[-_ ]?v?1[._-]?[45]|v1-5",
    "sd15-nai": NAI_WORDS,
    "sdxl": r"(stable[-_ ]?diffusion|sd)[-_ ]?xl[-_ ]?(base|1[._-]?0)|sdxl[-_ ]?(base|1[._-]?0)",
    "sdxl-pony": PONY_WORDS,
}

#: The ``__metadata__`` keys of a ``.safetensors`` checkpoint that name the model or the one it was made from
#: (the SAI model spec's title, the ss_sd_model_name a trainer records): read for a community base's name.
NAME_METADATA = ("modelspec.title", "ss_sd_model_name", "ss_output_name", "name")


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
def _heads() -> dict[str, dict[str, str]]:
    """Bundled profile -> its ``family``, ``repo`` and ``display_name`` lines, read from each profile file's top-level
    keys with one pattern (no profile is built, no TOML parsed)."""
    import re
    from importlib import resources

    out: dict[str, dict[str, str]] = {}
    for f in resources.files("te_align.profiles").joinpath("data/profiles").iterdir():
        if f.name.endswith(".toml"):
            text = f.read_text(encoding="utf-8")
            head = text[: m.start()] if (m := re.search(r"^\[", text, re.M)) else text
            out[f.name[:-5]] = dict(re.findall(r'^(family|repo|display_name)\s*=\s*"((?:[^"\\]|\\.)*)"', head, re.M))
    return out


def _families() -> dict[str, str]:
    """Bundled profile -> family, read from each profile file's ``family =`` line (no profile is built)."""
    return {name: h["family"] for name, h in _heads().items() if "family" in h}


def siblings(profile: str) -> list[str]:
    """The other bundled profiles of ``profile``'s family (flux-dev -> [flux-schnell])."""
    fams = _families()
    fam = fams.get(profile)
    return sorted(p for p, f in fams.items() if f == fam and p != profile) if fam else []


def profiles_of(families: Iterable[str]) -> list[str]:
    """The bundled profiles of the given families, sorted."""
    wanted = set(families)
    return sorted(p for p, f in _families().items() if f in wanted)


@functools.lru_cache(maxsize=1)
def community_bases() -> dict[str, tuple[str, str]]:
    """Community base -> (the architecture's profile, its display name): a bundled profile whose ``repo`` is another
    bundled profile's of its family (sd15-nai loads the SD 1.5 encoder files, its recipe differs)."""
    heads = _heads()
    out: dict[str, tuple[str, str]] = {}
    for name, head in heads.items():
        arch = next((o for o, h in sorted(heads.items()) if o != name and h.get("repo") == head.get("repo")
                     and h.get("family") == head.get("family") and not _is_variant_name(o, name)), None)
        if arch is not None:
            out[name] = (arch, head.get("display_name", name).replace('\\"', '"'))
    return out


def _is_variant_name(arch: str, name: str) -> bool:
    """Whether ``arch`` is itself named as a variant of ``name`` (its name extends it): never the architecture then."""
    return arch.startswith(name + "-")


def assumption(profile: str | None, what: str = "") -> str:
    """What ``check`` says when ``profile`` was picked without a signal that decides between it and the other
    profiles of its family ("" when it has none). ``what``: the signals that were looked at."""
    others = siblings(profile) if profile else []
    if not others:
        return ""
    where = what or "the config and the model's files"
    bases = community_bases()
    community = [o for o in others if bases.get(o, ("",))[0] == profile]
    if community and len(community) == len(others):
        ifs = "; ".join(f"if your base is {bases[o][1]}, pass --profile {o}" for o in community)
        return f"assumed {profile} (the architecture's own recipe): nothing in {where} names another base; {ifs}"
    return (f"{profile} assumed: nothing in {where} tells it from {' or '.join(others)} "
            f"(pass --profile {others[0]} if the model is that)")


__all__ = ["Guess", "assumption", "community_bases", "guess_model", "profile_from_files", "profiles_of", "siblings"]
