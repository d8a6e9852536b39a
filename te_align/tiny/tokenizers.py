"""Offline tokenizers that follow the real conventions of the diffusion text encoders.

Used by ``te-align probe``, the demo's tiny model and the test suite.

Every tokenizer here is written to a folder laid out like the Hugging Face repo it imitates
(``tokenizer_config.json``, ``special_tokens_map.json`` and either ``vocab.json``/``merges.txt`` or
``tokenizer.json``) and is then loaded with the real ``transformers`` class through
``from_pretrained(folder)``, so the load path is the one the diffusers pipelines use.

Nothing here touches the network.

* The CLIP tokenizer is the real one: its ``vocab.json``/``merges.txt`` are rebuilt from OpenAI CLIP's
  BPE file ``bpe_simple_vocab_16e6.txt.gz`` (MIT licence, see ``data/LICENSE-CLIP-BPE.txt``), which this
  package ships in ``te_align/tiny/data/`` (checked by sha256 on use), in the order the Hugging Face CLIP
  files use, so its ids equal the real CLIP ids.
* The other tokenizers (T5, UMT5, pile-T5/Llama-2, Gemma, Llama-3, Qwen2) use small vocabularies
  (at most 1,000 entries) but the real special tokens, special ids, model type (Unigram, SentencePiece
  BPE with byte fallback, byte-level BPE), pre-tokenization and post-processing templates.

Facts about the real files come from the official config snapshots the package ships
(``te_align/profiles/data/official/<org>--<name>.json``, cited below as ``official[<repo>]``) and from the ``transformers`` 5.x tokenizer classes.

transformers 5 note: there is no separate slow/fast tokenizer any more. ``CLIPTokenizerFast``,
``T5TokenizerFast``, ``LlamaTokenizerFast``, ``GemmaTokenizerFast`` and ``Qwen2TokenizerFast`` are
aliases of ``CLIPTokenizer``, ``T5Tokenizer``, ... which all subclass ``TokenizersBackend`` (the Rust
``tokenizers`` backend); ``PreTrainedTokenizerFast`` is ``TokenizersBackend`` itself. Model-specific
classes rebuild normalizer / pre-tokenizer / decoder in their ``__init__`` and take only the vocabulary,
merges and post-processor from the files; ``PreTrainedTokenizerFast`` uses ``tokenizer.json`` verbatim.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import tokenizers
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

__all__ = [
    "CLIP_BOS_ID",
    "CLIP_BPE_SHA256",
    "CLIP_EOS_ID",
    "CLIP_VOCAB_SIZE",
    "LLAMA3_SPECIAL_TOKENS",
    "QWEN2_SPECIAL_TOKENS",
    "QWEN3_ADDED_TOKENS",
    "QWEN3_CHAT_TEMPLATE_SOURCE",
    "QWEN_IMAGE_TEMPLATE",
    "QWEN_IMAGE_TEMPLATE_PREFIX_TOKENS",
    "TEKKEN_SPECIAL_TOKENS",
    "bytes_to_unicode",
    "clip_bpe_path",
    "clip_tokenizer",
    "default_cache_dir",
    "gemma_tokenizer",
    "llama3_tokenizer",
    "mistral_small_chat_template",
    "mistral_tekken_tokenizer",
    "pile_t5_tokenizer",
    "qwen2_tokenizer",
    "qwen3_chat_template",
    "qwen3_instruct_tokenizer",
    "qwen3_tokenizer",
    "t5_tokenizer",
    "umt5_tokenizer",
]

PathLike = str | os.PathLike[str]

# Bump when any recipe below changes: it is part of the default cache folder name.
_RECIPE_VERSION = "4"

CLIP_VOCAB_SIZE = 49408
CLIP_BOS_ID = 49406  # <|startoftext|>
CLIP_EOS_ID = 49407  # <|endoftext|>
_CLIP_BOS = "<|startoftext|>"
_CLIP_EOS = "<|endoftext|>"
# The CLIP merge table has 49152 - 256 - 2 = 48894 entries: lines 1..48894 of the BPE file
# (line 0 is the "#version: 0.2" header).
_CLIP_NUM_MERGES = 49152 - 256 - 2

_SPM_SPACE = "\u2581"  # "▁", the SentencePiece word-boundary marker

# Pre-tokenization regex of the Llama-3 tokenizer.json (meta-llama/Meta-Llama-3.1-8B-Instruct).
_LLAMA3_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Pre-tokenization regex of Qwen2 (single digits); transformers 5 rebuilds it in Qwen2Tokenizer.__init__.
_QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: The first eleven Llama-3.1 special tokens, in id order (real ids 128000..128010).
LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)

#: Qwen2.5-VL special tokens, in id order (real ids 151643..151656; the model config's
#: vision_start_token_id=151652, image_token_id=151655, video_token_id=151656 point into this list).
QWEN2_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

#: QwenImagePipeline.prompt_template_encode (diffusers 0.42.1). The pipeline drops the first
#: ``prompt_template_encode_start_idx = 34`` hidden states, which is the token length of the prefix
#: below with the real Qwen2.5-VL tokenizer; the small tokenizer reproduces that length.
QWEN_IMAGE_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
QWEN_IMAGE_TEMPLATE_PREFIX_TOKENS = 34

# Lumina2Pipeline.system_prompt (diffusers 0.42.1), joined to the prompt with " <Prompt Start> ".
_LUMINA2_SYSTEM_PROMPT = (
    "You are an assistant designed to generate superior images with the superior degree of image-text "
    "alignment based on textual prompts or user prompts."
)

# Words that the small vocabularies learn as whole pieces: common prompt words plus the words of the
# fixed templates the pipelines add (Qwen-Image, Lumina2).
_PROMPT_WORDS: tuple[str, ...] = tuple(
    """
    a an the of and in on with at by to for from is are this that it its as or
    photo photograph picture image painting portrait landscape illustration drawing render art style
    cat cats dog dogs bird horse fish person man woman girl boy child people face eyes hair hand
    red green blue yellow black white orange purple pink brown gray golden silver
    dark light bright colorful small large big tiny huge old young beautiful cute happy
    sitting standing running walking flying wearing holding looking
    street city forest mountain river lake sea ocean beach sky cloud clouds sun moon night day sunset
    morning water tree trees flower flowers grass house room table chair window door car road field garden
    snow rain fire smoke shadow detailed realistic cinematic high quality masterpiece best resolution
    sharp focus soft background foreground wide angle close up shot view camera lens film digital oil
    watercolor anime cartoon hello world
    """.split()
)
_TEMPLATE_WORDS: tuple[str, ...] = tuple(
    """
    system user assistant Describe describe detailing color shape size texture quantity text spatial
    relationships objects You designed generate superior images degree alignment based textual prompts
    prompt Prompt Start
    """.split()
)


# --------------------------------------------------------------------------------------------------
# cache folders
# --------------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """Folder where tokenizer files are written once and reused: ``te-align/tiny/tokenizers-<key>`` under
    the user cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``; the system temp folder when there is no
    home).

    The key is a hash of the recipe version and the ``transformers``/``tokenizers`` versions, so a changed
    recipe or library never reuses stale files.
    """
    key = f"{_RECIPE_VERSION}|{transformers.__version__}|{tokenizers.__version__}|{CLIP_BPE_SHA256}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return _user_cache_root() / "te-align" / "tiny" / f"tokenizers-{digest}"


def _user_cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg)
    try:
        return Path.home() / ".cache"
    except RuntimeError:  # no home folder can be determined
        return Path(tempfile.gettempdir())


def _root(cache_dir: PathLike | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


_DONE_MARKER = ".complete"


_BUILT: dict[Path, Path] = {}


def _materialize(name: str, root: Path, writer: Callable[[Path], None]) -> Path:
    """Write a tokenizer folder ``root/name`` once (atomically, safe across processes) and return it."""
    target = root / name
    if target in _BUILT or (target / _DONE_MARKER).is_file():
        _BUILT[target] = target
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        writer(staging)
        (staging / _DONE_MARKER).write_text("ok\n")
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first (or a stale partial folder is in the way).
            if not (target / _DONE_MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    _BUILT[target] = target
    return target


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _added_token_entry(content: str, special: bool | None = True, normalized: bool = False) -> dict[str, Any]:
    """A serialized AddedToken; ``special=None`` leaves the key out (pre-2023 files)."""
    entry: dict[str, Any] = {
        "content": content,
        "lstrip": False,
        "normalized": normalized,
        "rstrip": False,
        "single_word": False,
    }
    if special is not None:
        entry["special"] = special
    return entry


# --------------------------------------------------------------------------------------------------
# CLIP (real vocabulary)
# --------------------------------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable-character table of GPT-2/CLIP byte-level BPE.

    Printable Latin-1 bytes map to themselves (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``, 188 bytes in
    that order); the remaining 68 bytes map to ``chr(256 + k)`` in increasing byte order. The dict's
    insertion order (printable bytes first) is the order of the first 256 CLIP vocabulary entries,
    which is why ``"!"`` has id 0 and ``"!</w>"`` id 256.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


#: sha256 of OpenAI CLIP's ``bpe_simple_vocab_16e6.txt.gz`` (the file openai/CLIP and open_clip ship).
CLIP_BPE_SHA256 = "924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a"


@functools.cache
def clip_bpe_path() -> Path:
    """Path of the CLIP BPE file shipped in ``te_align/tiny/data/`` (checked against :data:`CLIP_BPE_SHA256`).

    Raises ``FileNotFoundError`` with one line when the installed package lacks it or it was changed.
    """
    from importlib import resources

    path = Path(str(resources.files("te_align.tiny").joinpath("data", "bpe_simple_vocab_16e6.txt.gz")))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: te-align's CLIP BPE file is missing from this installation; reinstall te-align")
    if hashlib.sha256(path.read_bytes()).hexdigest() != CLIP_BPE_SHA256:
        raise FileNotFoundError(f"{path}: te-align's CLIP BPE file does not match its sha256; reinstall te-align")
    return path


@functools.cache
def _clip_vocab_and_merges() -> tuple[dict[str, int], list[str]]:
    with gzip.open(clip_bpe_path(), "rt", encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    merges = lines[1 : _CLIP_NUM_MERGES + 1]
    chars = list(bytes_to_unicode().values())
    tokens = [
        *chars,
        *(c + "</w>" for c in chars),
        *("".join(m.split()) for m in merges),
        _CLIP_BOS,
        _CLIP_EOS,
    ]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != CLIP_VOCAB_SIZE or vocab[_CLIP_BOS] != CLIP_BOS_ID or vocab[_CLIP_EOS] != CLIP_EOS_ID:
        raise AssertionError("CLIP vocabulary rebuilt with an unexpected layout")
    return vocab, merges


def _legacy_added_token(content: str) -> dict[str, Any]:
    return {"__type": "AddedToken", **_added_token_entry(content, special=None, normalized=True)}


def _write_clip_files(folder: Path, pad: str, model_max_length: int, layout: str) -> None:
    vocab, merges = _clip_vocab_and_merges()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    common = {
        "add_prefix_space": False,
        "do_lower_case": True,
        "errors": "replace",
        "model_max_length": model_max_length,
        "tokenizer_class": "CLIPTokenizer",
    }
    if layout == "legacy":
        # Old-style config as in the SD1.5 / SDXL / SD2.x tokenizer folders: bos/eos/unk as serialized
        # AddedTokens, no added_tokens_decoder, and pad "<|endoftext|>" even where special_tokens_map.json
        # says "!" (official[stabilityai/stable-diffusion-2-1].tokenizer.pad_token). Without an
        # added_tokens_decoder, transformers reads special_tokens_map.json and lets it win.
        config = {
            **common,
            "bos_token": _legacy_added_token(_CLIP_BOS),
            "eos_token": _legacy_added_token(_CLIP_EOS),
            "pad_token": _CLIP_EOS,
            "unk_token": _legacy_added_token(_CLIP_EOS),
        }
        special_map: dict[str, Any] = {
            "bos_token": _added_token_entry(_CLIP_BOS, special=None, normalized=True),
            "eos_token": _added_token_entry(_CLIP_EOS, special=None, normalized=True),
            "pad_token": pad,
            "unk_token": _added_token_entry(_CLIP_EOS, special=None, normalized=True),
        }
    else:
        # Newer-style config as in the SD3.5 / FLUX tokenizer folders (official[stabilityai/
        # stable-diffusion-3.5-large].tokenizer.format): added_tokens_decoder for 49406/49407 and plain
        # strings. With an added_tokens_decoder present, transformers 5 ignores special_tokens_map.json.
        config = {
            **common,
            "added_tokens_decoder": {
                str(CLIP_BOS_ID): _added_token_entry(_CLIP_BOS, normalized=True),
                str(CLIP_EOS_ID): _added_token_entry(_CLIP_EOS, normalized=False),
            },
            "bos_token": _CLIP_BOS,
            "clean_up_tokenization_spaces": True,
            "eos_token": _CLIP_EOS,
            "pad_token": pad,
            "unk_token": _CLIP_EOS,
        }
        special_map = {
            "bos_token": _CLIP_BOS,
            "eos_token": _CLIP_EOS,
            "pad_token": pad,
            "unk_token": _CLIP_EOS,
        }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", special_map)
    if layout == "new":
        # Serialize the backend the way a converted repo ships it (tokenizer.json next to vocab/merges);
        # CLIPTokenizer still rebuilds its pipeline from the vocabulary and merges.
        loaded = transformers.CLIPTokenizer.from_pretrained(str(folder))
        loaded.backend_tokenizer.save(str(folder / "tokenizer.json"))


def clip_tokenizer(
    pad: str = _CLIP_EOS,
    fast: bool = False,
    model_max_length: int = 77,
    cache_dir: PathLike | None = None,
) -> transformers.CLIPTokenizer:
    """A real CLIP BPE tokenizer (49408 entries, ``<|startoftext|>``=49406, ``<|endoftext|>``=49407).

    Conventions (official[runwayml/stable-diffusion-v1-5 | stabilityai/stable-diffusion-xl-base-1.0]
    .tokenizer / .tokenizer_2): bos ``<|startoftext|>``, eos = unk ``<|endoftext|>``, lower-casing,
    ``model_max_length`` 77, right padding.

    * ``pad="<|endoftext|>"``: OpenAI CLIP-L (SD1.5, SDXL ``tokenizer``, SD3/FLUX ``tokenizer``).
    * ``pad="!"``: OpenCLIP ViT-H/bigG (SD2.x ``tokenizer``, SDXL/SD3 ``tokenizer_2``), from the official
      ``special_tokens_map.json``; ``"!"`` is vocabulary id 0.

    ``fast`` only picks the class name and the file layout: ``False`` loads ``transformers.CLIPTokenizer``
    from the SD1.5/SDXL/SD2.x layout (``vocab.json`` + ``merges.txt``, old-style ``tokenizer_config.json``
    whose ``pad_token`` is always ``<|endoftext|>``, the pad in ``special_tokens_map.json``, which then
    wins); ``True`` loads ``transformers.CLIPTokenizerFast`` from the newer layout (``added_tokens_decoder``,
    pad in ``tokenizer_config.json``, plus ``tokenizer.json``). In transformers 5 both names are the same
    ``TokenizersBackend`` class and both layouts give the same tokenizer.

    The files are written once into ``cache_dir`` (default: :func:`default_cache_dir`); every call
    returns a freshly loaded tokenizer, so pipelines that mutate their tokenizer do not leak state.
    """
    if pad not in (_CLIP_EOS, "!"):
        raise ValueError(f"pad must be '<|endoftext|>' or '!', got {pad!r}")
    tag = "eot" if pad == _CLIP_EOS else "bang"
    name = f"clip-pad_{tag}-len{model_max_length}-{'fast' if fast else 'slow'}"
    folder = _materialize(
        name,
        _root(cache_dir),
        functools.partial(
            _write_clip_files, pad=pad, model_max_length=model_max_length, layout="new" if fast else "legacy"
        ),
    )
    cls = transformers.CLIPTokenizerFast if fast else transformers.CLIPTokenizer
    return cls.from_pretrained(str(folder))


# --------------------------------------------------------------------------------------------------
# small vocabularies
# --------------------------------------------------------------------------------------------------


def _train_merges(word_freqs: dict[tuple[str, ...], int], max_merges: int) -> list[tuple[str, str]]:
    """Deterministic BPE training: repeatedly merge the most frequent adjacent pair.

    Ties are broken by the lexicographically smallest pair, so the result never depends on hash order.
    Stops when no pair occurs at least twice or after ``max_merges`` merges.
    """
    words = [list(w) for w in word_freqs]
    freqs = list(word_freqs.values())
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        counts: Counter[tuple[str, str]] = Counter()
        for word, freq in zip(words, freqs, strict=True):
            for pair in itertools.pairwise(word):
                counts[pair] += freq
        if not counts:
            break
        best_count = max(counts.values())
        if best_count < 2:
            break
        best = min(pair for pair, count in counts.items() if count == best_count)
        merges.append(best)
        joined = best[0] + best[1]
        for word in words:
            i = 0
            while i < len(word) - 1:
                if word[i] == best[0] and word[i + 1] == best[1]:
                    word[i : i + 2] = [joined]
                i += 1
    return merges


def _word_table(pieces: Iterable[str], weight: int) -> Counter[tuple[str, ...]]:
    table: Counter[tuple[str, ...]] = Counter()
    for piece in pieces:
        table[tuple(piece)] += weight
    return table


def _bpe_vocab(
    leading: Sequence[str],
    base_symbols: Sequence[str],
    word_freqs: dict[tuple[str, ...], int],
    trailing: Sequence[str],
    max_size: int,
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary = leading specials + base symbols + merged pieces (+ trailing specials), ≤ max_size."""
    budget = max_size - len(leading) - len(base_symbols) - len(trailing)
    merges = _train_merges(word_freqs, budget)
    tokens: list[str] = []
    for tok in [*leading, *base_symbols, *(a + b for a, b in merges), *trailing]:
        if tok not in tokens:
            tokens.append(tok)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    return vocab, merges


_ASCII_SYMBOLS: tuple[str, ...] = tuple(chr(c) for c in range(ord("!"), ord("~") + 1))
_BYTE_TOKENS: tuple[str, ...] = tuple(f"<0x{b:02X}>" for b in range(256))


def _sentences() -> list[str]:
    """Training text: every prompt word in running text, plus the fixed pipeline templates."""
    words = list(_PROMPT_WORDS)
    chunks = [" ".join(words[i : i + 8]) for i in range(0, len(words), 8)]
    return [*chunks, "a photo of a cat", "a photo of a dog", "hello world"]


def _spm_word_freqs(first_word_prefix: bool) -> dict[tuple[str, ...], int]:
    """Word table for SentencePiece-style BPE: ``▁word`` pieces (and bare ``word`` for a sentence start
    when the tokenizer adds no dummy prefix)."""
    table: Counter[tuple[str, ...]] = Counter()
    for word in (*_PROMPT_WORDS, *_TEMPLATE_WORDS):
        table += _word_table([_SPM_SPACE + word], 4)
        if not first_word_prefix:
            table += _word_table([word], 2)
    # "▁X" for every printable ASCII character, so a capitalised or unknown word starts with one piece.
    table += _word_table((_SPM_SPACE + symbol for symbol in _ASCII_SYMBOLS), 2)
    return dict(table)


def _byte_level_word_freqs(split_regex: str) -> dict[tuple[str, ...], int]:
    """Word table for byte-level BPE, pre-tokenized exactly like the runtime tokenizer."""
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    table: Counter[tuple[str, ...]] = Counter()
    template_text = (
        QWEN_IMAGE_TEMPLATE.replace("{}", "").replace("<|im_start|>", "\n").replace("<|im_end|>", "\n")
    )
    # " X" for every printable ASCII character, so a capitalised or unknown word starts with one piece.
    ascii_text = " " + " ".join(_ASCII_SYMBOLS)
    texts = [
        (template_text, 8),
        (_LUMINA2_SYSTEM_PROMPT, 2),
        (ascii_text, 2),
        *((s, 2) for s in _sentences()),
    ]
    for text, weight in texts:
        table += _word_table((piece for piece, _ in pre.pre_tokenize_str(text)), weight)
    return dict(table)


# --------------------------------------------------------------------------------------------------
# T5 / UMT5 (Unigram, SentencePiece conventions)
# --------------------------------------------------------------------------------------------------


def _unigram_pieces(words: Iterable[str], extra_symbols: Sequence[str] = ()) -> list[tuple[str, float]]:
    """Unigram pieces with SentencePiece-like log-prob scores: whole ``▁word`` pieces score better than
    any split into characters, so known words are single pieces and anything else still tokenizes."""
    pieces: list[tuple[str, float]] = [(_SPM_SPACE, -3.0)]
    seen = {_SPM_SPACE}
    for rank, word in enumerate(words):
        piece = _SPM_SPACE + word
        if piece not in seen:
            pieces.append((piece, -4.0 - rank * 0.01))
            seen.add(piece)
    for rank, symbol in enumerate((*_ASCII_SYMBOLS, *extra_symbols)):
        for piece, base in ((symbol, -8.0), (_SPM_SPACE + symbol, -9.0)):
            if piece not in seen:
                pieces.append((piece, base - rank * 0.001))
                seen.add(piece)
    return pieces


def _write_t5_like(
    folder: Path,
    *,
    pieces: list[tuple[str, float]],
    extra_ids: int,
    model_max_length: int | None,
    legacy: bool | None,
) -> None:
    # Real layout (official[black-forest-labs/FLUX.1-dev].tokenizer_2): <pad>=0, </s>=1, <unk>=2, the
    # SentencePiece pieces, then <extra_id_{extra_ids-1}> ... <extra_id_0> (so <extra_id_0> is the last id).
    extras = [f"<extra_id_{i}>" for i in range(extra_ids - 1, -1, -1)]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces, *((e, 0.0) for e in extras)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    # No precompiled NFKC charsmap (it cannot be produced without a SentencePiece model); ASCII text is
    # unaffected. Pre-tokenizer/decoder/post-processor are those of the real T5 tokenizer.json.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement=_SPM_SPACE, prepend_scheme="always"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement=_SPM_SPACE, prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"], special_tokens=[("</s>", 1)]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<pad>", "</s>", "<unk>", *extras)]
    )
    tok.save(str(folder / "tokenizer.json"))
    extra_names = [f"<extra_id_{i}>" for i in range(extra_ids)]
    decoder = {str(i): _added_token_entry(t) for i, t in enumerate(("<pad>", "</s>", "<unk>"))}
    for name in extra_names:
        decoder[str(tok.token_to_id(name))] = _added_token_entry(name)
    config: dict[str, Any] = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": extra_names,
        "clean_up_tokenization_spaces": True,
        "eos_token": "</s>",
        "extra_ids": extra_ids,
        "pad_token": "<pad>",
        "tokenizer_class": "T5Tokenizer",
        "unk_token": "<unk>",
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    if legacy is not None:
        config["legacy"] = legacy
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(
        folder / "special_tokens_map.json",
        {
            "additional_special_tokens": extra_names,
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        },
    )


def t5_tokenizer(cache_dir: PathLike | None = None) -> transformers.T5TokenizerFast:
    """Small T5 v1.1 tokenizer (``google/t5-v1_1-xxl`` conventions), loaded as ``T5TokenizerFast``.

    Conventions (official[black-forest-labs/FLUX.1-dev].tokenizer_2, [...stable-diffusion-3-medium...]
    .tokenizer_3, [PixArt-alpha/...].tokenizer; ``transformers`` ``T5Tokenizer``): ``<pad>``=0,
    ``</s>``=1, ``<unk>``=2, no BOS, ``</s>`` appended, right padding, 100 sentinels ``<extra_id_*>`` at
    the end of the vocabulary (``<extra_id_0>`` last), ``model_max_length`` 512, ``legacy`` false.
    The model is a SentencePiece-style Unigram over ``▁``-prefixed word pieces and every printable
    ASCII character, so any ASCII prompt tokenizes (unknown characters become ``<unk>``).
    Used by SD3 (``tokenizer_3``), FLUX (``tokenizer_2``), Chroma, PixArt-Sigma and HiDream.
    """
    pieces = _unigram_pieces((*_PROMPT_WORDS, *_TEMPLATE_WORDS))
    folder = _materialize(
        "t5",
        _root(cache_dir),
        functools.partial(_write_t5_like, pieces=pieces, extra_ids=100, model_max_length=512, legacy=False),
    )
    return transformers.T5TokenizerFast.from_pretrained(str(folder))


_UMT5_EXTRA_SYMBOLS: tuple[str, ...] = tuple("éèàüöäßçñ中文日本한국語")


def umt5_tokenizer(cache_dir: PathLike | None = None) -> transformers.T5TokenizerFast:
    """Small UMT5 tokenizer (``google/umt5-xxl`` conventions, used by Wan 2.1), loaded as ``T5TokenizerFast``.

    Conventions (official[Wan-AI/Wan2.1-T2V-1.3B-Diffusers].tokenizer, model_index ``T5TokenizerFast``):
    ``<pad>``=0, ``</s>``=1, ``<unk>``=2, no BOS added, ``</s>`` appended. The vocabulary adds a few
    non-ASCII characters (multilingual model). The sentinel count and ``model_max_length`` of the real
    repo were not read, so no sentinels and no ``model_max_length`` are written (the pipeline always passes
    ``max_length``).
    """
    pieces = _unigram_pieces((*_PROMPT_WORDS, *_TEMPLATE_WORDS), extra_symbols=_UMT5_EXTRA_SYMBOLS)
    folder = _materialize(
        "umt5",
        _root(cache_dir),
        functools.partial(_write_t5_like, pieces=pieces, extra_ids=0, model_max_length=None, legacy=None),
    )
    return transformers.T5TokenizerFast.from_pretrained(str(folder))


# --------------------------------------------------------------------------------------------------
# pile-T5 (AuraFlow): Llama-2 SentencePiece BPE loaded as LlamaTokenizerFast
# --------------------------------------------------------------------------------------------------


def _write_pile_t5(folder: Path) -> None:
    leading = ["<unk>", "<s>", "</s>", *_BYTE_TOKENS]
    base = [_SPM_SPACE, *_ASCII_SYMBOLS]
    vocab, merges = _bpe_vocab(leading, base, _spm_word_freqs(first_word_prefix=True), (), max_size=1000)
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPM_SPACE, prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace(_SPM_SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=["$A:0", "</s>:0"], pair=["$A:0", "</s>:0", "$B:1", "</s>:1"], special_tokens=[("</s>", 2)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "add_bos_token": False,
        "add_eos_token": True,
        "added_tokens_decoder": {
            str(i): _added_token_entry(t) for i, t in enumerate(("<unk>", "<s>", "</s>"))
        },
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 512,
        "pad_token": "<unk>",
        "padding_side": "right",
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(
        folder / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>", "unk_token": "<unk>"},
    )


def pile_t5_tokenizer(cache_dir: PathLike | None = None) -> transformers.LlamaTokenizerFast:
    """Small pile-T5 tokenizer as used by AuraFlow, loaded as ``LlamaTokenizerFast``.

    Conventions (official[fal/AuraFlow]: model_index ``LlamaTokenizerFast``; tokenizer from
    EleutherAI pile-t5 = the Llama-2 SentencePiece BPE): ``<unk>``=0, ``<s>``=1, ``</s>``=2, byte
    fallback pieces ``<0x00>``..``<0xFF>`` at 3..258, ``add_bos_token`` false, ``add_eos_token`` true,
    Metaspace with a prefix space on the first word, ``padding_side`` right (ComfyUI copy).

    Unconfirmed upstream: the pad token. The text encoder config has ``pad_token_id`` 0, so ``<unk>``
    (id 0) is used here. Note that diffusers' ``AuraFlowPipeline.__init__`` type hint says
    ``T5Tokenizer`` while the official ``model_index.json`` loads ``LlamaTokenizerFast``; the official
    class is used here.
    """
    folder = _materialize("pile-t5", _root(cache_dir), _write_pile_t5)
    return transformers.LlamaTokenizerFast.from_pretrained(str(folder))


# --------------------------------------------------------------------------------------------------
# Gemma (Lumina2, Sana)
# --------------------------------------------------------------------------------------------------


def _write_gemma(folder: Path, padding_side: str) -> None:
    leading = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<mask>",
        "<start_of_turn>",
        "<end_of_turn>",
        *_BYTE_TOKENS,
    ]
    base = [_SPM_SPACE, *_ASCII_SYMBOLS]
    vocab, merges = _bpe_vocab(leading, base, _spm_word_freqs(first_word_prefix=False), (), max_size=1000)
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    tok.normalizer = normalizers.Replace(" ", _SPM_SPACE)
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence(
        [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=["<bos>:0", "$A:0"], pair=["<bos>:0", "$A:0", "<bos>:1", "$B:1"], special_tokens=[("<bos>", 2)]
    )
    specials = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {str(vocab[t]): _added_token_entry(t) for t in specials},
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
        "bos_token": "<bos>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<eos>",
        "model_max_length": 8192,
        "pad_token": "<pad>",
        "padding_side": padding_side,
        "tokenizer_class": "GemmaTokenizer",
        "unk_token": "<unk>",
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(
        folder / "special_tokens_map.json",
        {
            "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        },
    )


def gemma_tokenizer(
    padding_side: str = "right", cache_dir: PathLike | None = None
) -> transformers.GemmaTokenizerFast:
    """Small Gemma-2 tokenizer, loaded as ``GemmaTokenizerFast``.

    Conventions (official[Alpha-VLLM/Lumina-Image-2.0 | Efficient-Large-Model/Sana_1600M_1024px_diffusers]
    .tokenizer; text encoder config bos 2 / eos 1 / pad 0): ``<pad>``=0, ``<eos>``=1, ``<bos>``=2,
    ``<unk>``=3, ``<mask>``=4, ``add_bos_token`` true (``<bos>`` prepended), ``add_eos_token`` false, no
    dummy prefix (spaces become ``▁`` by the normalizer, no pre-tokenizer), SentencePiece BPE with byte
    fallback ``<0x00>``..``<0xFF>``. ``<start_of_turn>``/``<end_of_turn>`` exist but at ids 5/6 (real: 106/107).

    ``padding_side``: Sana's converted tokenizer says ``right``; the Lumina-Image-2.0 value was not
    read. Both pipelines force ``right`` themselves, so passing ``"left"`` checks that forcing.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(padding_side)
    folder = _materialize(
        f"gemma-{padding_side}", _root(cache_dir), functools.partial(_write_gemma, padding_side=padding_side)
    )
    return transformers.GemmaTokenizerFast.from_pretrained(str(folder))


# --------------------------------------------------------------------------------------------------
# byte-level BPE: Llama-3 (HiDream) and Qwen2 (Qwen-Image)
# --------------------------------------------------------------------------------------------------


def _byte_level_tokenizer(
    split_regex: str, specials: Sequence[str], max_size: int
) -> tuple[Tokenizer, dict[str, int], list[tuple[str, str]]]:
    base = list(bytes_to_unicode().values())
    vocab, merges = _bpe_vocab((), base, _byte_level_word_freqs(split_regex), specials, max_size=max_size)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok, vocab, merges


def _write_llama3(folder: Path) -> None:
    tok, vocab, _ = _byte_level_tokenizer(_LLAMA3_SPLIT_REGEX, LLAMA3_SPECIAL_TOKENS, max_size=1000)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single=[f"{bos}:0", "$A:0"],
                pair=[f"{bos}:0", "$A:0", f"{bos}:1", "$B:1"],
                special_tokens=[(bos, vocab[bos])],
            ),
        ]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "added_tokens_decoder": {str(vocab[t]): _added_token_entry(t) for t in LLAMA3_SPECIAL_TOKENS},
        "bos_token": bos,
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", {"bos_token": bos, "eos_token": "<|eot_id|>"})


def llama3_tokenizer(cache_dir: PathLike | None = None) -> transformers.PreTrainedTokenizerFast:
    """Small Llama-3.1-Instruct tokenizer (HiDream ``tokenizer_4``), loaded as ``PreTrainedTokenizerFast``.

    Conventions (official[HiDream-ai/HiDream-I1-Full].tokenizer_4/.text_encoder_4; Llama-3.1-8B-Instruct
    files): byte-level BPE with the Llama-3 split regex, ``<|begin_of_text|>`` prepended by the
    ``tokenizer.json`` post-processor, eos ``<|eot_id|>``, no pad token (``HiDreamImagePipeline.__init__``
    sets ``pad_token = eos_token``), right padding, ``model_max_length`` 131072. The eleven
    :data:`LLAMA3_SPECIAL_TOKENS` follow the merged pieces in the real order (real ids 128000..128010).
    ``PreTrainedTokenizerFast`` is ``TokenizersBackend`` in transformers 5 and uses ``tokenizer.json``
    verbatim.
    """
    folder = _materialize("llama3", _root(cache_dir), _write_llama3)
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))


def _write_qwen2(folder: Path, eos: str = "<|im_end|>") -> None:
    tok, vocab, merges = _byte_level_tokenizer(_QWEN2_SPLIT_REGEX, QWEN2_SPECIAL_TOKENS, max_size=1000)
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.save(str(folder / "tokenizer.json"))
    base_vocab = {t: i for t, i in vocab.items() if t not in QWEN2_SPECIAL_TOKENS}
    (folder / "vocab.json").write_text(json.dumps(base_vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n", encoding="utf-8"
    )
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(vocab[t]): _added_token_entry(t) for t in QWEN2_SPECIAL_TOKENS},
        "additional_special_tokens": list(QWEN2_SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(
        folder / "special_tokens_map.json",
        {
            "additional_special_tokens": list(QWEN2_SPECIAL_TOKENS[1:]),
            "eos_token": eos,
            "pad_token": "<|endoftext|>",
        },
    )


def qwen2_tokenizer(cache_dir: PathLike | None = None) -> transformers.Qwen2TokenizerFast:
    """Small Qwen2.5-VL tokenizer (Qwen-Image ``tokenizer``), loaded as ``Qwen2TokenizerFast``.

    Conventions (official[Qwen/Qwen-Image].tokenizer: ``Qwen2Tokenizer``, bos/unk null, eos
    ``<|im_end|>``, pad ``<|endoftext|>``, ``add_prefix_space`` false, ``split_special_tokens`` false,
    ``model_max_length`` 131072): byte-level BPE with the Qwen2 split regex and NFC, nothing added
    around the text (no BOS/EOS), right padding. :data:`QWEN2_SPECIAL_TOKENS` follow the merged pieces
    in the real order, so the chat-template markers are single tokens. The prefix of
    :data:`QWEN_IMAGE_TEMPLATE` is exactly :data:`QWEN_IMAGE_TEMPLATE_PREFIX_TOKENS` (34) tokens, as
    with the real tokenizer, so ``prompt_template_encode_start_idx`` drops exactly the template.
    """
    folder = _materialize("qwen2", _root(cache_dir), _write_qwen2)
    return transformers.Qwen2TokenizerFast.from_pretrained(str(folder))


def qwen3_tokenizer(cache_dir: PathLike | None = None) -> transformers.Qwen2TokenizerFast:
    """Small Qwen3-0.6B-Base tokenizer (Anima's ``tokenizer``), loaded as ``Qwen2TokenizerFast``.

    The :func:`qwen2_tokenizer` recipe with the Qwen3 base conventions of kohya-ss/sd-scripts@48d368f
    ``configs/qwen3_06b/tokenizer_config.json`` (the Qwen3-0.6B tokenizer files sd-scripts bundles for
    Anima): eos and pad both ``<|endoftext|>``, no BOS, ``add_bos_token`` false, nothing added around
    the text (an empty prompt has no tokens at all), right padding.
    """
    folder = _materialize("qwen3", _root(cache_dir), functools.partial(_write_qwen2, eos="<|endoftext|>"))
    return transformers.Qwen2TokenizerFast.from_pretrained(str(folder))


#: Qwen3's added tokens after :data:`QWEN2_SPECIAL_TOKENS`, in id order (real ids 151657..151668), each with its
#: ``special`` flag as in the Qwen3 tokenizer_config.json (kohya-ss/sd-scripts@48d368f configs/qwen3_06b): only the
#: Qwen2 markers are special; ``<think>``/``</think>`` are ordinary added tokens, matched whole.
QWEN3_ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

#: Where ``data/qwen3_chat_template.jinja`` was copied from, verbatim: the ``chat_template`` of the Qwen3
#: tokenizer_config.json that kohya-ss/sd-scripts bundles (Apache-2.0, as the Qwen3 release).
QWEN3_CHAT_TEMPLATE_SOURCE = "kohya-ss/sd-scripts@48d368fa557731ad0488c07304dfeba8c07910eb configs/qwen3_06b/tokenizer_config.json chat_template"
#: None of the Qwen3 additions is special in that file (its added_tokens_decoder: "special": false).
_QWEN3_SPECIAL_FLAGS = {t: False for t in QWEN3_ADDED_TOKENS}


def qwen3_chat_template() -> str:
    """The real Qwen3 Jinja chat template (:data:`QWEN3_CHAT_TEMPLATE_SOURCE`), with its ``enable_thinking`` switch."""
    return (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text(encoding="utf-8")


def _write_qwen3_instruct(folder: Path) -> None:
    _write_qwen2(folder, eos="<|im_end|>")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=_QWEN3_SPECIAL_FLAGS[t], normalized=False) for t in QWEN3_ADDED_TOKENS])
    tok.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    for t in QWEN3_ADDED_TOKENS:
        config["added_tokens_decoder"][str(tok.token_to_id(t))] = _added_token_entry(t, special=_QWEN3_SPECIAL_FLAGS[t])
    config["add_bos_token"] = False
    config["chat_template"] = qwen3_chat_template()
    _write_json(folder / "tokenizer_config.json", config)


def qwen3_instruct_tokenizer(cache_dir: PathLike | None = None) -> transformers.Qwen2TokenizerFast:
    """Small Qwen3-4B / Qwen3-8B (instruct) tokenizer, loaded as ``Qwen2TokenizerFast``: the text encoder of
    FLUX.2 klein (``Flux2KleinPipeline``) and Z-Image (``ZImagePipeline``).

    The :func:`qwen2_tokenizer` recipe with the Qwen3 instruct conventions: eos ``<|im_end|>``, pad
    ``<|endoftext|>``, no BOS (``add_bos_token`` false), nothing added around the text, right padding, the
    :data:`QWEN3_ADDED_TOKENS` after the Qwen2 markers (``<think>``/``</think>`` matched whole, not special) and
    the real Qwen3 chat template (:func:`qwen3_chat_template`), so ``apply_chat_template(...,
    enable_thinking=...)`` renders as the real tokenizer does. eos/pad follow musubi-tuner@30c658c
    src/musubi_tuner/zimage/zimage_utils.py's Qwen3-4B/8B configs (eos_token_id 151645 = ``<|im_end|>``); the
    Qwen3-4B/8B tokenizer_config.json files themselves were not read.
    """
    folder = _materialize("qwen3-instruct", _root(cache_dir), _write_qwen3_instruct)
    return transformers.Qwen2TokenizerFast.from_pretrained(str(folder))


# --------------------------------------------------------------------------------------------------
# Mistral tekken (byte-level BPE): Mistral-Small-3.1 (FLUX.2 [dev])
# --------------------------------------------------------------------------------------------------

#: The named control tokens at the head of a tekken vocabulary, at their real ids 0..19 (Mistral's tekken
#: convention; the Mistral-Small-3.1 config's image_token_index 10 is ``[IMG]``, kohya-ss/musubi-tuner@30c658c
#: src/musubi_tuner/flux_2/flux2_utils.py:531). The real vocabulary reserves ids up to 999 for control tokens; the tiny
#: one keeps these 20 and starts the byte symbols at 20.
TEKKEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
# Pre-tokenization regex of tekken (cased words, single digits) as in Mistral's HF tokenizer.json conversions.
_TEKKEN_SPLIT_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def mistral_small_chat_template() -> str:
    """The Mistral-Small-3.1-24B-Instruct-2503 chat template (Jinja), from
    ``te_align/tiny/data/mistral_small_chat_template.json`` (mistralai/Mistral-Small-3.1-24B-Instruct-2503's template
    as vendored verbatim in ggml-org/llama.cpp@9190da2 models/templates/, its source noted there). FLUX.2 [dev]'s
    processor is that repo's (huggingface/diffusers@58eb52c scripts/convert_flux2_to_diffusers.py:510,517)."""
    path = Path(__file__).parent / "data" / "mistral_small_chat_template.json"
    return str(json.loads(path.read_text(encoding="utf-8"))["chat_template"])


def _write_mistral_tekken(folder: Path) -> None:
    base = list(bytes_to_unicode().values())
    freqs = _byte_level_word_freqs(_TEKKEN_SPLIT_REGEX)
    vocab, merges = _bpe_vocab(TEKKEN_SPECIAL_TOKENS, base, freqs, (), max_size=1000)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_TEKKEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TEKKEN_SPECIAL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single=["<s>:0", "$A:0"], pair=["<s>:0", "$A:0", "$B:1"], special_tokens=[("<s>", vocab["<s>"])]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "added_tokens_decoder": {str(vocab[t]): _added_token_entry(t) for t in TEKKEN_SPECIAL_TOKENS},
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": mistral_small_chat_template(),
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(
        folder / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
    )


def mistral_tekken_tokenizer(cache_dir: PathLike | None = None) -> transformers.PreTrainedTokenizerFast:
    """Small Mistral-Small-3.1 tekken tokenizer (FLUX.2 [dev]'s ``Flux2Pipeline``): byte-level BPE with the tekken
    pre-tokenization, the :data:`TEKKEN_SPECIAL_TOKENS` at their real ids (``<s>`` 1, ``</s>`` 2, ``[INST]`` 3,
    ``[/INST]`` 4, ``[IMG]`` 10, ``<pad>`` 11, ``[SYSTEM_PROMPT]`` 17, ``[/SYSTEM_PROMPT]`` 18), ``<s>`` added in
    front by the post-processor, pad ``<pad>``, right padding (the transformers default: the real tokenizer_config's
    padding side was not read) and the real chat template :func:`mistral_small_chat_template`."""
    folder = _materialize("mistral-tekken", _root(cache_dir), _write_mistral_tekken)
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
def qwen3_vl_chat_template() -> str:
    """The Qwen3-VL(-Instruct) chat template (Jinja), from ``te_align/tiny/data/qwen3_vl_chat_template.json``
    (Qwen/Qwen3-VL-4B-Instruct ``chat_template.json`` as vendored in sophgo/LLM-TPU@2097a5a, its source noted there)."""
    path = Path(__file__).parent / "data" / "qwen3_vl_chat_template.json"
    return str(json.loads(path.read_text(encoding="utf-8"))["chat_template"])


def qwen3_vl_tokenizer(cache_dir: PathLike | None = None) -> transformers.Qwen2TokenizerFast:
    """Small Qwen3-VL tokenizer (Ideogram 4's ``tokenizer``): the :func:`qwen2_tokenizer` recipe (Qwen3-VL keeps
    Qwen2.5-VL's ``Qwen2Tokenizer`` conventions: eos ``<|im_end|>``, pad ``<|endoftext|>``, no BOS) with the
    Qwen3-VL chat template (:func:`qwen3_vl_chat_template`), so ``apply_chat_template`` renders as the real one."""
    tokenizer = qwen2_tokenizer(cache_dir=cache_dir)
    tokenizer.chat_template = qwen3_vl_chat_template()
    return tokenizer
