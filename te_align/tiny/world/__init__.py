"""The shapes world: a procedural text-to-image world whose truth is known.

Modules by job (everything public is importable from here):

* :mod:`te_align.tiny.world.scenes`: the attribute space (:data:`SPACE`, the whole world; :data:`SIMPLE`, the
  world the shipped bases are pretrained on: one filled object, medium or large, on plain white), scenes,
  held-out concepts, :func:`render` and :func:`sample_scene`.
* :mod:`te_align.tiny.world.captions`: :func:`caption_scene` (tag lists, short sentences, long captions with the
  object past T5 position 77 / 154 / 256, emphasis, empty captions), :func:`make_dataset` / :func:`iter_dataset`
  and :func:`token_spans`.
* :mod:`te_align.tiny.world.reader`: :func:`read_image` / :func:`read_objects` (an image back into
  ``(colour, shape, position)`` per object), :func:`score` and :func:`evaluate`.
* :mod:`te_align.tiny.world.grid`: :func:`grid` (sample grids with a label under each image).
* :func:`base`: a shipped pretrained base (:mod:`te_align.tiny.bases`) as its official diffusers pipeline.

Only ``numpy`` and Pillow are needed; importing this package imports no torch (:func:`base` and the T5
tokenizer of :func:`default_tokenizer` import it when called).
"""

from __future__ import annotations

from typing import Any

from te_align.tiny.world.captions import (
    Caption,
    ObjectSpan,
    Sample,
    caption_scene,
    default_tokenizer,
    iter_dataset,
    make_dataset,
    token_spans,
)
from te_align.tiny.world.grid import grid
from te_align.tiny.world.reader import (
    ReadObject,
    evaluate,
    match,
    read_image,
    read_objects,
    score,
    score_keys,
)
from te_align.tiny.world.scenes import (
    ATTRIBUTES,
    BACKGROUND_KINDS,
    BACKGROUND_TONES,
    CAPTION_STYLES,
    COLOURS,
    DEFAULT_STYLE_MIX,
    POSITIONS,
    SHAPES,
    SIMPLE,
    SIZES,
    SPACE,
    SPACES,
    SPLITS,
    STYLES,
    Background,
    Concept,
    Scene,
    SceneObject,
    SceneSpace,
    render,
    sample_scene,
)


def base(name: str, **options: Any) -> Any:
    """The shipped world base ``name`` (``"sd3"``, ``"flux"``, ``"sdxl"``, ``"sd15"``) as its official diffusers
    pipeline, offline and hash-checked; ``pipe(prompt)`` samples at the base's size and settings. See
    :func:`te_align.tiny.bases.load` (``options``: ``cache_dir``, ``source``)."""
    from te_align.tiny.bases import load

    return load(name, **options)


__all__ = [
    "ATTRIBUTES",
    "BACKGROUND_KINDS",
    "BACKGROUND_TONES",
    "CAPTION_STYLES",
    "COLOURS",
    "DEFAULT_STYLE_MIX",
    "POSITIONS",
    "SHAPES",
    "SIMPLE",
    "SIZES",
    "SPACE",
    "SPACES",
    "SPLITS",
    "STYLES",
    "Background",
    "Caption",
    "Concept",
    "ObjectSpan",
    "ReadObject",
    "Sample",
    "Scene",
    "SceneObject",
    "SceneSpace",
    "base",
    "caption_scene",
    "default_tokenizer",
    "evaluate",
    "grid",
    "iter_dataset",
    "make_dataset",
    "match",
    "read_image",
    "read_objects",
    "render",
    "sample_scene",
    "score",
    "score_keys",
    "token_spans",
]
