"""A profile's cross-field checks: expressions name real slots, lengths are sane, provenance paths exist.

Reads a profile's fields only (the profile model is imported for type checking alone), so that reading a profile
(:mod:`te_align.profiles.serialize`, which re-exports :func:`validate`) and changing one
(:mod:`te_align.profiles.edit`) both call it below the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_align.errors import ProfileError, closest

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles.model import AlignmentProfile
    from te_align.profiles.spec import SlotSpec


def _validate_images(s: SlotSpec, file: str | None) -> None:
    """An edit slot's ``images`` table: a positive pixel area, a processor component name, and a prefix that
    names only the image's number (``{n}``)."""
    where = f"slots.{s.name}.images"
    im = s.images
    assert im is not None
    if im.area < 28 * 28:
        raise ProfileError(f"expected a pixel area of at least 784 (one 28x28 merged patch), got {im.area}", file=file,
                           key=f"{where}.area")
    if not im.processor_subfolder.strip():
        raise ProfileError("expected the processor's component name (e.g. 'processor')", file=file,
                           key=f"{where}.processor_subfolder")
    if "{" in im.prefix.replace("{n}", ""):
        raise ProfileError("the prefix may hold only the {n} place (the image's number)", file=file, key=f"{where}.prefix")
    if s.tokenizer_only:
        raise ProfileError("a tokenizer-only slot runs no encoder to take images", file=file, key=where)


def validate(p: AlignmentProfile, file: str | None = None) -> None:
    """Cross-field checks: expressions name real slots, lengths are sane, provenance paths exist."""
    from te_align.profiles.expr import check_expression, output_specs, refs

    for s in p.slots:
        where = f"slots.{s.name}"
        t, e = s.tokenizer, s.encoder
        if t.max_length < 1:
            raise ProfileError(f"expected a positive max_length, got {t.max_length}", file=file, key=f"{where}.tokenizer.max_length")
        if e.max_position_embeddings is not None and t.max_length > e.max_position_embeddings:
            raise ProfileError(
                f"max_length {t.max_length} exceeds the encoder's max_position_embeddings {e.max_position_embeddings}",
                file=file,
                key=f"{where}.tokenizer.max_length",
            )
        for index in e.layer if isinstance(e.layer, tuple) else (e.layer,):
            if isinstance(index, int) and not -(e.num_layers + 1) <= index <= e.num_layers:
                raise ProfileError(
                    f"layer index {index} is outside hidden_states of a {e.num_layers}-layer encoder",
                    file=file,
                    key=f"{where}.encoder.layer",
                )
        if isinstance(e.layer, tuple) and not e.layer:
            raise ProfileError("expected one or more hidden_states indices", file=file, key=f"{where}.encoder.layer")
        if e.layer_combine != "concat" and not isinstance(e.layer, tuple):
            raise ProfileError("layer_combine applies to a list of layers; this slot taps one", file=file,
                               key=f"{where}.encoder.layer_combine")
        if "{thinking}" in t.template and t.enable_thinking is None:
            raise ProfileError("the template has a {thinking} place but enable_thinking is not set", file=file,
                               key=f"{where}.tokenizer.enable_thinking")
        if s.masks.denoiser_extra_pad_tokens < 0:
            raise ProfileError("expected a count >= 0", file=file, key=f"{where}.masks.denoiser_extra_pad_tokens")
        if s.images is not None:
            _validate_images(s, file)
        if "{prompt}" not in t.template:
            raise ProfileError("the template must contain {prompt}", file=file, key=f"{where}.tokenizer.template")
        if t.absent_text != "empty" and t.text_transform == "none":
            raise ProfileError(
                "absent_text applies to prompts a text_transform finds no text in; this slot has text_transform = \"none\"",
                file=file, key=f"{where}.tokenizer.absent_text",
            )
        if s.masks.encoder_mask_dtype != "int64" and not s.masks.encoder:
            raise ProfileError("encoder_mask_dtype needs masks.encoder = true (no mask goes into the encoder)",
                               file=file, key=f"{where}.masks.encoder_mask_dtype")
        if t.min_length_pad_id is not None and t.min_length is None:
            raise ProfileError("min_length_pad_id needs a min_length", file=file, key=f"{where}.tokenizer.min_length_pad_id")
        if s.tokenizer_only:
            for flag in ("encoder", "zero_padded"):
                if getattr(s.masks, flag):
                    raise ProfileError(f"a tokenizer_only slot has no encoder: masks.{flag} must be false", file=file, key=f"{where}.masks.{flag}")
            if s.masks.repad != "none" or t.token_window != "all" or t.drop_start_tokens:
                raise ProfileError(
                    "a tokenizer_only slot keeps its token ids as tokenized (no repad, token_window or drop_start_tokens)",
                    file=file, key=f"{where}.tokenizer",
                )
    tokenizer_only = {s.name for s in p.slots if s.tokenizer_only}
    for name, expr in p.outputs:
        node = check_expression(expr, p.slot_names, key=f"outputs.{name}", file=file)
        for r in refs(node):
            if r.slot in tokenizer_only and r.attr not in ("ids", "mask", "denoiser_mask"):
                raise ProfileError(
                    f"slot '{r.slot}' is tokenizer_only: it gives ids, mask and denoiser_mask, not {r.attr}", file=file, key=f"outputs.{name}"
                )
    try:
        output_specs(p)  # every output is one kind of tensor (embeddings, mask or ids)
    except ProfileError as e:
        raise ProfileError(e.message, file=file, key=e.key) from None
    valid = set(p.behaviour_paths())
    prefixes = {path.rsplit(".", i)[0] for path in valid for i in range(path.count(".") + 1)}
    for path, _ in p.provenance:
        if path not in prefixes:
            raise ProfileError(f"provenance for a field that does not exist{closest(path, sorted(prefixes))}", file=file, key=f"provenance.{path}")


#: The former name of :func:`validate`.
_validate = validate


__all__ = ["validate"]
