"""Runtime hooks for kohya-ss/musubi-tuner: its Qwen-Image and Wan text encoding by a profile, the fingerprint in its
text-encoder cache files, and stale cache files re-encoded (or refused at training start).

musubi-tuner encodes captions once, in ``<arch>_cache_text_encoder_outputs.py``, into ``*_<short>_te.safetensors``
files that training reads; its training scripts encode sample prompts with the same functions. Targets (read and
verified at kohya-ss/musubi-tuner@30c658c, 0.3.4; module paths under ``musubi_tuner``):

==========  =====================================================  ==============================================
part        target                                                 replaced by
==========  =====================================================  ==============================================
qwen        ``qwen_image.qwen_image_utils.get_qwen_prompt_embeds``  :func:`te_align.encode` with musubi-tuner's
                                                                   tokenizer and Qwen2.5-VL; its return layout
                                                                   (embeddings padded to the batch's longest, the
                                                                   mask of the real tokens)
wan         ``wan.modules.t5.T5EncoderModel.__call__``             the profile's tokenization, masks and layer
                                                                   with musubi-tuner's own umT5 module; its return
                                                                   layout (each caption's real tokens)
cache       ``dataset.cache_io.save_text_encoder_output_cache_     the cache file's metadata gets the profile name
            common`` + ``utils.safetensors_utils.mem_eff_save_     and fingerprint (``te_align_profile``,
            file``                                                 ``te_align_fingerprint``)
cache       ``cache_text_encoder_outputs.process_text_encoder_     ``--skip_existing`` keeps only files with the
            batches``                                              current fingerprint: the rest are re-encoded
check       ``dataset.image_video_dataset.ImageDataset`` /         training refuses to start on cached outputs of
            ``VideoDataset.prepare_for_training``                  another fingerprint (one line: cache again)
==========  =====================================================  ==============================================

What the profile changes (``te-align check`` names each, file:line): Qwen-Image keeps 512 tokens (musubi-tuner: up
to 1024). Wan: musubi-tuner's encoding already follows the pipeline (512 tokens, the pipeline's caption cleaning,
mask into umT5, zero-padded to 512). ``--fp8_vl`` / ``--fp8_t5`` keep the quantized weights (the profile decides
the recipe, not the weights' precision; ``check`` warns about them).

Activation: :func:`boot` (the block ``te-align patch`` appends to ``src/musubi_tuner/__init__.py``) installs the
parts for the script being run (``qwen_image_*`` / ``wan_*``; Qwen-Image's edit and layered versions and the
architectures te-align has no profile for run unmodified, with one log line). Profile: ``install(profile=…)`` /
``TE_ALIGN_PROFILE``, else the architecture's (``qwen-image``, ``wan21``); overrides: ``TE_ALIGN_OVERRIDES`` and
``install(**overrides)``, as for every trainer (:mod:`te_align.hooks.base`). ``TE_ALIGN=off`` leaves musubi-tuner
unmodified.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from te_align._git import git_head
from te_align._lazy import lazy_module
from te_align._safetensors import read_header
from te_align.errors import TeAlignError
from te_align.hooks.base import (
    Hook,
    HookError,
    Lifecycle,
    Target,
    hooks_disabled,
    log_to_console,
    mark_wrapper,
)
from te_align.profiles.overrides import env_profile
from te_align.trainers.musubi import names
from te_align.trainers.musubi.audit import COMMIT, META_FINGERPRINT, META_PROFILE, parse_args

# imported on first use: keeps torch off this module's import (te-align patch and check read it)
_encoding_core = lazy_module("te_align.encoding.core")

if TYPE_CHECKING:  # pragma: no cover
    from types import SimpleNamespace

    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from te_align.encoding import core as _core
    from te_align.hooks.base import ProfileSource
    from te_align.profiles import AlignmentProfile
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _core = lazy_module("te_align.encoding.core")

logger = logging.getLogger("te_align")

#: The musubi-tuner commits the targets were read and verified against.
SUPPORTED: dict[str, str] = {COMMIT: "musubi-tuner 0.3.4 (30c658c)"}
_M = "musubi_tuner"
PARTS: tuple[str, ...] = ("qwen", "wan", "cache", "check")
#: Which part encodes each hooked architecture, and its profile family.
ENCODERS: dict[str, tuple[str, str]] = {"qwen_image": ("qwen", "qwen-image"), "wan": ("wan", "wan")}

_STAMP: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("te_align_musubi_stamp", default=None)


class _Encoder:
    """musubi-tuner's umT5 module (``T5Encoder.forward(ids, mask)`` -> last hidden state) as the Hugging Face-style
    encoder :mod:`te_align.encoding` calls (``encoder(input_ids=…, attention_mask=…).last_hidden_state``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        from types import SimpleNamespace

        self.model = model
        self.config = SimpleNamespace(d_model=getattr(model, "dim", None))

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: object
    ) -> SimpleNamespace:
        from types import SimpleNamespace

        return SimpleNamespace(last_hidden_state=self.model(input_ids, attention_mask))


class _TokenizerWrapper(Protocol):
    """musubi-tuner's ``HuggingfaceTokenizer`` (wan/modules/tokenizers.py): the tokenizer it wraps."""

    tokenizer: PreTrainedTokenizerBase


class _WanT5(Protocol):
    """What the Wan hook reads of musubi-tuner's ``T5EncoderModel`` (wan/modules/t5.py)."""

    tokenizer: _TokenizerWrapper
    model: torch.nn.Module


class _Dataset(Protocol):
    """What the training check reads of musubi-tuner's ``ImageDataset`` / ``VideoDataset``."""

    cache_directory: str

    def get_all_text_encoder_output_cache_files(self) -> Iterable[str]: ...


@dataclass
class MusubiHook(Hook):
    """The targets of :data:`PARTS` (``parts``: which ones)."""

    name: ClassVar[str] = "musubi-tuner"
    supported: ClassVar[dict[str, str]] = SUPPORTED

    parts: tuple[str, ...] = PARTS

    def __post_init__(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise HookError(f"unknown part '{bad[0]}'; known: {', '.join(PARTS)}")

    def targets(self) -> Sequence[Target]:
        out: list[Target] = []
        if "qwen" in self.parts:
            out.append(Target(f"{_M}.qwen_image.qwen_image_utils", "get_qwen_prompt_embeds", ("tokenizer", "vlm", "prompt"),
                              wrap=self._qwen))
        if "wan" in self.parts:
            out.append(Target(f"{_M}.wan.modules.t5", "T5EncoderModel.__call__", ("self", "texts", "device"), wrap=self._wan))
        if "cache" in self.parts:
            out += [
                Target(f"{_M}.dataset.cache_io", "save_text_encoder_output_cache_common",
                       ("item_info", "sd", "arch_fullname", "merge_existing"), wrap=self._save),
                Target(f"{_M}.utils.safetensors_utils", "mem_eff_save_file", ("tensors", "filename", "metadata"),
                       wrap=self._stamp),
                Target(f"{_M}.cache_text_encoder_outputs", "process_text_encoder_batches",
                       ("num_workers", "skip_existing", "batch_size", "datasets", "all_cache_files_for_dataset",
                        "all_cache_paths_for_dataset", "encode", "requires_content"), wrap=self._batches),
            ]
        if "check" in self.parts:
            out += [Target(f"{_M}.dataset.image_video_dataset", f"{cls}.prepare_for_training",
                           ("self", "num_timestep_buckets"), wrap=self._check) for cls in ("ImageDataset", "VideoDataset")]
        return out

    def detect_version(self) -> str:
        mod = sys.modules.get(_M)
        path = getattr(mod, "__file__", None) if mod is not None else None
        if not path:
            return "unknown (musubi_tuner not imported)"
        root = Path(path).resolve().parent.parent.parent  # src/musubi_tuner/__init__.py -> the checkout
        head = git_head(root)
        return (self.supported.get(head, head[:7]) if head else "unknown (no git)") + f" at {root}"

    # -- profiles ------------------------------------------------------------------------------
    def profile(self, prefix: str) -> AlignmentProfile:
        """The profile an architecture's calls follow (the user's, else the architecture's own)."""
        arch = names.BY_PREFIX[prefix]
        p = self.user.profile(arch.profile)
        family = ENCODERS[prefix][1]
        if p.family != family:
            raise HookError(f"te-align: musubi-tuner's {arch.display} encodes {family} prompts but the profile "
                            f"'{p.name}' is for {p.family}")
        return p

    def _by_short(self, short: str) -> AlignmentProfile | None:
        arch = names.BY_SHORT.get(short)
        return self.profile(arch.prefix) if arch is not None and arch.prefix in ENCODERS else None

    # -- encoding ------------------------------------------------------------------------------
    def _qwen(self, original: Callable[..., object]) -> Callable[..., object]:
        def get_qwen_prompt_embeds(
            tokenizer: PreTrainedTokenizerBase,
            vlm: PreTrainedModel,
            prompt: str | Sequence[str] | None = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            import torch

            p = self.profile("qwen_image")
            prompts = [prompt] if isinstance(prompt, str) else list(prompt or [])
            dtype = vlm.dtype
            fp8 = dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
            device = vlm.device
            autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if fp8 else contextlib.nullcontext()
            with torch.no_grad(), autocast:  # as the original runs an fp8 model (qwen_image_utils.py:353-356)
                out = _encoding_core.encode(p, prompts, tokenizers={p.slot("qwen").tokenizer_subfolder: tokenizer},
                                      text_encoders={p.slot("qwen").encoder_subfolder: vlm})
            return out["prompt_embeds"].to(dtype=dtype, device=device), out["prompt_embeds_mask"].long().to(device)

        return mark_wrapper(get_qwen_prompt_embeds, original)

    def _wan(self, original: Callable[..., object]) -> Callable[..., object]:
        def __call__(
            model: _WanT5, texts: str | Sequence[str], device: torch.device | str
        ) -> list[torch.Tensor]:
            import torch

            p = self.profile("wan")
            slot = p.slot("t5")
            batch = [texts] if isinstance(texts, str) else list(texts)
            ids, mask = _core.tokenize_slot(slot, model.tokenizer.tokenizer, batch)
            with torch.no_grad():
                encoder = _Encoder(model.model)
                res = _core.encode_slot_tokens(p, slot, encoder, ids.to(device), mask.to(device))
            return [u[:v] for u, v in zip(res.hidden, res.token_counts, strict=True)]

        return mark_wrapper(__call__, original)

    # -- cache ---------------------------------------------------------------------------------
    def _save(self, original: Callable[..., object]) -> Callable[..., object]:
        def save_text_encoder_output_cache_common(
            item_info: object, sd: dict[str, torch.Tensor], arch_fullname: str, *args: object, **kw: object
        ) -> object:
            arch = next((a for a in names.ARCHS if a.prefix in ENCODERS and arch_fullname == _full(a)), None)
            token = _STAMP.set(None if arch is None else _stamp(self.profile(arch.prefix)))
            try:
                return original(item_info, sd, arch_fullname, *args, **kw)
            finally:
                _STAMP.reset(token)

        return mark_wrapper(save_text_encoder_output_cache_common, original)

    def _stamp(self, original: Callable[..., object]) -> Callable[..., object]:
        def mem_eff_save_file(
            tensors: dict[str, torch.Tensor],
            filename: str,
            metadata: dict[str, str] | None = None,
            *args: object,
            **kw: object,
        ) -> object:
            stamp = _STAMP.get()
            if stamp is not None:
                metadata = {**(metadata or {}), **stamp}
            return original(tensors, filename, metadata, *args, **kw)

        return mark_wrapper(mem_eff_save_file, original)

    def _batches(self, original: Callable[..., object]) -> Callable[..., object]:
        def process_text_encoder_batches(
            num_workers: object,
            skip_existing: bool,
            batch_size: object,
            datasets: Sequence[object],
            all_cache_files_for_dataset: Sequence[Collection[str]],
            *args: object,
            **kw: object,
        ) -> object:
            if skip_existing:  # only files of the current fingerprint count as existing: the rest are encoded again
                kept: list[Collection[str]] = []
                for ds, files in zip(datasets, all_cache_files_for_dataset, strict=True):
                    p = self._by_short(str(getattr(ds, "architecture", "")))
                    if p is None:
                        kept.append(files)
                        continue
                    fresh = {f for f in files if _fingerprint(f) == p.fingerprint()}
                    if len(fresh) < len(files):
                        logger.warning("te-align: %d cached text-encoder output(s) in %s were made without te-align or "
                                       "under another profile; --skip_existing keeps only those of profile %s "
                                       "(fingerprint %s): the rest are encoded again", len(files) - len(fresh),
                                       getattr(ds, "cache_directory", "?"), p.name, p.fingerprint())
                    kept.append(fresh)
                all_cache_files_for_dataset = kept
            return original(num_workers, skip_existing, batch_size, datasets, all_cache_files_for_dataset, *args, **kw)

        return mark_wrapper(process_text_encoder_batches, original)

    def _check(self, original: Callable[..., object]) -> Callable[..., object]:
        def prepare_for_training(dataset: _Dataset, *args: object, **kw: object) -> object:
            result = original(dataset, *args, **kw)
            short = str(getattr(dataset, "architecture", ""))
            p = self._by_short(short)
            if p is not None:
                files = list(dataset.get_all_text_encoder_output_cache_files())
                stale = [f for f in files if _fingerprint(f) != p.fingerprint()]
                if stale:
                    arch = names.BY_SHORT[short]
                    raise HookError(
                        f"te-align: {len(stale)} of {len(files)} cached text-encoder outputs in "
                        f"{dataset.cache_directory} were made without te-align or under another profile than "
                        f"{p.name} (fingerprint {p.fingerprint()}); cache them again with te-align's hooks "
                        f"({arch.prefix}_cache_text_encoder_outputs.py in the patched checkout), or train on them as "
                        "they are with TE_ALIGN=off")
                self.once(f"train:{short}", "te-align: musubi-tuner trains on text-encoder outputs cached by profile %s "
                          "(fingerprint %s)", p.name, p.fingerprint())
            return result

        return mark_wrapper(prepare_for_training, original)

    def once(self, key: str, msg: str, *args: object) -> None:
        logged = self.__dict__.setdefault("_logged", set())
        if key not in logged:
            logged.add(key)
            logger.info(msg, *args)


def _full(arch: names.Arch) -> str:
    """The architecture's full name in musubi-tuner's cache metadata (dataset/architectures.py)."""
    return {"qwen_image": "qwen_image", "wan": "wan"}[arch.prefix]


def _stamp(profile: AlignmentProfile) -> dict[str, str]:
    return {META_PROFILE: profile.name, META_FINGERPRINT: profile.fingerprint()}


def _fingerprint(path: str) -> str:
    """The te-align fingerprint in a cache file's metadata ("" when it has none or cannot be read)."""
    try:
        return (read_header(path).metadata or {}).get(META_FINGERPRINT, "")
    except (OSError, TeAlignError):
        return ""


# ------------------------------------------------------------------------------------ install
LIFECYCLE = Lifecycle("musubi-tuner", MusubiHook, console=log_to_console)


def install(profile: ProfileSource = None, *, parts: Sequence[str] = PARTS, **overrides: object) -> bool:
    """Install the musubi-tuner hooks (all targets of ``parts`` or none; idempotent). False under ``TE_ALIGN=off``."""
    return LIFECYCLE.install(profile, overrides, parts=tuple(parts))


def uninstall() -> None:
    LIFECYCLE.uninstall()


def is_installed() -> bool:
    return LIFECYCLE.is_installed()


def current() -> MusubiHook | None:
    return LIFECYCLE.current()  # type: ignore[return-value]


def parts_for(argv: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """The parts to install for a process started with ``argv`` (its script and options), and why."""
    script = next((a for a in argv if a.endswith(".py")), "")
    found = names.script_arch(script)
    if found is None:
        return (), f"{Path(script).name or 'this process'} is not a musubi-tuner training or caching script"
    arch, kind = found
    if kind in names.LATENT_KINDS:
        return (), f"{Path(script).name} caches latents only (no text encoder runs)"
    if arch.prefix not in ENCODERS:
        return (), f"te-align has no profile for {arch.display}"
    values, _, _ = parse_args(list(argv))
    version = names.qwen_version(values) if arch.prefix == "qwen_image" else "original"
    if version != "original":
        return (), f"te-align has no profile for {names.QWEN_VERSIONS.get(version, version)}"
    return (ENCODERS[arch.prefix][0], "cache", "check"), f"{arch.display} ({Path(script).name})"


def boot(profile: str | None = None, argv: Sequence[str] | None = None) -> bool:
    """Install the hooks this process needs (the block ``te-align patch`` appends to ``musubi_tuner/__init__.py``
    calls it with the pinned profile): the parts for the script in ``argv`` (default ``sys.argv``)."""
    import os

    if hooks_disabled():
        log_to_console()
        logger.info("te-align: musubi-tuner hooks disabled by TE_ALIGN=%s; musubi-tuner runs unmodified",
                    os.environ.get("TE_ALIGN"))
        return False
    parts, why = parts_for(list(sys.argv if argv is None else argv))
    if not parts:
        log_to_console()
        logger.info("te-align: not active in this musubi-tuner process (%s)", why)
        return False
    return install(env_profile() or profile, parts=parts)
