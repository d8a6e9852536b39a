"""ai-toolkit integration against the PyPI packaging ostris-ai-toolkit 0.2.7 (installed --no-deps in CI).

Its real ``train_tools`` encode functions run on tiny models with and without the hooks: (a) the
documented differences appear without them, (b) with them the outputs equal ``te_align.encode``.
The wheel's top-level ``__init__`` imports its whole application (jobs, UI, torchvision, gradio, and
kohya's ``library`` / ``leco`` submodules it does not ship); the encode modules need none of it, so the
package object is registered without running that ``__init__`` — every module under test is real.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import te_align
from te_align.hooks import HookError
from te_align.parts import detect, plan_for
from te_align.patching import apply, revert, status
from te_align.patching.transaction import PatchError
from te_align.tiny.fit import fit_profile
from te_align.tiny.pipelines import build_pipeline_for_encoding
from te_align.trainers.ai_toolkit import patch as planner
from te_align.trainers.ai_toolkit.hooks import (
    AiToolkitHook,
    ConfigError,
    profile_name_for,
    settings_from_process,
    validate_section,
)

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ["a photo of a cat", "", "an astronaut riding a horse on the moon, " * 8]


def _wheel_module(name: str) -> Any:
    if importlib.util.find_spec("ostris_ai_toolkit") is None:
        pytest.skip("ostris-ai-toolkit 0.2.7 is not installed (pip install --no-deps ostris-ai-toolkit==0.2.7 oyaml==1.0)")
    if "ostris_ai_toolkit" not in sys.modules:
        spec = importlib.util.find_spec("ostris_ai_toolkit")
        sys.modules["ostris_ai_toolkit"] = importlib.util.module_from_spec(spec)  # its __init__ is not run
    return importlib.import_module(f"ostris_ai_toolkit.{name}")


@pytest.fixture(scope="module")
def tt() -> Any:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return _wheel_module("toolkit.train_tools")


def _lists(pipe: Any, n: int) -> tuple[list[Any], list[Any]]:
    names = ["" if i == 0 else f"_{i + 1}" for i in range(n)]
    return [getattr(pipe, f"tokenizer{s}") for s in names], [getattr(pipe, f"text_encoder{s}") for s in names]


# profile, te_align.tiny family, call of the real ai-toolkit function (as StableDiffusion.encode_prompt calls it), output names
CASES: dict[str, tuple[str, str, Any, tuple[str, ...]]] = {
    "sd15": ("sd15", "sd15", lambda tt, p, x, **k: tt.encode_prompts(p.tokenizer, p.text_encoder, x, **k), ("prompt_embeds",)),
    "sdxl": ("sdxl", "sdxl", lambda tt, p, x, **k: tt.encode_prompts_xl(*_lists(p, 2), x, None, **k), ("prompt_embeds", "pooled_prompt_embeds")),
    "sd35-large": ("sd35-large", "sd3", lambda tt, p, x, **k: tt.encode_prompts_sd3(*_lists(p, 3), x, pipeline=p, **k),
                   ("prompt_embeds", "pooled_prompt_embeds")),
    "flux-dev": ("flux-dev", "flux", lambda tt, p, x, **k: tt.encode_prompts_flux(*_lists(p, 2), x, max_length=512, **k),
                 ("prompt_embeds", "pooled_prompt_embeds")),
    "flux-schnell": ("flux-schnell", "flux", lambda tt, p, x, **k: tt.encode_prompts_flux(*_lists(p, 2), x, max_length=512, **k),
                     ("prompt_embeds", "pooled_prompt_embeds")),
    "pixart-sigma": ("pixart-sigma", "pixart-sigma", lambda tt, p, x, **k: tt.encode_prompts_pixart(p.tokenizer, p.text_encoder, x, max_length=300, **k),
                     ("prompt_embeds", "prompt_attention_mask")),
    "auraflow": ("auraflow", "auraflow", lambda tt, p, x, **k: tt.encode_prompts_auraflow(p.tokenizer, p.text_encoder, x, max_length=256, **k),
                 ("prompt_embeds",)),
}  # fmt: skip


def _run(tt: Any, case: str, hook: AiToolkitHook | None, **kw: Any) -> tuple[torch.Tensor, ...]:
    _, _, call, _ = CASES[case]
    if hook is not None:
        assert hook.install()
    try:
        with torch.no_grad():
            out = call(tt, _PIPES[case], PROMPTS, **kw)
    finally:
        if hook is not None:
            hook.uninstall()
    return out if isinstance(out, tuple) else (out,)


_PIPES: dict[str, Any] = {}


def _setup(case: str) -> Any:
    name, family, _, _ = CASES[case]
    if case not in _PIPES:
        _PIPES[case] = build_pipeline_for_encoding(family)
    return fit_profile(te_align.profile(name), _PIPES[case])


@pytest.mark.parametrize("case", list(CASES))
def test_wheel_encode_functions_with_hooks_equal_te_align(tt, case):
    prof = _setup(case)
    hook = AiToolkitHook(profile=prof, layout="pypi", parts=("train_tools",))
    got = _run(tt, case, hook)
    want = te_align.encode(prof, PROMPTS, pipeline=_PIPES[case])
    for name, t in zip(CASES[case][3], got, strict=False):
        assert t.dtype == want[name].dtype and torch.equal(t, want[name]), (case, name)
    assert not hook.is_installed
    assert getattr(tt.encode_prompts_flux, "__te_align_original__", None) is None  # uninstalled cleanly


def test_documented_differences_without_hooks(tt):
    # FLUX.1 schnell: ai-toolkit encodes T5 at 512 (StableDiffusion.encode_prompt passes max_length=512); the profile at 256.
    prof = _setup("flux-schnell")
    assert _run(tt, "flux-schnell", None)[0].shape[1] == 512
    assert _run(tt, "flux-schnell", AiToolkitHook(profile=prof, layout="pypi", parts=("train_tools",)))[0].shape[1] == 256
    # No way to set the T5 length in ai-toolkit: through the profile it is one override.
    longer = prof.with_overrides(t5_max_length=154)
    assert _run(tt, "flux-schnell", AiToolkitHook(profile=longer, layout="pypi", parts=("train_tools",)))[0].shape[1] == 154
    # SD3: prompt_dropout_prob is ignored (the argument is accepted and never used) ...
    prof3 = _setup("sd35-large")
    plain = _run(tt, "sd35-large", None)
    dropped = _run(tt, "sd35-large", None, dropout_prob=1.0)
    assert torch.equal(plain[0], dropped[0])
    # ... and honoured with the hook: every caption becomes what the profile says an empty prompt is.
    hooked = _run(tt, "sd35-large", AiToolkitHook(profile=prof3, layout="pypi", parts=("train_tools",)), dropout_prob=1.0)
    empty = te_align.encode(prof3, [""] * len(PROMPTS), pipeline=_PIPES["sd35-large"])
    assert torch.equal(hooked[0], empty["prompt_embeds"]) and not torch.equal(hooked[0], plain[0])
    # Flux attn_masking zeroes padded T5 outputs; the profile (diffusers, BFL) does not.
    profd = _setup("flux-dev")
    zeroed = _run(tt, "flux-dev", None, attn_mask=True)[0]
    ref = te_align.encode(profd, PROMPTS, pipeline=_PIPES["flux-dev"])["prompt_embeds"]
    assert not torch.equal(zeroed, ref)
    assert torch.equal(_run(tt, "flux-dev", AiToolkitHook(profile=profd, layout="pypi", parts=("train_tools",)), attn_mask=True)[0], ref)


def test_num_images_per_prompt_and_family_mismatch(tt):
    prof = _setup("sdxl")
    hook = AiToolkitHook(profile=prof, layout="pypi", parts=("train_tools",))
    emb, pooled = _run(tt, "sdxl", hook, num_images_per_prompt=2)
    want = te_align.encode(prof, PROMPTS, pipeline=_PIPES["sdxl"])
    assert torch.equal(emb, want["prompt_embeds"].repeat_interleave(2, 0)) and pooled.shape[0] == 2 * len(PROMPTS)
    wrong = AiToolkitHook(profile=_setup("flux-dev"), layout="pypi", parts=("train_tools",))
    with pytest.raises(HookError, match="active profile 'flux-dev' is for flux"):
        _run(tt, "sdxl", wrong)
    assert not wrong.is_installed or wrong.uninstall() is None


def test_te_align_off_and_idempotent_install(tt, monkeypatch):
    original = tt.encode_prompts_xl
    hook = AiToolkitHook(profile="sdxl", layout="pypi", parts=("train_tools",))
    monkeypatch.setenv("TE_ALIGN", "off")
    assert hook.install() is False and tt.encode_prompts_xl is original
    monkeypatch.delenv("TE_ALIGN")
    assert hook.install() and hook.install()  # second call is a no-op
    assert tt.encode_prompts_xl.__te_align_original__ is original
    with pytest.raises(HookError, match="already wrapped"):
        AiToolkitHook(profile="sdxl", layout="pypi", parts=("train_tools",)).install()
    hook.uninstall()
    hook.uninstall()
    assert tt.encode_prompts_xl is original


def test_refuses_rather_than_half_patching(tt):
    original = tt.encode_prompts_flux
    hook = AiToolkitHook(profile="flux-dev", layout="pypi", parts=("train_tools", "legacy"))
    try:
        hook.check()
    except HookError as e:  # StableDiffusion needs torchvision & kohya's library, absent here
        assert "toolkit.stable_diffusion_model" in e.message and "0.2.7" in e.message
        with pytest.raises(HookError):
            hook.install()
        assert tt.encode_prompts_flux is original and not hook.is_installed
    else:
        pytest.skip("the wheel's StableDiffusion imports here; nothing to refuse")
    with pytest.raises(HookError, match="no BaseModel models"):
        AiToolkitHook(profile="flux-dev", layout="pypi", parts=("models",)).check()


# ------------------------------------------------------------------------------ config section
def test_section_validation_names_key_and_allowed_ones():
    with pytest.raises(ConfigError, match=r"unknown key 't5_max_length'; allowed keys: profile, overrides, enabled.*overrides"):
        validate_section({"profile": "flux-dev", "t5_max_length": 154})
    with pytest.raises(ConfigError, match="must be a mapping"):
        validate_section("flux-dev")
    with pytest.raises(ConfigError, match="enabled must be true or false"):
        validate_section({"enabled": "yes"})
    with pytest.raises(ConfigError, match=r"model\.t5_max_length is ignored by ai-toolkit"):
        settings_from_process({"model": {"is_flux": True, "t5_max_length": 154}})
    with pytest.raises(ConfigError, match="te_align"):
        settings_from_process({"model": {"is_flux": True}, "te_align": {"overrides": {"t5_max_lenght": 154}}})
    with pytest.raises(ConfigError, match="no profile for ai-toolkit arch 'zimage'"):
        settings_from_process({"model": {"arch": "zimage"}, "te_align": {}})
    ok = settings_from_process({"model": {"arch": "flux", "name_or_path": "black-forest-labs/FLUX.1-schnell"},
                                "te_align": {"overrides": {"t5_max_length": 512}}})  # fmt: skip
    assert ok["resolved"].name == "flux-schnell" and ok["resolved"].slot("t5").tokenizer.max_length == 512


@pytest.mark.parametrize("arch", ["qwen_image_edit", "hidream_e1"])
def test_unhooked_edit_variants_refuse_an_explicit_profile(arch):
    """Their own get_prompt_embeds is not hooked: a te_align.profile must not silently do nothing."""
    from te_align.trainers.ai_toolkit.hooks import enable

    for section in ({"profile": "qwen-image"}, {}):
        with pytest.raises(HookError, match=f"hooks do not reach arch '{arch}'.*TE_ALIGN=off"):
            enable({"model": {"arch": arch}, "te_align": section})


@pytest.mark.parametrize(
    ("model", "name"),
    [({"is_xl": True}, "sdxl"), ({"is_v3": True, "name_or_path": "stabilityai/stable-diffusion-3.5-large"}, "sd35-large"),
     ({"arch": "sd3", "name_or_path": "stabilityai/stable-diffusion-3.5-medium"}, "sd35-medium"),
     ({"is_flux": True, "name_or_path": "black-forest-labs/FLUX.1-dev"}, "flux-dev"), ({"arch": "flex1"}, "flux-dev"),
     ({"arch": "chroma"}, "chroma"), ({"arch": "qwen_image"}, "qwen-image"), ({"arch": "wan22_14b:t2v"}, "wan21"),
     ({"arch": "hidream"}, "hidream"), ({"is_lumina2": True}, "lumina2"), ({"name_or_path": "x/sd15"}, "sd15"),
     ({"arch": "pixart_sigma"}, "pixart-sigma"), ({"arch": "pixart", "is_pixart_sigma": True}, "pixart-sigma")],
)  # fmt: skip
def test_profile_from_model_section(model, name):
    assert profile_name_for(model) == name


PRESETS = {"flux-dev": "flux-dev", "flux-schnell": "flux-schnell", "sd35-large": "sd35-large", "sdxl": "sdxl"}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_load_through_ai_toolkits_config_loader(preset):
    config = _wheel_module("toolkit.config")
    modules = _wheel_module("toolkit.config_modules")
    cfg = config.get_config(str(ROOT / "presets" / "ai-toolkit" / f"{preset}.yaml"))
    assert cfg["job"] == "extension" and cfg["meta"]["name"] == f"te_align_{preset}_lora"
    proc = cfg["config"]["process"][0]
    assert proc["type"] == "sd_trainer"
    assert settings_from_process(proc)["resolved"].name == PRESETS[preset]
    modules.ModelConfig(**proc["model"])
    modules.TrainConfig(**proc["train"])
    modules.DatasetConfig(**proc["datasets"][0])


# ------------------------------------------------------------------------------ on-disk patch
def _fake_checkout(root: Path, version: str | None = "0.12.26") -> Path:
    """The files detect() looks at, in ai-toolkit's layout (the real checkout is covered in test_ai_toolkit_checkout)."""
    (root / "toolkit").mkdir(parents=True)
    (root / "extensions_built_in").mkdir()
    (root / "extensions").mkdir()
    (root / "run.py").write_bytes(b"import os\r\nprint('ai-toolkit run')\n")
    (root / "toolkit" / "train_tools.py").write_text("X = 1\n")
    (root / "toolkit" / "job.py").write_text("Y = 1\n")
    if version:
        (root / "version.py").write_text(f'VERSION = "{version}"\n')
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} | {
        p.relative_to(root).as_posix() + "/": b"" for p in root.rglob("*") if p.is_dir()
    }


def test_patch_status_unpatch_restores_every_byte(tmp_path):
    root = _fake_checkout(tmp_path / "ai-toolkit")
    before = _tree(root)
    det = detect(root)
    assert (det.trainer, det.version) == ("ai-toolkit", "0.12.26")
    plan = plan_for(det, "flux-schnell")
    assert {c.path for c in plan.changes} == {"run.py", planner.EXTENSION, planner.ORIGINAL_RUN}
    apply(plan)
    assert (root / planner.ORIGINAL_RUN).read_bytes() == before["run.py"]
    assert b"PINNED_PROFILE = 'flux-schnell'" in (root / planner.EXTENSION).read_bytes()
    assert b"te_align_original_run.py" in (root / "run.py").read_bytes()
    assert status(root).patched and not status(root).changed
    assert apply(plan_for(detect(root), "flux-schnell")).noop  # re-planning on the patched tree is a no-op
    revert(root)
    assert _tree(root) == before


def test_patched_run_py_runs_the_original(tmp_path):
    import subprocess

    root = _fake_checkout(tmp_path / "ai-toolkit")
    (root / "run.py").write_text("import sys\nprint('original', sys.argv[1:], __name__)\n")
    apply(plan_for(detect(root), None))
    # the shim imports te_align: the one under test, not whatever this Python has installed
    on = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "run.py", "cfg.yaml"], cwd=root, capture_output=True, text=True, check=True,
                         env=on)
    assert out.stdout.strip() == "original ['cfg.yaml'] __main__"
    env = {**os.environ, "TE_ALIGN": "off"}
    out = subprocess.run([sys.executable, "run.py", "x"], cwd=root, capture_output=True, text=True, check=True, env=env)
    assert "original ['x']" in out.stdout


def test_bad_input_messages(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PatchError, match="is not a trainer installation te-align can patch"):
        detect(tmp_path / "empty", trainer="ai-toolkit")
    root = _fake_checkout(tmp_path / "old", version=None)
    with pytest.raises(PatchError, match="version is unknown"):
        plan_for(detect(root, trainer="ai-toolkit"), None)
    newer = detect(_fake_checkout(tmp_path / "new", version="0.13.0"), trainer="ai-toolkit")
    assert any("verified with ai-toolkit 0.12.26" in n for n in newer.notes)


def test_process_watch_is_a_declared_target(tmp_path, monkeypatch):
    """BaseProcess.__init__ is wrapped like every other target: checked signature, TE_ALIGN=off, uninstall.

    A module with ai-toolkit's BaseProcess signature (jobs/process/BaseProcess.py at 27a03a9 and in the
    0.2.7 wheel) stands in: the real one imports ai-toolkit's whole training stack."""
    from te_align.trainers.ai_toolkit.hooks import ProcessWatch

    pkg = tmp_path / "jobs" / "process"
    pkg.mkdir(parents=True)
    (tmp_path / "jobs" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "BaseProcess.py").write_text(
        "class BaseProcess:\n    def __init__(self, process_id, job, config):\n        self.config = config\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "jobs" or m.startswith("jobs.")]:
        monkeypatch.delitem(sys.modules, name)
    from jobs.process.BaseProcess import BaseProcess

    original = BaseProcess.__dict__["__init__"]
    watch = ProcessWatch(layout="current")
    monkeypatch.setenv("TE_ALIGN", "off")
    assert watch.install() is False and BaseProcess.__dict__["__init__"] is original
    monkeypatch.delenv("TE_ALIGN")
    assert watch.install() and BaseProcess.__init__.__te_align_original__ is original
    assert BaseProcess(0, None, {"name": "no model section"}).config == {"name": "no model section"}
    with pytest.raises(HookError, match="hooks do not reach arch 'qwen_image_edit'"):  # enable() ran with the config
        BaseProcess(1, None, {"model": {"arch": "qwen_image_edit"}, "te_align": {}})
    watch.uninstall()
    assert BaseProcess.__dict__["__init__"] is original
    (pkg / "BaseProcess.py").write_text("class BaseProcess:\n    def __init__(self, process_id, job):\n        pass\n")
    monkeypatch.delitem(sys.modules, "jobs.process.BaseProcess")
    with pytest.raises(HookError, match=r"BaseProcess\.__init__: signature changed"):
        ProcessWatch(layout="current").install()


def test_run_py_shim_carries_the_hooks_off_words(tmp_path):
    from te_align.hooks.base import OFF_WORDS

    shim = planner.shim_source(planner.templates_dir()).decode()
    assert f"_OFF_WORDS = {OFF_WORDS!r}" in shim and "_OFF_WORDS = None" not in shim
