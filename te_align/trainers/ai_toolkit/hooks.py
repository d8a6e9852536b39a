"""Runtime hooks for ostris ai-toolkit: its prompt encoders run by an alignment profile.

Two layouts are supported: the current checkout (top-level ``toolkit`` package, run from the
repository root) and the PyPI packaging ``ostris-ai-toolkit`` (``ostris_ai_toolkit.toolkit``).
Targets, each replaced by a wrapper that calls :func:`te_align.encode` and returns what the original
returned (verified against ai-toolkit 0.12.26 at 27a03a9 and ostris-ai-toolkit 0.2.7):

* ``train_tools``: ``encode_prompts`` (SD1/SD2), ``encode_prompts_xl``, ``encode_prompts_sd3``,
  ``encode_prompts_flux``, ``encode_prompts_pixart``, ``encode_prompts_auraflow``;
* ``legacy``: ``StableDiffusion.encode_prompt`` (picks the profile from the model config, encodes
  Lumina 2 itself, leaves the rest to the hooked ``train_tools`` functions);
* ``models`` (current layout only): ``BaseModel.encode_prompt`` (so ``prompt_dropout_prob`` reaches
  the newer models) and ``get_prompt_embeds`` of Chroma, HiDream, Qwen-Image and Wan 2.1/2.2;
* ``cache`` (current layout only): the text-embedding cache key gets the profile name and
  fingerprint, so a changed setting re-encodes instead of reusing a stale file.

:class:`ProcessWatch` (installed by the te-align extension, :func:`watch_processes`) is a hook of its
own with one target, ``BaseProcess.__init__``: each process ai-toolkit builds from a job config calls
:func:`enable` with its config, which installs :class:`AiToolkitHook` with the process's profile.

The profile decides lengths, masks, layers and what a dropped caption becomes; ai-toolkit's own
``max_length`` / ``attn_mask`` arguments are ignored. Fixed gaps (ostris/ai-toolkit@27a03a9
toolkit/stable_diffusion_model.py:2468-2481, toolkit/models/base_model.py:1108-1131): FLUX.1 schnell
encoded T5 at 512 (256), Chroma ran T5 without the mask, ``prompt_dropout_prob`` was ignored for SD3
and every ``BaseModel`` model, and no T5 length could be set.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypedDict, TypeVar

from te_align._git import installed_version as _installed
from te_align._git import read_version
from te_align._lazy import lazy_module
from te_align.errors import TeAlignError
from te_align.hooks.base import (
    Hook,
    HookError,
    Lifecycle,
    Settings,
    Target,
    log_to_console,
    mark_wrapper,
    settings,
)
from te_align.profiles.overrides import env_profile, resolve
from te_align.trainers.ai_toolkit import names as aitk_table

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline
    from transformers import PreTrainedTokenizerBase

    from te_align.encoding import core as _core
    from te_align.encoding.conditioning import Conditioning
    from te_align.hooks.base import ProfileSource
    from te_align.profiles import AlignmentProfile
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")

_T = TypeVar("_T")

logger = logging.getLogger("te_align")

#: Module prefix per layout.
PREFIXES: dict[str, str] = {"current": "", "pypi": "ostris_ai_toolkit."}
PARTS: tuple[str, ...] = ("train_tools", "legacy", "models", "cache")
#: The versions the targets were read and verified against, per layout (version -> label). ``te-align patch``
#: patches checkouts (the current layout) and names these versions.
SUPPORTED: dict[str, dict[str, str]] = {
    "current": {"0.12.26": "ai-toolkit 0.12.26 (27a03a9, current layout)"},
    "pypi": {"0.2.7": "ostris-ai-toolkit 0.2.7 (PyPI layout)"},
}

#: Keys of the YAML ``te_align:`` section (config.process[i].te_align).
SECTION_KEYS: dict[str, str] = {
    "profile": "bundled profile name or alias, a profile .toml, or a diffusers folder (default: from model.arch / name_or_path)",
    "overrides": "mapping of profile overrides, e.g. {t5_max_length: 256}",
    "enabled": "false turns te-align off for this process (default true)",
}
#: Keys people put into ai-toolkit's own sections expecting an effect; ai-toolkit ignores them.
IGNORED_BY_AI_TOOLKIT = ("t5_max_length", "max_sequence_length", "max_length", "text_encoder_max_length", "clip_skip")


class ConfigError(TeAlignError):
    """A malformed ``te_align:`` section in an ai-toolkit job config."""


class _SectionKeys(TypedDict):
    enabled: bool
    profile: str | None
    overrides: dict[str, object]


class Section(_SectionKeys, total=False):
    """A validated ``te_align:`` section (:func:`validate_section`), its profile resolved once enabled
    (:func:`settings_from_process`). ``resolved`` is the one optional key (``total=False`` rather than
    ``typing.NotRequired``, which Python 3.11 added: ai-toolkit runs on 3.10)."""

    resolved: AlignmentProfile


class _Model(Protocol):
    """What the hooks read directly of an ai-toolkit model (``StableDiffusion`` or a ``BaseModel``); what only
    some models have is read with ``getattr``."""

    pipeline: DiffusionPipeline
    #: Chroma's (CLIP-L, T5) pair: the hooks take the T5 of each.
    tokenizer: Sequence[PreTrainedTokenizerBase]
    text_encoder: Sequence[torch.nn.Module]
    torch_dtype: torch.dtype

    def text_encoder_to(self, device: torch.device, dtype: torch.dtype) -> None: ...


class _PromptEmbeds(Protocol):
    """ai-toolkit's ``PromptEmbeds`` (``toolkit/prompt_utils.py``) as the hooks fill it."""

    attention_mask: torch.Tensor | None


#: ai-toolkit's ``PromptEmbeds`` class (looked up when a wrapper runs).
PromptEmbedsClass = Callable[..., _PromptEmbeds]


# ------------------------------------------------------------------------------ layout/version
def detect_layout() -> str:
    """``current`` when ai-toolkit's ``toolkit`` package is importable (run from its root), else ``pypi``."""
    mod = sys.modules.get("toolkit.train_tools")
    if mod is not None:
        return "current"
    spec = importlib.util.find_spec("toolkit")
    if spec is not None and spec.submodule_search_locations:
        if any((Path(p) / "train_tools.py").is_file() for p in spec.submodule_search_locations):
            return "current"
    if importlib.util.find_spec("ostris_ai_toolkit") is not None:
        return "pypi"
    raise HookError("ai-toolkit not found: run from an ai-toolkit checkout (its 'toolkit' package on sys.path) or install ostris-ai-toolkit")


def checkout_version(root: Path) -> str | None:
    """``VERSION`` from a checkout's ``version.py`` (None when absent)."""
    return read_version(Path(root) / "version.py")


def installed_version(layout: str) -> str:
    if layout == "pypi":
        return _installed("ostris-ai-toolkit") or "unknown"
    spec = importlib.util.find_spec("toolkit")
    if spec is None or not spec.submodule_search_locations:
        return "unknown"
    return checkout_version(Path(next(iter(spec.submodule_search_locations))).parent) or "unknown"


# ------------------------------------------------------------------------------ profiles
def profile_name_for(model: Mapping[str, object]) -> str:
    """The bundled profile for an ai-toolkit ``model:`` section (``arch`` or ``is_*`` flags + name_or_path),
    from the trainer table :mod:`te_align.trainers.ai_toolkit`."""
    name = aitk_table.hooked_profile(model)
    if name is None:
        raise HookError(f"te-align has no profile for ai-toolkit arch '{aitk_table.arch_of(model)}'; supported: "
                        f"{', '.join(aitk_table.hooked_archs())}. Set te_align.profile, remove the te_align section, "
                        "or run with TE_ALIGN=off")
    return name


def _model_config_dict(model_config: object) -> dict[str, object]:
    return {k: getattr(model_config, k, None) for k in aitk_table.MODEL_KEYS}


def validate_section(section: object, where: str = "te_align") -> Section:
    """Check a ``te_align:`` section strictly; returns it with defaults. Errors name the key and the allowed ones."""
    if section is None:
        return {"enabled": True, "profile": None, "overrides": {}}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where} must be a mapping with keys {', '.join(SECTION_KEYS)}, got {type(section).__name__}")
    unknown = [k for k in section if k not in SECTION_KEYS]
    if unknown:
        hint = ""
        if any(k not in ("profile", "enabled") for k in unknown):
            hint = f" (profile settings go under {where}.overrides, e.g. overrides: {{{unknown[0]}: ...}})"
        raise ConfigError(
            f"{where}: unknown key '{unknown[0]}'" + (f" (and {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else "")
            + f"; allowed keys: {', '.join(SECTION_KEYS)}{hint}"
        )
    enabled = section.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled must be true or false, got {enabled!r}")
    prof = section.get("profile")
    if prof is not None and not isinstance(prof, str):
        raise ConfigError(f"{where}.profile must be a profile name or path, got {prof!r}")
    overrides = section.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{where}.overrides must be a mapping of profile settings, got {type(overrides).__name__}")
    return {"enabled": enabled, "profile": prof, "overrides": dict(overrides)}


def settings_from_process(process: Mapping[str, object], where: str = "te_align") -> Section:
    """Validate a process config's ``te_align`` section and resolve its profile (errors are ConfigError)."""
    sec = validate_section(process.get("te_align"), where)  # (the profile with TE_ALIGN_OVERRIDES under its overrides)
    model = process.get("model") or {}
    if isinstance(model, Mapping):
        stray = [k for k in IGNORED_BY_AI_TOOLKIT if k in model]
        if stray:
            raise ConfigError(f"model.{stray[0]} is ignored by ai-toolkit (it has no such key); set it as "
                              f"{where}.overrides.{stray[0] if stray[0] != 'max_sequence_length' else 't5_max_length'} instead")
    if not sec["enabled"]:
        return sec
    try:
        name = sec["profile"] or profile_name_for(model if isinstance(model, Mapping) else {})
        sec["resolved"] = resolve(name, (f"{where}.overrides", sec["overrides"] or None), env=True)
    except TeAlignError as e:
        raise ConfigError(str(e) if e.file else f"{where}: {e}") from None  # an override error names its key path
    return sec


# ------------------------------------------------------------------------------ runtime context
_ACTIVE: contextvars.ContextVar[AlignmentProfile | None] = contextvars.ContextVar(
    "te_align_ai_toolkit_profile", default=None
)
_DROPOUT: contextvars.ContextVar[float] = contextvars.ContextVar("te_align_ai_toolkit_dropout", default=0.0)


@contextlib.contextmanager
def _using(profile: AlignmentProfile, dropout: float | None = None) -> Iterator[None]:
    t1 = _ACTIVE.set(profile)
    t2 = _DROPOUT.set(dropout) if dropout is not None else None
    try:
        yield
    finally:
        _ACTIVE.reset(t1)
        if t2 is not None:
            _DROPOUT.reset(t2)


def _names(kind: str, n: int) -> list[str]:
    return [kind if i == 0 else f"{kind}_{i + 1}" for i in range(n)]


def _as_list(x: _T | list[_T] | tuple[_T, ...]) -> list[_T]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _draw(n: int, p: float) -> list[bool] | None:
    if not p or p <= 0.0:
        return None
    import torch

    return [torch.rand(1).item() < p for _ in range(n)]


def _text_encoder_to_device(model: _Model, family: str) -> None:
    """Move the text encoder(s) where the replaced ``get_prompt_embeds`` moves them before encoding.

    ai-toolkit keeps text encoders off the GPU between uses (``low_vram``, after caching); its
    ``get_prompt_embeds`` moves them to ``device_torch`` first, and te_align encodes on the encoder's device.
    """
    device = getattr(model, "device_torch", None)
    if device is None:
        return
    if family == "hidream":
        model.text_encoder_to(device, dtype=model.torch_dtype)
        return
    enc = getattr(getattr(model, "pipeline", None), "text_encoder", None)
    if enc is not None and getattr(enc, "device", device) != device:
        enc.to(device)


def _repeat(cond: Conditioning, name: str, n: int) -> torch.Tensor:
    t = cond[name]
    if n == 1 or not cond.is_batched(name):
        return t
    return t.repeat_interleave(n, dim=cond.batch_dim(name))


#: train_tools function -> (profile families it may run, how its components are passed).
TRAIN_TOOLS: dict[str, tuple[frozenset[str], str]] = {
    "encode_prompts": (frozenset({"sd1", "sd2"}), "single"),
    "encode_prompts_xl": (frozenset({"sdxl"}), "list"),
    "encode_prompts_sd3": (frozenset({"sd3"}), "list"),
    "encode_prompts_flux": (frozenset({"flux"}), "list"),
    "encode_prompts_pixart": (frozenset({"pixart"}), "single"),
    "encode_prompts_auraflow": (frozenset({"auraflow"}), "single"),
}
TRAIN_TOOLS_PARAMS: dict[str, tuple[str, ...]] = {
    "encode_prompts": ("tokenizer", "text_encoder", "prompts", "truncate", "max_length", "dropout_prob"),
    "encode_prompts_xl": ("tokenizers", "text_encoders", "prompts", "prompts2", "num_images_per_prompt",
                          "use_text_encoder_1", "use_text_encoder_2", "truncate", "max_length", "dropout_prob"),
    "encode_prompts_sd3": ("tokenizers", "text_encoders", "prompts", "num_images_per_prompt", "truncate",
                           "max_length", "dropout_prob", "pipeline"),
    "encode_prompts_flux": ("tokenizer", "text_encoder", "prompts", "truncate", "max_length", "dropout_prob", "attn_mask"),
    "encode_prompts_pixart": ("tokenizer", "text_encoder", "prompts", "truncate", "max_length", "dropout_prob"),
    "encode_prompts_auraflow": ("tokenizer", "text_encoder", "prompts", "truncate", "max_length", "dropout_prob"),
}  # fmt: skip
MODEL_CLASSES: dict[str, tuple[str, str, str]] = {
    # family -> (module, class, profile family)
    "chroma": ("extensions_built_in.diffusion_models.chroma.chroma_model", "ChromaModel", "chroma"),
    "hidream": ("extensions_built_in.diffusion_models.hidream.hidream_model", "HidreamModel", "hidream"),
    "qwen-image": ("extensions_built_in.diffusion_models.qwen_image.qwen_image", "QwenImageModel", "qwen-image"),
    "wan": ("toolkit.models.wan21.wan21", "Wan21", "wan"),
}
ENCODE_PROMPT_PARAMS = ("self", "prompt", "prompt2", "num_images_per_prompt", "force_all", "long_prompts", "max_length", "dropout_prob")
#: Profile output that carries the tokenizer mask (ai-toolkit's Chroma transformer adds the +1 pad itself).
_ENCODER_MASK = "te_align_encoder_mask"


@dataclass
class AiToolkitHook(Hook):
    """Hooks for ai-toolkit. ``profile``: an AlignmentProfile or name (None: chosen per model from its
    config); ``overrides`` apply to a named or auto-chosen profile; ``parts``: subset of :data:`PARTS`
    (default: every part the layout has); ``layout``: ``auto``, ``current`` or ``pypi``."""

    name: ClassVar[str] = "ai-toolkit"
    supported: ClassVar[dict[str, str]] = {v: label for layout in SUPPORTED.values() for v, label in layout.items()}

    profile: ProfileSource = None
    overrides: dict[str, object] = field(default_factory=dict)
    parts: tuple[str, ...] | None = None
    layout: str = "auto"
    _profiles: dict[str, AlignmentProfile] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.layout not in ("auto", *PREFIXES):
            raise HookError(f"layout must be auto, current or pypi, got {self.layout!r}")
        bad = [p for p in (self.parts or ()) if p not in PARTS]
        if bad:
            raise HookError(f"unknown part '{bad[0]}'; known: {', '.join(PARTS)}")
        if self.profile is not None or self.overrides:  # given here: with TE_ALIGN_OVERRIDES under the overrides
            self.configure(settings(self.profile, self.overrides, origin="AiToolkitHook(overrides=)"))

    def configure(self, settings: Settings) -> None:
        super().configure(settings)
        self._profiles.clear()
        if settings.source is not None:
            self.profile = settings.profile()

    # -- declaration --------------------------------------------------------------------------
    @property
    def resolved_layout(self) -> str:
        return detect_layout() if self.layout == "auto" else self.layout

    def active_parts(self) -> tuple[str, ...]:
        if self.parts is not None:
            return self.parts
        return PARTS if self.resolved_layout == "current" else ("train_tools", "legacy")

    def targets(self) -> Sequence[Target]:
        pre = PREFIXES[self.resolved_layout]
        parts = self.active_parts()
        if self.resolved_layout == "pypi" and any(p in parts for p in ("models", "cache")):
            raise HookError("the PyPI packaging ostris-ai-toolkit 0.2.7 has no BaseModel models and no text-embedding cache; use parts=('train_tools', 'legacy')")
        pe = partial(_prompt_embeds_cls, pre)
        out: list[Target] = []
        if "train_tools" in parts:
            out += [Target(f"{pre}toolkit.train_tools", fn, params, wrap=partial(self._train_tools_wrapper, fn))
                    for fn, params in TRAIN_TOOLS_PARAMS.items()]
        if "legacy" in parts:
            out.append(Target(f"{pre}toolkit.stable_diffusion_model", "StableDiffusion.encode_prompt", ENCODE_PROMPT_PARAMS,
                              wrap=partial(self._legacy_encode_prompt, prompt_embeds_cls=pe)))
        if "models" in parts:
            out.append(Target("toolkit.models.base_model", "BaseModel.encode_prompt", ENCODE_PROMPT_PARAMS, wrap=self._base_encode_prompt))
            out += [Target(mod, f"{cls}.get_prompt_embeds", ("self", "prompt"),
                           wrap=partial(self._get_prompt_embeds, family, pfam, prompt_embeds_cls=pe))
                    for family, (mod, cls, pfam) in MODEL_CLASSES.items()]
        if "cache" in parts:
            out.append(Target("toolkit.dataloader_mixins", "TextEmbeddingFileItemDTOMixin.get_text_embedding_info_dict",
                              ("self", "caption_override", "text_only"), wrap=self._cache_key))
        return out

    def detect_version(self) -> str:
        try:
            return installed_version(self.resolved_layout)
        except HookError:
            return "not found"

    # -- profiles -----------------------------------------------------------------------------
    def profile_for(self, model_config: object = None) -> AlignmentProfile:
        """The explicit profile, else the one active in this call, else the model config's."""
        if self.profile is not None:
            return self.profile
        active = _ACTIVE.get()
        if active is not None:
            return active
        if model_config is None:
            raise HookError("te-align: no profile for this ai-toolkit encode call; set te_align.profile in the job "
                            "config or pass profile= to AiToolkitHook")
        name = profile_name_for(_model_config_dict(model_config))
        if name not in self._profiles:  # the model's own, with the user's overrides (the one way in)
            self._profiles[name] = self.user.profile(name)
        return self._profiles[name]

    def current_profile(self) -> AlignmentProfile:
        """The profile for cache keys: explicit, active, or the only one resolved so far."""
        if self.profile is not None:
            return self.profile
        if _ACTIVE.get() is not None:
            return _ACTIVE.get()
        if len(self._profiles) == 1:
            return next(iter(self._profiles.values()))
        raise HookError("te-align: the text-embedding cache key needs the profile; set te_align.profile (or install "
                        "the hooks through the te-align extension, which resolves it from the model config)")

    @staticmethod
    def _check_family(profile: AlignmentProfile, what: str, families: frozenset[str] | set[str]) -> None:
        if profile.family not in families:
            raise HookError(f"te-align: {what} encodes {'/'.join(sorted(families))} prompts but the active profile "
                            f"'{profile.name}' is for {profile.family}")

    # -- encoding -----------------------------------------------------------------------------
    @staticmethod
    def encode(
        profile: AlignmentProfile,
        prompts: Sequence[str],
        *,
        dropout_prob: float = 0.0,
        truncate: bool = True,
        **components: Any,
    ) -> Conditioning:
        opts = _core.EncodeOptions(long_prompt_chunks=0 if truncate else 4)
        return _core.encode(profile, list(prompts), options=opts, drop=_draw(len(prompts), dropout_prob), **components)

    def _train_tools_wrapper(self, fn_name: str, original: Callable[..., object]) -> Callable[..., object]:
        families, style = TRAIN_TOOLS[fn_name]
        params = TRAIN_TOOLS_PARAMS[fn_name]
        defaults = {
            "truncate": True, "max_length": None, "dropout_prob": 0.0, "num_images_per_prompt": 1,
            "prompts2": None, "use_text_encoder_1": True, "use_text_encoder_2": True, "attn_mask": False,
            "pipeline": None,
        }

        def wrapper(*args: object, **kwargs: object) -> object:
            a: dict[str, Any] = dict(defaults)  # train_tools' arguments by name, each read as what it is
            a.update(zip(params, args, strict=False))
            a.update(kwargs)
            profile = self.profile_for()
            self._check_family(profile, f"ai-toolkit train_tools.{fn_name}", families)
            prompts = _as_list(a["prompts"])
            if a["prompts2"] is not None and _as_list(a["prompts2"]) != prompts:
                raise HookError("te-align: a second prompt list different from the first is not supported (encode_prompts_xl prompts2)")
            if style == "list":
                toks = _as_list(a.get("tokenizers", a.get("tokenizer")))
                encs = _as_list(a.get("text_encoders", a.get("text_encoder")))
                comps = {
                    "tokenizers": dict(zip(_names("tokenizer", len(toks)), toks, strict=True)),
                    "text_encoders": dict(zip(_names("text_encoder", len(encs)), encs, strict=True)),
                }
            else:
                comps = {"tokenizers": {"tokenizer": a["tokenizer"]}, "text_encoders": {"text_encoder": a["text_encoder"]}}
            drop_p = float(a["dropout_prob"] or 0.0) or _DROPOUT.get()
            cond = self.encode(profile, prompts, dropout_prob=drop_p, truncate=bool(a["truncate"]), **comps)
            n = int(a["num_images_per_prompt"] or 1)
            if fn_name in ("encode_prompts",):
                return _repeat(cond, "prompt_embeds", n)
            if fn_name == "encode_prompts_pixart":
                return cond["prompt_embeds"], cond["prompt_attention_mask"]
            if fn_name == "encode_prompts_auraflow":
                emb = cond["prompt_embeds"]
                return emb, cond["prompt_attention_mask"].unsqueeze(-1).expand(emb.shape)
            return _repeat(cond, "prompt_embeds", n), _repeat(cond, "pooled_prompt_embeds", n)

        return mark_wrapper(wrapper, original)

    def _legacy_encode_prompt(
        self, original: Callable[..., object], prompt_embeds_cls: Callable[[], PromptEmbedsClass]
    ) -> Callable[..., object]:
        def encode_prompt(model: _Model, prompt: str | list[str], *args: Any, **kwargs: Any) -> object:
            profile = self.profile_for(getattr(model, "model_config", None))
            bound = dict(zip(ENCODE_PROMPT_PARAMS[2:], args, strict=False))
            bound.update(kwargs)
            dropout = float(bound.get("dropout_prob") or 0.0)
            if profile.family == "lumina2":
                prompts = _as_list(prompt)
                cond = self.encode(profile, prompts, dropout_prob=dropout, pipeline=model.pipeline)
                return prompt_embeds_cls()(cond["prompt_embeds"], attention_mask=cond["prompt_attention_mask"])
            with _using(profile):
                return original(model, prompt, *args, **kwargs)

        return mark_wrapper(encode_prompt, original)

    def _base_encode_prompt(self, original: Callable[..., object]) -> Callable[..., object]:
        def encode_prompt(model: object, prompt: str | list[str], *args: Any, **kwargs: Any) -> object:
            profile = self.profile_for(getattr(model, "model_config", None))
            bound = dict(zip(ENCODE_PROMPT_PARAMS[2:], args, strict=False))
            bound.update(kwargs)
            with _using(profile, float(bound.get("dropout_prob") or 0.0)):
                return original(model, prompt, *args, **kwargs)

        return mark_wrapper(encode_prompt, original)

    def _get_prompt_embeds(self, family: str, profile_family: str, original: Callable[..., object],
                           prompt_embeds_cls: Callable[[], PromptEmbedsClass]) -> Callable[..., object]:
        def get_prompt_embeds(
            model: _Model, prompt: str | list[str], *args: object, **kwargs: object
        ) -> _PromptEmbeds:
            profile = self.profile_for(getattr(model, "model_config", None))
            self._check_family(profile, f"ai-toolkit {family} get_prompt_embeds", {profile_family})
            prompts = _as_list(prompt)
            pe_cls = prompt_embeds_cls()
            _text_encoder_to_device(model, family)
            if family == "chroma":
                p = dataclasses.replace(profile, outputs=(*profile.outputs, (_ENCODER_MASK, "t5.mask")))
                cond = self.encode(p, prompts, dropout_prob=_DROPOUT.get(),
                                   tokenizers={"tokenizer": model.tokenizer[1]}, text_encoders={"text_encoder": model.text_encoder[1]})
                pe = pe_cls(cond["prompt_embeds"])
                pe.attention_mask = cond[_ENCODER_MASK]
                return pe
            # Wan and HiDream cast their embeddings to the model dtype (encode_prompt(dtype=self.torch_dtype)).
            cast = getattr(model, "torch_dtype", None) if family in ("wan", "hidream") else None
            cond = self.encode(profile, prompts, dropout_prob=_DROPOUT.get(), pipeline=model.pipeline, dtype=cast)
            if family == "hidream":
                return pe_cls([[cond["prompt_embeds_t5"], cond["prompt_embeds_llama3"]], cond["pooled_prompt_embeds"]])
            pe = pe_cls(cond["prompt_embeds"])
            if family == "qwen-image":
                pe.attention_mask = cond["prompt_embeds_mask"]
            return pe

        return mark_wrapper(get_prompt_embeds, original)

    def _cache_key(self, original: Callable[..., dict[str, object]]) -> Callable[..., dict[str, object]]:
        def get_text_embedding_info_dict(item: object, *args: object, **kwargs: object) -> dict[str, object]:
            info = original(item, *args, **kwargs)
            p = self.current_profile()
            info["te_align_profile"] = p.name
            info["te_align_fingerprint"] = p.fingerprint()
            return info

        return mark_wrapper(get_text_embedding_info_dict, original)


def _prompt_embeds_cls(prefix: str) -> PromptEmbedsClass:
    """ai-toolkit's ``PromptEmbeds`` class (looked up when a wrapper runs)."""
    return importlib.import_module(f"{prefix}toolkit.prompt_utils").PromptEmbeds


# ------------------------------------------------------------------------------ extension entry
#: The encoding hooks of this process (one profile at a time: each process ai-toolkit builds sets its own).
ENCODING = Lifecycle("ai-toolkit", AiToolkitHook)


def enable(
    process_config: Mapping[str, Any], *, default_profile: str | None = None, where: str = "te_align"
) -> AiToolkitHook | None:
    """Install the hooks for one ai-toolkit process config (called by the te-align extension).

    Validates the ``te_align:`` section (unknown keys are an error), resolves the profile (the section's, else
    ``TE_ALIGN_PROFILE``, else the folder's pinned ``default_profile``, else from ``model:``) with the overrides
    (``TE_ALIGN_OVERRIDES`` under the section's ``overrides``) and installs every hook the layout has. Returns None
    when the section says ``enabled: false``. A second process takes over the installed hooks with its profile.
    """
    proc = dict(process_config)
    default_profile = env_profile() or default_profile
    if "te_align" not in proc and not default_profile:
        try:
            profile_name_for(proc.get("model") or {})
        except HookError as e:  # not asked for explicitly: leave unsupported models alone, say so
            logger.info("te-align: not active for this process (%s)", e.message)
            return None
    arch = aitk_table.arch_of(proc.get("model") or {})
    if arch is not None and arch not in aitk_table.ARCHS:
        # e.g. qwen_image_edit, hidream_e1: their own get_prompt_embeds is not hooked, so a profile
        # set here would silently not apply.
        known = ", ".join(aitk_table.hooked_archs())
        raise HookError(
            f"te-align's ai-toolkit hooks do not reach arch '{arch}' (it encodes prompts with its own method), so "
            f"{where} cannot apply; hooked archs: {known}. Remove the te_align section or run with TE_ALIGN=off"
        )
    if default_profile and not (proc.get("te_align") or {}).get("profile"):
        proc["te_align"] = {**(proc.get("te_align") or {}), "profile": default_profile}
    sec = settings_from_process(proc, where)
    if not sec["enabled"]:
        ENCODING.uninstall()
        logger.info("te-align: disabled by %s.enabled: false", where)
        return None
    prof = sec["resolved"]
    before = ENCODING.current()
    same = before is not None and before.is_installed and before.profile is not None and (
        before.profile.fingerprint() == prof.fingerprint())
    if ENCODING.install(prof, environ={}) and not same:  # prof is resolved: no second reading of the environment
        logger.info("te-align: ai-toolkit encodes prompts by profile '%s' (fingerprint %s)", prof.name, prof.fingerprint()[:12])
    return ENCODING.current()  # type: ignore[return-value]


@dataclass
class ProcessWatch(Hook):
    """ai-toolkit's ``BaseProcess.__init__``: every process constructed from a job config calls :func:`enable`
    with it first (ai-toolkit imports extensions before it builds the job's processes).

    ``default_profile``: the profile pinned at patch time (else each process's own); ``layout``: ``auto``,
    ``current`` or ``pypi``.
    """

    name: ClassVar[str] = "ai-toolkit process watch"
    supported: ClassVar[dict[str, str]] = AiToolkitHook.supported

    default_profile: str | None = None
    layout: str = "auto"

    def targets(self) -> Sequence[Target]:
        pre = PREFIXES[detect_layout() if self.layout == "auto" else self.layout]
        return (Target(f"{pre}jobs.process.BaseProcess", "BaseProcess.__init__", ("self", "process_id", "job", "config"),
                       wrap=self._process_init),)

    def detect_version(self) -> str:
        return AiToolkitHook(layout=self.layout).detect_version()

    def _process_init(self, original: Callable[..., object]) -> Callable[..., object]:
        default_profile = self.default_profile

        def __init__(
            process: object, process_id: int, job: object, config: object, *args: object, **kwargs: object
        ) -> None:
            if isinstance(config, Mapping) and ("model" in config or "te_align" in config):
                enable(config, default_profile=default_profile, where=f"config.process[{process_id}].te_align")
            original(process, process_id, job, config, *args, **kwargs)

        return mark_wrapper(__init__, original)


#: The process watch (installed once, by the te-align extension).
WATCH = Lifecycle("ai-toolkit", ProcessWatch, console=log_to_console)


def watch_processes(default_profile: str | None = None) -> bool:
    """Install :class:`ProcessWatch` (the te-align extension calls this at import). Idempotent; returns False
    under ``TE_ALIGN=off`` (ai-toolkit then runs unmodified). ai-toolkit configures no logging: te-align's
    one-line announcements go to stdout."""
    return WATCH.install(None, environ={}, default_profile=default_profile)
