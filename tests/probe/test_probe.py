"""``te-align probe`` / ``te-align matrix``: measured divergence of real trainer code from the profile.

ai-toolkit runs from the installed PyPI packaging ``ostris-ai-toolkit`` 0.2.7 (CI installs it with
--no-deps); sd-scripts from a checkout in ``TE_ALIGN_KOHYA_DIR`` (skipped otherwise). Expectations are
the measured ones (research trainers.md §2.2/§3 for ai-toolkit; kohya.md for sd-scripts).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from te_align.errors import TeAlignError
from te_align.parts import find_trainers, probe, run_matrix
from te_align.probe import ProbeError
from te_align.probe.matrix import Found

HAVE_AT = importlib.util.find_spec("ostris_ai_toolkit") is not None
needs_at = pytest.mark.skipif(not HAVE_AT, reason="ostris-ai-toolkit 0.2.7 is not installed (pip install --no-deps ostris-ai-toolkit==0.2.7)")
KOHYA_DIR = os.environ.get("TE_ALIGN_KOHYA_DIR")
needs_kohya = pytest.mark.kohya  # skipped with one reason (tests/conftest.py) without the checkout or its dependencies


def _t(result, name):
    return next(t for t in result.tensors if t.name == name)


@pytest.fixture(scope="module")
def schnell():
    return probe("ai-toolkit", "flux-schnell")


@needs_at
def test_ai_toolkit_flux_schnell_t5_at_512_is_a_shape_mismatch(schnell):
    emb = _t(schnell, "prompt_embeds")
    assert emb.trainer_shape == (512, 96) and emb.profile_shape == (256, 96) and not emb.shape_match
    assert len(emb.differing) == emb.compared == len(schnell.prompts) == 15
    assert emb.max_abs_diff > 0 and 0.5 < emb.mean_cosine < 1.0  # measured on the overlapping 256 tokens
    assert _t(schnell, "pooled_prompt_embeds").identical  # CLIP side is the same
    assert _t(schnell, "text_ids").trainer_shape is None  # made in the transformer call, not by the encoder
    assert not schnell.aligned and "shape (512, 96) vs profile (256, 96)" in schnell.summary()
    assert any("max_length=512" in n and "stable_diffusion_model.py:" in n for n in schnell.notes)


@needs_at
def test_ai_toolkit_with_hooks_equals_profile():
    hooked = probe("ai-toolkit", "flux-schnell", hooks=True)
    assert hooked.aligned and _t(hooked, "prompt_embeds").trainer_shape == (256, 96)


@needs_at
@pytest.mark.parametrize("name", ["sdxl", "sd35-large"])
def test_ai_toolkit_sdxl_and_sd3_encode_like_the_profile_without_dropout(name):
    # §2.2/§3: SDXL = diffusers; SD3 calls the pipeline's own _get_*_prompt_embeds (T5 256 from diffusers'
    # default). Their documented gap is prompt_dropout_prob (ignored for SD3), which the suite does not use.
    r = probe("ai-toolkit", name)
    assert r.aligned and {t.name for t in r.tensors} == {"prompt_embeds", "pooled_prompt_embeds"}


@needs_at
@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("bs4", "ftfy")),
                    reason="PixArt caption cleaning needs beautifulsoup4 and ftfy (pip install \"te-align[encode]\")")
def test_ai_toolkit_pixart_skips_caption_cleaning():
    r = probe("ai-toolkit", "pixart-sigma")
    emb = _t(r, "prompt_embeds")
    assert emb.shape_match and emb.differing == ["weight syntax", "mixed batch[4]"]  # diffusers clean_caption=True


@needs_at
def test_probe_leaves_the_interpreter_as_it_found_it():
    # judged against the modules present before the probe (other test modules, e.g. the kohya
    # integration tests, may have put their own stand-ins in place for the whole session)
    before = dict(sys.modules)
    had_tv = "torchvision" in before
    probe("ai-toolkit", "flux-schnell")
    added = {n: m for n, m in sys.modules.items() if n not in before}
    assert HAVE_TV or had_tv or ("torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None)
    assert not any(n == "library" or n.startswith("library.") for n in added)
    assert not any(type(m).__name__ == "_StubModule" for m in added.values())


HAVE_TV = importlib.util.find_spec("torchvision") is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainer", "foo", "--profile", "sdxl"], "unknown trainer 'foo'; known: kohya, ai-toolkit, simpletuner"),
        (["--trainer", "kohya", "--path", "{tmp}", "--profile", "sdxl"], "is not a kohya-ss/sd-scripts checkout"),
        (["--trainer", "ai-toolkit", "--path", "{tmp}", "--profile", "sdxl"], "is not an ai-toolkit installation"),
        pytest.param(["--trainer", "ai-toolkit", "--profile", "no-such-model"], "no-such-model", marks=needs_at),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message, tmp_path, capsys):
    from te_align.cli import main

    code = main(["probe", *[a.replace("{tmp}", str(tmp_path)) for a in args]])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and message in err and err.startswith("te-align: error:")


def test_kohya_checkout_whose_requirements_are_missing_names_the_install(tmp_path, capsys):
    """sd-scripts imports einops and imagesize, which a new user's te-align environment may lack: the one line says
    which module is missing and how to add sd-scripts' requirements (it named the module only)."""
    from te_align.cli import main

    pytest.importorskip("diffusers")
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "library" / "strategy_base.py").write_text("", encoding="utf-8")
    (tmp_path / "library" / "strategy_sd.py").write_text("import te_align_no_such_module_einops\n", encoding="utf-8")
    code = main(["probe", "--trainer", "kohya", "--path", str(tmp_path), "--profile", "sd15"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"te-align: error: kohya: cannot import library.strategy_sd from {tmp_path.resolve()} (ModuleNotFoundError: No "
        "module named 'te_align_no_such_module_einops'); sd-scripts' own requirements are missing in this Python: pip "
        'install "te-align[kohya-test]" (einops, imagesize) or sd-scripts\' requirements.txt\n')


def test_matrix_with_nothing_to_probe_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """`te-align matrix` where no trainer found here probes the profiles asked for printed an empty table (exit 0,
    and --out written with it); it says why in one line, exit 2, and writes nothing."""
    from te_align.cli import main
    from te_align.parts import find_trainers
    from te_align.trainers import specs

    for s in specs():
        if s.env_dir:
            monkeypatch.delenv(s.env_dir, raising=False)
    found = sorted({f.trainer for f in find_trainers()[0]})  # ai-toolkit where its package is installed
    out = tmp_path / "matrix.md"
    assert main(["matrix", "--profile", "wan21", "--out", str(out)]) == 2
    why = (f"no trainer found here ({', '.join(found)}) probes it" if found else
           "no trainer found here; set TE_ALIGN_KOHYA_DIR, TE_ALIGN_AI_TOOLKIT_DIR, TE_ALIGN_SIMPLETUNER_DIR, "
           "TE_ALIGN_ONETRAINER_DIR, TE_ALIGN_DIFFUSERS_EXAMPLES_DIR, TE_ALIGN_MUSUBI_DIR, TE_ALIGN_DIFFUSION_PIPE_DIR "
           "to a checkout, or install a trainer's package")
    assert capsys.readouterr() == ("", f"te-align: error: nothing to probe for wan21: {why} (te-align matrix --help)\n")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@needs_at
def test_unsupported_profile_names_the_probed_ones(monkeypatch):
    with pytest.raises(TeAlignError, match=r"ai-toolkit 0\.2\.7 has no encoding path .* 'chroma'; probed profiles: sd15"):
        probe("ai-toolkit", "chroma")
    monkeypatch.delenv("TE_ALIGN_KOHYA_DIR", raising=False)
    with pytest.raises(ProbeError, match=r"give --path to a kohya-ss/sd-scripts checkout \(or set TE_ALIGN_KOHYA_DIR\)"):
        probe("kohya", "sdxl", None)


@needs_at
def test_cli_probe_report_and_exit_code(capsys):
    from te_align.cli import main

    code = main(["probe", "--trainer", "ai-toolkit", "--profile", "flux-schnell"])
    out = capsys.readouterr().out
    assert code == 1 and "result: DIFFERS from the profile" in out
    assert "prompt_embeds         (512, 96)      (256, 96)" in out and "15/15" in out


@needs_at
def test_matrix_writes_measured_table_and_reports_unavailable_hooks(tmp_path, monkeypatch):
    out = tmp_path / "matrix.md"
    at = [Found("ai-toolkit", None, "installed ostris-ai-toolkit package")]
    m = run_matrix(trainers=at, profiles=["flux-schnell"], out=out)
    text = out.read_text()
    row = next(line for line in text.splitlines() if "| flux-schnell |" in line)
    assert row.startswith("| ai-toolkit 0.2.7 (PyPI) | flux-schnell | **differs** — prompt_embeds: shape (512, 96) vs profile (256, 96)")
    assert row.endswith("| identical — prompt_embeds, pooled_prompt_embeds (not produced by the trainer: text_ids) |")
    assert "max\\|Δ\\|" in row and m.rows[0].hooked.result.aligned
    monkeypatch.setenv("TE_ALIGN", "off")
    off = run_matrix(trainers=at, profiles=["sdxl"])
    assert off.rows[0].plain.result.aligned and off.rows[0].hooked.unavailable == "hooks unavailable: disabled by TE_ALIGN=off"
    assert "| sdxl | identical — prompt_embeds, pooled_prompt_embeds | hooks unavailable: disabled by TE_ALIGN=off |" in off.markdown()


def test_find_trainers_says_what_is_missing():
    found, absent = find_trainers({})
    assert any(line.startswith("kohya sd-scripts: TE_ALIGN_KOHYA_DIR is not set") for line in absent)
    if importlib.util.find_spec("simpletuner") is None:
        assert any(line.startswith("SimpleTuner: not installed and TE_ALIGN_SIMPLETUNER_DIR is not set") for line in absent)
    assert [f.trainer for f in found] == (["ai-toolkit"] if HAVE_AT else [])
    found, _ = find_trainers({"TE_ALIGN_KOHYA_DIR": "/x"})
    assert found[0] == Found("kohya", "/x", "TE_ALIGN_KOHYA_DIR=/x")


def test_help_does_not_import_torch():
    code = "import sys; from te_align.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------ sd-scripts checkout
@needs_kohya
def test_kohya_sdxl_and_sd3_differ_only_on_clip_g_exclamation_marks():
    for name in ("sdxl", "sd35-large"):
        r = probe("kohya", name, KOHYA_DIR)
        for t in r.tensors:
            assert t.shape_match and all("!" in r.prompts[label] for label in t.differing) and t.differing, (name, t)
        assert probe("kohya", name, KOHYA_DIR, hooks=True).aligned


@needs_kohya
@pytest.mark.parametrize("name", ["sd15", "flux-dev", "flux-schnell"])
def test_kohya_identical_families(name):
    # sd-scripts picks T5 256 for schnell and 512 for dev itself (flux_train_network.get_tokenize_strategy)
    assert probe("kohya", name, KOHYA_DIR).aligned


@needs_kohya
def test_kohya_chroma_is_identical():
    # flux_train_network.py --model_type chroma: T5 512 with --apply_t5_attn_mask (required), DummyCLIPL; the
    # transformer's text length (mask sum + attn_padding 1) equals the profile's mask
    r = probe("kohya", "chroma", KOHYA_DIR)
    assert r.aligned and {t.name for t in r.tensors} == {"prompt_embeds", "prompt_attention_mask", "text_ids"}


@needs_kohya
def test_kohya_lumina2_has_no_system_prompt_by_default():
    r = probe("kohya", "lumina2", KOHYA_DIR)
    emb = _t(r, "prompt_embeds")
    assert emb.shape_match and emb.trainer_shape == (256, 32) and len(emb.differing) == emb.compared == len(r.prompts)
    assert any("--system_prompt ''" in n for n in r.notes)
    assert probe("kohya", "lumina2", KOHYA_DIR, hooks=True).aligned


# ------------------------------------------------------------------------------ ai-toolkit model modules
AT_DIR = os.environ.get("TE_ALIGN_AI_TOOLKIT_DIR")
MODEL_PROFILES = ("lumina2", "chroma", "hidream", "qwen-image", "wan21")


def _fake_checkout(root: Path, absent: str = "te_align_absent_media_stack") -> Path:
    """A checkout whose model modules need a package that is not installed (the CI situation, by construction)."""
    (root / "toolkit").mkdir(parents=True)
    (root / "toolkit" / "__init__.py").write_text("")
    (root / "toolkit" / "train_tools.py").write_text("")
    (root / "toolkit" / "stable_diffusion_model.py").write_text("")
    (root / "version.py").write_text('VERSION = "0.0.1"\n')
    pkg = root / "extensions_built_in" / "diffusion_models" / "chroma"
    pkg.mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "chroma_model.py").write_text(f"import {absent}\n")
    return root


AT_PACKAGES = ("toolkit", "extensions_built_in", "te_align_absent_media_stack")


def _at_modules() -> dict[str, Any]:
    return {n: m for n, m in sys.modules.items() if n.split(".")[0] in AT_PACKAGES}


def test_model_cells_say_not_importable_here(tmp_path):
    at = [Found("ai-toolkit", str(_fake_checkout(tmp_path / "ai-toolkit")), "fake checkout")]
    before = _at_modules()  # another ai-toolkit may be imported already (tests/trainers/ai_toolkit/test_ai_toolkit_checkout.py)
    m = run_matrix(trainers=at, profiles=list(MODEL_PROFILES))
    want = "not importable here: ModuleNotFoundError: No module named 'te_align_absent_media_stack'"
    assert [r.profile for r in m.rows] == list(MODEL_PROFILES)
    assert all(r.plain.text() == r.hooked.text() == want for r in m.rows)
    assert f"| ai-toolkit 0.0.1 | chroma | {want} | {want} |" in m.markdown()
    with pytest.raises(ProbeError, match=r"ChromaModel\.encode_prompt \(profile chroma\) is not importable here"):
        probe("ai-toolkit", "chroma", at[0].path)
    assert _at_modules() == before  # the probe leaves no module of the checkout behind


@pytest.fixture
def other_checkout_imported(tmp_path):
    """ai-toolkit packages of another checkout imported by hand (its sys.path entry gone again); undone after."""
    saved_modules, saved_path = dict(sys.modules), list(sys.path)
    for name in _at_modules():  # a copy imported earlier in this process (tests/trainers/ai_toolkit/test_ai_toolkit_checkout.py)
        del sys.modules[name]
    other = _fake_checkout(tmp_path / "other" / "ai-toolkit", absent="te_align_absent_other_stack")
    sys.path.insert(0, str(other))
    try:
        yield {n: importlib.import_module(n) for n in ("toolkit.train_tools", "extensions_built_in.diffusion_models")}
    finally:
        sys.path[:] = saved_path
        for name in [n for n in sys.modules if n not in saved_modules]:
            del sys.modules[name]
        sys.modules.update(saved_modules)


def test_probe_imports_the_given_checkout_over_another_copy(tmp_path, other_checkout_imported):
    # a user probing two checkouts in one process (or with ai-toolkit imported): the cells are the given checkout's
    at = [Found("ai-toolkit", str(_fake_checkout(tmp_path / "ai-toolkit")), "fake checkout")]
    before = _at_modules()
    m = run_matrix(trainers=at, profiles=["chroma"])
    assert m.rows[0].plain.text() == "not importable here: ModuleNotFoundError: No module named 'te_align_absent_media_stack'"
    assert _at_modules() == before and all(sys.modules[n] is mod for n, mod in other_checkout_imported.items())


def _models_import() -> bool:
    return bool(AT_DIR) and all(importlib.util.find_spec(n) is not None for n in ("torchvision", "torchaudio", "cv2"))


@pytest.mark.skipif(not AT_DIR or _models_import(), reason="needs TE_ALIGN_AI_TOOLKIT_DIR in an environment without ai-toolkit's media stack")
def test_real_checkout_model_cells_not_importable_in_main_env():
    m = run_matrix(trainers=[Found("ai-toolkit", AT_DIR, "env")], profiles=["sd15", *MODEL_PROFILES])
    rows = {r.profile: r for r in m.rows}
    for name in MODEL_PROFILES:
        assert rows[name].plain.text().startswith("not importable here: ModuleNotFoundError: No module named "), name
    assert rows["sd15"].plain.result.aligned  # legacy families fall back to the replayed train_tools call
    assert any("StableDiffusion.encode_prompt is not importable here" in n for n in rows["sd15"].plain.result.notes)


@pytest.mark.skipif(not _models_import(), reason="ai-toolkit's model modules need TE_ALIGN_AI_TOOLKIT_DIR plus torchvision, torchaudio and cv2 (see tests/trainers/ai_toolkit/test_ai_toolkit_checkout.py)")
def test_real_base_model_and_legacy_probe():
    m = run_matrix(trainers=[Found("ai-toolkit", AT_DIR, "env")], profiles=["flux-schnell", *MODEL_PROFILES])
    rows = {r.profile: r for r in m.rows}
    if any(r.plain.unavailable for r in m.rows):
        pytest.skip(f"model modules do not import: {m.rows[0].plain.unavailable}")
    for name in ("lumina2", "hidream", "wan21"):
        assert rows[name].plain.result.aligned and rows[name].hooked.result.aligned, name
    chroma = rows["chroma"].plain.result
    assert not _t(chroma, "prompt_embeds").identical and _t(chroma, "prompt_attention_mask").identical  # T5 run unmasked
    qwen = _t(rows["qwen-image"].plain.result, "prompt_embeds")
    assert not qwen.shape_match and qwen.trainer_shape[0] > 512  # max_sequence_length 1024, profile 512
    for name in ("chroma", "qwen-image", "flux-schnell"):
        assert rows[name].hooked.result.aligned, name
    assert _t(rows["flux-schnell"].plain.result, "prompt_embeds").trainer_shape == (512, 96)
    assert any("StableDiffusion.encode_prompt(prompts)" in n for n in rows["flux-schnell"].plain.result.notes)


def test_a_stand_in_another_tool_left_is_set_aside_for_the_trainer(tmp_path):
    """te-align's ComfyUI import leaves torchvision as a stand-in whose attributes fail on use (a function, not a
    submodule); a trainer probed later in the same process gets the probe's own stand-ins, and the other tool's is put
    back afterwards."""
    from te_align.integrations.comfyui import tiny
    from te_align.probe import _stubs

    name = "te_align_absent_vision"
    root = tmp_path / "trainer"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "__init__.py").write_text("")
    (root / "lib" / "images.py").write_text(f"from {name} import transforms\nT = transforms.Compose([])\n")
    tiny._stand_in(name, ("transforms",))
    left = {n: m for n, m in sys.modules.items() if n.split(".")[0] == name}
    try:
        assert sorted(left) == [name, f"{name}.transforms"] and not _stubs._installed(name)
        with pytest.raises(AttributeError, match="'function' object has no attribute 'Compose'"):
            exec(f"from {name} import transforms\ntransforms.Compose([])", {})  # what sd-scripts met before
        with _stubs.sandbox([root], [str(root)]), _stubs.stub_missing([name], [root]) as finder:
            images = importlib.import_module("lib.images")
            assert finder.used == {name} and type(images.T).__name__ == "Compose"
        assert {n: m for n, m in sys.modules.items() if n.split(".")[0] == name} == left
        assert "lib.images" not in sys.modules
    finally:
        for n in left:
            sys.modules.pop(n, None)
        tiny.STAND_INS.pop(name, None)
