"""te-align extension for ostris ai-toolkit (installed by ``te-align patch``; removed by ``te-align unpatch``).

ai-toolkit imports every package in its ``extensions/`` folder before it builds a job's processes.
Importing this one makes each training process encode prompts by a te-align alignment profile:
the process's ``te_align:`` section (profile, overrides, enabled) if it has one, else the profile
pinned at patch time, else the one matching ``model.arch`` / ``name_or_path``. ``TE_ALIGN=off`` in
the environment gives ai-toolkit's unmodified behaviour.
"""

import sys

PINNED_PROFILE = None  # te-align patch --profile NAME

try:
    from te_align.trainers.ai_toolkit.hooks import watch_processes
except ImportError as _e:
    raise ImportError(
        f"the te-align extension ({__file__}) needs te-align installed in this Python ({_e}); "
        f"install it here with te-align patch --python {sys.executable} <this ai-toolkit folder> (from te-align's own "
        "environment), or remove it with: te-align unpatch <this ai-toolkit folder>"
    ) from _e

watch_processes(default_profile=PINNED_PROFILE)

AI_TOOLKIT_EXTENSIONS: list = []
