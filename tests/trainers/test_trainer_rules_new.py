"""Trainer rules for the newer families (issue 45): sd-scripts' Anima cache and caption_dropout_rate, musubi-tuner's
and diffusion-pipe's readers for FLUX.2, Z-Image, Qwen-Image-Edit, Kontext and Wan 2.2. Exact findings and exit codes."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

from te_align.checking import check_file


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return str(p)


def _npy_f32(value: float) -> bytes:
    """A 0-d float32 .npy file (numpy's format 1.0), as np.savez writes torch.tensor(rate, dtype=float32)."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + struct.pack("<f", value)


def anima_npz(path: Path, rate: float) -> None:
    """An ``*_anima_te.npz`` with the arrays sd-scripts writes (library/strategy_anima.py:238-245)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in ("prompt_embeds", "attn_mask", "t5_input_ids", "t5_attn_mask"):
            zf.writestr(f"{name}.npy", _npy_f32(0.0))
        zf.writestr("caption_dropout_rate.npy", _npy_f32(rate))
    path.write_bytes(buf.getvalue())


ANIMA = ('pretrained_model_name_or_path = "/m/anima.safetensors"\nqwen3 = "/m/qwen_3_06b_base.safetensors"\n'
         "cache_text_encoder_outputs = true\ncache_text_encoder_outputs_to_disk = true\n")


def _dataset(tmp_path: Path, rate: float) -> str:
    img = tmp_path / "img"
    img.mkdir(exist_ok=True)
    return write(tmp_path, "ds.toml", f'[[datasets]]\n[[datasets.subsets]]\nimage_dir = "{img.as_posix()}"\n'
                                      f"caption_dropout_rate = {rate}\n")


def test_anima_npz_rate_is_read_back(tmp_path):
    from te_align.audit.cachefiles import npz_scalar

    anima_npz(tmp_path / "a_anima_te.npz", 0.1)
    assert npz_scalar(tmp_path / "a_anima_te.npz", "caption_dropout_rate") == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert npz_scalar(tmp_path / "a_anima_te.npz", "missing") is None


def test_anima_changed_dropout_rate_with_an_existing_cache_is_caught(tmp_path):
    ds = _dataset(tmp_path, 0.2)
    for i in range(3):
        anima_npz(tmp_path / "img" / f"{i}_anima_te.npz", 0.1 if i < 2 else 0.2)
    r = check_file(write(tmp_path, "a.toml", ANIMA + f'dataset_config = "{Path(ds).as_posix()}"\n'),
                   extra_args=["anima_train_network.py"])
    assert (r.profile, r.exit_code) == ("anima", 1)
    stale = [f for f in r.findings if f.setting == "caption_dropout_rate"]
    assert len(stale) == 1
    f = stale[0]
    assert (f.kind, f.severity, f.effective) == ("stale-cache", "error", 0.2)
    folder = (tmp_path / "img").as_posix()
    assert f.message == (f"2 of 3 cached *_anima_te.npz files in {folder} hold another caption_dropout_rate (2 with 0.1) "
                         "than this config gives the subset (0.2): sd-scripts reuses them (its check only asks that the "
                         "rate is stored, not that it is the same) and drops captions at the cached rate, so the new "
                         "rate does nothing")
    assert f.fix == f"delete the *_anima_te.npz files in {folder} (sd-scripts caches them again with the new rate)"
    assert "strategy_anima.py:171-195" in f.trainer_source


def test_anima_cache_made_with_the_same_rate_is_fine(tmp_path):
    ds = _dataset(tmp_path, 0.1)
    anima_npz(tmp_path / "img" / "0_anima_te.npz", 0.1)
    r = check_file(write(tmp_path, "a.toml", ANIMA + f'dataset_config = "{Path(ds).as_posix()}"\n'))
    assert (r.profile, r.exit_code) == ("anima", 0)
    assert [f.setting for f in r.findings if f.kind != "note"] == []


def test_anima_command_line_rate_without_cache_files_is_a_note(tmp_path):
    img = tmp_path / "train"
    img.mkdir()
    r = check_file(write(tmp_path, "a.toml", ANIMA + f'train_data_dir = "{img.as_posix()}"\n'),
                   extra_args=["anima_train_network.py", "--caption_dropout_rate", "0.05"])
    assert (r.profile, r.exit_code) == ("anima", 0)
    notes = [f for f in r.findings if f.setting == "caption_dropout_rate"]
    assert [(f.kind, f.severity, f.fix) for f in notes] == [
        ("note", "info", "after changing caption_dropout_rate, delete the *_anima_te.npz files next to the images")]
    # the rate on the command line applies to train_data_dir: a cache made at 0 is stale
    anima_npz(img / "0_anima_te.npz", 0.0)
    r = check_file(write(tmp_path, "a.toml", ANIMA + f'train_data_dir = "{img.as_posix()}"\n'),
                   extra_args=["anima_train_network.py", "--caption_dropout_rate", "0.05"])
    assert r.exit_code == 1
    assert [(f.kind, f.effective) for f in r.findings if f.setting == "caption_dropout_rate"] == [("stale-cache", 0.05)]


# ------------------------------------------------------------------------------------ musubi-tuner
def musubi(*args: str):
    return check_file("<command line>", command=["python", *args, "--dataset_config", "d.toml"])


def test_musubi_kontext_is_checked_with_flux_dev_and_aligned():
    r = musubi("flux_kontext_cache_text_encoder_outputs.py", "--text_encoder1", "/m/t5xxl.safetensors",
               "--text_encoder2", "/m/clip_l.safetensors")
    assert (r.trainer, r.profile, r.exit_code) == ("musubi", "flux-dev", 0)
    assert r.effective == {"t5.tokenizer.max_length": 512, "t5.tokenizer.padding": "max_length",
                           "t5.masks.encoder": False, "t5.masks.denoiser": False, "clip_l.tokenizer.max_length": 77}
    assert [f.message for f in r.findings] == [
        "FLUX.1 Kontext is checked with the flux-dev profile: diffusers' FluxKontextPipeline encodes the prompt as "
        "FluxPipeline does (T5 at 512 without a mask, CLIP-L pooled at 77)"]


def test_musubi_versions_name_their_own_profile_never_another():
    cases = [  # (args, profile, why, exit code: the Edit models' image-resize/area deviations and the cache note)
        (("qwen_image_cache_text_encoder_outputs.py", "--model_version", "edit"), "qwen-image-edit",
         "script qwen_image_cache_text_encoder_outputs.py and --model_version edit", 1),
        (("qwen_image_cache_text_encoder_outputs.py", "--model_version", "edit-2511"), "qwen-image-edit-2511",
         "script qwen_image_cache_text_encoder_outputs.py and --model_version edit-2511", 1),
        (("qwen_image_cache_text_encoder_outputs.py", "--edit_plus"), "qwen-image-edit-2509",
         "script qwen_image_cache_text_encoder_outputs.py and --edit_plus", 1),
        (("flux_2_cache_text_encoder_outputs.py",), "flux2-dev",
         "script flux_2_cache_text_encoder_outputs.py and --model_version dev (the default)", 0),
        (("flux_2_cache_text_encoder_outputs.py", "--model_version", "klein-9b"), "flux2-klein-9b",
         "script flux_2_cache_text_encoder_outputs.py and --model_version klein-9b", 0),
        (("zimage_cache_text_encoder_outputs.py",), "z-image", "script zimage_cache_text_encoder_outputs.py", 0),
    ]
    for args, profile, why, code in cases:
        r = musubi(*args)
        assert (r.status, r.profile, r.family_reason, r.exit_code) == ("checked", profile, why, code), args


def test_musubi_unknown_version_is_refused_as_musubi_refuses_it():
    r = musubi("qwen_image_cache_text_encoder_outputs.py", "--model_version", "edit-2603")
    assert (r.exit_code, r.status, r.reason) == (
        2, "not-checked", "not checked: --model_version edit-2603 is no Qwen-Image version musubi-tuner or te-align knows")
    (bad,) = [f for f in r.findings if f.kind == "wrong-value"]
    assert bad.message == ("wrong type/value for model_version: 'edit-2603' is not a Qwen-Image version musubi-tuner "
                           "knows (original, layered, edit, edit-2509, edit-2511); it stops at start")
    r = musubi("flux_2_cache_text_encoder_outputs.py", "--model_version", "klein-2b")
    assert (r.exit_code, r.reason) == (
        2, "not checked: --model_version klein-2b is no FLUX.2 version musubi-tuner or te-align knows")


def test_musubi_edit_versions_vl_image_and_template():
    from te_align.trainers.musubi.audit import NOT_SETTABLE_UNHOOKED

    resize = ("qwen.images.resize", "bucket_16_crop", "round_32", "warning")
    r = musubi("qwen_image_cache_text_encoder_outputs.py", "--model_version", "edit")
    assert (r.profile, r.exit_code) == ("qwen-image-edit", 1)
    dev = {f.setting: f for f in r.findings if f.kind == "deviation"}
    assert [(f.setting, f.effective, f.profile, f.severity) for f in dev.values()] == [
        ("qwen.images.area", 147456, 1048576, "error"), resize]
    fix = NOT_SETTABLE_UNHOOKED.format(what="Qwen-Image-Edit")
    assert fix == ("not settable in musubi-tuner (hard-coded), and te-align's hooks do not cover Qwen-Image-Edit: "
                   "there is no fix in config")
    assert {f.fix for f in dev.values()} == {fix}
    assert dev["qwen.images.area"].trainer_source == ("qwen_image_cache_text_encoder_outputs.py:43-61; "
                                                      "qwen_image/qwen_image_utils.py:904")
    assert [f.kind for f in r.findings if f.kind == "stale-cache"] == ["stale-cache"]
    # 2509 / 2511: the template, "Picture N: " prefix and 384x384 are theirs; only the resize differs
    for version, prof in (("edit-2509", "qwen-image-edit-2509"), ("edit-2511", "qwen-image-edit-2511")):
        r = musubi("qwen_image_cache_text_encoder_outputs.py", "--model_version", version)
        assert r.profile == prof
        assert [(f.setting, f.effective, f.profile, f.severity) for f in r.findings if f.kind == "deviation"] == [resize]
        assert {"qwen.tokenizer.template", "qwen.images.prefix", "qwen.images.area"} <= set(r.effective)
    r = musubi("qwen_image_cache_text_encoder_outputs.py", "--edit")  # the older spelling of the original Edit
    assert r.profile == "qwen-image-edit"
    # the text-to-image rows (34 tokens dropped, 1024 tokens) are not applied to an Edit profile
    assert r.effective["qwen.tokenizer.drop_start_tokens"] == 64


def test_musubi_templates_are_the_profiles():
    import te_align
    from te_align.trainers.musubi.audit import EDIT_TEMPLATE, PLUS_PREFIX, PLUS_TEMPLATE

    assert te_align.profile("qwen-image-edit").get("slots.qwen.tokenizer.template") == EDIT_TEMPLATE
    for name in ("qwen-image-edit-2509", "qwen-image-edit-2511"):
        assert te_align.profile(name).get("slots.qwen.tokenizer.template") == PLUS_TEMPLATE
        assert te_align.profile(name).get("slots.qwen.images.prefix") == PLUS_PREFIX


# ------------------------------------------------------------------------------------ diffusion-pipe
def dpipe_config(tmp_path: Path, model: str, control: bool = False, top: str = "") -> str:
    """A diffusion-pipe training TOML and its dataset TOML (a control_path directory: Qwen-Image-Edit mode)."""
    (tmp_path / "img").mkdir(exist_ok=True)
    (tmp_path / "ctl").mkdir(exist_ok=True)
    ctl = f"control_path = '{(tmp_path / 'ctl').as_posix()}'\n" if control else ""
    write(tmp_path, "dataset.toml", f"resolutions = [1024]\n[[directory]]\npath = '{(tmp_path / 'img').as_posix()}'\n"
                                    f"{ctl}num_repeats = 1\n")
    return write(tmp_path, "train.toml", f"output_dir = '/out'\ndataset = '{(tmp_path / 'dataset.toml').as_posix()}'\n"
                                         f"epochs = 10\n{top}\n[model]\n{model}\ndtype = 'bfloat16'\n"
                                         "[optimizer]\ntype = 'adamw_optimi'\nlr = 2e-5\n")


def test_diffusion_pipe_comfy_types_are_not_checked_with_the_reason(tmp_path):
    for kind, display, module, line in (("z_image", "Z-Image", "z_image", 17), ("flux2", "FLUX.2", "flux2", 18),
                                        ("krea2", "Krea 2", "krea2", 18), ("ideogram4", "Ideogram 4", "ideogram4", 22),
                                        ("ltx2", "LTX-2", "ltx2", 173)):
        # each type's own text-encoder key (LTX-2 reads text_encoder, not text_encoders: another key is a finding)
        te = ("text_encoder = '/m/te.safetensors'" if kind == "ltx2" else
              "text_encoders = [{path = '/m/te.safetensors', type = 'x'}]")
        r = check_file(dpipe_config(tmp_path, f"type = '{kind}'\ndiffusion_model = '/m/x.safetensors'\n"
                                              f"vae = '/m/vae.safetensors'\n{te}"))
        assert (r.trainer, r.exit_code, r.status) == ("diffusion-pipe", 3, "not-checked"), kind
        assert r.reason == (f"not checked: diffusion-pipe's [model] type '{kind}' ({display}) is a ComfyPipeline "
                            f"(models/{module}.py:{line}, models/base.py:541): its captions are encoded by ComfyUI's "
                            "text encoders (comfy.sd.load_clip, models/base.py:575-591) from the ComfyUI submodule "
                            "pinned at 9a9fdb10, whose code te-align has not read, so what it does is not known")


QI = "type = 'qwen_image'\ndiffusers_path = '/m/{name}'\n"


D_WARN = [("qwen.images.resize", "scale", "round_32", "warning"), ("qwen.images.resample", "bicubic", "lanczos", "warning")]


def test_diffusion_pipe_edit_2509_and_2511_template_and_vl_size(tmp_path):
    import te_align
    from te_align.trainers.diffusion_pipe.audit import EDIT_TEMPLATE, NO_EDIT_FIX

    for name, version in (("Qwen-Image-Edit-2509", "qwen-image-edit-2509"), ("Qwen-Image-Edit-2511", "qwen-image-edit-2511")):
        r = check_file(dpipe_config(tmp_path, QI.format(name=name), control=True))
        assert (r.profile, r.exit_code, r.status) == (version, 1, "checked"), name
        assert r.family_reason == ("[model] type 'qwen_image' with a dataset directory that has control_path "
                                   f"(Qwen-Image-Edit) and diffusers_path '/m/{name}'")
        p = te_align.profile(version)
        dev = [f for f in r.findings if f.kind == "deviation"]
        assert [(f.setting, f.effective, f.profile, f.severity) for f in dev] == [
            # the severity policy: not measured, no token cut and the image larger, not smaller: warnings
            ("qwen.tokenizer.template", EDIT_TEMPLATE, p.get("slots.qwen.tokenizer.template"), "warning"),
            ("qwen.images.prefix", "", "Picture {n}: <|vision_start|><|image_pad|><|vision_end|>", "warning"),
            ("qwen.images.area", 1048576, 147456, "warning"), *D_WARN]
        assert {f.fix for f in dev} == {NO_EDIT_FIX}
        assert NO_EDIT_FIX == ("not settable in diffusion-pipe (hard-coded in models/qwen_image.py), and te-align's "
                               "hooks leave the Edit image prompts unmodified: there is no fix in config")
        assert dev[0].trainer_source == "models/qwen_image.py:184,356-360"
        assert dev[2].trainer_source == "models/qwen_image.py:187-188,314-330"


def test_diffusion_pipe_original_edit_matches_and_unknown_versions_are_not_guessed(tmp_path):
    from te_align.profiles.registry import bundled_names

    r = check_file(dpipe_config(tmp_path, QI.format(name="Qwen-Image-Edit"), control=True))
    assert (r.profile, r.exit_code) == ("qwen-image-edit", 1)  # template, prefix and 1024x1024 are the original's
    assert [(f.setting, f.effective, f.profile, f.severity) for f in r.findings if f.kind == "deviation"] == D_WARN
    assert "qwen-image-edit" in bundled_names()
    # the version is not in the config and the names do not say it: not checked, never read as another version
    r = check_file(dpipe_config(tmp_path, QI.format(name="my-edit-model"), control=True))
    assert (r.exit_code, r.reason) == (3, (
        "not checked: [model] type 'qwen_image' with a dataset directory that has control_path (Qwen-Image-Edit), and "
        "diffusion-pipe has no key for the Edit version: the model files' names (diffusers_path) do not say which; "
        "pass --profile qwen-image-edit|qwen-image-edit-2509|qwen-image-edit-2511"))
    # a future version: its own name, not checked, nearest named
    r = check_file(dpipe_config(tmp_path, QI.format(name="Qwen-Image-Edit-2603"), control=True))
    assert r.exit_code == 3 and r.reason.startswith("not checked: te-align has no profile for qwen-image-edit-2603 (")
    # without control_path it is the text-to-image model, checked as before
    r = check_file(dpipe_config(tmp_path, QI.format(name="Qwen-Image"), control=False))
    assert (r.profile, r.status) == ("qwen-image", "checked")


def test_diffusion_pipe_edit_uncond_fraction_uses_the_text_to_image_template(tmp_path):
    r = check_file(dpipe_config(tmp_path, QI.format(name="Qwen-Image-Edit"), control=True, top="uncond_fraction = 0.1"))
    (f,) = [f for f in r.findings if f.kind == "deviation" and f.setting == "empty_prompt"]
    assert (f.setting, f.severity, f.key, f.fix) == (
        "empty_prompt", "warning", "uncond_fraction", "uncond_fraction = 0 (diffusion-pipe has no Edit-form "
                                                      "unconditional embedding)")
    assert f.message == ("uncond_fraction = 0.1: the unconditional embedding is '' encoded with no control image, so "
                         "through the text-to-image template (34 tokens dropped), where the Edit pipelines encode the "
                         "negative prompt with the Edit template and the image")
    assert r.exit_code == 1


def test_musubi_z_image_and_klein_are_aligned_and_the_rules_compare():
    r = musubi("zimage_cache_text_encoder_outputs.py")
    assert (r.profile, r.exit_code, r.findings) == ("z-image", 0, [])
    assert r.effective == {"qwen3.tokenizer.enable_thinking": True, "qwen3.tokenizer.max_length": 512,
                           "qwen3.encoder.layer": -2, "qwen3.masks.encoder": True, "qwen3.tokenizer.padding": "max_length",
                           "qwen3.masks.encoder_mask_dtype": "bool", "qwen3.masks.repad": "batch_longest"}
    for version, prof in (("klein-4b", "flux2-klein-4b"), ("klein-9b", "flux2-klein-9b"), ("klein-base-4b", "flux2-klein-4b")):
        r = musubi("flux_2_cache_text_encoder_outputs.py", "--model_version", version)
        assert (r.profile, r.exit_code, r.findings) == (prof, 0, [])
        assert r.effective == {"qwen3.tokenizer.enable_thinking": False, "qwen3.tokenizer.max_length": 512,
                               "qwen3.tokenizer.padding": "max_length", "qwen3.encoder.layer": (9, 18, 27)}
    # against a profile set to the klein training script's layers, musubi's hard-coded (9, 18, 27) is a finding
    r = check_file("<command line>", command=["python", "flux_2_cache_text_encoder_outputs.py", "--model_version",
                                              "klein-4b", "--dataset_config", "d.toml"], overrides={"qwen3.layer": [10, 20, 30]})
    (f,) = [f for f in r.findings if f.kind == "deviation"]
    assert (f.setting, f.effective, f.profile, f.fix) == (
        "qwen3.encoder.layer", (9, 18, 27), (10, 20, 30),
        "not settable in musubi-tuner (hard-coded), and te-align's hooks do not cover FLUX.2: there is no fix in config")


def test_musubi_flux2_dev_keeps_the_system_message_newline():
    r = musubi("flux_2_cache_text_encoder_outputs.py")  # --model_version dev is the default
    assert (r.profile, r.exit_code, r.findings) == ("flux2-dev", 0, [])
    assert r.effective["mistral.tokenizer.system_prompt"].count("object\nattribution") == 1
    assert r.effective["mistral.encoder.layer"] == (10, 20, 30)
    assert r.effective["mistral.tokenizer.text_cleaning"] == "drop_img_tokens"


def test_diffusion_pipe_edit_uncond_fraction_fix_is_written_at_the_top(tmp_path):
    from te_align.checking import fix_file

    path = dpipe_config(tmp_path, QI.format(name="Qwen-Image-Edit"), control=True, top="uncond_fraction = 0.1")
    before = Path(path).read_text(encoding="utf-8")
    report = fix_file(path)
    assert report.written, report.refused
    after = Path(path).read_text(encoding="utf-8")
    assert after == before.replace("uncond_fraction = 0.1", "uncond_fraction = 0")
    r = check_file(path)
    assert [f for f in r.findings if f.setting == "empty_prompt"] == []
    # the hard-coded rows have no key: --fix leaves them (the resize/resample warnings stay)
    assert [f.setting for f in r.findings if f.kind == "deviation"] == ["qwen.images.resize", "qwen.images.resample"]
