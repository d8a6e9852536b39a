"""Prompt accuracy: does the finetuned model draw what the prompt asks?

For a validation folder with a shapes-world answer key (:func:`te_align.tiny.datasets.write_world_split`),
every validation caption is sampled once with the official pipeline, conditioned by the *profile* (what
inference uses), from a fixed seed per caption, and the image is read back by
:func:`te_align.tiny.world.score`. Both arms of a seed are scored on identical prompts and noise.

Reported per arm: ``object_accuracy`` (objects read exactly: colour, shape and position), ``concept_accuracy``
(the same over objects that carry the finetuned concept), per-attribute accuracies, ``image_accuracy`` and
spurious readings per image.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["sample_prompts", "score_images"]


def sample_prompts(
    pipe: Any, profile: Any, captions: Sequence[str], *, steps: int, guidance: float, size: int, seed: int = 0,
    batch: int = 16,
) -> list[Any]:
    """One uint8 HxWx3 image per caption (caption ``i`` from generator seed ``seed + i``), profile conditioning,
    classifier-free guidance against the profile's empty prompt."""
    import numpy as np
    import torch

    import te_align
    from te_align.encoding import encode_uncond

    accepted = set(inspect.signature(pipe.__call__).parameters)
    images: list[Any] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for i in range(0, len(captions), batch):
            chunk = list(captions[i : i + batch])
            cond = te_align.encode(profile, chunk, pipeline=pipe)
            kwargs: dict[str, Any] = {k: v for k, v in cond.items() if k in accepted}
            if guidance > 1:
                neg = encode_uncond(profile, len(chunk), pipeline=pipe)
                kwargs.update({f"negative_{k}": v for k, v in neg.items() if f"negative_{k}" in accepted})
            if "true_cfg_scale" in accepted:  # Flux: real classifier-free guidance against the negative
                kwargs["true_cfg_scale"] = guidance
            gens = [torch.Generator().manual_seed(seed + i + j) for j in range(len(chunk))]
            out = pipe(**kwargs, num_inference_steps=steps, guidance_scale=guidance, width=size, height=size,
                       generator=gens, output_type="np").images  # fmt: skip
            images += [np.clip(np.rint(im * 255), 0, 255).astype(np.uint8) for im in out]
    return images


def score_images(images: Sequence[Any], truths: Sequence[Sequence[Sequence[Any]]]) -> dict[str, float]:
    """Scores of ``images`` against answer-key objects ``[colour, shape, position, carries_concept]``."""
    from te_align.tiny import world

    rows = []
    concept_hits = concept_total = 0
    for img, objs in zip(images, truths, strict=True):
        keys = [tuple(o[:3]) for o in objs]
        pred = world.read_image(img)
        r = world.score_keys(keys, pred)
        rows.append(r)
        pairs = world.match(keys, pred)
        for t, p in pairs:
            if objs[t][3]:
                concept_hits += int(keys[t] == pred[p])
        concept_total += sum(1 for o in objs if o[3])
    objects = sum(r["objects"] for r in rows)
    exact = sum(r["exact"] for r in rows)
    out = {
        "images": float(len(rows)),
        "objects": float(objects),
        "object_accuracy": exact / objects if objects else float("nan"),
        "concept_objects": float(concept_total),
        "concept_accuracy": concept_hits / concept_total if concept_total else float("nan"),
        "image_accuracy": sum(r["image_exact"] for r in rows) / len(rows) if rows else float("nan"),
        "extra_per_image": sum(r["extra"] for r in rows) / len(rows) if rows else float("nan"),
    }
    for key in ("colour", "shape", "position"):
        out[key] = sum(r[key] * r["objects"] for r in rows) / objects if objects else float("nan")
    return out


def save_images(images: Sequence[Any], names: Sequence[str], folder: Path) -> list[Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for img, name in zip(images, names, strict=True):
        path = folder / f"{name}.png"
        Image.fromarray(img).save(path)
        files.append(path)
    return files


def read_probes(images: Sequence[Any], objects: Sequence[Sequence[Sequence[Any]]], *, concept_colour: str) -> list[dict[str, Any]]:
    """Per image, what the world's reader found against the one asked object ``[colour, shape, position, concept]``:
    ``hit`` (an object of the asked colour at the asked position), ``exact`` (colour, shape and position),
    ``concept_colour`` (any object read in the concept's colour), ``extra`` (objects read besides the asked one)
    and ``read`` (the readings)."""
    from te_align.tiny import world

    out = []
    for img, objs in zip(images, objects, strict=True):
        pred = world.read_image(img)
        colour, shape, position = (str(v) for v in objs[0][:3])
        out.append({
            "hit": any(p[0] == colour and p[2] == position for p in pred),
            "exact": (colour, shape, position) in pred,
            "concept_colour": any(p[0] == concept_colour for p in pred),
            "extra": max(0, len(pred) - 1),
            "read": [list(p) for p in pred],
        })
    return out
