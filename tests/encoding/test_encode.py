"""The reference encoder's options and its refusals: chunking, dropout, empty prompts, negatives, bad input."""

from __future__ import annotations

import functools

import pytest
import torch

import te_align
from te_align.encoding import EncodeOptions, encode, encode_uncond, sample_dropout
from te_align.errors import EncodingError, TeAlignError
from te_align.tiny.fit import fit_profile
from te_align.tiny.pipelines import build_pipeline_for_encoding, missing_pipeline


def _pipe(profile: str, family: str):
    reason = missing_pipeline(family)  # e.g. diffusers 0.32 (sd-scripts' and musubi-tuner's pin) has no ChromaPipeline
    if reason:
        pytest.skip(reason)
    return _built(profile, family)


@functools.cache
def _built(profile: str, family: str):
    pipe = build_pipeline_for_encoding(family)
    return pipe, fit_profile(te_align.profile(profile), pipe)


def sdxl():
    return _pipe("sdxl", "sdxl")


def sd35():
    return _pipe("sd35-large", "sd3")


# --------------------------------------------------------------------------------- negatives
@pytest.mark.parametrize(
    ("profile", "family", "call", "neg_positions"),
    [
        # SDXL: force_zeros_for_empty_prompt -> zeros for prompt and pooled embeddings
        ("sdxl", "sdxl", lambda pipe, x: pipe.encode_prompt(x, device="cpu", do_classifier_free_guidance=True),
         {1: "prompt_embeds", 3: "pooled_prompt_embeds"}),
        ("sd35-large", "sd3", lambda pipe, x: pipe.encode_prompt(
            prompt=x, prompt_2=None, prompt_3=None, device="cpu", do_classifier_free_guidance=True),
         {1: "prompt_embeds", 3: "pooled_prompt_embeds"}),
        # Lumina 2: the negative prompt gets no system prompt
        ("lumina2", "lumina2", lambda pipe, x: pipe.encode_prompt(x, do_classifier_free_guidance=True, device="cpu"),
         {2: "prompt_embeds", 3: "prompt_attention_mask"}),
        # Sana: the negative prompt gets no complex human instruction
        ("sana", "sana", lambda pipe, x: pipe.encode_prompt(x, do_classifier_free_guidance=True, device="cpu"),
         {2: "prompt_embeds", 3: "prompt_attention_mask"}),
        ("chroma", "chroma", lambda pipe, x: pipe.encode_prompt(x, device="cpu", do_classifier_free_guidance=True),
         {3: "prompt_embeds", 5: "prompt_attention_mask"}),
    ],
)  # fmt: skip
def test_uncond_equals_pipeline_negative(profile, family, call, neg_positions):
    pipe, p = _pipe(profile, family)
    with torch.no_grad():
        result = call(pipe, ["a cat", "a dog on a mat"])
    ours = encode_uncond(p, 2, pipeline=pipe)
    for pos, name in neg_positions.items():
        assert ours[name].dtype == result[pos].dtype
        assert torch.equal(ours[name], result[pos]), f"{profile}: {name} differs from the pipeline's negative"


def test_sdxl_uncond_is_zeros_and_sd3_uncond_is_encoded_empty_prompt():
    pipe, p = sdxl()
    u = encode_uncond(p, 1, pipeline=pipe)
    assert not u["prompt_embeds"].any() and not u["pooled_prompt_embeds"].any()
    pipe3, p3 = sd35()
    u3 = encode_uncond(p3, 1, pipeline=pipe3)
    assert torch.equal(u3["prompt_embeds"], encode(p3, [""], pipeline=pipe3)["prompt_embeds"])
    assert u3["prompt_embeds"].abs().sum() > 0


# ------------------------------------------------------------------------------ chunking
def test_long_prompt_chunking_novelai_method():
    pipe, p = sdxl()
    words = " ".join(f"w{i}" for i in range(100))  # well over 75 tokens
    short = "a cat"
    opts = EncodeOptions(long_prompt_chunks=3)
    c = encode(p, [words, short], pipeline=pipe, options=opts)
    counts = c.token_counts
    assert counts[0] > 150 and counts[1] == 2
    n = min(3, -(-counts[0] // 75))
    assert c["prompt_embeds"].shape[1] == 77 * n
    # chunk 1 of each prompt is the plain 77-token encoding of that prompt (truncated at 75 tokens)
    plain = encode(p, [words, short], pipeline=pipe)
    assert torch.equal(c["prompt_embeds"][:, :77], plain["prompt_embeds"])
    # pooled output comes from the first chunk only
    assert torch.equal(c["pooled_prompt_embeds"], plain["pooled_prompt_embeds"])
    # the second chunk of the long prompt is different from a padding-only chunk of the short one
    assert not torch.equal(c["prompt_embeds"][0, 77:154], c["prompt_embeds"][1, 77:154])
    from te_align.encoding import long_prompt_chunks

    assert long_prompt_chunks(p, [words, short, ""], 3, pipeline=pipe) == [n, 1, 1]
    assert long_prompt_chunks(p, [words], 1, pipeline=pipe) == [1]
    with pytest.raises(EncodingError, match="no chunkable slot"):
        long_prompt_chunks("chroma", [words], 3)
    # with one chunk allowed, chunking equals plain truncation
    one = encode(p, [words, short], pipeline=pipe, options=EncodeOptions(long_prompt_chunks=1))
    assert torch.equal(one["prompt_embeds"], plain["prompt_embeds"])


def test_chunking_touches_only_clip_slots_in_sd3():
    pipe, p = sd35()
    words = " ".join(f"w{i}" for i in range(100))
    c = encode(p, [words], pipeline=pipe, options=EncodeOptions(long_prompt_chunks=2))
    plain = encode(p, [words], pipeline=pipe)
    t5_len = p.slot("t5").tokenizer.max_length
    assert c["prompt_embeds"].shape[1] == 2 * 77 + t5_len
    assert torch.equal(c["prompt_embeds"][:, -t5_len:], plain["prompt_embeds"][:, -t5_len:])


# ------------------------------------------------------------------------------- dropout
def test_per_encoder_dropout_zeros_and_empty_policies():
    pipe, p = sd35()
    prompts = ["a cat", "a dog"]
    plain = encode(p, prompts, pipeline=pipe)
    z = encode(p, prompts, pipeline=pipe, drop_slots={"t5": [True, False]}, options=EncodeOptions(dropout_policy="zeros"))
    t5_len = p.slot("t5").tokenizer.max_length
    assert not z["prompt_embeds"][0, 77:].any()
    assert torch.equal(z["prompt_embeds"][0, :77], plain["prompt_embeds"][0, :77])
    assert torch.equal(z["prompt_embeds"][1], plain["prompt_embeds"][1])
    assert torch.equal(z["pooled_prompt_embeds"], plain["pooled_prompt_embeds"])  # t5 has no pooled part
    e = encode(p, prompts, pipeline=pipe, drop_slots={"clip_g": [False, True]}, options=EncodeOptions(dropout_policy="empty"))
    empty = encode(p, [""], pipeline=pipe)
    width_l = pipe.text_encoder.config.hidden_size
    width_g = pipe.text_encoder_2.config.hidden_size
    g = slice(width_l, width_l + width_g)
    assert torch.equal(e["prompt_embeds"][1, :77, g], empty["prompt_embeds"][0, :77, g])
    assert torch.equal(e["prompt_embeds"][1, :77, :width_l], plain["prompt_embeds"][1, :77, :width_l])
    assert torch.equal(e["prompt_embeds"][1, 77:], plain["prompt_embeds"][1, 77:])
    assert torch.equal(e["pooled_prompt_embeds"][1, width_l:], empty["pooled_prompt_embeds"][0, width_l:])
    assert torch.equal(e["prompt_embeds"][0], plain["prompt_embeds"][0])
    assert t5_len == e["prompt_embeds"].shape[1] - 77


def test_whole_caption_dropout_follows_profile_rule():
    pipe, p = sdxl()  # SDXL: empty prompt -> zeros
    c = encode(p, ["a cat", "a dog"], pipeline=pipe, drop=[False, True])
    assert not c["prompt_embeds"][1].any() and not c["pooled_prompt_embeds"][1].any()
    assert c["prompt_embeds"][0].abs().sum() > 0
    pipe3, p3 = sd35()  # SD3: empty prompt -> the encoded ""
    c3 = encode(p3, ["a cat", "a dog"], pipeline=pipe3, drop=[True, False])
    assert torch.equal(c3["prompt_embeds"][0], encode(p3, [""], pipeline=pipe3)["prompt_embeds"][0])


def test_sample_dropout_is_seeded_and_independent():
    p = te_align.profile("sd35-large")
    probs = {s.name: s.train_dropout for s in p.slots}
    assert probs == {"clip_l": 0.464, "clip_g": 0.464, "t5": 0.464}
    a = sample_dropout(p, 2000, probs, generator=torch.Generator().manual_seed(0))
    b = sample_dropout(p, 2000, probs, generator=torch.Generator().manual_seed(0))
    assert a == b
    rates = {k: sum(v) / len(v) for k, v in a.items()}
    assert all(0.43 < r < 0.50 for r in rates.values()), rates
    assert a["clip_l"] != a["t5"]  # independent draws per encoder
    with pytest.raises(EncodingError, match="must be in"):
        sample_dropout(p, 4, {"t5": 1.5})
    with pytest.raises(TeAlignError, match="no text-encoder slot 'clip_x'"):
        sample_dropout(p, 4, {"clip_x": 0.1})


# ------------------------------------------------------------------------------- bad input
def test_missing_component_names_the_slot():
    pipe, p = sd35()
    toks = {"clip_l": pipe.tokenizer, "clip_g": pipe.tokenizer_2}
    encs = {"clip_l": pipe.text_encoder, "clip_g": pipe.text_encoder_2}
    with pytest.raises(EncodingError, match=r"no tokenizer for slot 't5'.*'tokenizer_3'"):
        encode(p, ["a"], tokenizers=toks, text_encoders=encs)


def test_hidden_size_mismatch_names_slot_and_both_values():
    pipe = sd35()[0]
    real = te_align.profile("sd35-large")  # real sizes, tiny encoders
    with pytest.raises(EncodingError) as exc:
        encode(real, ["a"], pipeline=pipe)
    msg = str(exc.value)
    assert "slot 'clip_l'" in msg and "hidden size 32" in msg and "expects 768" in msg


def test_bad_dtype_device_and_prompts():
    pipe, p = sd35()
    with pytest.raises(EncodingError, match="dtype must be"):
        encode(p, ["a"], pipeline=pipe, dtype="float8")
    with pytest.raises(EncodingError, match="slot 'clip_l': the encoder is on cpu but device=cuda"):
        encode(p, ["a"], pipeline=pipe, device="cuda")
    with pytest.raises(EncodingError, match="non-empty list of strings"):
        encode(p, [], pipeline=pipe)
    with pytest.raises(EncodingError, match="drop has 1 entries for 2 prompts"):
        encode(p, ["a", "b"], pipeline=pipe, drop=[True])
    with pytest.raises(EncodingError, match="dropout_policy"):
        encode(p, ["a"], pipeline=pipe, options=EncodeOptions(dropout_policy="maybe"))


def test_dtype_argument_casts_float_outputs_only():
    pipe, p = _pipe("chroma", "chroma")
    c = encode(p, ["a cat"], pipeline=pipe, dtype="bfloat16")
    assert c["prompt_embeds"].dtype == torch.bfloat16
    assert c["prompt_attention_mask"].dtype == torch.bfloat16  # Chroma's mask has the embeddings' dtype
    q = encode(_pipe("pixart-sigma", "pixart-sigma")[1], ["a cat"], pipeline=_pipe("pixart-sigma", "pixart-sigma")[0], dtype=torch.float16)
    assert q["prompt_embeds"].dtype == torch.float16 and q["prompt_attention_mask"].dtype == torch.int64


def test_hidream_llama_layers_keep_batch_in_dim_1_through_index_cat_and_cache(tmp_path):
    from te_align.encoding import Conditioning
    from te_align.encoding.cache.store import EmbeddingCache

    pipe, p = _pipe("hidream", "hidream")
    prompts = ["a cat", "a dog on a mat", "!"]
    c = encode(p, prompts, pipeline=pipe)
    llama = c["prompt_embeds_llama3"]
    n_layers = pipe.text_encoder_4.config.num_hidden_layers
    assert llama.shape[:2] == (n_layers, 3)
    assert c.batch_size == 3 and c.batch_dim("prompt_embeds_llama3") == 1
    one = c.index(1)
    assert torch.equal(one["prompt_embeds_llama3"], llama[:, 1:2])
    assert torch.equal(one["prompt_embeds_t5"], c["prompt_embeds_t5"][1:2])
    assert torch.equal(Conditioning.cat(c.split())["prompt_embeds_llama3"], llama)
    cache = EmbeddingCache(tmp_path / "cache", p, "tiny-weights")
    cache.put(prompts[2], c.index(2))
    back = cache.get(prompts[2])
    assert back.batch_dim("prompt_embeds_llama3") == 1
    assert torch.equal(back["prompt_embeds_llama3"], llama[:, 2:3])


@pytest.mark.parametrize(
    ("profile", "family"), [("sd35-large", "sd3"), ("qwen-image", "qwen-image"), ("hunyuanimage-2.1", "hunyuanimage")]
)
def test_load_text_encoders_from_a_diffusers_folder(tmp_path, profile, family):
    pipe, p = _pipe(profile, family)
    for slot in p.slots:
        getattr(pipe, slot.tokenizer_subfolder).save_pretrained(tmp_path / slot.tokenizer_subfolder)
        getattr(pipe, slot.encoder_subfolder).save_pretrained(tmp_path / slot.encoder_subfolder)
    tokenizers, encoders = te_align.load_text_encoders(p, tmp_path)
    assert set(tokenizers) == set(encoders) == set(p.slot_names)
    for slot in p.slots:
        assert type(encoders[slot.name]).__name__ == slot.encoder.cls
        assert not encoders[slot.name].training
    prompts = ["a cat", "wow!! 東京 🐱"]
    loaded = te_align.encode(p, prompts, tokenizers=tokenizers, text_encoders=encoders)
    original = te_align.encode(p, prompts, pipeline=pipe)
    for name in p.output_names:
        assert torch.equal(loaded[name], original[name]), name
    half, _ = te_align.load_text_encoders(p, tmp_path, slots=[p.slots[0].name])
    assert list(half) == [p.slots[0].name]


def test_anima_tokenizer_only_slot_loads_encodes_and_drops(tmp_path):
    """Anima's t5 slot is tokenized only: load_text_encoders gives its tokenizer and no encoder, encode needs
    none, the slot's ids/masks follow the qwen slot's device, and dropped captions get the ids of ""."""
    pipe, p = _pipe("anima", "anima")
    pipe.tokenizer.save_pretrained(tmp_path / "tokenizer")
    pipe.text_encoder.save_pretrained(tmp_path / "text_encoder")
    pipe.t5_tokenizer.save_pretrained(tmp_path / "t5_tokenizer")
    tokenizers, encoders = te_align.load_text_encoders(p, tmp_path)
    assert set(tokenizers) == {"qwen", "t5"} and set(encoders) == {"qwen"}
    assert type(encoders["qwen"]).__name__ == "Qwen3Model" and not encoders["qwen"].training
    prompts = ["a cat", "wow!! 東京 🐱", ""]
    loaded = te_align.encode(p, prompts, tokenizers=tokenizers, text_encoders=encoders)
    original = te_align.encode(p, prompts, pipeline=pipe)
    for name in p.output_names:
        assert torch.equal(loaded[name], original[name]), name
    assert loaded["t5_input_ids"].dtype == torch.long and loaded.token_counts == [int(x) for x in loaded["qwen_attention_mask"].sum(1)]
    for policy in ("profile", "zeros"):
        dropped = te_align.encode(p, prompts, pipeline=pipe, drop_slots={"t5": [False, True, False]},
                                  options=te_align.encoding.EncodeOptions(dropout_policy=policy))  # fmt: skip
        as_empty = te_align.encode(p, ["a cat", "", ""], pipeline=pipe)
        assert torch.equal(dropped["t5_input_ids"], as_empty["t5_input_ids"])  # the batch's tokens with "" there
        assert torch.equal(dropped["t5_attention_mask"], as_empty["t5_attention_mask"])
        assert torch.equal(dropped["qwen_prompt_embeds"], original["qwen_prompt_embeds"])  # only the t5 slot is dropped
    with pytest.raises(EncodingError, match="no tokenizer for slot 't5'"):
        te_align.encode(p, prompts, tokenizers={"qwen": tokenizers["qwen"]}, text_encoders=encoders)


def test_load_text_encoders_names_the_missing_folder(tmp_path):
    p = te_align.profile("flux-dev")
    (tmp_path / "tokenizer").mkdir()
    with pytest.raises(EncodingError, match=r"slot 'clip_l': no text-encoder folder 'text_encoder' in"):
        te_align.load_text_encoders(p, tmp_path)
    (tmp_path / "text_encoder").mkdir()
    with pytest.raises(EncodingError, match=r"slot 'clip_l': cannot load from"):
        te_align.load_text_encoders(p, tmp_path)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("repad", ["batch_longest", "max_length"])
def test_repad_selects_real_tokens_after_the_dropped_prefix(side, repad):
    from te_align.encoding.core import repad as repad_fn

    p = te_align.profile("qwen-image", qwen_padding_side=side, qwen_repad=repad, qwen_max_length=9, qwen_drop_start_tokens=2)
    slot = p.slot("qwen")
    lengths = [7, 4, 2]
    seq = 8
    hidden = torch.randn(3, seq, 5)
    mask = torch.zeros(3, seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        if side == "right":
            mask[i, :n] = 1
        else:
            mask[i, seq - n :] = 1
    ids = torch.arange(3 * seq).reshape(3, seq) + 1
    out_h, out_m, out_i = repad_fn(slot, hidden, mask, ids)
    target = max(n - 2 for n in lengths) if repad == "batch_longest" else 9
    assert out_h.shape == (3, target, 5) and out_m.shape == (3, target)
    for i, n in enumerate(lengths):
        real = hidden[i][mask[i].bool()][2:]
        assert torch.equal(out_h[i, : n - 2], real)
        assert not out_h[i, n - 2 :].any()
        assert out_m[i].tolist() == [1] * (n - 2) + [0] * (target - n + 2)
        assert torch.equal(out_i[i, : n - 2], ids[i][mask[i].bool()][2:])



# ------------------------------------------------------------- text transform, absent text, per-sample
def _spy(module):
    """Record (batch size, attention-mask dtype) of every forward call of ``module``."""
    calls = []
    original = module.forward

    def forward(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        calls.append((kwargs["input_ids"].shape[0], None if mask is None else mask.dtype))
        return original(*args, **kwargs)

    module.forward = forward
    return calls


def test_quoted_text_slot_encodes_glyph_text_per_sample_with_a_float_mask_and_zeros_otherwise():
    from te_align.encoding.core import encode_slot_tokens, tokenize_slot
    from te_align.encoding.text import quoted_text, render

    pipe, p = _pipe("hunyuanimage-2.1", "hunyuanimage")
    slot = p.slot("byt5")
    prompts = ["a cat", 'a sign "OPEN"', "", "it's 'x' and “y”"]
    assert [quoted_text(x) for x in prompts] == [None, 'Text "OPEN". ', None, 'Text "s ". Text "y". ']
    assert render(slot.tokenizer, "a cat") == ""  # no text renders as the empty string would
    ids, mask = tokenize_slot(slot, pipe.tokenizer_2, prompts)
    assert ids.shape == mask.shape == (4, 128)
    assert mask.sum(dim=1).tolist()[0] == 0 and mask.sum(dim=1).tolist()[2] == 0 and not ids[[0, 2]].any()
    calls = _spy(pipe.text_encoder_2)
    try:
        with torch.no_grad():  # as encode runs it (T5 floats differ with autograd recording)
            res = encode_slot_tokens(p, slot, pipe.text_encoder_2, ids, mask)
        assert calls == [(1, torch.float32), (1, torch.float32)]  # only the two prompts with quoted text
        calls.clear()
        c = encode(p, prompts, pipeline=pipe)
        assert len(calls) == 2
        calls.clear()
        batched = p.with_overrides(byt5_per_sample=False, byt5_encoder_mask_dtype="int64")
        b = encode(batched, prompts, pipeline=pipe)
        assert calls == [(2, torch.int64)]  # the present samples in one batch, absent ones still not encoded
    finally:
        del pipe.text_encoder_2.forward
    assert torch.equal(res.hidden, c["prompt_embeds_2"]) and torch.equal(res.denoiser_mask, c["prompt_embeds_mask_2"])
    assert not c["prompt_embeds_2"][[0, 2]].any() and c["prompt_embeds_2"][[1, 3]].abs().sum(dim=(1, 2)).all()
    assert c["prompt_embeds_mask_2"].dtype == torch.int64 and not c["prompt_embeds_mask_2"][[0, 2]].any()
    assert b["prompt_embeds_2"].shape == c["prompt_embeds_2"].shape and not b["prompt_embeds_2"][[0, 2]].any()
    # all absent: zeros of the encoder's width, nothing encoded; a dropped caption is the empty prompt -> zeros
    none = encode(p, ["a", "b"], pipeline=pipe)
    assert none["prompt_embeds_2"].shape == (2, 128, pipe.text_encoder_2.config.d_model) and not none["prompt_embeds_2"].any()
    dropped = encode(p, prompts, pipeline=pipe, drop=[False, True, False, False])
    assert not dropped["prompt_embeds_2"][1].any() and torch.equal(dropped["prompt_embeds_2"][3], c["prompt_embeds_2"][3])


def test_new_slot_fields_are_validated():
    from te_align.errors import ProfileError

    with pytest.raises(ProfileError, match="absent_text applies to prompts a text_transform"):
        te_align.profile("hunyuanimage-2.1", byt5_text_transform="none")
    with pytest.raises(ProfileError, match=r"encoder_mask_dtype needs masks\.encoder = true"):
        te_align.profile("hunyuanimage-2.1", **{"byt5.masks.encoder": False})
    with pytest.raises(ProfileError, match=r"expected one of 'none' \| 'quoted_text'"):
        te_align.profile("sd15", clip_l_text_transform="glyphs")
    # a plain slot can take the quoted text too, with the empty string encoded for prompts without it
    p = te_align.profile("sd15", clip_l_text_transform="quoted_text")
    assert p.slot("clip_l").tokenizer.absent_text == "empty"


# ---------------------------------------------------------------- empty prompt "zeros" (issue 12, bug 2)
def test_hidream_zeros_uncond_keeps_the_llama_batch_dimension():
    """Zeroed embeddings keep each output's batch dimension: HiDream's Llama stack is (layers, batch, seq, width)."""
    pipe, p = _pipe("hidream", "hidream")
    z = p.with_overrides(empty_prompt="zeros")
    u = encode_uncond(z, 2, pipeline=pipe)
    ref = encode(z, ["", ""], pipeline=pipe, negative=True)
    n_layers = pipe.text_encoder_4.config.num_hidden_layers
    llama = u["prompt_embeds_llama3"]
    assert llama.shape == ref["prompt_embeds_llama3"].shape and llama.shape[:2] == (n_layers, 2)
    assert u.batch_size == 2 and u.batch_dim("prompt_embeds_llama3") == 1
    for name in p.output_names:
        assert u[name].shape == ref[name].shape and u[name].dtype == ref[name].dtype and not u[name].any(), name
    one = u.index(0)
    assert one["prompt_embeds_llama3"].shape == (n_layers, 1, *llama.shape[2:])
    assert one["prompt_embeds_t5"].shape == (1, *u["prompt_embeds_t5"].shape[1:])
    assert one["pooled_prompt_embeds"].shape == (1, u["pooled_prompt_embeds"].shape[1])


def test_anima_zeros_uncond_zeroes_embeddings_and_keeps_ids_and_masks():
    """Token ids are never zeroed (Anima's T5 ids of "" are [1]: the EOS token), masks are kept, embeddings are zero."""
    pipe, p = _pipe("anima", "anima")
    z = p.with_overrides(empty_prompt="zeros")
    u = encode_uncond(z, 2, pipeline=pipe)
    ref = encode(z, ["", ""], pipeline=pipe, negative=True)
    assert u["t5_input_ids"].tolist() == [[1], [1]] and torch.equal(u["t5_input_ids"], ref["t5_input_ids"])
    assert u["t5_attention_mask"].tolist() == [[1], [1]]
    assert torch.equal(u["qwen_attention_mask"], ref["qwen_attention_mask"])  # "" is one masked pad position: [[0], [0]]
    q = u["qwen_prompt_embeds"]
    assert q.shape == ref["qwen_prompt_embeds"].shape and q.dtype == ref["qwen_prompt_embeds"].dtype and not q.any()


# ------------------------------------------------------------- CLIP-G "!" as a tokenizer field
def test_pad_token_in_prompt_text_tokenizes_clip_g_as_sd_scripts():
    """``pad_token_in_prompt = "text"``: a literal "!" is BPE text ("!" 256, "!!" 748), padding keeps id 0, and
    the conditioning equals encoding with sd-scripts' CLIP-G tokenizer (library/strategy_sdxl.py:26: the laion
    tokenizer, pad <|endoftext|>, then ``pad_token_id = 0``), long-prompt chunks and weighted captions included."""
    from te_align.encoding.core import tokenize_slot
    from te_align.encoding.weights import tokenize_slot_weighted
    from te_align.tiny.tokenizers import clip_tokenizer

    pipe, p = sdxl()
    kohya = p.with_overrides({"clip_g.tokenizer.pad_token_in_prompt": "text"})
    assert kohya.fingerprint() != p.fingerprint()
    tok = pipe.tokenizer_2
    wow, amazing = tok.convert_tokens_to_ids(["wow</w>", "amazing</w>"])
    ids = tokenize_slot(kohya.slot("clip_g"), tok, ["wow! amazing!!"])[0][0].tolist()
    assert ids[:6] == [49406, wow, 256, amazing, 748, 49407] and set(ids[6:]) == {0} and len(ids) == 77
    official = tokenize_slot(p.slot("clip_g"), tok, ["wow! amazing!!"])[0][0].tolist()
    assert official[:7] == [49406, wow, 0, amazing, 0, 0, 49407]  # the hub tokenizer: every "!" is the pad id

    # sd-scripts' CLIP-G tokenizer: the laion one (the same CLIP BPE vocabulary, pad <|endoftext|>), pad_token_id = 0
    laion = clip_tokenizer(pad="<|endoftext|>")
    assert laion.get_vocab() == tok.get_vocab()
    laion.pad_token_id = 0
    tokenizers = {"clip_l": pipe.tokenizer, "clip_g": laion}
    encoders = {"clip_l": pipe.text_encoder, "clip_g": pipe.text_encoder_2}
    prompts = ["wow! amazing!!", "a photo of a cat", "!", "!!! a!b ! <|endoftext|>", ""]
    long = [" ".join(["w!"] * 80), "x!"]
    for batch, opts in ((prompts, None), (long, EncodeOptions(long_prompt_chunks=3))):
        want = encode(p, batch, tokenizers=tokenizers, text_encoders=encoders, options=opts)
        got = encode(kohya, batch, pipeline=pipe, options=opts)
        assert want.token_counts == got.token_counts
        for name in p.output_names:
            assert torch.equal(got[name], want[name]), name
    ids_w, _, w = tokenize_slot_weighted(kohya.slot("clip_g"), tok, ["(wow!:2) x"])
    assert torch.equal(ids_w, tokenize_slot(kohya.slot("clip_g"), tok, ["wow! x"])[0])
    assert ids_w[0, 1:3].tolist() == [wow, 256] and w[0, 1:4].tolist() == [2.0, 2.0, 1.0]


def test_pixart_cleaning_without_its_packages_says_so_once(monkeypatch, caplog):
    """Without beautifulsoup4 (or ftfy) the diffusers PixArt pipelines skip caption cleaning; te-align does the
    same, as the reference must, but says so (a trainer's environment need not have them)."""
    import diffusers.utils

    from te_align.encoding import text

    monkeypatch.setattr(diffusers.utils, "is_bs4_available", lambda: False)
    monkeypatch.setattr(text, "_WARNED", set())
    with caplog.at_level("WARNING", logger="te_align"):
        assert text.clean_pixart("  A <b>Cat</b> ") == "a <b>cat</b>"
        assert text.clean_pixart("Dog") == "dog"
    assert [r.getMessage() for r in caplog.records] == [
        'te-align: PixArt caption cleaning needs beautifulsoup4 and ftfy (pip install "te-align[encode]"); '
        "without them prompts are only lower-cased and stripped, as the diffusers pipeline does"]
