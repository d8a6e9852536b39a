"""Profiles to plain dicts and TOML (the inverse of :mod:`te_align.profiles.serialize`, which re-exports both).

Reads a profile's fields only, so it imports the profile model for type checking alone: the profile's own
``to_dict`` and ``to_toml`` call it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from _typeshed import DataclassInstance

    from te_align.profiles.model import AlignmentProfile


def _spec_to_dict(spec: DataclassInstance) -> dict[str, object]:
    return {f.name: getattr(spec, f.name) for f in fields(spec) if getattr(spec, f.name) is not None}


def profile_to_dict(p: AlignmentProfile) -> dict[str, object]:
    slots: dict[str, dict[str, object]] = {}
    for s in p.slots:
        d: dict[str, object] = {
            "tokenizer_subfolder": s.tokenizer_subfolder,
            "encoder_subfolder": s.encoder_subfolder,
        }
        if s.train_dropout is not None:
            d["train_dropout"] = s.train_dropout
        if s.tokenizer_only:
            d["tokenizer_only"] = True
        d["tokenizer"] = _spec_to_dict(s.tokenizer)
        if not s.tokenizer_only:
            d["encoder"] = _spec_to_dict(s.encoder)
        d["masks"] = _spec_to_dict(s.masks)
        if s.images is not None:
            d["images"] = _spec_to_dict(s.images)
        slots[s.name] = d
    return {
        "name": p.name,
        "family": p.family,
        "display_name": p.display_name,
        "repo": p.repo,
        "pipeline": p.pipeline,
        "aliases": list(p.aliases),
        "description": p.description,
        "empty_prompt": p.empty_prompt,
        "slots": slots,
        "outputs": dict(p.outputs),
        "provenance": provenance_to_dict(p),
    }


def provenance_to_dict(p: AlignmentProfile) -> dict[str, dict[str, object]]:
    """The ``provenance`` table of :func:`profile_to_dict`: path -> entry."""
    prov: dict[str, dict[str, object]] = {}
    for path, pv in p.provenance:
        e: dict[str, object] = {"source": pv.source, "status": pv.status}
        if pv.note:
            e["note"] = pv.note
        if pv.alternatives:
            e["alternatives"] = [
                {k: v for k, v in (("value", a.value), ("source", a.source), ("status", a.status), ("note", a.note)) if v != ""}
                for a in pv.alternatives
            ]
        prov[path] = e
    return prov


def profile_to_toml(p: AlignmentProfile) -> str:
    import toml

    return toml.dumps(profile_to_dict(p))


__all__ = ["profile_to_dict", "profile_to_toml"]
