"""Integration with a real kohya-ss/sd-scripts checkout (``TE_ALIGN_KOHYA_DIR``): real strategy classes,
tiny encoders, real-convention tokenizers.

(a) without hooks the documented differences to the official pipelines appear and are measured;
(b) with hooks sd-scripts' tokenize + encode_tokens equal ``te_align.encode`` exactly;
(c) patch -> status -> unpatch on a copy of the checkout restores every byte.

sd-scripts needs torchvision and cv2 at import time for its image code; where they are missing (a
CPU box whose PyPI torchvision does not match the CPU torch), inert stand-ins are put in their place
after transformers/diffusers have decided they are absent. transformers 5 dropped the
``CLIPFeatureExtractor`` alias sd-scripts imports; it is restored to ``CLIPImageProcessor``. Other pure
Python requirements (einops, imagesize) must be installed.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

KOHYA_DIR = os.environ.get("TE_ALIGN_KOHYA_DIR")
pytestmark = pytest.mark.skipif(
    not KOHYA_DIR, reason="set TE_ALIGN_KOHYA_DIR to a kohya-ss/sd-scripts checkout to run the kohya integration tests"
)

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
            importlib.import_module(name)
        except Exception:
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
    for name in ("strategy_base", "strategy_sd", "strategy_sdxl", "strategy_sd3", "strategy_flux"):
        try:
            mods[name] = importlib.import_module(f"library.{name}")
        except ModuleNotFoundError as e:
            pytest.skip(f"sd-scripts' library.{name} needs {e.name}, which is not installed (pip install {e.name})")
    return mods


@pytest.fixture(scope="module")
def kohya() -> dict[str, Any]:
    return import_sd_scripts(str(Path(KOHYA_DIR or ".").resolve()))


@pytest.fixture(scope="module")
def tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """sd-scripts' --tokenizer_cache_dir layout (hub id with '/' -> '_') holding the test tokenizers."""
    from tests.support import clip_tokenizer, t5_tokenizer

    d = tmp_path_factory.mktemp("kohya_tokenizers")
    clip_tokenizer(pad="<|endoftext|>").save_pretrained(d / "openai_clip-vit-large-patch14")
    # the laion bigG hub tokenizer pads with <|endoftext|>; sd-scripts then sets pad_token_id = 0
    clip_tokenizer(pad="<|endoftext|>").save_pretrained(d / "laion_CLIP-ViT-bigG-14-laion2B-39B-b160k")
    t5_tokenizer().save_pretrained(d / "google_t5-v1_1-xxl")
    return str(d)


@pytest.fixture
def hooks():
    from te_align.hooks import kohya as hk

    hk.uninstall()
    yield hk
    hk.uninstall()


def _setup(family: str, profile_name: str) -> tuple[dict[str, Any], Any]:
    import copy

    import torch
    import transformers

    import te_align
    from tests.support import family_components
    from tests.support.adapt import fit_profile

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

    toks = {k: v for k, v in comps.items() if k.startswith("tokenizer")}
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
    hooks.install(profile=p, **{"kohya.clip_g_exclamation": "sd-scripts"})
    hooks.uninstall()
    plain_ids = tok.tokenize(PROMPTS)[1]
    hooks.install(profile=p, **{"kohya.clip_g_exclamation": "sd-scripts"})
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
    hooks._RUN.record(flux_variant="schnell")
    assert hooks.profile_for("flux").name == "flux-schnell"
    hooks._RUN.record(flux_variant="dev")
    hooks._RUN.profiles.clear()
    assert hooks.profile_for("flux").name == "flux-dev"


# --------------------------------------------------------------------------------- targets / patch
def test_every_target_resolves_in_the_checkout(kohya):
    pytest.importorskip("einops")
    from te_align.hooks import kohya as hk
    from te_align.patching.kohya import static_problems

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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = lambda *a: subprocess.run([sys.executable, "-m", "te_align", *a], capture_output=True, text=True, env=env)  # noqa: E731
    r = run("patch", str(dst))
    assert r.returncode == 0, r.stderr
    assert "patched" in r.stdout
    r = run("status", str(dst))
    assert r.returncode == 0 and "intact   train_network.py" in r.stdout, r.stdout + r.stderr
    assert b"te-align drop-in" in (dst / "train_network.py").read_bytes()
    assert (dst / "te_align_originals" / "train_network.py").read_bytes() == before["train_network.py"]
    assert run("patch", str(dst)).stdout.strip().endswith("nothing to do")
    if shutil.which("git") and (dst / ".git").exists():
        dirty = subprocess.run(["git", "-C", str(dst), "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True)
        assert all(line[3:].endswith(".py") for line in dirty.stdout.splitlines())  # only the scripts, originals ignored
    r = run("unpatch", str(dst))
    assert r.returncode == 0, r.stderr
    assert _tree(dst) == before
