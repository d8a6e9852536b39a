"""Runtime hooks for tdrussell/diffusion-pipe: each model's text-encoder functions by a profile, and the profile's
fingerprint in its text-embedding cache.

diffusion-pipe asks each model class for one function per text encoder (``<Pipeline>.get_call_text_encoder_fn(self,
text_encoder) -> fn(caption, is_video[, control_file]) -> {name: tensor}``, models/<type>.py) and caches what they
return. The hooks (read and verified at tdrussell/diffusion-pipe@8f83dbf) replace ``get_call_text_encoder_fn`` of the
:data:`FAMILIES` with one whose functions encode the same slot by the profile (:func:`te_align.encoding.core.
encode_slot`) and return diffusion-pipe's own names and layout, so ``prepare_inputs`` combines them as before; and
``utils.dataset._map_and_cache`` adds ``te-align:<fingerprint>`` to the text-embedding cache's fingerprint arguments,
so a cache made without te-align (or under another profile) is cleared and encoded again, as diffusion-pipe does for
any changed fingerprint (utils/cache.py:38-60).

Hooked: FLUX.1 (dev, schnell: T5 at the profile's 256 instead of 512), SD3/3.5, Chroma, Lumina 2 (the profile's
system prompt; a ``caption_prefix`` up to ``<Prompt Start> `` is taken as an earlier way of writing it and replaced),
Qwen-Image (512 tokens instead of 1024; the edit variant's image prompts run unmodified) and AuraFlow. Not hooked
(``te-align check`` names their deviations): SDXL (encoded live from its own ids, models/sdxl.py), HiDream, Wan,
HunyuanImage-2.1, Anima.

Activation: :func:`boot` (the drop-in ``train.py`` that ``te-align patch`` writes calls it with the training TOML)
installs the hooks when the model's module is imported. Profile: ``install(profile=…)`` / ``TE_ALIGN_PROFILE``, else
the model type's, with the variant from its files (as ``te-align check`` reads them); overrides: ``TE_ALIGN_OVERRIDES``
and ``install(**overrides)`` (:mod:`te_align.hooks.base`). ``TE_ALIGN=off`` leaves diffusion-pipe unmodified.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from te_align._git import git_head
from te_align._lazy import lazy_module
from te_align.hooks.base import (
    Hook,
    HookError,
    Lifecycle,
    Target,
    after_import,
    hooks_disabled,
    log_to_console,
    mark_wrapper,
)
from te_align.profiles.overrides import env_profile
from te_align.trainers.diffusion_pipe import names
from te_align.trainers.diffusion_pipe.audit import COMMIT, FINGERPRINT_TAG, LUMINA_START, _variant

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from te_align.encoding import core as _core
    from te_align.encoding.core import SlotResult
    from te_align.hooks.base import ProfileSource
    from te_align.profiles import AlignmentProfile
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")

logger = logging.getLogger("te_align")

SUPPORTED: dict[str, str] = {COMMIT: "diffusion-pipe 8f83dbf (main)"}
#: One output of a text-encoder function: a tensor, each caption's rows (``rows``), or None.
Output: TypeAlias = "torch.Tensor | list[torch.Tensor] | None"
#: diffusion-pipe's function per text encoder, ``fn(caption, is_video[, control_file]) -> {name: output}``.
EncoderFn = Callable[..., dict[str, Output]]


@dataclass(frozen=True)
class Family:
    """One hooked model type: per text-encoder attribute (and the tokenizer attribute that goes with it),
    diffusion-pipe's output names -> (profile slot, result field: ``hidden``, ``pooled``, ``mask`` or ``rows``: each
    caption's real tokens)."""

    type: str
    profile_family: str
    encoders: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...]
    #: encoder attribute -> tokenizer attribute where it is not the profile slot's own folder name (Chroma: the T5 of
    #: a FLUX.1 diffusers folder, models/chroma.py:143,201-219)
    tokenizers: tuple[tuple[str, str], ...] = ()


FAMILIES: dict[str, Family] = {f.type: f for f in (
    Family("flux", "flux", (("text_encoder", (("clip_embed", "clip_l", "pooled"),)),
                            ("text_encoder_2", (("t5_embed", "t5", "hidden"),)))),
    Family("sd3", "sd3", (("text_encoder", (("prompt_embed", "clip_l", "hidden"), ("pooled_prompt_embed", "clip_l", "pooled"))),
                          ("text_encoder_2", (("prompt_2_embed", "clip_g", "hidden"), ("pooled_prompt_2_embed", "clip_g", "pooled"))),
                          ("text_encoder_3", (("t5_prompt_embed", "t5", "hidden"),)))),
    Family("chroma", "chroma", (("text_encoder_2", (("t5_embed", "t5", "hidden"), ("t5_attention_mask", "t5", "mask"))),),
           tokenizers=(("text_encoder_2", "tokenizer_2"),)),
    Family("lumina_2", "lumina2", (("text_encoder", (("prompt_embeds", "gemma", "hidden"), ("prompt_masks", "gemma", "mask"))),)),
    Family("qwen_image", "qwen-image", (("text_encoder", (("prompt_embeds", "qwen", "rows"),)),)),
    Family("auraflow", "auraflow", (("text_encoder", (("prompt_embeds", "t5", "hidden"),)),)),
)}


@dataclass
class DiffusionPipeHook(Hook):
    """``get_call_text_encoder_fn`` of ``types`` (the :data:`FAMILIES` keys) and the text-embedding cache key."""

    name: ClassVar[str] = "diffusion-pipe"
    supported: ClassVar[dict[str, str]] = SUPPORTED

    types: tuple[str, ...] = tuple(FAMILIES)
    cache: bool = True
    #: the profile of the model whose encoders were asked for last (the cache fingerprint)
    active: AlignmentProfile | None = field(default=None, repr=False)

    def targets(self) -> Sequence[Target]:
        out = []
        for t in self.types:
            mt = names.BY_TYPE[t]
            out.append(Target(f"models.{mt.module}", f"{mt.cls}.get_call_text_encoder_fn", ("self", "text_encoder"),
                              wrap=self._wrap(FAMILIES[t])))
        if self.cache:
            out.append(Target("utils.dataset", "_map_and_cache",
                              ("dataset", "map_fn", "cache_dir", "cache_file_prefix", "new_fingerprint_args",
                               "regenerate_cache", "caching_batch_size"), wrap=self._map_and_cache))
        return out

    def detect_version(self) -> str:
        mod = sys.modules.get("utils.dataset")
        path = getattr(mod, "__file__", None) if mod is not None else None
        if not path:
            return "unknown (diffusion-pipe's utils.dataset not imported)"
        root = Path(path).resolve().parent.parent
        head = git_head(root)
        return (self.supported.get(head, head[:7]) if head else "unknown (no git)") + f" at {root}"

    # -- profiles ------------------------------------------------------------------------------
    def profile(self, fam: Family, model: object) -> AlignmentProfile:
        """The profile of a model object (the user's, else its type's with the variant its files name)."""
        mt = names.BY_TYPE[fam.type]
        config = getattr(model, "model_config", None)
        default = _variant(mt, dict(config) if isinstance(config, dict) else {})[0] if self.user.source is None else None
        p = self.user.profile(default)
        if p.family != fam.profile_family:
            raise HookError(f"te-align: diffusion-pipe's {mt.display} encodes {fam.profile_family} prompts but the "
                            f"profile '{p.name}' is for {p.family}")
        return p

    # -- wrappers ------------------------------------------------------------------------------
    def _wrap(self, fam: Family) -> Callable[[Callable[..., EncoderFn]], Callable[..., EncoderFn]]:
        def wrap(original: Callable[..., EncoderFn]) -> Callable[..., EncoderFn]:
            def get_call_text_encoder_fn(model: object, text_encoder: object) -> EncoderFn:
                fn = original(model, text_encoder)
                outputs = next((outs for attr, outs in fam.encoders
                                if _component(model, attr) is text_encoder), None)
                if outputs is None:
                    return fn
                p = self.profile(fam, model)
                self.active = p
                self._once(f"{fam.type}:{p.fingerprint()}", "te-align: diffusion-pipe %s encodes captions by profile %s "
                           "(fingerprint %s)", fam.type, p.name, p.fingerprint())
                attr = next(a for a, outs in fam.encoders if outs is outputs)
                return _encoder_fn(self, fam, model, p, outputs, fn, attr)

            return mark_wrapper(get_call_text_encoder_fn, original)

        return wrap

    def _map_and_cache(self, original: Callable[..., object]) -> Callable[..., object]:
        def _map_and_cache(
            dataset: object,
            map_fn: object,
            cache_dir: object,
            cache_file_prefix: str = "",
            new_fingerprint_args: Sequence[object] | None = None,
            *args: object,
            **kw: object,
        ) -> object:
            if self.active is not None and str(cache_file_prefix).startswith("text_embeddings_"):
                new_fingerprint_args = [*(new_fingerprint_args or []), FINGERPRINT_TAG + self.active.fingerprint()]
            return original(dataset, map_fn, cache_dir, cache_file_prefix, new_fingerprint_args, *args, **kw)

        return mark_wrapper(_map_and_cache, original)

    def _once(self, key: str, msg: str, *args: object) -> None:
        logged = self.__dict__.setdefault("_logged", set())
        if key not in logged:
            logged.add(key)
            logger.info(msg, *args)


def _component(model: object, name: str) -> Any:
    """``model.<name>`` (a tokenizer or a text encoder, whatever the model class holds; None: it has none)."""
    try:
        return getattr(model, name)
    except (AttributeError, RuntimeError):
        return None


def _encoder_fn(hook: DiffusionPipeHook, fam: Family, model: object, profile: AlignmentProfile,
                outputs: tuple[tuple[str, str, str], ...], original_fn: EncoderFn, attr: str) -> EncoderFn:
    """The text-encoder function diffusion-pipe calls, encoding by the profile (same arity as the original: the
    caching code counts its parameters for the control-file argument, utils/dataset.py:1150-1153)."""

    def encode(
        caption: Sequence[str], is_video: object, control_file: Sequence[object] | None = None
    ) -> dict[str, Output]:
        import torch

        if control_file is not None and any(c is not None for c in control_file):
            return original_fn(caption, is_video, control_file)  # an edit model's image prompt: no profile
        texts = [str(c) for c in caption]
        if fam.type == "lumina_2":
            texts = [_without_prompt_start(hook, t) for t in texts]
        results: dict[str, SlotResult] = {}
        out: dict[str, Output] = {}
        for name, slot_name, what in outputs:
            if slot_name not in results:
                slot = profile.slot(slot_name)
                tok_attr = dict(fam.tokenizers).get(attr, slot.tokenizer_subfolder)
                tok, enc = _component(model, tok_attr), _component(model, attr)
                device = next(enc.parameters()).device
                with torch.no_grad():
                    results[slot_name] = _core.encode_slot(profile, slot, tok, enc, texts, device=device)
            res = results[slot_name]
            if what == "rows":
                counts = [int(m) for m in res.denoiser_mask.sum(dim=1)] if res.denoiser_mask is not None else res.token_counts
                out[name] = [h[:n] for h, n in zip(res.hidden, counts, strict=True)]
            else:
                out[name] = getattr(res, what)
        return out

    if len(inspect.signature(original_fn).parameters) == 3:
        return encode

    def encode2(caption: Sequence[str], is_video: object) -> dict[str, Output]:
        return encode(caption, is_video)

    return encode2


def _without_prompt_start(hook: DiffusionPipeHook, text: str) -> str:
    """A Lumina caption with a ``caption_prefix`` up to ``<Prompt Start> ``: the caption alone (the profile's
    template adds its system prompt)."""
    marker = LUMINA_START.lstrip()
    if marker in text:
        hook._once("lumina:prefix", "te-align: diffusion-pipe captions start with a caption_prefix up to '%s'; the "
                   "profile's system prompt takes its place", marker.strip())
        return text.split(marker, 1)[1]
    return text


# ------------------------------------------------------------------------------------ install
LIFECYCLE = Lifecycle("diffusion-pipe", DiffusionPipeHook, console=log_to_console)


def install(
    profile: ProfileSource = None,
    *,
    types: Sequence[str] | None = None,
    cache: bool = True,
    **overrides: object,
) -> bool:
    """Install the hooks for ``types`` (default every hooked model type; all targets or none). False under
    ``TE_ALIGN=off``."""
    return LIFECYCLE.install(profile, overrides, types=tuple(types or FAMILIES), cache=cache)


def uninstall() -> None:
    LIFECYCLE.uninstall()


def is_installed() -> bool:
    return LIFECYCLE.is_installed()


def current() -> DiffusionPipeHook | None:
    return LIFECYCLE.current()  # type: ignore[return-value]


def model_type(argv: Sequence[str]) -> tuple[str | None, str]:
    """The ``[model] type`` of the training TOML in ``argv`` (``--config PATH``), and the path."""
    from te_align import _toml as tomllib

    args = list(argv)
    path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if path is None and "--config" in args and args.index("--config") + 1 < len(args):
        path = args[args.index("--config") + 1]
    if not path:
        return None, ""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None, path
    model = data.get("model")
    return (str(model.get("type")) if isinstance(model, dict) and model.get("type") else None), path


def boot(profile: str | None = None, argv: Sequence[str] | None = None) -> bool:
    """Arm the hooks for the run in ``argv`` (default ``sys.argv``; the drop-in ``train.py`` calls this): they install
    when the model type's module is imported. Returns whether they will."""
    import os

    log_to_console()
    if hooks_disabled():
        logger.info("te-align: diffusion-pipe hooks disabled by TE_ALIGN=%s; diffusion-pipe runs unmodified",
                    os.environ.get("TE_ALIGN"))
        return False
    mt_name, path = model_type(list(sys.argv if argv is None else argv))
    if mt_name not in FAMILIES:
        why = (f"te-align's hooks do not reach model type {mt_name!r}" if mt_name else
               f"no [model] type in {path!r}" if path else "no --config")
        logger.info("te-align: not active in this diffusion-pipe process (%s); diffusion-pipe runs unmodified", why)
        return False
    chosen = env_profile() or profile

    def go() -> None:
        install(chosen, types=(mt_name,))

    after_import(f"models.{names.BY_TYPE[mt_name].module}", go)
    return True
