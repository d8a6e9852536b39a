"""The klein world base's pretraining recipe (tools/world_pretrain, family klein, issue 49): the latents, conditioning
and denoiser call are Flux2KleinPipeline's own, the default configuration builds te_align.tiny.klein's transformer,
and a few steps run end to end through tools/world_build.py with a resumed run equal to an unbroken one."""

from __future__ import annotations

import json
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

import diffusers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # tools/ is not installed

from world_pretrain import build, diagnostics, recipe  # noqa: E402

import te_align  # noqa: E402
from te_align.tiny import klein, world  # noqa: E402

#: tiny sizes (the klein encoder's real 512-token window and 3 x 32 text width are kept)
TINY = {"train_size": 24, "vae_channels": [8, 16], "latent_channels": 4, "vae_steps": 2, "vae_batch": 4, "width": 32,
        "head_dim": 16, "layers": 1, "single_layers": 1, "batch": 4, "warmup": 2, "encode_batch": 24, "world": "simple",
        "vae_bn_renders": 16}  # fmt: skip


def write_klein_encoder_set(folder: Path, encoder: object) -> Path:
    """A klein encoder set as ``world_build.py klein-encoder`` writes it (an untrained encoder, an empty record)."""
    from world_pretrain.klein_encoder import save_klein_encoder

    return save_klein_encoder(encoder, folder, config={}, metrics={})


def test_klein_defaults_build_the_klein_transformer() -> None:
    cfg = recipe.PretrainConfig.for_family("klein")
    assert (cfg.caption_dropout_rate, cfg.spec.pipeline, cfg.spec.profile) == (0.1, "Flux2KleinPipeline", "flux2-klein-4b")
    assert recipe._klein_changes(cfg, 96) == {}
    model = recipe.new_transformer(cfg, 96, 0)
    assert dict(model.config) == dict(klein.klein_transformer().config)
    assert recipe.fitted_profile("klein").slots[0].tokenizer.max_length == 512  # no PROFILE_CHANGES: window 512
    small = recipe.PretrainConfig.for_family("klein", **{**TINY, "vae_channels": (8, 16)})
    assert recipe._klein_changes(small, 96) == {"in_channels": 16, "num_layers": 1, "num_single_layers": 1,
                                                "attention_head_dim": 16, "axes_dims_rope": (4, 4, 4, 4)}  # fmt: skip


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[recipe.PretrainConfig, dict, object]:
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("klein")
    tok = klein.tok.qwen3_instruct_tokenizer()
    write_klein_encoder_set(folder / "encoders-klein", klein.klein_text_encoder(tok))
    cfg = recipe.PretrainConfig.for_family("klein", **{**TINY, "vae_channels": (8, 16)}, steps=3,
                                           encoders=str(folder / "encoders-klein"))  # fmt: skip
    shared_vae = diffusers.AutoencoderKL(**recipe._vae_config(cfg)).eval()
    logs: list[dict] = []
    prep = recipe.prepare(cfg, logs.append, vae=shared_vae)
    return cfg, prep, logs


def test_latents_and_conditioning_are_the_pipelines(prepared) -> None:
    cfg, prep, logs = prepared
    vae = prep["vae"]
    assert type(vae).__name__ == "AutoencoderKLFlux2"
    bn = next(r for r in logs if r["phase"] == "vae_bn")
    assert (bn["renders"], bn["seed"]) == (16, 30_000) and bn == {**bn, **recipe.vae_bn_record(vae)}
    renders = world.make_dataset(16, 30_000, image_size=32, tokenizer=False)
    with torch.no_grad():
        z = vae.encode(recipe._images_to_tensor([s.image for s in renders])).latent_dist.mode()
    patched = diffusers.Flux2KleinPipeline._patchify_latents(z)
    assert torch.equal(vae.bn.running_mean, patched.mean(dim=(0, 2, 3)))
    assert torch.equal(vae.bn.running_var, patched.var(dim=(0, 2, 3), unbiased=False))
    pipe = recipe.build_pipeline(klein.klein_transformer(), vae, cfg, prep["components"])
    assert type(pipe).__name__ == "Flux2KleinPipeline" and pipe.config.is_distilled is False
    # the training latents are the pipeline's image latents (_encode_vae_image: argmax, patchify, BatchNorm)
    images = recipe._images_to_tensor([s.image for s in prep["train"]])  # one batch, as encode_latents encodes
    with torch.no_grad():
        ref = pipe._encode_vae_image(images, generator=None)
    assert prep["latents"].shape == (24, 16, 8, 8) and torch.equal(prep["latents"], ref)
    # the cached conditioning is the pipeline's encode_prompt, and the dropped caption its encoded ""
    table = prep["table"]
    with torch.no_grad():
        embeds, ids = pipe.encode_prompt(table.captions[:3], device="cpu")
        empty, _ = pipe.encode_prompt("", device="cpu")
    assert table.tensors["prompt_embeds"].shape == (24, 512, 96) and torch.equal(table.tensors["prompt_embeds"][:3], embeds)
    assert set(table.tensors) == {"prompt_embeds"} and torch.equal(table.shared["text_ids"], ids[:1])
    assert torch.equal(prep["captions"].empty["prompt_embeds"], empty[0]) and prep["captions"].rate == 0.1


def test_the_denoiser_is_called_as_the_pipeline_calls_it(prepared) -> None:
    """One Euler step of Flux2KleinPipeline from given latents equals x_t + (t_next - t) v with the training call's v."""
    cfg, prep, _ = prepared
    model = recipe.new_transformer(cfg, 96, 0).eval()
    pipe = recipe.build_pipeline(model, prep["vae"], cfg, prep["components"])
    x = torch.randn((1, 16, 8, 8), generator=torch.Generator().manual_seed(1))
    seen: list[torch.Tensor] = []

    def keep(p: object, i: int, t: torch.Tensor, kw: dict) -> dict:
        seen.append(kw["latents"])
        return {}

    caption = prep["table"].captions[0]
    with torch.no_grad():
        pipe(prompt=caption, latents=x, guidance_scale=1.0, height=32,
             width=32, num_inference_steps=2, output_type="latent", callback_on_step_end=keep)  # fmt: skip
        rows = prep["table"].rows(torch.tensor([0]))
        v = recipe._denoise(cfg, model, x, torch.tensor([1.0]), rows, prep["table"].shared)
    # sigmas 1, 0.5 (linspace(1, 1 / 2, 2), shift 1): after the first step x + (0.5 - 1) v
    assert torch.allclose(seen[0], diffusers.Flux2KleinPipeline._pack_latents(x) - 0.5 * v, atol=1e-6)
    gap = diagnostics.conditioning_gap(cfg, model, prep["latents"][:4], recipe.ConditioningTable(
        prep["table"].rows(torch.arange(4)), prep["table"].captions[:4], prep["table"].shared))  # fmt: skip
    assert set(gap) == {0.3, 0.6, 0.9}


def test_world_build_klein_runs_and_resumes_to_the_weights_of_one_run(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    build.main(["vae", "--out", str(tmp_path / "v"), "--eval-every", "0", "--config", json.dumps(TINY)])
    enc = write_klein_encoder_set(tmp_path / "encoders-klein", klein.klein_text_encoder())
    common = ["base", "klein", "--vae", str(tmp_path / "v" / "vae"), "--encoders", str(enc), "--steps", "3",
              "--eval-at", "2", "--eval-n", "1", "--sample-steps", "2", "--gap-every", "1", "--config", json.dumps(TINY)]  # fmt: skip
    build.main([*common, "--out", str(tmp_path / "one")])
    build.main([*common, "--out", str(tmp_path / "two"), "--stop-after", "1"])
    assert not (tmp_path / "two" / "model-2").exists()
    build.main([*common, "--out", str(tmp_path / "two"), "--resume"])
    for step in (2, 3):
        a = diffusers.Flux2Transformer2DModel.from_pretrained(str(tmp_path / "one" / f"model-{step}" / "transformer"))
        b = diffusers.Flux2Transformer2DModel.from_pretrained(str(tmp_path / "two" / f"model-{step}" / "transformer"))
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items()), step
    pipe = diffusers.Flux2KleinPipeline.from_pretrained(str(tmp_path / "one" / "model-3"))
    assert type(pipe.vae).__name__ == "AutoencoderKLFlux2" and pipe.config.is_distilled is False
    logs = [json.loads(x) for x in (tmp_path / "one" / "log.jsonl").read_text().splitlines()]
    bn = next(r for r in logs if r["phase"] == "vae_bn")
    assert bn["mean"] == [float(v) for v in pipe.vae.bn.running_mean] and bn["seed"] == 30_000
    evals = [r for r in logs if r["phase"] == "eval"]
    assert [(r["step"], r["samples"]) for r in evals] == [(2, 8), (3, 12)] and evals[0]["visible"]["prompts"] == 3.0
    assert [r["step"] for r in logs if r["phase"] == "gap"] == [1, 2, 3]
    # the shipped encoder is the set's, and te_align.encode by the fitted profile equals the saved pipeline's encoding
    with torch.no_grad():
        ref, _ = pipe.encode_prompt(["a red square"], device="cpu")
    assert torch.equal(te_align.encode(recipe.fitted_profile("klein"), ["a red square"], pipeline=pipe)["prompt_embeds"], ref)
    _ship_and_score(tmp_path, pipe, bn)


def _ship_and_score(tmp_path: Path, pipe: object, bn: dict) -> None:
    """tools/ship_base.py ships the run's model-3 into a world data root that te_align.tiny.bases.load reads (the
    shared autoencoder, the klein encoder set's Qwen3 as encoders/qwen3_klein, the statistics in pretrain.vae_bn), and
    benchmarks/base_eval/base_eval.py scores the pipeline folder as a klein candidate."""
    import ship_base

    from te_align.tiny import bases

    root = tmp_path / "world"
    ship_base.main(["--name", "klein", "--run", str(tmp_path / "one"), "--step", "3", "--dest", str(root), "--eval-n", "1"])
    info = bases.base_info("klein", root)
    assert info["pretrain"]["vae_bn"] == {k: bn[k] for k in ("renders", "seed", "mean", "var")}
    assert info["profile_overrides"] == recipe.fitted_overrides("klein") and info["sampling"] == ship_base.SAMPLING["klein"]
    assert info["denoiser_class"] == "Flux2Transformer2DModel" and info["pretrain"]["encoders"] == {
        "command": "python tools/world_build.py klein-encoder", "config": {}, "metrics": {}, "kind": "klein"}
    assert sorted({f.split("/")[0] + "/" + f.split("/")[1] for f in info["files"]}) == [
        "encoders/qwen3_klein", "klein/scheduler", "klein/transformer", "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors"]  # fmt: skip
    assert info["metrics"]["heldout"]["prompts"] == 3
    loaded = bases.load("klein", cache_dir=tmp_path / "cache", source=root)
    assert type(loaded).__name__ == "Flux2KleinPipeline" and loaded.config.is_distilled is False
    assert torch.equal(loaded.vae.bn.running_mean, pipe.vae.bn.running_mean)  # type: ignore[attr-defined]
    assert torch.equal(loaded.vae.bn.running_var, pipe.vae.bn.running_var)  # type: ignore[attr-defined]
    for name in ("transformer", "text_encoder"):
        a, b = getattr(loaded, name).state_dict(), getattr(pipe, name).state_dict()
        assert all(torch.equal(v, b[k].half().float()) for k, v in a.items()), name
    with torch.no_grad():
        ref, _ = loaded.encode_prompt(["a red square"], device="cpu")
    assert torch.equal(te_align.encode(bases.base_profile("klein", root), ["a red square"], pipeline=loaded)["prompt_embeds"], ref)
    # base_eval.py score --pipeline RUN/model-3 --label klein-3 --family klein (results under a temporary OUT)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "base_eval"))
    import base_eval

    out = base_eval.OUT
    base_eval.OUT = tmp_path / "base_eval"
    try:
        assert base_eval.main(["score", "--pipeline", str(tmp_path / "one" / "model-3"), "--label", "klein-3",
                               "--family", "klein", "--limit", "2"]) == 0  # fmt: skip
        # a second shard of the first four: only index 3 is left to it (0 and 1 are done, 2 is the other shard's)
        assert base_eval.main(["score", "--pipeline", str(tmp_path / "one" / "model-3"), "--label", "klein-3",
                               "--family", "klein", "--limit", "4", "--shard", "1/2"]) == 0  # fmt: skip
    finally:
        base_eval.OUT = out
    rows = [json.loads(x) for x in (tmp_path / "base_eval" / "candidates" / "klein-3.jsonl").read_text().splitlines()]
    assert [r["i"] for r in rows] == [0, 1, 3] and all(isinstance(r["read"], list) for r in rows)
    rows = rows[:2]
    assert [r["text"] for r in rows] == [p.text for p in base_eval.prompts()[:2]]


def test_klein_recipe_is_the_plans() -> None:
    chosen = build.RECIPES["klein"]
    cfg = recipe.PretrainConfig.for_family("klein", **chosen["config"], steps=chosen["steps"])
    assert (cfg.world, cfg.held_out, cfg.train_size, cfg.batch, cfg.lr, cfg.warmup, cfg.ema_decay, cfg.grad_clip,
            cfg.seed, cfg.steps) == ("simple", "colour=pink", 20000, 16, 1e-3, 200, 0.999, 1.0, 0, 4000)  # fmt: skip
    assert (chosen["eval_at"], chosen["gap_every"], cfg.vae_bn_renders) == ([2000], 500, 10000)


def test_world_build_all_klein_writes_its_encoder_chain_first(tmp_path: Path) -> None:
    """`all klein` writes the chain of klein encoder sets before anything else, each continued from the one before
    (amendment 13's 13b last); a set already written is kept, and a bad link stops it with one line."""
    chain = build.RECIPES["klein"]["klein_encoders"]
    assert [name for name, _ in chain] == ["encoders-klein", "encoders-klein-2", "encoders-klein-13b"]
    assert chain[2][1] == {"init": "encoders-klein-2", "insert": 0.1, "delete": 0.1, "case": 0.1, "lm_weight": 0.1}
    for name, _ in chain[:2]:  # written already: kept as they are (a manifest is what marks a finished set)
        (tmp_path / name).mkdir()
        (tmp_path / name / "encoders.json").write_text("{}")
    bad = [*chain[:2], ("encoders-klein-13b", {**chain[2][1], "lm_weight": "heavy"})]
    with pytest.raises(SystemExit, match=r"^world_build\.py klein-encoder --config: KleinEncoderConfig\.lm_weight: "
                                         r"expected a number >= 0, got 'heavy'$"):  # fmt: skip
        build.build_klein_chain(tmp_path, bad, 1)
    # the third set is continued from the second, which here is a manifest alone: refused before any training
    with pytest.raises(SystemExit, match=f"KleinEncoderConfig.init: {tmp_path / 'encoders-klein-2'} is not a klein"):
        build.build_klein_chain(tmp_path, chain, 1)
    assert not (tmp_path / "encoders-klein-13b" / "encoders.json").exists()


def test_decide_reads_every_draw_against_the_bases_targets(capsys):
    """`base_eval.py decide` on committed scores: the Chroma base that shipped on two draws ships, the klein
    candidate that missed does not, and a draw not scored leaves the decision open."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "base_eval"))
    import base_eval

    assert base_eval.main(["decide", "--label", "chroma-t5case-8000", "--seeds", "0", "2"]) == 0
    assert "colour 575/600 = 95.8% [93.9%, 97.2%], position 598/600 = 99.7%" in capsys.readouterr().out
    assert base_eval.main(["decide", "--label", "klein-8000"]) == 3
    assert "colour 512/600 = 85.3%" in capsys.readouterr().out
    assert base_eval.main(["decide", "--label", "chroma-t5case-8000", "--seeds", "0", "7"]) == 1
    assert "undecided" in capsys.readouterr().out
    # the table's verdicts read the same targets (a second TARGETS once shadowed them and broke the table)
    assert ("- **chroma**: colour >= 90%: met (interval clears it); position >= 80%: met (interval clears it); shape "
            "above chance.") in base_eval.table(base_eval.summary()).splitlines()  # fmt: skip
