"""diffusion-pipe [model] text-encoder path keys that the model type never reads (the encoder the user meant is not
the one loaded), with their aligned counterparts; the table against the checkout's model classes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from te_align.checking import check_file, fix_file
from te_align.trainers.diffusion_pipe import names, semantics

TOP = "output_dir = '/out'\ndataset = '/nowhere/dataset.toml'\nepochs = 10\n"
TAIL = "[adapter]\ntype = 'lora'\nrank = 32\n[optimizer]\ntype = 'adamw_optimi'\nlr = 2e-5\n"
FLUX = "[model]\ntype = 'flux'\ndiffusers_path = '/m/FLUX.1-dev'\ndtype = 'bfloat16'\n"
ANIMA = ("[model]\ntype = 'anima'\ntransformer_path = '/m/anima-preview.safetensors'\n"
         "vae_path = '/m/qwen_image_vae.safetensors'\nllm_path = '/m/qwen_3_06b_base.safetensors'\ndtype = 'bfloat16'\n")


def write(tmp_path: Path, model: str) -> str:
    p = tmp_path / "train.toml"
    p.write_text(TOP + model + TAIL, encoding="utf-8")
    return str(p)


def unused(r):
    return [(f.severity, f.setting, f.line, f.message, f.fix) for f in r.findings if f.kind == "unused-value"]


def test_flux_ignores_llm_path(tmp_path):
    r = check_file(write(tmp_path, FLUX + "llm_path = '/m/qwen.safetensors'\n"))
    assert r.exit_code == 1
    assert unused(r) == [(
        "warning", "model.llm_path", 8,
        "[model] llm_path is not read by type 'flux': its text encoders come from diffusers_path "
        "(FluxPipeline.from_pretrained, models/flux.py:194), so the encoder llm_path names is not the one loaded",
        "remove llm_path from [model] (and give the text encoder as type 'flux' reads it)")]


def test_flux_fix_removes_it_and_the_aligned_counterpart(tmp_path):
    path = write(tmp_path, FLUX + "llm_path = '/m/qwen.safetensors'\n")
    report = fix_file(path, backup=False)
    assert report.refused == ""
    assert Path(path).read_text(encoding="utf-8") == TOP + FLUX + TAIL
    r = check_file(path)
    assert (r.exit_code, unused(r)) == (0, [])


def test_anima_with_t5_path_loads_t5_not_qwen3(tmp_path):
    r = check_file(write(tmp_path, ANIMA + "t5_path = '/m/t5.safetensors'\n"))
    assert r.exit_code == 1
    assert unused(r) == [(
        "warning", "model.llm_path", 8,
        "[model] llm_path is not read while t5_path is there: the Cosmos-Predict2 class loads the T5 of t5_path as "
        "the text encoder (with the T5 tokenizer) and reaches llm_path only without it, so this Anima run encodes "
        "captions with T5, not Anima's Qwen3", "remove t5_path from [model]")]
    assert unused(check_file(write(tmp_path, ANIMA))) == []


def test_lumina_ignores_text_encoder_path_and_reads_llm_path(tmp_path):
    lumina = ("[model]\ntype = 'lumina_2'\ntransformer_path = '/m/l.safetensors'\nllm_path = '/m/gemma.safetensors'\n"
              "vae_path = '/m/vae.safetensors'\ndtype = 'bfloat16'\n")
    r = check_file(write(tmp_path, lumina + "text_encoder_path = '/m/gemma2.safetensors'\n"))
    assert [(s, k) for s, k, *_ in unused(r)] == [("warning", "model.text_encoder_path")]
    assert "llm_path (models/lumina_2.py:56)" in unused(r)[0][3]
    assert unused(check_file(write(tmp_path, lumina))) == []


def test_a_comfy_type_not_checked_still_reports_the_ignored_path(tmp_path):
    r = check_file(write(tmp_path, "[model]\ntype = 'z_image'\ndiffusion_model = '/m/z.safetensors'\n"
                                   "llm_path = '/m/qwen3_4b.safetensors'\ndtype = 'bfloat16'\n"))
    assert r.exit_code == 1
    assert [(s, k) for s, k, *_ in unused(r)] == [("warning", "model.llm_path")]
    assert "the [[model.text_encoders]] tables (ComfyPipeline, models/base.py:576-591)" in unused(r)[0][3]


_READ = re.compile(r"model_config(?:\.get\(|\[)['\"](\w+)['\"]|['\"](\w+)['\"] in self\.model_config")


def test_table_matches_the_model_classes():
    root = os.environ.get("TE_ALIGN_DIFFUSION_PIPE_DIR")
    if not root:
        pytest.skip("TE_ALIGN_DIFFUSION_PIPE_DIR is not set (a tdrussell/diffusion-pipe checkout)")

    def te_keys(path: Path) -> set[str]:
        found = {a or b for a, b in _READ.findall(path.read_text(encoding="utf-8"))}
        return found & set(semantics.TE_PATH_KEYS)

    assert set(semantics.READS) == set(names.BY_TYPE)
    base = te_keys(Path(root) / "models" / "base.py")
    assert base == {"text_encoders"}
    for t, (reads, _) in semantics.READS.items():
        mt = names.BY_TYPE[t]
        own = te_keys(Path(root) / "models" / (mt.module.replace(".", "/") + ".py"))
        assert own == (set() if reads == ("text_encoders",) else set(reads)), t
