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
    overrides = tiny_profile_overrides(model)
    write_train_example(root, overrides)
    result = run_ab("tiny-demo", model=model, data=data, seeds=seeds, out=root / "ab", max_steps=steps,
                    profile_overrides=overrides, say=say)  # fmt: skip
    say(f"train your own LoRA on the demo's model (denoiser + CLIP-L): te-align train {root / TRAIN_EXAMPLE}")
    return result


#: The training config the demo leaves beside its model and data (``te-align train te-align-demo/train.toml``).
TRAIN_EXAMPLE = "train.toml"


def write_train_example(root: Path, overrides: dict[str, Any]) -> Path:
    """A ``te-align train`` config for the demo's tiny model and shapes: a LoRA on the denoiser and on CLIP-L,
    with the sd35-large profile fitted to the tiny encoders (paths relative to the file)."""
    import toml

    from te_align._atomic import atomic_file
    from te_align.tiny.fit import DEMO_PROFILE

    config = {
        "model": {"path": "model", "profile": DEMO_PROFILE, "profile_overrides": overrides},
        "data": {"path": "data/train", "resolution": 32, "bucket_step": 16, "min_bucket": 16, "max_bucket": 64},
        "lora": {"rank": 8, "alpha": 8.0, "text_encoders": ["clip_l"]},
        "train": {"max_steps": 60, "batch_size": 4, "learning_rate": 3e-3, "checkpoint_every": 0},
        "output": {"dir": "train-output"},
    }
    head = ("# A LoRA on te-align demo's tiny SD3-shaped model (denoiser + CLIP-L text encoder), conditioned by the\n"
            "# sd35-large profile fitted to the tiny encoders. Run: te-align train <this file>\n")  # fmt: skip
    path = root / TRAIN_EXAMPLE
    with atomic_file(path, "w") as f:
        f.write(head + toml.dumps(config))
    return path


__all__ = ["TRAIN_EXAMPLE", "run_demo", "write_train_example"]
