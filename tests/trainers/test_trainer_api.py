"""The trainer contract (te_align/trainers/api.py): a spec is validated when it registers, a part is checked
against its Protocol when it loads, the engine never imports trainers/, and a new trainer is one folder plus
one
registry line. No torch, no trainer checkout."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import te_align.trainers as registry
from te_align.trainers.api import (
    Dialect,
    Registry,
    RegistryError,
    TrainerSpec,
    TrainerSpecError,
    find_checkout,
    target_mismatch,
)
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _metrics():
    return load_script("tools/shape_metrics.py")


def test_registration_refuses_duplicate_names_and_aliases():
    a = TrainerSpec(name="alpha", display_name="Alpha", repo="someone/alpha", aliases=("al",), package="alpha")
    b = TrainerSpec(name="beta", display_name="Beta", repo="someone/beta", aliases=("AL",),
                    check=(Dialect("alpha", "audit", "Beta TOML"),), package="kohya")  # a reader that exists
    with pytest.raises(RegistryError) as e:
        Registry([a, b])
    assert str(e.value) == "cannot register the trainers: kohya: the name 'al' is already alpha's; " \
                           "kohya: the name 'alpha' is already alpha's"


def test_registration_refuses_mistyped_fields_and_missing_parts():
    bad = TrainerSpec(name="gamma", display_name="", repo="someone/gamma", aliases=["g"],  # type: ignore[arg-type]
                      patch="nope", env_dir="te_align_gamma", package="kohya")
    with pytest.raises(RegistryError) as e:
        Registry([bad])
    assert str(e.value) == (
        "cannot register the trainers: kohya: display_name must be a non-empty string; "
        "kohya: aliases must be a tuple, not list; "
        "kohya: patch names te_align.trainers.kohya.nope, which does not exist; "
        "kohya: env_dir must be an environment variable name, not 'te_align_gamma'")


def test_the_shipped_registry_is_valid_and_in_package_order():
    reg = registry.registry()
    assert isinstance(reg, Registry)
    assert reg.names() == ("kohya", "ai-toolkit", "simpletuner", "onetrainer", "diffusers-examples", "musubi",
                           "diffusion-pipe")
    assert reg.hooks_module("kohya") == "te_align.trainers.kohya.hooks"
    assert reg.hooks_module("diffusers_examples") is None
    kohya = reg.get("kohya-gui")
    gui = kohya.check[1]
    assert (kohya.dialect_env(gui), kohya.dialect_repo(gui)) == ("TE_ALIGN_KOHYA_GUI_DIR", "bmaltais/kohya_ss")
    assert (kohya.dialect_env(kohya.check[0]), kohya.dialect_repo(kohya.check[0])) == (
        "TE_ALIGN_KOHYA_DIR", "kohya-ss/sd-scripts")


def test_shared_pieces_say_what_every_trainer_said():
    spec = registry.get("musubi")
    assert find_checkout({}, spec, tuple) == (
        [], ["musubi-tuner: TE_ALIGN_MUSUBI_DIR is not set (path of a kohya-ss/musubi-tuner checkout)"])
    assert find_checkout({"TE_ALIGN_MUSUBI_DIR": "/x/musubi"}, spec, lambda *a: a) == (
        [("musubi", "/x/musubi", "TE_ALIGN_MUSUBI_DIR=/x/musubi")], [])
    assert find_checkout({"TE_ALIGN_MUSUBI_DIR": ""}, spec, tuple)[0] == []
    assert target_mismatch("OneTrainer", "abc1234", "/t", ["a.b: missing", "c.d: changed"], ["0123456789ab"],
                           how="check that commit out (git -C /t checkout 0123456)") == (
        "unknown OneTrainer version abc1234 at /t: te-align's hook targets do not match (a.b: missing; c.d: changed)."
        " te-align was verified with OneTrainer 0123456; check that commit out (git -C /t checkout 0123456) or "
        "upgrade te-align")


def test_the_engine_never_imports_trainers_and_no_subpackages_loop():
    shape = _metrics().measure(ROOT)
    assert shape["_arrows"] == []
    assert shape["_loops"] == []


@pytest.fixture
def new_trainer(tmp_path, monkeypatch):
    """A throwaway trainer: one folder (on the registry's package path) and one line in PACKAGES, nothing else."""
    folder = tmp_path / "toy_trainer"
    folder.mkdir()

    def write(name: str, text: str) -> None:
        (folder / name).write_text(textwrap.dedent(text), encoding="utf-8")

    write("__init__.py", '''
        from te_align.trainers.api import Dialect, TrainerSpec

        SPEC = TrainerSpec(name="toy", display_name="Toy Trainer", repo="someone/toy", aliases=("toy-trainer",),
                           check=(Dialect("toy", "audit", "Toy TOML"),), patch="patch", probe="probe",
                           env_dir="TE_ALIGN_TOY_DIR")
    ''')
    write("audit.py", '''
        from te_align.audit.parsed import Parsed
        from te_align.audit.rules import Rule, Trainer

        RULES = (Rule("clip_l.tokenizer.max_length", ("sd1",), "toy_len", 77, "CLIP length", "toy.py:1"),)
        CACHES = {}

        def detect(raw):
            return 100 if isinstance(raw.data, dict) and "toy_model" in raw.data else None

        def parse(raw, extra_args):
            trainer = Trainer("toy", RULES, lambda k, v: f"{k} = {v}", lambda k: f"remove {k}")
            return Parsed(trainer, dict(raw.data), raw.data["toy_model"], "toy_model", False, None, [], ("sd1",))
    ''')
    write("patch.py", '''
        def detect(path):
            return None

        def plan(detection, profile):
            raise NotImplementedError
    ''')
    write("probe.py", '''
        from te_align.probe.adapter import Adapter
        from te_align.probe.matrix import Found
        from te_align.trainers.api import find_checkout
        from te_align.trainers.toy_trainer import SPEC

        ADAPTER = Adapter

        def find(environ):
            return find_checkout(environ, SPEC, Found)
    ''')
    write("broken.py", "def detect(path):\n    return None\n")
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "PACKAGES", (*registry.PACKAGES, "toy_trainer"))
    registry.specs.cache_clear()
    yield folder
    registry.specs.cache_clear()
    for name in [m for m in sys.modules if m.startswith("te_align.trainers.toy_trainer")]:
        del sys.modules[name]


def test_a_new_trainer_is_one_folder_and_one_registry_line(new_trainer, tmp_path):
    pytest.importorskip("torch", reason="the new trainer's probe part runs on tiny models (the encode extra)")
    from te_align.checking import check_file
    from te_align.commands.check import trainer_choices
    from te_align.parts import available, find_trainers, probe_trainers
    from te_align.probe.matrix import Found

    assert sorted(p.name for p in new_trainer.iterdir() if p.suffix == ".py") == [
        "__init__.py", "audit.py", "broken.py", "patch.py", "probe.py"]
    assert registry.get("toy-trainer").package == "toy_trainer"
    cfg = tmp_path / "job.toml"
    cfg.write_text('toy_model = "sd15"\ntoy_len = 225\n', encoding="utf-8")
    r = check_file(str(cfg))
    assert (r.trainer, r.profile, r.exit_code) == ("toy", "sd15", 1)
    assert [(f.setting, f.effective, f.profile) for f in r.findings if f.kind == "deviation"] == [
        ("clip_l.tokenizer.max_length", 225, 77)]
    assert trainer_choices()[-1] == "toy" and available()[-1] == "toy" and probe_trainers()[-1] == "toy"
    assert "Toy Trainer: TE_ALIGN_TOY_DIR is not set (path of a someone/toy checkout)" in find_trainers({})[1]
    assert Found("toy", "/t", "TE_ALIGN_TOY_DIR=/t") in find_trainers({"TE_ALIGN_TOY_DIR": "/t"})[0]


def test_a_part_without_what_its_protocol_asks_is_one_error(new_trainer):
    spec = registry.get("toy")
    broken = TrainerSpec(name="toy", display_name="Toy Trainer", repo="someone/toy", patch="broken",
                         package="toy_trainer")
    with pytest.raises(TrainerSpecError) as e:
        broken.part("patch")
    assert str(e.value) == "trainer toy: its patch part te_align.trainers.toy_trainer.broken has no plan"
    assert spec.part("patch").__name__ == "te_align.trainers.toy_trainer.patch"
    with pytest.raises(LookupError):
        spec.part("hooks")


def test_the_lint_engine_imports_no_writer():
    """audit/ is the read-only lint engine: writing a fix lives in te_align/fixing/ (on the locks of
    te_align/patching/), neither of which it imports, at module level, in a function or through lazy_module."""
    import ast

    found = []
    for f in sorted((ROOT / "te_align" / "audit").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_module" and node.args:
                names = [getattr(node.args[0], "value", "")]
            else:
                continue
            found += [f"{f.name}: {n}" for n in names if n.startswith(("te_align.fixing", "te_align.patching"))]
    assert found == []
    assert not (ROOT / "te_align" / "audit" / "fix.py").exists() and not (ROOT / "te_align" / "audit" / "editing.py").exists()


def test_the_check_engine_uses_the_parts_it_is_handed(tmp_path):
    """audit.check_file reads no registry: a reader no trainer registers checks a config when it is handed one."""
    import types

    from te_align.audit import check_file
    from te_align.audit.parsed import Parsed
    from te_align.audit.readers import RawConfig
    from te_align.audit.rules import Rule, Trainer
    from te_align.trainers.api import CheckParts

    rules = (Rule("clip_l.tokenizer.max_length", ("sd1",), "len", 77, "CLIP length", "unregistered.py:1"),)
    reader = types.SimpleNamespace(
        RULES=rules, CACHES={}, detect=lambda raw: 1,
        parse=lambda raw, extra: Parsed(Trainer("unregistered", rules, lambda k, v: f"{k} = {v}", lambda k: k),
                                        dict(raw.data), "sd15", "model", False, None, [], ("sd1",)))
    parts = CheckParts(name="unregistered", reader=reader, command_line=False, package="nowhere", line_readers=(),
                       source_words=(), spec=registry.get("kohya"))
    raw = RawConfig(str(tmp_path / "job.toml"), "toml", "len = 225\n", {"len": 225})
    r = check_file(raw, parts)
    assert (r.trainer, r.profile, r.exit_code, r.file) == ("unregistered", "sd15", 1, str(tmp_path / "job.toml"))
    assert [(f.setting, f.effective, f.profile) for f in r.findings if f.kind == "deviation"] == [
        ("clip_l.tokenizer.max_length", 225, 77)]
    assert check_file(raw, parts, label="x:3").file == "x:3"


def test_a_hooks_part_is_the_module_hooks():
    """``te_align.hooks.<package>`` is ``te_align.trainers.<package>.hooks`` by name: a spec naming another
    module for its hooks is refused when it registers."""
    odd = TrainerSpec(name="delta", display_name="Delta", repo="someone/delta", hooks="audit", package="kohya")
    with pytest.raises(RegistryError) as e:
        Registry([odd])
    assert str(e.value) == ("cannot register the trainers: kohya: hooks must be the module 'hooks' "
                            "(te_align.hooks.kohya is it), not 'audit'")


def test_a_part_is_checked_against_its_protocol_tables_too(new_trainer):
    """What a part lacks comes from its Protocol: a missing member, a method that is not callable, a table of
    another type."""
    (new_trainer / "odd.py").write_text("RULES = []\nCACHES = {}\ndetect = 1\n", encoding="utf-8")
    (new_trainer / "odd_probe.py").write_text("ADAPTER = 1\n", encoding="utf-8")
    spec = TrainerSpec(name="toy", display_name="Toy Trainer", repo="someone/toy", probe="odd_probe",
                       check=(Dialect("toy", "odd", "Toy TOML"),), package="toy_trainer")
    with pytest.raises(TrainerSpecError) as e:
        spec.reader("toy")
    assert str(e.value) == "trainer toy: its check part te_align.trainers.toy_trainer.odd has no RULES as a tuple, " \
                           "detect, parse"
    with pytest.raises(TrainerSpecError) as e:
        spec.part("probe")
    assert str(e.value) == ("trainer toy: its probe part te_align.trainers.toy_trainer.odd_probe has no ADAPTER as "
                            "a class, find")
