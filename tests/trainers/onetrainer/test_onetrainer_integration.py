"""OneTrainer hooks, probe rows and data loader against a real checkout (TE_ALIGN_ONETRAINER_DIR).

OneTrainer's modules run on tiny encoders (:mod:`te_align.tiny`); optional packages its modules import at
the top and the text path never calls (gguf, parse, torchvision for mgds' image modules, ...) are stood in
for (:mod:`te_align.probe._stubs`). The data loader tests also need OneTrainer's data loader package
``mgds`` (Nerogar/mgds, installed with OneTrainer).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import random
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "TE_ALIGN_ONETRAINER_DIR"
ROOT = os.environ.get(ENV)
pytestmark = pytest.mark.skipif(not ROOT, reason=f"set {ENV} to a Nerogar/OneTrainer checkout")
_LOADER_MISSING = [why for why, missing in (
    (f"set {ENV} to a Nerogar/OneTrainer checkout", not ROOT),
    ("OneTrainer's data loader package mgds (Nerogar/mgds) is not importable", importlib.util.find_spec("mgds") is None),
) if missing]  # fmt: skip
NEEDS_MGDS = pytest.mark.skipif(bool(_LOADER_MISSING), reason="; ".join(_LOADER_MISSING))


@pytest.fixture(scope="module")
def adapter() -> Iterator[Any]:
    from te_align.trainers.onetrainer.probe import OneTrainer

    a = OneTrainer(ROOT)
    with a.session():
        yield a


@pytest.fixture(autouse=True)
def _clean_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from te_align.trainers.onetrainer import hooks as ot

    for var in ("TE_ALIGN", "TE_ALIGN_PROFILE", "TE_ALIGN_OVERRIDES"):
        monkeypatch.delenv(var, raising=False)
    yield
    ot.uninstall()


def test_every_target_resolves_on_the_checkout(adapter: Any) -> None:
    from te_align.trainers.onetrainer.hooks import OneTrainerHook
    from te_align.trainers.onetrainer.patch import static_problems

    assert static_problems(Path(ROOT)) == []
    parts = ("models", "loader", "cache") if importlib.util.find_spec("mgds") else ("models",)
    assert len(OneTrainerHook(parts=parts).check()) == (19 if len(parts) == 3 else 9)


# ---------------------------------------------------------------------------------------- probe rows
#: Without hooks: (tensor, OneTrainer's per-prompt shape, the profile's) on the tiny encoders (width 96).
DEVIATIONS = {
    "sd3-medium": ("prompt_embeds", (154, 96), (333, 96)),  # T5 at 77 (77 + 77) vs 256 (77 + 256)
    "sd35-large": ("prompt_embeds", (154, 96), (333, 96)),
    "flux-dev": ("prompt_embeds", (77, 96), (512, 96)),  # text_encoder_2_sequence_length default 77 vs 512
    "pixart-sigma": ("prompt_embeds", (120, 96), (300, 96)),  # T5 at 120 vs 300
}


@pytest.mark.parametrize("profile", ["sd15", "sd21", "sdxl", "sd3-medium", "sd35-large", "flux-dev", "chroma",
                                     "pixart-sigma", "sana", "hidream", "qwen-image"])  # fmt: skip
def test_probe_without_and_with_hooks(adapter: Any, profile: str) -> None:
    from te_align.probe.core import compare

    case = adapter.case(profile)
    plain, _ = compare(case)
    by_name = {t.name: t for t in plain}
    if profile in DEVIATIONS:
        name, trainer_shape, profile_shape = DEVIATIONS[profile]
        t = by_name[name]
        assert (t.trainer_shape, t.profile_shape) == (trainer_shape, profile_shape)
        assert len(t.differing) == t.compared
    elif profile == "sana":  # same length (300), but no complex-human instruction in front
        t = by_name["prompt_embeds"]
        assert t.shape_match and t.mean_cosine is not None and t.mean_cosine < 0.5
        assert len(t.differing) == t.compared
    elif profile == "hidream":  # T5 without its attention mask; the Llama layers and pooled CLIPs match
        t = by_name["prompt_embeds_t5"]
        assert t.shape_match and t.mean_cosine is not None and t.mean_cosine < 0.9
        assert by_name["prompt_embeds_llama3"].identical
    elif profile == "qwen-image":  # pruned to the batch's longest mask, padded to 16; the profile re-pads to it
        t = by_name["prompt_embeds"]
        assert (t.trainer_shape, t.profile_shape) == ((32, 32), (18, 32))
    elif profile == "chroma":  # pruned to the batch's longest mask (padded to 16), the profile keeps 512
        assert by_name["prompt_embeds"].profile_shape == (512, 96) and not by_name["prompt_embeds"].shape_match
    else:  # SD 1.5/2.x and SDXL hidden states: OneTrainer matches the pipeline
        assert by_name["prompt_embeds"].identical
    with adapter.hooked(case.profile):
        hooked, _ = compare(case)
    for t in hooked:
        if t.name == "text_ids":  # built by OneTrainer's transformer call, not by encode_text
            assert t.trainer_shape is None
        else:
            assert t.identical, t.summary()


# ---------------------------------------------------------------------------------------- data loader
def _loader_modules(adapter: Any, profile: str) -> tuple[Any, Any, Any, list[Any], Any]:
    from te_align.trainers.onetrainer.probe import tiny_components

    prof, toks, encs = tiny_components(profile)
    model = adapter.model(profile, toks, encs)
    cls_name = {"sd3-medium": "StableDiffusion3BaseDataLoader", "pixart-sigma": "PixArtAlphaBaseDataLoader",
                "hidream": "HiDreamBaseDataLoader", "qwen-image": "QwenBaseDataLoader"}[profile]  # fmt: skip
    loader_cls = getattr(importlib.import_module(f"modules.dataLoader.{cls_name}"), cls_name)
    if profile == "hidream":  # the data loader reads which Llama layers the transformer uses from its config
        layers = list(range(encs["text_encoder_4"].config.num_hidden_layers))
        model.transformer = types.SimpleNamespace(config=types.SimpleNamespace(llama_layers=layers))
    config = importlib.import_module("modules.util.config.TrainConfig").TrainConfig.default_values()
    config.model_type = model.model_type
    for part in ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4"):  # frozen: text is cached
        getattr(config, part).train = False
    modules = loader_cls._preparation_modules(object.__new__(loader_cls), config, model)
    return prof, toks, encs, modules, model


def _run_text_modules(modules: list[Any], data: dict[str, Any]) -> dict[str, Any]:
    """OneTrainer's Tokenize and Encode*Text modules in pipeline order, upstream items from ``data``."""
    import torch

    out = dict(data)
    for m in modules:
        name = type(m).__name__
        if name in ("Tokenize", "PadMaskedTokens") or (name.startswith("Encode") and "Text" in name):
            m._get_previous_item = lambda variation, name, index: out[name]
            m.pipeline = types.SimpleNamespace(device=torch.device("cpu"))  # what mgds' LoadingPipeline gives
            with torch.no_grad():
                out.update(m.get_item(0, 0))
    return out


@NEEDS_MGDS
def test_sd3_data_loader_unhooked_tokenizes_t5_at_77(adapter: Any) -> None:
    prompt = "a photo of a cat on a mat"
    _, _, _, modules, _ = _loader_modules(adapter, "sd3-medium")
    out = _run_text_modules(modules, {"prompt_1": prompt, "prompt_2": prompt, "prompt_3": prompt})
    assert out["tokens_3"].shape == (77,)
    assert out["text_encoder_3_hidden_state"].shape == (77, 96)


@NEEDS_MGDS
def test_sd3_data_loader_and_encode_text_hooked_equal_te_align_encode(adapter: Any) -> None:
    import torch

    import te_align
    from te_align.trainers.onetrainer import hooks as ot
    from te_align.trainers.onetrainer.probe import tiny_components

    prompt = "a photo of a cat on a mat, highly detailed"
    ot.install(profile=tiny_components("sd3-medium")[0])
    prof, toks, encs, modules, model = _loader_modules(adapter, "sd3-medium")
    out = _run_text_modules(modules, {"prompt_1": prompt, "prompt_2": prompt, "prompt_3": prompt})
    want = te_align.encode(prof, [prompt], tokenizers=toks, text_encoders=encs)
    assert out["tokens_3"].shape == (256,)
    batch = {k: v[None] for k, v in out.items() if hasattr(v, "shape")}
    with torch.no_grad():
        got = model.encode_text(
            train_device=torch.device("cpu"), batch_size=1, rand=random.Random(0),
            tokens_1=batch["tokens_1"], tokens_2=batch["tokens_2"], tokens_3=batch["tokens_3"],
            tokens_mask_1=batch["tokens_mask_1"], tokens_mask_2=batch["tokens_mask_2"], tokens_mask_3=batch["tokens_mask_3"],
            text_encoder_1_output=batch["text_encoder_1_hidden_state"], pooled_text_encoder_1_output=batch["text_encoder_1_pooled_state"],
            text_encoder_2_output=batch["text_encoder_2_hidden_state"], pooled_text_encoder_2_output=batch["text_encoder_2_pooled_state"],
            text_encoder_3_output=batch["text_encoder_3_hidden_state"],
        )  # fmt: skip
        emb, pooled = model.combine_text_encoder_output(*got)
    assert torch.equal(emb, want["prompt_embeds"])
    assert torch.equal(pooled, want["pooled_prompt_embeds"])


@NEEDS_MGDS
def test_hidream_data_loader_and_encode_text_hooked_equal_te_align_encode(adapter: Any) -> None:
    import torch

    import te_align
    from te_align.trainers.onetrainer import hooks as ot
    from te_align.trainers.onetrainer.probe import tiny_components

    prompt = "a photo of a cat on a mat, highly detailed"
    ot.install(profile=tiny_components("hidream")[0])
    prof, toks, encs, modules, model = _loader_modules(adapter, "hidream")
    out = _run_text_modules(modules, {f"prompt_{i}": prompt for i in range(1, 5)})
    assert isinstance(out["text_encoder_4_hidden_state"], list)  # one (L, D) tensor per Llama layer, as mgds caches
    want = te_align.encode(prof, [prompt], tokenizers=toks, text_encoders=encs)
    one = {k: v[None] for k, v in out.items() if hasattr(v, "shape")}
    with torch.no_grad():
        got = model.encode_text(
            train_device=torch.device("cpu"), batch_size=1, rand=random.Random(0),
            tokens_1=one["tokens_1"], tokens_2=one["tokens_2"], tokens_3=one["tokens_3"], tokens_4=one["tokens_4"],
            tokens_mask_3=one["tokens_mask_3"], tokens_mask_4=one["tokens_mask_4"],
            pooled_text_encoder_1_output=one["text_encoder_1_pooled_state"],
            pooled_text_encoder_2_output=one["text_encoder_2_pooled_state"],
            text_encoder_3_output=one["text_encoder_3_hidden_state"],
            text_encoder_4_output=[t[None] for t in out["text_encoder_4_hidden_state"]],
        )  # fmt: skip
        t5, llama, pooled = model.combine_text_encoder_output(*got)
    assert torch.equal(t5, want["prompt_embeds_t5"])
    assert torch.equal(llama, want["prompt_embeds_llama3"])
    assert torch.equal(pooled, want["pooled_prompt_embeds"])


@NEEDS_MGDS
def test_qwen_data_loader_cache_and_encode_text_hooked_equal_te_align_encode(adapter: Any) -> None:
    import torch
    from mgds.pipelineModules.PadMaskedTokens import PadMaskedTokens

    import te_align
    from te_align.trainers.onetrainer import hooks as ot
    from te_align.trainers.onetrainer.probe import tiny_components

    prompts = ["a photo of a cat on a mat", "a red house"]
    ot.install(profile=tiny_components("qwen-image")[0])
    prof, toks, encs, modules, model = _loader_modules(adapter, "qwen-image")
    # OneTrainer's cache step after encoding pads tokens, mask and hidden states to 512 (QwenBaseDataLoader)
    pad = PadMaskedTokens(tokens_name="tokens", tokens_mask_name="tokens_mask", hidden_state_name="text_encoder_hidden_state",
                          max_length=512)  # fmt: skip
    items = [_run_text_modules([*modules, pad], {"prompt": p}) for p in prompts]
    assert items[0]["tokens"].shape == (512,) and items[0]["text_encoder_hidden_state"].shape == (512, 32)
    batch = {k: torch.stack([it[k] for it in items]) for k in ("tokens", "tokens_mask", "text_encoder_hidden_state")}
    with torch.no_grad():
        emb, mask = model.encode_text(train_device=torch.device("cpu"), batch_size=2, tokens=batch["tokens"],
                                      tokens_mask=batch["tokens_mask"], text_encoder_output=batch["text_encoder_hidden_state"])  # fmt: skip
    for i, p in enumerate(prompts):  # each caption was encoded alone (as cached): compare with encode of it alone
        want = te_align.encode(prof, [p], tokenizers=toks, text_encoders=encs)
        n = want["prompt_embeds"].shape[1]
        assert torch.equal(emb[i, :n], want["prompt_embeds"][0]) and not emb[i, n:].any()
        assert torch.equal(mask[i, :n], want["prompt_embeds_mask"][0].bool()) and not mask[i, n:].any()
    assert emb.shape[1] == max(te_align.encode(prof, [p], tokenizers=toks, text_encoders=encs)["prompt_embeds"].shape[1]
                               for p in prompts)  # fmt: skip


@NEEDS_MGDS
def test_pixart_data_loader_hooked_encodes_by_the_profile(adapter: Any) -> None:
    import torch

    import te_align
    from te_align.trainers.onetrainer import hooks as ot
    from te_align.trainers.onetrainer.probe import tiny_components

    prompt = "A Cat on a mat. https://example.com <b>bold</b>"
    ot.install(profile=tiny_components("pixart-sigma")[0])
    prof, toks, encs, modules, model = _loader_modules(adapter, "pixart-sigma")
    out = _run_text_modules(modules, {"prompt": prompt})
    want = te_align.encode(prof, [prompt], tokenizers=toks, text_encoders=encs)
    model.text_encoder = None  # not loaded while training from cached text: the cache is enough
    with torch.no_grad():
        emb, mask = model.encode_text(train_device=torch.device("cpu"), batch_size=1, rand=random.Random(0),
                                      tokens=out["tokens"][None], attention_mask=out["tokens_mask"][None],
                                      text_encoder_output=out["text_encoder_hidden_state"][None])  # fmt: skip
    assert torch.equal(emb, want["prompt_embeds"])
    assert torch.equal(mask, want["prompt_attention_mask"])


@NEEDS_MGDS
def test_unhooked_tokens_are_refused_by_hooked_encode_text(adapter: Any) -> None:
    import torch

    from te_align.hooks.base import HookError
    from te_align.trainers.onetrainer import hooks as ot

    prof, _, _, modules, model = _loader_modules(adapter, "sd3-medium")
    out = _run_text_modules(modules, {"prompt_1": "cat", "prompt_2": "cat", "prompt_3": "cat"})  # OneTrainer's own: T5 77
    ot.install(profile=prof)
    with pytest.raises(HookError, match="tokens_3 of length 77, but profile slot 't5' tokenizes to 256"):
        model.encode_text(train_device=torch.device("cpu"), batch_size=1, tokens_1=out["tokens_1"][None],
                          tokens_2=out["tokens_2"][None], tokens_3=out["tokens_3"][None],
                          tokens_mask_3=out["tokens_mask_3"][None])  # fmt: skip


@NEEDS_MGDS
def test_text_cache_is_keyed_by_the_profile_and_stale_entries_counted(adapter: Any, tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    import logging

    from te_align.trainers.onetrainer import hooks as ot

    prof, _, _, _, model = _loader_modules(adapter, "sd3-medium")
    name = "StableDiffusion3BaseDataLoader"  # a concrete data loader; the method is the mixin's
    loader = object.__new__(getattr(importlib.import_module(f"modules.dataLoader.{name}"), name))
    config = importlib.import_module("modules.util.config.TrainConfig").TrainConfig.default_values()
    config.cache_dir = str(tmp_path)
    args = (model, None, ["latent_image"], ["crop_resolution"], ["tokens_1"], ["tokens_1", "concept"], config, True)

    def text_cache_dir() -> str:
        mods = loader._cache_modules_from_names(*args)
        return next(m.cache_dir for m in mods if str(getattr(m, "cache_dir", "")).startswith(str(tmp_path / "text")))

    assert text_cache_dir() == str(tmp_path / "text")  # OneTrainer's own: no profile in the key
    old = tmp_path / "text" / "group" / "variation-0"
    old.mkdir(parents=True)
    (old / "0.pt").write_bytes(b"")
    (old / "1.pt").write_bytes(b"")
    ot.install(profile=prof)
    with caplog.at_level(logging.INFO, logger="te_align"):
        assert text_cache_dir() == str(tmp_path / "text" / ot.cache_folder(prof))
    assert "2 cached text-encoder file(s)" in caplog.text
    assert ot.RUN.stale == 2


def test_uninstall_restores_every_original(adapter: Any) -> None:
    from te_align.trainers.onetrainer import hooks as ot

    parts = ("models", "loader", "cache") if importlib.util.find_spec("mgds") else ("models",)
    targets = ot.OneTrainerHook(parts=parts).targets()
    before = [importlib.import_module(t.module).__dict__[t.qualname.split(".")[0]].__dict__[t.qualname.split(".")[1]]
              for t in targets]  # fmt: skip
    assert ot.install(profile="sd15", parts=parts)
    assert ot.install(profile="sd15", parts=parts)  # idempotent
    after = [importlib.import_module(t.module).__dict__[t.qualname.split(".")[0]].__dict__[t.qualname.split(".")[1]]
             for t in targets]  # fmt: skip
    assert all(a is not b and a.__te_align_original__ is b for a, b in zip(after, before, strict=True))
    ot.uninstall()
    restored = [importlib.import_module(t.module).__dict__[t.qualname.split(".")[0]].__dict__[t.qualname.split(".")[1]]
                for t in targets]  # fmt: skip
    assert all(a is b for a, b in zip(restored, before, strict=True))


def test_matrix_has_onetrainer_rows_with_and_without_hooks() -> None:
    from te_align.parts import find_trainers, run_matrix

    found, absent = find_trainers({ENV: str(ROOT)})
    ot = [f for f in found if f.trainer == "onetrainer"]
    assert [f.how for f in ot] == [f"{ENV}={ROOT}"]
    assert not any(line.startswith("OneTrainer") for line in absent)
    m = run_matrix(trainers=ot, profiles=["sd3-medium", "sdxl"])
    cells = {r.profile: (r.plain.text(), r.hooked.text()) for r in m.rows}
    assert set(cells) == {"sd3-medium", "sdxl"}
    assert cells["sd3-medium"][1].startswith("identical") and not cells["sd3-medium"][0].startswith("identical")
    assert cells["sdxl"][1].startswith("identical")
    assert m.rows[0].trainer.startswith("onetrainer ")


@pytest.mark.parametrize("profile", ["pixart-sigma", "sd3-medium"])
def test_caption_dropout_is_onetrainers(adapter: Any, profile: str) -> None:
    """Hooked, a dropped caption is what OneTrainer makes of it (embeddings x 0; PixArt/Sana: the mask too),
    drawn from the batch ``rand`` in OneTrainer's order; kept captions are the profile's."""
    import torch

    import te_align
    from te_align.trainers.onetrainer import hooks as ot
    from te_align.trainers.onetrainer.probe import tiny_components

    prof, toks, encs = tiny_components(profile)
    model = adapter.model(profile, toks, encs)
    prompts = ["a cat", "a dog on a mat", "a red house"]
    rate = 0.5
    ot.install(profile=prof, parts=("models",))
    n = len(ot.FAMILIES["pixart" if profile == "pixart-sigma" else "sd3"].encoders)
    rand = random.Random(3)
    keep_first = [rand.random() > rate for _ in prompts]  # the first encoder's draws
    assert keep_first == [False, True, False]  # two dropped captions, one kept
    with torch.no_grad():
        kw = ({"text_encoder_dropout_probability": rate} if n == 1 else
              {f"text_encoder_{i}_dropout_probability": rate for i in range(1, n + 1)})  # fmt: skip
        out = model.encode_text(train_device=torch.device("cpu"), batch_size=len(prompts), rand=random.Random(3),
                                text=prompts, **kw)  # fmt: skip
    want = te_align.encode(prof, prompts, tokenizers=toks, text_encoders=encs)
    first = out[0]
    for i, kept in enumerate(keep_first):
        if profile == "pixart-sigma":
            assert torch.equal(first[i], want["prompt_embeds"][i] if kept else torch.zeros_like(first[i]))
            assert torch.equal(out[1][i], want["prompt_attention_mask"][i] if kept else torch.zeros_like(out[1][i]))
        else:  # SD3: CLIP-L hidden states (the first encoder)
            assert kept == bool(first[i].abs().sum() > 0)
