"""A wheel of the running te-align, built from itself (no package index has te-align; no setuptools needed).

``te-align patch`` installs te-align into a trainer's own Python environment from this wheel. The wheel is
deterministic (sorted entries, fixed timestamps and modes): the same installation gives the same bytes.

Where the files come from:

* a source tree or an editable install (the package's parent folder holds ``pyproject.toml``): every file of the
  ``te_align`` package without ``__pycache__``/``*.pyc``, plus the repository's ``presets/`` as ``te_align/_presets``
  (what ``setup.py`` adds to a wheel);
* an installed wheel: the distribution's own file list (``importlib.metadata``), files under ``te_align/``.

The ``.dist-info`` holds METADATA (from the installed distribution, Version set to the running code's), WHEEL,
entry_points.txt and RECORD (sha256 of every file).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

from te_align._version import __version__
from te_align.errors import TeAlignError

DIST = "te-align"
PACKAGE = "te_align"
#: Folders of the source tree that setup.py ships inside the package as ``te_align/_<name>`` (= setup.SHIPPED).
SHIPPED = ("presets",)
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_ENTRY_POINTS = "[console_scripts]\nte-align = te_align.cli:main\n"


@dataclass(frozen=True)
class Wheel:
    path: Path
    version: str
    #: The installed paths of the package's files (relative to site-packages), as the wheel holds them.
    files: tuple[str, ...]


def _distribution() -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_dir() -> Path:
    return Path(__file__).resolve().parents[1]  # te_align/patching/wheel.py -> te_align/


def source_root() -> Path | None:
    """The project root when te-align runs from a source tree / editable install (it holds pyproject.toml)."""
    root = _package_dir().parent
    return root if (root / "pyproject.toml").is_file() else None


def _walk(folder: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        here = Path(dirpath)
        for name in sorted(filenames):
            if name.endswith(_SKIP_SUFFIXES):
                continue
            f = here / name
            if f.is_symlink() or not f.is_file():
                continue
            yield f"{prefix}/{f.relative_to(folder).as_posix()}", f


def package_files() -> dict[str, Path]:
    """``{path in the wheel: file on disk}`` of the running te-align's package (see the module docstring)."""
    out: dict[str, Path] = {}
    root = source_root()
    if root is not None:
        out.update(_walk(root / PACKAGE, PACKAGE))
        for name in SHIPPED:
            if (root / name).is_dir():
                out.update(_walk(root / name, f"{PACKAGE}/_{name}"))
        return out
    dist = _distribution()
    if dist is None or not dist.files:
        raise TeAlignError("cannot build a wheel of this te-align: it is neither a source tree nor an installed "
                           "distribution with a file list")
    for f in dist.files:
        parts = f.parts
        if not parts or parts[0] != PACKAGE or _SKIP_DIRS & set(parts) or f.name.endswith(_SKIP_SUFFIXES):
            continue
        located = Path(str(f.locate()))
        if located.is_file():
            out[f.as_posix()] = located
    return out


def _metadata_text(version: str) -> str:
    """METADATA of the installed distribution (headers in order, Version set to ``version``, the description as
    the body); Requires-Dist from requires.txt when an egg-info holds them there."""
    dist = _distribution()
    if dist is None:
        return f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n"
    msg: Message = dist.metadata  # type: ignore[assignment]
    lines: list[str] = []
    for key, value in msg.items():
        if key.lower() in ("version", "description"):
            continue
        lines.append(f"{key}: {value}")
        if key.lower() == "name":
            lines.append(f"Version: {version}")
    if not msg.get_all("Requires-Dist"):
        lines.extend(f"Requires-Dist: {req}" for req in dist.requires or ())
    payload = msg.get_payload()
    body = payload if isinstance(payload, str) and payload.strip() else str(msg.get("Description") or "")
    return "\n".join(lines) + "\n" + (f"\n{body}" if body else "")


def _entry_points() -> str:
    dist = _distribution()
    text = dist.read_text("entry_points.txt") if dist is not None else None
    return text if text and text.strip() else _ENTRY_POINTS


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data, compresslevel=6)


def wheel_name(version: str = __version__) -> str:
    return f"{PACKAGE}-{version}-py3-none-any.whl"


def build_wheel(out_dir: str | Path, version: str = __version__) -> Wheel:
    """Write ``te_align-VERSION-py3-none-any.whl`` of the running te-align into ``out_dir``; deterministic."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = package_files()
    if f"{PACKAGE}/__init__.py" not in files:
        raise TeAlignError(f"cannot build a wheel of this te-align: {PACKAGE}/__init__.py not found")
    info = f"{PACKAGE}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": _metadata_text(version).encode("utf-8"),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: te-align\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": _entry_points().encode("utf-8"),
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    path = out_dir / wheel_name(version)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name in sorted(files):
            data = files[name].read_bytes()
            _add(zf, name, data)
            writer.writerow([name, _record_hash(data), len(data)])
        for name, data in meta.items():
            _add(zf, name, data)
            writer.writerow([name, _record_hash(data), len(data)])
        writer.writerow([f"{info}/RECORD", "", ""])
        _add(zf, f"{info}/RECORD", record.getvalue().encode("utf-8"))
    os.replace(tmp, path)
    installed = (*sorted(files), *meta, f"{info}/RECORD", f"{info}/INSTALLER", f"{info}/direct_url.json")
    return Wheel(path, version, tuple(installed))
