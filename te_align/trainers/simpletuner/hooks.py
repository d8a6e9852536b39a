"""Runtime hooks for bghira/SimpleTuner: its per-model prompt encoding and its text-embed cache key, by a profile.

SimpleTuner (AGPL; read for facts only, nothing copied) encodes captions in one method per model class,
``<Model>._encode_prompts(self, prompts, is_negative_prompt=False)``, whose result the model's
``_format_text_embedding`` stores in the text-embed cache (``simpletuner/helpers/models/common.py:6044-6060``).
The hooks replace that method on each model class te-align profiles with one that calls :func:`te_align.encode`
and returns SimpleTuner's own tuple layout, so everything downstream is unchanged:

=========  ====================================================  =========================================
family     target (``simpletuner.helpers.models.…``)             returns (as the original)
=========  ====================================================  =========================================
SD 1.x/2.x ``sd1x.model.StableDiffusion1._encode_prompts``       prompt_embeds
SDXL       ``sdxl.model.SDXL._encode_prompts``                   (prompt_embeds, pooled_prompt_embeds)
SD3/3.5    ``sd3.model.SD3._encode_prompts``                     (prompt_embeds, pooled_prompt_embeds)
FLUX.1     ``flux.model.Flux._encode_prompts``                   (prompt_embeds, pooled, text_ids, T5 mask)
PixArt-Σ   ``pixart.model.PixartSigma._encode_prompts``          (prompt_embeds, prompt_attention_mask)
Chroma     ``chroma.model.Chroma._encode_prompts``               (prompt_embeds, prompt_attention_mask)
AuraFlow   ``auraflow.model.Auraflow._encode_prompts``           (prompt_embeds, prompt_attention_mask)
Sana       ``sana.model.Sana._encode_prompts``                   (prompt_embeds, prompt_attention_mask)
Lumina 2   ``lumina2.model.Lumina2._encode_prompts``             (prompt_embeds, prompt_attention_mask)
HiDream    ``hidream.model.HiDream._encode_prompts``             (T5 embeds, Llama embeds (layers, batch, …),
                                                                 pooled_prompt_embeds)
Qwen-Image ``qwen_image.model.QwenImage._encode_prompts``        (prompt_embeds, prompt_embeds_mask)
Wan        ``wan.model.Wan._encode_prompts``                     (prompt_embeds, the empty prompt's embeds)
=========  ====================================================  =========================================

Facts read at bghira/SimpleTuner@bc8e6ab7738ce457a2ed8eb2d26cadd91c6442cb (4.8.0); what the hooks fix there:
SD3's T5 is cut to 154 tokens unless ``i_know_what_i_am_doing`` (``sd3/model.py:848-865``; the pipeline uses
256), ``t5_padding: zero`` zeroes padded T5 outputs (``sd3/model.py:419-457``, ``flux/model.py``), PixArt's T5
length is ``min(tokenizer_max_length, 300)`` (``pixart/model.py``), AuraFlow's T5 is cut to 120 tokens unless
``i_know_what_i_am_doing`` (``auraflow/model.py``; the pipeline uses 256), Sana gets SimpleTuner's own
complex-human instruction (``field_registry/sana.py``; the pipeline has its own), Qwen-Image pads every caption
to 1024 tokens and keeps up to 1024 (``simpletuner/helpers/training/diffusers_overrides.py:618-690,878-954``
replaces diffusers' ``QwenImagePipeline._get_qwen_prompt_embeds``; the pipeline pads to the batch's longest and
cuts at 512). HiDream (``hidream/model.py:490-515``: all four at 128, T5 and Llama with their masks) and Wan
(``wan/model.py:1377-1398``) already encode as their pipelines. Qwen-Image's edit flavours (an image in the
prompt) are not hooked: te-align has no Qwen-Image-Edit profile; their encoding is left to SimpleTuner.

The cache: ``TextEmbeddingCache.create_hash`` names a cached embed ``md5(caption)-<model_type>.pt``
(``simpletuner/helpers/caching/text_embeds.py:139-154``) — nothing about lengths, masks or layers, so a changed
setting silently reuses stale files. Hooked, the name gets ``-ta<fingerprint>``: files made under another
profile (or without te-align) are not found, are re-encoded, and ``compute_embeddings_for_prompts`` logs how
many were stale.

Profile: ``SimpleTunerHook(profile=…)`` / ``install(profile=…)`` / ``TE_ALIGN_PROFILE``, else per model from its
config (``model_family``, ``model_flavour``, ``pretrained_model_name_or_path``), as ``te-align check`` reads a
SimpleTuner config. Overrides: ``TE_ALIGN_OVERRIDES`` (a JSON object) and ``install(**overrides)`` over it, as for
every trainer's hooks (:func:`te_align.hooks.base.settings`). ``TE_ALIGN=off`` leaves SimpleTuner unmodified.

Enabling (no file of SimpleTuner is changed): ``simpletuner train`` and ``simpletuner server`` start training in
new Python processes (``accelerate launch …/train.py``; ``simpletuner/cli/train.py:277-312``), which inherit the
environment. :func:`boot_env` / ``python -m te_align.hooks.simpletuner env`` give the two variables that make
every such process install these hooks when SimpleTuner's modules import (``boot/`` of this folder).
"""

from __future__ import annotations

import contextvars
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Protocol

from te_align._lazy import lazy_module
from te_align.hooks.base import (
    ENV_PROFILE,
    ENV_SWITCH,
    Hook,
    HookError,
    Lifecycle,
    Settings,
    Target,
    hooks_disabled,
    mark_wrapper,
)
from te_align.trainers.simpletuner.audit import guess_profile

# imported on first use: keeps torch off this module's import (te-align patch and check read it)
_encoding_core = lazy_module("te_align.encoding.core")

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedTokenizerBase

    from te_align.encoding import core as _core
    from te_align.hooks.base import ProfileSource
    from te_align.profiles import AlignmentProfile
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")

logger = logging.getLogger("te_align")

COMMIT = "bc8e6ab7738ce457a2ed8eb2d26cadd91c6442cb"
#: Set (to anything but an off word) by :func:`boot_env`: the boot module installs the hooks in every process.
ENV_BOOT = "TE_ALIGN_SIMPLETUNER"
_M = "simpletuner.helpers.models"
_CACHE = "simpletuner.helpers.caching.text_embeds"
ENCODE_PARAMS = ("self", "prompts", "is_negative_prompt")


class _Model(Protocol):
    """What the hooks read directly of a SimpleTuner model (``ModelFoundation``); the rest by ``getattr``."""

    tokenizers: list[PreTrainedTokenizerBase | None] | None
    text_encoders: list[torch.nn.Module | None] | None

    def load_text_encoder(self) -> None: ...


class _Cache(Protocol):
    """What the hooks read directly of SimpleTuner's ``TextEmbeddingCache``: its data backend's id."""

    id: str


@dataclass(frozen=True)
class Family:
    """One SimpleTuner model class: its module, class, and how its ``_encode_prompts`` result is laid out."""

    module: str
    cls: str
    #: profile families this class trains
    families: tuple[str, ...]
    #: what the original returns, in order: profile output names, "t5_mask" (the T5 tokenizer mask),
    #: "NAME@batch" (a shared profile output repeated over the batch, float32), "NAME@empty" (NAME of the empty
    #: negative prompt, once per prompt) or "NAME?" (the original returns None where every position is real;
    #: the hook always returns the tensor: SimpleTuner's collate pairs cached masks by position, so a None among
    #: tensors would misalign them)
    returns: tuple[str, ...]
    #: a method of the model that returns True where the original must run (te-align has no profile for it)
    passthrough: str = ""
    #: a config attribute holding the dtype the original casts the ``cast_outputs`` to (when set)
    cast: str = ""
    cast_outputs: tuple[str, ...] = ()
    #: the original loads the text encoders when none are loaded and moves the first to the accelerator's device
    loads_encoders: bool = False

    def passes(self, model: object) -> bool:
        check = getattr(model, self.passthrough, None) if self.passthrough else None
        return bool(check()) if callable(check) else False

    @property
    def target_label(self) -> str:
        return f"{self.module}.{self.cls}._encode_prompts"


FAMILIES: dict[str, Family] = {
    "sd1x": Family(f"{_M}.sd1x.model", "StableDiffusion1", ("sd1", "sd2"), ("prompt_embeds",)),
    "sdxl": Family(f"{_M}.sdxl.model", "SDXL", ("sdxl",), ("prompt_embeds", "pooled_prompt_embeds")),
    "sd3": Family(f"{_M}.sd3.model", "SD3", ("sd3",), ("prompt_embeds", "pooled_prompt_embeds")),
    # text_ids: SimpleTuner's FluxPipeline.encode_prompt returns zeros(batch, seq, 3) float32
    # (simpletuner/helpers/models/flux/pipeline.py:1221-1223), the diffusers pipeline (seq, 3)
    "flux": Family(f"{_M}.flux.model", "Flux", ("flux",), ("prompt_embeds", "pooled_prompt_embeds", "text_ids@batch",
                                                            "t5_mask")),
    "pixart": Family(f"{_M}.pixart.model", "PixartSigma", ("pixart",), ("prompt_embeds", "prompt_attention_mask")),
    "chroma": Family(f"{_M}.chroma.model", "Chroma", ("chroma",), ("prompt_embeds", "prompt_attention_mask")),
    "auraflow": Family(f"{_M}.auraflow.model", "Auraflow", ("auraflow",), ("prompt_embeds", "prompt_attention_mask")),
    "sana": Family(f"{_M}.sana.model", "Sana", ("sana",), ("prompt_embeds", "prompt_attention_mask")),
    "lumina2": Family(f"{_M}.lumina2.model", "Lumina2", ("lumina2",), ("prompt_embeds", "prompt_attention_mask")),
    # the pipeline call gets dtype=config.base_weight_dtype (hidream/model.py:490-515): the T5 and CLIP outputs
    # are cast to it, the Llama layers are not (hidream/pipeline.py:930-1115)
    "hidream": Family(f"{_M}.hidream.model", "HiDream", ("hidream",), ("prompt_embeds_t5", "prompt_embeds_llama3",
                                                                       "pooled_prompt_embeds"),
                      cast="base_weight_dtype", cast_outputs=("prompt_embeds_t5", "pooled_prompt_embeds")),
    # SimpleTuner replaces diffusers' QwenImagePipeline._get_qwen_prompt_embeds: every caption padded to 1024
    # tokens (+34 template tokens into the encoder), kept up to 1024 (the pipeline's __call__: batch longest,
    # cut to 512) (simpletuner/helpers/training/diffusers_overrides.py:618-690,878-954); encode_prompt then
    # returns mask None when all 1024 are real (diffusers 0.42.1 pipelines/qwenimage/pipeline_qwenimage.py:265-266)
    "qwen_image": Family(f"{_M}.qwen_image.model", "QwenImage", ("qwen-image",),
                         ("prompt_embeds", "prompt_embeds_mask?"),
                         # edit flavours encode the caption with its image (qwen_image/model.py:507-549, 982-983)
                         passthrough="requires_text_embed_image_context", loads_encoders=True),
    # Wan's second value is not a mask: SimpleTuner's WanPipeline.encode_prompt returns (prompt_embeds,
    # negative_prompt_embeds) with classifier-free guidance on, i.e. the empty prompt's embeds per prompt
    # (simpletuner/helpers/models/wan/model.py:1390-1398, wan/pipeline.py:211-259); cached as "attention_masks"
    "wan": Family(f"{_M}.wan.model", "Wan", ("wan",), ("prompt_embeds", "prompt_embeds@empty")),
}
#: SimpleTuner ``model_family`` values -> key of :data:`FAMILIES`.
MODEL_FAMILY = {"sd1x": "sd1x", "sd2x": "sd1x", "sdxl": "sdxl", "sd3": "sd3", "flux": "flux", "pixart_sigma": "pixart",
                "pixart": "pixart", "chroma": "chroma", "auraflow": "auraflow", "sana": "sana", "lumina2": "lumina2",
                "hidream": "hidream", "qwen_image": "qwen_image", "wan": "wan"}

#: The SimpleTuner versions the targets were read and verified against.
SUPPORTED: dict[str, str] = {"4.8.0": f"SimpleTuner 4.8.0 ({COMMIT[:7]})"}


def detect_version() -> str:
    import re

    spec = importlib.util.find_spec("simpletuner")
    if spec is None or not spec.origin:
        return "not importable"
    try:
        text = Path(spec.origin).read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M)
    return m.group(1) if m else "unknown"


# ------------------------------------------------------------------------------ state
@dataclass
class _State:
    profiles: dict[int, AlignmentProfile] = field(default_factory=dict)
    stale: dict[str, set[str]] = field(default_factory=dict)
    logged: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_BYPASS: contextvars.ContextVar[bool] = contextvars.ContextVar("te_align_simpletuner_bypass", default=False)


def _profile_name_for(config: object) -> str:
    """The bundled profile for a SimpleTuner model config (as ``te-align check`` reads the config)."""
    values = {k: getattr(config, k, None) for k in ("model_family", "model_flavour", "pretrained_model_name_or_path")}
    name, why = guess_profile(values)
    if name is None:
        raise HookError(f"te-align has no profile for SimpleTuner {why}; set {ENV_PROFILE} or run with {ENV_SWITCH}=off")
    return name


def _components(model: _Model) -> tuple[dict[str, PreTrainedTokenizerBase], dict[str, torch.nn.Module]]:
    """SimpleTuner's ``tokenizers`` / ``text_encoders`` lists (TEXT_ENCODER_CONFIGURATION order) by diffusers name."""
    toks: dict[str, PreTrainedTokenizerBase] = {}
    encs: dict[str, torch.nn.Module] = {}
    for i, (tok, enc) in enumerate(zip(model.tokenizers or [], model.text_encoders or [], strict=False)):
        suffix = "" if i == 0 else f"_{i + 1}"
        if tok is not None:
            toks["tokenizer" + suffix] = tok
        if enc is not None:
            encs["text_encoder" + suffix] = enc
    return toks, encs


# ------------------------------------------------------------------------------ the hook
@dataclass
class SimpleTunerHook(Hook):
    """``_encode_prompts`` of the :data:`FAMILIES` present (``families``) and the text-embed cache key (``cache``)."""

    name: ClassVar[str] = "SimpleTuner"
    supported: ClassVar[dict[str, str]] = SUPPORTED

    profile: ProfileSource = None
    families: tuple[str, ...] = tuple(FAMILIES)
    cache: bool = True
    state: _State = field(default_factory=_State)

    def detect_version(self) -> str:
        return detect_version()

    def targets(self) -> Sequence[Target]:
        out = [Target(FAMILIES[f].module, f"{FAMILIES[f].cls}._encode_prompts", ENCODE_PARAMS, self._wrap_encode(f))
               for f in self.families]
        if self.cache:
            out += [
                Target(_CACHE, "TextEmbeddingCache.create_hash", ("self", "key_value", "prompt"), self._wrap_hash),
                Target(_CACHE, "TextEmbeddingCache.hash_prompt_with_path", ("self", "prompt_record"),
                       self._wrap_path),
                Target(_CACHE, "TextEmbeddingCache.compute_embeddings_for_prompts", ("self", "all_prompts"),
                       self._wrap_compute),
            ]
        return out

    # -- profile -------------------------------------------------------------------------------
    def configure(self, settings: Settings) -> None:
        super().configure(settings)
        if settings.source is not None:  # install(profile=…) / TE_ALIGN_PROFILE: the profile of every model
            self.profile = settings.source
        with self.state.lock:
            self.state.profiles.clear()

    def _given(self) -> AlignmentProfile | None:
        """The profile the user chose for every model (this hook's ``profile``, else ``TE_ALIGN_PROFILE`` / the
        install argument), with the user's overrides; None: each model's own."""
        user = self.user
        if self.profile is not None:
            return Settings(self.profile, user.layers).profile()
        return user.profile() if user.source is not None else None

    def profile_for(self, model: object, family: str) -> AlignmentProfile:
        key = id(model)
        prof = self.state.profiles.get(key)
        if prof is not None:
            return prof
        prof = self._given()
        if prof is None:  # the model's own, with TE_ALIGN_OVERRIDES / install() overrides (the one way in)
            prof = self.user.profile(_profile_name_for(getattr(model, "config", None)))
        fam = FAMILIES[family]
        if prof.family not in fam.families:
            raise HookError(f"profile {prof.name} is a {prof.family} profile, but SimpleTuner's {fam.cls} trains "
                            f"{'/'.join(fam.families)}; pick a matching profile ({ENV_PROFILE})")
        with self.state.lock:
            self.state.profiles[key] = prof
        self._once(f"profile:{prof.name}", "te-align: SimpleTuner %s encodes prompts by profile %s (fingerprint %s)",
                   fam.cls, prof.name, prof.fingerprint()[:16])
        return prof

    def _once(self, key: str, msg: str, *args: object) -> None:
        with self.state.lock:
            if key in self.state.logged:
                return
            self.state.logged.add(key)
        logger.info(msg, *args)

    # -- wrappers ------------------------------------------------------------------------------
    def _wrap_encode(self, family: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
        fam = FAMILIES[family]

        def wrap(original: Callable[..., object]) -> Callable[..., object]:
            def _encode_prompts(
                model: _Model,
                prompts: str | Sequence[str],
                is_negative_prompt: bool = False,
                *args: object,
                **kw: object,
            ) -> object:
                if _BYPASS.get():
                    return original(model, prompts, is_negative_prompt, *args, **kw)
                if fam.passes(model):
                    self._once(f"passthrough:{fam.cls}", "te-align: SimpleTuner %s model_flavour %r encodes prompts "
                               "with an image; te-align has no profile for that, SimpleTuner's own encoding runs",
                               fam.cls, getattr(getattr(model, "config", None), "model_flavour", None))
                    return original(model, prompts, is_negative_prompt, *args, **kw)
                prof = self.profile_for(model, family)
                padding = getattr(getattr(model, "config", None), "t5_padding", None)
                if padding not in (None, "unmodified"):
                    self._once("t5_padding", "te-align: SimpleTuner t5_padding=%r is not applied; profile %s decides "
                               "the padded T5 outputs (masks.zero_padded)", padding, prof.name)
                return encode_as(prof, fam, model, prompts, negative=bool(is_negative_prompt))

            return mark_wrapper(_encode_prompts, original)

        return wrap

    def _suffix(self, cache: object) -> str:
        model = getattr(cache, "model", None)
        prof = None
        if model is not None:
            fam = MODEL_FAMILY.get(str(getattr(getattr(model, "config", None), "model_family", "")))
            if fam is not None and fam in self.families:
                if FAMILIES[fam].passes(model):
                    return ""
                prof = self.profile_for(model, fam)
        if prof is None:
            prof = self._given()
        return "" if prof is None else f"-ta{prof.fingerprint()[:16]}"

    def _wrap_hash(self, original: Callable[..., str]) -> Callable[..., str]:
        def create_hash(
            cache: object, key_value: object, prompt: object = None, *args: object, **kw: object
        ) -> str:
            return original(cache, key_value, prompt, *args, **kw) + self._suffix(cache)

        return mark_wrapper(create_hash, original)

    def _wrap_path(self, original: Callable[..., str]) -> Callable[..., str]:
        def hash_prompt_with_path(cache: _Cache, prompt_record: object, *args: object, **kw: object) -> str:
            path = original(cache, prompt_record, *args, **kw)
            suffix = self._suffix(cache)
            if suffix and path.endswith(suffix + ".pt"):
                old = path[: -len(suffix + ".pt")] + ".pt"
                if old in _existing(cache) and path not in _existing(cache):
                    with self.state.lock:
                        self.state.stale.setdefault(str(getattr(cache, "cache_dir", "")), set()).add(old)
            return path

        return mark_wrapper(hash_prompt_with_path, original)

    def _wrap_compute(self, original: Callable[..., object]) -> Callable[..., object]:
        def compute_embeddings_for_prompts(
            cache: object, all_prompts: object, *args: object, **kw: object
        ) -> object:
            result = original(cache, all_prompts, *args, **kw)
            where = str(getattr(cache, "cache_dir", ""))
            with self.state.lock:
                n = len(self.state.stale.get(where, ()))
            if n:
                self._once(f"stale:{where}:{n}", "te-align: %d cached text embeds in %s were made under another "
                           "profile (or without te-align); they are re-encoded under %s", n, where, self._suffix(cache)[1:])
            return result

        return mark_wrapper(compute_embeddings_for_prompts, original)

    @property
    def stale_count(self) -> int:
        with self.state.lock:
            return sum(len(v) for v in self.state.stale.values())


def _existing(cache: _Cache) -> set[str]:
    """The cache files SimpleTuner knows exist for this backend (its own ``StateTracker`` list)."""
    tracker = getattr(sys.modules.get(type(cache).__module__), "StateTracker", None)
    if tracker is None:
        return set()
    try:
        files = tracker.get_text_cache_files(data_backend_id=cache.id) or {}
    except Exception:  # SimpleTuner's tracker without a backend registered: nothing is known to exist
        return set()
    return set(files)


def encode_as(
    profile: AlignmentProfile,
    fam: Family,
    model: _Model,
    prompts: str | Sequence[str],
    negative: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """:func:`te_align.encode` with SimpleTuner's model components, in the original's return layout
    (``negative``: SimpleTuner's validation negative prompt, encoded with the profile's negative template)."""
    batch = [prompts] if isinstance(prompts, str) else [str(p) for p in prompts]
    device = getattr(getattr(model, "accelerator", None), "device", None)
    if fam.loads_encoders:  # as the original does first (qwen_image/model.py:518-526)
        if not model.text_encoders:
            model.load_text_encoder()
        first = model.text_encoders[0]
        if device is not None and getattr(first, "device", device) != device:
            first.to(device)
    toks, encs = _components(model)
    out = _encoding_core.encode(profile, batch, tokenizers=toks, text_encoders=encs, negative=negative)
    dtype = getattr(getattr(model, "config", None), fam.cast, None) if fam.cast else None
    values: list[torch.Tensor] = []
    for name in fam.returns:
        if name.endswith("?"):
            value = out[name[:-1]]
        elif name.endswith("@empty"):
            value = _encoding_core.encode(profile, [""] * len(batch), tokenizers=toks, text_encoders=encs,
                                    negative=True)[name.split("@", 1)[0]]
        elif name == "t5_mask":
            slot = profile.slot("t5")
            value = _core.tokenize_slot(slot, toks[slot.tokenizer_subfolder], batch, negative=negative)[1]
        elif name.endswith("@batch"):
            import torch

            shared = out[name.split("@", 1)[0]]
            value = shared.to(torch.float32).unsqueeze(0).repeat(len(batch), *([1] * shared.dim()))
        else:
            value = out[name]
        if dtype is not None and name in fam.cast_outputs:
            value = value.to(dtype)
        values.append(value.to(device) if device is not None else value)
    return values[0] if len(values) == 1 else tuple(values)


# ------------------------------------------------------------------------------ module-level API
LIFECYCLE = Lifecycle("SimpleTuner", SimpleTunerHook)


def install(
    profile: ProfileSource = None,
    *,
    families: Sequence[str] | None = None,
    cache: bool = True,
    **overrides: object,
) -> bool:
    """Install the hooks (all targets or none). False when ``TE_ALIGN=off``.

    ``profile``: for every model (default ``TE_ALIGN_PROFILE``, else each model's own from its config);
    ``overrides``: profile overrides over ``TE_ALIGN_OVERRIDES``; ``families``: the :data:`FAMILIES` keys hooked;
    ``cache``: the text-embed cache key too. The lifecycle is :class:`te_align.hooks.base.Lifecycle`."""
    return LIFECYCLE.install(profile, overrides, families=tuple(families or FAMILIES), cache=cache)


def uninstall() -> None:
    LIFECYCLE.uninstall()


def current() -> SimpleTunerHook | None:
    return LIFECYCLE.current()  # type: ignore[return-value]


# ------------------------------------------------------------------------------ boot (every process)
def boot_dir() -> Path:
    """The folder with the ``sitecustomize`` that installs the hooks in every SimpleTuner process."""
    boot = Path(__file__).with_name("boot")
    if not (boot / "sitecustomize.py").is_file():
        raise HookError("te-align's SimpleTuner boot files are missing from this installation (reinstall te-align)")
    return boot


def boot_env(environ: dict[str, str] | None = None, profile: str | None = None) -> dict[str, str]:
    """The environment variables that enable the hooks in ``simpletuner train`` / ``simpletuner server``."""
    env = dict(os.environ if environ is None else environ)
    path = str(boot_dir())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != path]
    out = {"PYTHONPATH": os.pathsep.join([path, *parts]), ENV_BOOT: "1"}
    if profile:
        out[ENV_PROFILE] = profile
    return out


class _AfterImport(importlib.abc.MetaPathFinder):
    """Installs the hooks right after SimpleTuner's text-embed cache module is imported (each process)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _CACHE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module  # type: ignore[union-attr]

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            _boot_install()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        return spec


def _boot_install() -> None:
    for f in list(sys.meta_path):
        if isinstance(f, _AfterImport):
            sys.meta_path.remove(f)
    # every model module te-align hooks, imported now so the install is all-or-nothing
    present = tuple(k for k, fam in FAMILIES.items() if importlib.util.find_spec(fam.module) is not None)
    install(profile=_PINNED[0] if _PINNED else None, families=present)


_PINNED: list[str] = []


def boot(force: bool = False, profile: str | None = None) -> None:
    """Arm the hooks for this process: they install when SimpleTuner's text-embed cache module is imported.

    Called by ``boot/sitecustomize.py`` of this folder at interpreter start when :data:`ENV_BOOT` is set,
    and (``force=True``, with the profile ``te-align patch --profile`` pinned) by the block ``te-align patch``
    appends to a checkout's ``simpletuner/__init__.py``."""
    if hooks_disabled():
        return
    if not force and os.environ.get(ENV_BOOT, "").strip().lower() in ("", "off", "0", "false", "no", "disabled"):
        return
    if profile and not os.environ.get(ENV_PROFILE):
        _PINNED[:] = [profile]
    if _CACHE in sys.modules:
        _boot_install()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m te_align.hooks.simpletuner env [PROFILE]``: shell lines that enable the hooks."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "env" or len(args) > 2:
        print("usage: python -m te_align.hooks.simpletuner env [PROFILE]   "
              '(then: eval "$(python -m te_align.hooks.simpletuner env)"; simpletuner train …)', file=sys.stderr)
        return 2
    import shlex

    for k, v in boot_env(profile=args[1] if len(args) == 2 else None).items():
        print(f"export {k}={shlex.quote(v)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
