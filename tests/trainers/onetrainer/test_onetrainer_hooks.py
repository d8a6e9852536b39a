"""OneTrainer hooks: the contract (every target, signature and table row pinned) without a checkout.

The tests against a real checkout are in tests/trainers/onetrainer/test_onetrainer_integration.py (TE_ALIGN_ONETRAINER_DIR).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from te_align.hooks.base import HookError
from te_align.trainers.onetrainer import hooks as ot

_HEAD = ("self", "train_device", "batch_size", "rand", "text")

#: Every target the hooks replace, as read at Nerogar/OneTrainer@23df383 (module, qualname, parameters).
EXPECTED_TARGETS = [
    ("modules.model.StableDiffusionModel", "StableDiffusionModel.encode_text",
     (*_HEAD, "tokens", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output")),
    ("modules.dataLoader.StableDiffusionBaseDataLoader", "StableDiffusionBaseDataLoader._preparation_modules",
     ("self", "config", "model")),
    ("modules.model.StableDiffusionXLModel", "StableDiffusionXLModel.encode_text",
     (*_HEAD, "tokens_1", "tokens_2", "text_encoder_1_layer_skip", "text_encoder_2_layer_skip", "text_encoder_1_output",
      "text_encoder_2_output", "text_encoder_1_dropout_probability", "text_encoder_2_dropout_probability",
      "pooled_text_encoder_2_output")),
    ("modules.dataLoader.StableDiffusionXLBaseDataLoader", "StableDiffusionXLBaseDataLoader._preparation_modules",
     ("self", "config", "model")),
    ("modules.model.StableDiffusion3Model", "StableDiffusion3Model.encode_text",
     (*_HEAD, "tokens_1", "tokens_2", "tokens_3", "tokens_mask_1", "tokens_mask_2", "tokens_mask_3",
      "text_encoder_1_layer_skip", "text_encoder_2_layer_skip", "text_encoder_3_layer_skip",
      "text_encoder_1_dropout_probability", "text_encoder_2_dropout_probability", "text_encoder_3_dropout_probability",
      "apply_attention_mask", "text_encoder_1_output", "pooled_text_encoder_1_output", "text_encoder_2_output",
      "pooled_text_encoder_2_output", "text_encoder_3_output")),
    ("modules.dataLoader.StableDiffusion3BaseDataLoader", "StableDiffusion3BaseDataLoader._preparation_modules",
     ("self", "config", "model")),
    ("modules.model.FluxModel", "FluxModel.encode_text",
     (*_HEAD, "tokens_1", "tokens_2", "tokens_mask_2", "text_encoder_1_layer_skip", "text_encoder_2_layer_skip",
      "text_encoder_2_sequence_length", "text_encoder_1_dropout_probability", "text_encoder_2_dropout_probability",
      "apply_attention_mask", "pooled_text_encoder_1_output", "text_encoder_2_output")),
    ("modules.dataLoader.FluxBaseDataLoader", "FluxBaseDataLoader._preparation_modules", ("self", "config", "model")),
    ("modules.model.ChromaModel", "ChromaModel.encode_text",
     (*_HEAD, "tokens", "tokens_mask", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output")),
    ("modules.dataLoader.ChromaBaseDataLoader", "ChromaBaseDataLoader._preparation_modules", ("self", "config", "model")),
    ("modules.model.PixArtAlphaModel", "PixArtAlphaModel.encode_text",
     (*_HEAD, "tokens", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output", "attention_mask")),
    ("modules.dataLoader.PixArtAlphaBaseDataLoader", "PixArtAlphaBaseDataLoader._preparation_modules",
     ("self", "config", "model")),
    ("modules.model.SanaModel", "SanaModel.encode_text",
     (*_HEAD, "tokens", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output", "attention_mask")),
    ("modules.dataLoader.SanaBaseDataLoader", "SanaBaseDataLoader._preparation_modules", ("self", "config", "model")),
    ("modules.model.HiDreamModel", "HiDreamModel.encode_text",
     (*_HEAD, "tokens_1", "tokens_2", "tokens_3", "tokens_4", "tokens_mask_3", "tokens_mask_4", "text_encoder_3_layer_skip",
      "text_encoder_1_dropout_probability", "text_encoder_2_dropout_probability", "text_encoder_3_dropout_probability",
      "text_encoder_4_dropout_probability", "apply_attention_mask", "pooled_text_encoder_1_output",
      "pooled_text_encoder_2_output", "text_encoder_3_output", "text_encoder_4_output")),
    ("modules.dataLoader.HiDreamBaseDataLoader", "HiDreamBaseDataLoader._preparation_modules", ("self", "config", "model")),
    ("modules.model.QwenModel", "QwenModel.encode_text",
     (*_HEAD, "tokens", "tokens_mask", "text_encoder_layer_skip", "text_encoder_dropout_probability", "text_encoder_output")),
    ("modules.dataLoader.QwenBaseDataLoader", "QwenBaseDataLoader._preparation_modules", ("self", "config", "model")),
    ("modules.dataLoader.mixin.DataLoaderText2ImageMixin", "DataLoaderText2ImageMixin._cache_modules_from_names",
     ("self", "model", "model_setup", "image_split_names", "image_aggregate_names", "text_split_names", "sort_names",
      "config", "text_caching")),
]  # fmt: skip


def test_every_target_and_signature_is_pinned() -> None:
    got = [(t.module, t.qualname, t.params) for t in ot.OneTrainerHook().targets()]
    assert got == EXPECTED_TARGETS
    assert all(t.wrap is not None for t in ot.OneTrainerHook().targets())


def test_parts_select_target_groups() -> None:
    models = ot.OneTrainerHook(parts=("models",)).targets()
    assert [t.qualname.split(".")[1] for t in models] == ["encode_text"] * 9
    cache = ot.OneTrainerHook(parts=("cache",)).targets()
    assert [t.qualname for t in cache] == ["DataLoaderText2ImageMixin._cache_modules_from_names"]


def test_verified_version_is_data() -> None:
    assert list(ot.OneTrainerHook.supported) == ["23df3832e8f213d64c337e39f9365ba46e99fed0"]


@pytest.mark.parametrize(
    ("model_type", "profile"),
    [("STABLE_DIFFUSION_15", "sd15"), ("STABLE_DIFFUSION_15_INPAINTING", "sd15"), ("STABLE_DIFFUSION_20_BASE", "sd21"),
     ("STABLE_DIFFUSION_21", "sd21"), ("STABLE_DIFFUSION_3", "sd3-medium"), ("STABLE_DIFFUSION_35", "sd35-large"),
     ("STABLE_DIFFUSION_XL_10_BASE", "sdxl"), ("FLUX_DEV_1", "flux-dev"), ("FLUX_FILL_DEV_1", "flux-dev"),
     ("CHROMA_1", "chroma"), ("PIXART_SIGMA", "pixart-sigma"), ("SANA", "sana"), ("HI_DREAM_FULL", "hidream"),
     ("QWEN", "qwen-image")],
)  # fmt: skip
def test_model_type_profiles(model_type: str, profile: str) -> None:
    assert ot.profile_name_for_model_type(model_type) == profile


@pytest.mark.parametrize("model_type", ["FLUX_2", "PIXART_ALPHA", "Z_IMAGE", "ANIMA"])
def test_model_types_without_hooked_profile_are_refused(model_type: str) -> None:
    with pytest.raises(HookError, match=f"no (hooked )?profile for OneTrainer model_type {model_type}"):
        ot.profile_name_for_model_type(model_type)


def test_family_rows_match_profiles() -> None:
    import te_align

    for prof, key in [("sd15", "sd"), ("sd21", "sd"), ("sdxl", "sdxl"), ("sd35-large", "sd3"), ("flux-dev", "flux"),
                      ("chroma", "chroma"), ("pixart-sigma", "pixart"), ("sana", "sana"), ("hidream", "hidream"),
                      ("qwen-image", "qwen")]:  # fmt: skip
        p = te_align.profile(prof)
        fam = ot.FAMILIES[key]
        assert p.family in fam.profile_families
        slots = [s.name for s in p.slots]
        if len(fam.encoders) > 1:
            assert [e.slot for e in fam.encoders] == slots
        for e in fam.encoders:  # every parameter the row names is one encode_text has
            for name in (e.tokens, e.mask, e.output, e.pooled, e.dropout, e.layer_skip):
                assert name is None or name in fam.params, (key, name)


def test_models_without_a_row_are_refused_by_name() -> None:
    class ZImageModel:
        pass

    assert ot.NOT_HOOKED == {}
    with pytest.raises(HookError, match="OneTrainer model ZImageModel is not one te-align hooks"):
        ot.family_of_model(ZImageModel())


def test_te_align_off_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TE_ALIGN", "off")
    assert ot.install(profile="sd15") is False
    assert not ot.is_installed()


def test_install_makes_te_aligns_lines_visible_in_a_process_without_logging() -> None:
    """OneTrainer's scripts configure no logging: install() must put te-align's INFO lines on stdout (a real
    launch through the patched scripts/train.py showed none of them before)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TE_ALIGN": "off", "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    code = "from te_align.trainers.onetrainer import hooks as ot; print('installed:', ot.install(profile='sd15'))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.splitlines() == ["te-align: OneTrainer hooks disabled by TE_ALIGN=off; OneTrainer runs unmodified",
                                        "installed: False"]  # fmt: skip


def test_console_lines_give_way_to_logging_set_up_later() -> None:
    """Once the process sets up logging after install() (OneTrainer's GUI does), each te-align line is printed
    once, by that handler (it was printed twice: by te-align's console handler too)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TE_ALIGN": "off", "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    code = ("import logging; from te_align.trainers.onetrainer import hooks as ot; ot.install(profile='sd15'); "
            "logging.basicConfig(format='[root] %(message)s'); ot.logger.info('te-align: one line')")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.splitlines() == ["te-align: OneTrainer hooks disabled by TE_ALIGN=off; OneTrainer runs unmodified"]
    assert proc.stderr.splitlines() == ["[root] te-align: one line"]


def test_missing_onetrainer_refuses_naming_every_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TE_ALIGN", raising=False)
    import sys

    if "modules" in sys.modules:
        pytest.skip("a 'modules' package is imported in this process")
    with pytest.raises(HookError) as e:
        ot.install(profile="sd15")
    msg = e.value.message
    assert msg.startswith("OneTrainer hooks not installed (trainer version unknown")
    assert msg.count("cannot import modules.") == 19
    assert not ot.is_installed()


def test_bad_overrides_env_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TE_ALIGN", raising=False)
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", "{t5: 1")
    with pytest.raises(HookError, match="TE_ALIGN_OVERRIDES is not valid JSON"):
        ot.install(profile="sd15")


def test_stale_cache_entries_are_counted(tmp_path: Path) -> None:
    import te_align

    p = te_align.profile("sd35-large")
    keep = ot.cache_folder(p)
    assert keep == "te-align-" + p.fingerprint()[:16]
    text = tmp_path / "text"
    # aggregate.pt: mgds' per-variation file of aggregated items, not a caption's entry
    for rel in ("abc/variation-0/0.pt", "abc/variation-0/1.pt", "abc/variation-0/aggregate.pt",
                "te-align-0000000000000000/x/variation-0/0.pt", "te-align-0000000000000000/x/variation-0/aggregate.pt",
                f"{keep}/abc/variation-0/0.pt"):  # fmt: skip
        (text / rel).parent.mkdir(parents=True, exist_ok=True)
        (text / rel).write_bytes(b"")
    assert ot.count_stale(text, keep) == 3
    assert ot.count_stale(tmp_path / "absent", keep) == 0
