"""musubi-tuner (te_align/trainers/musubi): ``check`` reads its command lines, ``--config_file`` and
``--dataset_config`` TOMLs; against a checkout (``TE_ALIGN_MUSUBI_DIR``): the probe runs its real Qwen-Image and Wan
encoding code, the hooks make it encode by the profile with the fingerprint in its cache files, stale cache files are
re-encoded (``--skip_existing``) or refused at training start, and ``te-align patch`` / ``unpatch`` are byte-identical.
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
from te_align.trainers.musubi import hooks, names
from tests.support.files import write_sparse_safetensors

ROOT = Path(__file__).resolve().parents[3]
ENV = "TE_ALIGN_MUSUBI_DIR"
CHECKOUT = os.environ.get(ENV)
#: What musubi-tuner's encode modules need for real (the rest is stood in for by the probe's sandbox).
NEEDED = ("torch", "transformers", "diffusers", "accelerate", "safetensors", "ftfy", "regex", "PIL", "numpy")


def needs_checkout() -> Path:
    import importlib.util

    if not CHECKOUT:
        pytest.skip(f"{ENV} is not set (path of a kohya-ss/musubi-tuner checkout)")
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"musubi-tuner's encode modules need {', '.join(missing)}, which is not installed")
    return Path(CHECKOUT)


def write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def dataset(tmp_path: Path, caption: str = "a cat", extra: str = "") -> str:
    (tmp_path / "img").mkdir(exist_ok=True)
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "img" / "a.txt").write_text(caption, encoding="utf-8")
    return write(tmp_path, "dataset.toml", f'[general]\nresolution = [1024, 1024]\ncaption_extension = ".txt"\n'
                                           f'batch_size = 1\n{extra}\n[[datasets]]\nimage_directory = "{tmp_path / "img"}"\n'
                                           f'cache_directory = "{tmp_path / "cache"}"\nnum_repeats = 1\n')  # fmt: skip


def deviations(r) -> dict:
    return {f.setting: (f.effective, f.profile, f.severity) for f in r.findings if f.kind == "deviation"}


# ------------------------------------------------------------------------------------ check (no checkout)
def test_qwen_caching_command_line(tmp_path):
    ds = dataset(tmp_path, caption="a cat " * 200)
    sh = write(tmp_path, "cache.sh", f"python src/musubi_tuner/qwen_image_cache_text_encoder_outputs.py \\\n"
                                     f"  --dataset_config {ds} --text_encoder /m/qwen_2.5_vl_7b.safetensors --fp8_vl\n")
    r = check_file(sh)
    assert (r.trainer, r.profile, r.exit_code) == ("musubi", "qwen-image", 1)
    assert r.family_reason == "script qwen_image_cache_text_encoder_outputs.py"
    assert deviations(r) == {"qwen.tokenizer.max_length": (1024, 512, "warning"),
                             "qwen.encoder.dtype": ("float8_e4m3fn", "bfloat16", "warning")}
    dev = {f.setting: f for f in r.findings if f.kind == "deviation"}
    assert "1 of 1 caption file(s)" in dev["qwen.tokenizer.max_length"].message
    assert dev["qwen.tokenizer.max_length"].trainer_source == "qwen_image/qwen_image_utils.py:338,351,366-373"
    assert dev["qwen.encoder.dtype"].fix == "remove --fp8_vl" and dev["qwen.encoder.dtype"].line == 2
    assert "te-align patch MUSUBI_TUNER_CHECKOUT" in dev["qwen.tokenizer.max_length"].fix
    stale = [f for f in r.findings if f.kind == "stale-cache"]
    assert stale and "without --skip_existing" in stale[0].fix
    # rules that compare and agree ran too: template, 34 dropped tokens, padding, layer, masks
    assert {"qwen.tokenizer.template", "qwen.tokenizer.drop_start_tokens", "qwen.masks.denoiser"} <= set(r.rules_ran)


def test_short_captions_make_the_length_a_note(tmp_path):
    ds = dataset(tmp_path)
    r = check_file("<command line>", command=["python", "qwen_image_cache_text_encoder_outputs.py", "--dataset_config",
                                              ds, "--text_encoder", "/m/q.safetensors"])  # fmt: skip
    assert deviations(r) == {"qwen.tokenizer.max_length": (1024, 512, "info")}
    assert r.exit_code == 0


def test_wan_training_command_line_is_aligned_and_unknown_flags_are_errors(tmp_path):
    ds = dataset(tmp_path)
    base = ["accelerate", "launch", "src/musubi_tuner/wan_train_network.py", "--task", "t2v-1.3B", "--dit",
            "/m/wan2.1_t2v_1.3B_bf16.safetensors", "--dataset_config", ds, "--network_module", "networks.lora_wan"]
    r = check_file("<command line>", command=base)
    assert (r.profile, r.exit_code, deviations(r)) == ("wan21", 0, {})
    assert r.family_reason == "script wan_train_network.py and network_module 'networks.lora_wan'"
    assert any("wan_cache_text_encoder_outputs.py wrote" in f.message for f in r.findings if f.kind == "note")
    r = check_file("<command line>", command=[*base, "--t5_max_len", "256"])
    bad = [f for f in r.findings if f.kind == "unknown-key"]
    assert r.exit_code == 1 and bad[0].severity == "error" and "unrecognized arguments" in bad[0].message
    r = check_file("<command line>", command=[*base, "--task", "t2v-A14B", "--fp8_t5"])
    assert deviations(r) == {"t5.encoder.dtype": ("float8_e4m3fn", "bfloat16", "warning")}
    assert any("Wan 2.2 (--task t2v-A14B)" in f.message for f in r.findings)


def test_config_file_toml_and_extra_args(tmp_path):
    cfg = write(tmp_path, "train.toml", '[model]\ndit = "/m/qwen_image_bf16.safetensors"\n'
                                         'network_module = "networks.lora_qwen_image"\nfp8_vl = true\n'
                                         '[train]\nlearning_rate = 1e-4\nlerning_rate = 2\n')
    r = check_file(cfg)
    assert (r.trainer, r.profile) == ("musubi", "qwen-image")
    assert r.family_reason == "network_module 'networks.lora_qwen_image' and dit '/m/qwen_image_bf16.safetensors'"
    assert deviations(r)["qwen.encoder.dtype"][0] == "float8_e4m3fn"
    (typo,) = [f for f in r.findings if f.kind == "unknown-key"]
    assert (typo.key, typo.severity, typo.line) == ("lerning_rate", "warning", 7)
    assert typo.fix == "did you mean 'learning_rate'?"
    r = check_file(cfg, extra_args=["qwen_image_train_network.py", "--model_version", "edit-2509"])
    assert r.exit_code == 1  # the typo counts
    assert (r.status, r.profile) == ("checked", "qwen-image-edit-2509")  # the script's --model_version decides
    assert r.family_reason == ("script qwen_image_train_network.py and network_module 'networks.lora_qwen_image' and "
                               "--model_version edit-2509")
    assert [(f.key, f.line) for f in r.findings if f.kind == "unknown-key"] == [("lerning_rate", 7)]
    # the Edit versions are cached by the same script, so --fp8_vl quantizes their VL encoder too (:130-133)
    assert deviations(r)["qwen.encoder.dtype"] == ("float8_e4m3fn", "bfloat16", "warning")


def test_dataset_config_alone_names_the_model_from_its_cache_files(tmp_path):
    ds = dataset(tmp_path)
    r = check_file(ds)
    assert (r.exit_code, r.status) == (3, "not-checked") and r.reason.startswith(
        "not checked: a musubi-tuner dataset config names no model; check the caching command line that uses it")
    (tmp_path / "cache" / "a_qi_te.safetensors").write_bytes(_safetensors({"varlen_vl_embed_bf16": [7, 8]}))
    r = check_file(ds)
    assert (r.trainer, r.profile) == ("musubi", "qwen-image")
    assert r.family_reason == "cache files *_qi_te.safetensors in the dataset's cache_directory"
    r = check_file(ds, extra_args=["wan_cache_text_encoder_outputs.py"])  # the script wins; the files are named
    assert r.profile == "wan21"
    assert any("cache files *_qi_te.safetensors" in f.message and "names another model" in f.message
               for f in r.findings)  # fmt: skip


def test_dataset_config_keys_are_checked(tmp_path):
    ds = dataset(tmp_path, extra="caption_dropout_rate = 0.1")
    r = check_file(ds, extra_args=["qwen_image_cache_text_encoder_outputs.py"])
    (bad,) = [f for f in r.findings if f.kind == "unknown-key"]
    assert (bad.key, bad.severity, bad.line) == ("general.caption_dropout_rate", "error", 5)
    assert "refuses unknown keys" in bad.message


def test_models_without_a_profile_are_not_checked(tmp_path):
    for script, name in (("hv_train_network.py", "HunyuanVideo"), ("hidream_o1_cache_text_encoder_outputs.py",
                                                                   "HiDream-O1")):  # fmt: skip
        r = check_file("<command line>", command=["python", script, "--dataset_config", "d.toml"])
        assert r.exit_code == 3 and r.reason.startswith(f"not checked: te-align has no profile for {name}")


#: Commands from musubi-tuner's docs (at the commit te-align cites) for models te-align has no profile for: every
#: option is the script's own, so each is "not checked" (3) naming the model, with no unknown-key finding.
NO_PROFILE = {
    "fpack_train_network.py": (
        ["--dit", "/m/fp.safetensors", "--vae", "/m/vae.safetensors", "--text_encoder1", "/m/llava.safetensors",
         "--text_encoder2", "/m/clip_l.safetensors", "--image_encoder", "/m/sigclip.safetensors",
         "--network_module", "networks.lora_framepack"],
        "FramePack (script fpack_train_network.py and network_module 'networks.lora_framepack')"),
    "kandinsky5_train_network.py": (["--task", "k5-pro-t2v-5s-sd", "--dit", "/m/k5.safetensors"],
                                    "Kandinsky 5 (script kandinsky5_train_network.py)"),
    "hidream_o1_cache_text_encoder_outputs.py": (["--dit", "/m/ho1.safetensors", "--fp8_te", "--model_type", "dev"],
                                                 "HiDream-O1 (script hidream_o1_cache_text_encoder_outputs.py)"),
    # HunyuanVideo's caching script has no prefix (docs/hunyuan_video.md)
    "cache_text_encoder_outputs.py": (["--text_encoder1", "/m/llava.pt", "--text_encoder2", "/m/clip_l"],
                                      "HunyuanVideo (script cache_text_encoder_outputs.py)"),
}


@pytest.mark.parametrize("script", sorted(NO_PROFILE))
def test_every_script_has_its_own_options_and_models_without_a_profile_are_not_checked(script):
    args, why = NO_PROFILE[script]
    r = check_file("<command line>", command=["python", f"src/musubi_tuner/{script}", "--dataset_config", "d.toml",
                                              *args])  # fmt: skip
    assert (r.trainer, r.exit_code, r.status, r.reason) == ("musubi", 3, "not-checked",
                                                            f"not checked: te-align has no profile for {why}")
    assert [(f.kind, f.severity) for f in r.findings] == [("not-checked", "info")]  # no unknown key, no "other model"


def test_another_models_option_only_where_the_script_lacks_it(tmp_path):
    """An option only one model's scripts define names that model, where the script lacks it (argparse refuses it
    too); one several models define (--task: Wan, HiDream-O1, HunyuanVideo 1.5, Kandinsky 5) names none."""
    r = check_file("<command line>", command=["python", "qwen_image_train_network.py", "--dataset_config", "d.toml",
                                              "--task", "t2v-14B", "--dit_high_noise", "/m/high.safetensors"])  # fmt: skip
    assert sorted((f.key, f.severity) for f in r.findings if f.kind == "unknown-key") == [
        ("dit_high_noise", "error"), ("task", "error")]
    assert [f.message for f in r.findings if f.setting == "profile"] == [
        "--dit_high_noise (an option only Wan 2.1/2.2's scripts have; qwen_image_train_network.py does not) names "
        "another model than script qwen_image_train_network.py; checked as Qwen-Image"]
    assert r.profile == "qwen-image"
    # the script's own --task: no note (HiDream-O1, Kandinsky 5 and Wan each define one)
    r = check_file("<command line>", command=["python", "wan_train_network.py", "--dataset_config", "d.toml", "--task",
                                              "t2v-14B", "--t5", "/m/t5.pth"])  # fmt: skip
    assert r.profile == "wan21" and not [f for f in r.findings if f.setting == "profile" or f.kind == "unknown-key"]
    # a --config_file TOML alone: an option only one model's scripts have names it
    from te_align.trainers.musubi.audit import option_archs

    assert option_archs()["dit_high_noise"] == {"wan"} and option_archs()["edit_plus"] == {"qwen_image"}
    assert option_archs()["task"] == {"wan", "hidream_o1", "hv_1_5", "kandinsky5"}
    cfg = write(tmp_path, "w.toml", 'dit = "/m/low.safetensors"\ndit_high_noise = "/m/high.safetensors"\n')
    r = check_file(cfg)
    assert (r.profile, r.family_reason) == ("wan21", "--dit_high_noise (an option only Wan 2.1/2.2's scripts have)")


@pytest.mark.parametrize(("script", "te_script"), [("wan_cache_latents.py", "wan_cache_text_encoder_outputs.py"),
                                                   ("cache_latents.py", "cache_text_encoder_outputs.py")])
def test_latent_caching_scripts_are_not_training(script, te_script):
    r = check_file("<command line>", command=["python", script, "--dataset_config", "d.toml", "--vae", "/m/v.pth"])
    assert (r.trainer, r.exit_code, r.status) == ("musubi", 3, "not-training")
    assert r.reason == (f"not checked: {script} caches latents only (no text encoder runs); the captions are encoded "
                        f"by {te_script}: check that command line")
    assert hooks.parts_for(["python", script]) == ((), f"{script} caches latents only (no text encoder runs)")


def test_sd_scripts_tools_are_not_musubi(tmp_path):
    sh = write(tmp_path, "c.sh", "python tools/cache_latents.py --pretrained_model_name_or_path m --sdxl\n")
    r = check_file(sh)
    assert r.trainer != "musubi" and r.exit_code == 2


def test_key_table_has_every_training_and_caching_script():
    from te_align.trainers.musubi.audit import script_options, valid_keys

    sections = set(valid_keys())
    assert {"flux_kontext_cache_text_encoder_outputs", "fpack_train_network", "hidream_o1_train", "hidream_o1_cache_pixel",
            "flux_2_train_network_self_flow", "cache_text_encoder_outputs", "cache_latents"} <= sections
    assert {"text_encoder1", "text_encoder2", "fp8_t5"} <= script_options("flux_kontext_cache_text_encoder_outputs.py")
    assert "task" not in script_options("qwen_image_train_network.py")


def checkout_dir() -> Path:
    if not CHECKOUT:
        pytest.skip(f"{ENV} is not set (path of a kohya-ss/musubi-tuner checkout)")
    return Path(CHECKOUT)


def test_key_table_is_generated_from_the_checkout():
    """The bundled table is exactly what the generator reads from the checkout's argparse definitions: one section
    per training and caching script of src/musubi_tuner, nothing typed by hand."""
    from te_align.trainers.musubi.audit import key_table, scripts, valid_keys

    root = checkout_dir()
    got = key_table(root)
    assert {k: frozenset(v) for k, v in got.items()} == valid_keys()
    assert len(scripts(root)) == sum(not k.startswith("dataset") for k in got)
    # the maintainer command writes exactly the bundled file (its header names the commit te-align cites)
    bundled = (ROOT / "te_align" / "trainers" / "musubi" / "data" / "musubi.txt").read_text(encoding="utf-8")
    from te_align.trainers.musubi.audit import COMMIT

    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_audit_keys.py"), "musubi", str(root), "--commit",
                          COMMIT], capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out == bundled


def test_cache_dir_counts_fingerprints(tmp_path):
    import te_align

    ds = dataset(tmp_path)
    fp = te_align.profile("qwen-image").fingerprint()
    cache = tmp_path / "cache"
    (cache / "a_qi_te.safetensors").write_bytes(_safetensors({"varlen_vl_embed_bf16": [7, 8]}, {"te_align_fingerprint": fp}))
    (cache / "b_qi_te.safetensors").write_bytes(_safetensors({"varlen_vl_embed_bf16": [9, 8]},
                                                             {"te_align_fingerprint": "0" * 16}))  # fmt: skip
    (cache / "c_qi_te.safetensors").write_bytes(_safetensors({"varlen_vl_embed_bf16": [3, 8]}))
    r = check_file(ds, extra_args=["qwen_image_cache_text_encoder_outputs.py"], cache_dir=str(cache))
    (stale,) = [f for f in r.findings if f.kind == "stale-cache"]  # no deviation above info: only the fingerprint
    assert f"1 of 3 cached files in {cache} were encoded by te-align's hooks under another profile (1 with " in stale.message
    assert any("1 of 3 cached files" in f.message and "no te-align fingerprint" in f.message for f in r.findings)


def test_check_cli_and_json(tmp_path, capsys):
    ds = dataset(tmp_path)
    assert main(["check", "--json", "--", "python", "wan_cache_text_encoder_outputs.py", "--dataset_config", ds,
                 "--t5", "/m/t5.pth"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["results"][0]["trainer"] == "musubi" and data["results"][0]["profile"] == "wan21"


def _safetensors(tensors: dict[str, list[int]], metadata: dict[str, str] | None = None) -> bytes:
    """A header-only-valid safetensors file (bf16 zeros)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = write_sparse_safetensors(Path(d) / "x.safetensors", {k: tuple(v) for k, v in tensors.items()},
                                        metadata=metadata)  # fmt: skip
        return path.read_bytes()


# ------------------------------------------------------------------------------------ hooks (no checkout)
def test_hook_targets_are_pinned():
    got = [(t.label, t.params) for t in hooks.MusubiHook().targets()]
    m = "musubi_tuner"
    assert got == [
        (f"{m}.qwen_image.qwen_image_utils.get_qwen_prompt_embeds", ("tokenizer", "vlm", "prompt")),
        (f"{m}.wan.modules.t5.T5EncoderModel.__call__", ("self", "texts", "device")),
        (f"{m}.dataset.cache_io.save_text_encoder_output_cache_common", ("item_info", "sd", "arch_fullname", "merge_existing")),
        (f"{m}.utils.safetensors_utils.mem_eff_save_file", ("tensors", "filename", "metadata")),
        (f"{m}.cache_text_encoder_outputs.process_text_encoder_batches",
         ("num_workers", "skip_existing", "batch_size", "datasets", "all_cache_files_for_dataset",
          "all_cache_paths_for_dataset", "encode", "requires_content")),
        (f"{m}.dataset.image_video_dataset.ImageDataset.prepare_for_training", ("self", "num_timestep_buckets")),
        (f"{m}.dataset.image_video_dataset.VideoDataset.prepare_for_training", ("self", "num_timestep_buckets")),
    ]  # fmt: skip
    assert hooks.SUPPORTED == {"30c658c4f4b0bf05038b3346eff9670259b10fc7": "musubi-tuner 0.3.4 (30c658c)"}


@pytest.mark.parametrize(("argv", "parts"), [
    (["src/musubi_tuner/qwen_image_cache_text_encoder_outputs.py", "--dataset_config", "d.toml"], ("qwen", "cache", "check")),
    (["qwen_image_train_network.py", "--dit", "x"], ("qwen", "cache", "check")),
    (["wan_train_network.py", "--task", "t2v-14B"], ("wan", "cache", "check")),
    (["qwen_image_train_network.py", "--model_version", "edit"], ()),
    (["qwen_image_cache_text_encoder_outputs.py", "--edit"], ()),
    (["hv_train_network.py"], ()),
    (["-c"], ()),
])  # fmt: skip
def test_boot_installs_the_parts_the_script_needs(argv, parts):
    assert hooks.parts_for(argv)[0] == parts


def test_boot_says_why_it_does_nothing(monkeypatch, caplog):
    import logging

    monkeypatch.delenv("TE_ALIGN", raising=False)
    with caplog.at_level(logging.INFO, logger="te_align"):
        assert hooks.boot(argv=["hv_train_network.py"]) is False
    assert "not active in this musubi-tuner process (te-align has no profile for HunyuanVideo)" in caplog.text
    monkeypatch.setenv("TE_ALIGN", "off")
    assert hooks.boot(argv=["qwen_image_train_network.py"]) is False
    assert names.script_arch("wan_cache_text_encoder_outputs.py")[0].profile == "wan21"


# ------------------------------------------------------------------------------------ against a checkout
@pytest.fixture(scope="module")
def musubi():
    """musubi-tuner's modules imported from the checkout, inside the probe's sandbox (one session per module)."""
    root = needs_checkout()
    from te_align.probe.core import quiet
    from te_align.trainers.musubi.probe import Musubi

    adapter = Musubi(str(root))
    with quiet(), adapter.session():
        import importlib

        mods = {n: importlib.import_module(f"musubi_tuner.{n}") for n in (
            "qwen_image.qwen_image_utils", "wan.modules.t5", "dataset.cache_io", "dataset.image_video_dataset",
            "cache_text_encoder_outputs")}  # fmt: skip
        yield adapter, mods
    hooks.uninstall()


def test_every_target_resolves_and_matches_in_the_source(musubi):
    from te_align.trainers.musubi.patch import static_problems

    adapter, _ = musubi
    assert static_problems(adapter.root) == []
    hooks.MusubiHook().check()


def test_qwen_probe_differs_over_512_tokens_only_and_hooks_align_it(musubi):
    from te_align.probe.core import compare

    adapter, _ = musubi
    case = adapter.case("qwen-image")
    tensors, _ = compare(case)
    embeds = next(t for t in tensors if t.name == "prompt_embeds")
    assert embeds.trainer_shape == (1024, embeds.profile_shape[1]) and embeds.max_abs_diff == 0.0
    assert set(embeds.differing) == {"at limit (qwen)", "far over limit"}
    with adapter.hooked(case.profile):
        tensors, _ = compare(case)
    assert all(t.identical for t in tensors), [t.summary() for t in tensors]


def test_wan_probe_musubis_recipe_is_the_profiles(musubi):
    """musubi-tuner's Wan encoding follows the profile (the same differences with and without the hooks: its own umT5
    module rounds differently from transformers'); hooked, it equals te_align.encode run on that module bit for bit."""
    import torch

    import te_align
    from te_align.probe.core import compare

    adapter, mods = musubi
    case = adapter.case("wan21")
    plain, _ = compare(case)
    with adapter.hooked(case.profile):
        hooked, _ = compare(case)
        prompts = ["a cat", "", "café &amp; crème   with  spaces"]
        model = adapter.wan_encoder  # the probe's musubi-tuner T5EncoderModel object
        assert isinstance(model, mods["wan.modules.t5"].T5EncoderModel)
        got = model(prompts, torch.device("cpu"))
        want = te_align.encode(case.profile, prompts, tokenizers=case.tokenizers,
                               text_encoders={"text_encoder": hooks._Encoder(model.model)})["prompt_embeds"]  # fmt: skip
    for t_plain, t_hooked in zip(plain, hooked, strict=True):
        assert (t_plain.max_abs_diff, t_plain.differing) == (t_hooked.max_abs_diff, t_hooked.differing)
        assert t_plain.mean_cosine > 0.99999 and t_plain.shape_match
    lengths = [int((w.abs().sum(-1) > 0).sum()) for w in want]
    assert all(torch.equal(g, w[:n]) for g, w, n in zip(got, want, lengths, strict=True))


def test_cache_files_carry_the_fingerprint_and_stale_ones_are_encoded_again(musubi, tmp_path, monkeypatch):
    """A real ImageDataset: hooked, a cache file gets the fingerprint; ``--skip_existing`` keeps only files of the
    current fingerprint (the stale one is encoded again); training refuses to start on a stale file."""
    import torch
    from PIL import Image

    import te_align
    from te_align._safetensors import read_header

    _, mods = musubi
    for var in ("TE_ALIGN", "TE_ALIGN_PROFILE", "TE_ALIGN_OVERRIDES"):
        monkeypatch.delenv(var, raising=False)
    img, cache = tmp_path / "img", tmp_path / "cache"
    img.mkdir()
    cache.mkdir()
    for name in ("a", "b"):
        Image.new("RGB", (64, 64)).save(img / f"{name}.png")
        (img / f"{name}.txt").write_text(f"caption {name}", encoding="utf-8")
    dataset_cls = mods["dataset.image_video_dataset"].ImageDataset
    ds = dataset_cls((64, 64), ".txt", 1, 1, False, False, image_directory=str(img), cache_directory=str(cache),
                     architecture="qi")  # fmt: skip
    hooks.uninstall()
    assert hooks.install(parts=("cache", "check"))
    try:
        fp = te_align.profile("qwen-image").fingerprint()
        item = mods["dataset.image_video_dataset"].ItemInfo("a", "caption a", (64, 64))
        item.text_encoder_output_cache_path = str(cache / "a_qi_te.safetensors")
        mods["dataset.cache_io"].save_text_encoder_output_cache_qwen_image(item, torch.zeros(3, 8, dtype=torch.bfloat16))
        meta = read_header(item.text_encoder_output_cache_path).metadata
        assert (meta["te_align_fingerprint"], meta["te_align_profile"], meta["architecture"]) == (fp, "qwen-image", "qwen_image")
        (cache / "b_qi_te.safetensors").write_bytes(_safetensors({"varlen_vl_embed_bf16": [3, 8]}))  # made without te-align
        cte = mods["cache_text_encoder_outputs"]
        existing, paths = cte.prepare_cache_files_and_paths([ds])
        encoded: list[str] = []
        cte.process_text_encoder_batches(1, True, None, [ds], existing, paths, lambda batch: encoded.extend(i.item_key for i in batch))
        assert [Path(k).stem for k in encoded] == ["b"]  # a (current fingerprint) kept, b encoded again
        assert len(existing[0]) == 2  # the caller's sets stay as they were (post_process_cache_files reads them)
        with pytest.raises(hooks.HookError, match=r"1 of 2 cached text-encoder outputs in .* were made without te-align"):
            ds.prepare_for_training()
        (cache / "b_qi_te.safetensors").unlink()
        ds.prepare_for_training()  # every file of the current fingerprint: training may start
    finally:
        hooks.uninstall()
    encoded.clear()
    cte.process_text_encoder_batches(1, True, None, [ds], *cte.prepare_cache_files_and_paths([ds]),
                                     lambda batch: encoded.extend(i.item_key for i in batch))  # fmt: skip
    assert [Path(k).stem for k in encoded] == ["b"]  # unhooked: only the missing one (musubi-tuner's own rule)


def test_patch_and_unpatch_are_byte_identical_and_the_patched_package_boots(tmp_path):
    root = needs_checkout()
    copy = tmp_path / "musubi-tuner"
    shutil.copytree(root, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    init = copy / "src" / "musubi_tuner" / "__init__.py"
    before = init.read_bytes()
    assert main(["patch", str(copy), "--profile", "qwen-image"]) == 0
    assert b"te-align patch: musubi-tuner" in init.read_bytes()
    code = (
        "import sys\n"
        "sys.argv = ['src/musubi_tuner/qwen_image_cache_text_encoder_outputs.py', '--dataset_config', 'd.toml']\n"
        "from te_align.probe import _stubs\n"
        "from te_align.trainers.musubi.probe import OPTIONAL, _cuda_default\n"
        f"with _stubs.stub_missing(OPTIONAL, [{str(copy / 'src')!r}]), _cuda_default():\n"
        "    import musubi_tuner\n"
        "from te_align.trainers.musubi import hooks\n"
        "h = hooks.current()\n"
        "print(hooks.is_installed(), h.parts if h else None, h.user.source if h else None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TE_ALIGN", "TE_ALIGN_PROFILE", "TE_ALIGN_OVERRIDES")}
    env["PYTHONPATH"] = os.pathsep.join([str(copy / "src"), str(ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=copy)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "True ('qwen', 'cache', 'check') qwen-image"
    env["TE_ALIGN"] = "off"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=copy)
    assert run.stdout.strip().splitlines()[-1] == "False None None"
    assert main(["status", str(copy)]) == 0
    assert main(["unpatch", str(copy)]) == 0
    assert init.read_bytes() == before
    assert not (copy / ".te_align").exists()


def test_config_file_toml_with_hunyuan_videos_lora_module(tmp_path):
    """docs/advanced_config.md's --config_file example: dit + networks.lora (HunyuanVideo's module in musubi-tuner)."""
    cfg = write(tmp_path, "config.toml", 'dit = "/path/to/dit"\nnetwork_module = "networks.lora"\nnetwork_dim = 32\n')
    r = check_file(cfg)
    assert (r.trainer, r.exit_code, r.reason) == (
        "musubi", 3, "not checked: te-align has no profile for HunyuanVideo (network_module 'networks.lora')")
