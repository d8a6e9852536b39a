"""diffusion-pipe (te_align/trainers/diffusion_pipe): ``check`` reads its training TOML and the dataset TOML it names;
against a checkout (``TE_ALIGN_DIFFUSION_PIPE_DIR``): the probe runs each model class's real text-encoder functions,
the hooks make them encode by the profile, and ``te-align patch`` / ``unpatch`` of ``train.py`` are byte-identical with
the drop-in arming the hooks for the config's model type.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from te_align.checking import check_file
from te_align.cli import main
from te_align.trainers.diffusion_pipe import hooks, names
from tests.support.files import write_sparse_safetensors

ROOT = Path(__file__).resolve().parents[3]
ENV = "TE_ALIGN_DIFFUSION_PIPE_DIR"
CHECKOUT = os.environ.get(ENV)
NEEDED = ("torch", "transformers", "diffusers", "accelerate", "safetensors", "PIL", "numpy", "toml")


def needs_checkout() -> Path:
    import importlib.util

    if not CHECKOUT:
        pytest.skip(f"{ENV} is not set (path of a tdrussell/diffusion-pipe checkout)")
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"diffusion-pipe's model modules need {', '.join(missing)}, which is not installed")
    return Path(CHECKOUT)


#: The [model] keys diffusion-pipe reads without a default, by type (besides dtype): files of a plain run.
FILES = {"flux": "diffusers_path = '/m/flux-diffusers'", "lumina_2": "transformer_path = '/m/lumina_2_model_bf16.safetensors'\n"
         "llm_path = '/m/gemma_2_2b_fp16.safetensors'\nvae_path = '/m/flux_vae.safetensors'",
         "auraflow": "transformer_path = '/m/aura_flow_0.3.safetensors'\ntext_encoder_path = '/m/umt5.safetensors'\n"
                     "vae_path = '/m/sdxl_vae.safetensors'"}


def config(tmp_path: Path, model: str, dataset: str | None = None, top: str = "") -> str:
    """A training TOML with every key diffusion-pipe reads without a default (dtype, the files of the type unless
    ``model`` names them, [optimizer])."""
    kind = model.split("'")[1]
    extra = [line for line in FILES.get(kind, "").splitlines() if line.split(" =")[0] + " =" not in model]
    model = "\n".join([model, *extra, *([] if "dtype =" in model else ["dtype = 'bfloat16'"])])
    if dataset is not None:
        (tmp_path / "img").mkdir(exist_ok=True)
        (tmp_path / "dataset.toml").write_text(f"resolutions = [1024]\n{dataset}\n[[directory]]\npath = "
                                               f"'{tmp_path / 'img'}'\nnum_repeats = 1\n", encoding="utf-8")  # fmt: skip
    path = tmp_path / "train.toml"
    path.write_text(f"output_dir = '/out'\ndataset = '{tmp_path / 'dataset.toml'}'\nepochs = 10\n{top}\n[model]\n{model}\n"
                    "[adapter]\ntype = 'lora'\nrank = 32\n[optimizer]\ntype = 'adamw_optimi'\nlr = 2e-5\n",
                    encoding="utf-8")  # fmt: skip
    return str(path)


def deviations(r) -> dict:
    return {f.setting: (f.effective, f.profile, f.severity) for f in r.findings if f.kind == "deviation"}


def notes(r) -> list[str]:
    return [f.message for f in r.findings if f.kind == "note"]


# ------------------------------------------------------------------------------------ check (no checkout)
def test_flux_schnell_t5_at_512_and_the_cache_that_does_not_notice(tmp_path):
    r = check_file(config(tmp_path, "type = 'flux'\ndiffusers_path = '/m/FLUX.1-schnell'\ndtype = 'bfloat16'", ""))
    assert (r.trainer, r.profile, r.exit_code) == ("diffusion-pipe", "flux-schnell", 1)
    assert r.family_reason == "[model] type 'flux' and diffusers_path '/m/FLUX.1-schnell'"
    assert deviations(r) == {"t5.tokenizer.max_length": (512, 256, "warning")}
    dev = next(f for f in r.findings if f.kind == "deviation")
    assert dev.trainer_source == "models/flux.py:307-322" and "te-align patch DIFFUSION_PIPE_CHECKOUT" in dev.fix
    (stale,) = [f for f in r.findings if f.kind == "stale-cache"]
    assert "the text encoder's index and the captions" in stale.message and "regenerate_cache" in stale.fix


def test_flux_variant_from_the_model_files_or_said_to_be_assumed(tmp_path):
    dev = write_sparse_safetensors(tmp_path / "flux1.safetensors", {"guidance_in.in_layer.weight": (4, 4),
                                                                     "img_in.weight": (4, 4)})
    r = check_file(config(tmp_path, f"type = 'flux'\ntransformer_path = '{dev}'", ""))
    assert r.profile == "flux-dev" and "has guidance_in weights" in r.family_reason and r.exit_code == 0
    schnell = write_sparse_safetensors(tmp_path / "distilled.safetensors", {"img_in.weight": (4, 4)})
    r = check_file(config(tmp_path, f"type = 'flux'\ntransformer_path = '{schnell}'", ""))
    assert r.profile == "flux-schnell" and "has no guidance_in weights" in r.family_reason
    r = check_file(config(tmp_path, "type = 'flux'\ndiffusers_path = '/m/my-model'", ""))
    assert r.profile == "flux-dev" and r.exit_code == 0
    assert r.assumed.startswith("flux-dev assumed: nothing in the [model] file names or their files tells it from "
                                "flux-schnell")  # never a bare "aligned" on an assumption
    assert any(n == r.assumed for n in notes(r))


def test_flux_variant_from_a_diffusers_folder(tmp_path):
    folder = tmp_path / "model" / "transformer"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"guidance_embeds": False}), encoding="utf-8")
    r = check_file(config(tmp_path, f"type = 'flux'\ndiffusers_path = '{tmp_path / 'model'}'", ""))
    assert r.profile == "flux-schnell" and "guidance_embeds = false" in r.family_reason


def test_dataset_named_relative_to_the_checkout_like_the_shipped_examples(tmp_path):
    # examples/main_example.toml names dataset = 'examples/dataset.toml': relative to the checkout train.py runs in
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "dataset.toml").write_text(
        "caption_prefix = 'hi '\n[[directory]]\npath = '/nowhere'\n", encoding="utf-8")
    cfg = tmp_path / "examples" / "train.toml"
    cfg.write_text("output_dir = '/out'\ndataset = 'examples/dataset.toml'\nepochs = 1\n[model]\ntype = 'lumina_2'\n",
                   encoding="utf-8")
    r = check_file(str(cfg))
    assert r.effective["gemma.tokenizer.system_prompt"] == "hi "
    assert not any(f.setting == "dataset" for f in r.findings)


def test_lumina2_system_prompt_comes_from_the_dataset_caption_prefix(tmp_path):
    r = check_file(config(tmp_path, "type = 'lumina_2'", ""))
    dev = deviations(r)
    assert dev["gemma.tokenizer.system_prompt"][0] is None and dev["gemma.tokenizer.template"][0] == "{prompt}"
    fix = next(f.fix for f in r.findings if f.setting == "gemma.tokenizer.system_prompt")
    assert fix.startswith('caption_prefix = "You are an assistant designed to generate superior images') and fix.endswith(
        '<Prompt Start> " (in the dataset TOML)')
    diffusers_prompt = ("You are an assistant designed to generate superior images with the superior degree of image-text "
                        "alignment based on textual prompts or user prompts.")
    r = check_file(config(tmp_path, "type = 'lumina_2'", f"caption_prefix = '{diffusers_prompt} <Prompt Start> '"))
    assert r.exit_code == 0 and deviations(r) == {}
    # diffusion-pipe's own recommended prefix (examples/recommended_lumina_dataset_config.toml:13) is the authors'
    # general-generation template, another system prompt than the pipeline's: a note naming it, not an error
    r = check_file(config(tmp_path, "type = 'lumina_2'", "caption_prefix = 'You are an assistant designed to generate "
                                                         "high-quality images based on user prompts. <Prompt Start> '"))
    assert r.exit_code == 0 and deviations(r) == {"gemma.tokenizer.system_prompt": (
        "You are an assistant designed to generate high-quality images based on user prompts.", diffusers_prompt, "info")}
    dev = next(f for f in r.findings if f.kind == "deviation")
    assert "official alternative of lumina2: the Lumina-Image 2.0 general-generation template ('base')" in dev.message


def test_sdxl_sd3_auraflow_and_models_without_a_profile(tmp_path):
    r = check_file(config(tmp_path, "type = 'sdxl'\ncheckpoint_path = '/m/sd_xl_base_1.0.safetensors'"))
    assert deviations(r) == {
        # measured null on the SDXL world base (world-sdxl-pad-longest): warnings by the severity policy
        "clip_l.tokenizer.padding": ("longest", "max_length", "warning"),
        "clip_g.tokenizer.padding": ("longest", "max_length", "warning"),
        "clip_l.tokenizer.truncation": (False, True, "warning"),
        "clip_g.tokenizer.pad_token": ("<|endoftext|>", "!", "info")}
    assert not r.cached and any("every step" in n for n in notes(r))
    r = check_file(config(tmp_path, "type = 'sd3'\ndiffusers_path = '/m/some-sd3'"))
    assert (r.profile, r.exit_code, deviations(r)) == ("sd35-large", 0, {})
    assert r.assumed.startswith("sd35-large assumed") and r.assumed.endswith("every bundled SD3 profile encodes the same way")
    # an SD3 diffusers folder's transformer config decides the variant (num_layers, dual attention)
    folder = tmp_path / "sd3folder"
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}), encoding="utf-8")
    (folder / "transformer" / "config.json").write_text(json.dumps({"num_layers": 24, "dual_attention_layers": [0]}),
                                                       encoding="utf-8")
    r = check_file(config(tmp_path, f"type = 'sd3'\ndiffusers_path = '{folder}'"))
    assert (r.profile, r.assumed) == ("sd35-medium", "") and "num_layers 24 with dual_attention_layers" in r.family_reason
    r = check_file(config(tmp_path, "type = 'auraflow'\nmax_sequence_length = 768"))
    assert deviations(r) == {"t5.tokenizer.max_length": (768, 256, "warning")}  # longer, no token cut: a warning
    assert next(f.fix for f in r.findings if f.kind == "deviation") == "max_sequence_length = 256 (in [model])"
    r = check_file(config(tmp_path, "type = 'hunyuan-video'"))
    assert (r.exit_code, r.reason) == (3, "not checked: te-align has no profile for HunyuanVideo (diffusion-pipe "
                                          "[model] type 'hunyuan-video')")


def test_keys_and_the_dataset_config_alone(tmp_path):
    r = check_file(config(tmp_path, "type = 'flux'\ndiffusers_path = '/m/FLUX.1-dev'\ntransformer_dtyp = 'float8'", "",
                          top="micro_batch_size_per_gpu = 1\nwarmup_step = 10"))  # fmt: skip
    found = {f.key: f.fix for f in r.findings if f.kind == "unknown-key"}
    assert found == {"warmup_step": "did you mean 'warmup_steps'?", "model.transformer_dtyp": "did you mean 'transformer_dtype'?"}
    ds = tmp_path / "dataset.toml"
    r = check_file(str(ds))
    assert (r.trainer, r.exit_code) == ("diffusion-pipe", 3) and "a diffusion-pipe dataset config" in r.reason


# ------------------------------------------------------------------------------------ hooks (no checkout)
def test_hook_targets_are_pinned():
    got = [(t.label, t.params) for t in hooks.DiffusionPipeHook().targets()]
    assert got == [
        ("models.flux.FluxPipeline.get_call_text_encoder_fn", ("self", "text_encoder")),
        ("models.sd3.SD3Pipeline.get_call_text_encoder_fn", ("self", "text_encoder")),
        ("models.chroma.ChromaPipeline.get_call_text_encoder_fn", ("self", "text_encoder")),
        ("models.lumina_2.Lumina2Pipeline.get_call_text_encoder_fn", ("self", "text_encoder")),
        ("models.qwen_image.QwenImagePipeline.get_call_text_encoder_fn", ("self", "text_encoder")),
        ("models.auraflow.AuraFlowPipeline.get_call_text_encoder_fn", ("self", "text_encoder")),
        ("utils.dataset._map_and_cache", ("dataset", "map_fn", "cache_dir", "cache_file_prefix", "new_fingerprint_args",
                                          "regenerate_cache", "caching_batch_size")),
    ]  # fmt: skip


def test_the_text_embedding_cache_fingerprint_gets_the_profile():
    """The wrapper's contract (diffusion-pipe's caching needs HF datasets, not installed here): text-embedding caches get
    ``te-align:<fingerprint>`` in their fingerprint arguments, latents caches do not."""
    import te_align

    hook = hooks.DiffusionPipeHook(types=("flux",))
    seen = []
    wrapped = hook._map_and_cache(lambda *a, **k: seen.append(a) or "cache")
    wrapped("ds", None, "/c", cache_file_prefix="text_embeddings_1_", new_fingerprint_args=[1])  # nothing active yet
    hook.active = te_align.profile("flux-schnell")
    wrapped("ds", None, "/c", "text_embeddings_1_", [1])
    wrapped("ds", None, "/c", "latents_", None)
    assert [a[4] for a in seen] == [[1], [1, "te-align:" + te_align.profile("flux-schnell").fingerprint()], None]


def test_boot_reads_the_model_type_of_the_config(tmp_path, monkeypatch, caplog):
    import logging

    monkeypatch.delenv("TE_ALIGN", raising=False)
    cfg = config(tmp_path, "type = 'wan'")
    assert hooks.model_type(["train.py", "--deepspeed", "--config", cfg]) == ("wan", cfg)
    with caplog.at_level(logging.INFO, logger="te_align"):
        assert hooks.boot(argv=["train.py", f"--config={cfg}"]) is False
    assert "te-align's hooks do not reach model type 'wan'" in caplog.text


# ------------------------------------------------------------------------------------ against a checkout
@pytest.fixture(scope="module")
def dpipe():
    root = needs_checkout()
    from te_align.probe.core import quiet
    from te_align.trainers.diffusion_pipe.probe import DiffusionPipe

    adapter = DiffusionPipe(str(root))
    with quiet(), adapter.session():
        yield adapter
    hooks.uninstall()


def test_every_target_matches_in_the_source(dpipe):
    from te_align.trainers.diffusion_pipe.patch import static_problems

    assert static_problems(dpipe.root) == []


@pytest.mark.parametrize(("profile", "plain"), [
    ("flux-dev", set()), ("flux-schnell", {"prompt_embeds"}), ("sd35-large", set()), ("chroma", set()),
    ("lumina2", {"prompt_embeds", "prompt_attention_mask"}), ("qwen-image", {"prompt_embeds", "prompt_embeds_mask"}),
    ("auraflow", set()),
])  # fmt: skip
def test_probe_plain_and_hooked(dpipe, profile, plain):
    from te_align.probe.core import compare

    case = dpipe.case(profile)
    tensors, _ = compare(case)
    assert {t.name for t in tensors if t.trainer_shape is not None and not t.identical} == plain
    with dpipe.hooked(case.profile):
        tensors, _ = compare(case)
    assert all(t.identical for t in tensors if t.trainer_shape is not None), [t.summary() for t in tensors]


def test_patch_and_unpatch_are_byte_identical_and_the_drop_in_arms_the_hooks(tmp_path):
    root = needs_checkout()
    copy = tmp_path / "diffusion-pipe"
    shutil.copytree(root, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    train = copy / "train.py"
    before = train.read_bytes()
    assert main(["patch", str(copy), "--trainer", "diffusion-pipe", "--profile", "flux-schnell"]) == 0
    assert (copy / "te_align_originals" / "train.py").read_bytes() == before
    cfg = config(tmp_path, "type = 'flux'\ndiffusers_path = '/m/FLUX.1-schnell'")
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['train.py', '--deepspeed', '--config', {cfg!r}]\n"
        "from te_align.probe import _stubs\n"
        "from te_align.trainers.diffusion_pipe.probe import OPTIONAL\n"
        f"with _stubs.stub_missing(OPTIONAL, [{str(copy)!r}]):\n"
        f"    runpy.run_path({str(train)!r}, run_name='not_main')  # the drop-in, then train.py's top level\n"
        "    from te_align.trainers.diffusion_pipe import hooks\n"
        "    armed = hooks.current()\n"
        "    import models.flux\n"
        "h = hooks.current()\n"
        "print(armed is None, hooks.is_installed(), h.types, h.user.source)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TE_ALIGN", "TE_ALIGN_PROFILE", "TE_ALIGN_OVERRIDES")}
    env["PYTHONPATH"] = os.pathsep.join([str(copy), str(ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=copy)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "True True ('flux',) flux-schnell"
    assert main(["unpatch", str(copy)]) == 0
    assert train.read_bytes() == before and not (copy / "te_align_originals").exists()


def test_auraflow_without_max_sequence_length_stops_diffusion_pipe(tmp_path):
    """models/auraflow.py:28 reads [model] max_sequence_length with no default: diffusion-pipe stops with a KeyError."""
    r = check_file(config(tmp_path, "type = 'auraflow'"))
    assert (r.profile, r.exit_code) == ("auraflow", 1)
    (missing,) = [f for f in r.findings if f.kind == "missing-key"]
    assert (missing.severity, missing.setting, missing.key) == ("error", "model.max_sequence_length", "max_sequence_length")
    assert missing.message == ("[model] max_sequence_length is missing: diffusion-pipe reads it without a default for "
                               "[model] type 'auraflow' (models/auraflow.py:28) and stops with KeyError: "
                               "'max_sequence_length'")
    assert missing.fix == "add max_sequence_length = 256 to [model] (the auraflow profile's value)"
    assert missing.trainer_source == "diffusion-pipe: models/auraflow.py:28"
    r = check_file(config(tmp_path, "type = 'auraflow'\nmax_sequence_length = 256"))
    assert r.exit_code == 0 and not [f for f in r.findings if f.kind == "missing-key"]


def test_every_key_read_without_a_default_is_required():
    """One table (generated from the checkout, see test_key_tables_are_generated_from_the_checkout): for every model
    type te-align checks, leaving out any key diffusion-pipe reads with config['key'] is one missing-key error."""
    import tempfile

    from te_align import _toml as tomllib
    from te_align.audit.readers import load
    from te_align.trainers.diffusion_pipe.audit import parse, required_keys

    req = required_keys()
    assert {k: v[1] for k, v in req[""].items()} == {"dataset": "train.py:393", "optimizer": "train.py:422",
                                                      "output_dir": "train.py:543"}
    assert req["auraflow"]["max_sequence_length"] == (768, "models/auraflow.py:28")
    assert set(req["lumina_2"]) == {"type", "dtype", "transformer_path", "llm_path", "vae_path"}
    assert set(req["sd3"]) == {"type", "dtype"}  # diffusers_path: read with .get (NotImplementedError without it)
    profiled = {t.type for t in names.TYPES if t.profile}
    assert set(req) - {""} == profiled
    with tempfile.TemporaryDirectory() as d:
        for mt in sorted(profiled):
            full = {k: v for k, (v, _) in req[mt].items()}
            top = {k: v for k, (v, _) in req[""].items()}
            for leave in ["", *req[""], *(k for k in req[mt] if k != "type")]:
                data = {**{k: v for k, v in top.items() if k != leave}, "epochs": 1,
                        "model": {k: v for k, v in full.items() if k != leave}}  # fmt: skip
                path = Path(d) / "t.toml"
                path.write_text(_dump(data), encoding="utf-8")
                assert tomllib.loads(path.read_text(encoding="utf-8")) == data
                got = [f.key for f in parse(load(str(path)), []).findings if f.kind == "missing-key"]
                assert got == ([leave] if leave else []), (mt, leave)


def _dump(data: dict) -> str:
    """A small TOML writer for the test (top-level values, then tables)."""

    def lit(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {lit(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    tops = [f"{k} = {lit(v)}" for k, v in data.items() if k != "model"]
    return "\n".join([*tops, "[model]", *(f"{k} = {lit(v)}" for k, v in data["model"].items())]) + "\n"


def test_key_tables_are_generated_from_the_checkout():
    """data/diffusion-pipe.txt is exactly what the generator reads from the checkout (keys and required keys)."""
    from te_align.audit.readers import known_keys
    from te_align.trainers.diffusion_pipe.audit import _config_keys, _required, required_keys

    if not CHECKOUT:
        pytest.skip(f"{ENV} is not set (path of a tdrussell/diffusion-pipe checkout)")
    root = Path(CHECKOUT)
    bundled = known_keys("diffusion-pipe", "te_align.trainers.diffusion_pipe")
    assert {k: frozenset(v) for k, v in _config_keys(root).items()} == {
        k: v for k, v in bundled.items() if not k.startswith("required")}
    assert _required(root) == required_keys()
