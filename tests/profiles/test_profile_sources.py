"""Profiles built from diffusers folders, hub repos (cache only, never the network) and single files."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from te_align._safetensors import read_header
from te_align.cli import main
from te_align.errors import ProfileError, TeAlignError
from te_align.profiles import bundled, bundled_names, load_profile_file, profile
from te_align.profiles.model import AlignmentProfile
from te_align.profiles.resolve import build, classify
from te_align.profiles.sources.checkpoint import from_single_file
from te_align.profiles.sources.common import RECIPES, BuildReport
from te_align.profiles.sources.folder import from_folder
from te_align.profiles.sources.hub import HUB_PATTERNS, from_hub
from tests.support.files import (
    DM,
    chroma_keys,
    diffusers_folder,
    flux_keys,
    hf_clip_keys,
    mmdit_keys,
    open_clip_keys,
    t5_keys,
    unet_keys,
    write_json,
    write_numpy_safetensors,
    write_sparse_safetensors,
)


def need(name: str) -> AlignmentProfile:
    """The bundled profile (every profile these tests name is bundled: a missing one fails)."""
    return bundled(name)


def one_line(e: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


# ================================================================================ folders
FOLDER_PROFILES = ["sd15", "sd21", "sdxl", "sd3-medium", "sd35-medium", "sd35-large", "flux-dev", "flux-schnell",
                   "chroma", "pixart-sigma", "auraflow", "lumina2", "hidream", "sana", "qwen-image", "wan21", "hunyuanimage-2.1"]


@pytest.mark.parametrize("name", FOLDER_PROFILES)
def test_folder_stating_the_bundled_values_rebuilds_the_bundled_profile(tmp_path: Path, name: str) -> None:
    base = need(name)
    folder = diffusers_folder(tmp_path / "model", base)
    report = build(folder)
    assert isinstance(report, BuildReport)
    assert (report.base, report.kind) == (name, "folder")
    assert report.differences == [], report.summary_lines()
    assert report.profile.fingerprint() == base.fingerprint()
    assert report.confirmed > 0
    assert report.profile.name == "model"
    assert report.profile.aliases == ()


def test_every_recipe_row_names_a_pipeline_of_its_profile() -> None:
    for row in RECIPES:
        assert row.profile in bundled_names(), row
        p = bundled(row.profile)
        assert p.pipeline.startswith(row.pipeline), (row, p.pipeline)
        subs = {s.encoder_subfolder for s in p.slots}
        assert {sub for _, sub in row.encoders} <= subs, row


@pytest.mark.parametrize(
    ("name", "class_name"),
    [
        ("sdxl", "StableDiffusionXLImg2ImgPipeline"),
        ("sdxl", "StableDiffusionXLControlNetPAGPipeline"),
        ("sd15", "StableDiffusionInpaintPipeline"),
        ("sd35-large", "StableDiffusion3Img2ImgPipeline"),
        ("flux-dev", "FluxImg2ImgPipeline"),
        ("flux-schnell", "FluxInpaintPipeline"),
        ("chroma", "ChromaImg2ImgPipeline"),
        ("lumina2", "Lumina2Text2ImgPipeline"),
        ("qwen-image", "QwenImageImg2ImgPipeline"),
    ],
)
def test_variant_pipelines_map_to_the_base_profile(tmp_path: Path, name: str, class_name: str) -> None:
    base = need(name)
    report = build(diffusers_folder(tmp_path / "m", base, class_name=class_name))
    assert report.base == name
    assert class_name in report.reason


@pytest.mark.parametrize(
    ("name", "depth", "dual"),
    [("sd3-medium", 24, []), ("sd35-medium", 24, list(range(13))), ("sd35-large", 38, [])],
)
def test_sd3_variants_from_transformer_config(tmp_path: Path, name: str, depth: int, dual: list[int]) -> None:
    need(name)
    folder = diffusers_folder(
        tmp_path / "finetune", bundled("sd35-large"),
        transformer={"_class_name": "SD3Transformer2DModel", "num_layers": depth, "dual_attention_layers": dual},
    )
    report = build(folder)
    assert report.base == name
    assert f"num_layers {depth}" in report.reason


def test_sd3_with_unknown_depth_is_refused(tmp_path: Path) -> None:
    folder = diffusers_folder(tmp_path / "x", need("sd35-large"),
                              transformer={"_class_name": "SD3Transformer2DModel", "num_layers": 30})
    with pytest.raises(ProfileError) as e:
        build(folder)
    msg = one_line(e)
    assert "transformer/config.json" in msg and "num_layers" in msg and "30 layers" in msg


@pytest.mark.parametrize("guidance", [True, False])
def test_flux_dev_or_schnell_from_guidance_embeds(tmp_path: Path, guidance: bool) -> None:
    need("flux-dev")
    need("flux-schnell")
    folder = diffusers_folder(tmp_path / "some-flux", bundled("flux-dev"),
                              transformer={"_class_name": "FluxTransformer2DModel", "guidance_embeds": guidance})
    assert build(folder).base == ("flux-dev" if guidance else "flux-schnell")


def test_flux_dev_or_schnell_from_scheduler_then_name(tmp_path: Path) -> None:
    need("flux-dev")
    need("flux-schnell")
    empty = {"_class_name": "FluxTransformer2DModel"}
    folder = diffusers_folder(tmp_path / "a", bundled("flux-dev"), transformer=empty)
    write_json(folder / "scheduler" / "scheduler_config.json", {"use_dynamic_shifting": False, "shift": 1.0})
    report = build(folder)
    assert report.base == "flux-schnell" and "use_dynamic_shifting" in report.reason
    by_name = diffusers_folder(tmp_path / "FLUX.1-schnell-finetune", bundled("flux-dev"), transformer=empty)
    assert build(by_name).base == "flux-schnell"
    unknown = diffusers_folder(tmp_path / "b", bundled("flux-dev"), transformer=empty)
    with pytest.raises(ProfileError) as e:
        build(unknown)
    assert "dev" in one_line(e) and "schnell" in str(e.value)


def test_sd1_or_sd2_from_text_encoder_width(tmp_path: Path) -> None:
    sd15 = need("sd15")
    need("sd21")
    folder = diffusers_folder(tmp_path / "m", sd15, encoder_changes={"text_encoder": {"hidden_size": 1024}})
    report = build(folder)
    assert report.base == "sd21" and "hidden_size 1024" in report.reason


def test_sdxl_refiner_is_refused(tmp_path: Path) -> None:
    base = need("sdxl")
    folder = diffusers_folder(tmp_path / "refiner", base, class_name="StableDiffusionXLImg2ImgPipeline")
    index = json.loads((folder / "model_index.json").read_text())
    index["text_encoder"] = [None, None]
    index["tokenizer"] = [None, None]
    write_json(folder / "model_index.json", index)
    with pytest.raises(ProfileError) as e:
        build(folder)
    assert "refiner" in one_line(e)


def test_folder_values_win_and_are_reported_with_provenance(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(
        tmp_path / "my-finetune", base,
        encoder_changes={"text_encoder_2": {"torch_dtype": "bfloat16"}, "text_encoder_3": {"num_layers": 12}},
    )
    report = build(folder)
    rows = {d.path: d for d in report.differences}
    assert set(rows) == {"slots.clip_g.encoder.dtype", "slots.t5.encoder.num_layers"}
    d = rows["slots.t5.encoder.num_layers"]
    assert (d.bundled, d.found) == (24, 12)
    assert d.file == str(folder / "text_encoder_3" / "config.json")
    path, bundled_value, found, file = d  # rows unpack as (path, bundled, found, file)
    assert (path, bundled_value, found, file) == tuple(d)
    p = report.profile
    assert p.get("slots.t5.encoder.num_layers") == 12
    assert p.get("slots.clip_g.encoder.dtype") == "bfloat16"
    pv = p.provenance_of("slots.t5.encoder.num_layers")
    assert pv is not None and pv.status == "official"
    assert str(folder / "text_encoder_3" / "config.json") in pv.source and "num_layers" in pv.source
    assert any(a.value == 24 for a in pv.alternatives)
    assert p.fingerprint() != base.fingerprint()
    text = "\n".join(report.summary_lines())
    assert "slots.t5.encoder.num_layers: 24 -> 12" in text and "sd35-large" in text


def test_clip_model_max_length_is_adopted_but_t5_is_only_noted(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(
        tmp_path / "m", base,
        tokenizer_changes={"tokenizer": {"model_max_length": 64}, "tokenizer_3": {"model_max_length": 77}},
    )
    report = build(folder)
    assert [(d.path, d.found) for d in report.differences] == [("slots.clip_l.tokenizer.max_length", 64)]
    assert report.profile.get("slots.t5.tokenizer.max_length") == base.get("slots.t5.tokenizer.max_length")
    assert any("tokenizer_3/tokenizer_config.json model_max_length 77 not adopted" in n for n in report.notes)


def test_clip_model_max_length_beyond_the_positions_is_not_adopted(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base, tokenizer_changes={"tokenizer": {"model_max_length": 8192}})
    report = build(folder)
    assert report.differences == []
    assert any("8192 not adopted" in n for n in report.notes)


def test_token_changes_take_their_ids_from_vocab_json(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base)
    for rel in ("tokenizer_2/tokenizer_config.json", "tokenizer_2/special_tokens_map.json"):
        data = json.loads((folder / rel).read_text())
        data["pad_token"] = "<|endoftext|>"
        write_json(folder / rel, data)
    write_json(folder / "tokenizer_2" / "vocab.json", {"!": 0, "<|startoftext|>": 49406, "<|endoftext|>": 49407})
    report = build(folder)
    found = {d.path: d.found for d in report.differences}
    assert found == {"slots.clip_g.tokenizer.pad_token": "<|endoftext|>", "slots.clip_g.tokenizer.pad_token_id": 49407}
    pv = report.profile.provenance_of("slots.clip_g.tokenizer.pad_token_id")
    assert pv is not None and "tokenizer_2/vocab.json" in pv.source


def test_token_ids_from_added_tokens_decoder_and_unknown_ids(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base)
    (folder / "tokenizer_3" / "special_tokens_map.json").unlink()
    tc = json.loads((folder / "tokenizer_3" / "tokenizer_config.json").read_text())
    tc["added_tokens_decoder"] = {"0": {"content": "<pad>", "special": True}, "1": {"content": "</s>", "special": True}}
    write_json(folder / "tokenizer_3" / "tokenizer_config.json", tc)
    assert build(folder).differences == []
    tc["eos_token"] = "<eos>"
    write_json(folder / "tokenizer_3" / "tokenizer_config.json", tc)
    found = {d.path: d.found for d in build(folder).differences}
    assert found == {"slots.t5.tokenizer.eos_token": "<eos>", "slots.t5.tokenizer.eos_token_id": None}


def test_special_tokens_map_wins_unless_added_tokens_decoder(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base)
    tc_path = folder / "tokenizer_2" / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["pad_token"] = "<|endoftext|>"
    write_json(tc_path, tc)
    report = build(folder)
    assert report.differences == []  # special_tokens_map.json still says "!"
    assert any("special_tokens_map.json" in n and "pad_token" in n for n in report.notes)
    tc["added_tokens_decoder"] = {"49407": {"content": "<|endoftext|>"}, "49406": {"content": "<|startoftext|>"}}
    write_json(tc_path, tc)
    found = {d.path: d.found for d in build(folder).differences}
    assert found == {"slots.clip_g.tokenizer.pad_token": "<|endoftext|>", "slots.clip_g.tokenizer.pad_token_id": 49407}


def test_missing_and_null_components_are_noted(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base)
    index = json.loads((folder / "model_index.json").read_text())
    index["text_encoder_3"] = [None, None]
    index["tokenizer_3"] = [None, None]
    write_json(folder / "model_index.json", index)
    for sub in ("text_encoder_3", "tokenizer_3"):
        for f in (folder / sub).iterdir():
            f.unlink()
        (folder / sub).rmdir()
    report = build(folder)
    assert report.differences == []
    assert any("text_encoder_3 to null" in n for n in report.notes)


def test_encoder_class_follows_model_index(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base, encoder_changes={"text_encoder": {"architectures": ["CLIPTextModel"]}})
    report = build(folder)
    assert report.differences == []
    assert any("architectures[0] is CLIPTextModel" in n for n in report.notes)


def test_nested_text_config_and_llm_families(tmp_path: Path) -> None:
    base = bundled("qwen-image")
    slot = next(s for s in base.slots if not s.encoder.cls.startswith(("CLIP", "T5", "UMT5")))
    folder = diffusers_folder(tmp_path / "m", base)
    cfg_path = folder / slot.encoder_subfolder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    inner = {k: cfg.pop(k) for k in ("hidden_size", "num_hidden_layers")}
    cfg["text_config"] = inner
    write_json(cfg_path, cfg)
    report = build(folder)
    assert report.base == "qwen-image" and report.differences == []


# ------------------------------------------------------------------------------ folder errors
def test_folder_without_model_index(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError) as e:
        build(tmp_path / "empty")
    msg = one_line(e)
    assert "model_index.json" in msg and "diffusers" in msg


def test_malformed_json_names_file_line_and_column(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base)
    (folder / "text_encoder_2" / "config.json").write_text('{\n  "hidden_size": 1280,\n  "num_hidden_layers": 32,,\n}')
    with pytest.raises(ProfileError) as e:
        build(folder)
    msg = one_line(e)
    assert str(folder / "text_encoder_2" / "config.json") in msg
    assert "line 3 column" in msg


def test_unknown_pipeline_class_lists_the_supported_families(tmp_path: Path) -> None:
    write_json(tmp_path / "m" / "model_index.json", {"_class_name": "KandinskyV22Pipeline"})
    with pytest.raises(ProfileError) as e:
        build(tmp_path / "m")
    msg = one_line(e)
    assert "KandinskyV22Pipeline" in msg and "_class_name" in msg
    assert "StableDiffusion3Pipeline" in msg and "FluxPipeline" in msg and "sd35-large" in msg


def test_flux2_and_qwen_edit_pipelines_are_not_mistaken_for_bundled_ones(tmp_path: Path) -> None:
    for cls in ("Flux2Pipeline", "QwenImageEditPipeline", "StableDiffusionUpscalePipeline", "HunyuanImageRefinerPipeline"):
        write_json(tmp_path / cls / "model_index.json", {"_class_name": cls})
        with pytest.raises(ProfileError, match="has no bundled profile"):
            build(tmp_path / cls)


def test_missing_hidden_size_names_file_key_and_expectation(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base, encoder_changes={"text_encoder_2": {"hidden_size": None}})
    with pytest.raises(ProfileError) as e:
        build(folder)
    msg = one_line(e)
    assert str(folder / "text_encoder_2" / "config.json") in msg
    assert "'hidden_size'" in msg and "width" in msg


def test_wrongly_typed_config_value(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base, encoder_changes={"text_encoder": {"num_hidden_layers": "twelve"}})
    with pytest.raises(ProfileError, match=r"key 'num_hidden_layers': expected a positive integer, got 'twelve'"):
        build(folder)


def test_missing_source_and_other_formats(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such model folder"):
        build(tmp_path / "nope")
    with pytest.raises(ProfileError, match="no such checkpoint"):
        build(tmp_path / "nope.safetensors")
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"not opened")
    with pytest.raises(ProfileError, match="never opened"):
        build(ckpt)


# ------------------------------------------------------------------- registry, logging, CLI
def test_registry_dispatches_to_folders_and_files(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base)
    p = profile(str(folder))
    assert p.fingerprint() == base.fingerprint()
    ckpt = write_sparse_safetensors(tmp_path / "sd35.safetensors", mmdit_keys(38))
    assert profile(str(ckpt)).fingerprint() == base.fingerprint()


def test_one_classification_of_every_source(tmp_path: Path) -> None:
    folder = diffusers_folder(tmp_path / "m", bundled("sd35-large"))
    (tmp_path / "p.toml").write_text(bundled("sd15").to_toml())
    ckpt = write_sparse_safetensors(tmp_path / "c.sft", mmdit_keys(38))
    cases = {
        "sd35-large": ("bundled", "sd35-large", None),
        "SD3.5 Large": ("bundled", "sd35-large", None),
        str(folder): ("folder", "", folder),
        str(folder / "model_index.json"): ("folder", "", folder),
        str(tmp_path / "p.toml"): ("profile-file", "", tmp_path / "p.toml"),
        str(ckpt): ("single-file", "", ckpt),
        "owner/model@refs/pr/1": ("hub", "owner/model", None),
    }
    for text, (kind, name, path) in cases.items():
        src = classify(text)
        assert (src.kind, src.name, src.path) == (kind, name, path), text
    assert classify("owner/model@refs/pr/1").revision == "refs/pr/1"
    # an official repo id is also an alias: te_align.profile() takes the bundled profile, build reads the hub
    assert classify("stabilityai/stable-diffusion-3.5-large").kind == "bundled"
    assert classify("stabilityai/stable-diffusion-3.5-large", bundled_names=False).kind == "hub"
    # a missing file is never taken for a hub id, and build does not take profiles
    with pytest.raises(ProfileError, match="no such profile file"):
        profile("configs/mine.toml")
    with pytest.raises(ProfileError, match="no such model folder"):
        build("sd15")
    with pytest.raises(ProfileError, match="a profile file, not a model"):
        build(tmp_path / "p.toml")
    assert profile(str(folder / "model_index.json")).fingerprint() == bundled("sd35-large").fingerprint()


def test_each_difference_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "logged", base, encoder_changes={"text_encoder": {"torch_dtype": "float32"}})
    with caplog.at_level(logging.INFO, logger="te_align"):
        from_folder(folder)
        from_folder(folder)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "te_align"]
    assert len(warnings) == 1
    assert "slots.clip_l.encoder.dtype" in warnings[0].getMessage() and "float32" in warnings[0].getMessage()


def test_cli_build_writes_a_profile_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base, encoder_changes={"text_encoder": {"torch_dtype": "bfloat16"}})
    out = tmp_path / "out.toml"
    assert main(["profile", "build", str(folder), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "sd35-large" in err and "slots.clip_l.encoder.dtype" in err and f"wrote {out}" in err
    loaded = load_profile_file(out)
    assert loaded.get("slots.clip_l.encoder.dtype") == "bfloat16"
    assert loaded.fingerprint() == build(folder).profile.fingerprint()
    js = tmp_path / "out.json"
    assert main(["profile", "build", str(folder), "-o", str(js)]) == 0
    assert load_profile_file(js).fingerprint() == loaded.fingerprint()
    assert main(["profile", "build", str(folder)]) == 0
    assert 'name = "m"' in capsys.readouterr().out


def test_cli_build_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["profile", "build", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("te-align: error:") and "\n" not in err and "Traceback" not in err


def test_cli_build_imports_no_torch(tmp_path: Path) -> None:
    base = need("sd35-large")
    folder = diffusers_folder(tmp_path / "m", base)
    ckpt = write_sparse_safetensors(tmp_path / "c.safetensors", mmdit_keys(38))
    code = (
        "import sys\n"
        "from te_align.cli import main\n"
        f"assert main(['profile', 'build', {str(folder)!r}, '-o', {str(tmp_path / 'o.toml')!r}]) == 0\n"
        f"assert main(['profile', 'build', {str(ckpt)!r}, '-o', {str(tmp_path / 'c.toml')!r}]) == 0\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'diffusers')]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ==================================================================================== hub
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo_id: str, folder_writer: Any) -> Path:
    """Lay out a huggingface_hub cache entry (refs/main -> snapshots/<commit>/...) for ``repo_id``."""
    repo_dir = root / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    folder_writer(repo_dir / "snapshots" / COMMIT)
    return repo_dir


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_hub_offline_and_not_cached(offline_cache: Path) -> None:
    with pytest.raises(ProfileError) as e:
        from_hub("someone/not-cached-model")
    msg = one_line(e)
    assert "someone/not-cached-model" in msg and "HF_HUB_OFFLINE" in msg and str(offline_cache) in msg


def test_hub_from_a_prepopulated_cache(offline_cache: Path) -> None:
    base = need("sd35-large")
    repo = "stabilityai/stable-diffusion-3.5-large"
    hub_cache(offline_cache, repo, lambda d: diffusers_folder(d, base, encoder_changes={"text_encoder": {"torch_dtype": "bfloat16"}}))
    report = build(repo)
    assert (report.kind, report.base, report.source) == ("hub", "sd35-large", repo)
    assert report.profile.repo == repo
    [d] = report.differences
    assert d.path == "slots.clip_l.encoder.dtype"
    assert d.file == f"{repo}@{COMMIT[:12]}/text_encoder/config.json"
    assert from_hub(repo).fingerprint() == report.profile.fingerprint()
    # a pinned revision (commit hash) resolves from the cache too
    pinned = build(f"{repo}@{COMMIT}")
    assert pinned.source == f"{repo}@{COMMIT}"
    # and the registry routes repo ids here (the alias table does not know this fine-tune's id)
    hub_cache(offline_cache, "me/flux-schnell-ft", lambda d: diffusers_folder(d, need("flux-schnell")))
    assert profile("me/flux-schnell-ft").fingerprint() == bundled("flux-schnell").fingerprint()


def test_profile_and_build_accept_the_same_hub_ids(offline_cache: Path) -> None:
    """One dispatcher: te_align.profile() takes every source `te-align profile build` takes (issue 12, bug 1)."""
    flux = need("flux-schnell")
    hub_cache(offline_cache, "owner/my-flux-finetune", lambda d: diffusers_folder(d, flux))
    for source in ("owner/my-flux-finetune@main", f"owner/my-flux-finetune@{COMMIT}", "owner/my-flux-finetune"):
        built = build(source)
        assert built.kind == "hub" and built.source == source
        assert profile(source).fingerprint() == built.profile.fingerprint() == flux.fingerprint()


def test_hub_cache_via_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = need("sd35-large")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_cache(tmp_path / "home" / "hub", "a/b", lambda d: diffusers_folder(d, base))
    assert build("a/b").differences == []


def test_hub_repo_without_model_index(offline_cache: Path) -> None:
    hub_cache(offline_cache, "a/single-file-repo", lambda d: write_json(d / "README.json", {}))
    with pytest.raises(ProfileError, match=r"a/single-file-repo' has no model_index\.json"):
        build("a/single-file-repo")


def _http_error(cls: type[Exception]) -> Exception:
    import httpx2

    response = httpx2.Response(403, request=httpx2.Request("GET", "https://huggingface.co/api/models/a/b"))
    return cls("boom", response=response)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("error", "expected"),
    [("GatedRepoError", "is gated"), ("RepositoryNotFoundError", "not found"), ("RevisionNotFoundError", "no such revision")],
)
def test_hub_errors_are_one_line_and_name_the_repo(
    monkeypatch: pytest.MonkeyPatch, error: str, expected: str
) -> None:
    import huggingface_hub
    from huggingface_hub import errors

    pytest.importorskip("httpx2")
    exc = _http_error(getattr(errors, error))

    def fake_download(*args: Any, **kwargs: Any) -> str:
        raise exc

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(ProfileError) as e:
        from_hub("black-forest-labs/FLUX.1-dev")
    msg = one_line(e)
    assert "black-forest-labs/FLUX.1-dev" in msg and expected in msg


def test_hub_downloads_only_small_config_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    base = need("sd35-large")
    snapshot = diffusers_folder(tmp_path / "snap" / COMMIT, base)
    calls: list[dict[str, Any]] = []

    def fake_download(repo_id: str, **kwargs: Any) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert build("org/model@v1.0").source == "org/model@v1.0"
    [call] = calls
    assert call["repo_id"] == "org/model" and call["revision"] == "v1.0"
    assert call["local_files_only"] is False and call["cache_dir"] == str(tmp_path / "cache")
    assert call["allow_patterns"] == list(HUB_PATTERNS)
    assert all(p.endswith(".json") for p in call["allow_patterns"])


# ============================================================================== single files
def _te_shapes(p: AlignmentProfile, name: str) -> dict[str, tuple[int, ...]]:
    """Embedded text encoders sized from the bundled profile's own encoder values."""

    def enc(slot: str) -> Any:
        return p.slot(slot).encoder

    def by_sub(sub: str) -> Any:
        return next(s.encoder for s in p.slots if s.encoder_subfolder == sub)

    def clip(prefix: str, e: Any, projection: bool = False) -> dict[str, tuple[int, ...]]:
        return hf_clip_keys(prefix, hidden=e.hidden_size, layers=e.num_layers, vocab=e.vocab_size or 49408,
                            positions=e.max_position_embeddings or 77,
                            projection=e.projection_dim if projection else None)

    def t5(e: Any) -> dict[str, tuple[int, ...]]:
        return t5_keys(d_model=e.hidden_size, layers=e.num_layers, vocab=e.vocab_size or 32128)

    if name == "sd15":
        return clip("cond_stage_model.transformer.text_model.", by_sub("text_encoder"))
    if name == "sd21":
        e = by_sub("text_encoder")
        return open_clip_keys("cond_stage_model.model.", width=e.hidden_size, layers=e.num_layers + 1,
                              vocab=e.vocab_size or 49408, positions=e.max_position_embeddings or 77, projection=1024)
    if name == "sdxl":
        e2 = by_sub("text_encoder_2")
        return {**clip("conditioner.embedders.0.transformer.text_model.", by_sub("text_encoder")),
                **open_clip_keys("conditioner.embedders.1.model.", width=e2.hidden_size, layers=e2.num_layers,
                                 vocab=e2.vocab_size or 49408, positions=e2.max_position_embeddings or 77,
                                 projection=e2.projection_dim)}
    if name.startswith(("sd3", "sd35")):
        return {**clip("text_encoders.clip_l.transformer.text_model.", by_sub("text_encoder")),
                **clip("text_encoders.clip_g.transformer.text_model.", by_sub("text_encoder_2"), projection=True),
                **t5(by_sub("text_encoder_3"))}
    if name.startswith("flux"):
        return {**clip("text_encoders.clip_l.transformer.text_model.", by_sub("text_encoder")), **t5(by_sub("text_encoder_2"))}
    if name == "chroma":
        return t5(by_sub("text_encoder"))
    raise AssertionError(name)


DENOISERS: dict[str, dict[str, tuple[int, ...]]] = {
    "sd15": unet_keys(768),
    "sd21": unet_keys(1024),
    "sdxl": unet_keys(2048),
    "sd3-medium": mmdit_keys(24),
    "sd35-medium": mmdit_keys(24, dual=range(13)),
    "sd35-large": mmdit_keys(38),
    "flux-dev": flux_keys(guidance=True, prefix=DM),
    "flux-schnell": flux_keys(guidance=False, prefix=DM),
    "chroma": chroma_keys(prefix=DM),
}


@pytest.mark.parametrize("name", list(DENOISERS))
def test_single_file_with_embedded_text_encoders(tmp_path: Path, name: str) -> None:
    base = need(name)
    ckpt = write_sparse_safetensors(tmp_path / f"{name}-all-in-one.safetensors", {**DENOISERS[name], **_te_shapes(base, name)})
    report = build(ckpt)
    assert (report.base, report.kind) == (name, "single-file")
    assert report.differences == [], report.summary_lines()
    assert report.confirmed >= 2 * len(_te_slots(base, name))
    assert report.profile.fingerprint() == base.fingerprint()
    assert report.profile.name == f"{name}-all-in-one"


def _te_slots(p: AlignmentProfile, name: str) -> list[str]:
    return [row for row in dict(next(r for r in RECIPES if r.profile == name).encoders).values()]


@pytest.mark.parametrize("name", list(DENOISERS))
def test_single_file_denoiser_only(tmp_path: Path, name: str) -> None:
    base = need(name)
    report = build(write_sparse_safetensors(tmp_path / "m.safetensors", DENOISERS[name]))
    assert report.base == name and report.differences == []
    assert any("no text encoders" in n for n in report.notes)
    assert from_single_file(tmp_path / "m.safetensors").fingerprint() == base.fingerprint()


def test_sd2_checkpoint_drops_the_last_openclip_block(tmp_path: Path) -> None:
    base = need("sd21")
    report = build(write_sparse_safetensors(tmp_path / "v2.safetensors", {**DENOISERS["sd21"], **_te_shapes(base, "sd21")}))
    assert report.differences == []
    assert any("penultimate" in n for n in report.notes)


def test_single_file_text_encoder_mismatch_is_reported_and_adopted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base = need("sdxl")
    shapes = {**DENOISERS["sdxl"], **_te_shapes(base, "sdxl")}
    for i in range(24, 40):
        shapes.pop(f"conditioner.embedders.1.model.transformer.resblocks.{i}.mlp.c_proj.bias", None)
    ckpt = write_sparse_safetensors(tmp_path / "odd-sdxl.safetensors", shapes)
    with caplog.at_level(logging.WARNING, logger="te_align"):
        p = from_single_file(ckpt)
    slot = next(s.name for s in base.slots if s.encoder_subfolder == "text_encoder_2")
    assert p.get(f"slots.{slot}.encoder.num_layers") == 24
    pv = p.provenance_of(f"slots.{slot}.encoder.num_layers")
    assert pv is not None and pv.status == "inferred" and "resblocks" in pv.source
    assert any(f"slots.{slot}.encoder.num_layers" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("flux-dev", ["transformer_blocks.0.attn.to_q.weight", "single_transformer_blocks.0.attn.to_q.weight",
                      "time_text_embed.guidance_embedder.linear_1.weight", "x_embedder.weight"]),
        ("flux-schnell", ["transformer_blocks.0.attn.to_q.weight", "single_transformer_blocks.0.attn.to_q.weight",
                          "time_text_embed.timestep_embedder.linear_1.weight", "x_embedder.weight"]),
        ("chroma", ["transformer_blocks.0.attn.to_q.weight", "single_transformer_blocks.0.attn.to_q.weight",
                    "distilled_guidance_layer.in_proj.weight"]),
        ("sd35-medium", [f"transformer_blocks.{i}.attn.to_q.weight" for i in range(24)]
         + ["transformer_blocks.0.attn2.to_q.weight", "context_embedder.weight", "pos_embed.pos_embed"]),
        ("sd35-large", [f"transformer_blocks.{i}.attn.to_q.weight" for i in range(38)]
         + ["context_embedder.weight", "pos_embed.pos_embed"]),
        ("sdxl", ["down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight"]),
        ("qwen-image", ["txt_norm.weight", "img_in.weight", "transformer_blocks.0.img_mod.1.weight"]),
    ],
)
def test_bare_diffusers_format_transformers(tmp_path: Path, name: str, keys: list[str]) -> None:
    need(name)
    if name == "sdxl":  # the width is what matters here
        ckpt = write_sparse_safetensors(tmp_path / "unet.safetensors", {keys[0]: (640, 2048)})
    else:
        ckpt = write_numpy_safetensors(tmp_path / "diffusion_pytorch_model.safetensors", keys)
    assert build(ckpt).base == name


def test_inpainting_unet_is_noted(tmp_path: Path) -> None:
    need("sd15")
    report = build(write_sparse_safetensors(tmp_path / "inpaint.safetensors", unet_keys(768, in_channels=9)))
    assert report.base == "sd15" and any("9 input channels" in n for n in report.notes)


def test_flux_fill_is_noted(tmp_path: Path) -> None:
    need("flux-dev")
    report = build(write_sparse_safetensors(tmp_path / "fill.safetensors", flux_keys(guidance=True, img_in=384)))
    assert report.base == "flux-dev" and any("384" in n for n in report.notes)


def test_header_reader_reads_numpy_written_files(tmp_path: Path) -> None:
    ckpt = write_numpy_safetensors(tmp_path / "t.safetensors", ["a.weight", "b.bias"])
    header = read_header(ckpt)
    assert header.shapes == {"a.weight": (1,), "b.bias": (1,)} and header.metadata == {}


# ------------------------------------------------------------------------- single-file errors
def _raw(path: Path, header: bytes, length: int | None = None, tail: bytes = b"") -> Path:
    path.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header + tail)
    return path


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (lambda p: _raw(p, b"{}", length=200 * 1024 * 1024), "over the 100 MB limit"),
        (lambda p: _raw(p, b'{"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}', tail=b"\0\0"), "not valid JSON"),
        (lambda p: _raw(p, b"[1, 2]"), "expected a JSON object"),
        (lambda p: _raw(p, b'{"a": {"shape": [1]}}'), "tensor 'a'"),
        (lambda p: _raw(p, b"{}", length=4096), "does not fit"),
        (lambda p: p.write_bytes(b"abc") and p, "too short"),
        (lambda p: _raw(p, b'{"__metadata__": {"format": "pt"}}'), "holds no tensors"),
    ],
)
def test_malformed_headers_are_one_line_errors_naming_the_file(tmp_path: Path, content: Any, expected: str) -> None:
    path = tmp_path / "bad.safetensors"
    content(path)
    with pytest.raises(ProfileError) as e:
        build(path)
    msg = one_line(e)
    assert str(path) in msg and expected in msg


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ({"lora_unet_down_blocks_0.lora_down.weight": (4, 320)}, "LoRA"),
        ({"encoder.block.0.layer.0.SelfAttention.q.weight": (1, 1), "shared.weight": (1, 1)}, "standalone text encoder"),
        ({"double_blocks.0.img_attn.norm.key_norm.scale": (1,), "single_blocks.0.linear1.weight": (1,),
          "single_stream_modulation.lin.weight": (1,)}, "FLUX.2"),
        (unet_keys(1280), "refiner"),
        (mmdit_keys(30), "matches no bundled profile"),
        ({"something.else": (1,)}, "cannot tell which model"),
    ],
)
def test_unrecognised_checkpoints(tmp_path: Path, shapes: dict[str, tuple[int, ...]], expected: str) -> None:
    need("sd35-large")
    path = write_sparse_safetensors(tmp_path / "x.safetensors", shapes)
    with pytest.raises(TeAlignError) as e:
        build(path)
    assert expected in one_line(e) and str(path) in str(e.value)


def test_cli_build_single_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = need("sd35-large")
    ckpt = write_sparse_safetensors(tmp_path / "sd35.safetensors", {**DENOISERS["sd35-large"], **_te_shapes(base, "sd35-large")})
    out = tmp_path / "p.toml"
    assert main(["profile", "build", str(ckpt), "-o", str(out)]) == 0
    assert "single-file" in capsys.readouterr().err
    assert load_profile_file(out).fingerprint() == base.fingerprint()


# -------------------------------------------------------- key names against installed diffusers
def test_fixture_key_names_are_the_ones_diffusers_single_file_loading_uses() -> None:
    import diffusers

    source = (Path(diffusers.__file__).parent / "loaders" / "single_file_utils.py").read_text(encoding="utf-8")
    fixtures: dict[str, tuple[int, ...]] = {
        **unet_keys(1024),
        **mmdit_keys(38),
        **flux_keys(guidance=True),
        **flux_keys(guidance=True, prefix=DM),
        **chroma_keys(),
        **chroma_keys(prefix=DM),
        **open_clip_keys("conditioner.embedders.1.model.", width=1280, layers=32, projection=1280),
        **open_clip_keys("cond_stage_model.model.", width=1024, layers=24),
        **hf_clip_keys("cond_stage_model.transformer.text_model.", hidden=768, layers=12),
        **hf_clip_keys("conditioner.embedders.0.transformer.text_model.", hidden=768, layers=12),
        **hf_clip_keys("text_encoders.clip_l.transformer.text_model.", hidden=768, layers=12),
        **hf_clip_keys("text_encoders.clip_g.transformer.text_model.", hidden=1280, layers=32),
        **t5_keys(),
    }
    # detection keys diffusers itself checks (CHECKPOINT_KEY_NAMES and infer_diffusers_model_type)
    for key in (
        "model.diffusion_model.input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight",
        "model.diffusion_model.joint_blocks.37.x_block.mlp.fc1.weight",
        "model.diffusion_model.joint_blocks.0.context_block.adaLN_modulation.1.bias",
        "double_blocks.0.img_attn.norm.key_norm.scale",
        "model.diffusion_model.double_blocks.0.img_attn.norm.key_norm.scale",
        "guidance_in.in_layer.bias",
        "model.diffusion_model.guidance_in.in_layer.bias",
        "distilled_guidance_layer.in_proj.bias",
        "model.diffusion_model.distilled_guidance_layer.in_proj.bias",
        "conditioner.embedders.1.model.transformer.resblocks.9.mlp.c_proj.bias",
        "conditioner.embedders.1.model.positional_embedding",
        "cond_stage_model.model.token_embedding.weight",
        "cond_stage_model.transformer.text_model.embeddings.position_embedding.weight",
        "conditioner.embedders.0.transformer.text_model.embeddings.position_embedding.weight",
        "text_encoders.clip_l.transformer.text_model.embeddings.position_embedding.weight",
        "text_encoders.clip_g.transformer.text_model.embeddings.position_embedding.weight",
        "text_encoders.t5xxl.transformer.shared.weight",
    ):
        assert f'"{key}"' in source, f"{key} is not a key name in diffusers' single_file_utils.py"
        assert key in fixtures, key
    # SD3.5-medium's dual attention and OpenCLIP's layout, as the conversion code spells them
    for fragment in ('x_block.attn2.qkv.weight"', '"positional_embedding"', '"token_embedding.weight"',
                     '"cond_stage_model.model.transformer.resblocks.23.', "single_blocks"):
        assert fragment in source, fragment
