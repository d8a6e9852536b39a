"""Load the tokenizers and text encoders a profile needs from a diffusers-format folder or hub repo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from te_align.errors import EncodingError
from te_align.profiles.model import AlignmentProfile

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.


def _transformers_class(name: str, fallback: str) -> Any:
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None and name == "ProjectedTextEncoder":  # a swapped model's encoder (te-align swap)
        from te_align.encoding.projected import ProjectedTextEncoder

        cls = ProjectedTextEncoder
    if cls is None:
        cls = getattr(transformers, fallback)
    return cls


def load_text_encoders(
    profile: AlignmentProfile | str,
    path_or_repo: str | Path,
    *,
    dtype: Any = None,
    device: Any = None,
    revision: str | None = None,
    local_files_only: bool = False,
    slots: list[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tokenizers, text_encoders)`` keyed by slot name, loaded with transformers.

    Each slot's tokenizer comes from ``<path>/<tokenizer_subfolder>`` and its encoder from
    ``<path>/<encoder_subfolder>``, with the classes the profile names; a ``tokenizer_only`` slot
    (Anima's T5 ids) gets its tokenizer and no encoder entry. ``dtype`` defaults to the
    profile's encoder dtype. ``slots`` restricts loading to some slots (e.g. only ``t5``).
    """
    from te_align.encoding.core import _resolve_dtype, resolve_profile

    p = resolve_profile(profile)
    source = str(path_or_repo)
    is_local = Path(source).expanduser().exists()
    if is_local:
        source = str(Path(source).expanduser())
    wanted = slots or list(p.slot_names)
    tokenizers: dict[str, Any] = {}
    encoders: dict[str, Any] = {}
    for name in wanted:
        slot = p.slot(name)
        common: dict[str, Any] = {"revision": revision, "local_files_only": local_files_only}
        if is_local and not (Path(source) / slot.tokenizer_subfolder).is_dir():
            raise EncodingError(f"slot '{name}': no tokenizer folder '{slot.tokenizer_subfolder}' in {source}")
        if not slot.tokenizer_only and is_local and not (Path(source) / slot.encoder_subfolder).is_dir():
            raise EncodingError(f"slot '{name}': no text-encoder folder '{slot.encoder_subfolder}' in {source}")
        if is_local and not any((Path(source) / slot.tokenizer_subfolder).iterdir()):
            # said here: transformers 4 fails on an empty folder with a TypeError (4.57 without protobuf: ImportError)
            raise EncodingError(f"slot '{name}': cannot load from {source}: the folder '{slot.tokenizer_subfolder}' is empty")
        tok_cls = _transformers_class(slot.tokenizer.cls, "AutoTokenizer")
        # a tokenizer_only slot (Anima's T5 ids) has no encoder to load
        enc_cls = None if slot.tokenizer_only else _transformers_class(slot.encoder.cls, "AutoModel")
        torch_dtype = None if enc_cls is None else _resolve_dtype(dtype if dtype is not None else slot.encoder.dtype)
        try:
            try:
                tokenizers[name] = tok_cls.from_pretrained(source, subfolder=slot.tokenizer_subfolder, **common)
            except TypeError as e:  # transformers 4 opens a vocabulary file it did not find (None) instead of OSError
                raise OSError(f"no tokenizer files in '{slot.tokenizer_subfolder}' ({e})") from None
            if enc_cls is None:
                continue
            enc = enc_cls.from_pretrained(
                source, subfolder=slot.encoder_subfolder, **{_dtype_argument(): torch_dtype}, **common
            )
        except OSError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            what = "the tokenizer " if enc_cls is None else ""
            raise EncodingError(f"slot '{name}': cannot load {what}from {source}: {first}") from None
        enc.eval()
        if device is not None:
            enc.to(device)
        encoders[name] = enc
    return tokenizers, encoders


def _dtype_argument() -> str:
    """The name ``from_pretrained`` reads the weights' dtype from: ``dtype`` where configs carry a ``dtype``
    (transformers 4.56 renamed it; 5.x reads only ``dtype``), else ``torch_dtype`` (4.54, sd-scripts' pin)."""
    import transformers

    config = transformers.PretrainedConfig
    return "dtype" if hasattr(config, "dtype") or "dtype" in vars(config()) else "torch_dtype"
