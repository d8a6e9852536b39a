"""Whether this environment is the committed lock (``lock/constraints.txt``, written by ``tools/deps.py lock``).

Tests that compare bytes recorded once (a pretraining run's SHA-256) can only hold on the exact library versions
they were recorded with; they run under the lock and skip elsewhere, saying which versions differ.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

LOCK = Path(__file__).resolve().parents[2] / "lock" / "constraints.txt"

#: the libraries whose numbers reach a recorded tensor
NUMERIC = ("torch", "numpy", "diffusers", "transformers", "tokenizers", "safetensors", "accelerate", "peft", "pillow")


def locked_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    if not LOCK.is_file():
        return out
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return out


def differences(packages: tuple[str, ...] = NUMERIC) -> list[str]:
    """``["diffusers 0.43.0 (lock 0.42.1)", …]`` for the packages installed at another version than the lock's."""
    lock = locked_versions()
    out = []
    for name in packages:
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = "not installed"
        want = lock.get(name)
        if want is not None and have.split("+")[0] != want:
            out.append(f"{name} {have} (lock {want})")
    return out


def skip_reason(packages: tuple[str, ...] = NUMERIC) -> str | None:
    if not LOCK.is_file():
        return "lock/constraints.txt is missing (python tools/deps.py lock writes it)"
    diff = differences(packages)
    if not diff:
        return None
    return ("the reference was recorded under lock/constraints.txt (the README's test command installs it); this "
            f"environment differs: {', '.join(diff)}")
