"""Runtime hooks for kohya-ss/sd-scripts (and the kohya_ss GUI, which runs it): tokenize and encode by a profile.

sd-scripts builds one tokenize strategy and one text-encoding strategy per architecture
(``library/strategy_<arch>.py``); tokenization runs in the Dataset (DataLoader workers) and encoding
in ``NetworkTrainer.process_batch`` or while caching TE outputs. The hooks replace, in place on
those classes, ``tokenize`` and ``encode_tokens`` with functions that call :mod:`te_align.encoding`
(:func:`~te_align.encoding.core.tokenize_slot` / :func:`~te_align.encoding.core.encode_slot_tokens`)
and return sd-scripts' own tuple layout, so everything downstream is unchanged. Cached TE outputs
(``*_te*.npz``) get the profile fingerprint and are re-encoded when it differs; saved LoRAs get the
te_align metadata stamp. ``--weighted_captions`` (``tokenize_with_weights`` /
``encode_tokens_with_weights``) is tokenized and encoded by the profile with sd-scripts' prompt
weights applied its way (:mod:`te_align.hooks.kohya_weights`); sample images are conditioned as
training is (:mod:`te_align.hooks.kohya_sample`, which lists every sd-scripts sample path).

Activation: ``install(profile=None, **overrides)``, or ``TE_ALIGN_ACTIVE=1`` in the environment,
which installs at import time of this module. The drop-in train scripts (``te-align patch``) set it
and import this module at their top level, and DataLoader workers started with *spawn* re-import the
main script, so every process of a run is hooked. ``TE_ALIGN=off`` leaves sd-scripts unmodified.

Profile choice: ``install(profile=...)`` / ``TE_ALIGN_PROFILE``; otherwise per architecture
(SD1 ``sd15``, SD2 ``sd21`` (tokenizer pad "!"), SDXL ``sdxl``, SD3 ``sd35-large`` (every bundled
SD3 profile has the same behaviour), Flux ``flux-dev``/``flux-schnell`` from sd-scripts' own
checkpoint analysis, Chroma ``chroma``, Lumina 2 ``lumina2``, Anima ``anima``, HunyuanImage
``hunyuanimage-2.1``). Overrides: keyword arguments and
``TE_ALIGN_OVERRIDES`` (JSON object; keyword arguments win); keys starting with ``kohya.`` are
hook options, the rest are profile overrides. Hook options:

* ``kohya.clip_g_exclamation``: ``"official"`` (default; every literal "!" becomes the pad token
  id 0, as the hub ``tokenizer_2`` of SDXL/SD3 does) or ``"sd-scripts"`` (plain BPE "!", as
  sd-scripts' laion tokenizer and open_clip do).

HunyuanImage-2.1 (``hunyuanimage-2.1``): both tokenizers pad to the profile's fixed lengths (Qwen 1000 + 34,
ByT5 128) so per-caption tokens and cached outputs keep one shape; see :func:`_tokenize_hunyuan` and
:func:`_encode_hunyuan` for what differs from sd-scripts' own encoding.

Anima: sd-scripts caches TE outputs per caption and collates them later, so its tokenize strategy
pads both tokenizers to a fixed length. The hooks keep that fixed shape: the profile's tokens are
padded to its ``max_length`` (512), and ``encode_tokens`` encodes the batch cut back to its longest
caption (the profile's ``padding = "longest"``), then pads the states with zeros and the mask with 0.
The result is the official encoding zero-padded to 512 (bit for bit), and padding positions get zero
weight in the denoiser's text conditioner (see :func:`_encode_anima`): equivalent in exact arithmetic,
with float differences at rounding level (the attention reduces over 512 instead of the batch's longest
keys), as between official batches of different composition. The T5 ids / mask pass through unchanged.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from te_align.hooks.base import Hook, HookError, ResolvedTarget, Target, hooks_disabled, mark_wrapper

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

logger = logging.getLogger("te_align")

ENV_ACTIVE = "TE_ALIGN_ACTIVE"
ENV_PROFILE = "TE_ALIGN_PROFILE"
ENV_OVERRIDES = "TE_ALIGN_OVERRIDES"
#: Run facts the parent learns (Flux variant) handed to DataLoader workers through the environment.
ENV_STATE = "TE_ALIGN_KOHYA_STATE"
#: Key stored in every TE-output npz written while the hooks are active.
NPZ_KEY = "te_align_fingerprint"

#: The sd-scripts commits the targets below were read and verified against.
VERIFIED_COMMITS = {"48d368fa557731ad0488c07304dfeba8c07910eb": "48d368f (main, 2026-02-16)"}
SUPPORTED = "kohya-ss/sd-scripts 48d368f"

HOOK_OPTIONS = {"kohya.clip_g_exclamation": ("official", "sd-scripts")}


@dataclass(frozen=True)
class Arch:
    """One sd-scripts architecture: its strategy classes and how sd-scripts' tensors map to profile slots."""

    name: str
    module: str
    tokenize_cls: str
    encode_cls: str
    cache_cls: str | None
    #: tokenize-strategy attribute holding each slot's tokenizer, in sd-scripts' order.
    tokenizers: tuple[str, ...]
    tokenize_params: tuple[str, ...] = ("self", "text")


ARCHS: tuple[Arch, ...] = (
    Arch("sd", "library.strategy_sd", "SdTokenizeStrategy", "SdTextEncodingStrategy", None, ("tokenizer",)),
    Arch(
        "sdxl", "library.strategy_sdxl", "SdxlTokenizeStrategy", "SdxlTextEncodingStrategy",
        "SdxlTextEncoderOutputsCachingStrategy", ("tokenizer1", "tokenizer2"),
    ),
    Arch(
        "sd3", "library.strategy_sd3", "Sd3TokenizeStrategy", "Sd3TextEncodingStrategy",
        "Sd3TextEncoderOutputsCachingStrategy", ("clip_l", "clip_g", "t5xxl"),
    ),
    Arch(
        "flux", "library.strategy_flux", "FluxTokenizeStrategy", "FluxTextEncodingStrategy",
        "FluxTextEncoderOutputsCachingStrategy", ("clip_l", "t5xxl"),
    ),
    Arch(
        "lumina", "library.strategy_lumina", "LuminaTokenizeStrategy", "LuminaTextEncodingStrategy",
        "LuminaTextEncoderOutputsCachingStrategy", ("tokenizer",), ("self", "text", "is_negative"),
    ),
    Arch(
        "anima", "library.strategy_anima", "AnimaTokenizeStrategy", "AnimaTextEncodingStrategy",
        "AnimaTextEncoderOutputsCachingStrategy", ("qwen3_tokenizer", "t5_tokenizer"),
    ),
    Arch(
        "hunyuan_image", "library.strategy_hunyuan_image", "HunyuanImageTokenizeStrategy",
        "HunyuanImageTextEncodingStrategy", "HunyuanImageTextEncoderOutputsCachingStrategy",
        ("vlm_tokenizer", "byt5_tokenizer"),
    ),
)  # fmt: skip

#: encode_tokens parameters per architecture (sd-scripts 48d368f).
ENCODE_PARAMS: dict[str, tuple[str, ...]] = {
    "sd": ("self", "tokenize_strategy", "models", "tokens"),
    "sdxl": ("self", "tokenize_strategy", "models", "tokens"),
    "sd3": ("self", "tokenize_strategy", "models", "tokens", "apply_lg_attn_mask", "apply_t5_attn_mask", "enable_dropout"),
    "flux": ("self", "tokenize_strategy", "models", "tokens", "apply_t5_attn_mask"),
    "lumina": ("self", "tokenize_strategy", "models", "tokens"),
    "anima": ("self", "tokenize_strategy", "models", "tokens"),
    "hunyuan_image": ("self", "tokenize_strategy", "models", "tokens"),
}
#: LoRA network modules whose ``LoRANetwork.save_weights(self, file, dtype, metadata)`` gets the stamp.
NETWORK_MODULES = ("networks.lora", "networks.lora_flux", "networks.lora_sd3", "networks.lora_lumina", "networks.lora_anima")
#: Facts recorded from sd-scripts itself: the Flux checkpoint analysis and Chroma's dummy CLIP-L.
FLUX_PROBES = (
    Target("library.flux_utils", "analyze_checkpoint_state", ("ckpt_path",)),
    Target("library.flux_utils", "DummyCLIPL.__init__", ("self",)),
)
#: Architectures with sd-scripts' --weighted_captions path (48d368f), and the parameters of their
#: ``encode_tokens_with_weights``; both weighted methods follow the profile (te_align.hooks.kohya_weights).
WEIGHTED = ("sd", "sdxl", "lumina")
ENCODE_WEIGHTED_PARAMS: dict[str, tuple[str, ...]] = {
    "sd": ("self", "tokenize_strategy", "models", "tokens_list", "weights_list"),
    "sdxl": ("self", "tokenize_strategy", "models", "tokens_list", "weights_list"),
    "lumina": ("self", "tokenize_strategy", "models", "tokens", "weights"),
}
#: Sample images with their own text encoding (te_align.hooks.kohya_sample): SD1/2's lpw pipeline
#: embeddings, and both lpw pipelines' ``__call__`` (a missing negative prompt under a zeros profile).
SAMPLE_TARGETS = (
    Target(
        "library.lpw_stable_diffusion", "get_weighted_text_embeddings",
        ("pipe", "prompt", "uncond_prompt", "max_embeddings_multiples", "no_boseos_middle", "skip_parsing", "skip_weighting", "clip_skip"),
    ),
    Target("library.lpw_stable_diffusion", "StableDiffusionLongPromptWeightingPipeline.__call__", ("self", "prompt", "negative_prompt")),
    Target("library.sdxl_lpw_stable_diffusion", "SdxlStableDiffusionLongPromptWeightingPipeline.__call__", ("self", "prompt", "negative_prompt")),
)  # fmt: skip


def all_targets() -> list[Target]:
    """Every function or method the kohya hooks replace, with the parameter names relied on."""
    out: list[Target] = []
    for a in ARCHS:
        out.append(Target(a.module, f"{a.tokenize_cls}.tokenize", a.tokenize_params))
        out.append(Target(a.module, f"{a.encode_cls}.encode_tokens", ENCODE_PARAMS[a.name]))
        if a.cache_cls:
            out.append(Target(a.module, f"{a.cache_cls}.is_disk_cached_outputs_expected", ("self", "npz_path")))
            batch = "batch" if a.name == "lumina" else "infos"
            out.append(
                Target(a.module, f"{a.cache_cls}.cache_batch_outputs", ("self", "tokenize_strategy", "models", "text_encoding_strategy", batch))
            )
    for a in ARCHS:
        if a.name in WEIGHTED:
            out.append(Target(a.module, f"{a.tokenize_cls}.tokenize_with_weights", ("self", "text")))
            out.append(Target(a.module, f"{a.encode_cls}.encode_tokens_with_weights", ENCODE_WEIGHTED_PARAMS[a.name]))
    out.extend(SAMPLE_TARGETS)
    out.extend(FLUX_PROBES)
    out.extend(Target(m, "LoRANetwork.save_weights", ("self", "file", "dtype", "metadata")) for m in NETWORK_MODULES)
    return out


# ------------------------------------------------------------------------------------ run state
class _Run:
    """Per-process state: chosen profiles, user overrides, counters, one-time log lines."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.explicit: Any = None
        self.overrides: dict[str, Any] = {}
        self.options: dict[str, str] = {"kohya.clip_g_exclamation": "official"}
        self.profiles: dict[str, AlignmentProfile] = {}
        self.logged: set[str] = set()
        self.reencoded = 0
        self.reencoded_logged = 0
        self.last_profile: AlignmentProfile | None = None

    def once(self, key: str, msg: str, *args: Any, level: int = logging.INFO) -> None:
        with self.lock:
            if key in self.logged:
                return
            self.logged.add(key)
        logger.log(level, msg, *args)

    def state(self) -> dict[str, Any]:
        try:
            data = json.loads(os.environ.get(ENV_STATE, "{}"))
        except json.JSONDecodeError:
            data = {}
        return data if isinstance(data, dict) else {}

    def record(self, **facts: Any) -> None:
        data = self.state()
        data.update(facts)
        os.environ[ENV_STATE] = json.dumps(data, sort_keys=True)


_RUN = _Run()
_HOOK: KohyaHook | None = None


def _split_overrides(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    profile_ov, options = {}, {}
    for k, v in raw.items():
        if k.startswith("kohya."):
            if k not in HOOK_OPTIONS:
                raise HookError(f"unknown kohya hook option {k!r}; known: {', '.join(HOOK_OPTIONS)}")
            if v not in HOOK_OPTIONS[k]:
                raise HookError(f"{k} must be one of {', '.join(HOOK_OPTIONS[k])}, got {v!r}")
            options[k] = v
        else:
            profile_ov[k] = v
    return profile_ov, options


def _env_overrides() -> dict[str, Any]:
    raw = os.environ.get(ENV_OVERRIDES, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise HookError(f"{ENV_OVERRIDES} is not valid JSON ({e.msg}); expected an object such as '{{\"t5_max_length\": 512}}'") from None
    if not isinstance(data, dict):
        raise HookError(f"{ENV_OVERRIDES} must be a JSON object, got {type(data).__name__}")
    return data


def default_profile_name(arch: str, strategy: Any = None) -> str:
    """The bundled profile for an sd-scripts architecture (Flux: from the run's recorded facts)."""
    if arch == "sd":
        tok = getattr(strategy, "tokenizer", None)
        pad, eos = getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None)
        return "sd21" if tok is not None and pad != eos else "sd15"
    if arch == "flux":
        return {"schnell": "flux-schnell", "chroma": "chroma"}.get(_RUN.state().get("flux_variant", "dev"), "flux-dev")
    return {"sdxl": "sdxl", "sd3": "sd35-large", "lumina": "lumina2", "chroma": "chroma", "anima": "anima",
            "hunyuan_image": "hunyuanimage-2.1"}[arch]


def profile_for(arch: str, strategy: Any = None) -> AlignmentProfile:
    """The profile a hooked call of ``arch`` follows (explicit, else per architecture; overrides applied)."""
    from te_align.profiles import AlignmentProfile, profile

    name = _RUN.explicit if _RUN.explicit is not None else default_profile_name(arch, strategy)
    key = name.name if isinstance(name, AlignmentProfile) else f"{arch}:{name}"
    with _RUN.lock:
        p = _RUN.profiles.get(key)
        if p is None:
            p = name if isinstance(name, AlignmentProfile) else profile(name)
            if _RUN.overrides:
                p = p.with_overrides(dict(_RUN.overrides))
            _RUN.profiles[key] = p
            logger.info(
                "te-align: kohya %s follows profile %s (fingerprint %s)%s%s", arch, p.name, p.fingerprint()[:12],
                f"; user overrides {json.dumps(_RUN.overrides, sort_keys=True)}" if _RUN.overrides else "",
                "" if _RUN.options["kohya.clip_g_exclamation"] == "official" else "; CLIP-G '!' kept as sd-scripts tokenizes it",
            )  # fmt: skip
        _RUN.last_profile = p
    return p


def with_clip_skip(p: AlignmentProfile, clip_skip: Any) -> AlignmentProfile:
    """SD1/2: sd-scripts' ``--clip_skip N`` taken as a user override of the profile (logged once).

    sd-scripts reads ``hidden_states[-N]`` and applies the final layer norm (library/strategy_sd.py
    encode_tokens); a base model trained with clip skip (NovelAI-lineage SD1.5 fine-tunes) needs the
    same. An explicit layer override in ``TE_ALIGN_OVERRIDES`` wins over the flag.
    """
    if clip_skip in (None, 0, 1) or len(p.slots) != 1:
        return p
    slot = p.slots[0].name
    if any("layer" in k for k in _RUN.overrides):
        _RUN.once("clip_skip:ignored", "te-align: --clip_skip %s not used: the user override %s sets the layer", clip_skip,
                  json.dumps(_RUN.overrides, sort_keys=True))  # fmt: skip
        return p
    key = f"{p.name}:{p.fingerprint()}:clip_skip={clip_skip}"
    with _RUN.lock:
        q = _RUN.profiles.get(key)
        if q is None:
            q = _RUN.profiles[key] = p.with_overrides(
                {f"slots.{slot}.encoder.layer": -int(clip_skip), f"slots.{slot}.encoder.final_layer_norm": True}
            )
            logger.info("te-align: --clip_skip %s taken as a user override of profile %s: hidden_states[-%s] + final layer "
                        "norm (fingerprint %s)", clip_skip, p.name, clip_skip, q.fingerprint()[:12])  # fmt: skip
    return q


def cache_fingerprint(p: AlignmentProfile, strategy: Any = None, *, weighted: bool = False) -> str:
    """Fingerprint stored in TE-output caches: the profile's, plus hook options that change outputs.

    ``weighted``: the cache holds --weighted_captions outputs (sd-scripts' prompt weights applied).
    """
    fp = p.fingerprint()
    if _RUN.options["kohya.clip_g_exclamation"] != "official" and any(s.name == "clip_g" for s in p.slots):
        fp += "+clip_g_exclamation=sd-scripts"
    chunks = _chunk_options(p.family, strategy).long_prompt_chunks if strategy is not None else 0
    if chunks:
        fp += f"+long_prompt_chunks={chunks}"
    if weighted:
        fp += "+weighted_captions=sd-scripts"
    return fp


def _chunk_options(arch_name: str, strategy: Any) -> Any:
    """sd-scripts' ``--max_token_length 150/225`` (SD1/2, SDXL) as te-align's long-prompt chunking.

    sd-scripts stitches its 75-token chunks into one n*75+2 sequence; te-align keeps each chunk's
    BOS/EOS (n*77, the NovelAI method), always n chunks so per-caption tokens collate.
    """
    from te_align.encoding.core import EncodeOptions

    ml = getattr(strategy, "max_length", None) or 77
    if arch_name in ("sd", "sd1", "sd2", "sdxl") and ml > 77:
        return EncodeOptions(long_prompt_chunks=(ml - 2) // 75, pad_chunks=True)
    return EncodeOptions()


# -------------------------------------------------------------------------------- tokenization
def _clip_g_tokenizer(strategy: Any, attr: str) -> Any:
    """sd-scripts' laion CLIP-G tokenizer, or a copy that splits "!" as the pad token like the hub tokenizer_2."""
    tok = getattr(strategy, attr)
    if _RUN.options["kohya.clip_g_exclamation"] == "sd-scripts":
        return tok
    cached = strategy.__dict__.get("_te_align_clip_g")
    if cached is None or cached[0] is not tok:
        official = copy.deepcopy(tok)
        official.add_special_tokens({"pad_token": "!"})
        cached = (tok, official)
        strategy.__dict__["_te_align_clip_g"] = cached
    return cached[1]


def _slot_tokenizers(arch: Arch, strategy: Any, p: AlignmentProfile) -> list[tuple[Any, Any]]:
    """(slot spec or None, tokenizer) per sd-scripts tokenizer, in sd-scripts' order."""
    names = {s.name for s in p.slots}
    out = []
    for attr in arch.tokenizers:
        slot_name = _slot_name(arch, attr, p)
        tok = _clip_g_tokenizer(strategy, attr) if slot_name == "clip_g" else getattr(strategy, attr)
        out.append((p.slot(slot_name) if slot_name in names else None, tok))
    return out


def _slot_name(arch: Arch, attr: str, p: AlignmentProfile) -> str:
    if arch.name in ("sd", "lumina"):
        return p.slots[0].name
    return {"tokenizer1": "clip_l", "tokenizer2": "clip_g", "clip_l": "clip_l", "clip_g": "clip_g", "t5xxl": "t5",
            "qwen3_tokenizer": "qwen", "t5_tokenizer": "t5", "vlm_tokenizer": "qwen", "byt5_tokenizer": "byt5"}[attr]


def _note_setting_differences(arch: Arch, strategy: Any, p: AlignmentProfile) -> None:
    """Log once where sd-scripts' own settings ask for something the profile does differently."""
    chunks = _chunk_options(arch.name, strategy).long_prompt_chunks
    if chunks:
        _RUN.once(
            f"ml:{arch.name}",
            "te-align: --max_token_length %s: %d CLIP chunks of 77 tokens each with BOS/EOS (NovelAI method; sd-scripts "
            "stitches them to %d tokens); the profile %s itself truncates at 77",
            chunks * 75, chunks, chunks * 75 + 2, p.name,
        )  # fmt: skip
    t5len = getattr(strategy, "t5xxl_max_length", None)
    if t5len is not None and any(s.name == "t5" for s in p.slots) and t5len != p.slot("t5").tokenizer.max_length:
        _RUN.once(
            f"t5:{arch.name}",
            "te-align: sd-scripts' T5 length %s replaced by profile %s's %s (override with %s='{\"t5_max_length\": %s}')",
            t5len, p.name, p.slot("t5").tokenizer.max_length, ENV_OVERRIDES, t5len,
        )  # fmt: skip
    sp = getattr(strategy, "system_prompt", None)
    if arch.name == "lumina" and sp is not None:
        tmpl = p.slots[0].tokenizer
        _RUN.once("lumina:sp", "te-align: Lumina 2 captions use profile %s's template (sd-scripts --system_prompt %r not used): %r",
                  p.name, sp, getattr(tmpl, "template", None))  # fmt: skip
    if arch.name == "anima":
        for attr, flag, slot in (("qwen3_max_length", "--qwen3_max_token_length", "qwen"), ("t5_max_length", "--t5_max_token_length", "t5")):
            have, want = getattr(strategy, attr, None), p.slot(slot).tokenizer.max_length if slot in p.slot_names else None
            if have is not None and want is not None and have != want:
                _RUN.once(f"anima:{attr}", "te-align: sd-scripts' %s %s replaced by profile %s's %s (override with %s='{\"%s_max_length\": %s}')",
                          flag, have, p.name, want, ENV_OVERRIDES, slot, have)  # fmt: skip


def _tokenize(arch: Arch, strategy: Any, text: Any, negative: bool = False) -> Any:
    import torch

    from te_align.encoding.core import tokenize_slot

    texts = [text] if isinstance(text, str) else list(text)
    p = profile_for(arch.name, strategy)
    _note_setting_differences(arch, strategy, p)
    if arch.name == "anima":
        return _tokenize_anima(arch, p, strategy, texts, negative)
    if arch.name == "hunyuan_image":
        return _tokenize_hunyuan(arch, p, strategy, texts, negative)
    parts: list[tuple[Any, Any]] = []
    for slot, tok in _slot_tokenizers(arch, strategy, p):
        if slot is None:  # e.g. Chroma has no CLIP-L: sd-scripts still tokenizes for its dummy encoder
            enc = tok(texts, max_length=77, padding="max_length", truncation=True, return_tensors="pt")
            parts.append((enc["input_ids"], enc["attention_mask"]))
        else:
            parts.append(tokenize_slot(slot, tok, texts, negative=negative, options=_chunk_options(arch.name, strategy)))
    if arch.name == "sd":
        return [parts[0][0].unsqueeze(1)]
    if arch.name == "sdxl":
        return (parts[0][0].unsqueeze(1), parts[1][0].unsqueeze(1))
    if arch.name == "sd3":
        return [parts[0][0], parts[1][0], parts[2][0], parts[0][1], parts[1][1], parts[2][1]]
    if arch.name == "flux":
        return [parts[0][0], parts[1][0], parts[1][1]]
    ids, mask = parts[0]
    return (ids, mask.to(torch.long))


# ------------------------------------------------------------------------------------ encoding
def _clip_mask(ids: Any, eos: int | None) -> Any:
    """Attention mask of CLIP ids without one: real tokens up to and including the first EOS."""
    import torch

    if eos is None:
        return torch.ones_like(ids)
    first = (ids == eos).int().argmax(dim=1, keepdim=True)
    return (torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) <= first).to(torch.long)


def _one_chunk(t: Any, arch: str) -> Any:
    if t.dim() == 3:
        if t.shape[1] != 1:
            raise HookError(
                f"te-align kohya {arch}: got {t.shape[1]} token chunks per caption; hooked tokenization makes one "
                "(were these tokens made before the hooks were installed?)"
            )
        return t[:, 0]
    return t


def _slot_encode(p: AlignmentProfile, slot_name: str, encoder: Any, ids: Any, mask: Any | None) -> Any:
    from te_align.encoding.core import encode_slot_tokens

    slot = p.slot(slot_name)
    if mask is None:
        mask = _clip_mask(ids, slot.tokenizer.eos_token_id)
    return encode_slot_tokens(p, slot, encoder, ids, mask)


def _drop(rate: float, enable: bool, n: int) -> list[bool]:
    return [enable and rate > 0.0 and random.random() < rate for _ in range(n)]


def _zero_rows(t: Any, rows: list[bool]) -> Any:
    import torch

    if t is None or not any(rows):
        return t
    sel = torch.tensor(rows, device=t.device).view(-1, *([1] * (t.dim() - 1)))
    return torch.where(sel, torch.zeros((), dtype=t.dtype, device=t.device), t)


def _encode(arch: Arch, self: Any, tokenize_strategy: Any, models: Sequence[Any], tokens: Sequence[Any], **kw: Any) -> Any:
    import torch

    name = arch.name
    if name == "flux" and _is_chroma(models):
        _RUN.record(flux_variant="chroma")
    p = profile_for(name, tokenize_strategy)
    if name == "anima":
        return _encode_anima(p, models, tokens)
    if name == "hunyuan_image":
        return _encode_hunyuan(arch, p, tokenize_strategy, models, tokens)
    if name == "sd":
        p = with_clip_skip(p, getattr(self, "clip_skip", None))
        return [_slot_encode(p, p.slots[0].name, models[0], _one_chunk(tokens[0], name), None).hidden]
    if name == "sdxl":
        r1 = _slot_encode(p, "clip_l", models[0], _one_chunk(tokens[0], name), None)
        r2 = _slot_encode(p, "clip_g", models[1], _one_chunk(tokens[1], name), None)
        return [r1.hidden, r2.hidden, r2.pooled]
    if name == "sd3":
        return _encode_sd3(p, self, models, tokens, kw.get("enable_dropout", True))
    if name == "flux":
        clip_l, t5 = models if len(models) == 2 else (models[0], None)
        l_ids, t5_ids = tokens[:2]
        t5_mask = tokens[2] if len(tokens) > 2 else None
        if clip_l is None or l_ids is None:
            l_pooled = None
        elif "clip_l" in p.slot_names:
            l_pooled = _slot_encode(p, "clip_l", clip_l, l_ids, None).pooled
        else:  # Chroma: sd-scripts' zero dummy stands in for CLIP-L
            l_pooled = clip_l(l_ids.to(clip_l.device))["pooler_output"]
        if t5 is None or t5_ids is None:
            return [l_pooled, None, None, None]
        mask = t5_mask if t5_mask is not None else torch.ones_like(t5_ids)
        t5_out = _slot_encode(p, "t5", t5, t5_ids, mask).hidden
        txt_ids = torch.zeros(t5_out.shape[0], t5_out.shape[1], 3, device=t5_out.device)
        return [l_pooled, t5_out, txt_ids, t5_mask]
    ids, mask = tokens
    r = _slot_encode(p, p.slots[0].name, models[0], ids, mask)
    return [r.hidden, ids, mask]


def _encode_sd3(p: AlignmentProfile, self: Any, models: Sequence[Any], tokens: Sequence[Any], enable_dropout: bool) -> Any:
    import torch

    clip_l, clip_g, t5 = [*list(models), None, None, None][:3]
    l_ids, g_ids, t5_ids, l_mask, g_mask, t5_mask = tokens
    flags = ("apply_lg_attn_mask", "apply_t5_attn_mask")
    if any(getattr(self, f, False) for f in flags):
        _RUN.once("sd3:masks", "te-align: SD3 --apply_lg_attn_mask/--apply_t5_attn_mask are not used: masks follow profile %s "
                  "(encoder masks: clip_l=%s clip_g=%s t5=%s), on the live and the cached path alike",
                  p.name, *(p.slot(s).masks.encoder for s in ("clip_l", "clip_g", "t5")))  # fmt: skip
    lg_out = lg_pooled = None
    if l_ids is not None and clip_l is not None:
        rl = _slot_encode(p, "clip_l", clip_l, l_ids, l_mask)
        rg = _slot_encode(p, "clip_g", clip_g, g_ids, g_mask)
        n = l_ids.shape[0]
        dl, dg = _drop(getattr(self, "l_dropout_rate", 0.0), enable_dropout, n), _drop(getattr(self, "g_dropout_rate", 0.0), enable_dropout, n)
        lg_out = torch.cat([_zero_rows(rl.hidden, dl), _zero_rows(rg.hidden, dg)], dim=-1)
        lg_pooled = torch.cat([_zero_rows(rl.pooled, dl), _zero_rows(rg.pooled, dg)], dim=-1)
    else:
        l_mask = g_mask = None
    t5_out = None
    if t5_ids is not None and t5 is not None:
        r5 = _slot_encode(p, "t5", t5, t5_ids, t5_mask)
        t5_out = _zero_rows(r5.hidden, _drop(getattr(self, "t5_dropout_rate", 0.0), enable_dropout, t5_ids.shape[0]))
    else:
        t5_mask = None
    return [lg_out, t5_out, lg_pooled, l_mask, g_mask, t5_mask]


# ------------------------------------------------------------------------------------------ Anima
def _batch_longest(slot: Any, ids: Any, mask: Any, pad_id: int) -> tuple[Any, Any]:
    """Fixed-length tokens cut back to what :func:`~te_align.encoding.core.tokenize_slot` gives the same
    batch under ``padding = "longest"``: the longest caption's width (at least ``min_length``, the added
    positions holding ``min_length_pad_id``), every other masked position the pad id (captions tokenized
    one by one and collated may carry their own ``min_length`` fill). Tokens of a ``max_length`` profile
    are returned as they are."""
    import torch

    t = slot.tokenizer
    if t.padding != "longest":
        return ids, mask
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
    real = int(mask.sum(dim=1).max()) if mask.shape[0] else 0
    width = min(ids.shape[1], max(real, t.min_length or 0))
    left = t.padding_side == "left"
    ids, mask = (ids[:, ids.shape[1] - width :], mask[:, mask.shape[1] - width :]) if left else (ids[:, :width], mask[:, :width])
    if width > real and t.min_length_pad_id is not None:
        ids = ids.clone()
        if left:
            ids[:, : width - real] = t.min_length_pad_id
        else:
            ids[:, real:] = t.min_length_pad_id
    return ids, mask


def _tokenize_anima(arch: Arch, p: AlignmentProfile, strategy: Any, texts: list[str], negative: bool) -> Any:
    """``[qwen ids, qwen mask, t5 ids, t5 mask]`` as sd-scripts' AnimaTokenizeStrategy.tokenize returns them
    (strategy_anima.py:53-69), by the profile, each padded to the slot's ``max_length`` for collation."""
    from te_align.encoding.core import pad_id_of, pad_tokens, tokenize_slot

    out: list[Any] = []
    for slot, tok in _slot_tokenizers(arch, strategy, p):
        ids, mask = tokenize_slot(slot, tok, texts, negative=negative)
        out.extend(pad_tokens(slot, ids, mask, slot.tokenizer.max_length, pad_id_of(slot, tok)))
    return out


def _encode_anima(p: AlignmentProfile, models: Sequence[Any], tokens: Sequence[Any]) -> Any:
    """``[qwen states, qwen mask, t5 ids, t5 mask]`` as AnimaTextEncodingStrategy.encode_tokens returns them
    (strategy_anima.py:82-107): Qwen3 runs on the batch cut back to its longest caption, exactly as the
    official pipeline encodes that batch; states and mask are then zero-padded back to sd-scripts' width.

    Why the zero padding is exact for the denoiser (diffusers 0.42.1 / sd-scripts 48d368f):

    * Qwen states: the conditioner's cross-attention takes the Qwen mask as key mask
      (df models/condition_embedders/condition_embedder_anima.py:217-223 with :306-307; sd
      library/anima_models.py:1528-1535,1574-1582), so padded source positions get zero weight; source
      RoPE positions are ``arange`` (:312-315; sd :1586-1589) and right padding leaves the real positions at
      0..n-1. The states of padded positions are zero either way (df modular_pipelines/anima/encoders.py:147;
      sd library/strategy_anima.py:105).
    * T5 ids: padded targets are key-masked in the conditioner's self-attention (:206-214; sd :1517-1525),
      their outputs are zeroed (:340-341; sd library/anima_models.py:1370), and the official output is
      right-padded with zeros to ``min_sequence_length`` 512 (:253,343-344), which is sd-scripts' width.
    * The DiT takes the 512 conditioning rows without a mask (df modular_pipelines/anima/denoise.py:131-137;
      sd anima_train_network.py:306-314), so it sees the same 512 rows: the real ones, then zeros.

    A batch of captions that all tokenize to nothing (Qwen3 adds no special tokens, so "") has one key,
    masked, officially and 512 masked keys in sd-scripts: the cross-attention output of a fully masked
    row is 0 in both (torch >= 2.5 SDPA; sd-scripts docs/anima_train_network.md asks for torch >= 2.5).

    So zero padding is exact in exact arithmetic. In float, attention over 512 instead of the batch's
    longest keys rounds differently: on the tiny test models (fp32) the conditioner output moves by at
    most 7.2e-7, the same as the official pipeline's own change when a prompt shares its batch with a
    longer one (tests/test_kohya_integration.py::test_anima_padding_is_invisible_to_sd_scripts_llm_adapter).
    """
    import torch

    from te_align.encoding.core import encode_slot_tokens

    qwen = p.slot("qwen")
    ids, mask, t5_ids, t5_mask = tokens
    width = ids.shape[1]
    pad_id = qwen.tokenizer.pad_token_id if qwen.tokenizer.pad_token_id is not None else 0
    cut_ids, cut_mask = _batch_longest(qwen, ids, mask, pad_id)
    r = encode_slot_tokens(p, qwen, models[0], cut_ids, cut_mask)
    extra = width - r.hidden.shape[-2]
    left = qwen.tokenizer.padding_side == "left"
    hidden = torch.nn.functional.pad(r.hidden, (0, 0, extra, 0) if left else (0, 0, 0, extra))
    out_mask = torch.nn.functional.pad(r.denoiser_mask, (extra, 0) if left else (0, extra))
    return [hidden, out_mask, t5_ids, t5_mask]


# ----------------------------------------------------------------------------------- HunyuanImage
def _tokenize_hunyuan(arch: Arch, p: AlignmentProfile, strategy: Any, texts: list[str], negative: bool) -> Any:
    """``[vlm ids, vlm mask, byt5 ids, byt5 mask]`` as HunyuanImageTokenizeStrategy.tokenize returns them
    (strategy_hunyuan_image.py:27-45), by the profile.

    The profile pads Qwen to 1000 + 34 and ByT5 to 128 (``padding = "max_length"``), so every caption's
    tokens have the same shape and collate, where sd-scripts pads Qwen to the batch's longest (up to
    1024 + 34) and ByT5 to 128, or to 1 when no caption of the batch has quoted text. A caption without
    quoted text gets ByT5 pad ids with an all-zero mask, which sd-scripts' own encode step also reads as
    "no glyph text" (hunyuan_image_text_encoder.py:600-605).
    """
    from te_align.encoding.core import tokenize_slot

    _RUN.once(
        "hunyuan:settings",
        "te-align: HunyuanImage captions follow profile %s: Qwen %s tokens (sd-scripts: up to 1024, padded to the batch's "
        "longest), ByT5 glyph text from '...', \"...\", ‘...’ and “...” (sd-scripts skips '...')",
        p.name, p.slot("qwen").tokenizer.max_length if "qwen" in p.slot_names else "?",
    )  # fmt: skip
    out: list[Any] = []
    for slot, tok in _slot_tokenizers(arch, strategy, p):
        out.extend(tokenize_slot(slot, tok, texts, negative=negative))
    return out


def _check_token_width(p: AlignmentProfile, slot_name: str, tokenizer: Any, ids: Any) -> None:
    from te_align.encoding.core import tokenize_length

    slot = p.slot(slot_name)
    if slot.tokenizer.padding != "max_length" or not slot.tokenizer.truncation:
        return
    want = tokenize_length(slot, tokenizer)
    if ids.shape[1] != want:
        raise HookError(
            f"te-align kohya hunyuan_image: {slot_name} tokens are {ids.shape[1]} wide but profile {p.name} tokenizes to "
            f"{want} (were these tokens made before the hooks were installed?)"
        )


def _encode_hunyuan(arch: Arch, p: AlignmentProfile, tokenize_strategy: Any, models: Sequence[Any], tokens: Sequence[Any]) -> Any:
    """``[vlm_embed, vlm_mask, byt5_embed, byt5_mask, ocr_mask]`` as HunyuanImageTextEncodingStrategy.encode_tokens
    returns them (strategy_hunyuan_image.py:53-79): states and int64 masks of both slots by the profile, and
    ``ocr_mask`` (bool, per caption, on the CPU as sd-scripts builds it): the caption has glyph text.

    The shapes stay fixed per caption ((1000, width), (1000,), (128, 1472), (128,), ()), which sd-scripts'
    per-item TE cache and its collate (train_util.py:1748-1787) take as they are. sd-scripts' denoiser
    (library/hunyuan_image_models.py:240-355) masks both sequences and moves the valid ByT5 and Qwen
    tokens to the front per sample, so the longer Qwen padding changes no valid position.
    """
    import torch

    from te_align.encoding.core import encode_slot_tokens

    vlm_ids, vlm_mask, byt5_ids, byt5_mask = tokens
    qwen, byt5 = models
    for attr, ids in zip(arch.tokenizers, (vlm_ids, byt5_ids), strict=True):  # sd-scripts' order: Qwen, ByT5
        _check_token_width(p, _slot_name(arch, attr, p), getattr(tokenize_strategy, attr, None), ids)
    with torch.no_grad():  # as sd-scripts (hunyuan_image_text_encoder.py:545-548,610): neither encoder is trained
        if getattr(getattr(qwen, "dtype", None), "itemsize", 2) == 1:
            vlm_embed, vlm_out_mask = _encode_hunyuan_fp8(p, qwen, vlm_ids, vlm_mask)
        else:
            rq = encode_slot_tokens(p, p.slot("qwen"), qwen, vlm_ids, vlm_mask)
            vlm_embed, vlm_out_mask = rq.hidden, rq.denoiser_mask
        rb = encode_slot_tokens(p, p.slot("byt5"), byt5, byt5_ids, byt5_mask)
    ocr = rb.denoiser_mask.bool().any(dim=1).cpu()
    return [vlm_embed, vlm_out_mask, rb.hidden, rb.denoiser_mask, ocr.to(torch.bool)]


def _encode_hunyuan_fp8(p: AlignmentProfile, qwen: Any, ids: Any, mask: Any) -> tuple[Any, Any]:
    """--fp8_vl: float8 Qwen2.5-VL weights only run through sd-scripts' own forward (bf16 autocast and the
    float8 hooks it installs at load, hunyuan_image_text_encoder.py:411-491,544-546). It is handed the
    profile's tokens; it takes hidden_states[-3] and drops the first 34 positions, which is the profile's
    recipe when the profile says so (else refused). Floats then differ from an unquantised bf16 encoder."""
    from library import hunyuan_image_text_encoder as hte

    slot = p.slot("qwen")
    same = (slot.encoder.layer, slot.tokenizer.drop_start_tokens, slot.masks.repad, slot.masks.zero_padded, slot.encoder.final_layer_norm)
    if same != (-3, hte.PROMPT_TEMPLATE_ENCODE_START_IDX, "none", False, False) or not slot.masks.encoder:
        raise HookError(
            f"te-align kohya hunyuan_image: --fp8_vl runs Qwen2.5-VL through sd-scripts' own forward, which cannot follow "
            f"profile {p.name} (layer {slot.encoder.layer}, drop {slot.tokenizer.drop_start_tokens}, repad {slot.masks.repad}); "
            "remove --fp8_vl or those overrides"
        )
    _RUN.once("hunyuan:fp8", "te-align: --fp8_vl: Qwen2.5-VL encodes the profile's tokens through sd-scripts' float8 forward "
              "(bf16 autocast); floats differ from the official bf16 encoding by the quantisation")  # fmt: skip
    return hte.get_qwen_prompt_embeds_from_tokens(qwen, ids, mask)


def _is_chroma(models: Sequence[Any]) -> bool:
    return bool(models) and models[0] is not None and type(models[0]).__name__ == "DummyCLIPL"


# ---------------------------------------------------------------------------------------- caches
def _npz_fingerprint(path: str) -> str | None:
    import numpy as np

    try:
        with np.load(path) as data:
            return str(data[NPZ_KEY]) if NPZ_KEY in data.files else None
    except (OSError, ValueError, KeyError):
        return None


def _expected_fingerprint(arch: Arch, strategy: Any) -> str:
    tok = _tokenize_strategy()
    return cache_fingerprint(profile_for(arch.name, tok), tok, weighted=bool(getattr(strategy, "is_weighted", False)))


def _tokenize_strategy() -> Any:
    try:
        from library.strategy_base import TokenizeStrategy

        return TokenizeStrategy.get_strategy()
    except Exception:  # no sd-scripts strategy registry yet (tests build strategies directly)
        return None


def _stamp_npz(path: str, fingerprint: str) -> None:
    from pathlib import Path

    import numpy as np

    from te_align._atomic import atomic_file

    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays[NPZ_KEY] = np.array(fingerprint)
    with atomic_file(Path(path), "wb", error=HookError) as f:
        np.savez(f, **arrays)


def _report_reencoded() -> None:
    with _RUN.lock:
        n, done = _RUN.reencoded, _RUN.reencoded_logged
        _RUN.reencoded_logged = n
    if n > done:
        logger.warning("te-align: %d cached text-encoder output file(s) were made with another profile and are re-encoded", n - done)


atexit.register(_report_reencoded)


# ------------------------------------------------------------------------------------- the hook
@dataclass
class KohyaHook(Hook):
    name = "kohya"
    supported_versions = SUPPORTED

    def targets(self) -> Sequence[Target]:
        return all_targets()

    def detect_version(self) -> str:
        import sys
        from pathlib import Path

        mod = sys.modules.get("library")
        root = Path(mod.__file__).resolve().parent.parent if mod is not None and getattr(mod, "__file__", None) else None
        if root is None:
            return "unknown (sd-scripts 'library' not imported)"
        from te_align.patching.kohya import git_head

        head = git_head(root)
        return (VERIFIED_COMMITS.get(head, head[:7]) if head else "unknown (no git)") + f" at {root}"

    def replacement(self, resolved: ResolvedTarget) -> Any:
        t, original = resolved.target, resolved.original
        kind = t.qualname.rsplit(".", 1)[-1]
        arch = next((a for a in ARCHS if a.module == t.module), None)
        if t.module == "library.flux_utils":
            return _flux_probe(t.qualname, original)
        if t.qualname == "LoRANetwork.save_weights":
            return _stamping_save(original)
        if t in SAMPLE_TARGETS:
            from te_align.hooks import kohya_sample

            if kind == "__call__":
                return kohya_sample.pipeline_call_wrapper(kohya_sample.PIPELINE_ARCH[t.module], original)
            return kohya_sample.lpw_embeddings_wrapper(original)
        assert arch is not None, t.label
        from te_align.hooks import kohya_weights

        factory: dict[str, Callable[[Arch, Any], Any]] = {
            "tokenize": _tokenize_wrapper,
            "tokenize_with_weights": kohya_weights.tokenize_with_weights_wrapper,
            "encode_tokens_with_weights": kohya_weights.encode_tokens_with_weights_wrapper,
            "encode_tokens": _encode_wrapper,
            "is_disk_cached_outputs_expected": _cache_check_wrapper,
            "cache_batch_outputs": _cache_write_wrapper,
        }
        return factory[kind](arch, original)


def _tokenize_wrapper(arch: Arch, original: Any) -> Any:
    if arch.name == "lumina":

        def tokenize_lumina(self: Any, text: Any, is_negative: bool = False) -> Any:
            return _tokenize(arch, self, text, negative=is_negative)

        return mark_wrapper(tokenize_lumina, original)

    def tokenize(self: Any, text: Any) -> Any:
        return _tokenize(arch, self, text)

    return mark_wrapper(tokenize, original)


def _encode_wrapper(arch: Arch, original: Any) -> Any:
    def encode_tokens(self: Any, tokenize_strategy: Any, models: Any, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        if arch.name == "sd3" and len(args) >= 3:
            kwargs["enable_dropout"] = args[2]
        return _encode(arch, self, tokenize_strategy, models, tokens, **kwargs)

    return mark_wrapper(encode_tokens, original)


def _cache_check_wrapper(arch: Arch, original: Any) -> Any:
    def is_disk_cached_outputs_expected(self: Any, npz_path: str) -> bool:
        if not original(self, npz_path):
            return False
        want = _expected_fingerprint(arch, self)
        have = _npz_fingerprint(npz_path)
        if have == want:
            return True
        with _RUN.lock:
            _RUN.reencoded += 1
        _RUN.once(f"stale:{arch.name}", "te-align: %s was cached %s; it and any like it are re-encoded", npz_path,
                  "without a te-align profile" if have is None else f"with profile fingerprint {have[:12]}")  # fmt: skip
        return False

    return mark_wrapper(is_disk_cached_outputs_expected, original)


def _cache_write_wrapper(arch: Arch, original: Any) -> Any:
    def cache_batch_outputs(self: Any, tokenize_strategy: Any, models: Any, text_encoding_strategy: Any, infos: Any) -> Any:
        _report_reencoded()
        if arch.name == "flux" and _is_chroma(models):
            _RUN.record(flux_variant="chroma")
        result = original(self, tokenize_strategy, models, text_encoding_strategy, infos)
        if getattr(self, "cache_to_disk", False):
            fp = cache_fingerprint(profile_for(arch.name, tokenize_strategy), tokenize_strategy, weighted=bool(getattr(self, "is_weighted", False)))
            for info in infos:
                path = getattr(info, "text_encoder_outputs_npz", None)
                if path and os.path.exists(path):
                    _stamp_npz(path, fp)
        return result

    return mark_wrapper(cache_batch_outputs, original)


def _flux_probe(qualname: str, original: Any) -> Any:
    if qualname == "analyze_checkpoint_state":

        def analyze_checkpoint_state(ckpt_path: str, *a: Any, **k: Any) -> Any:
            result = original(ckpt_path, *a, **k)
            if _RUN.state().get("flux_variant") != "chroma":
                _RUN.record(flux_variant="schnell" if result[1] else "dev")
            return result

        return mark_wrapper(analyze_checkpoint_state, original)

    def dummy_init(self: Any, *a: Any, **k: Any) -> None:
        _RUN.record(flux_variant="chroma")
        original(self, *a, **k)

    return mark_wrapper(dummy_init, original)


def _stamping_save(original: Any) -> Any:
    def save_weights(self: Any, file: str, dtype: Any, metadata: Any) -> Any:
        p = _RUN.last_profile
        if p is None or not str(file).endswith(".safetensors"):
            return original(self, file, dtype, metadata)
        from te_align.metadata import stamp, stamp_keys

        if isinstance(metadata, dict):
            metadata.update(stamp_keys(p, {"trainer": "kohya-ss/sd-scripts", "options": _RUN.options}))
            return original(self, file, dtype, metadata)
        result = original(self, file, dtype, metadata)
        stamp(file, profile=p, extra={"trainer": "kohya-ss/sd-scripts", "options": _RUN.options})
        return result

    return mark_wrapper(save_weights, original)


# ------------------------------------------------------------------------------------ public API
def install(profile: Any = None, **overrides: Any) -> bool:
    """Install the kohya hooks (idempotent; all targets or none). Returns False under ``TE_ALIGN=off``.

    ``profile``: a profile name or object used for every architecture (default: ``TE_ALIGN_PROFILE``,
    else chosen per architecture). ``overrides``: profile overrides and ``kohya.*`` hook options
    (merged over ``TE_ALIGN_OVERRIDES``; pass dotted keys with ``**{"kohya.clip_g_exclamation": ...}``).
    """
    global _HOOK
    if hooks_disabled():
        logger.info("te-align: kohya hooks disabled by TE_ALIGN=%s; sd-scripts runs unmodified", os.environ.get("TE_ALIGN"))
        return False
    merged = {**_env_overrides(), **overrides}
    profile_ov, options = _split_overrides(merged)
    chosen = profile if profile is not None else (os.environ.get(ENV_PROFILE) or None)
    if chosen is not None and not isinstance(chosen, str):
        from te_align.profiles import AlignmentProfile

        if not isinstance(chosen, AlignmentProfile):
            raise HookError(f"profile must be a name or an AlignmentProfile, got {type(chosen).__name__}")
    elif isinstance(chosen, str):
        from te_align.profiles import profile as load

        load(chosen)  # fail early with the profile registry's message
    with _RUN.lock:
        if _HOOK is not None and _HOOK.is_installed:
            same = (_RUN.explicit, _RUN.overrides, _RUN.options) == (chosen, profile_ov, {**_RUN.options, **options})
            if not same:
                _configure(chosen, profile_ov, options)
            return True
        hook = KohyaHook()
        _configure(chosen, profile_ov, options)
        hook.install()
        _HOOK = hook
    logger.info("te-align: kohya hooks active (%s)", SUPPORTED)
    if merged:
        logger.info("te-align: user overrides for kohya: %s", json.dumps(merged, sort_keys=True, default=str))
    return True


def _configure(chosen: Any, profile_ov: dict[str, Any], options: dict[str, str]) -> None:
    _RUN.explicit = chosen
    _RUN.overrides = profile_ov
    _RUN.options = {"kohya.clip_g_exclamation": "official", **options}
    _RUN.profiles.clear()


def uninstall() -> None:
    """Restore every replaced method (idempotent)."""
    global _HOOK
    with _RUN.lock:
        if _HOOK is not None:
            _HOOK.uninstall()
        _HOOK = None
        _RUN.profiles.clear()
        _RUN.explicit = None
        _RUN.overrides = {}
        _RUN.options = {"kohya.clip_g_exclamation": "official"}
        _RUN.last_profile = None
        _RUN.reencoded = _RUN.reencoded_logged = 0
        _RUN.logged.clear()


def is_installed() -> bool:
    return _HOOK is not None and _HOOK.is_installed


def check() -> None:
    """Resolve every target without changing anything; raises HookError listing each problem."""
    KohyaHook().check()


def _activate_from_environment() -> None:
    import te_align

    # The te-align CLI itself (patch/status read this module's target list) never installs hooks.
    if os.environ.get(ENV_ACTIVE, "").strip() == "1" and not getattr(te_align, "_running_cli", False):
        install()


_activate_from_environment()

__all__ = ["ARCHS", "ENV_ACTIVE", "ENV_OVERRIDES", "ENV_PROFILE", "KohyaHook", "all_targets", "check", "install", "is_installed", "profile_for", "uninstall"]
