"""``te-align demo``: the whole A/B offline on a tiny SD3-shaped model and synthetic shapes (CPU, minutes).

Builds the model (:func:`te_align.tiny.pipelines.build_tiny_sd3`) and the dataset once into ``OUT/model`` and
``OUT/data``, then runs the ``tiny-demo`` preset (SimpleTuner's default SD3 T5 length against the
sd35-large profile) and writes ``OUT/ab/report.md`` and ``report.html``. ``TE_ALIGN_DEMO_STEPS`` and
``TE_ALIGN_DEMO_SEEDS`` (or ``steps=`` / ``seeds=``) shorten it, for tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from te_align.ab.preset import ABError


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
    from te_align.ab.runner import run_ab
    from te_align.tiny.datasets import make_shapes_dataset
    from te_align.tiny.fit import tiny_profile_overrides
    from te_align.tiny.pipelines import build_tiny_sd3

    steps = steps if steps is not None else _env_int("TE_ALIGN_DEMO_STEPS")
    seeds = seeds if seeds is not None else _env_int("TE_ALIGN_DEMO_SEEDS")
    root = Path(out).expanduser()
    say(f"te-align demo: tiny SD3-shaped model and synthetic shapes in {root}")
    model = build_tiny_sd3(root / "model")
    data = root / "data"
    if not (data / "train").is_dir() or not (data / "val").is_dir():
        make_shapes_dataset(data)
    return run_ab("tiny-demo", model=model, data=data, seeds=seeds, out=root / "ab", max_steps=steps,
                  profile_overrides=tiny_profile_overrides(model), say=say)  # fmt: skip


__all__ = ["run_demo"]
