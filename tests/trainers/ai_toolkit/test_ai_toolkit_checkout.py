"""ai-toolkit integration against a current checkout: TE_ALIGN_AI_TOOLKIT_DIR=/path/to/ai-toolkit.

Patch -> status -> unpatch on a copy restores every byte; the legacy ``train_tools`` encoders of the
checkout (top-level ``toolkit`` layout) equal ``te_align.encode`` with the hooks. Where ai-toolkit's
model modules import, the method-level hooks run on tiny random models with
and without hooks — ``StableDiffusion.encode_prompt`` (SD1.5, SDXL, SD3.5, FLUX.1, AuraFlow, PixArt-Sigma,
Lumina 2), ``BaseModel.encode_prompt`` -> ``get_prompt_embeds`` (Chroma, HiDream, Qwen-Image, Wan), the
text-embedding cache key — and the patched checkout's extension is loaded the way ai-toolkit loads
extensions. Elsewhere (CI has no torchvision) those tests skip with the import error.

A venv where they import: ai-toolkit's own pins at 27a03a9 (``tools/trainer_envs/ai-toolkit.txt``, Python 3.12)::

    python tools/trainer_envs.py run ai-toolkit --venv aitk-venv --checkout /path/to/ai-toolkit

Model objects are made with ``cls.__new__`` plus the attributes the encode methods read (no weights
are loaded); every method under test is ai-toolkit's own code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import te_align
from te_align.hooks import HookError
from te_align.parts import detect, plan_for
from te_align.patching import apply, revert, status
from te_align.tiny.fit import architecture_overrides, fit_profile
from te_align.tiny.pipelines import build_pipeline_for_encoding
from te_align.trainers.ai_toolkit import probe_models as am
from te_align.trainers.ai_toolkit.hooks import AiToolkitHook

ENV = "TE_ALIGN_AI_TOOLKIT_DIR"
CHECKOUT = os.environ.get(ENV)
pytestmark = pytest.mark.skipif(not CHECKOUT, reason=f"{ENV} is not set (path of an ostris/ai-toolkit checkout)")


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}  # fmt: skip


def test_patch_status_unpatch_on_checkout_copy(tmp_path):
    src = Path(str(CHECKOUT))
    root = tmp_path / "ai-toolkit"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns(".git", "node_modules", "*.safetensors"), symlinks=True)
    before = _tree(root)
    det = detect(root)
    assert det.trainer == "ai-toolkit" and det.version != "unknown"
    apply(plan_for(det, None))
    st = status(root)
    assert st.patched and not st.changed
    revert(root)
    assert _tree(root) == before
    assert not (root / "extensions" / "te_align").exists()


@pytest.fixture(scope="module")
def checkout_on_path():
    sys.path.insert(0, str(CHECKOUT))
    yield
    sys.path.remove(str(CHECKOUT))


def test_legacy_train_tools_equal_te_align(checkout_on_path):
    import toolkit.train_tools as tt

    prompts = ["a photo of a cat", "", "an astronaut riding a horse " * 30]
    for name, family in (("flux-schnell", "flux"), ("sd35-large", "sd3")):
        pipe = build_pipeline_for_encoding(family)
        prof = fit_profile(te_align.profile(name), pipe)
        hook = AiToolkitHook(profile=prof, layout="current", parts=("train_tools",))
        toks = [pipe.tokenizer, pipe.tokenizer_2] + ([pipe.tokenizer_3] if family == "sd3" else [])
        encs = [pipe.text_encoder, pipe.text_encoder_2] + ([pipe.text_encoder_3] if family == "sd3" else [])
        with torch.no_grad():
            plain = (tt.encode_prompts_flux(toks, encs, prompts, max_length=512) if family == "flux"
                     else tt.encode_prompts_sd3(toks, encs, prompts, pipeline=pipe))  # fmt: skip
            assert hook.install()
            try:
                got = (tt.encode_prompts_flux(toks, encs, prompts, max_length=512) if family == "flux"
                       else tt.encode_prompts_sd3(toks, encs, prompts, pipeline=pipe, dropout_prob=0.0))  # fmt: skip
            finally:
                hook.uninstall()
        want = te_align.encode(prof, prompts, pipeline=pipe)
        assert torch.equal(got[0], want["prompt_embeds"]) and torch.equal(got[1], want["pooled_prompt_embeds"])
        if name == "flux-schnell":
            assert plain[0].shape[1] == 512 and got[0].shape[1] == 256




# ------------------------------------------------------------------------------ method-level hooks
PROMPTS = ["a photo of a cat", "", "an astronaut riding a horse on the moon, " * 8]
# shared with the probe (te_align.trainers.ai_toolkit.probe_models): model objects via cls.__new__ on tiny models
_import_model_package = am.import_model_package
BASE_MODELS = am.BASE_MODELS


@pytest.fixture(scope="module")
def aitk(checkout_on_path) -> dict[str, Any]:
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # albumentations asks PyPI for updates at import
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        return am.import_model_classes()
    except Exception as e:  # CI: no torchvision / torchaudio / cv2 beside torch 2.13 CPU
        pytest.skip(f"ai-toolkit's model modules do not import here ({type(e).__name__}: {e})")


def _bare(aitk: dict[str, Any], cls: Any, model: dict[str, Any], **attrs: Any) -> Any:
    return am.bare(aitk, cls, model, **attrs)


def _encode(model: Any, hook: AiToolkitHook | None, prompts: list[str] = PROMPTS, **kw: Any) -> Any:
    if hook is not None:
        assert hook.install()
    try:
        with torch.no_grad():
            return model.encode_prompt(prompts, **kw)
    finally:
        if hook is not None:
            hook.uninstall()


def _base_model(aitk: dict[str, Any], family: str) -> tuple[Any, Any, Any]:
    name, _, support = BASE_MODELS[family]
    m, pipe = am.base_model(aitk, family, build_pipeline_for_encoding(support))
    over = architecture_overrides(te_align.profile(name), pipe)
    return m, pipe, over


def _main(pe: Any, family: str) -> list[torch.Tensor]:
    if family == "hidream":
        (t5, llama), pooled = pe.text_embeds, pe.pooled_embeds
        return [t5, llama, pooled]
    return [pe.text_embeds] + ([pe.attention_mask] if family == "qwen-image" else [])


def _want(cond: Any, family: str) -> list[torch.Tensor]:
    if family == "hidream":
        return [cond["prompt_embeds_t5"], cond["prompt_embeds_llama3"], cond["pooled_prompt_embeds"]]
    return [cond["prompt_embeds"]] + ([cond["prompt_embeds_mask"]] if family == "qwen-image" else [])


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("family", list(BASE_MODELS))
def test_base_model_get_prompt_embeds_with_and_without_hooks(aitk, family):
    m, pipe, over = _base_model(aitk, family)
    name = BASE_MODELS[family][0]
    prof = te_align.profile(name, **over)
    # the profile is chosen from the model config (arch), with the tiny models' architecture numbers
    hook = lambda: AiToolkitHook(overrides=over, layout="current", parts=("models",))  # noqa: E731
    plain, got = _encode(m, None), _encode(m, hook())
    want = te_align.encode(prof, PROMPTS, pipeline=pipe)
    assert _same(_main(got, family), _want(want, family)), family
    # prompt_dropout_prob reaches BaseModel models only through the hooks (ai-toolkit drops it)
    plain_drop, got_drop = _encode(m, None, dropout_prob=1.0), _encode(m, hook(), dropout_prob=1.0)
    want_drop = te_align.encode(prof, PROMPTS, pipeline=pipe, drop=[True] * len(PROMPTS))
    assert _same(_main(plain_drop, family), _main(plain, family))
    assert _same(_main(got_drop, family), _want(want_drop, family))
    assert not _same(_main(got_drop, family), _main(got, family))
    if family == "chroma":
        # documented gap: ai-toolkit runs T5 without its attention mask; the mask it passes on is the
        # tokenizer's (its transformer adds the one padding token itself) and the hook keeps that
        assert not torch.equal(plain.text_embeds, want["prompt_embeds"])
        assert torch.equal(got.attention_mask, plain.attention_mask)
        assert torch.equal(got.attention_mask.sum(1) + 1, want["prompt_attention_mask"].sum(1).long())
    else:  # same encoding as ai-toolkit at these prompt lengths
        assert _same(_main(plain, family), _want(want, family)), family


def test_qwen_image_long_prompt_length(aitk):
    # ai-toolkit calls QwenImagePipeline.encode_prompt with its default max_sequence_length=1024;
    # the profile keeps the official pipeline call's 512.
    m, pipe, over = _base_model(aitk, "qwen-image")
    long = ["an astronaut riding a horse on the moon, " * 120]
    plain = _encode(m, None, long)
    got = _encode(m, AiToolkitHook(overrides=over, layout="current", parts=("models",)), long)
    assert plain.text_embeds.shape[1] > 512 and got.text_embeds.shape[1] == 512
    assert torch.equal(got.text_embeds, te_align.encode(te_align.profile("qwen-image", **over), long, pipeline=pipe)["prompt_embeds"])


def test_wan_casts_to_model_dtype_and_refuses_other_families(aitk):
    m, pipe, over = _base_model(aitk, "wan")
    m.torch_dtype = torch.bfloat16  # Wan21.get_prompt_embeds passes dtype=self.torch_dtype
    plain, got = _encode(m, None), _encode(m, AiToolkitHook(overrides=over, layout="current", parts=("models",)))
    want = te_align.encode(te_align.profile("wan21", **over), PROMPTS, pipeline=pipe, dtype=torch.bfloat16)
    assert plain.text_embeds.dtype == got.text_embeds.dtype == torch.bfloat16
    assert torch.equal(got.text_embeds, want["prompt_embeds"]) and torch.equal(plain.text_embeds, want["prompt_embeds"])
    hook = AiToolkitHook(profile="sdxl", layout="current", parts=("models",))
    with pytest.raises(HookError, match="'sdxl' is for sdxl"):
        _encode(m, hook)
    assert not hook.is_installed


LEGACY = {k: v for k, v in am.LEGACY.items() if k in ("sd15", "sdxl", "sd35-large", "flux-dev", "flux-schnell", "auraflow",
                                                       "lumina2", "pixart-sigma")}  # fmt: skip


@pytest.mark.parametrize("name", list(LEGACY))
def test_legacy_stable_diffusion_encode_prompt(aitk, name):
    _, support, _ = LEGACY[name]
    pipe = build_pipeline_for_encoding(support)
    m = am.legacy_model(aitk, name, pipe)
    over = architecture_overrides(te_align.profile(name), pipe)
    prof = te_align.profile(name, **over)
    hook = lambda: AiToolkitHook(overrides=over, layout="current", parts=("train_tools", "legacy"))  # noqa: E731
    plain, got, got_drop = _encode(m, None), _encode(m, hook()), _encode(m, hook(), dropout_prob=1.0)
    plain_drop = _encode(m, None, dropout_prob=1.0)
    want = te_align.encode(prof, PROMPTS, pipeline=pipe)
    want_drop = te_align.encode(prof, PROMPTS, pipeline=pipe, drop=[True] * len(PROMPTS))
    if name == "pixart-sigma":
        # ai-toolkit's StableDiffusion.is_pixart is arch == "pixart": arch pixart_sigma takes the generic T5
        # branch (encode_prompts_pixart at 256, padding zeroed, no mask passed on). The hooks give the
        # profile's 300 tokens; that branch still zeroes the padding rows and drops the mask.
        mask = want["prompt_attention_mask"].unsqueeze(-1).to(want["prompt_embeds"].dtype)
        assert plain.text_embeds.shape[1] == 256 and got.attention_mask is None
        assert torch.equal(got.text_embeds, want["prompt_embeds"] * mask)
        return
    assert torch.equal(got.text_embeds, want["prompt_embeds"]), name
    assert torch.equal(got_drop.text_embeds, want_drop["prompt_embeds"]), name
    if "pooled_prompt_embeds" in want:
        assert torch.equal(got.pooled_embeds, want["pooled_prompt_embeds"]), name
    if name == "lumina2":
        assert torch.equal(got.attention_mask, want["prompt_attention_mask"])
    if name == "flux-schnell":  # documented gap: T5 at 512 instead of 256
        assert plain.text_embeds.shape[1] == 512 and got.text_embeds.shape[1] == 256
    else:
        assert torch.equal(plain.text_embeds, want["prompt_embeds"]), name
    if name in ("sd35-large", "lumina2"):  # documented gap: prompt_dropout_prob ignored without the hooks
        assert torch.equal(plain_drop.text_embeds, plain.text_embeds)
        assert not torch.equal(got_drop.text_embeds, got.text_embeds)


def test_cache_key_changes_with_the_profile(aitk):
    from toolkit.dataloader_mixins import TextEmbeddingFileItemDTOMixin

    class Item(TextEmbeddingFileItemDTOMixin):
        path = "/data/img/cat.png"
        caption = "a photo of a cat"
        text_embedding_space_version = "flux"
        encode_control_in_text_embeddings = False
        control_path = None

    item = Item()

    def key(profile: Any, **kw: Any) -> str:
        hook = AiToolkitHook(profile=profile, layout="current", parts=("cache",)) if profile is not None else None
        if hook is not None:
            assert hook.install()
        try:
            return item._build_text_embedding_path(**kw)
        finally:
            if hook is not None:
                hook.uninstall()

    plain, a = key(None), key(te_align.profile("flux-schnell"))
    assert plain != a and a == key(te_align.profile("flux-schnell"))  # stable for the same profile
    assert a != key(te_align.profile("flux-schnell", t5_max_length=512)) != key(te_align.profile("flux-dev"))
    assert key(None, text_only=True) != key(te_align.profile("flux-schnell"), text_only=True)  # dropout embeds too
    assert key(None) == plain  # uninstalled cleanly


EXTENSION_SCRIPT = r"""
import importlib, json, os, pkgutil, sys
from collections import OrderedDict
from types import SimpleNamespace
root, repo = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, repo]
os.chdir(root)
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
from tests.trainers.ai_toolkit.test_ai_toolkit_checkout import _import_model_package
out = {"package_note": _import_model_package()}
from toolkit.extension import get_all_extensions
try:
    get_all_extensions()  # ai-toolkit's own loader: extensions/ first (te_align), then extensions_built_in/
    out["loader"] = "get_all_extensions"
except Exception as e:  # an extensions_built_in package that does not import here
    out["loader"] = f"extensions/ only ({type(e).__name__})"
    for _, name, _ in pkgutil.iter_modules([os.path.join(root, "extensions")]):
        importlib.import_module(f"extensions.{name}")
import torch
import te_align
import toolkit.train_tools as tt
from jobs.process.BaseProcess import BaseProcess
from te_align.trainers.ai_toolkit import hooks
from te_align.tiny.fit import architecture_overrides
from te_align.tiny.pipelines import build_pipeline_for_encoding
out["wrapped_init"] = hasattr(BaseProcess.__init__, "__te_align_original__")
job = SimpleNamespace(name="job", meta=OrderedDict())
pipe = build_pipeline_for_encoding("flux")
over = architecture_overrides(te_align.profile("flux-schnell"), pipe)
over["t5_max_length"] = 128
BaseProcess(0, job, OrderedDict(model={"arch": "flux", "name_or_path": "black-forest-labs/FLUX.1-schnell"},
                                te_align={"overrides": over}))
hook = hooks.ENCODING.current()
out["profile"] = hook.profile.name
out["targets"] = sorted(r.target.label for r in hook.installed)
prompts = ["a photo of a cat", ""]
with torch.no_grad():
    got = tt.encode_prompts_flux([pipe.tokenizer, pipe.tokenizer_2], [pipe.text_encoder, pipe.text_encoder_2], prompts, max_length=512)
want = te_align.encode(hook.profile, prompts, pipeline=pipe)
out["equal"] = torch.equal(got[0], want["prompt_embeds"]) and torch.equal(got[1], want["pooled_prompt_embeds"])
out["t5_len"] = got[0].shape[1]
try:
    BaseProcess(1, job, OrderedDict(model={"arch": "flux"}, te_align={"t5_max_length": 256}))
except Exception as e:
    out["bad_section"] = f"{type(e).__name__}: {e}"
BaseProcess(2, job, OrderedDict(model={"arch": "flux"}, te_align={"enabled": False}))
out["disabled_uninstalled"] = hooks.ENCODING.current() is None and getattr(tt.encode_prompts_flux, "__te_align_original__", None) is None
print("RESULT " + json.dumps(out))
"""


def test_extension_start_up_from_job_config(tmp_path, aitk):
    """Patch a copy, load its extensions as ai-toolkit does, build a process from a config with a ``te_align:`` section."""
    root = tmp_path / "ai-toolkit"
    shutil.copytree(Path(str(CHECKOUT)), root, ignore=shutil.ignore_patterns(".git", "node_modules", "ui", "*.safetensors"))
    apply(plan_for(detect(root), None))
    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TE_ALIGN"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(EXTENSION_SCRIPT), str(root), str(repo)],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["wrapped_init"] and out["profile"] == "flux-schnell"
    # on stdout (te-align's console handler), or on stderr through the root handler a library's implicit
    # basicConfig() left (torchao 0.10, which ai-toolkit pins, logs at import); either way, visible
    assert "te-align: ai-toolkit encodes prompts by profile 'flux-schnell'" in proc.stdout + proc.stderr
    assert "toolkit.models.base_model.BaseModel.encode_prompt" in out["targets"] and len(out["targets"]) == 13
    assert out["equal"] and out["t5_len"] == 128
    assert "unknown key 't5_max_length'" in out["bad_section"] and "overrides" in out["bad_section"]
    assert out["disabled_uninstalled"]


def test_model_targets_resolve(aitk):
    resolved = AiToolkitHook(profile="chroma", layout="current").check()
    assert len(resolved) == 13  # 6 train_tools + StableDiffusion + BaseModel + 4 get_prompt_embeds + cache key
