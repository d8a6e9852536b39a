"""Pretrained shapes-world base models shipped with te-align (float16, SHA-256 checked on every load).

A base is a real diffusers pipeline pretrained from scratch on :mod:`te_align.tiny.world` with exactly its
family's profile (``tools/world_build.py``; how in ``benchmarks/learnability/bench_learnability.md``). The package ships, under
``world/te_align_world/``, each neural component's config and float16 weights once:

* ``encoders/clip_l``, ``encoders/clip_g``, ``encoders/t5``: the text encoders, pretrained on world captions and
  shared by every base, as SD 1.5, SDXL, SD3 and Flux share CLIP-L and SD3 and Flux share T5;
  ``encoders/t5_cased``: the Chroma base's own T5, the shared one continued on captions with capitalised words
  (``benchmarks/learnability/bench_learnability.md`` amendment 11; the SD3 and Flux bases keep the shared one);
* ``vae``: the autoencoder, shared by every base;
* ``<name>/``: the base's denoiser, its scheduler config, ``model_index.json`` and ``base.json`` (what was trained
  how, for how many samples and how long, its measured held-out accuracy, its sampling settings, and the
  SHA-256 of every file it uses, shared ones included).

The tokenizers are not shipped: they are the real-convention tokenizers of :mod:`te_align.tiny.tokenizers`,
rebuilt offline. :func:`materialize` checks every hash and writes a complete float32 diffusers folder into the user
cache (``$XDG_CACHE_HOME/te-align/world/<name>-<digest>``) that ``te-align train``, ``te-align ab run --model
world:NAME`` and the official pipelines' ``from_pretrained`` load. :func:`load` returns the official pipeline
whose plain call ``pipe(prompt)`` samples at the base's size and sampling settings (the profile's T5 length, the
guidance it was evaluated with).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_align import _quiet
from te_align._extras import MissingExtra
from te_align.errors import TeAlignError

__all__ = ["BASES", "BaseError", "BaseSpec", "base_info", "base_profile", "data_root", "load", "materialize", "shipped", "verify"]

MANIFEST = "base.json"
FORMAT = 2
#: Where a materialized folder records its digest and the hashes of what it wrote.
MARKER = ".te-align-base"


class BaseError(TeAlignError):
    """A shipped base that is missing, altered or cannot be built."""


@dataclass(frozen=True)
class BaseSpec:
    name: str
    family: str  # te_align.tiny.encoders.family_components family
    profile: str  # the bundled profile it was pretrained with
    pipeline: str  # the official diffusers pipeline class
    denoiser: str  # the pipeline's denoiser component


#: The world bases te-align knows. A base whose files are not shipped is refused with one line.
BASES: dict[str, BaseSpec] = {
    "sd3": BaseSpec("sd3", "sd3", "sd35-large", "StableDiffusion3Pipeline", "transformer"),
    "flux": BaseSpec("flux", "flux", "flux-schnell", "FluxPipeline", "transformer"),
    "sdxl": BaseSpec("sdxl", "sdxl", "sdxl", "StableDiffusionXLPipeline", "unet"),
    "sd15": BaseSpec("sd15", "sd15", "sd15", "StableDiffusionPipeline", "unet"),
    "chroma": BaseSpec("chroma", "chroma", "chroma", "ChromaPipeline", "transformer"),
    # issue 49: FLUX.2 klein's recipe at tiny size (te_align.tiny.klein; plan and decision benchmarks/klein/bench_klein.md)
    "klein": BaseSpec("klein", "klein", "flux2-klein-4b", "Flux2KleinPipeline", "transformer"),
}

#: Per family: text-encoder component -> (shared encoder folder, transformers class); tokenizer component ->
#: (kind, CLIP pad token). The classes are those of te_align.tiny.encoders.family_components.
ENCODERS: dict[str, dict[str, tuple[str, str]]] = {
    "sd3": {
        "text_encoder": ("clip_l", "CLIPTextModelWithProjection"),
        "text_encoder_2": ("clip_g", "CLIPTextModelWithProjection"),
        "text_encoder_3": ("t5", "T5EncoderModel"),
    },
    "flux": {"text_encoder": ("clip_l", "CLIPTextModel"), "text_encoder_2": ("t5", "T5EncoderModel")},
    "sdxl": {
        "text_encoder": ("clip_l", "CLIPTextModel"),
        "text_encoder_2": ("clip_g", "CLIPTextModelWithProjection"),
    },
    "sd15": {"text_encoder": ("clip_l", "CLIPTextModel")},
    "chroma": {"text_encoder": ("t5_cased", "T5EncoderModel")},
    "klein": {"text_encoder": ("qwen3_klein", "Qwen3ForCausalLM")},
}
TOKENIZERS: dict[str, dict[str, tuple[str, str]]] = {
    "sd3": {"tokenizer": ("clip", "<|endoftext|>"), "tokenizer_2": ("clip", "!"), "tokenizer_3": ("t5", "")},
    "flux": {"tokenizer": ("clip", "<|endoftext|>"), "tokenizer_2": ("t5", "")},
    "sdxl": {"tokenizer": ("clip", "<|endoftext|>"), "tokenizer_2": ("clip", "!")},
    "sd15": {"tokenizer": ("clip", "<|endoftext|>")},
    "chroma": {"tokenizer": ("t5", "")},
    "klein": {"tokenizer": ("qwen3", "")},
}
#: Constructor arguments of the official pipelines besides their components.
PIPELINE_KWARGS: dict[str, dict[str, Any]] = {
    "sdxl": {"add_watermarker": False, "force_zeros_for_empty_prompt": True},
    "sd15": {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False},
}
#: Families whose pipeline decodes ``latents / scaling_factor`` only (their autoencoder config carries no shift).
UNSHIFTED = ("sdxl", "sd15")


def data_root() -> Path:
    """The shipped world data: the ``te_align_world`` package (the ``te-align-world`` distribution, ``world/`` in a
    te-align clone), kept out of te-align's core so that the core stays small."""
    try:
        import te_align_world
    except ModuleNotFoundError:
        raise MissingExtra(
            "the world bases are the te-align-world package, which is not installed in this Python "
            f"({sys.executable}); from a te-align clone: pip install ./world \".[train]\"") from None
    return te_align_world.ROOT


def shipped(source: str | Path | None = None) -> list[str]:
    """The bases whose ``base.json`` is in the world data root ``source`` (default: the package's), in
    :data:`BASES` order."""
    root = Path(source) if source is not None else data_root()
    return [name for name in BASES if (root / name / MANIFEST).is_file()]


def _spec(name: str) -> BaseSpec:
    if name not in BASES:
        raise BaseError(f"no world base {name!r}; known: {', '.join(BASES)}")
    return BASES[name]


def base_info(name: str, source: str | Path | None = None) -> dict[str, Any]:
    """``base.json`` of base ``name``: what was trained how, its metrics, its sampling settings, file hashes.

    ``source``: a world data root written by ``tools/ship_base.py`` elsewhere (default: the package's)."""
    _spec(name)
    path = (Path(source) if source is not None else data_root()) / name / MANIFEST
    if not path.is_file():
        raise BaseError(f"the {name} world base is not shipped with this te-align (no {MANIFEST})", file=str(path))
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BaseError(f"unreadable ({e}); reinstall te-align", file=str(path)) from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or not isinstance(info.get("files"), dict):
        raise BaseError(f"not a format-{FORMAT} base manifest; reinstall te-align", file=str(path))
    return info


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_files(root: Path, files: dict[str, str], what: str) -> None:
    for rel, digest in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            raise BaseError(f"{what} file missing; {_FIX[what]}", file=str(path))
        got = _sha256(path)
        if got != digest:
            raise BaseError(
                f"SHA-256 {got[:12]}… differs from the recorded {digest[:12]}…: the {what} file was altered; "
                f"{_FIX[what]}",
                file=str(path),
            )


_FIX = {"shipped": "reinstall te-align", "cached": "delete the folder (it is rebuilt on the next load)"}


def verify(name: str, source: str | Path | None = None) -> dict[str, Any]:
    """Check the SHA-256 of every file base ``name`` uses; returns its ``base.json``. Raises :class:`BaseError`."""
    info = base_info(name, source)
    _check_files(Path(source) if source is not None else data_root(), info["files"], "shipped")
    return info


def _cache_root() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "te-align" / "world"


def _digest(info: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]


def _tokenizers(family: str) -> dict[str, Any]:
    from te_align.tiny import tokenizers as tok

    out = {}
    for comp, (kind, pad) in TOKENIZERS[family].items():
        if kind == "qwen3":  # the Qwen3 instruct tokenizer with its real chat template (the klein base)
            out[comp] = tok.qwen3_instruct_tokenizer()
            continue
        out[comp] = tok.clip_tokenizer(pad=pad) if kind == "clip" else tok.t5_tokenizer()
    return out


def _assemble(spec: BaseSpec, root: Path, info: dict[str, Any]) -> Any:
    """The official pipeline of ``spec`` built from the shipped files (float32)."""
    import diffusers
    import torch
    import transformers

    comps: dict[str, Any] = dict(_tokenizers(spec.family))
    for comp, (folder, cls_name) in ENCODERS[spec.family].items():
        src = root / "encoders" / folder
        cls = getattr(transformers, cls_name)
        if cls_name == "CLIPTextModel":  # the shared CLIP-L carries a projection the plain tower does not use
            full = transformers.CLIPTextModelWithProjection.from_pretrained(str(src), dtype=torch.float32)
            model = cls(full.config)
            tower = {k.removeprefix("text_model."): v for k, v in full.state_dict().items() if not k.startswith("text_projection.")}
            # the tower's names carry a "text_model." prefix or not depending on the transformers version
            model.load_state_dict({k: tower[k.removeprefix("text_model.")] for k in model.state_dict()}, strict=True)
        else:
            model = cls.from_pretrained(str(src), dtype=torch.float32)
        comps[comp] = model.float().eval()
    vae = diffusers.AutoencoderKL.from_pretrained(str(root / "vae"), dtype=torch.float32)
    if spec.family == "klein":  # the shared autoencoder as an AutoencoderKLFlux2, its latent statistics from base.json
        from te_align.tiny.klein import klein_vae

        vae = klein_vae(vae)
        bn = info["pretrain"]["vae_bn"]
        vae.bn.running_mean.copy_(torch.tensor(bn["mean"], dtype=torch.float32))
        vae.bn.running_var.copy_(torch.tensor(bn["var"], dtype=torch.float32))
    if spec.family in UNSHIFTED:
        vae.register_to_config(shift_factor=None)
    comps["vae"] = vae.eval()
    denoiser_cls = getattr(diffusers, info["denoiser_class"])
    comps[spec.denoiser] = denoiser_cls.from_pretrained(str(root / spec.name / spec.denoiser), dtype=torch.float32).eval()
    sched_cfg = json.loads((root / spec.name / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8"))
    comps["scheduler"] = getattr(diffusers, sched_cfg["_class_name"]).from_config(sched_cfg)
    pipe = getattr(diffusers, spec.pipeline)(**comps, **PIPELINE_KWARGS.get(spec.family, {}))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def materialize(name: str, cache_dir: str | Path | None = None, source: str | Path | None = None) -> Path:
    """A float32 diffusers folder of base ``name`` (hash-checked; built once per manifest into the cache).

    Every shipped file's SHA-256 is checked on every call, and every file of an existing cached folder against
    the hashes recorded when it was built; an altered shipped file is one :class:`BaseError` line, an altered
    cached folder is rebuilt. ``source``: a world data root written by ``tools/ship_base.py`` (default: the
    package's)."""
    spec = _spec(name)
    info = verify(name, source)
    root = Path(source) if source is not None else data_root()
    digest = _digest(info)
    dest = Path(cache_dir) if cache_dir is not None else _cache_root() / f"{name}-{digest}"
    marker = dest / MARKER
    if marker.is_file():
        try:
            rec = json.loads(marker.read_text(encoding="utf-8"))
            if rec.get("digest") == digest:
                _check_files(dest, rec["files"], "cached")
                return dest
        except (ValueError, KeyError, BaseError):
            pass
    tmp = dest.with_name(dest.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with _quiet.no_progress_bars():
            pipe = _assemble(spec, root, info)
            pipe.save_pretrained(str(tmp), safe_serialization=True)
        (tmp / MANIFEST).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MARKER).write_text(json.dumps({"digest": digest, "files": files}, indent=1, sort_keys=True), encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BaseError(
            f"cannot write the world base ({e.strerror or e}); free space or set XDG_CACHE_HOME", file=str(dest)
        ) from None
    return dest


# --------------------------------------------------------------------------------------------------
# loading with the base's call defaults
# --------------------------------------------------------------------------------------------------


class _CallDefaults:
    """Mixed in front of an official pipeline class: ``pipe(prompt)`` fills :attr:`call_defaults` (the base's size,
    steps, guidance, T5 length, negative prompt) for every argument the caller leaves out. Everything else is the
    official class; ``save_pretrained`` writes its name, so a saved folder loads with the official class."""

    call_defaults: dict[str, Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and "prompt" not in kwargs and _is_text(args[0]) and _first_parameter(super().__call__) != "prompt":  # type: ignore[misc]
            # Flux2KleinPipeline.__call__ takes ``image`` first: a plain ``pipe(prompt)`` still means the prompt
            kwargs["prompt"], args = args[0], args[1:]
        for k, v in self.call_defaults.items():
            kwargs.setdefault(k, v)
        return super().__call__(*args, **kwargs)  # type: ignore[misc]


def _is_text(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value))


def _first_parameter(method: Any) -> str | None:
    import inspect

    return next(iter(inspect.signature(method).parameters), None)


_CLASSES: dict[type, type] = {}


def base_profile(name: str, source: str | Path | None = None) -> Any:
    """The profile base ``name`` was pretrained with: its bundled profile with the ``profile_overrides`` of its
    ``base.json`` (the tiny encoders' widths and depths)."""
    from te_align.profiles import profile

    info = base_info(name, source)
    return profile(info["profile"], **dict(info.get("profile_overrides") or {}))


def _with_defaults(pipe: Any, defaults: dict[str, Any]) -> Any:
    official = type(pipe)
    cls = _CLASSES.get(official)
    if cls is None:
        cls = type(official.__name__, (_CallDefaults, official), {"__module__": __name__, "__doc__": official.__doc__})
        _CLASSES[official] = cls
    pipe.__class__ = cls
    object.__setattr__(pipe, "call_defaults", dict(defaults))
    return pipe


def load(name: str, *, cache_dir: str | Path | None = None, source: str | Path | None = None) -> Any:
    """Base ``name`` as its official diffusers pipeline (offline, float32, CPU), hash-checked.

    ``pipe(prompt)`` samples at the base's size with the settings its held-out accuracy was measured at
    (``base.json["sampling"]``: steps, guidance, and for Flux true classifier-free guidance against the encoded
    empty prompt at the profile's T5 length); pass any argument to override it. ``pipe.call_defaults`` shows them.
    ``pipe.te_align_profile`` is the profile it was pretrained with (:func:`base_profile`), which
    ``te_align.apply(pipe)`` uses.
    """
    import diffusers
    import torch

    spec = _spec(name)
    folder = materialize(name, cache_dir=cache_dir, source=source)
    info = base_info(name, source)
    with _quiet.no_progress_bars():
        pipe = getattr(diffusers, spec.pipeline).from_pretrained(str(folder), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    _with_defaults(pipe, info["sampling"])
    object.__setattr__(pipe, "te_align_profile", base_profile(name, source))
    return pipe
