"""``te_align.apply(pipe, profile)``: a diffusers pipeline encodes its prompts by an alignment profile.

One line, and a LoRA trained aligned to a profile meets the same conditioning when sampled in diffusers::

    pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-schnell", ...)
    te_align.apply(pipe, "flux-schnell")        # T5 at 256 (BFL's reference), not the pipeline's 512 default
    image = pipe("a photo of a cat", num_inference_steps=4).images[0]

How: the pipeline object's class is swapped for a subclass whose ``__call__`` encodes ``prompt`` (and
``negative_prompt``) with :func:`te_align.encode` on the pipeline's own tokenizers and text encoders, then calls
the pipeline's own ``__call__`` with ``prompt_embeds=...`` (and the profile's other outputs under the keyword
names the pipeline takes). Prompt embeddings a caller passes are used as they are. Without a negative prompt,
pipelines that take ``negative_prompt_embeds`` get the profile's empty prompt (:func:`te_align.encoding.encode_uncond`:
zeros for SDXL, the encoded "" for SD3, Chroma (with its mask) and FLUX.2 klein); FluxPipeline gets a negative only when
one is given (true CFG).
:func:`remove` restores the original class. No weights are copied.

A pipeline class that wraps an official one (te-align's world bases fill their sampling settings in a ``__call__(*args,
**kwargs)`` that forwards to the official call) keeps its wrapper: the aligned call is placed between the wrappers
and the official class, so it sees the arguments they fill in and checks the official signature. A pipeline that
carries its profile (:data:`PROFILE_ATTR`, set by :func:`te_align.tiny.bases.load`) is aligned to it by
``apply(pipe)``. The profile's encoder widths are checked against the pipeline's encoders when applying.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, TypeVar

from te_align.encoding import encode
from te_align.encoding.core import _config_width, encode_uncond
from te_align.errors import TeAlignError
from te_align.profiles import profile as resolve

if TYPE_CHECKING:
    import torch
    from diffusers import DiffusionPipeline

    from te_align.encoding.conditioning import Conditioning
    from te_align.profiles.model import AlignmentProfile

# ``encode`` loads te_align.encoding.core (and torch) when this module is imported: it is not on the CLI's
# cold path (``te_align.apply`` and ``te_align.integrations.apply`` import it on first use).

_Pipe = TypeVar("_Pipe", bound="DiffusionPipeline")

#: Pipelines whose ``__call__`` takes the profile's outputs under these names, checked by tests/integrations/test_apply.py.
SUPPORTED: dict[str, str] = {
    "FluxPipeline": "flux",
    "StableDiffusion3Pipeline": "sd3",
    "StableDiffusionXLPipeline": "sdxl",
    "StableDiffusionPipeline": "sd1",
    "ChromaPipeline": "chroma",
    # takes no negative_prompt: true CFG (guidance_scale > 1, not distilled) against negative_prompt_embeds, its own
    # encoded "" when none are given (diffusers 0.42.1 pipelines/flux2/pipeline_flux2_klein.py:595-596, 749-760)
    "Flux2KleinPipeline": "flux2-klein",
}
#: Pipelines that take a negative only when the caller gives one (it switches on true CFG).
NEGATIVE_ONLY_WHEN_GIVEN = ("FluxPipeline",)
#: Profile outputs the pipelines rebuild themselves and do not take as keywords.
REBUILT = ("text_ids",)
#: The attribute through which a pipeline carries the profile it was built with (``apply(pipe)`` uses it).
PROFILE_ATTR = "te_align_profile"
_MARK = "_te_align_profile"
#: pipeline class -> its aligned subclass (one per class, so every aligned pipe of a class shares it).
_ALIGNED: dict[type, type] = {}


def _base_class(pipe: object) -> type:
    """The pipeline's class before :func:`apply`."""
    cls = type(pipe)
    return cls.__bases__[0] if getattr(cls, "_te_align_wrapped", False) else cls


def _official(cls: type) -> type | None:
    """The official diffusers pipeline class ``cls`` is or wraps (the first supported one in its MRO)."""
    for klass in cls.__mro__:
        call = vars(klass).get("__call__")
        if klass.__name__ in SUPPORTED and klass.__module__.startswith("diffusers.") and call not in (None, _aligned_call):
            return klass
    return None


def _aligned_class(cls: type, official: type) -> type:
    """``cls`` with :func:`_aligned_call` right above ``official`` in its MRO: wrappers in ``cls`` run first.

    Its first base is always ``cls`` (what :func:`remove` restores)."""
    if cls not in _ALIGNED:
        attrs = {"_te_align_wrapped": True, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "__doc__": cls.__doc__}
        if cls is official:
            _ALIGNED[cls] = type(cls.__name__, (cls,), {**attrs, "__call__": _aligned_call})
        else:  # cls wraps official: (cls, aligned) puts every class of cls before the aligned call, then official
            aligned = type(official.__name__, (official,), {"__call__": _aligned_call, "__module__": official.__module__,
                                                           "__qualname__": official.__qualname__})
            _ALIGNED[cls] = type(cls.__name__, (cls, aligned), attrs)
    return _ALIGNED[cls]


def _width_mismatch(p: AlignmentProfile, pipe: DiffusionPipeline, cls_name: str) -> str | None:
    """One line naming every slot whose pipeline encoder is not as wide as the profile says, or None."""
    bad = []
    for slot in p.slots:
        if slot.tokenizer_only:
            continue
        width = _config_width(getattr(getattr(pipe, slot.encoder_subfolder), "config", None))
        if width is not None and width != slot.encoder.hidden_size:
            bad.append((slot, width))
    if not bad:
        return None
    widths = "; ".join(f"{s.name} ({s.encoder_subfolder}) is {w} wide, the profile says {s.encoder.hidden_size}"
                       for s, w in bad)
    keys = ", ".join(f"{s.name}_hidden_size={w}" for s, w in bad)
    return (f"profile '{p.name}' does not fit this {cls_name}'s text encoders: {widths} (use the profile the "
            f"pipeline was built with, or override {keys} if this is intended)")


def apply(pipe: _Pipe, profile: AlignmentProfile | str | None = None, **encode_kwargs: Any) -> _Pipe:
    """Make ``pipe`` encode prompts by ``profile`` (a name, alias, file or :class:`AlignmentProfile`).

    Returns ``pipe`` (changed in place). ``profile`` None: the profile the pipeline carries (te-align's world bases
    carry theirs). ``encode_kwargs`` go to every :func:`te_align.encode` call (e.g.
    ``options=EncodeOptions(long_prompt_chunks=3)``). Calling it again switches the profile; :func:`remove`
    undoes it. Refuses, in one line, a pipeline class te-align has not verified, a profile of another model family
    and a profile whose encoder widths are not the pipeline's.
    """
    base = _base_class(pipe)
    official = _official(base)
    family = SUPPORTED.get(official.__name__) if official is not None else None
    if official is None or family is None:
        raise TeAlignError(
            f"te_align.apply supports {', '.join(SUPPORTED)}; got a {base.__name__} (encode with te_align.encode "
            "and pass prompt_embeds=... yourself)"
        )
    name = official.__name__
    if profile is None:
        profile = getattr(pipe, PROFILE_ATTR, None)
        if profile is None:
            raise TeAlignError(f"te_align.apply(pipe) needs a profile: this {name} carries none; pass one, e.g. "
                               f"te_align.apply(pipe, '{_EXAMPLE[family]}')")
    p = resolve(profile) if not hasattr(profile, "slots") else profile
    if p.family != family:
        raise TeAlignError(f"profile '{p.name}' is a {p.family} profile, but {name} samples {family} models")
    for slot in p.slots:
        if getattr(pipe, slot.tokenizer_subfolder, None) is None or (
            not slot.tokenizer_only and getattr(pipe, slot.encoder_subfolder, None) is None
        ):
            raise TeAlignError(
                f"profile '{p.name}' encodes slot '{slot.name}' with {slot.tokenizer_subfolder}/{slot.encoder_subfolder}, "
                f"but this {name} has none (loaded without it?)"
            )
    mismatch = _width_mismatch(p, pipe, name)
    if mismatch:
        raise TeAlignError(mismatch)
    params = inspect.signature(official.__call__).parameters
    missing = [n for n in p.output_names if n not in REBUILT and n not in params]
    if missing:
        raise TeAlignError(f"{name}.__call__ takes no {', '.join(missing)}: profile '{p.name}' does not fit it")
    if not getattr(type(pipe), "_te_align_wrapped", False):
        pipe.__class__ = _aligned_class(base, official)
    object.__setattr__(pipe, _MARK, (p, dict(encode_kwargs)))
    return pipe


_EXAMPLE = {"flux": "flux-dev", "sd3": "sd35-large", "sdxl": "sdxl", "sd1": "sd15", "chroma": "chroma",
            "flux2-klein": "flux2-klein-4b"}


def remove(pipe: _Pipe) -> _Pipe:
    """Undo :func:`apply`: the pipeline encodes prompts its own way again."""
    if getattr(type(pipe), "_te_align_wrapped", False):
        pipe.__class__ = _base_class(pipe)
    if _MARK in pipe.__dict__:
        object.__delattr__(pipe, _MARK)
    return pipe


def applied_profile(pipe: DiffusionPipeline) -> AlignmentProfile | None:
    """The profile :func:`apply` set on ``pipe``, or None."""
    state = pipe.__dict__.get(_MARK)
    return state[0] if state else None


def _as_list(x: object, what: str) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, (list, tuple)) and all(isinstance(s, str) for s in x):
        return list(x)
    raise TeAlignError(f"{what} must be a string or a list of strings, got {type(x).__name__}")


def _aligned_call(self: DiffusionPipeline, *args: Any, **kwargs: Any) -> object:
    import torch

    official = _official(type(self))
    if official is None:  # pragma: no cover - apply() placed this call above an official class
        raise TeAlignError(f"{type(self).__name__} is no pipeline te_align.apply supports")
    original = official.__call__
    p, enc_kw = self.__dict__[_MARK]
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    call = dict(bound.arguments)
    call.pop("self", None)
    extra = call.pop("kwargs", None) or {}
    call.update(extra)
    params = inspect.signature(original).parameters
    if call.get("prompt_embeds") is not None or call.get("prompt") is None:
        return original(self, **call)  # the caller's own embeddings, or nothing to encode
    for other in ("prompt_2", "prompt_3", "negative_prompt_2", "negative_prompt_3"):
        if call.get(other) is not None:
            raise TeAlignError(f"te_align.apply encodes one prompt for every text encoder, as profile '{p.name}' does; "
                               f"{other} is not used: leave it out")
    prompts = _as_list(call.pop("prompt"), "prompt")
    n = int(call.pop("num_images_per_prompt", None) or 1)
    device = self._execution_device
    with torch.no_grad():
        cond = encode(p, prompts, pipeline=self, device=device, **enc_kw)
        negative = call.pop("negative_prompt", None)
        neg = None
        if negative is not None:
            negs = _as_list(negative, "negative_prompt")
            if len(negs) == 1 and len(prompts) > 1:
                negs = negs * len(prompts)
            if len(negs) != len(prompts):
                raise TeAlignError(f"negative_prompt has {len(negs)} entries for {len(prompts)} prompts")
            neg = encode(p, negs, pipeline=self, device=device, negative=True, **enc_kw)
        elif official.__name__ not in NEGATIVE_ONLY_WHEN_GIVEN and "negative_prompt_embeds" in params:
            neg = encode_uncond(p, len(prompts), pipeline=self, device=device, **enc_kw)
    for name in cond:
        if name in REBUILT:
            continue
        call[name] = _repeat(cond, name, n)
        if neg is not None:
            call[f"negative_{name}"] = _repeat(neg, name, n)
    if "num_images_per_prompt" in params:
        call["num_images_per_prompt"] = 1  # the embeddings above are repeated already
    return original(self, **call)


def _repeat(cond: Conditioning, name: str, n: int) -> torch.Tensor:
    t = cond[name]
    if n == 1 or not cond.is_batched(name):
        return t
    return t.repeat_interleave(n, dim=cond.batch_dim(name))


__all__ = ["PROFILE_ATTR", "SUPPORTED", "applied_profile", "apply", "remove"]
