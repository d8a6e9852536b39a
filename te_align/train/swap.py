"""Training a swapped model (``te-align swap``): its text projection is a trainable parameter group.

A profile slot whose encoder is a :class:`te_align.encoding.projected.ProjectedTextEncoder` trains its
``projection`` (weight and bias) with ``train.projection_lr`` (0 = ``train.learning_rate``); the
inner encoder stays frozen (its output scale and shift are fixed buffers). The denoiser trains as
configured (LoRA on ``lora.target_modules``). The trained projection is written beside the LoRA as
``<output.name>_projection.safetensors``, keyed ``<component>.projection.weight`` / ``.bias`` and
stamped with the profile.

``train.full_modules`` trains denoiser weights in full besides the LoRA (:func:`full_params`; e.g. the
cross-attention layers ``--reset cross`` re-initialised), with ``train.full_lr``; they are written as
``<output.name>_full.safetensors`` (diffusers parameter names). That works for any model, swapped or not.

Captions are cached before the projection (:func:`text_source`): the frozen inner encoder's output is
what the text cache holds, keyed by the swapped model's profile, the inner encoder's weights and
tokenizer and the option ``stage = "before-projection"``; each step applies the projection (and its
scale and shift) to it, so the projection gets gradients while no caption is encoded twice. Where
that is not exact (text-encoder LoRA, a dropped caption that becomes zeros, an output that is more
than one projected slot's hidden states) the captions are encoded live through the whole encoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import te_align
from te_align._types import JSONObject
from te_align.encoding import Conditioning, EncodeOptions
from te_align.encoding.cache.keys import hash_text_encoders
from te_align.encoding.cache.store import EmbeddingCache
from te_align.encoding.projected import CLASS_NAME
from te_align.metadata import stamp
from te_align.profiles.expr import Node, Ref, output_specs, refs
from te_align.train._io import writing
from te_align.train.config import TrainConfig, TrainError
from te_align.train.models import CLIP_TARGETS

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline

    from te_align.encoding.projected import ProjectedTextEncoder
    from te_align.profiles.model import AlignmentProfile
    from te_align.train.text import TextSource


def projection_models(profile: AlignmentProfile, pipe: DiffusionPipeline) -> dict[str, ProjectedTextEncoder]:
    """Pipeline component -> projected encoder, for the profile's swapped slots; their projections are
    made trainable (float32), everything else of them stays as it is (frozen, or LoRA from ``lora.text_encoders``)."""
    import torch

    out: dict[str, ProjectedTextEncoder] = {}
    for slot in profile.slots:
        if slot.tokenizer_only or slot.encoder.cls != CLASS_NAME:
            continue
        enc = getattr(pipe, slot.encoder_subfolder)  # frozen by prepare_frozen (its LoRA, if any, trains)
        enc.projection.to(torch.float32)
        enc.projection.requires_grad_(True)
        out[slot.encoder_subfolder] = enc
    return out


#: Default LoRA targets of a projected encoder's inner encoder, by model type (else CLIP's names).
INNER_LORA_TARGETS = {"t5": ["q", "k", "v", "o"], "umt5": ["q", "k", "v", "o"], "mt5": ["q", "k", "v", "o"]}


def encoder_lora_targets(model: ProjectedTextEncoder) -> list[str]:
    """``lora.text_encoders`` on a swapped slot: LoRA on the inner encoder's attention (never the projection,
    which trains in full)."""
    inner_type = str(model.config.encoder_config.get("model_type", ""))
    return list(INNER_LORA_TARGETS.get(inner_type, CLIP_TARGETS))


def named_projection_params(models: Mapping[str, ProjectedTextEncoder]) -> dict[str, torch.nn.Parameter]:
    return {f"{comp}.projection.{n}": p for comp, m in models.items() for n, p in m.projection.named_parameters()}


def full_params(denoiser: torch.nn.Module, patterns: list[str]) -> dict[str, torch.nn.Parameter]:
    """``train.full_modules``: the denoiser's own weights (not LoRA) whose names match a pattern, made
    trainable in float32; keyed by their diffusers names (peft's ``.base_layer`` left out)."""
    import re

    import torch

    if not patterns:
        return {}
    out: dict[str, torch.nn.Parameter] = {}
    for name, p in denoiser.named_parameters():
        clean = name.replace(".base_layer.", ".")
        if "lora_" in name or not any(re.search(pat, clean) for pat in patterns):
            continue
        p.requires_grad_(True)
        if p.dtype != torch.float32:
            p.data = p.data.float()
        out[clean] = p
    if not out:
        raise TrainError(f"no {type(denoiser).__name__} parameter matches {patterns}", key="train.full_modules")
    return out


def save_tensors(
    tensors: Mapping[str, torch.Tensor], path: Path, *, profile: AlignmentProfile, extra: JSONObject
) -> Path:
    """Trained tensors as one stamped .safetensors file (whole file or nothing)."""
    import tempfile

    from safetensors.torch import save_file

    data = {k: p.detach().float().cpu().contiguous() for k, p in tensors.items()}
    with writing(path):
        with tempfile.TemporaryDirectory(prefix=".tensors-", dir=path.parent) as tmp:
            raw = Path(tmp) / "tensors.safetensors"
            save_file(data, str(raw))
            stamp(raw, path, profile=profile, extra=extra)
    return path


def save_projection(
    models: Mapping[str, ProjectedTextEncoder], path: Path, *, profile: AlignmentProfile, extra: JSONObject
) -> Path:
    """The trained projections as one stamped .safetensors file (whole file or nothing)."""
    return save_tensors(named_projection_params(models), path, profile=profile, extra=extra)


def _cacheable(cfg: TrainConfig, profile: AlignmentProfile, models: Mapping[str, ProjectedTextEncoder]) -> bool:
    """Whether conditioning = projection(cached inner output) exactly, for every output and dropout."""
    if cfg.lora.text_encoders:
        return False
    zeros = cfg.data.dropout_policy == "zeros" or (cfg.data.dropout_policy == "profile" and profile.empty_prompt == "zeros")
    if zeros:
        return False
    projected = {s.name for s in profile.slots if s.encoder_subfolder in models}
    for out in output_specs(profile):
        node = out.node
        uses = isinstance(node, Ref) and node.slot in projected
        if uses and node.attr != "hidden":
            return False
        if not uses and any(r.slot in projected for r in _refs(node)):
            return False
    return True


def _refs(node: Node) -> list[Ref]:
    return refs(node)


def inner_profile(profile: AlignmentProfile, models: Mapping[str, ProjectedTextEncoder]) -> AlignmentProfile:
    """``profile`` with each projected slot describing its inner encoder (class and width)."""
    import dataclasses

    slots = []
    for s in profile.slots:
        m = models.get(s.encoder_subfolder)
        if m is not None and s.encoder.cls == CLASS_NAME:
            enc = dataclasses.replace(s.encoder, cls=m.config.encoder_class, hidden_size=m.config.input_width)
            s = dataclasses.replace(s, encoder=enc)
        slots.append(s)
    return dataclasses.replace(profile, slots=tuple(slots))


def text_source(
    cfg: TrainConfig,
    profile: AlignmentProfile,
    pipe: DiffusionPipeline,
    models: Mapping[str, ProjectedTextEncoder],
    device: torch.device,
    dtype: torch.dtype,
    *,
    cache_dir: Path,
    writer: bool,
    base: type[TextSource],
) -> TextSource:
    """The run's text source for a swapped model: the projection applied to cached inner outputs
    where that is exact (see the module docstring), else live encoding through the whole encoder.

    ``base``: the run's text source class (:class:`te_align.train.text.TextSource`), which the projected source
    extends; the loop hands it down, so that this module does not import the loop that imports it."""
    if not _cacheable(cfg, profile, models):
        return base(cfg, profile, pipe, device, dtype, trainable=True, cache_dir=cache_dir, writer=writer)

    class ProjectedTextSource(base):  # type: ignore[valid-type,misc]
        """Caches (and encodes) the inner encoders' output; :meth:`batch` applies the projections."""

        def __init__(self) -> None:
            super().__init__(cfg, profile, pipe, device, dtype, trainable=False, cache_dir=cache_dir, writer=writer)
            self.trainable = True  # the projection trains: the encoders stay in memory (te_align.train.residency)
            self.inner = inner_profile(profile, models)
            self.components = {s.name: (getattr(pipe, s.tokenizer_subfolder), models[s.encoder_subfolder])
                               for s in profile.slots if s.encoder_subfolder in models}
            self.outputs = {o: self.components[expr.split(".")[0]][1] for o, expr in profile.outputs
                            if expr.split(".")[0] in self.components}

        def _cache(self, pattern: str, options: EncodeOptions | None = None) -> EmbeddingCache:
            options = options or self.options
            key = pattern if options is self.options else f"{pattern}|{options.as_dict()}"
            if key not in self._caches:
                if self._te_hash is None:
                    encoders = {s.name: getattr(self.pipe, s.encoder_subfolder) for s in self.profile.slots}
                    encoders.update({name: m.encoder for name, (_, m) in self.components.items()})
                    self._te_hash = hash_text_encoders(
                        encoders, {s.name: getattr(self.pipe, s.tokenizer_subfolder) for s in self.profile.slots}
                    )
                opts = dict(options.as_dict(), dropped=pattern, stage="before-projection")
                self._caches[key] = EmbeddingCache(self.cache_dir, self.profile, self._te_hash, opts)
            return self._caches[key]

        def _encode(
            self,
            captions: list[str],
            drop: list[bool],
            drop_slots: dict[str, list[bool]],
            options: EncodeOptions | None = None,
        ) -> Conditioning:
            import dataclasses

            tokenizers = {s.name: getattr(self.pipe, s.tokenizer_subfolder) for s in self.profile.slots}
            encoders = {s.name: getattr(self.pipe, s.encoder_subfolder) for s in self.profile.slots}
            encoders.update({name: m.encoder for name, (_, m) in self.components.items()})
            cond = te_align.encode(self.inner, captions, tokenizers=tokenizers, text_encoders=encoders,
                                   options=options or self.options, drop=drop, drop_slots=drop_slots or None)
            # the swapped profile's conditioning at the stage before the projection (the cache key says which stage)
            return dataclasses.replace(cond, profile_name=self.profile.name, fingerprint=self.profile.fingerprint())

        def batch(
            self, captions: list[str], gen: torch.Generator, span: tuple[int, int] | None = None,
            dropout_gen: torch.Generator | None = None,
        ) -> Conditioning:
            import dataclasses

            cond = super().batch(captions, gen, span, dropout_gen)
            tensors = dict(cond.tensors)
            for name, model in self.outputs.items():
                tensors[name] = model.project(tensors[name]).to(self.dtype)
            return dataclasses.replace(cond, tensors=tensors, profile_name=self.profile.name,
                                       fingerprint=self.profile.fingerprint())

    return ProjectedTextSource()


__all__ = ["encoder_lora_targets", "full_params", "inner_profile", "named_projection_params", "projection_models", "save_projection", "save_tensors", "text_source"]
