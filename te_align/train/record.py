"""What a training run records: ``train_config.json`` (the run record) and, on request, every random draw of its
steps (:func:`recording_draws`, for checking that the two arms of an A/B share every draw but the one they change)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import te_align
from te_align.train._io import write_atomic, writing
from te_align.train.models import QUANTIZE_BACKENDS, weight_dtype_name

if TYPE_CHECKING:  # pragma: no cover
    from te_align.train.run import Run


def _write_json(path: Path, data: object) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str))


def write_run_record(run: Run) -> None:
    """``train_config.json``: the config, profile and dataset summary of this run."""
    cfg, report = run.cfg, run.report
    with writing(run.out_dir):
        run.out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(run.out_dir / "train_config.json", {
        "config": cfg.to_dict(), "profile": run.profile.name, "fingerprint": run.profile.fingerprint(),
        "profile_overrides": cfg.model.profile_overrides, "objective": run.objective, "family": run.family.name,
        "images": len(report.items), "buckets": sorted({it.bucket for it in report.items}), "te_align": te_align.__version__,
        "missing_captions": [str(p) for p in report.missing_captions],
        "unreadable": [str(p) for p, _ in report.unreadable],
        "weight_dtype": weight_dtype_name(cfg.model, cfg.train.mixed_precision), "quantize": cfg.model.quantize,
        "quantize_backend": QUANTIZE_BACKENDS[cfg.model.quantize],
        "residency": dataclasses.asdict(run.residency) if run.residency is not None else None,
        "denoiser_mask": run.denoiser_mask if run.family.mask_arg is not None else None,
    })


#: Every random draw of the training steps, while :func:`recording_draws` is active (None otherwise).
_DRAWS: list[dict[str, Any]] | None = None


@contextlib.contextmanager
def recording_draws() -> Iterator[list[dict[str, Any]]]:
    """Record every micro-step's random draws of the runs trained inside (in this process): the global batch's item
    indices (data order), flips, noise, timesteps, processed captions, caption-dropout and per-encoder dropout flags,
    and at the first step a digest of the trainable parameters as initialised (the LoRA's initial weights). For
    checking that two arms of an A/B share every draw but the one their setting changes."""
    global _DRAWS
    previous, _DRAWS = _DRAWS, []
    try:
        yield _DRAWS
    finally:
        _DRAWS = previous


def active_draws() -> list[dict[str, Any]] | None:
    """The draws being recorded (:func:`recording_draws`), None when none are."""
    return _DRAWS


def params_digest(run: Run) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, param in sorted(run.named_trainable.items()):
        h.update(name.encode())
        h.update(param.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


__all__ = ["active_draws", "params_digest", "recording_draws", "write_run_record"]
