"""Reference text encoding by an alignment profile.

One mechanism for every family, read top to bottom the way a diffusers ``encode_prompt`` reads:
:func:`encode` checks the request, encodes each slot (:func:`encode_slot`: tokenize, run the
encoder, then the post-processing steps in pipeline order: :func:`select_layer`, :func:`pool`,
:func:`token_window`, :func:`zero_padding`, :func:`drop_prefix`, :func:`trim`) and combines the slot
results into the named tensors the denoiser takes (:func:`evaluate` over the profile's typed
outputs). Family differences live in profile data, not in code paths.
"""

from __future__ import annotations

import dataclasses
import json
import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from te_align._dtypes import DTYPE_NAMES, torch_dtype
from te_align.encoding.conditioning import Conditioning
from te_align.encoding.text import is_absent, render, template_prefix
from te_align.errors import EncodingError
from te_align.profiles import profile as load
from te_align.profiles.expr import Call, Node, Ref, output_specs
from te_align.profiles.model import AlignmentProfile, ImageSpec, SlotSpec

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline
    from transformers import PreTrainedTokenizerBase
    from transformers.utils import ModelOutput

_Component = TypeVar("_Component")

#: CLIP-style chunk body length for long prompts (77 positions minus BOS and EOS).
CHUNK_BODY = 75

#: How far the last long-prompt chunk is padded (:attr:`EncodeOptions.chunk_padding`).
ChunkPadding = Literal["max_length", "longest"]


@dataclass(frozen=True)
class EncodeOptions:
    """Options that change conditioning; all off by default. Part of every cache key.

    long_prompt_chunks:
        0 = off (the profile's truncation). N >= 1 = the NovelAI long-prompt method for chunkable
        slots (``tokenizer.chunkable``: the CLIP slots):
        the prompt's tokens are split into 75-token chunks, each wrapped in BOS/EOS and padded to
        77, at most N chunks; chunk hidden states are concatenated along the sequence and the pooled
        output comes from the first chunk. Every prompt of a batch gets the batch's chunk count
        (or exactly N with ``pad_chunks``).
        Source: NovelAI's "Improvements to SD" (2022) and AUTOMATIC1111/kohya ``max_token_length``.
    chunk_padding:
        With chunking, how far the last chunk is padded. ``"max_length"``: to 77, as above.
        ``"longest"``: diffusion-pipe's SDXL (tdrussell/diffusion-pipe@8f83dbf models/sdxl.py:581-589,744-781):
        every chunk but the last is 77 positions, the last is padded only to the batch's longest
        caption, ``L - 75 * (n - 1) + 2`` positions for a longest caption of L tokens in n chunks
        (a batch of short captions: ``L + 2`` < 77). The chunkable slots share the widest of their
        layouts (the hub CLIP-G tokenizer reads "!" as its pad id and can count a prompt longer than
        CLIP-L; diffusion-pipe tokenizes for both with CLIP-L's). Needs ``long_prompt_chunks >= 1``
        (still the chunk limit) and excludes ``pad_chunks``.
    dropout_policy:
        What a dropped caption or dropped encoder becomes: ``"empty"`` (the encoded empty prompt)
        or ``"zeros"``; ``"profile"`` uses the profile's ``empty_prompt`` rule.
    """

    long_prompt_chunks: int = 0
    dropout_policy: str = "profile"
    #: With chunking: always emit ``long_prompt_chunks`` chunks (fixed shapes, e.g. for a trainer's
    #: per-caption tokenization that is collated later) instead of the batch's longest need.
    pad_chunks: bool = False
    chunk_padding: ChunkPadding = "max_length"

    def __post_init__(self) -> None:
        padding, n = self.chunk_padding, self.long_prompt_chunks
        if padding not in ("max_length", "longest"):
            raise EncodingError(f"chunk_padding must be 'max_length' or 'longest', got {padding!r}")
        if padding == "longest" and n < 1:
            raise EncodingError(f"chunk_padding='longest' needs long_prompt_chunks >= 1, got {n}")
        if padding == "longest" and self.pad_chunks:
            raise EncodingError("chunk_padding='longest' excludes pad_chunks (which pads every chunk to 77)")

    def as_dict(self) -> dict[str, int | str | bool]:
        d: dict[str, int | str | bool] = {
            "long_prompt_chunks": self.long_prompt_chunks,
            "dropout_policy": self.dropout_policy,
            "pad_chunks": self.pad_chunks,
        }
        if self.chunk_padding != "max_length":  # only when set: cache keys made before the option stay valid
            d["chunk_padding"] = self.chunk_padding
        return d


@dataclass
class SlotResult:
    """Everything one slot produced, before combination."""

    hidden: torch.Tensor
    pooled: torch.Tensor | None
    mask: torch.Tensor
    ids: torch.Tensor
    denoiser_mask: torch.Tensor
    token_counts: list[int] = field(default_factory=list)


# ------------------------------------------------------------------------------ components
def eos_mask(ids: torch.Tensor, eos: int | None) -> torch.Tensor:
    """Attention mask of CLIP ids made without one: real tokens up to and including the first EOS (all ones when
    the tokenizer has no EOS)."""
    if eos is None:
        return torch.ones_like(ids)
    first = (ids == eos).int().argmax(dim=1, keepdim=True)
    return (torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) <= first).to(torch.long)


def _component(table: Mapping[str, _Component] | None, slot: SlotSpec, attr: str, kind: str) -> _Component:
    if table is None:
        table = {}
    if not isinstance(table, Mapping):
        raise EncodingError(
            f"{kind}s must be a dict of slot name (or component name) -> {kind}, got a {type(table).__name__}"
        )
    folder = getattr(slot, attr)
    for key in (slot.name, folder):
        if key in table and table[key] is not None:
            return table[key]
    raise EncodingError(
        f"no {kind} for slot '{slot.name}' (pass it under '{slot.name}' or '{folder}'); got: "
        + (", ".join(sorted(table)) or "nothing")
    )


def _from_pipeline(
    pipeline: DiffusionPipeline, slot: SlotSpec
) -> tuple[PreTrainedTokenizerBase, torch.nn.Module | None]:
    tok = getattr(pipeline, slot.tokenizer_subfolder, None)
    if slot.tokenizer_only:
        if tok is None:
            raise EncodingError(f"slot '{slot.name}': the pipeline has no component '{slot.tokenizer_subfolder}'")
        return tok, None
    enc = getattr(pipeline, slot.encoder_subfolder, None)
    if tok is None or enc is None:
        missing = slot.tokenizer_subfolder if tok is None else slot.encoder_subfolder
        raise EncodingError(f"slot '{slot.name}': the pipeline has no component '{missing}'")
    return tok, enc


def _config_width(config: object) -> int | None:
    for name in ("hidden_size", "d_model"):
        v = getattr(config, name, None)
        if isinstance(v, int):
            return v
    text_config = getattr(config, "text_config", None)
    if text_config is not None and text_config is not config:
        return _config_width(text_config)
    return None


def check_components(
    profile: AlignmentProfile,
    slot: SlotSpec,
    tokenizer: PreTrainedTokenizerBase,
    encoder: torch.nn.Module,
    device: torch.device | None,
) -> None:
    """Refuse encoders that do not fit the profile, naming the slot and both values."""
    width = _config_width(getattr(encoder, "config", None))
    if width is not None and width != slot.encoder.hidden_size:
        raise EncodingError(
            f"slot '{slot.name}': the loaded encoder has hidden size {width} but profile "
            f"'{profile.name}' expects {slot.encoder.hidden_size} (override with "
            f"{slot.name}_hidden_size=... if this is intended)"
        )
    if not callable(tokenizer):
        raise EncodingError(f"slot '{slot.name}': the tokenizer is a {type(tokenizer).__name__}, not a tokenizer")
    if not callable(getattr(encoder, "parameters", None)):
        raise EncodingError(f"slot '{slot.name}': the text encoder is a {type(encoder).__name__}, not a torch module")
    if device is not None:
        p = next(iter(encoder.parameters()), None)
        if p is not None and p.device.type != device.type:
            raise EncodingError(
                f"slot '{slot.name}': the encoder is on {p.device} but device={device} was requested; "
                "move the encoder first (encoder.to(device))"
            )


def _encoder_dtype(encoder: torch.nn.Module) -> torch.dtype:
    dt = getattr(encoder, "dtype", None)
    if isinstance(dt, torch.dtype):
        return dt
    p = next(iter(encoder.parameters()), None)
    return p.dtype if p is not None else torch.float32


def _encoder_device(encoder: torch.nn.Module) -> torch.device:
    p = next(iter(encoder.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def _final_norm(encoder: torch.nn.Module, slot: SlotSpec) -> torch.nn.Module:
    for path in ("text_model.final_layer_norm", "final_layer_norm", "encoder.final_layer_norm", "norm", "model.norm"):
        obj: object = encoder
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    raise EncodingError(f"slot '{slot.name}': the profile applies the final layer norm but {type(encoder).__name__} has none")


# ------------------------------------------------------------------------------ tokenizing
def tokenize_length(slot: SlotSpec, tokenizer: PreTrainedTokenizerBase, *, negative: bool = False) -> int:
    """The truncation length handed to the tokenizer for one slot.

    ``max_length`` plus dropped template tokens, or an explicit ``tokenize_max_length``; for a
    ``bos_and_tail`` window behind a template prefix (Sana), the prefix's token count plus
    ``max_length - 2``, as the Sana pipeline computes it.
    """
    t = slot.tokenizer
    length = t.tokenize_max_length or (t.max_length + t.drop_start_tokens)
    if t.token_window == "bos_and_tail":
        prefix = template_prefix(t, negative=negative)
        if prefix:
            length = len(prompt_tokenizer(slot, tokenizer).encode(prefix)) + t.max_length - 2
    return length


#: tokenizer -> its copy that reads a literal pad token as text (built once per tokenizer object).
_TEXT_PAD: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, PreTrainedTokenizerBase] = (
    weakref.WeakKeyDictionary()
)


def prompt_tokenizer(slot: SlotSpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The tokenizer that reads prompt text for ``slot``.

    ``tokenizer.pad_token_in_prompt = "pad_id"``: ``tokenizer`` itself. ``"text"``: a copy (built
    once per tokenizer) in which the pad token written in a prompt is ordinary BPE text while padding
    keeps the pad id: the hub SDXL/SD3 CLIP-G tokenizer (pad "!") then tokenizes as kohya
    sd-scripts' (the laion tokenizer with ``pad_token_id = 0``: "!" is 256, "!!" 748).
    """
    if slot.tokenizer.pad_token_in_prompt == "pad_id":
        return tokenizer
    cached = _TEXT_PAD.get(tokenizer)
    if cached is None:
        cached = _text_pad_tokenizer(slot, tokenizer)
        _TEXT_PAD[tokenizer] = cached
        _TEXT_PAD[cached] = cached
    return cached


def _clip_bpe_tokenizer(
    vocab: dict[str, int], merges: list[tuple[str, str]], fast: bool, **kw: Any
) -> PreTrainedTokenizerBase:
    """A CLIP BPE tokenizer made from ``vocab`` and ``merges`` (the Rust-backed one where ``fast``)."""
    import inspect
    import tempfile
    from pathlib import Path

    import transformers

    if "vocab" in inspect.signature(transformers.CLIPTokenizer.__init__).parameters:
        # transformers 5: CLIPTokenizer is the Rust-backed one and is built from the vocabulary in memory
        return transformers.CLIPTokenizer(vocab=vocab, merges=merges, **kw)
    # transformers 4: CLIPTokenizer (Python) and CLIPTokenizerFast read vocab.json and merges.txt files
    cls = transformers.CLIPTokenizerFast if fast else transformers.CLIPTokenizer
    with tempfile.TemporaryDirectory() as d:
        vocab_file, merges_file = Path(d) / "vocab.json", Path(d) / "merges.txt"
        vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        merges_file.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
        return cls(str(vocab_file), str(merges_file), **kw)


def _text_pad_tokenizer(slot: SlotSpec, tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    pad, pad_id = tok.pad_token, tok.pad_token_id
    if pad is None or pad in (tok.bos_token, tok.eos_token, tok.unk_token):
        return tok  # the pad token is a special token anyway (no text spells it)
    kw = {"pad_token": tok.eos_token, "model_max_length": tok.model_max_length}
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        model = json.loads(backend.to_str())["model"]
        if model.get("type") != "BPE":
            raise EncodingError(
                f"slot '{slot.name}': pad_token_in_prompt = \"text\" needs a CLIP BPE tokenizer; got a {model.get('type')} "
                f"{type(tok).__name__}"
            )
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        new = _clip_bpe_tokenizer(model["vocab"], merges, True, **kw)  # type: ignore[arg-type]
    elif isinstance(getattr(tok, "encoder", None), dict) and isinstance(getattr(tok, "bpe_ranks", None), dict):
        # a Python BPE tokenizer (transformers 4's CLIPTokenizer, what sd-scripts loads on 4.54): vocabulary and ranks
        ranks: dict[tuple[str, str], int] = tok.bpe_ranks
        new = _clip_bpe_tokenizer(dict(tok.encoder), sorted(ranks, key=ranks.__getitem__), False, **kw)
    else:
        raise EncodingError(f"slot '{slot.name}': pad_token_in_prompt = \"text\" needs a CLIP BPE tokenizer; got {type(tok).__name__}")
    new.pad_token_id = pad_id
    new.padding_side = tok.padding_side
    probe = new(pad, add_special_tokens=False)["input_ids"]
    if probe == [pad_id] or new.pad_token_id != pad_id:  # pragma: no cover - depends on the transformers version
        raise EncodingError(f"slot '{slot.name}': cannot build a tokenizer that reads {pad!r} as text with this transformers version")
    return new


def _tokenize(
    slot: SlotSpec, tokenizer: PreTrainedTokenizerBase, texts: list[str], negative: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    t = slot.tokenizer
    tokenizer = prompt_tokenizer(slot, tokenizer)
    length = tokenize_length(slot, tokenizer, negative=negative)
    old_side = getattr(tokenizer, "padding_side", None)
    if old_side == t.padding_side:
        old_side = None  # nothing to switch (setting it is not free on fast tokenizers)
    try:
        if old_side is not None:
            tokenizer.padding_side = t.padding_side
        # lists, made into tensors below: transformers' return_tensors="pt" walks the nested lists in Python first
        kwargs: dict[str, bool | int | str] = {"add_special_tokens": t.add_special_tokens}
        if t.truncation:
            kwargs.update(truncation=True, max_length=length)
            kwargs["padding"] = "max_length" if t.padding == "max_length" else True
        else:
            kwargs.update(truncation=False, padding=True)
        enc = tokenizer(texts, **kwargs)
    finally:
        if old_side is not None:
            tokenizer.padding_side = old_side
    ids = torch.tensor(enc["input_ids"], dtype=torch.long)
    mask = enc.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else torch.tensor(mask, dtype=torch.long)
    floor = max(t.min_length or 0, length if (t.padding == "max_length" and not t.truncation) else 0)
    if ids.shape[1] < floor:
        pad_id = pad_id_of(slot, tokenizer)
        if t.min_length_pad_id is not None and ids.shape[1] < (t.min_length or 0):
            pad_id = t.min_length_pad_id
        ids, mask = pad_tokens(slot, ids, mask, floor, pad_id)
    return ids, mask


def pad_id_of(slot: SlotSpec, tokenizer: PreTrainedTokenizerBase) -> int:
    """The id padding positions get: the profile's ``pad_token_id``, else the tokenizer's, else 0."""
    t = slot.tokenizer
    return t.pad_token_id if t.pad_token_id is not None else (tokenizer.pad_token_id or 0)


def pad_tokens(slot: SlotSpec, ids: torch.Tensor, mask: torch.Tensor, length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad (never cut) ids and mask to ``length`` on the slot's padding side: ``pad_id``, mask 0."""
    extra = length - ids.shape[1]
    if extra <= 0:
        return ids, mask
    pad = (extra, 0) if slot.tokenizer.padding_side == "left" else (0, extra)
    return torch.nn.functional.pad(ids, pad, value=pad_id), torch.nn.functional.pad(mask, pad, value=0)


def count_tokens(
    slot: SlotSpec, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], *, negative: bool = False
) -> list[int]:
    """Tokens per prompt for a slot, without special tokens and without truncation."""
    texts = [render(slot.tokenizer, p, negative=negative) for p in prompts]
    tokenizer = prompt_tokenizer(slot, tokenizer)
    return [len(x) for x in tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]]


def long_prompt_chunks(
    profile: AlignmentProfile | str,
    prompts: Sequence[str],
    max_chunks: int,
    *,
    tokenizers: Mapping[str, PreTrainedTokenizerBase] | None = None,
    pipeline: DiffusionPipeline | None = None,
) -> list[int]:
    """Chunks each prompt needs under the NovelAI method (1..max_chunks), per the profile's first chunkable slot.

    Bucket a dataset by this number so a batch is not padded to its longest prompt's chunk count.
    """
    p = resolve_profile(profile)
    clip = next((s for s in p.slots if s.tokenizer.chunkable), None)
    if clip is None:
        raise EncodingError(
            f"profile '{p.name}' has no chunkable slot; long-prompt chunking applies to slots with tokenizer.chunkable (CLIP)"
        )
    if max_chunks < 1:
        raise EncodingError(f"max_chunks must be >= 1, got {max_chunks}")
    tok = _from_pipeline(pipeline, clip)[0] if pipeline is not None else _component(tokenizers, clip, "tokenizer_subfolder", "tokenizer")
    body = clip.tokenizer.max_length - 2
    return [max(1, min(max_chunks, math.ceil(n / body))) for n in count_tokens(clip, tok, prompts)]


def _chunk_ids(
    slot: SlotSpec,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    max_chunks: int,
    fixed: bool = False,
    longest: bool = False,
    min_width: int = 0,
) -> tuple[torch.Tensor, list[int], int]:
    """Long-prompt chunks laid side by side: (B, n_chunks * 77) ids (NovelAI), token counts, chunks per prompt.

    ``longest`` (``chunk_padding = "longest"``): the last chunk is cut to the batch's longest last piece plus BOS and
    EOS, (B, (n_chunks - 1) * 77 + that), or to ``min_width`` where that is wider (more chunks where it needs them);
    positions past a prompt's EOS are pad, as in 77-wide chunks.
    """
    t = slot.tokenizer
    tokenizer = prompt_tokenizer(slot, tokenizer)
    bos = t.bos_token_id if t.bos_token_id is not None else tokenizer.bos_token_id
    eos = t.eos_token_id if t.eos_token_id is not None else tokenizer.eos_token_id
    pad = t.pad_token_id if t.pad_token_id is not None else tokenizer.pad_token_id
    body = t.max_length - 2
    raw = tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
    counts = [len(r) for r in raw]
    n = max_chunks if fixed else max(1, min(max_chunks, max(math.ceil(c / body) for c in counts) if counts else 1))
    if longest:
        tail = max((min(c, n * body) - (n - 1) * body for c in counts), default=0)
        width = max((n - 1) * t.max_length + max(tail, 0) + 2, min_width)
        n = math.ceil(width / t.max_length)
    rows = []
    for r in raw:
        r = r[: n * body]
        row: list[int] = []
        for k in range(n):
            part = r[k * body : (k + 1) * body]
            row += [bos, *part, eos]
            row += [pad] * (t.max_length - len(part) - 2)
        rows.append(row)
    ids = torch.tensor(rows, dtype=torch.long).reshape(len(texts), n * t.max_length)
    if longest:
        ids = ids[:, :width]
    return ids, counts, n


# ---------------------------------------------------------------------------------- one slot
def _chunked(slot: SlotSpec, options: EncodeOptions) -> bool:
    return options.long_prompt_chunks >= 1 and slot.tokenizer.chunkable


def _batch_dim(slot: SlotSpec) -> int:
    """The batch dimension of a slot's hidden states: 1 for a layer stack (``layer = "all"``), else 0."""
    return 1 if slot.encoder.layer == "all" else 0


def encode_slot(
    profile: AlignmentProfile,
    slot: SlotSpec,
    tokenizer: PreTrainedTokenizerBase,
    encoder: torch.nn.Module | None,
    prompts: Sequence[str],
    *,
    device: torch.device,
    negative: bool = False,
    options: EncodeOptions = EncodeOptions(),
    chunk_width: int = 0,
) -> SlotResult:
    """Tokenize, encode and post-process one slot exactly as its profile entry says (``chunk_width``: see
    :func:`tokenize_slot`)."""
    ids, mask = tokenize_slot(
        slot, tokenizer, prompts, negative=negative, options=options, chunk_width=chunk_width
    )
    counts = count_tokens(slot, tokenizer, prompts, negative=negative) if _chunked(slot, options) else None
    return encode_slot_tokens(profile, slot, encoder, ids, mask, device=device, counts=counts)


def tokenize_slot(
    slot: SlotSpec,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    negative: bool = False,
    options: EncodeOptions = EncodeOptions(),
    chunk_width: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of one slot exactly as :func:`encode_slot` makes them.

    Trainer hooks call this where the trainer tokenizes (e.g. in DataLoader workers) and hand the
    result to :func:`encode_slot_tokens` later; together they equal :func:`encode_slot`. With
    long-prompt chunking the chunks are laid side by side: (batch, chunks * max_length), the last
    chunk narrower with ``chunk_padding = "longest"``; there ``chunk_width`` widens the layout to the
    batch's width in another slot (:func:`encode` passes the widest chunkable slot's, so CLIP-L and
    CLIP-G line up where their tokenizers count a prompt differently). Without chunking, a chunkable
    slot's ids are at most ``max_length`` wide (wider ones would read as chunks).
    """
    texts = [render(slot.tokenizer, p, negative=negative) for p in prompts]
    if _chunked(slot, options):
        n, fixed, longest = options.long_prompt_chunks, options.pad_chunks, options.chunk_padding == "longest"
        ids = _chunk_ids(slot, tokenizer, texts, n, fixed=fixed, longest=longest, min_width=chunk_width)[0]
        return ids, torch.ones_like(ids)
    absent = [is_absent(slot.tokenizer, p) for p in prompts]
    if not any(absent):
        ids, mask = _tokenize(slot, tokenizer, texts, negative)
    else:
        ids, mask = _tokenize_with_absent(slot, tokenizer, texts, absent, negative)
    if slot.tokenizer.chunkable and ids.shape[1] > slot.tokenizer.max_length:
        raise EncodingError(
            f"slot '{slot.name}': {ids.shape[1]} positions without long-prompt chunks, over max_length "
            f"{slot.tokenizer.max_length}; a chunkable slot's ids that wide are read as chunks (encode with "
            "long_prompt_chunks >= 1, or set tokenizer.chunkable = false)"
        )
    return ids, mask


def _tokenize_with_absent(
    slot: SlotSpec, tokenizer: PreTrainedTokenizerBase, texts: list[str], absent: list[bool], negative: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize the prompts that have text for the slot; the others get pad ids and an all-zero mask."""
    t = slot.tokenizer
    present = [x for x, a in zip(texts, absent, strict=True) if not a]
    if present:
        ids_p, mask_p = _tokenize(slot, tokenizer, present, negative)
        width = ids_p.shape[1]
    else:
        width = tokenize_length(slot, tokenizer, negative=negative) if t.padding == "max_length" else max(t.min_length or 0, 1)
        ids_p = mask_p = torch.zeros((0, width), dtype=torch.long)
    ids = torch.full((len(texts), width), pad_id_of(slot, tokenizer), dtype=ids_p.dtype)
    mask = torch.zeros((len(texts), width), dtype=mask_p.dtype)
    rows = torch.tensor([i for i, a in enumerate(absent) if not a], dtype=torch.long)
    ids[rows], mask[rows] = ids_p, mask_p
    return ids, mask


def encode_slot_tokens(
    profile: AlignmentProfile,
    slot: SlotSpec,
    encoder: torch.nn.Module | None,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    device: torch.device | None = None,
    counts: list[int] | None = None,
) -> SlotResult:
    """Encode and post-process ids from :func:`tokenize_slot` (default device: the encoder's).

    Ids of a chunkable slot wider than ``max_length`` are long-prompt chunks: ``max_length``-wide
    pieces and a narrower last one (``chunk_padding = "longest"``). Each chunk position is encoded
    with the plain batch shape, so chunk 1 is bit-identical to the unchunked encoding (float results
    depend on the batch shape); the pooled output comes from chunk 1.
    """
    if slot.tokenizer_only:
        if device is not None:
            ids, mask = ids.to(device), mask.to(device)
        return _tokens_only(slot, ids, mask, counts)
    ids, mask = ids.to(device or _encoder_device(encoder)), mask.to(device or _encoder_device(encoder))
    width = slot.tokenizer.max_length
    if slot.tokenizer.chunkable and ids.shape[1] > width:
        parts = [
            _forward(slot, encoder, ids[:, k : k + width], mask[:, k : k + width]) for k in range(0, ids.shape[1], width)
        ]
        hidden = torch.cat([h for h, _ in parts], dim=-2)
        pooled = parts[0][1]
    else:
        hidden, pooled = _encode_batch(slot, encoder, ids, mask)
    if counts is None:
        counts = [int(x) for x in mask.sum(dim=1)]
    return _post_process(slot, encoder, hidden, pooled, ids, mask, counts)


def _tokens_only(slot: SlotSpec, ids: torch.Tensor, mask: torch.Tensor, counts: list[int] | None) -> SlotResult:
    """The result of a tokenizer-only slot: ids and masks as tokenized; ``hidden`` is empty (width 0)."""
    if counts is None:
        counts = [int(x) for x in mask.sum(dim=1)]
    hidden = torch.zeros((*ids.shape, 0), dtype=torch.float32, device=ids.device)
    return SlotResult(hidden=hidden, pooled=None, mask=mask, ids=ids, denoiser_mask=denoiser_mask(slot, mask, torch.float32), token_counts=counts)


# ------------------------------------------------------------------------- running the encoder
def run_encoder(
    slot: SlotSpec, encoder: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor
) -> ModelOutput:
    """The encoder's output for ``ids``; the attention mask goes in only where the profile says
    (``masks.encoder``), and all hidden states are returned when a layer other than the normed
    last one is selected."""
    e = slot.encoder
    kwargs: dict[str, torch.Tensor | bool] = {"input_ids": ids}
    if slot.masks.encoder:
        dtype = {"float": torch.float32, "bool": torch.bool}.get(slot.masks.encoder_mask_dtype)
        kwargs["attention_mask"] = mask.to(dtype) if dtype is not None else mask
    if not (e.layer == "last" and e.final_layer_norm) or _is_lm_head(encoder):
        kwargs["output_hidden_states"] = True
    return encoder(**kwargs)


def _is_lm_head(encoder: torch.nn.Module) -> bool:
    # language-model heads return logits and no last_hidden_state at all
    return type(encoder).__name__.endswith(("ForCausalLM", "ForConditionalGeneration"))


def select_layer(slot: SlotSpec, encoder: torch.nn.Module, out: ModelOutput) -> torch.Tensor:
    """HiddenMaskIds 1: the hidden states the profile takes (``encoder.layer``: last, penultimate, an index
    or every layer stacked), through the final layer norm where ``encoder.final_layer_norm`` says."""
    e = slot.encoder
    # last_hidden_state is read by name: position 0 of a CLIPTextModelWithProjection output is text_embeds
    if e.layer == "last" and e.final_layer_norm and getattr(out, "last_hidden_state", None) is not None:
        return out.last_hidden_state
    if e.layer == "last" and e.final_layer_norm:
        return out.hidden_states[-1]  # language models: the last entry is already normed
    if e.layer == "all":
        return torch.stack(tuple(out.hidden_states[1:]), dim=0)
    if isinstance(e.layer, tuple):
        return combine_layers(e.layer_combine, [out.hidden_states[k] for k in e.layer])
    index = {"last": -1, "penultimate": -2}.get(e.layer, e.layer)  # type: ignore[arg-type]
    hidden = out.hidden_states[index]
    if e.final_layer_norm:
        hidden = _final_norm(encoder, slot)(hidden)
    return hidden


def combine_layers(how: str, states: list[torch.Tensor]) -> torch.Tensor:
    """Several tapped (batch, sequence, width) states as one tensor (``encoder.layer_combine``): ``concat``
    (FLUX.2: the layers side by side, list order), ``interleave`` (width-major, layer fastest) or ``stack``
    ((batch, sequence, layers, width))."""
    if how == "concat":
        return torch.cat(states, dim=-1)
    stacked = torch.stack(states, dim=-2 if how == "stack" else -1)
    return stacked if how == "stack" else stacked.flatten(-2)


def pool(slot: SlotSpec, ids: torch.Tensor, out: ModelOutput) -> torch.Tensor | None:
    """HiddenMaskIds 2: the pooled embedding (``encoder.pooled``: pooler_output, text_embeds, the last hidden
    state at the first EOS token, or none)."""
    e = slot.encoder
    if e.pooled == "none":
        return None
    if e.pooled == "pooler_output":
        return out.pooler_output
    if e.pooled == "text_embeds":
        return out.text_embeds
    # first_eos
    positions = (ids == slot.tokenizer.eos_token_id).int().argmax(dim=-1)
    last = out.last_hidden_state
    return last[torch.arange(last.shape[0], device=last.device), positions]


def _forward(
    slot: SlotSpec, encoder: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = run_encoder(slot, encoder, ids, mask)
    return select_layer(slot, encoder, out), pool(slot, ids, out)


def _encode_batch(
    slot: SlotSpec, encoder: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_forward` over a batch, one sample at a time where the profile says so (``per_sample``);
    samples without text for the slot (``absent_text = "zeros"``: an all-zero mask) are not encoded
    and get zeros."""
    absent = (mask.sum(dim=1) == 0).tolist() if slot.tokenizer.absent_text == "zeros" else [False] * ids.shape[0]
    if not slot.encoder.per_sample and not any(absent):
        return _forward(slot, encoder, ids, mask)
    bd = _batch_dim(slot)
    keep = [i for i, a in enumerate(absent) if not a]
    if slot.encoder.per_sample:
        rows = {i: _forward(slot, encoder, ids[i : i + 1], mask[i : i + 1]) for i in keep}
    elif keep:
        hidden, pooled = _forward(slot, encoder, ids[keep], mask[keep])
        rows = {
            i: (hidden.narrow(bd, k, 1), None if pooled is None else pooled[k : k + 1]) for k, i in enumerate(keep)
        }
    else:
        rows = {}
    zero_h, zero_p = _zero_row(slot, encoder, ids, rows)
    hiddens = [rows[i][0] if i in rows else zero_h for i in range(ids.shape[0])]
    pooled_rows = [rows[i][1] if i in rows else zero_p for i in range(ids.shape[0])]
    out_pooled = None if slot.encoder.pooled == "none" else torch.cat(pooled_rows, dim=0)  # type: ignore[arg-type]
    return torch.cat(hiddens, dim=bd), out_pooled


def _zero_row(
    slot: SlotSpec,
    encoder: torch.nn.Module,
    ids: torch.Tensor,
    rows: Mapping[int, tuple[torch.Tensor, torch.Tensor | None]],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Zero hidden state (and pooled output) of one sample, shaped like an encoded one."""
    if rows:
        h, p = next(iter(rows.values()))
        return torch.zeros_like(h), None if p is None else torch.zeros_like(p)
    e = slot.encoder
    width = _config_width(getattr(encoder, "config", None)) or e.hidden_size
    kw: dict[str, torch.dtype | torch.device] = {"dtype": _encoder_dtype(encoder), "device": ids.device}
    lead = (e.num_layers,) if e.layer == "all" else ()
    pooled = None if e.pooled == "none" else torch.zeros((1, e.projection_dim or width), **kw)
    if isinstance(e.layer, tuple):
        n = len(e.layer)
        tail = (n, width) if e.layer_combine == "stack" else (n * width,)
        return torch.zeros((1, ids.shape[1], *tail), **kw), pooled
    return torch.zeros((*lead, 1, ids.shape[1], width), **kw), pooled


# ------------------------------------------------------------ post-processing, in pipeline order
def _post_process(
    slot: SlotSpec,
    encoder: torch.nn.Module,
    hidden
: torch.Tensor,
    pooled: torch.Tensor | None,
    ids: torch.Tensor,
    mask: torch.Tensor,
    counts: list[int],
) -> SlotResult:
    """Steps 3-6 after :func:`select_layer` and :func:`pool`, in the encoder's dtype."""
    hidden = hidden.to(_encoder_dtype(encoder))
    if pooled is not None:
        pooled = pooled.to(_encoder_dtype(encoder))
    hidden, mask, ids = token_window(slot, hidden, mask, ids)
    hidden = zero_padding(slot, hidden, mask)
    hidden, mask, ids = drop_prefix(slot, hidden, mask, ids)
    hidden, mask, ids = trim(slot, hidden, mask, ids)
    return SlotResult(hidden=hidden, pooled=pooled, mask=mask, ids=ids, denoiser_mask=denoiser_mask(slot, mask, hidden.dtype),
                      token_counts=counts)


#: (hidden states, attention mask, token ids) as a step passes them on.
HiddenMaskIds = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def token_window(slot: SlotSpec, hidden: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor) -> HiddenMaskIds:
    """HiddenMaskIds 3: ``tokenizer.token_window = "bos_and_tail"`` keeps position 0 and the last
    ``max_length - 1`` positions (Sana's ``select_index``); ``all`` keeps everything."""
    t = slot.tokenizer
    if t.token_window != "bos_and_tail":
        return hidden, mask, ids
    sd = _batch_dim(slot) + 1
    index = torch.tensor([0, *range(hidden.shape[sd] - t.max_length + 1, hidden.shape[sd])], device=hidden.device)
    return hidden.index_select(sd, index), mask.index_select(1, index), ids.index_select(1, index)


def zero_padding(slot: SlotSpec, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """HiddenMaskIds 4: ``masks.zero_padded`` multiplies the padded positions of the hidden states by zero."""
    if not slot.masks.zero_padded:
        return hidden
    if hidden.dim() == 3:
        return hidden * mask.unsqueeze(-1).to(hidden.dtype)
    if _batch_dim(slot) == 0:  # (batch, sequence, layers, width): layer_combine = "stack"
        return hidden * mask[:, :, None, None].to(hidden.dtype)
    return hidden * mask[None, :, :, None].to(hidden.dtype)


def drop_prefix(slot: SlotSpec, hidden: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor) -> HiddenMaskIds:
    """HiddenMaskIds 5: drop the template's first ``tokenizer.drop_start_tokens`` positions (Qwen-Image's chat
    prefix); with ``masks.repad`` every padded position goes too and each sample is re-padded with
    zeros (:func:`repad`)."""
    if slot.masks.repad != "none":
        return repad(slot, hidden, mask, ids)
    d = slot.tokenizer.drop_start_tokens
    if not d:
        return hidden, mask, ids
    sd = _batch_dim(slot) + 1
    return hidden.narrow(sd, d, hidden.shape[sd] - d), mask[:, d:], ids[:, d:]


def repad(slot: SlotSpec, hidden: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor) -> HiddenMaskIds:
    """Drop masked positions per sample (and the template prefix), then re-pad with zeros to the
    batch's longest (``masks.repad = "batch_longest"``, Qwen-Image) or ``max_length`` (Wan).

    Vectorised: a stable sort brings each sample's real positions to the front in their order,
    the first ``drop_start_tokens`` of them are skipped, and positions past a sample's length are
    zero. Values are gathered, never recomputed, so they equal the pipelines' per-sample loops.
    """
    if hidden.dim() != 3:
        raise EncodingError(f"slot '{slot.name}': repad needs (batch, sequence, width) hidden states")
    d = slot.tokenizer.drop_start_tokens
    keep = mask.bool()
    lengths = (keep.sum(dim=1) - d).clamp(min=0)
    target = int(lengths.max()) if slot.masks.repad == "batch_longest" else slot.tokenizer.max_length
    valid = torch.arange(target, device=mask.device).unsqueeze(0) < lengths.unsqueeze(1)
    if slot.tokenizer.padding_side == "right":
        # Right padding: real positions are a prefix, so a slice is the same selection.
        span = hidden.shape[1] - d
        gathered, gathered_ids = hidden[:, d : d + target], ids[:, d : d + target]
        if span < target:
            gathered = torch.nn.functional.pad(gathered, (0, 0, 0, target - span))
            gathered_ids = torch.nn.functional.pad(gathered_ids, (0, target - span))
    else:
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, d : d + target]
        if order.shape[1] < target:
            order = torch.nn.functional.pad(order, (0, target - order.shape[1]))
        gathered = hidden.gather(1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        gathered_ids = ids.gather(1, order)
    out_h = torch.where(valid.unsqueeze(-1), gathered, torch.zeros((), dtype=hidden.dtype, device=hidden.device))
    out_i = torch.where(valid, gathered_ids, torch.zeros((), dtype=ids.dtype, device=ids.device))
    return out_h, valid.to(torch.long), out_i


def trim(slot: SlotSpec, hidden: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor) -> HiddenMaskIds:
    """HiddenMaskIds 6: a slot tokenized past ``max_length`` (``tokenizer.tokenize_max_length``, Qwen-Image)
    is cut back to ``max_length`` positions (not after a re-pad to ``max_length``)."""
    t = slot.tokenizer
    if not t.tokenize_max_length or slot.masks.repad == "max_length":
        return hidden, mask, ids
    sd = _batch_dim(slot) + 1
    return hidden.narrow(sd, 0, min(hidden.shape[sd], t.max_length)), mask[:, : t.max_length], ids[:, : t.max_length]


def denoiser_mask(slot: SlotSpec, mask: torch.Tensor, embeds_dtype: torch.dtype) -> torch.Tensor:
    """The mask handed to the denoiser: the real tokens plus ``masks.denoiser_extra_pad_tokens``
    visible pad positions (Chroma: 1), in ``masks.denoiser_mask_dtype``."""
    m = slot.masks
    lengths = mask.sum(dim=1, keepdim=True)
    positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    visible = positions < lengths + m.denoiser_extra_pad_tokens
    mask_dtype = {"int64": torch.long, "bool": torch.bool, "embeds": embeds_dtype}[m.denoiser_mask_dtype]
    return visible.to(mask_dtype)


# ------------------------------------------------------------------------------ combining
def evaluate(node: Node, results: Mapping[str, SlotResult]) -> torch.Tensor | int:
    """Evaluate an output expression over slot results."""
    if isinstance(node, int):
        return node
    if isinstance(node, Ref):
        value = getattr(results[node.slot], node.attr)
        if value is None:
            raise EncodingError(f"slot '{node.slot}' has no {node.attr} output (its profile sets pooled = 'none')")
        return value
    assert isinstance(node, Call)
    args = [evaluate(a, results) for a in node.args]
    if node.fn == "feat":
        return torch.cat(args, dim=-1)  # type: ignore[arg-type]
    if node.fn == "seq":
        return torch.cat(args, dim=-2)  # type: ignore[arg-type]
    if node.fn == "padw":
        x, w = args
        width = w if isinstance(w, int) else w.shape[-1]
        return torch.nn.functional.pad(x, (0, width - x.shape[-1]))  # type: ignore[union-attr]
    if node.fn == "text_ids":
        (x,) = args
        return torch.zeros(x.shape[-2], 3).to(device=x.device, dtype=x.dtype)  # type: ignore[union-attr]
    if node.fn == "text_ids_4d":
        (x,) = args
        return flux2_text_ids(x)  # type: ignore[arg-type]
    raise EncodingError(f"unknown function {node.fn}")  # pragma: no cover - rejected at profile load


def flux2_text_ids(x: torch.Tensor) -> torch.Tensor:
    """FLUX.2's text position ids for (batch, sequence, width) states: (batch, sequence, 4) int64 whose
    (t, h, w, l) rows are (0, 0, 0, position) (Flux2Pipeline._prepare_text_ids' cartesian product)."""
    ids = torch.zeros((x.shape[0], x.shape[-2], 4), dtype=torch.long, device=x.device)
    ids[..., 3] = torch.arange(x.shape[-2], device=x.device)
    return ids


# ---------------------------------------------------------------------------------- public
def resolve_profile(profile: AlignmentProfile | str) -> AlignmentProfile:
    if isinstance(profile, AlignmentProfile):
        return profile
    return load(profile)


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return torch_dtype(dtype)
    raise EncodingError(f"dtype must be a torch dtype or one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")


@dataclass(frozen=True)
class _Request:
    """A checked :func:`encode` call."""

    #: What each prompt's encoded slots read: "" where a whole caption is dropped under the "encode" rule.
    texts: list[str]
    #: Whole captions dropped, and per slot the samples whose encoder output is dropped (whole drops included).
    drop: list[bool]
    drop_slots: dict[str, list[bool]]
    #: What a dropped part becomes: "encode" (the encoded empty prompt) or "zeros".
    policy: str
    options: EncodeOptions
    device: torch.device | None
    dtype: torch.dtype | None
    negative: bool
    #: Condition images per prompt (edit models), or None for text only.
    images: list[list[Any]] | None = None


def _check_request(
    p: AlignmentProfile,
    prompts: str | Sequence[str],
    *,
    options: EncodeOptions | None,
    dtype: torch.dtype | str | None,
    device: torch.device | str | None,
    drop: Sequence[bool] | None,
    drop_slots: Mapping[str, Sequence[bool]] | None,
    negative: bool,
) -> _Request:
    opts = options or EncodeOptions()
    if opts.dropout_policy not in ("profile", "empty", "zeros"):
        raise EncodingError(f"dropout_policy must be 'profile', 'empty' or 'zeros', got {opts.dropout_policy!r}")
    if opts.long_prompt_chunks < 0:
        raise EncodingError(f"long_prompt_chunks must be >= 0, got {opts.long_prompt_chunks}")
    if isinstance(prompts, str):
        batch = [prompts]
    elif isinstance(prompts, Iterable) and not isinstance(prompts, (bytes, bytearray, Mapping)):
        batch = list(prompts)
    else:
        raise EncodingError(f"prompts must be a string or a non-empty list of strings, got {type(prompts).__name__}")
    if not batch:
        raise EncodingError("prompts must be a string or a non-empty list of strings, got an empty list")
    for i, x in enumerate(batch):
        if not isinstance(x, str):
            raise EncodingError(f"prompts must be strings; prompt {i} is {type(x).__name__}")
        try:
            x.encode("utf-8")
        except UnicodeEncodeError as e:
            raise EncodingError(f"prompt {i} is not valid Unicode text: a lone surrogate U+{ord(x[e.start]):04X} at "
                                f"position {e.start} (decode the text with errors='replace' first)") from None
    if drop is not None and (isinstance(drop, (str, bytes)) or not isinstance(drop, Iterable)):
        raise EncodingError(f"drop must be a list of booleans, got {type(drop).__name__}")
    if drop_slots is not None and not isinstance(drop_slots, Mapping):
        raise EncodingError(f"drop_slots must map slot names to lists of booleans, got {type(drop_slots).__name__}")
    for name, flags in (drop_slots or {}).items():
        if isinstance(flags, (str, bytes)) or not isinstance(flags, Iterable):
            raise EncodingError(f"drop_slots['{name}'] must be a list of booleans, got {type(flags).__name__}")
    out_dtype = _resolve_dtype(dtype)
    dev = torch.device(device) if device is not None else None
    policy = p.empty_prompt if opts.dropout_policy == "profile" else ("encode" if opts.dropout_policy == "empty" else "zeros")
    drop_all = [bool(x) for x in drop] if drop is not None else [False] * len(batch)
    if len(drop_all) != len(batch):
        raise EncodingError(f"drop has {len(drop_all)} entries for {len(batch)} prompts")
    for name, flags in (drop_slots or {}).items():
        p.slot(name)
        if len(flags) != len(batch):
            raise EncodingError(f"drop_slots['{name}'] has {len(flags)} entries for {len(batch)} prompts")
    per_slot = {
        s.name: [a or bool(b) for a, b in zip(drop_all, (drop_slots or {}).get(s.name, [False] * len(batch)), strict=True)]
        for s in p.slots
    }
    texts = ["" if d and policy == "encode" else x for x, d in zip(batch, drop_all, strict=True)]
    return _Request(texts, drop_all, per_slot, policy, opts, dev, out_dtype, negative)


def _encode_slots(
    p: AlignmentProfile,
    req: _Request,
    tokenizers: Mapping[str, PreTrainedTokenizerBase] | None,
    text_encoders: Mapping[str, torch.nn.Module] | None,
    pipeline: DiffusionPipeline | None,
) -> dict[str, SlotResult]:
    """Every slot's result, in profile order; dropped samples replaced as ``req.policy`` says."""

    def components(slot: SlotSpec) -> tuple[PreTrainedTokenizerBase, torch.nn.Module | None]:
        if pipeline is not None and (tokenizers is None or text_encoders is None):
            return _from_pipeline(pipeline, slot)
        tok = _component(tokenizers, slot, "tokenizer_subfolder", "tokenizer")
        if slot.tokenizer_only:
            return tok, None
        return tok, _component(text_encoders, slot, "encoder_subfolder", "text encoder")

    width = 0  # chunk_padding "longest": the chunkable slots share the widest layout of theirs
    if req.options.chunk_padding == "longest":
        for slot in p.slots:
            if _chunked(slot, req.options) and not slot.tokenizer_only:
                tok, enc = components(slot)
                check_components(p, slot, tok, enc, req.device)
                ids = tokenize_slot(slot, tok, req.texts, negative=req.negative, options=req.options)[0]
                width = max(width, ids.shape[1])
    results: dict[str, SlotResult] = {}
    slot_dev: torch.device | None = None
    for slot in sorted(p.slots, key=lambda s: s.tokenizer_only):  # encoded slots first: they set the device
        tok, enc = components(slot)
        if slot.tokenizer_only:
            if not callable(tok):
                raise EncodingError(f"slot '{slot.name}': the tokenizer is a {type(tok).__name__}, not a tokenizer")
            # token ids go where the encoded slots' outputs are (the pipeline's execution device)
            slot_dev = req.device or slot_dev or torch.device("cpu")
        else:
            check_components(p, slot, tok, enc, req.device)
            slot_dev = req.device or _encoder_device(enc)
        flags = req.drop_slots[slot.name]
        if slot.images is not None and req.images is not None:
            if any(flags):
                raise EncodingError(f"slot '{slot.name}': caption dropout (drop / drop_slots) with condition images is "
                                    "not supported: the edit pipelines have no dropped-caption rule for an image prompt")
            processor = _processor(slot, tokenizers, pipeline)
            results[slot.name] = encode_slot_images(slot, processor, enc, req.texts, req.images, device=slot_dev, negative=req.negative)
            continue
        if slot.tokenizer_only:
            # nothing encoded to zero: a dropped sample gets the tokens of "" (under either policy)
            texts = ["" if f else x for x, f in zip(req.texts, flags, strict=True)]
            res = encode_slot(p, slot, tok, enc, texts, device=slot_dev, negative=req.negative, options=req.options)
        else:
            res = encode_slot(
                p,
                slot,
                tok,
                enc,
                req.texts,
                device=slot_dev,
                negative=req.negative,
                options=req.options,
                chunk_width=width,
            )
            if any(flags):
                res = _apply_slot_drop(p, slot, tok, enc, res, flags, slot_dev, req)
        results[slot.name] = res
    return {s.name: results[s.name] for s in p.slots}  # profile order


def _combine(p: AlignmentProfile, results: Mapping[str, SlotResult], dtype: torch.dtype | None) -> Conditioning:
    """The profile's outputs evaluated over the slot results, typed (shared tensors, batch dims)."""
    specs = output_specs(p)
    tensors: dict[str, torch.Tensor] = {}
    for out in specs:
        value = evaluate(out.node, results)
        assert isinstance(value, torch.Tensor)
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        tensors[out.name] = value
    counts = next(iter(results.values())).token_counts if results else None
    return Conditioning(
        tensors=tensors,
        profile_name=p.name,
        fingerprint=p.fingerprint(),
        token_counts=counts,
        shared=tuple(o.name for o in specs if o.shared),
        batch_dims=tuple((o.name, o.batch_dim) for o in specs if o.batch_dim),
    )


def encode(
    profile: AlignmentProfile | str,
    prompts: str | Sequence[str],
    *,
    tokenizers: Mapping[str, PreTrainedTokenizerBase] | None = None,
    text_encoders: Mapping[str, torch.nn.Module] | None = None,
    pipeline: DiffusionPipeline | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    negative: bool = False,
    options: EncodeOptions | None = None,
    drop: Sequence[bool] | None = None,
    drop_slots: Mapping[str, Sequence[bool]] | None = None,
    requires_grad: bool = False,
    images: Any = None,
) -> Conditioning:
    """Encode prompts exactly as the profile's official pipeline does.

    ``images`` (edit profiles, a slot with ``images``): per prompt one PIL image or a list of them, as the
    user has them; each is resized as the profile's ``images`` table says and goes through the pipeline's
    processor with the prompt (looked up as ``tokenizers[images.processor_subfolder]`` or on ``pipeline``).
    Without ``images`` the prompts are encoded as text only, where the profile's pipeline can: a profile whose
    template holds the image's place (``images.prefix = ""``, Qwen-Image-Edit) needs exactly one image per prompt
    and refuses text only, as the official pipeline does; a profile that writes a prefix per image
    (Qwen-Image-Edit-2509 / 2511) encodes text only with no prefix, as its pipeline does with ``image=None``.
    A batch of several prompts with images: with ``images.prefix = ""`` it is one processor call, as
    ``encode_prompt(prompts, image=[one per prompt])``; with a per-image prefix each prompt is encoded alone (the
    pipeline runs one prompt at a time: ``__call__`` refuses ``batch_size > 1``, and its ``encode_prompt`` writes
    every image before every prompt) and the results are re-padded with zeros to the batch's longest.

    Components are looked up per slot by slot name (``clip_l``) or diffusers component name
    (``tokenizer_2`` / ``text_encoder_2``) in ``tokenizers`` / ``text_encoders``, or taken from a
    diffusers ``pipeline``. ``negative=True`` uses the profile's negative template (Lumina 2 and
    Sana encode negatives without their system prompt). ``drop`` marks prompts whose whole caption
    is dropped and ``drop_slots`` marks, per slot, samples whose encoder output is dropped; dropped
    parts become what ``options.dropout_policy`` says.
    """
    p = resolve_profile(profile)
    req = _check_request(p, prompts, options=options, dtype=dtype, device=device, drop=drop, drop_slots=drop_slots, negative=negative)
    if images is not None:
        req = dataclasses.replace(req, images=_check_images(p, images, len(req.texts)))
    else:
        _check_text_only(p)
    with torch.set_grad_enabled(requires_grad):
        results = _encode_slots(p, req, tokenizers, text_encoders, pipeline)
        return _combine(p, results, req.dtype)


def _apply_slot_drop(
    p: AlignmentProfile,
    slot: SlotSpec,
    tok: PreTrainedTokenizerBase,
    enc: torch.nn.Module,
    res: SlotResult,
    flags: list[bool],
    device: torch.device,
    req: _Request,
) -> SlotResult:
    """Replace dropped samples of one slot by zeros or by the encoded empty prompt."""
    rows = torch.tensor(flags, device=res.hidden.device)
    sel = rows.view(*([1] * _batch_dim(slot)), -1, 1, 1)
    if req.policy == "zeros":
        hidden = torch.where(sel, torch.zeros_like(res.hidden), res.hidden)
        pooled = None if res.pooled is None else torch.where(rows[:, None], torch.zeros_like(res.pooled), res.pooled)
        return SlotResult(hidden, pooled, res.mask, res.ids, res.denoiser_mask, res.token_counts)
    if flags == req.drop:
        return res  # whole captions were already replaced by "" before encoding
    empty = encode_slot(p, slot, tok, enc, [""], device=device, negative=req.negative, options=req.options)
    seq, width = res.hidden.shape[-2], slot.tokenizer.max_length
    if empty.hidden.shape[-2] != seq and _chunked(slot, req.options):
        # a chunked batch: the empty prompt gets the batch's layout, as a whole dropped caption does (the batch's
        # chunk count; with chunk_padding "longest" the last chunk cut to the batch's width)
        n = -(-seq // width)
        chunked = dataclasses.replace(
            req.options, long_prompt_chunks=n, pad_chunks=True, chunk_padding="max_length"
        )
        ids, mask = tokenize_slot(slot, tok, [""], negative=req.negative, options=chunked)
        counts = count_tokens(slot, tok, [""], negative=req.negative)
        empty = encode_slot_tokens(p, slot, enc, ids[:, :seq], mask[:, :seq], device=device, counts=counts)
    if empty.hidden.shape[-2] != seq:
        raise EncodingError(f"slot '{slot.name}': the empty prompt encodes to a different length; use dropout_policy='zeros'")
    hidden = torch.where(sel, empty.hidden.expand_as(res.hidden), res.hidden)
    pooled = None if res.pooled is None else torch.where(rows[:, None], empty.pooled.expand_as(res.pooled), res.pooled)  # type: ignore[union-attr]
    mask = torch.where(rows[:, None], empty.mask.expand_as(res.mask), res.mask)
    dmask = torch.where(rows[:, None], empty.denoiser_mask.expand_as(res.denoiser_mask), res.denoiser_mask)
    ids = torch.where(rows[:, None], empty.ids.expand_as(res.ids), res.ids)
    return SlotResult(hidden, pooled, mask, ids, dmask, res.token_counts)


def encode_uncond(profile: AlignmentProfile | str, batch_size: int = 1, **kwargs: Any) -> Conditioning:
    """What an empty prompt / dropped caption becomes under the profile's ``empty_prompt`` rule.

    ``encode``: the encoded empty prompt (negative template). ``zeros``: the embeddings are zeros
    shaped like it; masks and ids are kept (as SDXL's ``force_zeros_for_empty_prompt``).
    """
    p = resolve_profile(profile)
    kwargs.setdefault("negative", True)
    cond = encode(p, [""] * batch_size, **kwargs)
    if p.empty_prompt == "zeros":
        tensors = {o.name: torch.zeros_like(cond[o.name]) if o.kind == "embeds" else cond[o.name] for o in output_specs(p)}
        return dataclasses.replace(cond, tensors=tensors)
    return cond


def sample_dropout(
    profile: AlignmentProfile | str,
    batch_size: int,
    probabilities: Mapping[str, float],
    generator: torch.Generator | None = None,
) -> dict[str, list[bool]]:
    """Independent per-encoder dropout flags (SD3 trained with 46.4% per encoder).

    ``probabilities`` maps slot names to a probability; ``"profile"`` as the only key's value is not
    accepted, pass numbers (``profile.slot(name).train_dropout`` holds the published ones).
    """
    p = resolve_profile(profile)
    flags: dict[str, list[bool]] = {}
    for name, prob in probabilities.items():
        p.slot(name)
        if not 0.0 <= prob <= 1.0:
            raise EncodingError(f"dropout probability for slot '{name}' must be in [0, 1], got {prob}")
        draws = torch.rand(batch_size, generator=generator)
        flags[name] = [bool(x) for x in (draws < prob)]
    return flags


# ------------------------------------------------------------------- condition images (edit models)
def vl_image_size(spec: ImageSpec, width: int, height: int) -> tuple[int, int]:
    """(width, height) a condition image of ``width`` x ``height`` is resized to (``images.resize = "round_32"``:
    Qwen-Image-Edit's ``calculate_dimensions(area, width / height)``)."""
    ratio = width / height
    w = math.sqrt(spec.area * ratio)
    h = w / ratio
    return round(w / 32) * 32, round(h / 32) * 32


def prepare_image(spec: ImageSpec, image: Any) -> Any:
    """A PIL image resized as the profile's pipeline resizes a condition image before its processor."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise EncodingError(f"condition images must be PIL images, got {type(image).__name__}")
    filters = {"lanczos": Image.Resampling.LANCZOS, "bicubic": Image.Resampling.BICUBIC,
               "bilinear": Image.Resampling.BILINEAR, "nearest": Image.Resampling.NEAREST}
    return image.resize(vl_image_size(spec, *image.size), resample=filters[spec.resample])


def _check_images(p: AlignmentProfile, images: Any, n: int) -> list[list[Any]]:
    """``images`` as one list of images per prompt (a single image stands for a batch of one prompt)."""
    slots = [s for s in p.slots if s.images is not None]
    if not slots:
        raise EncodingError(f"profile '{p.name}' encodes text only: it takes no images")
    per_prompt = [images] if not isinstance(images, (list, tuple)) else list(images)
    if len(per_prompt) != n:
        raise EncodingError(f"images has {len(per_prompt)} entries for {n} prompts (one image or list of images per prompt)")
    out = [list(x) if isinstance(x, (list, tuple)) else [x] for x in per_prompt]
    if any(not x for x in out):
        raise EncodingError("every prompt needs at least one image when images are given")
    for slot in slots:
        assert slot.images is not None
        if not slot.images.prefix and any(len(x) != 1 for x in out):
            counts = sorted({len(x) for x in out if len(x) != 1})
            raise EncodingError(f"profile '{p.name}' takes exactly one condition image per prompt (its template holds "
                                f"one image's place), got {counts[0]}")
    return out


def _check_text_only(p: AlignmentProfile) -> None:
    """Refuse text only where the template itself holds an image's vision tokens (``images.prefix = ""``): the
    official pipeline's processor refuses a text with an image place and no image."""
    for slot in p.slots:
        if slot.images is not None and not slot.images.prefix:
            raise EncodingError(f"profile '{p.name}' needs one condition image per prompt (images=...): its template "
                                "holds the image's vision tokens, and the official pipeline refuses text only")


def _processor(slot: SlotSpec, tokenizers: Mapping[str, Any] | None, pipeline: DiffusionPipeline | None) -> Any:
    assert slot.images is not None
    name = slot.images.processor_subfolder
    found = (tokenizers or {}).get(name) if tokenizers is not None else None
    if found is None and pipeline is not None:
        found = getattr(pipeline, name, None)
    if found is None:
        raise EncodingError(f"slot '{slot.name}': no processor '{name}' (pass it in tokenizers or with the pipeline)")
    return found


def encode_slot_images(
    slot: SlotSpec,
    processor: Any,
    encoder: torch.nn.Module,
    prompts: Sequence[str],
    images: list[list[Any]],
    *,
    device: torch.device,
    negative: bool = False,
) -> SlotResult:
    """One slot of an edit model with condition images: ``images.prefix`` once per image before each prompt,
    the template around it, the processor over texts and resized images (no truncation, padded to the
    longest), the encoder given ``pixel_values`` and ``image_grid_thw``, then the slot's usual steps."""
    spec = slot.images
    assert spec is not None
    if spec.prefix and len(prompts) > 1:
        return _stack_results(slot, [
            encode_slot_images(slot, processor, encoder, [text], [imgs], device=device, negative=negative)
            for text, imgs in zip(prompts, images, strict=True)
        ])
    texts = [render(slot.tokenizer, "".join(spec.prefix.replace("{n}", str(k + 1)) for k in range(len(imgs))) + text,
                    negative=negative)
             for text, imgs in zip(prompts, images, strict=True)]
    flat = [prepare_image(spec, im) for imgs in images for im in imgs]
    inputs = processor(text=texts, images=flat, padding=True, return_tensors="pt")
    ids, mask = inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
    out = encoder(input_ids=ids, attention_mask=mask, pixel_values=inputs["pixel_values"].to(device),
                  image_grid_thw=inputs["image_grid_thw"].to(device), output_hidden_states=True)
    hidden = select_layer(slot, encoder, out)
    return _post_process(slot, encoder, hidden, None, ids, mask, [int(x) for x in mask.sum(dim=1)])


def _stack_results(slot: SlotSpec, parts: list[SlotResult]) -> SlotResult:
    """Results of one prompt each as one batch: every (1, L, D) re-padded with zeros (mask 0) to the longest L."""
    target = max(r.hidden.shape[1] for r in parts)

    def pad(t: torch.Tensor) -> torch.Tensor:
        extra = target - t.shape[1]
        return torch.nn.functional.pad(t, (0, 0, 0, extra) if t.dim() == 3 else (0, extra))

    hidden = torch.cat([pad(r.hidden) for r in parts])
    mask = torch.cat([pad(r.mask) for r in parts])
    return SlotResult(hidden=hidden, pooled=None, mask=mask, ids=torch.cat([pad(r.ids) for r in parts]),
                      denoiser_mask=denoiser_mask(slot, mask, hidden.dtype),
                      token_counts=[c for r in parts for c in r.token_counts])
