"""The one way the tests import a script of the repository's ``tools/`` or ``benchmarks/`` (folders that are not
packages): :func:`load_script` executes the file once per process and keeps the module in ``sys.modules`` under a
name made from its path, so two test modules that load the same script share one module object (and a dataclass in
it can look its module up, as ``dataclasses`` does)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def module_name(relpath: str) -> str:
    """The ``sys.modules`` name of the script at ``relpath``: ``tools/fault_campaign.py`` -> ``te_align_script_tools_fault_campaign``."""
    stem = relpath[: -len(".py")] if relpath.endswith(".py") else relpath
    return "te_align_script_" + re.sub(r"\W", "_", stem)


def load_script(relpath: str) -> ModuleType:
    """The module of the script at ``relpath`` (relative to the repository root, ``/``-separated), executed on the
    first call and cached in ``sys.modules``; a script that raises while executing is not cached."""
    name = module_name(relpath)
    cached = sys.modules.get(name)
    if cached is not None:
        return cached
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file that can be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
