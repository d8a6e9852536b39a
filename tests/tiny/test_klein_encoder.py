"""The klein base's text encoder pretraining (tools/world_pretrain/klein_encoder.py) at a tiny size: captions written
and padded exactly as Flux2KleinPipeline writes them, the read-out targets, a resumed run equal to an unbroken one."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from te_align.tiny.pipelines import missing_pipeline  # noqa: E402

_REASON = missing_pipeline("flux2-klein")  # diffusers < 0.37 (the trainers' old environments) has no klein classes
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # tools/ is not installed

from world_pretrain import klein_encoder as ke  # noqa: E402
from world_pretrain.encoders import _attr_index  # noqa: E402

TINY = ke.KleinEncoderConfig(captions=24, steps=4, batch=4, warmup=2, checkpoint_every=100)


def _samples(n: int = 6) -> list:
    return ke._samples(TINY, n, 5)


def test_ids_and_mask_are_the_pipelines_and_its_taps_read_them():
    import diffusers

    from te_align.tiny import tokenizers as tok
    from te_align.tiny.klein import klein_text_encoder

    torch.set_num_threads(1)
    tokenizer = tok.qwen3_instruct_tokenizer()
    samples = _samples(3)
    data = ke.klein_targets(samples, tokenizer)
    encoder = klein_text_encoder(tokenizer)
    with torch.no_grad():
        ours = encoder(input_ids=data["input_ids"], attention_mask=data["attention_mask"], output_hidden_states=True)
        theirs = diffusers.Flux2KleinPipeline._get_qwen3_prompt_embeds(encoder, tokenizer, [s.caption for s in samples])
    stacked = torch.stack([ours.hidden_states[k] for k in (9, 18, 27)], dim=2).flatten(2)
    assert data["input_ids"].shape == (3, 512)
    assert torch.equal(stacked, theirs)
    assert data["lengths"].tolist() == [len(tokenizer(ke.templated(tokenizer, s.caption))["input_ids"]) for s in samples]


def test_targets_start_where_a_description_ends_and_run_through_the_padding():
    from te_align.tiny import tokenizers as tok
    from te_align.tiny import world

    tokenizer = tok.qwen3_instruct_tokenizer()
    sample = next(s for s in _samples(40) if len(s.objects) == 1)
    data = ke.klein_targets([sample], tokenizer)
    text = ke.templated(tokenizer, sample.caption)
    at = text.index(sample.caption)
    span = sample.spans[0]
    _, (tokens,) = world.token_spans(tokenizer, text, [(at + span.char_start, at + span.char_end)])
    attrs = data["attrs"][0].long()
    expected = torch.tensor(_attr_index(sample.objects[0]))
    assert bool((attrs[: tokens.token_end - 1] == -1).all())
    assert bool((attrs[tokens.token_end - 1 :] == expected).all())  # the description's end, the suffix, the padding
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off, as the pipeline


def test_a_resumed_run_equals_an_unbroken_one(tmp_path):
    torch.set_num_threads(1)
    whole = ke.pretrain_klein_encoder(TINY, tmp_path / "whole", heldout=4)
    assert ke.pretrain_klein_encoder(TINY, tmp_path / "broken", stop_after=2, heldout=4) is None
    assert (tmp_path / "broken" / ke.CHECKPOINT).is_file()
    resumed = ke.pretrain_klein_encoder(TINY, tmp_path / "broken", heldout=4)
    assert whole is not None and resumed is not None
    a, b = whole[0].state_dict(), resumed[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert whole[1]["heldout"] == resumed[1]["heldout"]
    start = ke._initial(TINY)[1].state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it trained
    assert all(torch.equal(v, v.half().float()) for v in a.values())  # float16 values, as shipped


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path):
    ke.pretrain_klein_encoder(TINY, tmp_path, stop_after=2, heldout=4)
    other = ke.KleinEncoderConfig(captions=24, steps=4, batch=4, warmup=2, checkpoint_every=100, lr=2e-3)
    with pytest.raises(SystemExit, match="written by another configuration"):
        ke.pretrain_klein_encoder(other, tmp_path, heldout=4)


def test_saved_set_loads_frozen(tmp_path):
    from te_align.tiny.klein import klein_text_encoder

    model = klein_text_encoder()
    ke.save_klein_encoder(model, tmp_path, config=TINY.as_dict(), metrics={})
    loaded = ke.load_klein_encoder(tmp_path)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_vary_inserts_and_deletes_other_words_only_and_carries_the_spans():
    samples = _samples(60)
    assert ke.vary(samples, 0.0, 0.0, 1) == list(samples)
    varied = ke.vary(samples, 0.2, 0.2, 1)
    assert varied == ke.vary(samples, 0.2, 0.2, 1)  # seeded
    assert varied != ke.vary(samples, 0.2, 0.2, 2)
    changed = 0
    for old, new in zip(samples, varied, strict=True):
        assert new.objects == old.objects
        words = [w.lower() for w in ke._WORD.findall(new.caption)]
        old_words = [w.lower() for w in ke._WORD.findall(old.caption)]
        # the attribute words are the same, in the same order
        assert [w for w in words if w in ke.ATTRIBUTE_WORDS] == [w for w in old_words if w in ke.ATTRIBUTE_WORDS]
        for a, b in zip(old.spans, new.spans, strict=True):
            keep = [w for w in ke._WORD.findall(old.caption[a.char_start : a.char_end]) if w in ke.ATTRIBUTE_WORDS]
            got = ke._WORD.findall(new.caption[b.char_start : b.char_end])
            assert [w for w in got if w in ke.ATTRIBUTE_WORDS] == keep
            assert got[0] in ke.ATTRIBUTE_WORDS and got[-1] in ke.ATTRIBUTE_WORDS  # a span still starts and ends on one
        assert "  " not in new.caption and new.caption == new.caption.strip()
        changed += new.caption != old.caption
    assert changed > 40


def test_vary_by_hand():
    from te_align.tiny.world.captions import ObjectSpan

    sample = _samples(1)[0]
    text = "a drawing of a red circle in the top left on a plain white background"
    span = (text.index("red"), text.index(" on a"))
    one = dataclasses.replace(sample, caption=text, spans=(ObjectSpan(*span, 0, 0),))
    # delete everything deletable, insert nothing: only the attribute words and the punctuation-free gaps remain
    (out,) = ke.vary([one], 0.0, 1.0, 0)
    assert out.caption == "red circle top left"
    assert out.caption[out.spans[0].char_start : out.spans[0].char_end] == "red circle top left"
    (ins,) = ke.vary([one], 1.0, 0.0, 0)
    words = ins.caption.split()
    assert words[::2] == text.split() and all(w not in ke.ATTRIBUTE_WORDS for w in words[1::2])
    inside = ins.caption[ins.spans[0].char_start : ins.spans[0].char_end].split()
    assert inside[0] == "red" and inside[-1] == "left" and len(inside) == 11  # 6 words, 5 inserted between them


def test_varied_and_recased_captions_give_the_same_targets_per_object():
    from te_align.tiny import tokenizers as tok

    tokenizer = tok.qwen3_instruct_tokenizer()
    sample = next(s for s in _samples(40) if len(s.objects) == 1)
    (varied,) = ke.vary([sample], 0.3, 0.3, 4)
    data = ke.klein_targets([varied], tokenizer)
    attrs = data["attrs"][0].long()
    real = int(data["lengths"][0])
    assert bool((attrs[real - 1] == torch.tensor(_attr_index(sample.objects[0]))).all())
    cfg = ke.KleinEncoderConfig(insert=0.1, delete=0.1, case=0.1)
    assert cfg.as_dict()["insert"] == 0.1 and "init" not in cfg.as_dict()
    assert "insert" not in TINY.as_dict() and "case" not in TINY.as_dict()  # the older manifests' form
    with pytest.raises(ValueError, match=r"KleinEncoderConfig\.delete"):
        ke.KleinEncoderConfig(delete=1.5)
