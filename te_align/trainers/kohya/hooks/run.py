"""The state of one hooked sd-scripts process: chosen profile, user overrides, facts, counters.

Everything the kohya hook modules share lives here and is imported by name (``RUN``, ``profile_for``, …):
the profile a hooked call follows (:func:`profile_for`: explicit, else the architecture's bundled one
from :mod:`te_align.trainers.kohya`, with the user's overrides), sd-scripts flags taken as te-align
settings (:func:`with_clip_skip`, :func:`chunk_options`) and the facts the parent process learns and
hands to DataLoader workers through the environment (:data:`ENV_STATE`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from te_align import kohya_lora
from te_align._lazy import lazy_module
from te_align._types import JSONObject, JSONValue
from te_align.hooks.base import ENV_OVERRIDES, ENV_PROFILE, HookError, Settings, env_overrides, settings  # noqa: F401
from te_align.profiles import AlignmentProfile
from te_align.trainers.kohya import names as table

if TYPE_CHECKING:  # pragma: no cover
    from te_align.encoding import core as _core
    from te_align.encoding.core import EncodeOptions
    from te_align.hooks.base import ProfileSource
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")

logger = logging.getLogger("te_align")

#: Run facts the parent learns (Flux variant) handed to DataLoader workers through the environment.
ENV_STATE = "TE_ALIGN_KOHYA_STATE"

#: Former hook options, now ordinary profile overrides: old key -> (override key, {old value: new value}).
RENAMED_OPTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "kohya.clip_g_exclamation": ("clip_g.tokenizer.pad_token_in_prompt", {"official": "pad_id", "sd-scripts": "text"}),
}


class Run:
    """Per-process state: chosen profiles, user overrides, counters, one-time log lines."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.settings: Settings | None = None
        self.explicit: ProfileSource = None
        self.overrides: dict[str, object] = {}
        self.profiles: dict[str, AlignmentProfile] = {}
        self.logged: set[str] = set()
        self.reencoded = 0
        self.reencoded_logged = 0
        self.last_profile: AlignmentProfile | None = None

    def configure(self, settings: Settings | None) -> None:
        """The user's settings (:func:`te_align.hooks.base.settings`): profile source and overrides."""
        with self.lock:
            self.settings = settings
            self.explicit = settings.source if settings is not None else None
            self.overrides = dict(settings.overrides) if settings is not None else {}
            self.profiles.clear()

    def reset(self) -> None:
        with self.lock:
            self.configure(None)
            self.last_profile = None
            self.reencoded = self.reencoded_logged = 0
            self.logged.clear()

    def once(self, key: str, msg: str, *args: object, level: int = logging.INFO) -> None:
        with self.lock:
            if key in self.logged:
                return
            self.logged.add(key)
        logger.log(level, msg, *args)

    def state(self) -> JSONObject:
        try:
            data = json.loads(os.environ.get(ENV_STATE, "{}"))
        except json.JSONDecodeError:
            data = {}
        return data if isinstance(data, dict) else {}

    def record(self, **facts: JSONValue) -> None:
        data = self.state()
        data.update(facts)
        os.environ[ENV_STATE] = json.dumps(data, sort_keys=True)


RUN = Run()


# ------------------------------------------------------------------------------ user settings
def check_overrides(raw: dict[str, object]) -> dict[str, object]:
    """The user's overrides, all of them profile overrides (validated when the profile is built).

    The former hook option ``kohya.clip_g_exclamation`` is refused with the override that replaces it.
    """
    for k, v in raw.items():
        if k in RENAMED_OPTIONS:
            key, values = RENAMED_OPTIONS[k]
            shown = json.dumps({key: values.get(str(v), "pad_id|text")})
            raise HookError(f"{k} is now the profile override {key} (pad_id = official, text = sd-scripts): use {shown}")
        if k.startswith("kohya."):
            raise HookError(f"unknown override {k!r}: the kohya hooks take profile overrides only (e.g. t5_max_length)")
    return dict(raw)


# ------------------------------------------------------------------------------------- profiles
def default_profile_name(arch: str, strategy: object = None) -> str:
    """The bundled profile for an sd-scripts architecture (SD: v2 from the tokenizer; Flux: the recorded variant)."""
    variant = None
    if arch == "sd":
        tok = getattr(strategy, "tokenizer", None)
        if tok is not None and getattr(tok, "pad_token_id", None) != getattr(tok, "eos_token_id", None):
            variant = "v2"  # sd-scripts' SD2 tokenizer pads with "!"
    elif arch == "flux":
        variant = RUN.state().get("flux_variant")
    return table.profile_name(arch, variant)


def profile_for(arch: str, strategy: object = None) -> AlignmentProfile:
    """The profile a hooked call of ``arch`` follows (explicit, else per architecture; overrides applied)."""
    name = RUN.explicit if RUN.explicit is not None else default_profile_name(arch, strategy)
    key = name.name if isinstance(name, AlignmentProfile) else f"{arch}:{name}"
    with RUN.lock:
        p = RUN.profiles.get(key)
        if p is None:
            if RUN.settings is None:  # used without install(): the environment's settings
                RUN.settings = settings()
            p = RUN.settings.profile(name)  # the one way in: source + TE_ALIGN_OVERRIDES + install() overrides
            RUN.profiles[key] = p
            logger.info(
                "te-align: kohya %s follows profile %s (fingerprint %s)%s", arch, p.name, p.fingerprint()[:12],
                f"; user overrides {json.dumps(RUN.overrides, sort_keys=True)}" if RUN.overrides else "",
            )
        RUN.last_profile = p
    return p


def with_clip_skip(p: AlignmentProfile, clip_skip: int | None) -> AlignmentProfile:
    """SD1/2: sd-scripts' ``--clip_skip N`` taken as a user override of the profile (logged once).

    sd-scripts reads ``hidden_states[-N]`` and applies the final layer norm (library/strategy_sd.py
    encode_tokens); a base model trained with clip skip (NovelAI-lineage SD1.5 fine-tunes) needs the
    same. An explicit layer override in ``TE_ALIGN_OVERRIDES`` wins over the flag.
    """
    if clip_skip in (None, 0, 1) or len(p.slots) != 1:
        return p
    slot = p.slots[0].name
    if any("layer" in k for k in RUN.overrides):
        RUN.once("clip_skip:ignored", "te-align: --clip_skip %s not used: the user override %s sets the layer", clip_skip,
                 json.dumps(RUN.overrides, sort_keys=True))
        return p
    key = f"{p.name}:{p.fingerprint()}:clip_skip={clip_skip}"
    with RUN.lock:
        q = RUN.profiles.get(key)
        if q is None:
            q = RUN.profiles[key] = p.with_overrides(kohya_lora.clip_skip_overrides(slot, int(clip_skip)))
            logger.info("te-align: --clip_skip %s taken as a user override of profile %s: hidden_states[-%s] + final layer "
                        "norm (fingerprint %s)", clip_skip, p.name, clip_skip, q.fingerprint()[:12])
    return q


def chunk_options(chunkable: bool, strategy: object) -> EncodeOptions:
    """sd-scripts' ``--max_token_length 150/225`` (SD1/2, SDXL: ``chunkable``) as te-align's long-prompt chunking.

    sd-scripts stitches its 75-token chunks into one n*75+2 sequence; te-align keeps each chunk's
    BOS/EOS (n*77, the NovelAI method), always n chunks so per-caption tokens collate.
    """
    ml = getattr(strategy, "max_length", None) or 77
    if chunkable and ml > 77:
        return _core.EncodeOptions(long_prompt_chunks=(ml - 2) // 75, pad_chunks=True)
    return _core.EncodeOptions()


def tokenize_strategy() -> object:
    """sd-scripts' registered tokenize strategy (``TokenizeStrategy.get_strategy()``), or None.

    None while sd-scripts' ``library.strategy_base`` is not imported: then no strategy was set either.
    """
    base = sys.modules.get("library.strategy_base")
    return None if base is None else base.TokenizeStrategy.get_strategy()
