"""``profile()``: the one dispatcher over "what is this source?".

A profile source is one of (checked in this order by :func:`classify`):

1. a bundled profile name or alias (``"sd35-large"``, ``"flux-schnell"``);
2. an existing folder: a diffusers-format model folder (or its ``model_index.json``); a folder that
   carries its own profile file (:data:`MODEL_PROFILE_FILE`, written by ``te-align swap``) is that file;
3. an existing file: a profile file (``.toml`` / ``.json``) or a single-file checkpoint
   (``.safetensors`` / ``.sft``); pickle checkpoints are refused, never opened;
4. a Hugging Face hub repo id with an optional revision: ``owner/name`` or ``owner/name@revision``.

:func:`profile` (``te_align.profile``) loads any of them; :func:`build` (``te-align profile build``)
builds from the model sources (2–4) and returns the report of what it found. Both ask
:func:`classify`, so a string one accepts the other accepts too. Nothing here imports torch; the
source modules load only when a model source is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from te_align.errors import ProfileError
from te_align.profiles.model import AlignmentProfile
from te_align.profiles.registry import bundled, bundled_name

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles.sources.common import BuildReport

# Function-local te_align imports in this module: would close an import loop at module level.

#: A hub repo id, ``owner/name``, with an optional ``@revision`` (a branch, tag or commit; branches may hold ``/``).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?")
#: File suffixes of profile files and of single-file checkpoints.
PROFILE_SUFFIXES = (".toml", ".json")
CHECKPOINT_SUFFIXES = (".safetensors", ".sft")

#: The profile file a model folder may carry (``te-align swap`` writes it): the folder's profile is that file.
MODEL_PROFILE_FILE = "te_align_profile.toml"

SourceKind = Literal["bundled", "profile-file", "folder", "single-file", "hub"]


@dataclass(frozen=True)
class Source:
    """What a profile source string names."""

    kind: SourceKind
    #: The source as given (names the source in messages and build reports).
    text: str
    #: ``bundled``: the bundled profile's name. ``hub``: the repo id (``owner/name``).
    name: str = ""
    #: ``profile-file``, ``folder``, ``single-file``: the path (a folder's, for its model_index.json too).
    path: Path | None = None
    #: ``hub``: the revision after ``@``, if any.
    revision: str | None = None


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the form of a hub repo id (``owner/name`` or ``owner/name@revision``)."""
    return HUB_ID.fullmatch(text) is not None


def classify(source: str | Path, *, bundled_names: bool = True) -> Source:
    """What ``source`` names, or a :class:`ProfileError` saying why it names nothing usable.

    A bundled name or alias wins over a folder, file or hub repo of the same name (several aliases
    are the official hub ids: ``te_align.profile("black-forest-labs/FLUX.1-dev")`` downloads
    nothing). ``bundled_names=False`` looks only for a model's own files, as ``te-align profile
    build`` does. A ``Path`` object is never a bundled name or a hub id.
    """
    text = str(source)
    is_path = isinstance(source, Path)
    if not isinstance(source, (str, Path)):
        raise ProfileError(f"a profile source is a name, a path or a hub repo id (a string), got {type(source).__name__}")
    if not text.strip():
        raise ProfileError(
            f"empty profile source {text!r}: give a bundled profile name (te-align profile list), a profile file, "
            "a diffusers model folder, a .safetensors checkpoint or a hub repo id"
        )
    if "\x00" in text:
        raise ProfileError("a profile source cannot hold a NUL character", file=repr(text))
    if bundled_names and not is_path:
        name = bundled_name(text)
        if name is not None:
            return Source("bundled", text, name=name)
    path = Path(text).expanduser()
    suffix = path.suffix.lower()
    _check_kind(path, text)
    if path.is_dir():
        if (path / MODEL_PROFILE_FILE).is_file():
            return Source("profile-file", text, path=path / MODEL_PROFILE_FILE)
        return Source("folder", text, path=path)
    if path.is_file():
        if path.name == "model_index.json":
            if (path.parent / MODEL_PROFILE_FILE).is_file():
                return Source("profile-file", text, path=path.parent / MODEL_PROFILE_FILE)
            return Source("folder", str(path.parent), path=path.parent)
        if suffix in PROFILE_SUFFIXES:
            return Source("profile-file", text, path=path)
        if suffix in CHECKPOINT_SUFFIXES:
            return Source("single-file", text, path=path)
        raise ProfileError(
            "expected a profile file (.toml / .json), a diffusers model folder, a .safetensors checkpoint or a "
            "hub repo id (pickle checkpoints such as .ckpt, .bin and .pt are never opened)",
            file=text,
        )
    if suffix in PROFILE_SUFFIXES:
        raise ProfileError("no such profile file", file=text)
    if suffix in CHECKPOINT_SUFFIXES:
        raise ProfileError("no such checkpoint file", file=text)
    match = None if is_path else HUB_ID.fullmatch(text)
    if match is not None:
        return Source("hub", text, name=match["repo"], revision=match["revision"])
    if is_path or not bundled_names or re.search(r"[/\\]", text):
        raise ProfileError(
            "no such model folder or checkpoint, and not a hub repo id (owner/name[@revision])", file=text
        )
    return Source("bundled", text, name=bundled(text).name)  # raises ProfileNotFound naming the closest


def _check_kind(path: Path, text: str) -> None:
    """Refuse a symlink loop or a path that is neither a file nor a folder (a FIFO would block a reader)."""
    import errno
    import os
    import stat

    from te_align._paths import describe

    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ProfileError("symlink loop (the link points back at itself)", file=text) from None
        return
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise ProfileError(f"is {describe(st.st_mode)}, not a profile file, model folder or checkpoint", file=text)


def _build(src: Source) -> BuildReport:
    if src.kind == "folder":
        from te_align.profiles.sources.folder import build_folder

        return build_folder(src.path or src.text, src.text)
    if src.kind == "single-file":
        from te_align.profiles.sources.checkpoint import build_checkpoint

        return build_checkpoint(src.path or src.text, src.text)
    if src.kind == "hub":
        from te_align.profiles.sources.hub import build_hub

        return build_hub(src.name, src.revision)
    if src.path is not None and src.path.name == MODEL_PROFILE_FILE:
        raise ProfileError(f"a model folder that carries its own profile ({MODEL_PROFILE_FILE}, written by te-align swap); "
                           "te-align profile show reads it", file=src.text)
    raise ProfileError(  # build classifies without bundled names: a profile file is the one other kind
        f"a {src.kind.replace('-', ' ')}, not a model: build reads a diffusers model folder, a .safetensors "
        "checkpoint or a hub repo id (te-align profile show reads this one)",
        file=src.text,
    )


def build(source: str | Path) -> BuildReport:
    """Build a profile from a diffusers folder, a ``.safetensors`` checkpoint or a hub repo id.

    Hub ids may carry a revision: ``owner/name@revision``. Returns the report of what was read and
    how it differs from the bundled profile the build started from.
    """
    return _build(classify(source, bundled_names=False))


def profile(source: str | Path | AlignmentProfile, /, **overrides: Any) -> AlignmentProfile:
    """Resolve a profile from any source, then apply validated overrides.

    ``source`` may be a bundled name or alias (``"sd35-large"``, ``"flux-schnell"``), a profile file
    (``.toml`` / ``.json``), a diffusers-format model folder, a single-file ``.safetensors``
    checkpoint, or a Hugging Face hub repo id ``owner/name[@revision]`` (config files only are
    downloaded). Values a model's own files state differently from the bundled profile are logged once.
    """
    if isinstance(source, AlignmentProfile):
        base = source
    else:
        src = classify(source)
        if src.kind == "bundled":
            base = bundled(src.name)
        elif src.kind == "profile-file":
            from te_align.profiles.serialize import load_profile_file

            base = load_profile_file(src.path or src.text)
        else:
            from te_align.profiles.sources.common import log_report

            report = _build(src)
            log_report(report)
            base = report.profile
    return base.with_overrides(overrides) if overrides else base


__all__ = [
    "CHECKPOINT_SUFFIXES",
    "HUB_ID",
    "MODEL_PROFILE_FILE",
    "PROFILE_SUFFIXES",
    "Source",
    "build",
    "classify",
    "is_hub_id",
    "profile",
]
