"""``te-align demo``: one consequential A/B on the pretrained shapes-world base, offline, on CPU, in minutes.

The SD3-shaped world base shipped with te-align (:mod:`te_align.tiny.bases`, pretrained with exactly the
sd35-large profile) learns a colour it never saw from captioned images drawn from the world; arm A conditions
as OneTrainer does by default (T5 truncated and padded at 77 tokens), arm B by the profile (256). Both are
scored as the official pipeline conditions at inference: held-out validation loss and prompt accuracy read
back from the samples. The report (``OUT/report.md`` and ``report.html``) leads with the verdict.
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
    say(f"te-align demo: the pretrained SD3-shaped shapes-world base learns {preset.world.concept.split('=')[1]}; "
        f"arm A: {preset.baseline.trainer} ({preset.baseline.overrides}), arm B: profile {preset.profile}; output in {root}")  # fmt: skip
    return run_ab(preset, seeds=seeds, out=root, max_steps=steps, say=say)


__all__ = ["DEMO_PRESET", "run_demo"]
