"""Runtime hooks for kohya-ss/sd-scripts (and the kohya_ss GUI, which runs it): tokenize and encode by a profile.

sd-scripts builds one tokenize strategy and one text-encoding strategy per architecture
(``library/strategy_<arch>.py``); tokenization runs in the Dataset (DataLoader workers) and encoding
in ``NetworkTrainer.process_batch`` or while caching TE outputs. The hooks replace, in place on
those classes, ``tokenize`` and ``encode_tokens`` with functions that call :mod:`te_align.encoding`
(:func:`~te_align.encoding.core.tokenize_slot` / :func:`~te_align.encoding.core.encode_slot_tokens`)
and return sd-scripts' own tuple layout, so everything downstream is unchanged. Cached TE outputs
(``*_te*.npz``) get the profile fingerprint and are re-encoded when it differs; saved LoRAs get the
te_align metadata stamp.

Activation: ``install(profile=None, **overrides)``, or ``TE_ALIGN_ACTIVE=1`` in the environment,
which installs at import time of this module. The drop-in train scripts (``te-align patch``) set it
and import this module at their top level, and DataLoader workers started with *spawn* re-import the
main script, so every process of a run is hooked. ``TE_ALIGN=off`` leaves sd-scripts unmodified.

Profile choice: ``install(profile=...)`` / ``TE_ALIGN_PROFILE``; otherwise per architecture
(SD1 ``sd15``, SD2 ``sd21`` (tokenizer pad "!"), SDXL ``sdxl``, SD3 ``sd35-large`` (every bundled
SD3 profile has the same behaviour), Flux ``flux-dev``/``flux-schnell`` from sd-scripts' own
checkpoint analysis, Chroma ``chroma``, Lumina 2 ``lumina2``). Overrides: keyword arguments and
``TE_ALIGN_OVERRIDES`` (JSON object; keyword arguments win); keys starting with ``kohya.`` are
hook options, the rest are profile overrides. Hook options:

* ``kohya.clip_g_exclamation``: ``"official"`` (default; every literal "!" becomes the pad token
  id 0, as the hub ``tokenizer_2`` of SDXL/SD3 does) or ``"sd-scripts"`` (plain BPE "!", as
  sd-scripts' laion tokenizer and open_clip do).

HunyuanImage and Anima have no bundled profile; their strategies are left unmodified.
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
)  # fmt: skip

#: encode_tokens parameters per architecture (sd-scripts 48d368f).
ENCODE_PARAMS: dict[str, tuple[str, ...]] = {
    "sd": ("self", "tokenize_strategy", "models", "tokens"),
    "sdxl": ("self", "tokenize_strategy", "models", "tokens"),
    "sd3": ("self", "tokenize_strategy", "models", "tokens", "apply_lg_attn_mask", "apply_t5_attn_mask", "enable_dropout"),
    "flux": ("self", "tokenize_strategy", "models", "tokens", "apply_t5_attn_mask"),
    "lumina": ("self", "tokenize_strategy", "models", "tokens"),
}
#: LoRA network modules whose ``LoRANetwork.save_weights(self, file, dtype, metadata)`` gets the stamp.
NETWORK_MODULES = ("networks.lora", "networks.lora_flux", "networks.lora_sd3", "networks.lora_lumina")
#: Facts recorded from sd-scripts itself: the Flux checkpoint analysis and Chroma's dummy CLIP-L.
FLUX_PROBES = (
    Target("library.flux_utils", "analyze_checkpoint_state", ("ckpt_path",)),
    Target("library.flux_utils", "DummyCLIPL.__init__", ("self",)),
)
#: Architectures whose tokenize strategy has sd-scripts' --weighted_captions path (48d368f).
WEIGHTED = ("sd", "sdxl", "lumina")
#: Architectures in sd-scripts without a bundled profile: not hooked (named in the log).
UNHOOKED = {"hunyuan_image": "library.strategy_hunyuan_image", "anima": "library.strategy_anima"}


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
    # --weighted_captions takes sd-scripts' own weighted path, which does not follow a profile.
    out.extend(Target(a.module, f"{a.tokenize_cls}.tokenize_with_weights", ("self", "text")) for a in ARCHS if a.name in WEIGHTED)
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
    return {"sdxl": "sdxl", "sd3": "sd35-large", "lumina": "lumina2", "chroma": "chroma"}[arch]


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


def cache_fingerprint(p: AlignmentProfile, strategy: Any = None) -> str:
    """Fingerprint stored in TE-output caches: the profile's, plus hook options that change outputs."""
    fp = p.fingerprint()
    if _RUN.options["kohya.clip_g_exclamation"] != "official" and any(s.name == "clip_g" for s in p.slots):
        fp += "+clip_g_exclamation=sd-scripts"
    chunks = _chunk_options(p.family, strategy).long_prompt_chunks if strategy is not None else 0
    if chunks:
        fp += f"+long_prompt_chunks={chunks}"
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
    return {"tokenizer1": "clip_l", "tokenizer2": "clip_g", "clip_l": "clip_l", "clip_g": "clip_g", "t5xxl": "t5"}[attr]


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


def _tokenize(arch: Arch, strategy: Any, text: Any, negative: bool = False) -> Any:
    import torch

    from te_align.encoding.core import tokenize_slot

    texts = [text] if isinstance(text, str) else list(text)
    p = profile_for(arch.name, strategy)
    _note_setting_differences(arch, strategy, p)
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
    if name == "sd":
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
    return cache_fingerprint(profile_for(arch.name, tok), tok)


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
        assert arch is not None, t.label
        factory: dict[str, Callable[[Arch, Any], Any]] = {
            "tokenize": _tokenize_wrapper,
            "tokenize_with_weights": _refuse_weighted,
            "encode_tokens": _encode_wrapper,
            "is_disk_cached_outputs_expected": _cache_check_wrapper,
            "cache_batch_outputs": _cache_write_wrapper,
        }
        return factory[kind](arch, original)


def _refuse_weighted(arch: Arch, original: Any) -> Any:
    def tokenize_with_weights(self: Any, text: Any, *a: Any, **k: Any) -> Any:
        raise HookError(
            "te-align: --weighted_captions is not supported while te-align's kohya hooks are active (sd-scripts' "
            "weighted path scales hidden states its own way and would bypass the profile). Remove "
            "--weighted_captions, or run this training unmodified with TE_ALIGN=off"
        )

    return mark_wrapper(tokenize_with_weights, original)


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
            fp = cache_fingerprint(profile_for(arch.name, tokenize_strategy), tokenize_strategy)
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
    logger.info("te-align: kohya hooks active (%s); unhooked architectures without a profile: %s", SUPPORTED, ", ".join(UNHOOKED))
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
