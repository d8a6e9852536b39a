"""Training a swapped model (``te-align swap``): its text projection is a trainable parameter group.

A profile slot whose encoder is a :class:`te_align.encoding.projected.ProjectedTextEncoder` trains its
``projection`` (weight and bias) with ``train.projection_lr`` (0 = ``train.learning_rate``); the
inner encoder stays frozen (its output scale and shift are fixed buffers). The denoiser trains as
configured (LoRA on ``lora.target_modules``). The trained projection is written beside the LoRA as
``<output.name>_projection.safetensors``, keyed ``<component>.projection.weight`` / ``.bias`` and
stamped with the profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from te_align.encoding.projected import CLASS_NAME


def projection_models(profile: Any, pipe: Any) -> dict[str, Any]:
    """Pipeline component -> projected encoder, for the profile's swapped slots; their projections are
    made trainable (float32), everything else of them stays frozen."""
    import torch

    out: dict[str, Any] = {}
    for slot in profile.slots:
        if slot.tokenizer_only or slot.encoder.cls != CLASS_NAME:
            continue
        enc = getattr(pipe, slot.encoder_subfolder)
        enc.requires_grad_(False)
        enc.projection.to(torch.float32)
        enc.projection.requires_grad_(True)
        out[slot.encoder_subfolder] = enc
    return out


def named_projection_params(models: dict[str, Any]) -> dict[str, Any]:
    return {f"{comp}.projection.{n}": p for comp, m in models.items() for n, p in m.projection.named_parameters()}


def save_projection(models: dict[str, Any], path: Path, *, profile: Any, extra: dict[str, Any]) -> Path:
    """The trained projections as one stamped .safetensors file (whole file or nothing)."""
    import tempfile

    from safetensors.torch import save_file

    from te_align.metadata import stamp
    from te_align.train._io import writing

    tensors = {k: p.detach().float().cpu().contiguous() for k, p in named_projection_params(models).items()}
    with writing(path):
        with tempfile.TemporaryDirectory(prefix=".projection-", dir=path.parent) as tmp:
            raw = Path(tmp) / "projection.safetensors"
            save_file(tensors, str(raw))
            stamp(raw, path, profile=profile, extra=extra)
    return path


__all__ = ["named_projection_params", "projection_models", "save_projection"]
