"""The probe adapter: a trainer's real encoding code imported and called as the trainer calls it.

Each trainer's ``probe`` module (:mod:`te_align.trainers`) has ``ADAPTER``, a subclass of :class:`Adapter`: the
profiles it can probe, a ``session`` that imports the trainer's modules once, a ``case`` per profile (the trainer
call on te-align's tiny models, :func:`_tiny`) and ``hooked`` (the same with te-align's hooks installed).
Missing third-party imports of the trainers' modules are stood in for (:mod:`te_align.probe._stubs`); nothing the
encode paths call is a stand-in. No trainer is named here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from te_align.errors import closest
from te_align.probe.core import Case
from te_align.probe.errors import ProbeError
from te_align.profiles import profile as load
from te_align.tiny.fit import fit_profile

if TYPE_CHECKING:  # the trainer contract, for annotations only
    from te_align.trainers.api import ProbePart

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.

#: tiny-model family (te_align.tiny.encoders.family_components) per bundled profile.
TINY_FAMILY = {
    "sd15": "sd15",
    "sd21": "sd21",
    "sdxl": "sdxl",
    "sd3-medium": "sd3",
    "sd35-large": "sd3",
    "sd35-medium": "sd3",
    "flux-dev": "flux",
    "flux-schnell": "flux",
    "chroma": "chroma",
    "pixart-sigma": "pixart-sigma",
    "auraflow": "auraflow",
    "lumina2": "lumina2",
    "hidream": "hidream",
    "qwen-image": "qwen-image",
    "wan21": "wan21",
    "hunyuanimage-2.1": "hunyuanimage",
    "sana": "sana",
}

#: Third-party packages whose absence must not stop a trainer module from importing (stood in).
OPTIONAL_IMPORTS = (
    "torchvision",
    "cv2",
    "library",
    "leco",
    "networks",
    "optimum",
    "lycoris",
    "k_diffusion",
    "bitsandbytes",
    "prodigyopt",
    "dadaptation",
    "albumentations",
    "controlnet_aux",
    "timm",
    "kornia",
    "lpips",
    "gradio",
    "imwatermark",
    "torchao",
    "ip_adapter",
    "open_clip",
    "clip",
    "xformers",
    "lion_pytorch",
    "schedulefree",
)


class HooksUnavailable(Exception):
    """te-align's hooks for this trainer cannot be installed here (the reason is the message)."""


class NotImportable(ProbeError):
    """The trainer code path for a profile does not import in this environment (a measured fact, not a failure).

    ``reason`` is the import error; the matrix shows the cell as ``not importable here: <reason>``.
    """

    def __init__(self, trainer: str, profile: str, where: str, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{trainer}: {where} (profile {profile}) is not importable here: {reason}")


def _hf_quiet() -> None:
    with contextlib.suppress(Exception):
        import diffusers.utils.logging as dlog
        import transformers.utils.logging as tlog

        dlog.set_verbosity_error()
        tlog.set_verbosity_error()


class Adapter:
    name = ""
    version = "unknown"
    location = ""
    #: profile name -> short description of the trainer code path probed (set per instance).
    profiles: dict[str, str]

    def __init__(self, path: str | None) -> None:  # pragma: no cover - subclasses
        self.profiles = {}

    def profile_name(self, name: str) -> str:
        canonical = load(name).name
        if canonical not in self.profiles:
            raise ProbeError(f"{self.name} {self.version} has no encoding path te-align can probe for profile "
                             f"'{canonical}'; probed profiles: {', '.join(self.profiles)}")
        return canonical

    def label(self, path: str | None) -> str:
        """The trainer as the matrix names it (``path`` None: the installed package was found)."""
        return f"{self.name} {self.version}"

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        yield

    def case(self, profile_name: str) -> Case:
        raise NotImplementedError

    @contextlib.contextmanager
    def hooked(self, profile: Any) -> Iterator[list[str]]:
        raise HooksUnavailable("te-align has no hooks for this trainer")
        yield []  # pragma: no cover


def _tiny(profile_name: str, **replace: Any) -> tuple[Any, dict[str, Any], dict[str, Any], Any]:
    """(fitted profile, tokenizers, text encoders, diffusers pipeline) for a profile's tiny family."""
    from te_align.tiny.pipelines import PipelineUnavailable, build_pipeline_for_encoding

    _need_clip_bpe()
    try:
        pipe = build_pipeline_for_encoding(TINY_FAMILY[profile_name], **replace)
    except PipelineUnavailable as e:
        raise ProbeError(str(e)) from None
    return (*_fitted(profile_name, pipe.components), pipe)


def _tiny_text(profile_name: str, **replace: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(fitted profile, tokenizers, text encoders) for a profile's tiny family, without a diffusers pipeline: the
    probes of trainers that encode with their own code need none (diffusers 0.32, which trainers still pin, has no
    pipeline class for e.g. Qwen-Image or Wan)."""
    from te_align.tiny.encoders import family_components

    _need_clip_bpe()
    return _fitted(profile_name, {**family_components(TINY_FAMILY[profile_name]), **replace})


def _need_clip_bpe() -> None:
    from te_align.tiny.tokenizers import clip_bpe_path

    try:
        clip_bpe_path()
    except FileNotFoundError as e:
        raise ProbeError(str(e)) from None


def _fitted(profile_name: str, components: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    comps = {k: v for k, v in components.items() if k.startswith(("tokenizer", "text_encoder")) and v is not None}
    prof = fit_profile(load(profile_name), comps)
    toks = {k: v for k, v in comps.items() if k.startswith("tokenizer")}
    encs = {k: v for k, v in comps.items() if k.startswith("text_encoder")}
    return prof, toks, encs


def _ordered(table: dict[str, Any], kind: str) -> list[Any]:
    return [table[k] for k in sorted(table, key=lambda k: (len(k), k)) if k.startswith(kind)]


def adapter_for(trainer: str, path: str | None, probes: Mapping[str, ProbePart]) -> Adapter:
    """The probe adapter of ``trainer`` for the installation at ``path``: ``probes`` (trainer name -> its
    :class:`~te_align.trainers.api.ProbePart`, handed down by the caller) holds its part."""
    part = probes.get(trainer)
    if part is None:
        known = tuple(probes)
        raise ProbeError(f"unknown trainer '{trainer}'; known: {', '.join(known)}{closest(trainer, known)}")
    return part.ADAPTER(path)
