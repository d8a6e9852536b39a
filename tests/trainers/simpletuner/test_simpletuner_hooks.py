"""SimpleTuner hooks (te_align.trainers.simpletuner.hooks): pinned targets and signatures, and against a real checkout
(``TE_ALIGN_SIMPLETUNER_DIR``): every target resolves, hooked outputs equal ``te_align.encode`` exactly and keep
SimpleTuner's return layout, the documented deviations are measured without hooks (SD3's T5 cut to 154), the
text-embed cache key carries the profile fingerprint and stale files are counted, ``TE_ALIGN=off`` and the
environment boot (``simpletuner train`` / ``server`` processes).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from te_align.hooks.base import OFF_WORDS
from te_align.trainers.simpletuner import hooks as st

ENV = "TE_ALIGN_SIMPLETUNER_DIR"
ROOT = Path(__file__).resolve().parents[3]
#: What SimpleTuner's model modules need for real (the rest is stood in for by the probe's sandbox).
NEEDED = ("torch", "transformers", "diffusers", "accelerate", "peft", "huggingface_hub", "numpy", "PIL",
          "safetensors", "tqdm")


# ------------------------------------------------------------------------------------ contract (no checkout)
def test_targets_and_signatures_are_pinned():
    hook = st.SimpleTunerHook()
    got = [(t.label, t.params) for t in hook.targets()]
    enc = ("self", "prompts", "is_negative_prompt")
    m = "simpletuner.helpers.models"
    c = "simpletuner.helpers.caching.text_embeds.TextEmbeddingCache"
    assert got == [
        (f"{m}.sd1x.model.StableDiffusion1._encode_prompts", enc),
        (f"{m}.sdxl.model.SDXL._encode_prompts", enc),
        (f"{m}.sd3.model.SD3._encode_prompts", enc),
        (f"{m}.flux.model.Flux._encode_prompts", enc),
        (f"{m}.pixart.model.PixartSigma._encode_prompts", enc),
        (f"{m}.chroma.model.Chroma._encode_prompts", enc),
        (f"{m}.auraflow.model.Auraflow._encode_prompts", enc),
        (f"{m}.sana.model.Sana._encode_prompts", enc),
        (f"{m}.lumina2.model.Lumina2._encode_prompts", enc),
        (f"{m}.hidream.model.HiDream._encode_prompts", enc),
        (f"{m}.qwen_image.model.QwenImage._encode_prompts", enc),
        (f"{m}.wan.model.Wan._encode_prompts", enc),
        (f"{c}.create_hash", ("self", "key_value", "prompt")),
        (f"{c}.hash_prompt_with_path", ("self", "prompt_record")),
        (f"{c}.compute_embeddings_for_prompts", ("self", "all_prompts")),
    ]
    assert all(t.wrap is not None for t in hook.targets())
    assert st.SUPPORTED == {"4.8.0": "SimpleTuner 4.8.0 (bc8e6ab)"}
    assert [t.label for t in st.SimpleTunerHook(families=("sd3",), cache=False).targets()] == [
        f"{m}.sd3.model.SD3._encode_prompts"]


def test_missing_simpletuner_refuses_naming_every_target(monkeypatch):
    if importlib.util.find_spec("simpletuner") is not None:
        pytest.skip("simpletuner is importable here")
    monkeypatch.delenv("TE_ALIGN", raising=False)
    hook = st.SimpleTunerHook(families=("sd3",), cache=False)
    with pytest.raises(st.HookError) as e:
        hook.install()
    assert "SimpleTuner hooks not installed (trainer version not importable; verified with SimpleTuner 4.8.0" in str(e.value)
    assert "simpletuner.helpers.models.sd3.model.SD3._encode_prompts: cannot import" in str(e.value)
    assert not hook.is_installed


def test_boot_file_knows_the_off_words():
    import ast

    tree = ast.parse((ROOT / "te_align" / "trainers" / "simpletuner" / "boot" / "sitecustomize.py").read_text(encoding="utf-8"))
    found = [ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and [getattr(t, "id", None) for t in n.targets] == ["off"]]
    assert found == [OFF_WORDS]


def test_boot_env_and_cli(capsys):
    env = st.boot_env({"PYTHONPATH": "/a"}, profile="sd35-large")
    boot = str(ROOT / "te_align" / "trainers" / "simpletuner" / "boot")
    assert env == {"PYTHONPATH": os.pathsep.join([boot, "/a"]), "TE_ALIGN_SIMPLETUNER": "1",
                   "TE_ALIGN_PROFILE": "sd35-large"}
    assert st.boot_env({"PYTHONPATH": boot})["PYTHONPATH"] == boot  # not added twice
    assert st._main(["env"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("export PYTHONPATH=") and out[1] == "export TE_ALIGN_SIMPLETUNER=1"
    assert st._main(["nope"]) == 2


# ------------------------------------------------------------------------------------ against a checkout
def _checkout() -> str:
    root = os.environ.get(ENV)
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not root or missing:
        why = [f"{ENV} is not set (path of a bghira/SimpleTuner checkout)"] if not root else []
        why += [f"missing imports: {', '.join(missing)}"] if missing else []
        pytest.skip("; ".join(why))
    if not (Path(root) / "simpletuner" / "helpers" / "models" / "common.py").is_file():
        pytest.skip(f"{ENV}={root} has no simpletuner/helpers/models/common.py")
    return root


@pytest.fixture(scope="module")
def session():
    from te_align.probe.core import quiet
    from te_align.trainers.simpletuner.probe import SimpleTunerProbe

    adapter = SimpleTunerProbe(_checkout())
    with quiet(), adapter.session():
        yield adapter


def test_every_target_resolves_with_its_signature(session, monkeypatch):
    monkeypatch.delenv("TE_ALIGN", raising=False)
    for fam in st.FAMILIES:
        session._module(fam)
    import importlib

    importlib.import_module(st._CACHE)
    resolved = st.SimpleTunerHook().check()
    assert len(resolved) == 15
    assert st.detect_version() in ("4.8.0", "not importable")  # the sandbox's checkout is on sys.path


@pytest.mark.parametrize("name", ["sd15", "sd21", "sdxl", "sd3-medium", "sd35-large", "flux-dev", "flux-schnell",
                                  "pixart-sigma", "chroma", "auraflow", "sana", "lumina2", "hidream", "qwen-image",
                                  "wan21"])
def test_hooked_outputs_equal_te_align_encode(session, name, monkeypatch):
    from te_align.probe.core import compare

    monkeypatch.delenv("TE_ALIGN", raising=False)
    case = session.case(name)
    plain, _ = compare(case)
    with session.hooked(case.profile):
        hooked, _ = compare(case)
    assert all(t.identical for t in hooked if t.trainer_shape is not None), [t.summary() for t in hooked]
    # SimpleTuner's Chroma returns no text_ids (its transformer call builds them): the only output not compared
    assert [t.name for t in hooked if t.trainer_shape is None] == (["text_ids"] if name == "chroma" else [])
    assert [t.name for t in hooked] == [t.name for t in plain]
    if name.startswith("sd3") or name == "sd35-large":
        embeds = {t.name: t for t in plain}["prompt_embeds"]
        # SimpleTuner's check_user_config: T5 cut to 154 (77 CLIP + 154 T5 tokens) where the pipeline uses 256
        assert (embeds.trainer_shape, embeds.profile_shape) == ((231, 96), (333, 96))
        assert len(embeds.differing) == embeds.compared == 15
        assert {t.name: t for t in plain}["pooled_prompt_embeds"].identical
    elif name == "sana":
        # SimpleTuner passes its own 10-line instruction (not the pipeline's): every prompt's embedding differs
        embeds = {t.name: t for t in plain}["prompt_embeds"]
        assert embeds.shape_match and len(embeds.differing) == embeds.compared == 14
    elif name == "auraflow":
        # SimpleTuner's check_user_config: T5 cut to 120 tokens where the pipeline uses 256
        shapes = {t.name: (t.trainer_shape, t.profile_shape) for t in plain}
        assert shapes == {"prompt_embeds": ((120, 64), (256, 64)), "prompt_attention_mask": ((120,), (256,))}
    elif name == "qwen-image":
        # SimpleTuner's diffusers override pads every caption to 1024 tokens (the pipeline: the batch's longest)
        shapes = {t.name: (t.trainer_shape, t.profile_shape, len(t.differing), t.compared) for t in plain}
        assert shapes == {"prompt_embeds": ((1024, 32), (5, 32), 14, 14),
                          "prompt_embeds_mask": ((1024,), (5,), 14, 14)}
    else:
        assert all(t.identical for t in plain if t.trainer_shape is not None), (name, [t.summary() for t in plain])


@pytest.mark.parametrize("name", ["sd15", "sdxl", "sd3-medium", "flux-dev", "pixart-sigma", "chroma", "auraflow",
                                  "sana", "lumina2", "hidream", "qwen-image", "wan21"])
def test_hooked_return_layout_is_simpletuners(session, name, monkeypatch):
    """Same tuple length, shapes, dtypes and devices as the original returns (at the profile's lengths)."""
    import torch

    from te_align.probe.adapter import _tiny

    monkeypatch.delenv("TE_ALIGN", raising=False)
    prof, toks, encs, pipe = _tiny(name)
    model = session.model(name, toks, encs, pipe)
    length = {"sd3-medium": 256, "auraflow": 256}.get(name)
    if length:
        model.config.tokenizer_max_length, model.config.i_know_what_i_am_doing = length, True
    prompts = ["a cat", "", "two dogs!"]
    with torch.no_grad():
        original = model._encode_prompts(prompts)
        with session.hooked(prof):
            hooked = model._encode_prompts(prompts)
    a = original if isinstance(original, tuple) else (original,)
    b = hooked if isinstance(hooked, tuple) else (hooked,)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if name == "qwen-image":  # SimpleTuner pads to 1024, the profile to the batch's longest (9 here)
            assert (x.shape[0], x.shape[1], x.shape[2:], x.dtype, x.device) == (3, 1024, y.shape[2:], y.dtype, y.device)
            assert y.shape[1] == int(b[1].sum(1).max())
            continue
        assert (tuple(x.shape), x.dtype, x.device) == (tuple(y.shape), y.dtype, y.device)
    if name not in ("sd3-medium", "auraflow", "sana", "qwen-image"):  # deviating: only the layout is compared
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def test_te_align_off_leaves_simpletuner_alone(session, monkeypatch):
    import te_align

    session._module("sd3")
    monkeypatch.setenv("TE_ALIGN", "off")
    hook = st.SimpleTunerHook(profile=te_align.profile("sd3-medium"), families=("sd3",), cache=False)
    original = session.modules[st.FAMILIES["sd3"].module].SD3._encode_prompts
    assert hook.install() is False
    assert session.modules[st.FAMILIES["sd3"].module].SD3._encode_prompts is original
    assert not hook.is_installed


def test_cache_key_has_the_fingerprint_and_stale_files_are_counted(session, monkeypatch, tmp_path):
    import importlib

    import te_align

    monkeypatch.delenv("TE_ALIGN", raising=False)
    mod = importlib.import_module(st._CACHE)
    tracker = sys.modules[mod.__name__].StateTracker
    cache = mod.TextEmbeddingCache.__new__(mod.TextEmbeddingCache)
    cache.model_type, cache.cache_dir, cache.id, cache.model = "sd3", str(tmp_path), "st18-test", None
    cache.key_type = mod.TextEmbedCacheKey.CAPTION
    cache._requires_path_based_keys = False
    cache.batch_write_thread = threading.Thread(target=lambda: None)  # never started: __del__ has nothing to join
    record = {"prompt": "a cat", "key": "a cat"}
    old = cache.hash_prompt_with_path(record)
    prof = te_align.profile("sd3-medium")
    saved = dict(tracker.all_text_cache_files)
    tracker.all_text_cache_files["st18-test"] = {old: False}
    hook = st.SimpleTunerHook(profile=prof, families=("sd3",))
    for fam in st.FAMILIES:
        session._module(fam)
    try:
        assert hook.install()
        new = cache.hash_prompt_with_path(record)
        assert new == old[: -len(".pt")] + f"-ta{prof.fingerprint()[:16]}.pt"
        assert hook.stale_count == 1
        tracker.all_text_cache_files["st18-test"] = {old: False, new: False}
        cache.hash_prompt_with_path({"prompt": "a dog", "key": "a dog"})
        assert hook.stale_count == 1  # a file that was never cached is not stale
    finally:
        hook.uninstall()
        tracker.all_text_cache_files.clear()
        tracker.all_text_cache_files.update(saved)
    assert cache.hash_prompt_with_path(record) == old


def test_boot_installs_the_hooks_in_a_new_process(tmp_path):
    root = _checkout()
    code = (
        "import sys\n"
        "from te_align.probe import _stubs\n"
        "from te_align.trainers.simpletuner.probe import OPTIONAL_IMPORTS\n"
        "import diffusers, transformers\n"
        f"with _stubs.stub_missing(OPTIONAL_IMPORTS, [{root!r}]):\n"
        "    import simpletuner.helpers.caching.text_embeds\n"
        "from te_align.trainers.simpletuner import hooks as st\n"
        "h = st.current()\n"
        "print(h is not None and h.is_installed, len(h.installed) if h else 0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TE_ALIGN",)}
    env.update(st.boot_env(env, profile="sd35-large"))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], root, str(ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True 15"
    env["TE_ALIGN"] = "off"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "False 0"


def test_check_fix_text_names_the_hooks_for_hooked_families(tmp_path):
    """``te-align check`` on a SimpleTuner config: a hard-coded deviation in a hooked family says how to enable
    the hooks; the families it names are the hooks' own."""
    import json

    from te_align.checking import check_file
    from te_align.trainers.simpletuner import audit

    assert set(audit.HOOKED) == {f for fam in st.FAMILIES.values() for f in fam.families}
    assert 'eval "$(python -m te_align.hooks.simpletuner env)"' in audit.HOOKS_FIX
    path = tmp_path / "sana.json"
    path.write_text(json.dumps({"model_family": "sana"}), encoding="utf-8")
    (f,) = [f for f in check_file(str(path)).findings if f.kind == "deviation"]
    assert (f.setting, f.fix) == ("gemma.tokenizer.system_prompt", audit.HOOKS_FIX)  # SimpleTuner's own instruction
    from te_align.audit.readers import load

    path = tmp_path / "wan.json"
    path.write_text(json.dumps({"model_family": "wan"}), encoding="utf-8")
    assert audit.parse(load(str(path)), []).trainer.not_settable == audit.HOOKS_FIX
    path = tmp_path / "qwen-edit.json"
    path.write_text(json.dumps({"model_family": "qwen_image", "model_flavour": "edit-v1"}), encoding="utf-8")
    assert audit.parse(load(str(path)), []).trainer.not_settable == audit.NOT_SETTABLE  # edit: not hooked
    path = tmp_path / "sd3.json"
    path.write_text(json.dumps({"model_family": "sd3"}), encoding="utf-8")
    r = check_file(str(path))
    (cache,) = [f for f in r.findings if f.kind == "stale-cache"]
    assert "python -m te_align.hooks.simpletuner env" in cache.fix


def test_wan_second_value_is_the_empty_prompt(session, monkeypatch):
    """SimpleTuner's Wan ``_encode_prompts`` returns (prompt_embeds, the pipeline's CFG negative: the empty prompt
    once per prompt), cached as ``attention_masks``; hooked, both equal ``te_align.encode`` exactly."""
    import torch

    import te_align
    from te_align.probe.adapter import _tiny

    monkeypatch.delenv("TE_ALIGN", raising=False)
    prof, toks, encs, pipe = _tiny("wan21")
    model = session.model("wan21", toks, encs, pipe)
    prompts = ["a cat", "", "two  dogs!"]
    with torch.no_grad():
        want = te_align.encode(prof, prompts, tokenizers=toks, text_encoders=encs)["prompt_embeds"]
        empty = te_align.encode(prof, [""] * 3, tokenizers=toks, text_encoders=encs, negative=True)["prompt_embeds"]
        original = model._encode_prompts(prompts)
        with session.hooked(prof):
            hooked = model._encode_prompts(prompts)
    assert torch.equal(hooked[0], want) and torch.equal(hooked[1], empty)
    assert torch.equal(original[0], want) and torch.equal(original[1], empty)  # measured: no deviation


def test_qwen_image_deviation_is_measured(session, monkeypatch):
    """Without hooks SimpleTuner keeps up to 1024 caption tokens (the pipeline: 512) and pads every caption to
    1024 with zero rows; real tokens match the pipeline's up to float rounding (the encoder sees 1058 positions)."""
    import torch

    import te_align
    from te_align.probe.adapter import _tiny

    monkeypatch.delenv("TE_ALIGN", raising=False)
    prof, toks, encs, pipe = _tiny("qwen-image")
    model = session.model("qwen-image", toks, encs, pipe)
    prompts = ["a cat", "word " * 1500]
    with torch.no_grad():
        want = te_align.encode(prof, prompts, tokenizers=toks, text_encoders=encs)
        embeds, mask = model._encode_prompts(prompts)
        with session.hooked(prof):
            hooked = model._encode_prompts(prompts)
    assert mask.sum(1).tolist() == [7, 1024]
    assert want["prompt_embeds_mask"].sum(1).tolist() == [7, 512]
    assert float((embeds[0, :7] - want["prompt_embeds"][0, :7]).abs().max()) < 1e-5  # the suite's max: 3.6e-7
    assert not embeds[0, 7:].any() and tuple(embeds.shape[:2]) == (2, 1024)  # zero rows up to 1024
    assert torch.equal(hooked[0], want["prompt_embeds"]) and torch.equal(hooked[1], want["prompt_embeds_mask"])


def test_qwen_image_edit_flavours_are_left_to_simpletuner(session, monkeypatch):
    """An edit flavour encodes the caption with its image; te-align has no profile for it: SimpleTuner's own
    ``_encode_prompts`` runs (here it stops for want of the image context, as it does without te-align) and the
    cache key is unchanged."""
    import te_align
    from te_align.probe.adapter import _tiny

    monkeypatch.delenv("TE_ALIGN", raising=False)
    _, toks, encs, pipe = _tiny("qwen-image")
    model = session.model("qwen-image", toks, encs, pipe)
    model.config.model_flavour = "edit-v1"
    assert model.requires_text_embed_image_context()
    bundled = te_align.profile("qwen-image")
    hook = st.SimpleTunerHook(profile=bundled, families=("qwen_image",))
    for fam in st.FAMILIES:
        session._module(fam)
    try:
        assert hook.install()
        with pytest.raises(ValueError, match="requires prompt image context"):
            model._encode_prompts(["a cat"])
        assert hook._suffix(type("Cache", (), {"model": model})()) == ""
        model.config.model_flavour = "v1.0"
        assert hook._suffix(type("Cache", (), {"model": model})()) == f"-ta{bundled.fingerprint()[:16]}"
    finally:
        hook.uninstall()


def test_probe_session_puts_back_what_simpletuner_patches_in_diffusers():
    """Importing SimpleTuner's models rewrites diffusers' ``QwenImagePipeline._get_qwen_prompt_embeds`` (pad to
    1024) and more, process-wide; after a probe session diffusers is its own again (run in a fresh process)."""
    root = _checkout()
    code = (
        "from diffusers import QwenImagePipeline\n"
        "from diffusers.models.attention_processor import Attention\n"
        "from te_align.trainers.simpletuner.probe import SimpleTunerProbe\n"
        "before = (QwenImagePipeline._get_qwen_prompt_embeds, Attention.fuse_projections)\n"
        f"probe = SimpleTunerProbe({root!r})\n"
        "with probe.session():\n"
        "    probe._module('qwen_image')\n"
        "    during = QwenImagePipeline._get_qwen_prompt_embeds.__module__\n"
        "after = (QwenImagePipeline._get_qwen_prompt_embeds, Attention.fuse_projections)\n"
        "print(during, [a is b for a, b in zip(before, after)])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TE_ALIGN"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "simpletuner.helpers.training.diffusers_overrides [True, True]"


def test_hidream_outputs_take_simpletuners_base_weight_dtype(session, monkeypatch):
    """SimpleTuner's HiDream passes ``dtype=config.base_weight_dtype`` to its pipeline, which casts the T5 and CLIP
    outputs to it and leaves the Llama layers in the encoder's dtype: hooked, the same (bit-identical here)."""
    import torch

    from te_align.probe.adapter import _tiny

    monkeypatch.delenv("TE_ALIGN", raising=False)
    prof, toks, encs, pipe = _tiny("hidream")
    model = session.model("hidream", toks, encs, pipe)
    model.config.base_weight_dtype = torch.bfloat16
    prompts = ["a cat", "two dogs!"]
    with torch.no_grad():
        original = model._encode_prompts(prompts)
        with session.hooked(prof):
            hooked = model._encode_prompts(prompts)
    assert [x.dtype for x in hooked] == [torch.bfloat16, torch.float32, torch.bfloat16]
    assert all(torch.equal(x, y) for x, y in zip(original, hooked, strict=True))


def test_qwen_image_hook_loads_the_text_encoder_as_simpletuner_does(session, monkeypatch):
    """SimpleTuner's Qwen-Image ``_encode_prompts`` loads the text encoder when none is loaded; hooked, too (its
    loader reads the hub: a stand-in puts the tiny encoder in place)."""
    import torch

    import te_align
    from te_align.probe.adapter import _tiny

    monkeypatch.delenv("TE_ALIGN", raising=False)
    prof, toks, encs, pipe = _tiny("qwen-image")
    model = session.model("qwen-image", toks, encs, pipe)
    loaded = []
    model.text_encoders = None
    model.load_text_encoder = lambda: loaded.append(1) or setattr(model, "text_encoders", [encs["text_encoder"]])
    with torch.no_grad(), session.hooked(prof):
        embeds, mask = model._encode_prompts(["a cat"])
    want = te_align.encode(prof, ["a cat"], tokenizers=toks, text_encoders=encs)
    assert loaded == [1] and torch.equal(embeds, want["prompt_embeds"]) and torch.equal(mask, want["prompt_embeds_mask"])
