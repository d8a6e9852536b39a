"""The klein base's text encoder pretraining (tools/world_pretrain/klein_encoder.py) at a tiny size: captions written
and padded exactly as Flux2KleinPipeline writes them, the read-out targets, a resumed run equal to an unbroken one."""

from __future__ import annotations

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
