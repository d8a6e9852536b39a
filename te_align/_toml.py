"""TOML reading on every Python te-align runs on: the standard library's ``tomllib`` (3.11+), else ``tomli``.

``tomli`` is the package ``tomllib`` was taken from (same API: ``loads``, ``load`` of a binary file,
``TOMLDecodeError``); te-align requires it on Python 3.10 only (``tomli; python_version < "3.11"``). Import
``loads`` and ``TOMLDecodeError`` from here, never ``tomllib`` directly, so the core runs on Python 3.10 inside a
trainer's own environment.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from tomllib import TOMLDecodeError, load, loads
else:  # pragma: no cover - Python 3.10
    from tomli import TOMLDecodeError, load, loads

__all__ = ["TOMLDecodeError", "load", "loads"]
