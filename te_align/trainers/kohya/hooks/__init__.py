"""Runtime hooks for kohya-ss/sd-scripts (and the kohya_ss GUI, which runs it): tokenize and encode by a profile.

sd-scripts builds one tokenize strategy and one text-encoding strategy per architecture
(``library/strategy_<arch>.py``); tokenization runs in the Dataset (DataLoader workers) and encoding
in ``NetworkTrainer.process_batch`` or while caching TE outputs. The hooks replace, in place on
those classes, ``tokenize`` and ``encode_tokens`` with functions that call :mod:`te_align.encoding`
(:func:`~te_align.encoding.core.tokenize_slot` / :func:`~te_align.encoding.core.encode_slot_tokens`)
and return sd-scripts' own tuple layout, so everything downstream is unchanged. Cached TE outputs
(``*_te*.npz``) get the profile fingerprint and are re-encoded when it differs; saved LoRAs get the
te_align metadata stamp (:mod:`~te_align.trainers.kohya.hooks.caches`). ``--weighted_captions``
(``tokenize_with_weights`` / ``encode_tokens_with_weights``) is tokenized and encoded by the profile
with sd-scripts' prompt weights applied its way (:mod:`~te_align.trainers.kohya.hooks.weights`); sample images
are conditioned as training is (:mod:`~te_align.trainers.kohya.hooks.sample`, which lists every sd-scripts
sample path).

The package: :mod:`~te_align.trainers.kohya.hooks.archs` (one row per sd-scripts architecture: classes, slots,
parameters, its own steps, its targets), :mod:`~te_align.trainers.kohya.hooks.slots` (the steps every
architecture shares), :mod:`~te_align.trainers.kohya.hooks.run` (the run's state: profile, overrides, facts),
and the modules above.

Activation: ``install(profile=None, **overrides)``. Importing the package installs nothing. The drop-in
train scripts (``te-align patch``) call :func:`install` at their top level, and DataLoader workers
started with *spawn* re-import the main script, so every process of a run is hooked.
``TE_ALIGN=off`` leaves sd-scripts unmodified.

Profile choice: ``install(profile=...)`` / ``TE_ALIGN_PROFILE``; otherwise per architecture from
:mod:`te_align.trainers.kohya` (SD1 ``sd15``, SD2 ``sd21`` (tokenizer pad "!"), SDXL ``sdxl``, SD3
``sd35-large`` (every bundled SD3 profile has the same behaviour), Flux ``flux-dev``/``flux-schnell``
from sd-scripts' own checkpoint analysis, Chroma ``chroma``, Lumina 2 ``lumina2``, Anima ``anima``,
HunyuanImage ``hunyuanimage-2.1``). Overrides: keyword arguments and ``TE_ALIGN_OVERRIDES`` (JSON
object; keyword arguments win), all ordinary profile overrides. CLIP-G "!": by default every literal "!"
becomes the pad token id 0, as the hub ``tokenizer_2`` of SDXL/SD3 does; the override
``clip_g.tokenizer.pad_token_in_prompt = "text"`` keeps sd-scripts' plain BPE "!" (fingerprinted like
every override).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from te_align._git import git_head
from te_align.hooks.base import Hook, Lifecycle, Settings, Target
from te_align.trainers.kohya.hooks.archs import ARCHS, Arch, all_targets, cache_fingerprint
from te_align.trainers.kohya.hooks.caches import NPZ_KEY
from te_align.trainers.kohya.hooks.run import (
    ENV_OVERRIDES,
    ENV_PROFILE,
    ENV_STATE,
    RUN,
    check_overrides,
    default_profile_name,
    profile_for,
    with_clip_skip,
)

if TYPE_CHECKING:  # pragma: no cover
    from te_align.hooks.base import ProfileSource

logger = logging.getLogger("te_align")


@dataclass
class KohyaHook(Hook):
    name: ClassVar[str] = "kohya"
    #: The sd-scripts commits the targets were read and verified against.
    supported: ClassVar[dict[str, str]] = {
        "48d368fa557731ad0488c07304dfeba8c07910eb": "kohya-ss/sd-scripts 48d368f (main, 2026-02-16)"
    }

    def targets(self) -> Sequence[Target]:
        return all_targets()

    def configure(self, settings: Settings) -> None:
        super().configure(settings)
        RUN.configure(settings)

    def detect_version(self) -> str:
        mod = sys.modules.get("library")
        root = Path(mod.__file__).resolve().parent.parent if mod is not None and getattr(mod, "__file__", None) else None
        if root is None:
            return "unknown (sd-scripts 'library' not imported)"
        head = git_head(root)
        return (self.supported.get(head, head[:7]) if head else "unknown (no git)") + f" at {root}"


LIFECYCLE = Lifecycle("kohya", KohyaHook, check=check_overrides, runs="sd-scripts")


# ------------------------------------------------------------------------------------ public API
def install(profile: ProfileSource = None, **overrides: object) -> bool:
    """Install the kohya hooks (idempotent; all targets or none). Returns False under ``TE_ALIGN=off``.

    ``profile``: a profile name or object used for every architecture (default: ``TE_ALIGN_PROFILE``,
    else chosen per architecture). ``overrides``: profile overrides
    (merged over ``TE_ALIGN_OVERRIDES``; pass dotted keys with ``**{"clip_g.tokenizer.pad_token_in_prompt": "text"}``).
    The lifecycle (environment, validation, idempotence, logging) is :class:`te_align.hooks.base.Lifecycle`.
    """
    return LIFECYCLE.install(profile, overrides)


def uninstall() -> None:
    """Restore every replaced method (idempotent)."""
    with RUN.lock:
        LIFECYCLE.uninstall()
        RUN.reset()


def is_installed() -> bool:
    return LIFECYCLE.is_installed()


def check() -> None:
    """Resolve every target without changing anything; raises HookError listing each problem."""
    KohyaHook().check()


__all__ = [
    "ARCHS", "ENV_OVERRIDES", "ENV_PROFILE", "ENV_STATE", "NPZ_KEY", "RUN", "Arch", "KohyaHook",
    "all_targets", "cache_fingerprint", "check", "default_profile_name", "install", "is_installed", "profile_for",
    "uninstall", "with_clip_skip",
]
