"""``te-align demo``: one consequential A/B on a pretrained shapes-world base, offline, on CPU, in minutes.

The ``tiny-demo`` preset names the base (:mod:`te_align.tiny.bases`, pretrained with exactly its family's
profile), the concept it learns from captioned images drawn from the world, and the trainer deviation of arm A;
arm B conditions by the profile. Both are scored as the official pipeline conditions at inference: held-out
validation loss and prompt accuracy read back from the samples. The report (``OUT/report.md`` and
``report.html``) leads with the verdict.
``TE_ALIGN_DEMO_STEPS`` and ``TE_ALIGN_DEMO_SEEDS`` (or ``steps=`` / ``seeds=``) shorten it, for tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from te_align.ab.preset import ABError

DEMO_PRESET = "tiny-demo"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ABError(f"expected an integer, got {value!r}", key=name) from None


def run_demo(out: str | Path = "te-align-demo", *, steps: int | None = None, seeds: int | None = None,
             say: Callable[[str], None] = print) -> Any:
    """Run the demo A/B; returns the :class:`te_align.ab.runner.ABResult`."""
    from te_align.ab.preset import load_preset
    from te_align.ab.runner import run_ab

    steps = steps if steps is not None else _env_int("TE_ALIGN_DEMO_STEPS")
    seeds = seeds if seeds is not None else _env_int("TE_ALIGN_DEMO_SEEDS")
    root = Path(out).expanduser()
    preset = load_preset(DEMO_PRESET)
    assert preset.world is not None
    say(f"te-align demo: the pretrained {preset.world.base} shapes-world base learns {preset.world.concept.split('=')[1]}; "
        f"arm A: {preset.baseline.behaviour} ({preset.baseline.trainer}); arm B: profile {preset.profile}; output in {root}")  # fmt: skip
    return run_ab(preset, seeds=seeds, out=root, max_steps=steps, say=say)


__all__ = ["DEMO_PRESET", "run_demo"]
