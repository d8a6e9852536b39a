"""What a hooked sd-scripts run writes: TE-output caches carry the profile fingerprint, LoRAs the stamp.

sd-scripts' TE-output caches (``*_te*.npz``) are reused when their key names match
(``is_disk_cached_outputs_expected``). Hooked, a cache written by ``cache_batch_outputs`` also gets
:data:`NPZ_KEY` = :func:`~te_align.trainers.kohya.hooks.archs.cache_fingerprint`, and one whose fingerprint
differs (or is missing) is re-encoded (counted, and logged at exit). A saved ``LoRANetwork`` gets the te_align
metadata stamp.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from te_align._atomic import atomic_file
from te_align.hooks.base import HookError, mark_wrapper
from te_align.metadata import stamp, stamp_keys
from te_align.trainers.kohya.hooks.run import RUN, profile_for, tokenize_strategy

if TYPE_CHECKING:  # pragma: no cover
    from te_align.trainers.kohya.hooks.archs import Arch, Models

#: Key stored in every TE-output npz written while the hooks are active.
NPZ_KEY = "te_align_fingerprint"
#: Trainer name in the stamp of a saved LoRA.
TRAINER = "kohya-ss/sd-scripts"
#: ``cache_fingerprint(profile, tokenize strategy, *, weighted)``: the fingerprint a TE-output cache carries.
Fingerprint = Callable[..., str]


def npz_fingerprint(path: str) -> str | None:
    """The fingerprint a TE-output npz was stamped with (None: none, or unreadable)."""
    import numpy as np

    try:
        with np.load(path) as data:
            return str(data[NPZ_KEY]) if NPZ_KEY in data.files else None
    except (OSError, ValueError, KeyError):
        return None


def stamp_npz(path: str, fingerprint: str) -> None:
    """Rewrite a TE-output npz with :data:`NPZ_KEY` added (atomically)."""
    from pathlib import Path

    import numpy as np

    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays[NPZ_KEY] = np.array(fingerprint)
    with atomic_file(Path(path), "wb", error=HookError) as f:
        np.savez(f, **arrays)


def report_reencoded() -> None:
    """Log how many cached TE outputs were re-encoded since the last report."""
    import logging

    with RUN.lock:
        n, done = RUN.reencoded, RUN.reencoded_logged
        RUN.reencoded_logged = n
    if n > done:
        logging.getLogger("te_align").warning(
            "te-align: %d cached text-encoder output file(s) were made with another profile and are re-encoded", n - done
        )


atexit.register(report_reencoded)


def _expected_fingerprint(arch: Arch, fingerprint: Fingerprint, strategy: object) -> str:
    tok = tokenize_strategy()
    return fingerprint(profile_for(arch.name, tok), tok, weighted=bool(getattr(strategy, "is_weighted", False)))


# ------------------------------------------------------------------------------ replacements
def cache_check_wrapper(arch: Arch, fingerprint: Fingerprint, original: Callable[..., object]) -> Callable[..., bool]:
    """``is_disk_cached_outputs_expected``: sd-scripts' check, then the fingerprint must match (``fingerprint``:
    :func:`~te_align.trainers.kohya.hooks.archs.cache_fingerprint`, handed down by the architecture table)."""

    def is_disk_cached_outputs_expected(self: object, npz_path: str) -> bool:
        if not original(self, npz_path):
            return False
        want = _expected_fingerprint(arch, fingerprint, self)
        have = npz_fingerprint(npz_path)
        if have == want:
            return True
        with RUN.lock:
            RUN.reencoded += 1
        RUN.once(f"stale:{arch.name}", "te-align: %s was cached %s; it and any like it are re-encoded", npz_path,
                 "without a te-align profile" if have is None else f"with profile fingerprint {have[:12]}")
        return False

    return mark_wrapper(is_disk_cached_outputs_expected, original)


def cache_write_wrapper(arch: Arch, fingerprint: Fingerprint, original: Callable[..., object]) -> Callable[..., object]:
    """``cache_batch_outputs``: sd-scripts writes the npz files, then each gets the fingerprint (``fingerprint``: as
    for :func:`cache_check_wrapper`)."""

    def cache_batch_outputs(
        self: object,
        tokenize_strategy: object,
        models: Models,
        text_encoding_strategy: object,
        infos: Iterable[object],
    ) -> object:
        report_reencoded()
        if arch.observe is not None:
            arch.observe(models)
        result = original(self, tokenize_strategy, models, text_encoding_strategy, infos)
        if getattr(self, "cache_to_disk", False):
            fp = fingerprint(profile_for(arch.name, tokenize_strategy), tokenize_strategy, weighted=bool(getattr(self, "is_weighted", False)))
            for info in infos:
                path = getattr(info, "text_encoder_outputs_npz", None)
                if path and os.path.exists(path):
                    stamp_npz(path, fp)
        return result

    return mark_wrapper(cache_batch_outputs, original)


def stamping_save(original: Callable[..., object]) -> Callable[..., object]:
    """``LoRANetwork.save_weights``: the saved .safetensors carries the te_align stamp of the run's profile."""

    def save_weights(self: object, file: str, dtype: object, metadata: object) -> object:
        p = RUN.last_profile
        if p is None or not str(file).endswith(".safetensors"):
            return original(self, file, dtype, metadata)
        if isinstance(metadata, dict):
            metadata.update(stamp_keys(p, {"trainer": TRAINER}))
            return original(self, file, dtype, metadata)
        result = original(self, file, dtype, metadata)
        stamp(file, profile=p, extra={"trainer": TRAINER})
        return result

    return mark_wrapper(save_weights, original)
