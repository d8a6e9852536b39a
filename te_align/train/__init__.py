"""Built-in PEFT LoRA trainer, aligned by construction: every caption is encoded by ``te_align.encode``.

``te-align train CONFIG.toml``, ``python -m te_align.train CONFIG.toml`` (also under
``accelerate launch -m te_align.train CONFIG.toml``) or :func:`train` from Python. The config schema
is :mod:`te_align.train.config`. Submodules that need torch load on first use.
"""

from __future__ import annotations

from te_align._lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": "te_align.train.config",
    "TrainError": "te_align.train.config",
    "config_from_dict": "te_align.train.config",
    "load_config": "te_align.train.config",
    "TrainResult": "te_align.train.run",
    "train": "te_align.train.loop",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
