"""Long-prompt chunks padded to the batch's longest caption (``EncodeOptions(chunk_padding="longest")``), against an
independent reference of diffusion-pipe's SDXL text encoding (tdrussell/diffusion-pipe@8f83dbf models/sdxl.py:581-589
``_get_input_ids``, :744-781 ``get_prompt_embeds``) on the tiny SDXL pipeline (real CLIP BPE, tiny CLIP encoders).
"""

from __future__ import annotations

import functools

import pytest
import torch

import te_align
from te_align.encoding import EncodeOptions, encode
from te_align.encoding.core import tokenize_slot
from te_align.errors import EncodingError
from te_align.tiny.fit import fit_profile
from te_align.tiny.pipelines import build_pipeline_for_encoding

LONGEST = EncodeOptions(long_prompt_chunks=16, chunk_padding="longest")
#: Words that are one CLIP BPE token each (checked in :func:`caption`).
WORDS = ("red", "cat", "dog", "blue", "tree", "house", "green", "bird")


@functools.cache
def _sdxl():
    pipe = build_pipeline_for_encoding("sdxl")
    return pipe, fit_profile(te_align.profile("sdxl"), pipe)


def caption(n: int) -> str:
    """A caption of exactly ``n`` CLIP tokens (without BOS/EOS) for both SDXL tokenizers."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(n))
    pipe, _ = _sdxl()
    for tok in (pipe.tokenizer, pipe.tokenizer_2):
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == n
    return text


# ------------------------------------------------------------------------------- the reference
def reference_ids(tokenizer, captions: list[str]) -> list[torch.Tensor]:
    """diffusion-pipe's chunks, step by step: tokenize to the batch's longest without truncation or special tokens,
    split into model_max_length - 2 = 75-token pieces, wrap each as BOS + piece + one pad, first pad of each row -> EOS."""
    ids = tokenizer(
        captions, padding="longest", truncation=False, add_special_tokens=False, return_tensors="pt"
    )
    ids = ids.input_ids.to(torch.int64)
    bs = ids.shape[0]
    chunks = []
    for piece in torch.split(ids, tokenizer.model_max_length - 2, dim=-1):
        chunk = torch.cat(
            [torch.full((bs, 1), tokenizer.bos_token_id), piece, torch.full((bs, 1), tokenizer.pad_token_id)],
            dim=-1,
        )
        first_pad = torch.argmax((chunk == tokenizer.pad_token_id).to(torch.int32), dim=-1)
        chunk[torch.arange(bs), first_pad] = tokenizer.eos_token_id
        chunks.append(chunk)
    return chunks


def reference_embeds(chunks: list[torch.Tensor], encoder) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk encoded on its own: hidden_states[-2] concatenated along the sequence; output[0] of chunk 0."""
    hidden, pooled = [], None
    with torch.no_grad():
        for i, ids in enumerate(chunks):
            out = encoder(ids, output_hidden_states=True)
            if i == 0:
                pooled = out[0]
            hidden.append(out.hidden_states[-2])
    return torch.cat(hidden, dim=1), pooled


def reference(
    pipe, captions: list[str], tokenizer_2=None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(prompt_embeds, pooled_prompt_embeds, CLIP-L chunk ids) as diffusion-pipe's get_text_conditioning."""
    ids_l = reference_ids(pipe.tokenizer, captions)
    ids_g = reference_ids(tokenizer_2 or pipe.tokenizer_2, captions)
    hidden_l, _ = reference_embeds(ids_l, pipe.text_encoder)
    hidden_g, pooled = reference_embeds(ids_g, pipe.text_encoder_2)
    return torch.cat([hidden_l, hidden_g], dim=-1), pooled, ids_l


def encode_longest(p, pipe, captions: list[str], **kw):
    with torch.no_grad():
        return encode(p, captions, pipeline=pipe, options=kw.pop("options", LONGEST), **kw)


# ------------------------------------------------------------------------------------ shapes and values
@pytest.mark.parametrize(
    ("lengths", "width"),
    [
        ((3, 10, 20), 22),  # short captions: the longest + BOS + EOS, under 77
        ((5, 160), 77 + 77 + 12),  # 160 tokens: 3 chunks, the last 160 - 150 + 2 positions
        ((75, 4), 77),  # exactly 75 tokens: one full chunk
        ((76,), 77 + 3),  # one token over: a second chunk of BOS, 1 token, EOS
        ((150, 1), 77 + 77),  # two full chunks, nothing narrower
        ((0, 5), 7),  # an empty caption in the batch
        ((0, 160), 77 + 77 + 12),
        ((0,), 2),  # only empty captions: BOS, EOS
    ],
)
def test_equals_diffusion_pipe_sdxl(lengths: tuple[int, ...], width: int) -> None:
    pipe, p = _sdxl()
    captions = [caption(n) for n in lengths]
    ref_embeds, ref_pooled, ref_ids = reference(pipe, captions)
    cond = encode_longest(p, pipe, captions)
    ids, mask = tokenize_slot(p.slot("clip_l"), pipe.tokenizer, captions, options=LONGEST)
    assert ids.shape == mask.shape == (len(captions), width)
    assert torch.equal(ids, torch.cat(ref_ids, dim=1)) and bool(mask.all())
    assert cond["prompt_embeds"].shape == ref_embeds.shape == (len(captions), width, ref_embeds.shape[-1])
    # the same forward shapes (each chunk alone, the whole batch) as the reference: bit-identical
    assert torch.equal(cond["prompt_embeds"], ref_embeds)
    assert torch.equal(cond["pooled_prompt_embeds"], ref_pooled)
    assert cond.token_counts == list(lengths)


def test_diffusion_pipe_setup_clip_l_tokenizer_for_both_encoders() -> None:
    """diffusion-pipe replaces tokenizer_2 by the CLIP-L tokenizer (models/sdxl.py:390-393): with the profile's CLIP-G
    pad overridden to <|endoftext|> the option reproduces it exactly, a literal "!" included."""
    pipe, p = _sdxl()
    p = p.with_overrides(clip_g_pad_token="<|endoftext|>", clip_g_pad_token_id=pipe.tokenizer.pad_token_id)
    captions = ["wow! a red cat!!", caption(80) + " end!"]
    ref_embeds, ref_pooled, _ = reference(pipe, captions, tokenizer_2=pipe.tokenizer)
    with torch.no_grad():
        cond = encode(
            p,
            captions,
            tokenizers={"clip_l": pipe.tokenizer, "clip_g": pipe.tokenizer},
            text_encoders={"clip_l": pipe.text_encoder, "clip_g": pipe.text_encoder_2},
            options=LONGEST,
        )
    assert cond["prompt_embeds"].shape[1] == 77 + (82 - 75) + 2
    assert torch.equal(cond["prompt_embeds"], ref_embeds)
    assert torch.equal(cond["pooled_prompt_embeds"], ref_pooled)


def test_slots_that_count_a_prompt_apart_share_the_widest_layout() -> None:
    pipe, p = _sdxl()
    captions = [caption(73) + " hi!!!", caption(3)]
    # CLIP-L: 75 tokens, one chunk (77); CLIP-G reads each "!" as its pad id: 77 tokens, two chunks (77 + 4)
    ids_l = tokenize_slot(p.slot("clip_l"), pipe.tokenizer, captions, options=LONGEST)[0]
    ids_g = tokenize_slot(p.slot("clip_g"), pipe.tokenizer_2, captions, options=LONGEST)[0]
    assert ids_l.shape[1] == 77 and ids_g.shape[1] == 81
    cond = encode_longest(p, pipe, captions)
    assert cond["prompt_embeds"].shape[1] == 81
    wide_l = tokenize_slot(p.slot("clip_l"), pipe.tokenizer, captions, options=LONGEST, chunk_width=81)[0]
    # CLIP-L's own chunk, then one of BOS, EOS and pads (CLIP-L pads with <|endoftext|>)
    assert (
        torch.equal(wide_l[:, :77], ids_l) and wide_l[:, 77:].tolist() == [[49406, 49407, 49407, 49407]] * 2
    )
    hidden_l, _ = reference_embeds([wide_l[:, :77], wide_l[:, 77:]], pipe.text_encoder)
    hidden_g, pooled = reference_embeds([ids_g[:, :77], ids_g[:, 77:]], pipe.text_encoder_2)
    assert torch.equal(cond["prompt_embeds"], torch.cat([hidden_l, hidden_g], dim=-1))
    assert torch.equal(cond["pooled_prompt_embeds"], pooled)


def test_chunk_limit_still_applies() -> None:
    pipe, p = _sdxl()
    captions = [caption(160), caption(3)]
    cond = encode_longest(
        p, pipe, captions, options=EncodeOptions(long_prompt_chunks=2, chunk_padding="longest")
    )
    # two chunks at most: the caption is cut at 150 tokens, both chunks full
    assert cond["prompt_embeds"].shape[1] == 154
    ref = encode_longest(p, pipe, [caption(150), caption(3)])
    assert torch.equal(cond["prompt_embeds"], ref["prompt_embeds"])


# ------------------------------------------------------------------------------------ NovelAI unchanged
def test_novelai_layout_unchanged_and_longest_is_its_cut() -> None:
    pipe, p = _sdxl()
    captions = [caption(20), caption(160)]
    slot = p.slot("clip_g")
    ids, mask = tokenize_slot(slot, pipe.tokenizer_2, captions, options=EncodeOptions(long_prompt_chunks=16))
    bos, eos, pad = 49406, 49407, slot.tokenizer.pad_token_id
    expected = []
    for c in captions:
        r = pipe.tokenizer_2(c, add_special_tokens=False)["input_ids"]
        row: list[int] = []
        for k in range(3):  # 160 tokens: 3 chunks, each BOS + up to 75 tokens + EOS + pads to 77
            part = r[k * 75 : (k + 1) * 75]
            row += [bos, *part, eos] + [pad] * (75 - len(part))
        expected.append(row)
    assert ids.tolist() == expected and bool(mask.all())
    longest, _ = tokenize_slot(slot, pipe.tokenizer_2, captions, options=LONGEST)
    assert torch.equal(longest, ids[:, : 2 * 77 + 12])
    novelai = encode_longest(p, pipe, captions, options=EncodeOptions(long_prompt_chunks=16))
    cut = encode_longest(p, pipe, captions)
    assert novelai["prompt_embeds"].shape[1] == 3 * 77
    # chunks 1 and 2 are the same forwards in both layouts; the last differs in width only
    assert torch.equal(novelai["prompt_embeds"][:, :154], cut["prompt_embeds"][:, :154])
    assert torch.equal(novelai["pooled_prompt_embeds"], cut["pooled_prompt_embeds"])
    torch.testing.assert_close(
        novelai["prompt_embeds"][:, 154:166], cut["prompt_embeds"][:, 154:], atol=1e-6, rtol=0
    )


def test_as_dict_default_unchanged() -> None:
    d = EncodeOptions().as_dict()
    assert d == {"long_prompt_chunks": 0, "dropout_policy": "profile", "pad_chunks": False}
    assert list(d) == ["long_prompt_chunks", "dropout_policy", "pad_chunks"]
    assert "chunk_padding" not in EncodeOptions(long_prompt_chunks=3, pad_chunks=True).as_dict()
    assert LONGEST.as_dict() == {
        "long_prompt_chunks": 16,
        "dropout_policy": "profile",
        "pad_chunks": False,
        "chunk_padding": "longest",
    }


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk_padding": "longest"}, "needs long_prompt_chunks >= 1"),
        ({"chunk_padding": "longest", "long_prompt_chunks": 3, "pad_chunks": True}, "pad_chunks"),
        ({"chunk_padding": "shortest", "long_prompt_chunks": 3}, "'max_length' or 'longest'"),
    ],
)
def test_bad_combinations(kwargs: dict, match: str) -> None:
    with pytest.raises(EncodingError, match=match) as e:
        EncodeOptions(**kwargs)
    assert "\n" not in str(e.value)


def test_chunkable_slot_wider_without_chunks_is_refused() -> None:
    pipe, p = _sdxl()
    p = p.with_overrides(clip_l_truncation=False, clip_l_padding="longest")
    with pytest.raises(EncodingError, match=r"clip_l.*positions without long-prompt chunks") as e:
        tokenize_slot(p.slot("clip_l"), pipe.tokenizer, [caption(100)])
    assert "\n" not in str(e.value)
    assert tokenize_slot(p.slot("clip_l"), pipe.tokenizer, [caption(75)])[0].shape == (1, 77)


# ------------------------------------------------------------------------------------ dropout
def _empty_in_layout(pipe, widths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP-G's encoding of "" in a batch's layout, built by hand: BOS, EOS, pads, chunk by chunk; one sample."""
    # tokenizer_2 pads with "!" (id 0)
    chunks = [torch.tensor([[49406, 49407] + [0] * (w - 2)]) for w in widths]
    return reference_embeds(chunks, pipe.text_encoder_2)


@pytest.mark.parametrize(("lengths", "widths"), [((3, 20), (22,)), ((20, 160), (77, 77, 12))])
def test_dropped_encoder_gets_the_batch_layout(lengths: tuple[int, ...], widths: tuple[int, ...]) -> None:
    pipe, p = _sdxl()
    captions = [caption(n) for n in lengths]
    width_l = pipe.text_encoder.config.hidden_size
    plain = encode_longest(p, pipe, captions)
    opts = EncodeOptions(long_prompt_chunks=16, chunk_padding="longest", dropout_policy="empty")
    cond = encode_longest(p, pipe, captions, options=opts, drop_slots={"clip_g": [True, False]})
    empty_hidden, empty_pooled = _empty_in_layout(pipe, widths)
    assert cond["prompt_embeds"].shape == plain["prompt_embeds"].shape
    assert torch.equal(cond["prompt_embeds"][0, :, width_l:], empty_hidden[0])
    assert torch.equal(cond["pooled_prompt_embeds"][0], empty_pooled[0])
    assert torch.equal(cond["prompt_embeds"][0, :, :width_l], plain["prompt_embeds"][0, :, :width_l])
    assert torch.equal(cond["prompt_embeds"][1], plain["prompt_embeds"][1])
    # a whole dropped caption is "" in the batch (the reference's own row); the slot fill equals it up to batch shape
    whole = encode_longest(p, pipe, ["", captions[1]], options=opts)
    torch.testing.assert_close(
        cond["prompt_embeds"][0, :, width_l:], whole["prompt_embeds"][0, :, width_l:], atol=1e-6, rtol=0
    )
    zeros = EncodeOptions(long_prompt_chunks=16, chunk_padding="longest", dropout_policy="zeros")
    z = encode_longest(p, pipe, captions, options=zeros, drop_slots={"clip_g": [True, False]})
    assert z["prompt_embeds"].shape == plain["prompt_embeds"].shape
    assert not z["prompt_embeds"][0, :, width_l:].any() and not z["pooled_prompt_embeds"][0].any()
    assert torch.equal(z["prompt_embeds"][1], plain["prompt_embeds"][1])


# ------------------------------------------------------------------------------------ prompt weights
def test_prompt_weights_align_with_a_narrow_last_chunk() -> None:
    from te_align.encoding.weights import tokenize_slot_weighted

    pipe, p = _sdxl()
    slot = p.slot("clip_l")
    prompts = ["(red:1.5) cat", caption(78) + " (dog:2)"]
    ids, _, w = tokenize_slot_weighted(slot, pipe.tokenizer, prompts, options=LONGEST)
    assert torch.equal(
        ids, tokenize_slot(slot, pipe.tokenizer, ["red cat", caption(78) + " dog"], options=LONGEST)[0]
    )
    assert ids.shape == w.shape == (2, 77 + 6)  # 79 tokens: 75, then 4 + BOS + EOS
    assert [k for k in range(83) if w[0, k] != 1.0] == [1] and w[0, 1] == 1.5
    assert [k for k in range(83) if w[1, k] != 1.0] == [77 + 4] and w[1, 81] == 2.0


# ------------------------------------------------------------------------------------ training config
def _config(**data):
    from te_align.train.config import config_from_dict

    return config_from_dict({"model": {"path": "model"}, "data": {"path": "images", **data}})


def test_train_config_long_prompt_padding() -> None:
    from te_align.train.config import TrainError

    assert _config().data.long_prompt_padding == "max_length"
    assert _config(long_prompt_chunks=3, long_prompt_padding="longest").data.long_prompt_padding == "longest"
    with pytest.raises(TrainError) as e:
        _config(long_prompt_padding="longest")
    assert "\n" not in str(e.value) and "data.long_prompt_padding" in str(e.value)
    assert "data.long_prompt_chunks >= 1" in str(e.value)
    with pytest.raises(TrainError) as e:
        _config(long_prompt_chunks=3, long_prompt_padding="shortest")
    assert "\n" not in str(e.value) and "data.long_prompt_padding" in str(e.value)


def test_training_text_source_pads_each_batch_to_its_longest(tmp_path) -> None:
    from te_align.train.text import TextSource

    pipe, p = _sdxl()
    cfg = _config(long_prompt_chunks=16, long_prompt_padding="longest")
    source = TextSource(cfg, p, pipe, torch.device("cpu"), torch.float32, trainable=False, cache_dir=tmp_path)
    assert source.options == LONGEST and not source.use_cache
    for captions in ([caption(3), caption(20)], [caption(5), caption(160)]):
        with torch.no_grad():
            cond = source.batch(captions, torch.Generator().manual_seed(0))
        assert torch.equal(cond["prompt_embeds"], encode_longest(p, pipe, captions)["prompt_embeds"])
    assert not any(tmp_path.iterdir())  # nothing cached


def test_train_runs_with_longest_padding_and_dropout(tmp_path, tiny_model_folder) -> None:
    import math

    from te_align.tiny.datasets import make_squares_dataset
    from te_align.tiny.fit import profile_overrides
    from te_align.train import config_from_dict, train

    data = make_squares_dataset(tmp_path / "d", n=4)
    (data / "img00.txt").write_text(caption(160), encoding="utf-8")
    cfg = config_from_dict(
        {
            "model": {
                "path": str(tiny_model_folder("sdxl")),
                "profile": "sdxl",
                "profile_overrides": profile_overrides("sdxl"),
            },
            "data": {
                "path": str(data),
                "resolution": 32,
                "bucket_step": 16,
                "min_bucket": 16,
                "max_bucket": 64,
                "long_prompt_chunks": 3,
                "long_prompt_padding": "longest",
                "caption_dropout": 0.3,
                "encoder_dropout": {"clip_g": 0.5},
                "dropout_policy": "empty",
            },
            "train": {"max_steps": 2, "learning_rate": 1e-3, "checkpoint_every": 0, "batch_size": 2},
            "output": {"dir": str(tmp_path / "o")},
            "logging": {"progress": False},
        }
    )
    result = train(cfg)
    assert result.steps == 2 and all(math.isfinite(v) for _, v in result.losses)
    text_cache = tmp_path / "o" / "cache" / "text"
    assert not text_cache.exists() or not any(text_cache.rglob("*.safetensors"))
