"""Integration with a real kohya-ss/sd-scripts checkout (``TE_ALIGN_KOHYA_DIR``): real strategy classes,
tiny encoders, real-convention tokenizers.

(a) without hooks the documented differences to the official pipelines appear and are measured;
(b) with hooks sd-scripts' tokenize + encode_tokens equal ``te_align.encode`` exactly;
(c) patch -> status -> unpatch on a copy of the checkout restores every byte.

sd-scripts needs torchvision and cv2 at import time for its image code; where they are missing (a
CPU box whose PyPI torchvision does not match the CPU torch), inert stand-ins are put in their place
after transformers/diffusers have decided they are absent. transformers 5 dropped the
``CLIPFeatureExtractor`` alias sd-scripts imports; it is restored to ``CLIPImageProcessor``. Its other pure
Python requirements (einops, imagesize) are the ``kohya-test`` extra. transformers 5 also dropped
``batch_encode_plus``, which sd-scripts' Anima tokenizer calls (sd-scripts pins transformers 4.54.1, where
it equals ``__call__`` on a list of strings): the unhooked Anima tests give the tokenizers that alias where it is missing.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

KOHYA_DIR = os.environ.get("TE_ALIGN_KOHYA_DIR")
pytestmark = pytest.mark.kohya  # skipped with one reason (tests/conftest.py) without the checkout or its dependencies

PROMPTS = [
    "a photo of a cat",
    "wow! amazing!!",
    "",
    "a very long prompt " + "with many words and details, " * 12,
]


def _standin(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)

        class Unavailable:
            def __init__(self, *a: Any, **k: Any) -> None:
                pass

            def __call__(self, *a: Any, **k: Any) -> Any:
                raise RuntimeError(f"{name}.{attr} is not available here (image-only stand-in for the text tests)")

        return Unavailable

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


def import_sd_scripts(root: str) -> dict[str, Any]:
    """Import sd-scripts' real strategy modules from ``root``."""
    import diffusers  # noqa: F401
    import transformers
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel  # noqa: F401

    for name in ("torchvision", "cv2"):
        try:
            # another tool's stand-in, put into sys.modules by hand, has no loader (te-align's ComfyUI import leaves
            # torchvision's, whose attributes fail on use): sd-scripts gets this module's stand-in instead
            real = importlib.import_module(name).__spec__.loader is not None
        except Exception:
            real = False
        if not real:
            sys.modules[name] = _standin(name)
            if name == "torchvision":
                sys.modules["torchvision.transforms"] = _standin("torchvision.transforms")
                sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]  # type: ignore[attr-defined]
    tf = sys.modules["transformers"]
    if "CLIPFeatureExtractor" not in tf.__dict__:
        try:
            from transformers import CLIPFeatureExtractor as fe
        except ImportError:
            fe = transformers.CLIPImageProcessor
        tf.CLIPFeatureExtractor = fe  # type: ignore[attr-defined]
    if root not in sys.path:
        sys.path.insert(0, root)
    mods = {}
    for name in ("strategy_base", "strategy_sd", "strategy_sdxl", "strategy_sd3", "strategy_flux", "strategy_anima", "strategy_hunyuan_image"):
        try:
            mods[name] = importlib.import_module(f"library.{name}")
        except ModuleNotFoundError as e:
            pytest.skip(f"sd-scripts' library.{name} needs {e.name}, which is not installed (pip install {e.name})")
    return mods


@pytest.fixture(scope="module")
def kohya() -> Iterator[dict[str, Any]]:
    saved = {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("torchvision", "cv2")}
    yield import_sd_scripts(str(Path(KOHYA_DIR or ".").resolve()))
    # the stand-ins are for sd-scripts' imports only: later tests (OneTrainer's data loaders import torchvision.io)
    # must see torchvision and cv2 as they were, not as this module's non-package stand-ins
    for name in [n for n in sys.modules if n.split(".")[0] in ("torchvision", "cv2")]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.fixture(scope="module")
def tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """sd-scripts' --tokenizer_cache_dir layout (hub id with '/' -> '_') holding the test tokenizers."""
    from te_align.tiny.tokenizers import clip_tokenizer, t5_tokenizer

    d = tmp_path_factory.mktemp("kohya_tokenizers")
    clip_tokenizer(pad="<|endoftext|>").save_pretrained(d / "openai_clip-vit-large-patch14")
    # the laion bigG hub tokenizer pads with <|endoftext|>; sd-scripts then sets pad_token_id = 0
    clip_tokenizer(pad="<|endoftext|>").save_pretrained(d / "laion_CLIP-ViT-bigG-14-laion2B-39B-b160k")
    t5_tokenizer().save_pretrained(d / "google_t5-v1_1-xxl")
    return str(d)


@pytest.fixture
def hooks():
    from te_align.trainers.kohya import hooks as hk

    hk.uninstall()
    yield hk
    hk.uninstall()


def _setup(family: str, profile_name: str) -> tuple[dict[str, Any], Any]:
    import copy

    import torch
    import transformers

    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import fit_profile

    comps = family_components(family)
    if family == "sdxl":
        # sd-scripts reads CLIP-L hidden_states[11] by index (the penultimate of 12 layers): give the
        # tiny CLIP-L 12 layers so that index means what it means for the real model
        cfg = copy.deepcopy(comps["text_encoder"].config)
        cfg.num_hidden_layers = 12
        torch.manual_seed(1234)
        comps["text_encoder"] = transformers.CLIPTextModel(cfg).eval()
    return comps, fit_profile(te_align.profile(profile_name), comps)


def _ref(p: Any, comps: dict[str, Any], prompts: list[str]) -> Any:
    import te_align

    toks = {k: v for k, v in comps.items() if k.startswith("tokenizer") or k.endswith("_tokenizer")}  # Anima: t5_tokenizer
    encs = {k: v for k, v in comps.items() if k.startswith("text_encoder")}
    return te_align.encode(p, prompts, tokenizers=toks, text_encoders=encs)


def _maxdiff(a: Any, b: Any) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a.float() - b.float()).abs().max())


def _report(name: str, rows: list[tuple[str, float]]) -> None:
    print(f"\n[kohya {name}] unhooked sd-scripts vs official (max |diff| per prompt):")
    for prompt, d in rows:
        print(f"  {d:>10.3g}  {prompt[:40]!r}")


# ------------------------------------------------------------------------------------------ SD1.5
def test_sd15(kohya, tokenizer_cache, hooks):
    import torch

    sd = kohya["strategy_sd"]
    comps, p = _setup("sd15", "sd15")
    tok = sd.SdTokenizeStrategy(False, None, tokenizer_cache)
    enc = sd.SdTextEncodingStrategy(None)
    ref = _ref(p, comps, PROMPTS)["prompt_embeds"]
    with torch.no_grad():
        plain = enc.encode_tokens(tok, [comps["text_encoder"]], tok.tokenize(PROMPTS))[0]
    rows = [(x, _maxdiff(plain[i], ref[i])) for i, x in enumerate(PROMPTS)]
    _report("sd15", rows)
    assert all(d == 0.0 for _, d in rows)  # research §14: no difference for SD1.x
    hooks.install(profile=p)
    with torch.no_grad():
        hooked = enc.encode_tokens(tok, [comps["text_encoder"]], tok.tokenize(PROMPTS))[0]
    assert torch.equal(hooked, ref)


def test_sd15_clip_skip_is_a_logged_user_override(kohya, tokenizer_cache, hooks, caplog):
    """--clip_skip 2 (NovelAI-lineage SD1.5 models) is kept under the hooks, as a recorded profile override:
    hooked sd-scripts equals te_align.encode with hidden_states[-2] + final norm, which is what sd-scripts
    computes for clip skip 2 (strategy_sd.py encode_tokens; unhooked it needs ``text_encoder.text_model``,
    which transformers 5 no longer has, so the expectation is computed from the model here)."""
    import logging

    import torch

    sd = kohya["strategy_sd"]
    comps, p = _setup("sd15", "sd15")
    tok = sd.SdTokenizeStrategy(False, None, tokenizer_cache)
    enc = sd.SdTextEncodingStrategy(2)
    want = p.with_overrides({"slots.clip_l.encoder.layer": -2, "slots.clip_l.encoder.final_layer_norm": True})
    ref = _ref(want, comps, PROMPTS)["prompt_embeds"]
    assert not torch.equal(ref, _ref(p, comps, PROMPTS)["prompt_embeds"])  # clip skip changes the conditioning
    te = comps["text_encoder"]
    norm = te.text_model.final_layer_norm if hasattr(te, "text_model") else te.final_layer_norm  # transformers 4 / 5
    with torch.no_grad():
        manual = norm(te(tok.tokenize(PROMPTS)[0].squeeze(1), output_hidden_states=True).hidden_states[-2])
    assert torch.equal(manual, ref)
    hooks.install(profile=p)
    with caplog.at_level(logging.INFO, logger="te_align"), torch.no_grad():
        hooked = enc.encode_tokens(tok, [comps["text_encoder"]], tok.tokenize(PROMPTS))[0]
    assert torch.equal(hooked, ref)
    assert "--clip_skip 2 taken as a user override of profile sd15" in caplog.text
    # an explicit layer override wins over the flag
    hooks.uninstall()
    hooks.install(profile=p, **{"slots.clip_l.encoder.layer": "last", "slots.clip_l.encoder.final_layer_norm": True})
    with torch.no_grad():
        kept = enc.encode_tokens(tok, [comps["text_encoder"]], tok.tokenize(PROMPTS))[0]
    assert torch.equal(kept, _ref(p, comps, PROMPTS)["prompt_embeds"])


# ------------------------------------------------------------------------------------------ SDXL
def test_sdxl_exclamation_difference_and_hooked_parity(kohya, tokenizer_cache, hooks):
    import torch

    sx = kohya["strategy_sdxl"]
    comps, p = _setup("sdxl", "sdxl")
    tok = sx.SdxlTokenizeStrategy(None, tokenizer_cache)
    enc = sx.SdxlTextEncodingStrategy()
    ref = _ref(p, comps, PROMPTS)
    models = [comps["text_encoder"], comps["text_encoder_2"]]
    with torch.no_grad():
        hs1, hs2, pool = enc.encode_tokens(tok, models, tok.tokenize(PROMPTS))
    plain = torch.cat([hs1, hs2], dim=-1)
    rows = [(x, _maxdiff(plain[i], ref["prompt_embeds"][i])) for i, x in enumerate(PROMPTS)]
    _report("sdxl", rows)
    for (x, d), pd in zip(rows, (pool - ref["pooled_prompt_embeds"]).abs().amax(dim=1), strict=True):
        if "!" in x:
            assert d > 0 and pd > 0  # CLIP-G "!" is plain BPE in sd-scripts, the pad token (id 0) officially
        else:
            assert d == 0 and pd == 0
    hooks.install(profile=p)
    with torch.no_grad():
        hs1, hs2, pool = enc.encode_tokens(tok, models, tok.tokenize(PROMPTS))
    assert torch.equal(torch.cat([hs1, hs2], dim=-1), ref["prompt_embeds"])
    assert torch.equal(pool, ref["pooled_prompt_embeds"])
    # keep sd-scripts' "!" tokenization on request: equal to the unhooked ids
    hooks.uninstall()
    plain_ids = tok.tokenize(PROMPTS)[1]
    hooks.install(profile=p, **{"clip_g.tokenizer.pad_token_in_prompt": "text"})
    assert torch.equal(tok.tokenize(PROMPTS)[1], plain_ids)


# ------------------------------------------------------------------------------------------- SD3
def test_sd3_masks_and_hooked_parity(kohya, tokenizer_cache, hooks):
    import torch

    s3 = kohya["strategy_sd3"]
    comps, p = _setup("sd3", "sd35-large")
    tok = s3.Sd3TokenizeStrategy(256, tokenizer_cache)
    models = [comps["text_encoder"], comps["text_encoder_2"], comps["text_encoder_3"]]
    ref = _ref(p, comps, PROMPTS)
    lg_w = comps["text_encoder"].config.hidden_size + comps["text_encoder_2"].config.hidden_size

    def parts(out: list[Any]) -> tuple[Any, Any, Any]:
        return out[0], out[1], out[2]

    plain = s3.Sd3TextEncodingStrategy(None, None)
    with torch.no_grad():
        lg, t5, _pooled = parts(plain.encode_tokens(tok, models, tok.tokenize(PROMPTS)))
    ref_lg, ref_t5 = ref["prompt_embeds"][:, :77, :lg_w], ref["prompt_embeds"][:, 77:, :]
    rows = [(x, max(_maxdiff(lg[i], ref_lg[i]), _maxdiff(t5[i], ref_t5[i]))) for i, x in enumerate(PROMPTS)]
    _report("sd3", rows)
    for x, d in rows:
        assert (d > 0) == ("!" in x)  # only CLIP-G "!" differs by default (research §14)
    # --apply_t5_attn_mask: ignored on the live path (encode_tokens defaults False), applied when caching
    masked = s3.Sd3TextEncodingStrategy(True, True)
    with torch.no_grad():
        live = parts(masked.encode_tokens(tok, models, tok.tokenize(PROMPTS)))[1]
        cached = parts(masked.encode_tokens(tok, models, tok.tokenize(PROMPTS), True, True))[1]
    live_vs_cached = float((live - cached).abs().max())
    print(f"[kohya sd3] --apply_t5_attn_mask live vs cache path: max |diff| {live_vs_cached:.3g} (live ignores the flag)")
    assert torch.equal(live, t5) and live_vs_cached > 0
    hooks.install(profile=p)
    for strategy in (plain, masked):
        with torch.no_grad():
            out = strategy.encode_tokens(tok, models, tok.tokenize(PROMPTS))
            out_cache_path = strategy.encode_tokens(tok, models, tok.tokenize(PROMPTS), True, True)
        for o in (out, out_cache_path):  # masks follow the profile on both paths
            assert torch.equal(o[0], ref_lg) and torch.equal(o[1], ref_t5)
            assert torch.equal(o[2], ref["pooled_prompt_embeds"])


# ------------------------------------------------------------------------------------------ Flux
@pytest.mark.parametrize("variant", ["dev", "schnell"])
def test_flux_lengths_and_hooked_parity(kohya, tokenizer_cache, hooks, variant, monkeypatch):
    import torch

    fl = kohya["strategy_flux"]
    comps, p = _setup("flux", f"flux-{variant}")
    models = [comps["text_encoder"], comps["text_encoder_2"]]
    ref = _ref(p, comps, PROMPTS)
    enc = fl.FluxTextEncodingStrategy(None)
    # sd-scripts' own choice (flux_train_network.get_tokenize_strategy): 256 schnell, 512 dev; the GUI writes 512
    for length in (256 if variant == "schnell" else 512, 512):
        tok = fl.FluxTokenizeStrategy(length, tokenizer_cache)
        with torch.no_grad():
            pooled, t5, _, _ = enc.encode_tokens(tok, models, tok.tokenize(PROMPTS))
        same = t5.shape == ref["prompt_embeds"].shape and torch.equal(t5, ref["prompt_embeds"])
        print(f"[kohya flux-{variant}] sd-scripts T5 length {length}: shape {tuple(t5.shape)} vs profile "
              f"{tuple(ref['prompt_embeds'].shape)}; identical={same}")  # fmt: skip
        assert torch.equal(pooled, ref["pooled_prompt_embeds"])
        assert same == (length == p.slot("t5").tokenizer.max_length)
    hooks.install(profile=p)
    tok = fl.FluxTokenizeStrategy(512, tokenizer_cache)  # GUI value: the profile's length wins
    with torch.no_grad():
        pooled, t5, txt_ids, _mask = enc.encode_tokens(tok, models, tok.tokenize(PROMPTS))
    assert torch.equal(t5, ref["prompt_embeds"]) and torch.equal(pooled, ref["pooled_prompt_embeds"])
    assert torch.equal(txt_ids[0], ref["text_ids"])


def test_flux_profile_follows_sd_scripts_checkpoint_analysis(kohya, hooks, monkeypatch):
    monkeypatch.delenv("TE_ALIGN_KOHYA_STATE", raising=False)
    hooks.install()
    hooks.RUN.record(flux_variant="schnell")
    assert hooks.profile_for("flux").name == "flux-schnell"
    hooks.RUN.record(flux_variant="dev")
    hooks.RUN.profiles.clear()
    assert hooks.profile_for("flux").name == "flux-dev"


# --------------------------------------------------------------------------------- targets / patch
def test_every_target_resolves_in_the_checkout(kohya):
    from te_align.trainers.kohya import hooks as hk
    from te_align.trainers.kohya.patch import static_problems

    assert static_problems(Path(KOHYA_DIR or ".")) == []
    hk.check()  # imports every target module and checks each signature


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_patch_status_unpatch_on_a_copy_restores_every_byte(tmp_path):
    src = Path(KOHYA_DIR or ".")
    dst = tmp_path / "sd-scripts"
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    before = _tree(dst)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    run = lambda *a: subprocess.run([sys.executable, "-m", "te_align", *a], capture_output=True, text=True, env=env)  # noqa: E731
    r = run("patch", str(dst))
    assert r.returncode == 0, r.stderr
    assert "patched" in r.stdout
    r = run("status", str(dst))
    assert r.returncode == 0 and "intact   train_network.py" in r.stdout, r.stdout + r.stderr
    assert b"te-align drop-in" in (dst / "train_network.py").read_bytes()
    assert b"te-align drop-in" in (dst / "hunyuan_image_train_network.py").read_bytes()
    assert (dst / "te_align_originals" / "train_network.py").read_bytes() == before["train_network.py"]
    assert run("patch", str(dst)).stdout.strip().endswith("nothing to do")
    if shutil.which("git") and (dst / ".git").exists():
        dirty = subprocess.run(["git", "-C", str(dst), "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True)
        assert all(line[3:].endswith(".py") for line in dirty.stdout.splitlines())  # only the scripts, originals ignored
    r = run("unpatch", str(dst))
    assert r.returncode == 0, r.stderr
    assert _tree(dst) == before


# ----------------------------------------------------------------------------------------- Anima
def _with_batch_encode_plus(tok: Any) -> Any:
    """transformers 4's ``batch_encode_plus`` (what sd-scripts' Anima tokenizer calls) is ``__call__`` on a list;
    given only where the tokenizer lacks it (transformers 4's own ``__call__`` calls ``batch_encode_plus``)."""
    if not hasattr(tok, "batch_encode_plus"):
        tok.batch_encode_plus = tok.__call__
    return tok


def _anima(kohya: dict[str, Any], **lengths: int) -> tuple[Any, dict[str, Any], Any, Any, Any]:
    """(strategy module, tiny components, fitted profile, tokenize strategy, text-encoding strategy)."""
    comps, p = _setup("anima", "anima")
    sa = kohya["strategy_anima"]
    tok = sa.AnimaTokenizeStrategy(
        qwen3_tokenizer=_with_batch_encode_plus(comps["tokenizer"]),
        t5_tokenizer=_with_batch_encode_plus(comps["t5_tokenizer"]), **lengths,
    )  # fmt: skip
    return sa, comps, p, tok, sa.AnimaTextEncodingStrategy()


def _pad_to(t: Any, n: int = 512) -> Any:
    """Right zero-padding along the sequence dimension (dim 1): the fixed shape sd-scripts caches."""
    import torch

    extra = n - t.shape[1]
    return torch.nn.functional.pad(t, (0, 0, 0, extra)) if t.dim() == 3 else torch.nn.functional.pad(t, (0, extra))


ANIMA_KEYS = ("qwen_prompt_embeds", "qwen_attention_mask", "t5_input_ids", "t5_attention_mask")


def _cosine(a: Any, b: Any) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    if not a.norm() and not b.norm():
        return 1.0
    return float(a @ b / (a.norm() * b.norm()))


def test_anima_unhooked_differences_and_hooked_parity(kohya, hooks):
    """(a) sd-scripts pads both tokenizers to 512 (strategy_anima.py:57-66): same tokens and masks up to
    padding, zero states past each caption, and Qwen3 states that differ from the official batch-longest
    run only by float rounding (Qwen3 runs over 512 instead of the batch's longest positions).
    (b) hooked: the official encoding (te_align.encode) zero-padded to 512, exactly, whether the batch
    was tokenized at once (caching) or caption by caption and collated (dataset)."""
    import torch

    _, comps, p, tok, enc = _anima(kohya)
    models = [comps["text_encoder"]]
    ref = _ref(p, comps, PROMPTS)
    assert ref["qwen_prompt_embeds"].shape[1] < 512  # the official batch is shorter than sd-scripts' 512
    with torch.no_grad():
        plain = enc.encode_tokens(tok, models, tok.tokenize(PROMPTS))
    assert [tuple(t.shape[:2]) for t in plain] == [(len(PROMPTS), 512)] * 4
    n = ref["qwen_prompt_embeds"].shape[1]
    rows = []
    for i, x in enumerate(PROMPTS):
        got, want = plain[0][i, :n], ref["qwen_prompt_embeds"][i]
        rows.append((x, _maxdiff(got, want)))
        print(f"  [anima] {x[:30]!r}: Qwen states max|diff| {rows[-1][1]:.3g}, cosine {_cosine(got, want):.9f}")
        assert _cosine(got, want) > 0.999999
    _report("anima", rows)
    assert not plain[0][:, n:].any()  # past the official width: zeros
    assert max(d for _, d in rows) < 1e-5  # float rounding only
    for k, out in zip(ANIMA_KEYS[1:], plain[1:], strict=True):
        assert torch.equal(out.cpu(), _pad_to(ref[k])), k  # masks and T5 ids: identical up to padding

    hooks.install(profile=p)
    with torch.no_grad():
        hooked = enc.encode_tokens(tok, models, tok.tokenize(PROMPTS))
        per_caption = [tok.tokenize(x) for x in PROMPTS]  # as sd-scripts' dataset tokenizes
        collated = [torch.cat([c[j] for c in per_caption]) for j in range(4)]
        from_dataset = enc.encode_tokens(tok, models, collated)
        empty_batch = enc.encode_tokens(tok, models, tok.tokenize(["", ""]))
    for out in (hooked, from_dataset):
        for k, t in zip(ANIMA_KEYS, out, strict=True):
            assert t.dtype == ref[k].dtype and torch.equal(t, _pad_to(ref[k])), k
    ref_empty = _ref(p, comps, ["", ""])
    assert ref_empty["qwen_prompt_embeds"].shape[1] == 1  # the pipeline's zero-length case
    for k, t in zip(ANIMA_KEYS, empty_batch, strict=True):
        assert torch.equal(t, _pad_to(ref_empty[k])), k

    # caption dropout of cached outputs (strategy_anima.py:109-148) gives exactly the encoding of "":
    # zero states, zero Qwen mask, T5 "</s>" -- the profile's empty_prompt = "encode"
    dropped = enc.drop_cached_text_encoder_outputs(*hooked, caption_dropout_rates=torch.ones(len(PROMPTS)))
    ref_drop = _ref(p, comps, [""] * len(PROMPTS))
    for k, t in zip(ANIMA_KEYS, dropped, strict=True):
        assert torch.equal(t, _pad_to(ref_drop[k])), k


def test_anima_padding_is_invisible_to_sd_scripts_llm_adapter(kohya):
    """sd-scripts' own LLM adapter (library/anima_models.py) on the official batch-longest tensors and on the
    same tensors zero-padded to 512: equal up to float rounding, of the same size as the official
    pipeline's own dependence on which prompts share a batch."""
    import torch

    models = importlib.import_module("library.anima_models")
    comps, p = _setup("anima", "anima")
    width = comps["text_encoder"].config.hidden_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        adapter = models.LLMAdapter(width, width, width, num_layers=2, num_heads=4, self_attn=True).eval()

    def run(c: Any, n: int | None = None) -> Any:
        ids = c["t5_input_ids"].clamp(max=adapter.embed.num_embeddings - 1)
        args = [c["qwen_prompt_embeds"], ids, c["t5_attention_mask"], c["qwen_attention_mask"]]
        if n is not None:
            args = [_pad_to(a, n) for a in args]
        with torch.no_grad():
            out = adapter(args[0], args[1], target_attention_mask=args[2], source_attention_mask=args[3])
        out[~args[2].bool()] = 0  # anima_models.py:1370
        return _pad_to(out, 512)  # the official conditioner's min_sequence_length

    for prompts in (PROMPTS, ["", ""]):
        c = _ref(p, comps, prompts)
        a, b = run(c), run(c, 512)
        print(f"\n[anima] LLM adapter, batch-longest vs 512 padding ({len(prompts)} prompts): max|diff| {_maxdiff(a, b):.3g}")
        assert torch.isfinite(b).all() and _maxdiff(a, b) < 1e-5
    alone, mixed = _ref(p, comps, PROMPTS[:1]), _ref(p, comps, PROMPTS)
    batch_effect = _maxdiff(run(alone)[0], run(mixed)[0])
    print(f"[anima] official batch-composition effect on the same adapter output: max|diff| {batch_effect:.3g}")


def test_anima_length_flags_and_hooked_lengths(kohya, hooks, caplog):
    """--qwen3_max_token_length / --t5_max_token_length (anima_train_utils.py:82-93) change what sd-scripts
    encodes (the DiT then sees t5_max_token_length rows instead of the official 512); hooked, the
    profile's 512 wins and the replacement is logged."""
    import torch

    _, comps, p, tok, enc = _anima(kohya, qwen3_max_length=64, t5_max_length=64)
    models = [comps["text_encoder"]]
    long = [PROMPTS[-1] * 3]
    ref = _ref(p, comps, long)
    with torch.no_grad():
        plain = enc.encode_tokens(tok, models, tok.tokenize(long))
    assert plain[0].shape[1] == 64 < ref["qwen_prompt_embeds"].shape[1]
    assert plain[2].shape[1] == 64 < ref["t5_input_ids"].shape[1]
    print(f"\n[anima] --qwen3/--t5_max_token_length 64: sd-scripts keeps {int(plain[1].sum())} Qwen and "
          f"{int(plain[3].sum())} T5 tokens, the official pipeline {int(ref['qwen_attention_mask'].sum())} and "
          f"{int(ref['t5_attention_mask'].sum())}; the DiT sees 64 text rows instead of 512")  # fmt: skip
    with caplog.at_level("INFO", logger="te_align"):
        hooks.install(profile=p)
        with torch.no_grad():
            hooked = enc.encode_tokens(tok, models, tok.tokenize(long))
    for k, t in zip(ANIMA_KEYS, hooked, strict=True):
        assert torch.equal(t, _pad_to(ref[k])), k
    msgs = [r.getMessage() for r in caplog.records]
    assert any("--qwen3_max_token_length 64 replaced by profile anima's 512" in m for m in msgs)
    assert any("--t5_max_token_length 64 replaced by profile anima's 512" in m for m in msgs)


def test_anima_bundled_tokenizers_follow_the_profile(kohya, hooks):
    """sd-scripts' own tokenizer files (configs/qwen3_06b, configs/t5_old: the real Qwen3-0.6B-Base and T5
    v1.1 vocabularies): the profile's special ids hold, and hooked tokenize gives sd-scripts' own tokens."""
    import torch
    from library import anima_utils

    import te_align

    qwen = anima_utils.load_qwen3_tokenizer(str(Path(KOHYA_DIR or ".") / "no-such-file.safetensors"))
    t5 = anima_utils.load_t5_tokenizer(None)
    p = te_align.profile("anima")
    q, t = p.slot("qwen").tokenizer, p.slot("t5").tokenizer
    assert (qwen.pad_token, qwen.pad_token_id, qwen.eos_token, qwen.eos_token_id, qwen.bos_token) == (
        q.pad_token, q.pad_token_id, q.eos_token, q.eos_token_id, None)  # fmt: skip
    assert (t5.pad_token, t5.pad_token_id, t5.eos_token, t5.eos_token_id) == (t.pad_token, t.pad_token_id, t.eos_token, t.eos_token_id)
    assert qwen("")["input_ids"] == [] and t5("")["input_ids"] == [t.eos_token_id]  # "" -> the zero-length Qwen case
    sa = kohya["strategy_anima"]
    tok = sa.AnimaTokenizeStrategy(qwen3_tokenizer=_with_batch_encode_plus(qwen), t5_tokenizer=_with_batch_encode_plus(t5))
    plain = tok.tokenize(PROMPTS)
    hooks.install(profile=p)
    hooked = tok.tokenize(PROMPTS)
    for a, b in zip(plain, hooked, strict=True):
        assert torch.equal(a, b)


def test_anima_te_cache_fingerprint_and_reencode(kohya, hooks, tmp_path, caplog):
    """AnimaTextEncoderOutputsCachingStrategy checks key names only (strategy_anima.py:171-195): a cache made
    without te-align (or with another profile) is kept unhooked and re-encoded hooked; hooked caches
    carry the fingerprint and hold the official encoding padded to 512."""
    import numpy as np

    sa, comps, p, tok, enc = _anima(kohya)
    cache = sa.AnimaTextEncoderOutputsCachingStrategy(True, 2, False)

    class Info:
        def __init__(self, caption: str, npz: str) -> None:
            self.caption, self.caption_dropout_rate, self.text_encoder_outputs_npz = caption, 0.0, npz

    infos = [Info(x, str(tmp_path / f"img{i}{sa.AnimaTextEncoderOutputsCachingStrategy.ANIMA_TEXT_ENCODER_OUTPUTS_NPZ_SUFFIX}"))
             for i, x in enumerate(PROMPTS[:2])]  # fmt: skip
    cache.cache_batch_outputs(tok, [comps["text_encoder"]], enc, infos)
    assert all(cache.is_disk_cached_outputs_expected(i.text_encoder_outputs_npz) for i in infos)
    with caplog.at_level("INFO", logger="te_align"):
        hooks.install(profile=p)
        assert not cache.is_disk_cached_outputs_expected(infos[0].text_encoder_outputs_npz)  # stale: re-encode
        cache.cache_batch_outputs(tok, [comps["text_encoder"]], enc, infos)
    assert any("re-encoded" in r.getMessage() for r in caplog.records)
    ref = _ref(p, comps, PROMPTS[:2])
    for i, info in enumerate(infos):
        assert cache.is_disk_cached_outputs_expected(info.text_encoder_outputs_npz)
        with np.load(info.text_encoder_outputs_npz) as data:
            assert str(data["te_align_fingerprint"]) == hooks.cache_fingerprint(hooks.profile_for("anima"))
            assert np.array_equal(data["prompt_embeds"], _pad_to(ref["qwen_prompt_embeds"])[i].numpy())
            assert np.array_equal(data["attn_mask"], _pad_to(ref["qwen_attention_mask"])[i].numpy())
            assert np.array_equal(data["t5_input_ids"], _pad_to(ref["t5_input_ids"])[i].numpy())
    hooks.uninstall()
    hooks.install(profile=p, t5_max_length=256)
    assert not cache.is_disk_cached_outputs_expected(infos[0].text_encoder_outputs_npz)  # another profile: re-encode


# ---------------------------------------------------------------- --weighted_captions and sample images
# sd-scripts 48d368f: tokenize_with_weights / encode_tokens_with_weights (strategy_sd.py:43,108,
# strategy_sdxl.py:40,195, strategy_lumina.py:74,125) and the SD1/2 lpw sample embeddings
# (lpw_stable_diffusion.py:270). Expected values are built here from te_align.encode of the prompt
# without weight syntax and the per-token weights written out by hand (pieces at word boundaries, so
# tokenizing them apart gives the whole prompt's tokens), with sd-scripts' formulas:
#   strategies: hidden * w (no renormalisation; pooled unweighted)            strategy_sd.py:117-128
#   lpw sample: h' = hidden * w; h' * mean(hidden) / mean(h') per sample      lpw_stable_diffusion.py:389-393
WEIGHTED_PROMPTS = [
    ("a photo of a cat", [("a photo of a cat", 1.0)]),
    ("a photo of a (red:1.5) cat, [blurry] background", [("a photo of a", 1.0), ("red", 1.5), ("cat,", 1.0), ("blurry", 1 / 1.1), ("background", 1.0)]),
    ("((masterpiece)), (wow!:0.7) a dog", [("masterpiece", 1.1 * 1.1), (",", 1.0), ("wow!", 0.7), ("a dog", 1.0)]),
    ("(" + "very long and detailed " * 25 + ":1.2) tail", [("very long and detailed " * 25, 1.2), ("tail", 1.0)]),  # 101 tokens
]  # fmt: skip


def _stripped(pieces: list[tuple[str, float]]) -> str:
    return " ".join(t for t, _ in pieces).replace(" ,", ",")


def _wt_expected(tokenizer: Any, pieces: list[tuple[str, float]], chunks: int = 0) -> Any:
    """Per-position weights: BOS 1, each piece's tokens at its weight, EOS/pad 1; n chunks of 77 (BOS, 75, EOS)."""
    import torch

    body: list[float] = []
    for text, w in pieces:
        body += [w] * len(tokenizer(text, add_special_tokens=False)["input_ids"])
    row: list[float] = []
    for k in range(max(chunks, 1)):
        part = [1.0, *body[k * 75 : (k + 1) * 75]]
        row += part + [1.0] * (77 - len(part))
    return torch.tensor(row, dtype=torch.float32)


def _wt_stats(a: Any, b: Any) -> tuple[float, float]:
    if a.shape != b.shape:
        return float("inf"), float("nan")
    a, b = a.double().flatten(), b.double().flatten()
    cos = 1.0 if not a.norm() and not b.norm() else float(a @ b / (a.norm() * b.norm() + 1e-30))
    return float((a - b).abs().max()), cos


def _wt_report(name: str, rows: list[tuple[str, Any, Any]]) -> list[float]:
    print(f"\n[kohya {name}] unhooked sd-scripts vs te-align expectation (max |diff|, cosine, shapes):")
    out = []
    for prompt, got, want in rows:
        d, c = _wt_stats(got, want)
        print(f"  {d:>10.3g}  cos {c:.6f}  {tuple(got.shape)} vs {tuple(want.shape)}  {prompt[:48]!r}")
        out.append(d)
    return out


def test_parser_equals_sd_scripts(kohya):
    import random

    lpw = pytest.importorskip("library.lpw_stable_diffusion")
    from te_align.encoding.weights import parse_prompt_weights

    alphabet = [*"ab ()[]:\\.1+-,!", "1.5", ":1.2)", ":0.5)", "\\(", "BREAK", "٣"]
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        try:
            want: Any = [tuple(x) for x in lpw.parse_prompt_attention(text)]
        except ValueError:
            want = ValueError
        if want is ValueError:
            with pytest.raises(ValueError):
                parse_prompt_weights(text)
        else:
            assert parse_prompt_weights(text) == want, text


@pytest.mark.parametrize("max_token_length", [None, 225])
def test_sd15_weighted_captions(kohya, tokenizer_cache, hooks, max_token_length):
    import torch

    import te_align
    from te_align.encoding import EncodeOptions

    sd = kohya["strategy_sd"]
    comps, p = _setup("sd15", "sd15")
    tok = sd.SdTokenizeStrategy(False, max_token_length, tokenizer_cache)
    enc = sd.SdTextEncodingStrategy(None)
    chunks = 3 if max_token_length else 0
    opts = EncodeOptions(long_prompt_chunks=chunks, pad_chunks=True)
    prompts = [x for x, _ in WEIGHTED_PROMPTS]
    plain = te_align.encode(p, [_stripped(pc) for _, pc in WEIGHTED_PROMPTS], tokenizers=comps, text_encoders=comps, options=opts)
    w = torch.stack([_wt_expected(comps["tokenizer"], pc, chunks) for _, pc in WEIGHTED_PROMPTS])
    expected = plain["prompt_embeds"] * w.unsqueeze(-1)
    models = [comps["text_encoder"]]
    with torch.no_grad():
        ids, weights = tok.tokenize_with_weights(prompts)
        unhooked = enc.encode_tokens_with_weights(tok, models, ids, weights)[0]
    diffs = _wt_report(f"sd15 weighted, max_token_length={max_token_length}", [(x, unhooked[i], expected[i]) for i, x in enumerate(prompts)])
    if chunks:
        assert all(d == float("inf") for d in diffs)  # sd-scripts stitches n*75+2 = 227 positions, te-align n*77
    else:
        assert all(d == 0.0 for d in diffs)  # SD1.5, 77 tokens, word-boundary weights: no difference
    hooks.install(profile=p)
    with torch.no_grad():
        ids, weights = tok.tokenize_with_weights(prompts)
        hooked = enc.encode_tokens_with_weights(tok, models, ids, weights)[0]
    assert torch.equal(hooked[0], plain["prompt_embeds"][0])  # no weight syntax: exactly te_align.encode
    assert torch.equal(hooked, expected)


@pytest.mark.parametrize("max_token_length", [None, 150])
def test_sdxl_weighted_captions(kohya, tokenizer_cache, hooks, max_token_length):
    import torch

    import te_align
    from te_align.encoding import EncodeOptions

    sx = kohya["strategy_sdxl"]
    comps, p = _setup("sdxl", "sdxl")
    tok = sx.SdxlTokenizeStrategy(max_token_length, tokenizer_cache)
    enc = sx.SdxlTextEncodingStrategy()
    chunks = 2 if max_token_length else 0
    opts = EncodeOptions(long_prompt_chunks=chunks, pad_chunks=True)
    prompts = [x for x, _ in WEIGHTED_PROMPTS]
    plain = te_align.encode(p, [_stripped(pc) for _, pc in WEIGHTED_PROMPTS], tokenizers=comps, text_encoders=comps, options=opts)
    w1 = torch.stack([_wt_expected(comps["tokenizer"], pc, chunks) for _, pc in WEIGHTED_PROMPTS])
    w2 = torch.stack([_wt_expected(comps["tokenizer_2"], pc, chunks) for _, pc in WEIGHTED_PROMPTS])
    width1 = comps["text_encoder"].config.hidden_size
    h1, h2 = plain["prompt_embeds"][..., :width1], plain["prompt_embeds"][..., width1:]
    expected = torch.cat([h1 * w1.unsqueeze(-1), h2 * w2.unsqueeze(-1)], dim=-1)
    models = [comps["text_encoder"], comps["text_encoder_2"]]
    with torch.no_grad():
        ids, weights = tok.tokenize_with_weights(prompts)
        u1, u2, _ = enc.encode_tokens_with_weights(tok, models, ids, weights)
    unhooked = torch.cat([u1, u2], dim=-1)
    diffs = _wt_report(f"sdxl weighted, max_token_length={max_token_length}", [(x, unhooked[i], expected[i]) for i, x in enumerate(prompts)])
    for (x, _), d in zip(WEIGHTED_PROMPTS, diffs, strict=True):
        if chunks:
            assert d == float("inf")  # stitched 152 vs 2 x 77
        else:
            assert (d > 0) == ("!" in x)  # CLIP-G "!" is plain BPE in sd-scripts, the pad token officially
    hooks.install(profile=p)
    with torch.no_grad():
        ids, weights = tok.tokenize_with_weights(prompts)
        k1, k2, pool = enc.encode_tokens_with_weights(tok, models, ids, weights)
    assert torch.equal(torch.cat([k1, k2], dim=-1), expected)
    assert torch.equal(pool, plain["pooled_prompt_embeds"])  # pooled from CLIP-G, unweighted


def test_lumina_weighted_captions(kohya, hooks):
    """sd-scripts gives Gemma 2 no prompt weights (strategy_lumina.py:74-89,125-144): hooked, the weighted path is
    te_align.encode of the caption as written (weight syntax included), as the unweighted path is."""
    import torch

    import te_align

    sl = pytest.importorskip("library.strategy_lumina")
    comps, p = _setup("lumina2", "lumina2")
    spec = p.slot("gemma").tokenizer

    def strategy(system_prompt: str | None) -> Any:
        tok = object.__new__(sl.LuminaTokenizeStrategy)  # __init__ downloads google/gemma-2-2b
        tok.tokenizer = comps["tokenizer"]
        tok.tokenizer.padding_side = "right"
        tok.system_prompt = f"{system_prompt} <Prompt Start> " if system_prompt else ""  # strategy_lumina.py:35-38
        tok.max_length = 256
        return tok

    enc = sl.LuminaTextEncodingStrategy()
    models = [comps["text_encoder"]]
    prompts = ["a photo of a cat", "a (red:1.5) cat, [blurry]", ""]
    ref = _ref(p, comps, prompts)["prompt_embeds"]
    rows = []
    for sp in (None, spec.system_prompt):
        tok = strategy(sp)
        with torch.no_grad():
            ids, mask, weights = tok.tokenize_with_weights(prompts)
            hidden = enc.encode_tokens_with_weights(tok, models, (ids, mask), weights)[0]
        rows.append(_wt_report(f"lumina weighted, --system_prompt {'official' if sp else 'unset'}",
                               [(x, hidden[i], ref[i]) for i, x in enumerate(prompts)]))  # fmt: skip
    assert all(d > 0 for d in rows[0]) and all(d == 0 for d in rows[1])  # only the system prompt differs
    hooks.install(profile=p)
    tok = strategy(None)
    with torch.no_grad():
        ids, mask, weights = tok.tokenize_with_weights(prompts)
        hidden, _, out_mask = enc.encode_tokens_with_weights(tok, models, (ids, mask), weights)
    assert torch.equal(hidden, ref) and all(bool((x == 1).all()) for x in weights)
    assert torch.equal(out_mask, te_align.encode(p, prompts, tokenizers=comps, text_encoders=comps)["prompt_attention_mask"].long())


def test_sdxl_sample_pipeline_and_missing_negative(kohya, tokenizer_cache, hooks, monkeypatch):
    """SDXL sample images encode in SdxlStableDiffusionLongPromptWeightingPipeline.__call__ through the weighted
    strategies (sdxl_lpw_stable_diffusion.py:839-852); a missing negative prompt is "" there, zeros officially."""
    import torch

    import te_align
    from te_align.encoding import encode_uncond

    lpwx = pytest.importorskip("library.sdxl_lpw_stable_diffusion")
    sb, sx = kohya["strategy_base"], kohya["strategy_sdxl"]
    comps, p = _setup("sdxl", "sdxl")
    tok = sx.SdxlTokenizeStrategy(None, tokenizer_cache)
    enc = sx.SdxlTextEncodingStrategy()
    monkeypatch.setattr(sb.TokenizeStrategy, "_strategy", tok)
    monkeypatch.setattr(sb.TextEncodingStrategy, "_strategy", enc)
    seen: list[Any] = []

    def spy(*a: Any) -> Any:
        out = type(enc).encode_tokens_with_weights(enc, *a)
        seen.append(out)
        return out

    enc.encode_tokens_with_weights = spy  # type: ignore[method-assign]

    class Stop(Exception):
        pass

    class Unet:
        @property
        def dtype(self) -> Any:
            raise Stop  # right after the text encoding (sdxl_lpw_stable_diffusion.py:858)

    pipe = object.__new__(lpwx.SdxlStableDiffusionLongPromptWeightingPipeline)
    pipe.device, pipe.unet = torch.device("cpu"), Unet()
    pipe.text_encoders = [comps["text_encoder"], comps["text_encoder_2"]]

    def sample(prompt: str, negative: str | None) -> tuple[Any, Any, Any, Any]:
        seen.clear()
        with torch.no_grad(), pytest.raises(Stop):
            pipe(prompt=prompt, negative_prompt=negative, height=512, width=512)
        (c1, c2, cpool), (n1, n2, npool) = seen
        return torch.cat([c1, c2], dim=-1), cpool, torch.cat([n1, n2], dim=-1), npool

    prompt, pieces = WEIGHTED_PROMPTS[2]
    # batch of one, as the pipeline encodes (float results depend on the batch shape)
    ref = te_align.encode(p, _stripped(pieces), tokenizers=comps, text_encoders=comps)
    empty = te_align.encode(p, "", tokenizers=comps, text_encoders=comps)
    width1 = comps["text_encoder"].config.hidden_size
    w1, w2 = _wt_expected(comps["tokenizer"], pieces), _wt_expected(comps["tokenizer_2"], pieces)
    want_cond = torch.cat([ref["prompt_embeds"][0, :, :width1] * w1[:, None], ref["prompt_embeds"][0, :, width1:] * w2[:, None]], dim=-1)
    zeros = encode_uncond(p, tokenizers=comps, text_encoders=comps)
    unhooked = sample(prompt, None)
    _wt_report("sdxl sample (pipeline __call__)", [
        (prompt, unhooked[0][0], want_cond), ("<no negative> hidden", unhooked[2][0], zeros["prompt_embeds"][0]),
        ("<no negative> pooled", unhooked[3][0], zeros["pooled_prompt_embeds"][0]),
    ])  # fmt: skip
    assert not torch.equal(unhooked[0][0], want_cond)  # "!" in the prompt
    assert float(unhooked[2].abs().max()) > 0  # sd-scripts encodes "" where SDXL uses zeros
    hooks.install(profile=p)
    cond, pool, neg, neg_pool = sample(prompt, None)
    assert torch.equal(cond[0], want_cond) and torch.equal(pool[0], ref["pooled_prompt_embeds"][0])
    assert torch.equal(neg, zeros["prompt_embeds"]) and torch.equal(neg_pool, zeros["pooled_prompt_embeds"])
    assert not bool(neg.any())
    _, _, neg, neg_pool = sample(prompt, "")  # an explicit "" is encoded, as officially
    assert torch.equal(neg, empty["prompt_embeds"]) and torch.equal(neg_pool, empty["pooled_prompt_embeds"])


@pytest.mark.parametrize("family", ["sd15", "sd21"])
def test_sd_sample_lpw_embeddings(kohya, tokenizer_cache, hooks, monkeypatch, family):
    """SD1/2 sample images: lpw_stable_diffusion.get_weighted_text_embeddings, hooked, equals the te-align
    expectation (training's chunks, the profile's layer, weights with the mean restored)."""
    import types

    import torch

    import te_align
    from te_align.encoding import EncodeOptions

    lpw = pytest.importorskip("library.lpw_stable_diffusion")
    sb, sd = kohya["strategy_base"], kohya["strategy_sd"]
    comps, p = _setup(family, family)
    te = comps["text_encoder"]
    norm = te.text_model.final_layer_norm if hasattr(te, "text_model") else te.final_layer_norm  # transformers 4 / 5
    if not bool(norm.bias.any()):  # a bias-free final norm makes the mean 0 and the lpw mean restore 0/0 (NaN)
        torch.manual_seed(7)
        torch.nn.init.normal_(norm.bias, std=0.1)
    pipe = types.SimpleNamespace(tokenizer=comps["tokenizer"], text_encoder=comps["text_encoder"], device=torch.device("cpu"))
    cases = [WEIGHTED_PROMPTS[0], WEIGHTED_PROMPTS[1], WEIGHTED_PROMPTS[3]]  # plain, weighted, long (101 tokens)
    for max_token_length in (None, 225):
        tok = object.__new__(sd.SdTokenizeStrategy)
        tok.tokenizer, tok.max_length = comps["tokenizer"], (max_token_length or 75) + 2
        monkeypatch.setattr(sb.TokenizeStrategy, "_strategy", tok)
        chunks = 3 if max_token_length else 0
        opts = EncodeOptions(long_prompt_chunks=chunks, pad_chunks=True)
        # one prompt and its negative per call, as train_util.sample_image_inference samples
        empty = te_align.encode(p, "", tokenizers=comps, text_encoders=comps, options=opts)["prompt_embeds"]
        rows, expected = [], []
        for prompt, pieces in cases:
            h = te_align.encode(p, _stripped(pieces), tokenizers=comps, text_encoders=comps, options=opts)["prompt_embeds"]
            scaled = h * _wt_expected(comps["tokenizer"], pieces, chunks).unsqueeze(-1)
            want = scaled * (h.float().mean(dim=(-2, -1)) / scaled.float().mean(dim=(-2, -1))).view(-1, 1, 1)
            expected.append((h, want))
            hooks.uninstall()
            with torch.no_grad():
                cond, uncond = lpw.get_weighted_text_embeddings(pipe, prompt, "", max_embeddings_multiples=3)
            rows += [(prompt, cond[0], want[0]), ("<empty negative> with " + prompt[:20], uncond[0], empty[0])]
        diffs = _wt_report(f"{family} sample lpw, training max_token_length={max_token_length}", rows)
        if family == "sd21":
            assert all(d > 0 for d in diffs)  # lpw pads with EOS, SD2's tokenizer pads with "!" (id 0)
        elif chunks:  # training's 3 chunks; sd-scripts samples with the pair's need (1 or 2 chunks)
            assert all(d == float("inf") for d in diffs)
        else:  # 77 tokens in training: only the long prompt (and its negative) get 2 chunks in sd-scripts
            assert [d == float("inf") for d in diffs] == [False, False, False, False, True, True] and max(diffs[:4]) == 0
        hooks.install(profile=p)
        for (prompt, _), (h, want) in zip(cases, expected, strict=True):
            with torch.no_grad():
                cond, uncond = lpw.get_weighted_text_embeddings(pipe, prompt, "", max_embeddings_multiples=3)
            assert torch.equal(cond, want) and torch.equal(uncond, empty)
            if prompt == cases[0][0]:
                assert torch.equal(cond, h)  # no weight syntax: exactly te_align.encode
    hooks.uninstall()


def test_sample_paths_go_through_hooked_strategies():
    """Contract (read from the source): the sample paths with no text encoding of their own call the tokenize
    strategy's ``tokenize`` and the encoding strategy's ``encode_tokens`` (hooked); SDXL's pipeline the weighted
    pair; SD1/2's pipeline the module's ``get_weighted_text_embeddings`` (hooked); train_util passes a
    missing negative prompt as None to the pipelines (hooked ``__call__``)."""
    import ast

    root = Path(KOHYA_DIR or ".")
    want = {
        ("library/flux_train_utils.py", "sample_image_inference"): {"tokenize", "encode_tokens"},
        ("library/sd3_train_utils.py", "sample_image_inference"): {"tokenize", "encode_tokens"},
        ("library/lumina_train_util.py", "sample_image_inference"): {"tokenize", "encode_tokens"},
        ("library/anima_train_utils.py", "_sample_image_inference"): {"tokenize", "encode_tokens"},
        ("hunyuan_image_train_network.py", "sample_image_inference"): {"tokenize", "encode_tokens"},
        ("library/sdxl_lpw_stable_diffusion.py", "__call__"): {"tokenize_with_weights", "encode_tokens_with_weights"},
        ("library/lpw_stable_diffusion.py", "_encode_prompt"): {"get_weighted_text_embeddings"},
    }
    for (path, fn), calls in want.items():
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        node = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn), None)
        assert node is not None, f"{path}: {fn} not found"
        called = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "") for c in ast.walk(node) if isinstance(c, ast.Call)}
        assert calls <= called, f"{path}:{fn} no longer calls {sorted(calls - called)}"
        direct = set()  # models called directly: text_encoder(ids), text_encoders[0](ids)
        for c in ast.walk(node):
            f = c.func.value if isinstance(c, ast.Call) and isinstance(c.func, ast.Subscript) else getattr(c, "func", None)
            if isinstance(f, ast.Name) and any(k in f.id.lower() for k in ("encoder", "gemma", "qwen", "t5", "clip")):
                direct.add(f.id)
        assert not direct, f"{path}:{fn} runs {sorted(direct)} itself"
    src = (root / "library/train_util.py").read_text(encoding="utf-8")
    assert 'negative_prompt = prompt_dict.get("negative_prompt")' in src and "negative_prompt=negative_prompt," in src


# ------------------------------------------------------------------------------------ HunyuanImage
#: Prompts for HunyuanImage: plain ones, quoted glyph text of every kind extract_glyph_text knows, and one
#: over the official 1000 Qwen tokens (sd-scripts keeps 1024).
HUNYUAN_PROMPTS = {
    "plain": PROMPTS,
    "double and chinese quotes": ['a sign that says "OPEN"', "招牌上写着“欢迎光临”", "a label ‘café’", ""],
    "single quotes": ["a poster reading 'SALE 50%'", "the cat's toy and the dog's bone", "a cat"],
    "mixed quotes": ['both "A" and \'b\' and “c”'],
    "over 1000 tokens": ["word " * 1100, "a cat"],
}


def _hunyuan(kohya: dict[str, Any]) -> tuple[Any, dict[str, Any], Any, Any, Any, list[Any]]:
    """(strategy module, tiny components, fitted profile, tokenize strategy, text-encoding strategy, models).

    HunyuanImageTokenizeStrategy.__init__ downloads Qwen/Qwen2.5-VL-7B-Instruct and google/byt5-small from
    the hub; the object is made without it and given the tiny tokenizers in those two attributes.
    """
    comps, p = _setup("hunyuanimage", "hunyuanimage-2.1")
    sh = kohya["strategy_hunyuan_image"]
    tok = object.__new__(sh.HunyuanImageTokenizeStrategy)
    tok.vlm_tokenizer, tok.byt5_tokenizer = comps["tokenizer"], comps["tokenizer_2"]
    return sh, comps, p, tok, sh.HunyuanImageTextEncodingStrategy(), [comps["text_encoder"], comps["text_encoder_2"]]


def _hunyuan_cosine(a: Any, b: Any) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    if not a.norm() or not b.norm():
        return 1.0 if not a.norm() and not b.norm() else 0.0
    return float(a @ b / (a.norm() * b.norm()))


def test_hunyuan_image_unhooked_differences_are_measured(kohya, hooks):
    """(a) sd-scripts 48d368f vs the official HunyuanImagePipeline encoding, on the tiny models:

    * Qwen: sd-scripts pads to the batch's longest (padding=True) instead of 1000 + 34 and truncates at
      1024 + 34 instead of 1000 + 34; the template, the 34 dropped positions, hidden_states[-3] and the mask
      are the same. Real positions agree up to float noise of the other sequence length; a prompt over 1000
      tokens keeps 24 more tokens.
    * ByT5: '...' is not glyph text in sd-scripts (the single-quote pattern is commented out), so single-quoted
      text and apostrophes ("the cat's toy and the dog's bone") give zeros and ocr_mask False there; with
      "...", ‘...’ and “...” the glyph text, the 128 tokens, the float mask and the zeros are the same.
    """
    import torch

    _sh, comps, p, tok, enc, models = _hunyuan(kohya)
    print("\n[kohya hunyuan_image] unhooked sd-scripts vs official (real Qwen positions; whole ByT5 rows):")
    for label, prompts in HUNYUAN_PROMPTS.items():
        ref = _ref(p, comps, prompts)
        with torch.no_grad():
            tokens = tok.tokenize(prompts)
            vlm, vlm_mask, byt5, byt5_mask, ocr = enc.encode_tokens(tok, models, tokens)
        longest = max(int(m.sum()) for m in tokens[1])
        assert vlm.shape[1] == longest - 34 and ref["prompt_embeds"].shape[1] == 1000  # batch-longest vs fixed 1000
        assert byt5.shape == ref["prompt_embeds_2"].shape  # 128 both (sd-scripts' zeros are 128 x 1472 too)
        for i, x in enumerate(prompts):
            n_sd, n_off = int(vlm_mask[i].sum()), int(ref["prompt_embeds_mask"][i].sum())
            n = min(n_sd, n_off)
            dq = float((vlm[i, :n].double() - ref["prompt_embeds"][i, :n].double()).abs().max())
            cq = _hunyuan_cosine(vlm[i, :n], ref["prompt_embeds"][i, :n])
            db = float((byt5[i].double() - ref["prompt_embeds_2"][i].double()).abs().max())
            cb = _hunyuan_cosine(byt5[i], ref["prompt_embeds_2"][i])
            glyph_off = bool(ref["prompt_embeds_mask_2"][i].any())
            print(f"  {label:26} {x[:34]!r:38} qwen tokens {n_sd}/{n_off} max|d| {dq:.3g} cos {cq:.6f} | "
                  f"byt5 max|d| {db:.3g} cos {cb:.4f} glyph sd/official {bool(ocr[i])}/{glyph_off}")  # fmt: skip
            assert dq < 1e-6 and cq > 0.999999  # same recipe; only the padded length (float noise) differs
            if label == "over 1000 tokens" and i == 0:
                assert (n_sd, n_off) == (1024, 1000)
            else:
                assert n_sd == n_off
                assert torch.equal(vlm_mask[i, :n], ref["prompt_embeds_mask"][i, :n])
            single = "'" in x
            if single:  # official extracts '...' (and apostrophe spans), sd-scripts does not
                assert glyph_off and cb < 0.99 and not torch.equal(byt5_mask[i], ref["prompt_embeds_mask_2"][i])
            else:
                assert torch.equal(byt5[i], ref["prompt_embeds_2"][i]) and torch.equal(byt5_mask[i], ref["prompt_embeds_mask_2"][i])
            assert bool(ocr[i]) == bool(byt5_mask[i].any())
    # sd-scripts' ByT5 tokens are padded per batch: width 1 when no caption has glyph text
    assert tok.tokenize(["a cat", "a dog"])[2].shape == (2, 1)


def test_hunyuan_image_hooked_parity_fixed_shapes_and_lora(kohya, hooks):
    """(b) hooked: sd-scripts' tokenize + encode_tokens give te_align.encode exactly, batched (caching) and
    caption by caption collated as the dataset does; every caption's tensors keep one shape."""
    import importlib

    import torch

    _sh, comps, p, tok, enc, models = _hunyuan(kohya)
    hooks.install(profile=p)
    for label, prompts in HUNYUAN_PROMPTS.items():
        ref = _ref(p, comps, prompts)
        batched = tok.tokenize(prompts)
        per_caption = [tok.tokenize(x) for x in prompts]
        collated = [torch.stack([c[k][0] for c in per_caption]) for k in range(4)]  # train_util.py:1748-1787
        for tokens in (batched, collated):
            assert [tuple(t.shape) for t in tokens] == [(len(prompts), 1034)] * 2 + [(len(prompts), 128)] * 2
            vlm, vlm_mask, byt5, byt5_mask, ocr = enc.encode_tokens(tok, models, tokens)
            for got, name in ((vlm, "prompt_embeds"), (vlm_mask, "prompt_embeds_mask"), (byt5, "prompt_embeds_2"),
                              (byt5_mask, "prompt_embeds_mask_2")):  # fmt: skip
                assert got.dtype == ref[name].dtype and torch.equal(got, ref[name]), (label, name)
            assert ocr.dtype == torch.bool and torch.equal(ocr, ref["prompt_embeds_mask_2"].any(dim=1))
    # HunyuanImage's LoRA network saves through lora_flux.LoRANetwork.save_weights, which is stamped
    lora = importlib.import_module("networks.lora_hunyuan_image")
    lora_flux = importlib.import_module("networks.lora_flux")
    assert "save_weights" not in lora.HunyuanImageLoRANetwork.__dict__
    assert lora.HunyuanImageLoRANetwork.save_weights is lora_flux.LoRANetwork.save_weights
    assert hasattr(lora_flux.LoRANetwork.save_weights, "__te_align_original__")


def test_hunyuan_image_cache_is_stamped_and_a_mismatch_reencodes(kohya, hooks, tmp_path):
    """(c) the real HunyuanImageTextEncoderOutputsCachingStrategy: per-item npz files written through the hooks
    hold the profile's tensors in fixed shapes and its fingerprint; files of unhooked sd-scripts or of another
    profile are reported as not cached, so sd-scripts encodes them again."""
    import numpy as np
    import torch

    sh, comps, p, tok, enc, models = _hunyuan(kohya)
    prompts = ['a sign that says "OPEN"', "a cat", "the cat's toy"]
    infos = [types.SimpleNamespace(caption=x, text_encoder_outputs_npz=str(tmp_path / f"img{i}_hi_te.npz")) for i, x in enumerate(prompts)]
    cache = sh.HunyuanImageTextEncoderOutputsCachingStrategy(True, 2, False)
    cache.cache_batch_outputs(tok, models, enc, infos)  # unhooked sd-scripts
    assert all(cache.is_disk_cached_outputs_expected(i.text_encoder_outputs_npz) for i in infos)
    hooks.install(profile=p)
    assert not any(cache.is_disk_cached_outputs_expected(i.text_encoder_outputs_npz) for i in infos)  # no fingerprint
    cache.cache_batch_outputs(tok, models, enc, infos)
    ref = _ref(p, comps, prompts)
    for k, info in enumerate(infos):
        assert cache.is_disk_cached_outputs_expected(info.text_encoder_outputs_npz)
        with np.load(info.text_encoder_outputs_npz) as data:
            assert str(data["te_align_fingerprint"]) == hooks.cache_fingerprint(p)
        vlm, vlm_mask, byt5, byt5_mask, ocr = cache.load_outputs_npz(info.text_encoder_outputs_npz)
        assert vlm.shape == (1000, comps["text_encoder"].config.text_config.hidden_size) and byt5.shape == (128, 1472)
        assert torch.equal(torch.from_numpy(vlm), ref["prompt_embeds"][k]) and torch.equal(torch.from_numpy(byt5), ref["prompt_embeds_2"][k])
        assert torch.equal(torch.from_numpy(vlm_mask), ref["prompt_embeds_mask"][k]) and bool(ocr) == (k == 0)  # one apostrophe is no quote
        assert torch.equal(torch.from_numpy(byt5_mask), ref["prompt_embeds_mask_2"][k])
    hooks.uninstall()
    hooks.install(profile=p.with_overrides(qwen_max_length=900))  # another profile: re-encode
    assert not any(cache.is_disk_cached_outputs_expected(i.text_encoder_outputs_npz) for i in infos)


def test_hunyuan_image_fp8_vl_goes_through_sd_scripts_forward_with_profile_tokens(kohya, hooks):
    """--fp8_vl: float8 Qwen weights only run in sd-scripts' own forward (bf16 autocast); the hooks hand it the
    profile's tokens, so shapes, masks and layer are the profile's and only the floats move (here: bf16 autocast
    of the tiny float32 model standing in for the float8 one). A profile it cannot follow is refused."""
    import torch

    from te_align.hooks import HookError

    _sh, comps, p, tok, enc, models = _hunyuan(kohya)

    class Fp8View(torch.nn.Module):
        """Reports float8 like the --fp8_vl model; runs the tiny float32 weights."""

        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        dtype = property(lambda self: torch.float8_e4m3fn)
        device = property(lambda self: torch.device("cpu"))

        def forward(self, **kw: Any) -> Any:
            return self.m(**kw)

    prompts = ['a sign that says "OPEN"', "a photo of a cat"]
    ref = _ref(p, comps, prompts)
    hooks.install(profile=p)
    vlm, vlm_mask, byt5, _byt5_mask, _ocr = enc.encode_tokens(tok, [Fp8View(models[0]), models[1]], tok.tokenize(prompts))
    assert vlm.shape == ref["prompt_embeds"].shape
    assert torch.equal(vlm_mask, ref["prompt_embeds_mask"]) and torch.equal(byt5, ref["prompt_embeds_2"])
    for i in range(len(prompts)):
        n = int(vlm_mask[i].sum())
        assert _hunyuan_cosine(vlm[i, :n], ref["prompt_embeds"][i, :n]) > 0.99
    hooks.uninstall()
    hooks.install(profile=p.with_overrides(qwen_layer=-2))
    with pytest.raises(HookError, match=r"--fp8_vl runs Qwen2\.5-VL through sd-scripts' own forward"):
        enc.encode_tokens(tok, [Fp8View(models[0]), models[1]], tok.tokenize(prompts))
