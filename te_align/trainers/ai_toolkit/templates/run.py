# te-align shim for ai-toolkit's run.py (installed by `te-align patch`; `te-align unpatch` restores
# the original byte for byte). The original is te_align_original_run.py next to this file; the web UI
# spawns `python run.py CONFIG` from this folder and reaches it unchanged through this shim. Encoding
# itself is switched by the te-align extension in extensions/te_align. TE_ALIGN=off runs the original
# without te-align.
import os
import runpy
import sys

_OFF_WORDS = None  # `te-align patch` writes te_align.hooks.base.OFF_WORDS here

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("TE_ALIGN", "").strip().lower() not in _OFF_WORDS:
    try:
        import te_align.trainers.ai_toolkit.hooks  # noqa: F401
    except ImportError as e:
        sys.exit(
            f"te-align patched this ai-toolkit folder but cannot be imported in this Python ({e}); "
            f"install it here with te-align patch --python {sys.executable} {_here} (from te-align's own environment), "
            f"run with TE_ALIGN=off, or restore the original: te-align unpatch {_here}"
        )
sys.argv[0] = os.path.join(_here, "te_align_original_run.py")
runpy.run_path(sys.argv[0], run_name="__main__")
