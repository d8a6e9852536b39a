"""The world pretraining tools (tools/world_pretrain): encoder pretraining targets and determinism, the per-family
encoder sets, conditioning probes, and the one resumable command per part (tools/world_build.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # tools/ is not installed

from world_pretrain import build, diagnostics, encoders, recipe  # noqa: E402

from te_align.tiny import world  # noqa: E402
from te_align.tiny.encoders import family_components  # noqa: E402
from te_align.tiny.tokenizers import clip_tokenizer, t5_tokenizer  # noqa: E402


def _sample(caption_style: str, seed: int) -> world.Sample:
    return world.make_dataset(1, seed, image_size=None, tokenizer=False, space=world.SIMPLE,
                              style_mix={caption_style: 1.0})[0]  # fmt: skip


def test_caption_targets_follow_the_description_tokens() -> None:
    s = world.Sample(0, world.Scene((world.SceneObject("red", "circle", "top left", "large"),)),
                     "a large red circle at the top left", "short", "none", "start",
                     (world.ObjectSpan(2, 34, 0, 0),), 0, None)  # fmt: skip
    clip = clip_tokenizer()
    got = encoders.caption_targets([s], clip, 77, causal=True)
    ids = got["input_ids"][0].tolist()
    # <bos> a large red circle at the top left <eos> pad...: the description is tokens 2..8
    assert clip.decode(ids[2:9]) == "large red circle at the top left" and ids[9] == 49407
    target = [list(world.COLOURS).index("red"), world.SHAPES.index("circle"), world.POSITIONS.index("top left"),
              list(world.SIZES).index("large")]  # fmt: skip
    attrs = got["attrs"][0]
    assert (attrs[:8] == -1).all() and (attrs[8:] == torch.tensor(target)).all()  # from the description's last token on
    assert not got["inside"].any()  # CLIP has no span flags
    t5 = t5_tokenizer()
    got = encoders.caption_targets([s], t5, 256, causal=False)
    _n, spans = world.token_spans(t5, s.caption, [(2, 34)])
    a, b = spans[0].token_start, spans[0].token_end
    assert (got["attrs"][0, a:b] == torch.tensor(target)).all() and (got["attrs"][0, :a] == -1).all()
    assert (got["attrs"][0, b:] == -1).all() and got["inside"][0].tolist() == [float(a <= i < b) for i in range(256)]
    # a description cut by truncation teaches nothing
    cut = encoders.caption_targets([s], t5, b, causal=False)
    assert (cut["attrs"] == -1).all() and not cut["inside"].any()


def test_encoder_pretraining_is_deterministic_and_leaves_unseen_words_alone() -> None:
    torch.set_num_threads(1)
    cfg = encoders.EncoderConfig(captions=48, steps=3, batch=8, t5_lengths=(77, 154))
    a, metrics = encoders.pretrain_encoders(cfg)
    b, _ = encoders.pretrain_encoders(cfg)
    for key in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        sa, sb = a[key].state_dict(), b[key].state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), key
        assert all(torch.equal(v, v.half().float()) for v in sa.values())  # float16 values, what is shipped
    assert set(metrics["heldout_accuracy"]) == {"clip_l_penultimate", "clip_l_last", "clip_l_embeds", "clip_g_penultimate",
                                                "clip_g_embeds", "t5"}  # fmt: skip
    fresh = family_components("sd3")
    emb = "text_model.embeddings.token_embedding.weight"
    pink = clip_tokenizer()("pink", add_special_tokens=False).input_ids
    before, after = fresh["text_encoder"].state_dict()[emb], a["text_encoder"].state_dict()[emb]
    assert torch.equal(after[pink], before[pink].half().float())  # the held-out word is never trained
    red = clip_tokenizer()("red", add_special_tokens=False).input_ids
    assert not torch.equal(after[red], before[red].half().float())  # a world word is


def test_components_for_every_family_share_one_encoder_set(tmp_path: Path) -> None:
    comps = family_components("sd3")
    encoders.save_encoders(comps, tmp_path, config={}, metrics={})
    shared = encoders.load_encoders(tmp_path)
    for family in ("sd3", "flux", "sdxl", "sd15"):
        got = encoders.components_for(family, shared)
        ref = family_components(family)
        assert {k: type(v).__name__ for k, v in got.items()} == {k: type(v).__name__ for k, v in ref.items()}
        assert [got[k].pad_token for k in got if k.startswith("tokenizer")] == [ref[k].pad_token for k in ref if k.startswith("tokenizer")]
        tower = got["text_encoder"].state_dict()
        clip_l = {k.removeprefix("text_model."): v for k, v in comps["text_encoder"].state_dict().items()}
        assert all(torch.equal(v, clip_l[k.removeprefix("text_model.")]) for k, v in tower.items())
    assert encoders.components_for("sd3", shared)["text_encoder_3"] is shared["t5"]
    chroma = encoders.components_for("chroma", shared)  # T5 alone, the one SD3 and Flux use
    ref = family_components("chroma")
    assert {k: type(v).__name__ for k, v in chroma.items()} == {k: type(v).__name__ for k, v in ref.items()}
    assert chroma["text_encoder"] is shared["t5"] and chroma["tokenizer"].pad_token == ref["tokenizer"].pad_token


def test_probes_read_what_the_conditioning_carries() -> None:
    torch.set_num_threads(1)
    samples = world.make_dataset(60, 1, image_size=None, tokenizer=False, space=world.SIMPLE)
    comps = family_components("sd3")
    table = recipe.encode_captions(recipe.fitted_profile("sd3"), comps, [s.caption for s in samples])
    res = diagnostics.probe_conditioning(table, samples, 40, steps=20)
    assert set(res) == {"pooled", "mean", "attention"} and set(res["pooled"]) == {"colour", "shape", "position", "size"}
    assert all(0.0 <= v <= 1.0 for r in res.values() for v in r.values())
    again = diagnostics.probe_conditioning(table, samples, 40, steps=20)
    assert again == res


def test_visible_means_described_inside_some_window() -> None:
    prof = recipe.fitted_profile("sdxl")
    short = _sample("short", 0)
    long_ = next(s for s in world.make_dataset(40, 3, image_size=None, space=world.SIMPLE, style_mix={"long": 1.0})
                 if s.placement == "end" and s.spans[0].token_start > 300)  # fmt: skip
    assert recipe.visible(prof, [short, long_]) == [True, False]
    assert recipe.visible(recipe.fitted_profile("sd3"), [long_]) == [long_.spans[0].token_end <= 255]


TINY = {"train_size": 32, "vae_channels": [8, 16], "latent_channels": 4, "vae_steps": 2, "vae_batch": 4, "width": 32,
        "head_dim": 16, "layers": 2, "batch": 4, "warmup": 2, "encode_batch": 32, "world": "simple"}  # fmt: skip


def test_world_build_base_resumes_to_the_weights_of_one_run(tmp_path: Path) -> None:
    build.main(["vae", "--out", str(tmp_path / "v"), "--eval-every", "0", "--config", json.dumps(TINY)])
    vae = tmp_path / "v" / "vae"
    common = ["base", "sd3", "--vae", str(vae), "--steps", "6", "--eval-at", "4", "--eval-n", "1", "--sample-steps", "2",
              "--gap-every", "2", "--config", json.dumps(TINY)]  # fmt: skip
    build.main([*common, "--out", str(tmp_path / "one")])
    build.main([*common, "--out", str(tmp_path / "two"), "--stop-after", "3"])
    assert not (tmp_path / "two" / "model-4").exists()
    build.main([*common, "--out", str(tmp_path / "two"), "--resume"])
    for step in (4, 6):
        a = diffusers.SD3Transformer2DModel.from_pretrained(str(tmp_path / "one" / f"model-{step}" / "transformer"))
        b = diffusers.SD3Transformer2DModel.from_pretrained(str(tmp_path / "two" / f"model-{step}" / "transformer"))
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items()), step
    logs = [json.loads(x) for x in (tmp_path / "two" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logs if r["phase"] in ("stopped", "resume")] == [3, 3]
    evals = [r for r in logs if r["phase"] == "eval"]
    assert [(r["step"], r["samples"]) for r in evals] == [(4, 16), (6, 24)] and "visible" in evals[0]
    # a finished run continues to more steps with the weights of a longer run (warm-up then constant rate)
    shorter = [*common[:5], "4", *common[6:]]
    build.main([*shorter, "--out", str(tmp_path / "three")])
    build.main([*common, "--out", str(tmp_path / "three"), "--resume"])
    a = diffusers.SD3Transformer2DModel.from_pretrained(str(tmp_path / "one" / "model-6" / "transformer"))
    b = diffusers.SD3Transformer2DModel.from_pretrained(str(tmp_path / "three" / "model-6" / "transformer"))
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    with pytest.raises(SystemExit, match="saved at step 6, past --steps 4"):
        build.main([*shorter, "--out", str(tmp_path / "three"), "--resume"])
    # another configuration does not resume from this checkpoint
    with pytest.raises(SystemExit, match="saved for another configuration"):
        build.main([*common[:-1], json.dumps({**TINY, "lr": 2e-3}), "--out", str(tmp_path / "two"), "--resume"])


def test_curriculum_draws_tag_captions_first() -> None:
    cfg = recipe.PretrainConfig(train_size=40, batch=4, curriculum_tags_steps=3)
    styles = ["tags" if i % 5 == 0 else "long" for i in range(40)]
    pool = torch.tensor([i for i, s in enumerate(styles) if s == "tags"])
    picked = [recipe._batch_indices(cfg, step, 40, pool) for step in range(3)]
    assert all(styles[int(i)] == "tags" for idx in picked for i in idx)
    later = recipe._batch_indices(cfg, 3, 40, torch.arange(40))
    assert later.tolist() == torch.randperm(40, generator=torch.Generator().manual_seed(0))[12:16].tolist()


def _shipped() -> list[str]:
    from te_align.tiny import bases

    return bases.shipped()


@pytest.mark.parametrize("name", _shipped())
def test_the_one_command_rebuilds_the_shipped_recipe(name: str) -> None:
    """`world_build.py all FAMILY` trains exactly the configuration the shipped base records (paths aside)."""
    from te_align.tiny import bases

    assert name in build.RECIPES, f"{name} is shipped without a recipe in world_pretrain.build.RECIPES"
    manifest = bases.data_root() / name / bases.MANIFEST
    shipped = json.loads(manifest.read_text(encoding="utf-8"))["pretrain"]
    chosen = build.RECIPES[name]
    cfg = recipe.PretrainConfig.for_family(name, **chosen["config"], steps=chosen["steps"]).as_dict()
    # fields added after the base was shipped (chroma's approximator sizes) are at the defaults it had
    complete = recipe.complete_config(shipped["config"])
    recorded = {k: v for k, v in complete.items() if k in cfg and k != "encoders"}
    assert {k: v for k, v in cfg.items() if k != "encoders"} == recorded
    assert shipped["steps"] == chosen["steps"] and shipped["samples_seen"] == chosen["steps"] * cfg["batch"]
    if "encoders" in chosen:  # a base with its own encoder set: continued from the shared one as the recipe says
        own = shipped["encoders"]["config"]
        assert own.pop("init") and own == encoders.EncoderConfig(**chosen["encoders"]).as_dict()
    if "klein_encoders" in chosen:  # its own Qwen3, a chain of sets: every link trained as the recipe writes it
        from world_pretrain.klein_encoder import KleinEncoderConfig

        record = shipped["encoders"]
        for _, link in reversed(chosen["klein_encoders"]):
            own = dict(record["config"])
            assert bool(own.pop("init", "")) == ("init" in link)
            assert own == KleinEncoderConfig(**{k: v for k, v in link.items() if k != "init"}).as_dict()
            record = record.get("init_record")
        assert record is None  # nothing before the chain's first set


def test_encoder_continuation_trains_only_the_named_encoder(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    first, metrics = encoders.pretrain_encoders(encoders.EncoderConfig(captions=32, steps=2, batch=8, t5_lengths=(77,)))
    encoders.save_encoders(first, tmp_path, config={}, metrics=metrics)
    cfg = encoders.EncoderConfig(captions=32, steps=2, batch=8, t5_lengths=(77,), init=str(tmp_path), train_only=("t5",))
    assert cfg.as_dict()["train_only"] == ["t5"] and "init" not in encoders.EncoderConfig().as_dict()
    cont, metrics = encoders.pretrain_encoders(cfg)
    assert set(metrics["heldout_accuracy"]) == {"t5"}
    for key in ("text_encoder", "text_encoder_2"):  # the CLIPs are the init's, value for value
        sa, sb = first[key].state_dict(), cont[key].state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), key
    sa, sb = first["text_encoder_3"].state_dict(), cont["text_encoder_3"].state_dict()
    assert not all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ValueError, match="train_only: unknown encoder"):
        encoders.EncoderConfig(train_only=("bert",))
    with pytest.raises(ValueError, match="is not an encoder set"):
        encoders.EncoderConfig(init=str(tmp_path / "nowhere"))


def test_recase_capitalises_word_starts_only_and_keeps_spans() -> None:
    from te_align.tiny import world

    samples = world.make_dataset(200, 0, space=world.SPACES["simple"], image_size=None, tokenizer=False, split="all")
    assert encoders.recase(samples, 0.0, 1) == list(samples)
    out = encoders.recase(samples, 0.5, 1)
    assert out == encoders.recase(samples, 0.5, 1)  # seeded
    changed = 0
    for a, b in zip(samples, out, strict=True):
        assert len(a.caption) == len(b.caption) and a.spans == b.spans
        for i, (ca, cb) in enumerate(zip(a.caption, b.caption, strict=True)):
            if ca != cb:  # only a lower-case letter that starts a word, made upper-case
                assert ca.islower() and cb == ca.upper() and (i == 0 or not (a.caption[i - 1].isalpha() or a.caption[i - 1] == "'"))
                changed += 1
    starts = sum(len(re.findall(r"(?<![A-Za-z'])[a-z]", s.caption)) for s in samples)
    assert 0.45 * starts < changed < 0.55 * starts, (changed, starts)  # about half the lower-case word starts
    one = world.make_dataset(1, 0, space=world.SPACES["simple"], image_size=None, tokenizer=False, split="all")
    assert [s.caption for s in encoders.recase(one, 1.0, 0)] == [
        "A Cyan Triangle In The Top Center On A Plain White Background"
    ]
    assert encoders.EncoderConfig(case=0.1).as_dict()["case"] == 0.1 and "case" not in encoders.EncoderConfig().as_dict()
    with pytest.raises(ValueError, match=r"case: 1\.5 is not a probability"):
        encoders.EncoderConfig(case=1.5)
