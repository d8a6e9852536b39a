"""te-align for SimpleTuner, in every Python process of a run (no SimpleTuner file is changed).

Enabled by the environment that ``python -m te_align.hooks.simpletuner env`` prints: this folder first on
PYTHONPATH and TE_ALIGN_SIMPLETUNER=1. Python imports ``sitecustomize`` at start-up; this one arms
te_align.trainers.simpletuner.hooks, which installs the hooks when SimpleTuner's text-embed cache module is imported
(``simpletuner train`` and ``simpletuner server`` both start training in new processes that inherit the
environment). Any other ``sitecustomize`` later on sys.path still runs. TE_ALIGN=off skips te-align.
"""

import importlib.util
import os
import sys

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.


def _chain() -> None:
    """Run the next ``sitecustomize`` on sys.path (the one this file shadows), if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_te_align_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


def _arm() -> None:
    off = ("off", "0", "false", "no", "disabled")
    if os.environ.get("TE_ALIGN", "").strip().lower() in off:
        return
    if os.environ.get("TE_ALIGN_SIMPLETUNER", "").strip().lower() in ("", *off):
        return
    try:
        from te_align.trainers.simpletuner.hooks import boot
    except ImportError as e:
        raise SystemExit(f"te-align: TE_ALIGN_SIMPLETUNER is set but te-align is not importable in {sys.executable} "
                         f"({e}); install te-align into SimpleTuner's Python or unset TE_ALIGN_SIMPLETUNER") from None
    boot()


_chain()
_arm()
