"""Read and stamp the text-conditioning recipe in a ``.safetensors`` file's metadata (LoRAs, checkpoints).

Everything here works on the file's header (read and written by :mod:`te_align._safetensors`): no
tensor is ever loaded, torch is never imported, and :func:`stamp` copies the tensor bytes unchanged
behind a rewritten header.

:func:`stamp` writes ``te_align.*`` keys (profile, fingerprint, and the per-slot values that decide
what the text encoders produce). :func:`read` returns those keys, the text-encoder settings kohya
sd-scripts records (``ss_clip_skip``, ``ss_apply_t5_attn_mask``, …), and whether the stamp still
matches the bundled profile of that name.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypedDict

from te_align import _safetensors, kohya_lora
from te_align._atomic import atomic_file, link_or_copy
from te_align._paths import check_file
from te_align._safetensors import Header
from te_align._version import __version__
from te_align.errors import ProfileNotFound, TeAlignError
from te_align.profiles import bundled, profiles
from te_align.profiles import profile as resolve

if TYPE_CHECKING:  # pragma: no cover
    from te_align._types import JSONValue
    from te_align.kohya_lora import MetadataValue
    from te_align.profiles import AlignmentProfile

PREFIX = "te_align."
#: Version of the ``te_align.*`` key layout written by :func:`stamp`.
STAMP_FORMAT = 1

#: kohya sd-scripts metadata keys that describe text conditioning (the file format: :mod:`te_align.kohya_lora`).
KOHYA_KEYS = kohya_lora.METADATA_KEYS


class MetadataError(TeAlignError):
    """A file that is not a readable safetensors file, or one that cannot be stamped."""


class _ProfileCheckKeys(TypedDict):
    profile: JSONValue
    stamped_fingerprint: str
    bundled: bool
    current_fingerprint: str | None
    matches: bool | None
    same_behaviour_as: list[str]
    differences: list[dict[str, object]]


class ProfileCheck(_ProfileCheckKeys, total=False):
    """A stamp's fingerprint against the bundled profile of the stamped name (see :func:`read`). ``bundled_name``,
    ``world_base`` and ``world_base_differences`` are the optional keys (``total=False``: ``typing.NotRequired`` is
    Python 3.11+, trainers run on 3.10)."""

    bundled_name: str
    #: The te-align world base (``te_align.tiny.bases``) whose own profile has the stamped fingerprint: a LoRA
    #: ``te-align train`` / ``te-align demo`` trained on that base (its profile is the bundled one fitted to the
    #: base's tiny encoders, so it differs from the bundled fingerprint on purpose).
    world_base: str
    #: With ``world_base``: the behaviour values in which the stamp differs from that base's own profile
    #: (``{"path", "stamped", "base"}``; empty: it matches). A LoRA trained on the base with a deviation (an A/B's
    #: arm A) carries the base's encoder widths and these changes.
    world_base_differences: list[dict[str, object]]


class FileMetadata(TypedDict):
    """What :func:`read` gives back for one safetensors file."""

    path: str
    stamped: bool
    te_align: dict[str, JSONValue]
    kohya: dict[str, MetadataValue]
    profile_check: ProfileCheck | None
    tensor_count: int
    text_encoder_tensors: int
    metadata_keys: int


# ------------------------------------------------------------------------------- header reading
def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and validate only the header of a safetensors file (see :func:`te_align._safetensors.read_header`).

    A missing path, a folder, a symlink loop or a named pipe is one :class:`MetadataError` line
    (a FIFO is refused before it is opened: opening one blocks until a writer appears), and so is
    a header nested too deeply to parse.
    """
    check_file(path, MetadataError, what="file")
    try:
        return _safetensors.read_header(path, error=MetadataError)
    except RecursionError:
        raise MetadataError("not a valid safetensors file: the header JSON is nested too deeply", file=str(path)) from None


# ------------------------------------------------------------------------------------ stamping
def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    return str(v)


def stamp_keys(profile: AlignmentProfile | str, extra: dict[str, object] | None = None) -> dict[str, str]:
    """The ``te_align.*`` metadata keys for a profile (all values strings)."""
    p = resolve(profile) if isinstance(profile, str) else profile
    keys: dict[str, str] = {
        "te_align.version": __version__,
        "te_align.stamp_format": str(STAMP_FORMAT),
        "te_align.profile": p.name,
        "te_align.fingerprint": p.fingerprint(),
        "te_align.family": p.family,
        "te_align.empty_prompt": p.empty_prompt,
        "te_align.slots": ",".join(p.slot_names),
    }
    for s in p.slots:
        base = f"te_align.{s.name}"
        keys[f"{base}.max_length"] = _value(s.tokenizer.max_length)
        if s.tokenizer_only:  # no encoder (Anima's T5 ids): no layer / norm / pooling keys
            keys[f"{base}.tokenizer_only"] = _value(True)
        else:
            keys[f"{base}.layer"] = _value(s.encoder.layer)
            keys[f"{base}.final_layer_norm"] = _value(s.encoder.final_layer_norm)
            keys[f"{base}.pooled"] = _value(s.encoder.pooled)
        keys[f"{base}.masks.encoder"] = _value(s.masks.encoder)
        keys[f"{base}.masks.zero_padded"] = _value(s.masks.zero_padded)
        keys[f"{base}.masks.denoiser"] = _value(s.masks.denoiser)
    keys["te_align.profile_json"] = json.dumps(p.behaviour(), separators=(",", ":"), ensure_ascii=False)
    for k, v in (extra or {}).items():
        if not isinstance(k, str) or not k:
            raise MetadataError(f"extra metadata keys must be non-empty strings, got {k!r}")
        keys[f"te_align.extra.{k}"] = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return keys


def stamp(
    path_in: str | os.PathLike[str],
    path_out: str | os.PathLike[str] | None = None,
    *,
    profile: AlignmentProfile | str,
    extra: dict[str, object] | None = None,
    backup: bool = False,
) -> dict[str, str]:
    """Write the ``te_align.*`` keys of ``profile`` into a safetensors file's metadata.

    Only the header is rewritten: other metadata keys are kept, earlier ``te_align.*`` keys are
    replaced, tensor entries and offsets are unchanged, and the tensor bytes are streamed across
    unchanged (no tensor is loaded). The output is written to a temporary file next to it, fsynced
    and renamed over the target, so a crash never leaves a half-written file. With ``path_out``
    None (or equal to ``path_in``) the file is stamped in place; ``backup=True`` then keeps the
    original as ``<file>.bak``. Returns the keys written.
    """
    src = Path(path_in)
    dst = Path(path_out) if path_out is not None else src
    in_place = path_out is None or _same_file(src, dst)
    if backup and not in_place:
        raise MetadataError("backup=True only applies to stamping in place (path_out is given)", file=str(src))
    head = read_header(src)
    keys = stamp_keys(profile, extra)

    meta = {k: v for k, v in head.metadata.items() if not k.startswith(PREFIX)}
    meta.update(keys)
    new_header: dict[str, object] = {"__metadata__": meta}
    new_header.update((k, v) for k, v in head.raw.items() if k != "__metadata__")
    encoded = _safetensors.encode_header(new_header)

    backup_fn = (lambda: link_or_copy(src, src.with_name(src.name + ".bak"))) if in_place and backup else None
    with atomic_file(dst, error=MetadataError, mode_from=dst if dst.exists() else src, before_replace=backup_fn) as out:
        out.write(encoded)
        with open(src, "rb") as f:
            f.seek(head.data_start)
            copied = _copy_exactly(f, out, head.data_len)
        if copied != head.data_len:
            raise MetadataError(f"file changed while stamping ({copied} of {head.data_len} tensor bytes read)", file=str(src))
    return keys


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _copy_exactly(f: IO[bytes], out: IO[bytes], n: int, chunk: int = 16 << 20) -> int:
    done = 0
    while done < n:
        buf = f.read(min(chunk, n - done))
        if not buf:
            break
        out.write(buf)
        done += len(buf)
    return done


# ------------------------------------------------------------------------------------- reading
_BOOL_SUFFIXES = (".final_layer_norm", ".masks.encoder", ".masks.zero_padded", ".masks.denoiser", ".tokenizer_only")


def _parse_stamp_value(key: str, v: str) -> JSONValue:
    if key == "te_align.profile_json":
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
        except RecursionError:
            raise MetadataError("metadata te_align.profile_json is nested too deeply to read") from None
    if key.startswith("te_align.extra."):
        return v
    if key.endswith(_BOOL_SUFFIXES) and v in ("true", "false"):
        return v == "true"
    if key.endswith((".max_length", ".layer")) or key == "te_align.stamp_format":
        if re.fullmatch(r"-?\d+", v):
            return int(v)
    return v


def _profile_check(stamp: dict[str, JSONValue]) -> ProfileCheck | None:
    """Compare a stamp's fingerprint with the bundled profile of the same name (bundled only: no files, no hub)."""
    fp = stamp.get("te_align.fingerprint")
    name = stamp.get("te_align.profile")
    if not isinstance(fp, str):
        return None
    same = [p.name for p in profiles() if p.fingerprint() == fp]
    check: ProfileCheck = {
        "profile": name,
        "stamped_fingerprint": fp,
        "bundled": False,
        "current_fingerprint": None,
        "matches": None,
        "same_behaviour_as": same,
        "differences": [],
    }
    try:
        current = bundled(name) if isinstance(name, str) else None
    except ProfileNotFound:
        current = None
    if current is None:
        return check
    check["bundled"] = True
    check["bundled_name"] = current.name
    check["current_fingerprint"] = current.fingerprint()
    check["matches"] = current.fingerprint() == fp
    old = stamp.get("te_align.profile_json")
    if not check["matches"]:
        found = _world_base(current.name, fp, old if isinstance(old, dict) else None)
        if found is not None:
            check["world_base"], check["world_base_differences"] = found
            return check
    if not check["matches"] and isinstance(old, dict):
        now = current.behaviour()
        check["differences"] = [
            {"path": k, "stamped": old.get(k, "<absent>"), "current": now.get(k, "<absent>")}
            for k in dict.fromkeys([*old, *now])
            if old.get(k, "<absent>") != now.get(k, "<absent>")
        ]
    return check


def _world_base(
    profile_name: str, fingerprint: str, stamped: dict[str, JSONValue] | None
) -> tuple[str, list[dict[str, object]]] | None:
    """The shipped world base a stamp was trained on, and the behaviour values in which the stamp differs from the
    base's own profile (the bundled profile ``profile_name`` fitted to the base's tiny encoders, ``base.json``).

    A base whose own profile has ``fingerprint`` matches (no differences); else one whose encoder widths and depths
    (its ``profile_overrides``) the stamped values (``stamped``, ``te_align.profile_json``) all carry, with the
    values that differ. None when neither, or when the world data (the te-align-world package) is not installed.
    Reads JSON only: no torch."""
    from te_align._extras import MissingExtra
    from te_align.tiny import bases

    try:
        shipped = bases.shipped()
    except MissingExtra:  # no world data here: no world base to compare with
        return None
    near: tuple[str, list[dict[str, object]]] | None = None
    for name in shipped:
        if bases.BASES[name].profile != profile_name:
            continue
        try:
            own = bases.base_profile(name)
            fitted = list(bases.base_info(name).get("profile_overrides") or {})
        except TeAlignError:  # an unreadable base.json is the world base's error to report, not inspect's
            continue
        if own.fingerprint() == fingerprint:
            return name, []
        if stamped is None or near is not None:
            continue
        now = own.behaviour()
        if fitted and all(p in now and stamped.get(p, "<absent>") == now[p] for p in fitted):
            near = name, [
                {"path": k, "stamped": stamped.get(k, "<absent>"), "base": now.get(k, "<absent>")}
                for k in dict.fromkeys([*stamped, *now])
                if stamped.get(k, "<absent>") != now.get(k, "<absent>")
            ]
    return near


def read(path: str | os.PathLike[str]) -> FileMetadata:
    """The te-align stamp and kohya text-encoder metadata of a safetensors file (header only).

    Returns ``{"path", "stamped", "te_align": {key: value}, "kohya": {key: value}, "profile_check",
    "tensor_count", "text_encoder_tensors", "metadata_keys"}``. ``te_align`` holds the ``te_align.*`` keys with numbers and
    booleans parsed and ``te_align.profile_json`` decoded; ``kohya`` holds the sd-scripts keys of
    :data:`KOHYA_KEYS` that are present, parsed from their ``str()`` form. ``profile_check`` (None
    when unstamped) says whether the stamped fingerprint equals the current fingerprint of the
    bundled profile with the stamped name, which bundled profiles have that fingerprint, and — when
    they differ — which behaviour values changed.
    """
    head = read_header(path)
    meta = head.metadata
    te = {k: _parse_stamp_value(k, v) for k, v in meta.items() if k.startswith(PREFIX)}
    kohya = kohya_lora.read(meta, MetadataError)
    stamped = "te_align.fingerprint" in te
    return {
        "path": str(path),
        "stamped": stamped,
        "te_align": te,
        "kohya": kohya,
        "profile_check": _profile_check(te) if stamped else None,
        "tensor_count": len(head.tensors),
        "text_encoder_tensors": sum(1 for n in head.tensors if kohya_lora.is_text_encoder_tensor(n)),
        "metadata_keys": len(meta),
    }


__all__ = [
    "KOHYA_KEYS",
    "MetadataError",
    "read",
    "read_header",
    "stamp",
    "stamp_keys",
]
