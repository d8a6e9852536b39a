"""Checks of the offline tiny world (te_align.tiny): tokenizer conventions, tiny encoders, pipelines."""

from __future__ import annotations

import inspect
import itertools
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import regex
import torch
import transformers

from te_align.tiny import encoders as enc
from te_align.tiny import pipelines as pipes
from te_align.tiny import tokenizers as toks

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "a photo of a cat"

# Ids of the real OpenAI CLIP tokenizer (openai/clip-vit-large-patch14), well known from the CLIP papers,
# READMEs and countless notebooks.
KNOWN_CLIP_IDS = {
    "a photo of a cat": [49406, 320, 1125, 539, 320, 2368, 49407],
    "a photo of a dog": [49406, 320, 1125, 539, 320, 1929, 49407],
    "hello world": [49406, 3306, 1002, 49407],
    "": [49406, 49407],
}

# Free-form prompts that must tokenize without error everywhere.
ODD_PROMPTS = [
    PROMPT,
    "An astronaut riding a horse on the moon, 4k, highly detailed!!",
    "(masterpiece:1.2), best_quality, 1girl, looking at viewer; {blue|red} [sky] ~ #42 @home",
    "don't   stop\tbelievin'\n— café naïve 東京",
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("te-align-tokenizers")


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # The models are tiny: one intra-op thread is faster, and much faster on a busy machine, where
    # OpenMP barriers between two threads cost ~30 ms per matmul. Restored after this module.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------------------
# CLIP
# --------------------------------------------------------------------------------------------------


def _reference_clip_ids(folder: Path, text: str) -> list[int]:
    """Independent OpenAI-CLIP BPE (rank-ordered merges over byte-level symbols) for ASCII text."""
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2"
    ranks = {tuple(line.split()): i for i, line in enumerate(lines[1:])}
    byte_chars = toks.bytes_to_unicode()
    ids = [vocab["<|startoftext|>"]]
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
    for word in regex.findall(pattern, " ".join(text.lower().split())):
        symbols = [byte_chars[b] for b in word.encode("utf-8")]
        symbols[-1] += "</w>"
        while len(symbols) > 1:
            best = min(itertools.pairwise(symbols), key=lambda p: ranks.get(p, math.inf))
            if best not in ranks:
                break
            merged: list[str] = []
            i = 0
            while i < len(symbols):
                if i < len(symbols) - 1 and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids.extend(vocab[s] for s in symbols)
    return [*ids, vocab["<|endoftext|>"]]


def test_bytes_to_unicode_layout() -> None:
    table = toks.bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    chars = list(table.values())
    assert chars[0] == "!" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


@pytest.mark.parametrize("fast", [False, True])
def test_clip_tokenizer_known_ids(cache_dir: Path, fast: bool) -> None:
    tokenizer = toks.clip_tokenizer(fast=fast, cache_dir=cache_dir)
    assert isinstance(tokenizer, transformers.CLIPTokenizer)
    assert len(tokenizer) == toks.CLIP_VOCAB_SIZE == 49408
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (49406, 49407)
    assert tokenizer.unk_token == tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.model_max_length == 77 and tokenizer.padding_side == "right"
    for text, ids in KNOWN_CLIP_IDS.items():
        assert tokenizer(text).input_ids == ids, text
    # lower-casing and whitespace folding
    assert tokenizer("A  Photo OF a CAT").input_ids == KNOWN_CLIP_IDS[PROMPT]
    assert "open_clip" not in sys.modules


def test_clip_bpe_ships_with_te_align_and_needs_no_open_clip(tmp_path: Path) -> None:
    """``pip install te-align`` alone builds the real CLIP tokenizer: the BPE file is package data, checked by
    sha256, and open_clip is never looked up (here it cannot even be imported)."""
    import hashlib

    import te_align

    path = toks.clip_bpe_path()
    assert path.parent == Path(te_align.__file__).parent / "tiny" / "data"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == toks.CLIP_BPE_SHA256
    assert (path.parent / "LICENSE-CLIP-BPE.txt").read_text(encoding="utf-8").count("Copyright (c) 2021 OpenAI") == 1
    code = (
        "import sys; sys.modules['open_clip'] = None\n"
        "from te_align.tiny.tokenizers import clip_tokenizer\n"
        f"print(clip_tokenizer(cache_dir={str(tmp_path / 'tok')!r})('a photo of a cat').input_ids)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == str(KNOWN_CLIP_IDS[PROMPT])


def test_clip_bpe_file_changed_is_one_line(tmp_path: Path) -> None:
    code = (
        "import hashlib, pathlib, sys\n"
        "import te_align.tiny.tokenizers as toks\n"
        "toks.CLIP_BPE_SHA256 = '0' * 64\n"
        "try:\n"
        "    toks.clip_bpe_path()\n"
        "except FileNotFoundError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = out.stdout.strip()
    assert "\n" not in line and line.endswith("bpe_simple_vocab_16e6.txt.gz: te-align's CLIP BPE file does not match its sha256; reinstall te-align")


def test_clip_tokenizer_matches_reference_bpe(cache_dir: Path) -> None:
    tokenizer = toks.clip_tokenizer(cache_dir=cache_dir)
    folder = Path(tokenizer.name_or_path)
    for text in [*ODD_PROMPTS[:3], "hello!! world!", "it's a DSLR photo, 85mm f/1.8 - bokeh"]:
        assert tokenizer(text).input_ids == _reference_clip_ids(folder, text), text


def test_clip_slow_and_fast_layouts_agree(cache_dir: Path) -> None:
    # transformers 5 has one tokenizer class per model; the "Fast" names are aliases.
    assert transformers.CLIPTokenizerFast is transformers.CLIPTokenizer
    for pad in ("<|endoftext|>", "!"):
        slow = toks.clip_tokenizer(pad=pad, fast=False, cache_dir=cache_dir)
        fast = toks.clip_tokenizer(pad=pad, fast=True, cache_dir=cache_dir)
        assert (Path(fast.name_or_path) / "tokenizer.json").is_file()
        assert not (Path(slow.name_or_path) / "tokenizer.json").exists()
        assert slow.pad_token == fast.pad_token == pad
        for text in ODD_PROMPTS:
            kwargs: dict[str, Any] = {"padding": "max_length", "max_length": 77, "truncation": True}
            assert slow(text, **kwargs).input_ids == fast(text, **kwargs).input_ids


def test_special_tokens_map_only_read_for_legacy_configs(cache_dir: Path, tmp_path: Path) -> None:
    # transformers 5 reads special_tokens_map.json only when tokenizer_config.json has no
    # added_tokens_decoder; then the map wins over the config (the legacy layout's config says
    # pad "<|endoftext|>", its map says "!"). With an added_tokens_decoder the map is ignored.
    legacy = Path(toks.clip_tokenizer(pad="!", fast=False, cache_dir=cache_dir).name_or_path)
    assert json.loads((legacy / "tokenizer_config.json").read_text())["pad_token"] == "<|endoftext|>"
    new = Path(toks.clip_tokenizer(pad="!", fast=True, cache_dir=cache_dir).name_or_path)
    copy = tmp_path / "clip"
    copy.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (copy / name).write_bytes((new / name).read_bytes())
    (copy / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))
    assert transformers.CLIPTokenizer.from_pretrained(str(copy)).pad_token == "!"


def test_clip_pad_conventions(cache_dir: Path) -> None:
    eot = toks.clip_tokenizer(pad="<|endoftext|>", cache_dir=cache_dir)
    bang = toks.clip_tokenizer(pad="!", cache_dir=cache_dir)
    assert (eot.pad_token, eot.pad_token_id) == ("<|endoftext|>", 49407)
    assert (bang.pad_token, bang.pad_token_id) == ("!", 0)
    padded = {
        name: t("a cat", padding="max_length", max_length=8) for name, t in [("eot", eot), ("bang", bang)]
    }
    assert padded["eot"].input_ids == [49406, 320, 2368, 49407, 49407, 49407, 49407, 49407]
    assert padded["bang"].input_ids == [49406, 320, 2368, 49407, 0, 0, 0, 0]
    assert padded["eot"].attention_mask == padded["bang"].attention_mask == [1, 1, 1, 1, 0, 0, 0, 0]
    # True behaviour: a pad token is registered as a special added token, so with pad "!" every "!" in
    # the text is split off and encoded as id 0, while the "<|endoftext|>"-padded tokenizer uses the
    # normal BPE pieces ("!</w>" = 256, "!!</w>" = 748).
    assert eot("!").input_ids == [49406, 256, 49407]
    assert bang("!").input_ids == [49406, 0, 49407]
    assert eot("hello!! world!").input_ids == [49406, 3306, 748, 1002, 256, 49407]
    assert bang("hello!! world!").input_ids == [49406, 3306, 0, 0, 1002, 0, 49407]


def test_clip_truncation_keeps_eos(cache_dir: Path) -> None:
    tokenizer = toks.clip_tokenizer(cache_dir=cache_dir, model_max_length=77)
    ids = tokenizer(" ".join(["cat"] * 200), padding="max_length", truncation=True, max_length=77).input_ids
    assert len(ids) == 77 and ids[0] == 49406 and ids[-1] == 49407 and set(ids[1:-1]) == {2368}
    long = toks.clip_tokenizer(cache_dir=cache_dir, model_max_length=128)
    assert long.model_max_length == 128


def test_tokenizer_cache_reuses_files(cache_dir: Path) -> None:
    first = toks.t5_tokenizer(cache_dir=cache_dir)
    folder = Path(first.name_or_path)
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    second = toks.t5_tokenizer(cache_dir=cache_dir)
    assert second is not first and Path(second.name_or_path) == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp
    assert folder.parent == cache_dir
    default = toks.default_cache_dir()
    assert default.parent.parts[-2:] == ("te-align", "tiny") and default.name.startswith("tokenizers-")


def test_default_cache_dir_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert toks.default_cache_dir().parent == tmp_path / "te-align" / "tiny"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert toks.default_cache_dir().parent == Path.home() / ".cache" / "te-align" / "tiny"


# --------------------------------------------------------------------------------------------------
# small tokenizers
# --------------------------------------------------------------------------------------------------


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text).input_ids)


@pytest.mark.parametrize(
    "factory",
    [toks.t5_tokenizer, toks.umt5_tokenizer, toks.pile_t5_tokenizer, toks.gemma_tokenizer,
     toks.llama3_tokenizer, toks.qwen2_tokenizer],
)  # fmt: skip
def test_small_tokenizers_are_small_and_total(cache_dir: Path, factory: Callable[..., Any]) -> None:
    tokenizer = factory(cache_dir=cache_dir)
    assert len(tokenizer) <= 1000
    for text in ODD_PROMPTS:
        ids = _ids(tokenizer, text)
        assert ids and all(0 <= i < len(tokenizer) for i in ids)
    # whole prompt words are single pieces
    words = [t for t in tokenizer.convert_ids_to_tokens(_ids(tokenizer, PROMPT)) if not t.startswith("<")]
    assert [w.lstrip("▁Ġ") for w in words] == PROMPT.split()


def test_t5_conventions(cache_dir: Path) -> None:
    t5 = toks.t5_tokenizer(cache_dir=cache_dir)
    assert (
        isinstance(t5, transformers.T5TokenizerFast)
        and transformers.T5TokenizerFast is transformers.T5Tokenizer
    )
    assert (t5.pad_token_id, t5.eos_token_id, t5.unk_token_id, t5.bos_token) == (0, 1, 2, None)
    assert t5.model_max_length == 512 and t5.padding_side == "right"
    ids = _ids(t5, PROMPT)
    assert ids[-1] == 1 and 1 not in ids[:-1] and ids[0] not in (0, 1, 2)
    assert t5.convert_ids_to_tokens(ids) == ["▁a", "▁photo", "▁of", "▁a", "▁cat", "</s>"]
    assert t5.convert_tokens_to_ids("<extra_id_0>") == len(t5) - 1
    assert t5.convert_tokens_to_ids("<extra_id_99>") == len(t5) - 100
    batch = t5([PROMPT, "a cat"], padding="max_length", max_length=10)
    assert batch.input_ids[1] == [*_ids(t5, "a cat"), 0, 0, 0, 0, 0, 0, 0]
    assert batch.attention_mask[1] == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert _ids(t5, "") == [1]
    assert t5.decode(ids, skip_special_tokens=True) == PROMPT


def test_umt5_conventions(cache_dir: Path) -> None:
    umt5 = toks.umt5_tokenizer(cache_dir=cache_dir)
    assert isinstance(umt5, transformers.T5TokenizerFast)
    assert (umt5.pad_token_id, umt5.eos_token_id, umt5.unk_token_id, umt5.bos_token) == (0, 1, 2, None)
    ids = _ids(umt5, "café 日本語")
    assert ids[-1] == 1 and umt5.unk_token_id not in ids


def test_pile_t5_conventions(cache_dir: Path) -> None:
    pile = toks.pile_t5_tokenizer(cache_dir=cache_dir)
    assert isinstance(pile, transformers.LlamaTokenizerFast)
    assert (pile.unk_token_id, pile.bos_token_id, pile.eos_token_id, pile.pad_token_id) == (0, 1, 2, 0)
    assert pile.padding_side == "right" and pile.model_max_length == 512
    ids = _ids(pile, PROMPT)
    assert ids[-1] == 2 and ids[0] != 1
    assert pile.convert_ids_to_tokens(ids)[:2] == ["▁a", "▁photo"]
    # byte fallback instead of <unk>
    assert pile.convert_ids_to_tokens(_ids(pile, "é")) == ["▁", "<0xC3>", "<0xA9>", "</s>"]
    assert pile("a cat", padding="max_length", max_length=6).input_ids[-2:] == [0, 0]


@pytest.mark.parametrize("side", ["left", "right"])
def test_gemma_conventions(cache_dir: Path, side: str) -> None:
    gemma = toks.gemma_tokenizer(padding_side=side, cache_dir=cache_dir)
    assert isinstance(gemma, transformers.GemmaTokenizerFast)
    assert (gemma.pad_token_id, gemma.eos_token_id, gemma.bos_token_id, gemma.unk_token_id) == (0, 1, 2, 3)
    assert gemma.padding_side == side
    ids = _ids(gemma, PROMPT)
    assert ids[0] == 2 and 1 not in ids
    assert gemma.convert_ids_to_tokens(ids)[:3] == ["<bos>", "a", "▁photo"]  # no dummy prefix
    assert gemma.convert_ids_to_tokens(_ids(gemma, "東"))[1:] == ["<0xE6>", "<0x9D>", "<0xB1>"]
    padded = gemma("a cat", padding="max_length", max_length=6).input_ids
    assert padded == (
        [0, 0, 0, *_ids(gemma, "a cat")] if side == "left" else [*_ids(gemma, "a cat"), 0, 0, 0]
    )


def test_llama3_conventions(cache_dir: Path) -> None:
    llama = toks.llama3_tokenizer(cache_dir=cache_dir)
    # PreTrainedTokenizerFast is the generic TokenizersBackend in transformers 5.
    assert type(llama) is transformers.PreTrainedTokenizerFast
    assert (
        llama.bos_token == "<|begin_of_text|>" and llama.eos_token == "<|eot_id|>" and llama.pad_token is None
    )
    special_ids = [llama.convert_tokens_to_ids(t) for t in toks.LLAMA3_SPECIAL_TOKENS]
    assert special_ids == list(range(len(llama) - len(special_ids), len(llama)))
    ids = _ids(llama, PROMPT)
    assert ids[0] == llama.bos_token_id and llama.eos_token_id not in ids
    assert _ids(llama, "<|start_header_id|>user<|end_header_id|>")[1] == special_ids[6]
    for text in ODD_PROMPTS:
        assert llama.decode(_ids(llama, text), skip_special_tokens=True) == text


def test_qwen2_conventions(cache_dir: Path) -> None:
    qwen = toks.qwen2_tokenizer(cache_dir=cache_dir)
    assert isinstance(qwen, transformers.Qwen2TokenizerFast)
    assert qwen.bos_token is None and qwen.eos_token == "<|im_end|>" and qwen.pad_token == "<|endoftext|>"
    special_ids = [qwen.convert_tokens_to_ids(t) for t in toks.QWEN2_SPECIAL_TOKENS]
    assert special_ids == list(range(len(qwen) - len(special_ids), len(qwen)))
    ids = _ids(qwen, PROMPT)
    assert len(ids) == 5 and not set(ids) & set(special_ids)
    chat = _ids(qwen, "<|im_start|>user\nhi<|im_end|>")
    assert chat[0] == special_ids[1] and chat[-1] == special_ids[2]
    prefix = toks.QWEN_IMAGE_TEMPLATE.split("{}")[0]
    assert len(_ids(qwen, prefix)) == toks.QWEN_IMAGE_TEMPLATE_PREFIX_TOKENS == 34
    for text in ODD_PROMPTS:
        assert qwen.decode(_ids(qwen, text)) == text


# --------------------------------------------------------------------------------------------------
# encoders and pipelines
# --------------------------------------------------------------------------------------------------


def test_encoder_factories_are_deterministic() -> None:
    state = torch.random.get_rng_state()
    a, b = enc.clip_text_model_with_projection("G"), enc.clip_text_model_with_projection("G")
    assert torch.equal(torch.random.get_rng_state(), state)  # callers' RNG untouched
    assert not a.training and a.dtype == torch.float32
    assert a.config.eos_token_id == 2 and a.config.max_position_embeddings == 77
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(p, q), name
    t5a, t5b = enc.t5_encoder_model(512), enc.t5_encoder_model(512)
    assert all(torch.equal(p, q) for p, q in zip(t5a.parameters(), t5b.parameters(), strict=True))


# Expected shapes of encode_prompt(PROMPT) per family (batch 1, CFG on where the pipeline has it).
L, H, G = (enc.CLIP_VARIANTS[v]["hidden_size"] for v in "LHG")
PL, PG = enc.CLIP_VARIANTS["L"]["projection_dim"], enc.CLIP_VARIANTS["G"]["projection_dim"]
T5 = enc.T5_D_MODEL
EXPECTED_SHAPES: dict[str, tuple[Any, ...]] = {
    "sd15": ((1, 77, L), (1, 77, L)),
    "sd21": ((1, 77, H), (1, 77, H)),
    "sdxl": ((1, 77, L + G), (1, 77, L + G), (1, PG), (1, PG)),
    "sd3": ((1, 77 + 256, T5), (1, 77 + 256, T5), (1, PL + PG), (1, PL + PG)),
    "flux": ((1, 512, T5), (1, PL), (512, 3)),
    "flux-kontext": ((1, 512, T5), (1, PL), (512, 3)),
    "chroma": ((1, 512, T5), (512, 3), (1, 512), (1, 512, T5), (512, 3), (1, 512)),
    "pixart-sigma": ((1, 300, T5), (1, 300), (1, 300, T5), (1, 300)),
    # AuraFlow returns its mask expanded to the embedding shape and flattened: (B, 256 * d_model).
    "auraflow": ((1, 256, 64), (1, 256 * 64), (1, 256, 64), (1, 256 * 64)),
    "lumina2": ((1, 256, 32), (1, 256), (1, 256, 32), (1, 256)),
    "hidream": ((1, 128, T5), (1, 128, T5), (3, 1, 128, 32), (3, 1, 128, 32), (1, PL + PG), (1, PL + PG)),
    "sana": ((1, 300, 32), (1, 300), (1, 300, 32), (1, 300)),
    # 5 prompt tokens + "<|im_end|>\n<|im_start|>assistant\n" (5 tokens); mask None when all ones.
    "qwen-image": ((1, 10, 32), None),
    # With one 56x56 image (ENCODE_ARGS): 4x4 patches of 14 merged 2x2 -> 4 <|image_pad|> tokens. Edit: template
    # before the prompt 143 tokens (its one <|image_pad|> becomes 4: +3), prompt 5, after 5, minus 64 dropped = 92.
    "qwen-image-edit": ((1, 92, 32), None),
    # Plus: template before 140, "Picture 1: <|vision_start|><|image_pad|><|vision_end|>" 9 (+3), prompt 5,
    # after 5, minus 64 = 98.
    "qwen-image-edit-plus": ((1, 98, 32), None),
    "wan21": ((1, 226, 64), (1, 226, 64)),
    # Qwen 1000 positions after the 34 dropped; ByT5 128 (zeros here: the prompt has no quoted text).
    "hunyuanimage": ((1, 1000, 32), (1, 1000), (1, 128, enc.BYT5_D_MODEL), (1, 128)),
    # AnimaTextEncoderStep.encode_prompt's dict: Qwen states + mask, T5 ids + mask ("</s>" added), then the
    # negatives of "" (zero Qwen tokens -> one position with mask 0; T5 "</s>").
    "anima": ((1, 5, 32), (1, 5), (1, 6), (1, 6), (1, 1, 32), (1, 1), (1, 1), (1, 1)),
    # Mistral layers 10, 20, 30 side by side (3 x 16), padded to 512; text_ids (0, 0, 0, position).
    "flux2": ((1, 512, 3 * 16), (1, 512, 4)),
    # Qwen3 layers 9, 18, 27 side by side (3 x 16), padded to 512; text_ids (0, 0, 0, position).
    "flux2-klein": ((1, 512, 3 * 16), (1, 512, 4)),
    # lists of (real tokens, width): "<|im_start|>user\n" 3 + the prompt 5 + "<|im_end|>\n<|im_start|>assistant\n"
    # 5; the negative "" has the template's 8.
    "z-image": (((13, 16),), ((8, 16),)),
    # Krea 2: 12 hidden states stacked per token, 512 positions (prefix dropped, suffix after the padding), bool mask.
    "krea2": ((1, 512, 12, 32), (1, 512)),
    # Ideogram 4 on a 2 x 3 grid: 2048 text + 6 image positions, 13 taps interleaved; position ids, segment ids, indicator.
    "ideogram4": ((1, 2048 + 6, 13 * 32), (1, 2048 + 6, 3), (1, 2048 + 6), (1, 2048 + 6)),
    # LTX-2: the 49 hidden states of the 48-layer Gemma 3 interleaved, 1024 left-padded positions; negative "" (CFG on).
    "ltx2": ((1, 1024, 49 * 32), (1, 1024), (1, 1024, 49 * 32), (1, 1024)),
}

def _support_image() -> Any:
    from PIL import Image

    return Image.new("RGB", (56, 56), (120, 40, 200))


_SUPPORT_IMAGE = _support_image()

# Positional arguments needed besides the prompt.
ENCODE_ARGS: dict[str, tuple[Any, ...]] = {
    "sd15": (torch.device("cpu"), 1, True),
    "sd21": (torch.device("cpu"), 1, True),
    "sd3": (None, None),
    # encode_prompt(prompt, image): one 56x56 condition image (the smallest the Qwen2-VL processor keeps as is)
    "qwen-image-edit": (_SUPPORT_IMAGE,),
    "qwen-image-edit-plus": (_SUPPORT_IMAGE,),
    "ideogram4": (2, 3, 2048, torch.device("cpu")),  # grid_h, grid_w, max_sequence_length, device (all required)
}

_PIPELINES: dict[str, Any] = {}


def _encode_prompt(pipe: Any, family: str, prompt: str) -> Any:
    if family in enc.MODULAR_FAMILIES:  # the modular pipeline's text step (its __call__ reads block state)
        from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep

        return tuple(AnimaTextEncoderStep.encode_prompt(pipe, prompt).values())
    return pipe.encode_prompt(prompt, *ENCODE_ARGS.get(family, ()))


def _type_hints(pipe: Any, family: str) -> dict[str, Any]:
    if family in enc.MODULAR_FAMILIES:
        from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep

        return {c.name: c.type_hint for c in AnimaTextEncoderStep().expected_components}
    hints = {k: v.annotation for k, v in inspect.signature(type(pipe).__init__).parameters.items()}
    if any(isinstance(h, str) for h in hints.values()):  # `from __future__ import annotations` (HunyuanImage)
        import typing

        hints.update(typing.get_type_hints(type(pipe).__init__))
    return hints


def _pipeline(family: str, cache_dir: Path) -> Any:
    if family not in _PIPELINES:
        _PIPELINES[family] = pipes.build_pipeline_for_encoding(family, cache_dir=cache_dir)
    return _PIPELINES[family]


def _shapes(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, tuple | list):
        return tuple(_shapes(v) for v in value)
    return value


def test_families_cover_the_brief() -> None:
    assert set(enc.FAMILIES) == set(EXPECTED_SHAPES)


@pytest.mark.parametrize("family", enc.FAMILIES)
def test_family_components_match_pipeline_type_hints(cache_dir: Path, family: str) -> None:
    pipe = _pipeline(family, cache_dir)
    pipeline_cls = type(pipe)
    assert pipeline_cls.__name__ == enc.PIPELINE_CLASSES[family]
    params = _type_hints(pipe, family)
    components = {k: v for k, v in pipe.components.items() if k.startswith(("tokenizer", "text_encoder")) or k.endswith("_tokenizer")}
    assert components and all(v is not None for v in components.values())
    for name, component in components.items():
        hint = params[name]
        if (family, name) == ("auraflow", "tokenizer"):
            # diffusers hints T5Tokenizer; the official fal/AuraFlow model_index loads LlamaTokenizerFast.
            assert hint is transformers.T5Tokenizer and isinstance(component, transformers.LlamaTokenizerFast)
        elif (family, name) == ("z-image", "tokenizer"):
            # hint AutoTokenizer (and PreTrainedModel for the encoder): the Qwen3 tokenizer class is Qwen2Tokenizer.
            assert hint is transformers.AutoTokenizer and isinstance(component, transformers.Qwen2TokenizerFast)
        elif (family, name) == ("flux2", "tokenizer"):
            # hint AutoProcessor (a PixtralProcessor in FLUX.2-dev); transformers' PixtralProcessor needs torchvision,
            # so the tiny pipeline holds the processor's tokenizer, which apply_chat_template tokenizes alike.
            assert hint is transformers.AutoProcessor and isinstance(component, transformers.PreTrainedTokenizerFast)
        elif (family, name) == ("wan21", "tokenizer"):
            # hint AutoTokenizer; the official model_index loads T5TokenizerFast.
            assert hint is transformers.AutoTokenizer and isinstance(component, transformers.T5TokenizerFast)
        elif (family, name) in {("krea2", "tokenizer"), ("ideogram4", "tokenizer")}:
            # hint AutoTokenizer, which is never an instance; Qwen3-VL ships a Qwen2 tokenizer.
            assert hint is transformers.AutoTokenizer and isinstance(component, transformers.Qwen2TokenizerFast)
        else:
            assert isinstance(component, hint), (family, name, hint)
        if isinstance(component, torch.nn.Module):
            assert not component.training and component.dtype == torch.float32


@pytest.mark.parametrize("family", enc.FAMILIES)
def test_encode_prompt_runs(cache_dir: Path, family: str) -> None:
    pipe = _pipeline(family, cache_dir)
    with torch.no_grad():
        out = _encode_prompt(pipe, family, PROMPT)
    assert _shapes(out) == EXPECTED_SHAPES[family]
    first = out[0][0] if isinstance(out[0], list) else out[0]  # Z-Image: a list per prompt
    assert first.dtype == torch.float32 and torch.isfinite(first).all()


def test_pipeline_side_effects_on_tokenizers(cache_dir: Path) -> None:
    # Lumina2 forces right padding on a left-padding Gemma tokenizer; HiDream pads Llama with its eos.
    assert toks.gemma_tokenizer(padding_side="left", cache_dir=cache_dir).padding_side == "left"
    assert _pipeline("lumina2", cache_dir).tokenizer.padding_side == "right"
    llama_tok = _pipeline("hidream", cache_dir).tokenizer_4
    assert llama_tok.pad_token == llama_tok.eos_token == "<|eot_id|>"
    # SDXL zeroes the negative embeddings for an empty negative prompt (force_zeros_for_empty_prompt).
    with torch.no_grad():
        _, negative, _, negative_pooled = _pipeline("sdxl", cache_dir).encode_prompt(PROMPT)
    assert not negative.any() and not negative_pooled.any()


def test_sd3_without_t5_uses_transformer_width(cache_dir: Path) -> None:
    pipe = pipes.build_pipeline_for_encoding("sd3", cache_dir=cache_dir, text_encoder_3=None, tokenizer_3=None)
    with torch.no_grad():
        embeds, _, pooled, _ = pipe.encode_prompt(PROMPT, None, None)
    assert embeds.shape == (1, 77 + 256, pipe.transformer.config.joint_attention_dim)
    assert not embeds[:, 77:].any() and pooled.shape == (1, PL + PG)
