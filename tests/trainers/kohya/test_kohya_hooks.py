"""kohya hooks and patch on a stand-in sd-scripts tree (runs in CI, no checkout needed).

The stand-in is a small fake trainer written by the test: the same module paths, class names and
method signatures as sd-scripts 48d368f (pinned below, independently of te-align's own table), with
trivial bodies. It exercises install / refuse / uninstall, the hooked tokenize + encode path on tiny
real encoders, the TE-cache fingerprint, the LoRA stamp, the drop-in scripts (``--help`` and a spawn
DataLoader) and the on-disk patch's refusals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from te_align.errors import ProfileError
from te_align.hooks import HookError

REPO = Path(__file__).resolve().parents[3]

#: sd-scripts 48d368f: module -> qualname -> parameters (read from the source; see the report in CHANGELOG).
PINNED: dict[str, dict[str, tuple[str, ...]]] = {
    "library.strategy_sd": {
        "SdTokenizeStrategy.tokenize": ("self", "text"),
        "SdTokenizeStrategy.tokenize_with_weights": ("self", "text"),
        "SdTextEncodingStrategy.encode_tokens": ("self", "tokenize_strategy", "models", "tokens"),
        "SdTextEncodingStrategy.encode_tokens_with_weights": ("self", "tokenize_strategy", "models", "tokens_list", "weights_list"),
    },
    "library.strategy_sdxl": {
        "SdxlTokenizeStrategy.tokenize": ("self", "text"),
        "SdxlTokenizeStrategy.tokenize_with_weights": ("self", "text"),
        "SdxlTextEncodingStrategy.encode_tokens": ("self", "tokenize_strategy", "models", "tokens"),
        "SdxlTextEncodingStrategy.encode_tokens_with_weights": ("self", "tokenize_strategy", "models", "tokens_list", "weights_list"),
        "SdxlTextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": ("self", "npz_path"),
        "SdxlTextEncoderOutputsCachingStrategy.cache_batch_outputs": ("self", "tokenize_strategy", "models", "text_encoding_strategy", "infos"),
    },
    "library.strategy_sd3": {
        "Sd3TokenizeStrategy.tokenize": ("self", "text"),
        "Sd3TextEncodingStrategy.encode_tokens": (
            "self", "tokenize_strategy", "models", "tokens", "apply_lg_attn_mask", "apply_t5_attn_mask", "enable_dropout",
        ),
        "Sd3TextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": ("self", "npz_path"),
        "Sd3TextEncoderOutputsCachingStrategy.cache_batch_outputs": ("self", "tokenize_strategy", "models", "text_encoding_strategy", "infos"),
    },
    "library.strategy_flux": {
        "FluxTokenizeStrategy.tokenize": ("self", "text"),
        "FluxTextEncodingStrategy.encode_tokens": ("self", "tokenize_strategy", "models", "tokens", "apply_t5_attn_mask"),
        "FluxTextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": ("self", "npz_path"),
        "FluxTextEncoderOutputsCachingStrategy.cache_batch_outputs": ("self", "tokenize_strategy", "models", "text_encoding_strategy", "infos"),
    },
    "library.strategy_lumina": {
        "LuminaTokenizeStrategy.tokenize": ("self", "text", "is_negative"),
        "LuminaTokenizeStrategy.tokenize_with_weights": ("self", "text"),
        "LuminaTextEncodingStrategy.encode_tokens": ("self", "tokenize_strategy", "models", "tokens"),
        "LuminaTextEncodingStrategy.encode_tokens_with_weights": ("self", "tokenize_strategy", "models", "tokens", "weights"),
        "LuminaTextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": ("self", "npz_path"),
        "LuminaTextEncoderOutputsCachingStrategy.cache_batch_outputs": ("self", "tokenize_strategy", "models", "text_encoding_strategy", "batch"),
    },
    "library.strategy_anima": {
        "AnimaTokenizeStrategy.tokenize": ("self", "text"),
        "AnimaTextEncodingStrategy.encode_tokens": ("self", "tokenize_strategy", "models", "tokens"),
        "AnimaTextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": ("self", "npz_path"),
        "AnimaTextEncoderOutputsCachingStrategy.cache_batch_outputs": ("self", "tokenize_strategy", "models", "text_encoding_strategy", "infos"),
    },
    "library.flux_utils": {"analyze_checkpoint_state": ("ckpt_path",), "DummyCLIPL.__init__": ("self",)},
    "library.strategy_hunyuan_image": {
        "HunyuanImageTokenizeStrategy.tokenize": ("self", "text"),
        "HunyuanImageTextEncodingStrategy.encode_tokens": ("self", "tokenize_strategy", "models", "tokens"),
        "HunyuanImageTextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": ("self", "npz_path"),
        "HunyuanImageTextEncoderOutputsCachingStrategy.cache_batch_outputs": (
            "self", "tokenize_strategy", "models", "text_encoding_strategy", "infos",
        ),
    },
    "library.lpw_stable_diffusion": {
        "get_weighted_text_embeddings": (
            "pipe", "prompt", "uncond_prompt", "max_embeddings_multiples", "no_boseos_middle", "skip_parsing", "skip_weighting", "clip_skip",
        ),
        "StableDiffusionLongPromptWeightingPipeline.__call__": ("self", "prompt", "negative_prompt"),
    },
    "library.sdxl_lpw_stable_diffusion": {"SdxlStableDiffusionLongPromptWeightingPipeline.__call__": ("self", "prompt", "negative_prompt")},
    **{m: {"LoRANetwork.save_weights": ("self", "file", "dtype", "metadata")} for m in (
        "networks.lora", "networks.lora_flux", "networks.lora_sd3", "networks.lora_lumina", "networks.lora_anima")},
}  # fmt: skip

SCRIPTS = ["train_network.py", "sdxl_train_network.py", "sd3_train_network.py", "flux_train_network.py", "lumina_train_network.py",
           "hunyuan_image_train_network.py"]


def test_targets_are_pinned():
    from te_align.trainers.kohya.hooks import all_targets

    got = {(t.module, t.qualname, t.params) for t in all_targets()}
    want = {(m, q, p) for m, table in PINNED.items() for q, p in table.items()}
    assert got == want


# ------------------------------------------------------------------------------ stand-in tree
_DEFAULTS = {
    "is_negative": "False", "apply_lg_attn_mask": "False", "apply_t5_attn_mask": "None", "enable_dropout": "True",
    "uncond_prompt": "None", "max_embeddings_multiples": "3", "no_boseos_middle": "False", "skip_parsing": "False",
    "skip_weighting": "False", "clip_skip": "None", "negative_prompt": "None",
}  # fmt: skip

_BODIES = {
    "SdTokenizeStrategy.__init__": "self.tokenizer = tokenizer\n        self.max_length = 77",
    "SdTokenizeStrategy.tokenize": "return ['plain', text]",
    "SdTextEncodingStrategy.encode_tokens": "return ['plain', tokens]",
    "SdxlTextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": "return self.cache_to_disk and os.path.exists(npz_path)",
    "SdxlTextEncoderOutputsCachingStrategy.cache_batch_outputs": (
        "for info in infos:\n            np.savez(info.text_encoder_outputs_npz, hidden_state1=np.zeros(2))"
    ),
    "LoRANetwork.save_weights": (
        "from safetensors.torch import save_file\n        import torch\n"
        "        save_file({'lora_unet.w': torch.zeros(2)}, file, metadata)"
    ),
    "analyze_checkpoint_state": "return False, 'schnell' in ckpt_path, (19, 38), []",
    "HunyuanImageTextEncoderOutputsCachingStrategy.is_disk_cached_outputs_expected": "return self.cache_to_disk and os.path.exists(npz_path)",
    "HunyuanImageTextEncoderOutputsCachingStrategy.cache_batch_outputs": (
        "for info in infos:\n            np.savez(info.text_encoder_outputs_npz, vlm_embed=np.zeros(2), ocr_mask=np.array(True))"
    ),
    "StableDiffusionLongPromptWeightingPipeline.__call__": "return negative_prompt",
    "SdxlStableDiffusionLongPromptWeightingPipeline.__call__": "return negative_prompt",
    "get_weighted_text_embeddings": "return 'plain', uncond_prompt",
}


def _write_standin(root: Path, drop: tuple[str, str] | None = None, rename_param: tuple[str, str] | None = None) -> None:
    (root / "library").mkdir(parents=True, exist_ok=True)
    (root / "networks").mkdir(exist_ok=True)
    (root / "library" / "__init__.py").write_text("")
    (root / "networks" / "__init__.py").write_text("")
    (root / "library" / "strategy_base.py").write_text(textwrap.dedent("""
        import torch
        class TokenizeStrategy:
            _strategy = None
            @classmethod
            def get_strategy(cls):
                return cls._strategy
        class WorkerDataset(torch.utils.data.Dataset):
            def __len__(self):
                return 2
            def __getitem__(self, i):
                from library import strategy_sd
                return int(hasattr(strategy_sd.SdTokenizeStrategy.tokenize, "__te_align_original__"))
    """))
    for module, table in PINNED.items():
        classes: dict[str, list[str]] = {}
        funcs: list[str] = []
        extra = dict(table)
        if module == "library.strategy_sd":
            extra["SdTokenizeStrategy.__init__"] = ("self", "tokenizer")
        for qual, params in extra.items():
            if drop == (module, qual):
                continue
            ps = list(params)
            if rename_param and rename_param[0] == f"{module}.{qual}":
                ps = [rename_param[1] if p == ps[-1] else p for p in ps]
            sig = ", ".join(f"{p}={_DEFAULTS[p]}" if p in _DEFAULTS else p for p in ps)
            owner, _, name = qual.rpartition(".")
            body = _BODIES.get(qual, "return None")
            fn = f"def {name}({sig}):\n        {body}\n"
            if owner:
                classes.setdefault(owner, []).append(fn)
            else:
                funcs.append(fn.replace("\n        ", "\n    "))
        src = "import os\nimport numpy as np\n\n" + "\n".join(funcs)
        for cls, fns in classes.items():
            src += f"\nclass {cls}:\n    cache_to_disk = True\n" + "".join("    " + f for f in fns)
        (root / Path(*module.split("."))).with_suffix(".py").write_text(src)
    main = textwrap.dedent("""
        import argparse
        if __name__ == "__main__":
            import torch
            from library import strategy_base, strategy_sd
            p = argparse.ArgumentParser(description="stand-in {name}")
            p.add_argument("--workers", type=int, default=0)
            args = p.parse_args()
            hooked = hasattr(strategy_sd.SdTokenizeStrategy.tokenize, "__te_align_original__")
            print("parent hooked:", int(hooked))
            if args.workers:
                dl = torch.utils.data.DataLoader(strategy_base.WorkerDataset(), num_workers=args.workers,
                                                 multiprocessing_context="spawn", batch_size=1)
                print("worker hooked:", [int(x) for x in dl])
    """)
    for name in SCRIPTS:
        (root / name).write_text(main.replace("{name}", name))


@pytest.fixture
def standin(tmp_path, monkeypatch):
    from te_align.trainers.kohya import hooks as hk

    root = tmp_path / "sd-scripts"
    _write_standin(root)
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in ("library", "networks")}
    for k in saved:
        del sys.modules[k]
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("TE_ALIGN_KOHYA_STATE", "{}")
    for var in ("TE_ALIGN_OVERRIDES", "TE_ALIGN_PROFILE", "TE_ALIGN"):
        monkeypatch.delenv(var, raising=False)
    hk.uninstall()
    yield root
    hk.uninstall()
    for k in [k for k in sys.modules if k.split(".")[0] in ("library", "networks")]:
        del sys.modules[k]
    sys.modules.update(saved)


def test_install_wraps_every_target_and_uninstall_restores(standin):
    from library import strategy_sd, strategy_sdxl

    from te_align.trainers.kohya import hooks as hk

    orig = strategy_sd.SdTokenizeStrategy.__dict__["tokenize"]
    assert hk.install() is True and hk.is_installed()
    assert hk.install() is True  # idempotent
    assert strategy_sd.SdTokenizeStrategy.tokenize.__te_align_original__ is orig
    assert hasattr(strategy_sdxl.SdxlTextEncoderOutputsCachingStrategy.cache_batch_outputs, "__te_align_original__")
    hk.uninstall()
    hk.uninstall()
    assert strategy_sd.SdTokenizeStrategy.__dict__["tokenize"] is orig


@pytest.mark.parametrize(
    "drop, rename, expect",
    [
        (("library.strategy_flux", "FluxTextEncoderOutputsCachingStrategy.cache_batch_outputs"), None, "FluxTextEncoderOutputsCachingStrategy.cache_batch_outputs: not found"),
        (None, ("library.strategy_sd3.Sd3TokenizeStrategy.tokenize", "texts"), "signature changed: expected (self, text), found (self, texts)"),
    ],
)  # fmt: skip
def test_changed_targets_refuse_and_change_nothing(standin, drop, rename, expect):
    from te_align.trainers.kohya import hooks as hk

    _write_standin(standin, drop=drop, rename_param=rename)
    from library import strategy_sd

    with pytest.raises(HookError) as exc:
        hk.install()
    assert expect in str(exc.value) and "trainer version" in str(exc.value) and "48d368f" in str(exc.value)
    assert not hasattr(strategy_sd.SdTokenizeStrategy.tokenize, "__te_align_original__") and not hk.is_installed()


def test_te_align_off_runs_unmodified(standin, monkeypatch):
    from library import strategy_sd

    from te_align.trainers.kohya import hooks as hk

    monkeypatch.setenv("TE_ALIGN", "off")
    assert hk.install() is False
    assert strategy_sd.SdTokenizeStrategy(None).tokenize("x") == ["plain", "x"]


def test_bad_overrides_are_refused(standin, monkeypatch):
    from te_align.trainers.kohya import hooks as hk

    monkeypatch.setenv("TE_ALIGN_OVERRIDES", "[1]")
    with pytest.raises(HookError, match="must be a JSON object"):
        hk.install()
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", '{"kohya.clip_g_exclamation": "sd-scripts"}')
    with pytest.raises(HookError) as e:
        hk.install()
    assert str(e.value) == (
        "kohya.clip_g_exclamation is now the profile override clip_g.tokenizer.pad_token_in_prompt "
        '(pad_id = official, text = sd-scripts): use {"clip_g.tokenizer.pad_token_in_prompt": "text"}'
    )
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", '{"kohya.other": 1}')
    with pytest.raises(HookError, match="the kohya hooks take profile overrides only"):
        hk.install()
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", '{"clip_g.tokenizer.pad_token_in_prompt": "maybe"}')
    hk.install()  # overrides are validated against the profile sd-scripts' architecture picks
    with pytest.raises(ProfileError, match="pad_token_in_prompt"):
        hk.profile_for("sdxl")


def test_hooked_sd_path_equals_te_align_encode_and_overrides_win(standin, monkeypatch, caplog):
    import torch
    from library import strategy_sd

    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import fit_profile
    from te_align.trainers.kohya import hooks as hk

    comps = family_components("sd15")
    p = fit_profile(te_align.profile("sd15"), comps)
    prompts = ["a photo of a cat", "", "wow!"]
    tok = strategy_sd.SdTokenizeStrategy(comps["tokenizer"])
    enc = strategy_sd.SdTextEncodingStrategy()
    hk.install(profile=p)
    out = enc.encode_tokens(tok, [comps["text_encoder"]], tok.tokenize(prompts))[0]
    ref = te_align.encode(p, prompts, tokenizers=comps, text_encoders=comps)["prompt_embeds"]
    assert torch.equal(out, ref)
    hk.uninstall()
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", json.dumps({"clip_l_layer": "penultimate"}))
    with caplog.at_level("INFO", logger="te_align"):
        hk.install(profile=p)
        out = enc.encode_tokens(tok, [comps["text_encoder"]], tok.tokenize(prompts))[0]
    ref2 = te_align.encode(p.with_overrides({"clip_l_layer": "penultimate"}), prompts, tokenizers=comps, text_encoders=comps)
    assert torch.equal(out, ref2["prompt_embeds"]) and not torch.equal(out, ref)
    assert sum("user overrides" in r.getMessage() for r in caplog.records) >= 1


def test_max_token_length_becomes_long_prompt_chunking(standin, caplog):
    """--max_token_length 225 (sd-scripts max_length 227) -> 3 fixed 77-token chunks per caption."""
    import torch
    from library import strategy_sd

    import te_align
    from te_align.encoding import EncodeOptions
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import fit_profile
    from te_align.trainers.kohya import hooks as hk

    comps = family_components("sd15")
    p = fit_profile(te_align.profile("sd15"), comps)
    long = " ".join(f"w{i}" for i in range(60))  # ~120 tokens: needs 2 chunks, the third is padding
    tok = strategy_sd.SdTokenizeStrategy(comps["tokenizer"])
    tok.max_length = 227
    enc = strategy_sd.SdTextEncodingStrategy()
    with caplog.at_level("INFO", logger="te_align"):
        hk.install(profile=p)
        per_caption = [tok.tokenize(x)[0] for x in (long, "a cat")]  # as sd-scripts' dataset does
    assert [t.shape for t in per_caption] == [torch.Size([1, 1, 231])] * 2  # same shape: they collate
    out = enc.encode_tokens(tok, [comps["text_encoder"]], [torch.cat(per_caption)])[0]
    ref = te_align.encode(p, [long, "a cat"], tokenizers=comps, text_encoders=comps,
                          options=EncodeOptions(long_prompt_chunks=3, pad_chunks=True))  # fmt: skip
    assert out.shape == (2, 231, comps["text_encoder"].config.hidden_size)
    assert torch.equal(out, ref["prompt_embeds"])
    plain = te_align.encode(p, [long, "a cat"], tokenizers=comps, text_encoders=comps)["prompt_embeds"]
    assert torch.equal(out[:, :77], plain)  # chunk 1 is the plain 77-token encoding
    assert any("--max_token_length 225: 3 CLIP chunks" in r.getMessage() for r in caplog.records)
    assert hk.cache_fingerprint(p, tok).endswith("+long_prompt_chunks=3")


def _clip_weights(tokenizer, pieces: list[tuple[str, float]], length: int = 77):
    """Per-position weights written out by hand: BOS, each piece's tokens at its weight, 1.0 after."""
    import torch

    w = [1.0]
    for text, weight in pieces:
        w += [weight] * len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return torch.tensor(w + [1.0] * (length - len(w)), dtype=torch.float32)


def test_weighted_captions_follow_profile_with_sd_scripts_weights(standin, caplog, tmp_path):
    """--weighted_captions: the profile's tokens and layer; hidden x weight as sd-scripts (strategy_sd.py:108-129)."""
    import numpy as np
    import torch
    from library import strategy_sd, strategy_sdxl

    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import fit_profile
    from te_align.trainers.kohya import hooks as hk

    comps = family_components("sd15")
    p = fit_profile(te_align.profile("sd15"), comps)
    tok = strategy_sd.SdTokenizeStrategy(comps["tokenizer"])
    enc = strategy_sd.SdTextEncodingStrategy()
    with caplog.at_level("INFO", logger="te_align"):
        hk.install(profile=p)
        ids, weights = tok.tokenize_with_weights(["a photo of a cat", "a (red:1.5) [cat], (wow!)"])
        out = enc.encode_tokens_with_weights(tok, [comps["text_encoder"]], ids, weights)[0]
    plain = te_align.encode(p, ["a photo of a cat", "a red cat, wow!"], tokenizers=comps, text_encoders=comps)["prompt_embeds"]
    w = _clip_weights(comps["tokenizer"], [("a", 1.0), ("red", 1.5), ("cat", 1 / 1.1), (",", 1.0), ("wow!", 1.1)])
    plain_ids = comps["tokenizer"]("a red cat, wow!", padding="max_length", max_length=77, return_tensors="pt")["input_ids"]
    assert ids[0].shape == weights[0].shape == (2, 1, 77) and torch.equal(ids[0][1], plain_ids)  # the syntax is not tokenized
    assert torch.equal(out[0], plain[0])  # no weight syntax: exactly te_align.encode
    assert torch.equal(out[1], plain[1] * w.unsqueeze(-1))
    assert any("weighted prompts (sd: --weighted_captions)" in r.getMessage() and "no renormalisation" in r.getMessage() for r in caplog.records)
    # a weighted TE-output cache (SDXL is_weighted) has its own fingerprint: switching --weighted_captions re-encodes
    cache = strategy_sdxl.SdxlTextEncoderOutputsCachingStrategy()
    cache.is_weighted = True
    npz = str(tmp_path / "img_te_outputs.npz")
    cache.cache_batch_outputs(None, [], None, [type("Info", (), {"text_encoder_outputs_npz": npz})()])
    with np.load(npz) as data:
        assert str(data["te_align_fingerprint"]).endswith("+weighted_captions=sd-scripts")
    assert cache.is_disk_cached_outputs_expected(npz)
    cache.is_weighted = False
    assert not cache.is_disk_cached_outputs_expected(npz)


def test_sample_embeddings_and_missing_negative(standin):
    """SD lpw sample embeddings follow the profile (mean restored); a missing negative becomes zeros only where the profile says so."""
    import types

    import torch
    from library import lpw_stable_diffusion, sdxl_lpw_stable_diffusion

    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import fit_profile
    from te_align.trainers.kohya import hooks as hk
    from te_align.trainers.kohya.hooks.sample import MISSING_NEGATIVE

    comps = family_components("sd15")
    p = fit_profile(te_align.profile("sd15"), comps)
    pipe = types.SimpleNamespace(tokenizer=comps["tokenizer"], text_encoder=comps["text_encoder"])
    assert lpw_stable_diffusion.get_weighted_text_embeddings(pipe, "x", "") == ("plain", "")
    hk.install(profile=p)
    cond, uncond = lpw_stable_diffusion.get_weighted_text_embeddings(pipe, "a (red:1.5) cat", "")
    ref = te_align.encode(p, ["a red cat", ""], tokenizers=comps, text_encoders=comps)["prompt_embeds"]
    h = ref[:1]
    scaled = h * _clip_weights(comps["tokenizer"], [("a", 1.0), ("red", 1.5), ("cat", 1.0)]).unsqueeze(-1)
    expect = scaled * (h.float().mean(dim=(-2, -1)) / scaled.float().mean(dim=(-2, -1))).view(-1, 1, 1)
    assert torch.equal(cond, expect) and torch.equal(uncond, ref[1:])
    # SD1.5 encodes a missing negative; SDXL's profile (force_zeros_for_empty_prompt) marks it for zeros
    assert lpw_stable_diffusion.StableDiffusionLongPromptWeightingPipeline()("x") is None
    hk.uninstall()
    hk.install(profile="sdxl")
    sdxl_pipe = sdxl_lpw_stable_diffusion.SdxlStableDiffusionLongPromptWeightingPipeline()
    assert sdxl_pipe("x") is MISSING_NEGATIVE and (sdxl_pipe("x") or "") is MISSING_NEGATIVE
    assert sdxl_pipe("x", "") == "" and sdxl_pipe("x", negative_prompt="blurry") == "blurry"
    hk.uninstall()
    assert sdxl_pipe("x") is None and lpw_stable_diffusion.get_weighted_text_embeddings(pipe, "x") == ("plain", None)


def test_hooked_anima_path_equals_te_align_encode_padded_to_512(standin, caplog):
    """Anima: the profile's tokens padded to sd-scripts' fixed 512 (per caption, so they collate); encode_tokens
    gives te_align.encode of the batch zero-padded to 512, T5 ids passed through (strategy_anima.py:53-107)."""
    import torch
    from library import strategy_anima

    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import fit_profile
    from te_align.trainers.kohya import hooks as hk

    comps = family_components("anima")
    p = fit_profile(te_align.profile("anima"), comps)
    tok = strategy_anima.AnimaTokenizeStrategy()
    tok.qwen3_tokenizer, tok.t5_tokenizer = comps["tokenizer"], comps["t5_tokenizer"]
    tok.qwen3_max_length, tok.t5_max_length = 256, 512  # sd-scripts --qwen3_max_token_length 256
    enc = strategy_anima.AnimaTextEncodingStrategy()
    prompts = ["a photo of a cat", "", "a very long prompt " * 40]
    with caplog.at_level("INFO", logger="te_align"):
        hk.install()
        assert hk.profile_for("anima").name == "anima"
        hk.uninstall()
        hk.install(profile=p)
        per_caption = [tok.tokenize(x) for x in prompts]
    assert all(t.shape == (1, 512) for c in per_caption for t in c)
    tokens = [torch.cat([c[j] for c in per_caption]) for j in range(4)]
    with torch.no_grad():
        out = enc.encode_tokens(tok, [comps["text_encoder"]], tokens)
        empty = enc.encode_tokens(tok, [comps["text_encoder"]], tok.tokenize(["", ""]))
    toks = {k: comps[k] for k in ("tokenizer", "t5_tokenizer")}

    def padded(t):
        return torch.nn.functional.pad(t, (0, 0, 0, 512 - t.shape[1])) if t.dim() == 3 else torch.nn.functional.pad(t, (0, 512 - t.shape[1]))

    for batch, got in ((prompts, out), (["", ""], empty)):
        ref = te_align.encode(p, batch, tokenizers=toks, text_encoders={"text_encoder": comps["text_encoder"]})
        for name, t in zip(p.output_names, got, strict=True):
            assert t.dtype == ref[name].dtype and torch.equal(t, padded(ref[name])), name
    assert empty[0].shape == (2, 512, comps["text_encoder"].config.hidden_size) and not empty[1].any()
    assert any("--qwen3_max_token_length 256 replaced by profile anima's 512" in r.getMessage() for r in caplog.records)


def test_te_cache_carries_fingerprint_and_mismatch_reencodes(standin, tmp_path, caplog):
    import numpy as np
    from library import strategy_sdxl

    from te_align.trainers.kohya import hooks as hk

    cache = strategy_sdxl.SdxlTextEncoderOutputsCachingStrategy()
    npz = str(tmp_path / "img_te_outputs.npz")
    info = type("Info", (), {"text_encoder_outputs_npz": npz})()
    cache.cache_batch_outputs(None, [], None, [info])  # written before te-align: no fingerprint
    assert cache.is_disk_cached_outputs_expected(npz)
    hk.install(profile="sdxl")
    with caplog.at_level("INFO", logger="te_align"):
        assert not cache.is_disk_cached_outputs_expected(npz)  # stale: re-encode
        cache.cache_batch_outputs(None, [], None, [info])
    assert any("re-encoded" in r.getMessage() and "1 cached" in r.getMessage() for r in caplog.records)
    with np.load(npz) as data:
        assert str(data["te_align_fingerprint"]) == hk.cache_fingerprint(hk.profile_for("sdxl"))
        assert "hidden_state1" in data.files
    assert cache.is_disk_cached_outputs_expected(npz)
    hk.uninstall()
    hk.install(profile="sdxl", **{"clip_g.tokenizer.pad_token_in_prompt": "text"})
    assert not cache.is_disk_cached_outputs_expected(npz)  # overrides are part of the cache key


def _hunyuan_strategies(module, comps):
    """sd-scripts' HunyuanImage strategies without their hub downloads: the tokenizers are the tiny ones."""
    tok = object.__new__(module.HunyuanImageTokenizeStrategy)
    tok.vlm_tokenizer, tok.byt5_tokenizer = comps["tokenizer"], comps["tokenizer_2"]
    return tok, module.HunyuanImageTextEncodingStrategy()


def test_hooked_hunyuan_image_path_equals_te_align_encode_with_fixed_shapes(standin, tmp_path):
    import numpy as np
    import torch
    from library import strategy_hunyuan_image as shi

    import te_align
    from te_align.tiny.encoders import family_components
    from te_align.tiny.fit import fit_profile
    from te_align.trainers.kohya import hooks as hk

    comps = family_components("hunyuanimage")
    p = fit_profile(te_align.profile("hunyuanimage-2.1"), comps)
    models = [comps["text_encoder"], comps["text_encoder_2"]]
    tok, enc = _hunyuan_strategies(shi, comps)
    prompts = ["a cat", 'a sign "OPEN"', "", "it's 'x' on “y”"]
    hk.install(profile=p)
    per_caption = [tok.tokenize(x) for x in prompts]  # as sd-scripts' dataset does, one caption at a time
    assert {tuple(tuple(t.shape) for t in c) for c in per_caption} == {((1, 1034), (1, 1034), (1, 128), (1, 128))}
    tokens = [torch.cat([c[i] for c in per_caption]) for i in range(4)]
    vlm, vlm_mask, byt5, byt5_mask, ocr = enc.encode_tokens(tok, models, tokens)
    ref = te_align.encode(p, prompts, tokenizers=comps, text_encoders=comps)
    for got, name in ((vlm, "prompt_embeds"), (vlm_mask, "prompt_embeds_mask"), (byt5, "prompt_embeds_2"), (byt5_mask, "prompt_embeds_mask_2")):
        assert got.dtype == ref[name].dtype and torch.equal(got, ref[name]), name
    assert ocr.dtype == torch.bool and ocr.tolist() == [False, True, False, True]
    assert hk.profile_for("hunyuan_image").name == p.name
    with pytest.raises(HookError, match="before the hooks were installed"):
        enc.encode_tokens(tok, models, [tokens[0][:, :100], tokens[1][:, :100], tokens[2], tokens[3]])
    # the TE cache of this architecture carries the fingerprint too
    cache = shi.HunyuanImageTextEncoderOutputsCachingStrategy()
    npz = str(tmp_path / "img_hi_te.npz")
    info = type("Info", (), {"text_encoder_outputs_npz": npz})()
    hk.uninstall()
    cache.cache_batch_outputs(None, [], None, [info])
    hk.install(profile="hunyuanimage-2.1")
    assert not cache.is_disk_cached_outputs_expected(npz)
    cache.cache_batch_outputs(None, [], None, [info])
    with np.load(npz) as data:
        assert str(data["te_align_fingerprint"]) == hk.cache_fingerprint(te_align.profile("hunyuanimage-2.1"))
    assert cache.is_disk_cached_outputs_expected(npz)
    hk.uninstall()
    hk.install()  # no explicit profile: the architecture's bundled one
    assert hk.profile_for("hunyuan_image").name == "hunyuanimage-2.1"


@pytest.mark.parametrize(("module", "arch", "profile_name"), [("lora_flux", "flux", "flux-dev"), ("lora_anima", "anima", "anima")])
def test_saved_lora_gets_the_stamp(standin, tmp_path, module, arch, profile_name):
    import importlib

    from te_align.metadata import read
    from te_align.trainers.kohya import hooks as hk

    hk.install()
    hk.profile_for(arch)
    out = tmp_path / "lora.safetensors"
    importlib.import_module(f"networks.{module}").LoRANetwork().save_weights(str(out), None, {"ss_network_dim": "4"})
    info = read(out)
    assert info["stamped"] and info["te_align"]["te_align.profile"] == profile_name
    assert info["profile_check"]["matches"] is True


def test_flux_variant_comes_from_sd_scripts_checkpoint_analysis(standin):
    from library import flux_utils

    from te_align.trainers.kohya import hooks as hk

    hk.install()
    flux_utils.analyze_checkpoint_state("/models/flux1-schnell.safetensors")
    assert hk.profile_for("flux").name == "flux-schnell"
    assert json.loads(os.environ["TE_ALIGN_KOHYA_STATE"]) == {"flux_variant": "schnell"}  # workers inherit it
    flux_utils.DummyCLIPL()
    hk.RUN.profiles.clear()
    assert hk.profile_for("flux").name == "chroma"


# --------------------------------------------------------------------------------- on-disk patch
def _tree(root: Path) -> dict[str, bytes]:
    """Every file of the tree but git's and Python's own bytecode (running the trainer writes __pycache__ unless
    PYTHONDONTWRITEBYTECODE is set; that is Python's, not te-align's, and unpatch leaves it)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "te_align", *args], capture_output=True, text=True, env=e)


def test_detect_layouts(tmp_path):
    from te_align.patching import PatchError
    from te_align.trainers.kohya.patch import detect

    bare = tmp_path / "bare"
    _write_standin(bare)
    (bare / "library" / "strategy_base.py").write_text("")
    d = detect(bare)
    assert d is not None and d.root == bare and d.layout == "sd-scripts checkout" and d.version == "unknown (no git)"
    gui = tmp_path / "kohya_ss"
    (gui / "kohya_gui").mkdir(parents=True)
    (gui / "sd-scripts").mkdir()
    (gui / ".git").mkdir()  # a clone of kohya_ss: the way out is git's submodule command
    with pytest.raises(PatchError, match="submodule update --init"):
        detect(gui)
    _write_standin(gui / "sd-scripts")
    d = detect(gui)
    assert d is not None and d.root == gui / "sd-scripts" and d.layout == "kohya_ss GUI"
    assert detect(tmp_path) is None
    r = _cli("patch", str(tmp_path))
    assert r.returncode != 0 and "not a trainer installation" in r.stderr


def test_patch_runs_original_with_hooks_in_spawn_workers_and_unpatch_restores(tmp_path):
    gui = tmp_path / "kohya_ss"
    (gui / "kohya_gui").mkdir(parents=True)
    root = gui / "sd-scripts"
    _write_standin(root)
    before = _tree(root)
    r = _cli("patch", str(gui), "--profile", "flux-dev")
    assert r.returncode == 0, r.stderr
    assert "kohya_ss GUI" in r.stdout and "replace train_network.py" in r.stdout
    assert _cli("patch", str(gui), "--profile", "flux-dev").stdout.strip().endswith("nothing to do")
    st = _cli("status", str(gui))
    assert st.returncode == 0 and "profile flux-dev" in st.stdout
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # the GUI's launch path: <gui>/sd-scripts/<script>, run from the GUI folder
    run = subprocess.run([sys.executable, "sd-scripts/train_network.py", "--help"], cwd=gui, capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "stand-in train_network.py" in run.stdout, run.stderr
    run = subprocess.run([sys.executable, "sd-scripts/train_network.py", "--workers", "2"], cwd=gui, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "parent hooked: 1" in run.stdout and "worker hooked: [1, 1]" in run.stdout
    off = subprocess.run([sys.executable, "sd-scripts/train_network.py", "--workers", "1"], cwd=gui, capture_output=True, text=True,
                         env={**env, "TE_ALIGN": "off"})  # fmt: skip
    assert "parent hooked: 0" in off.stdout and "worker hooked: [0, 0]" in off.stdout, off.stderr
    r = _cli("unpatch", str(gui))
    assert r.returncode == 0, r.stderr
    assert _tree(root) == before


def test_patch_refuses_unknown_version_and_dirty_tree(tmp_path):
    import shutil

    root = tmp_path / "sd-scripts"
    _write_standin(root, drop=("library.strategy_lumina", "LuminaTokenizeStrategy.tokenize"))
    r = _cli("patch", str(root))
    assert r.returncode != 0 and "unknown sd-scripts version" in r.stderr and "LuminaTokenizeStrategy.tokenize: not found" in r.stderr
    assert "checkout 48d368f" in r.stderr and not (root / ".te-align").exists()
    _write_standin(root)
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    g = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*g, "init", "-q"], check=True)
    subprocess.run([*g, "add", "."], check=True)
    subprocess.run([*g, "commit", "-qm", "x"], check=True)
    (root / "library" / "strategy_sd.py").write_text((root / "library" / "strategy_sd.py").read_text() + "# local edit\n")
    r = _cli("patch", str(root))
    assert r.returncode != 0 and "uncommitted changes (library/strategy_sd.py)" in r.stderr and "stash" in r.stderr
    subprocess.run([*g, "checkout", "-q", "--", "."], check=True)
    assert _cli("patch", str(root)).returncode == 0
    assert _cli("patch", str(root)).returncode == 0  # our own changes do not count as dirty
    data = json.loads((root / ".te-align" / "manifest.json").read_text())
    data["te_align_version"] = "99.0"
    (root / ".te-align" / "manifest.json").write_text(json.dumps(data))
    r = _cli("patch", str(root))
    assert r.returncode != 0 and "newer than this te-align" in r.stderr


def test_importing_the_hooks_installs_nothing(tmp_path):
    """No hook installs itself on import (the drop-in scripts call install()): not even with the removed
    TE_ALIGN_ACTIVE=1 in the environment, and the te-align CLI (which reads the hook target list for
    patch/status) runs beside it."""
    env = {**os.environ, "TE_ALIGN_ACTIVE": "1", "PYTHONPATH": str(REPO)}
    probe = "import te_align.trainers.kohya.hooks as k, te_align.trainers.ai_toolkit.hooks; print(k.is_installed())"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    r = subprocess.run([sys.executable, "-m", "te_align", "status", str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "not patched by te-align" in r.stdout, r.stderr


def test_drop_in_decides_off_with_the_hooks_word_list(tmp_path):
    """The drop-in decides TE_ALIGN=off before it can import te-align: it carries te_align.hooks.base.OFF_WORDS."""
    from te_align.hooks.base import OFF_WORDS
    from te_align.trainers.kohya.patch import shim_source

    src = shim_source("train_network.py", "sdxl").decode()
    assert f"not in {OFF_WORDS!r}:" in src and 'environ.setdefault("TE_ALIGN_PROFILE", \'sdxl\')' in src
    assert "_te_kohya.install()" in src and "TE_ALIGN_ACTIVE" not in src
    compile(src, "train_network.py", "exec")


def test_patch_plan_covers_the_anima_scripts(tmp_path):
    from te_align.trainers.kohya.patch import SCRIPTS, detect, plan

    assert ("anima_train_network.py", "anima") in SCRIPTS and ("anima_train.py", "anima") in SCRIPTS
    root = tmp_path / "sd-scripts"
    _write_standin(root)
    (root / "anima_train_network.py").write_text("print('anima')\n")
    changes = {c.path for c in plan(detect(root), None).changes}
    assert {"anima_train_network.py", "te_align_originals/anima_train_network.py"} <= changes
    assert "anima_train.py" not in changes  # only scripts that exist get a drop-in
