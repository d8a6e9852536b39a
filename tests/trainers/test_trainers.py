"""The trainer registry (te_align.trainers): one folder per trainer, every list of trainers derived from it, and
shared machinery that names no trainer. No torch, no trainer checkout."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import te_align.trainers as registry
from te_align.trainers import PACKAGES, dialects, specs

ROOT = Path(__file__).resolve().parents[2]
#: The machinery every trainer goes through; it reads trainers from the registry only.
SHARED = ("te_align/audit", "te_align/fixing", "te_align/hooks", "te_align/patching", "te_align/probe", "te_align/cli.py",
          "te_align/commands/check.py", "te_align/commands/patch.py", "te_align/commands/probe.py")
#: Names of te-align's own dependencies that a trainer also goes by (diffusers-examples' alias "diffusers").
LIBRARIES = {"diffusers"}


def trainer_words() -> set[str]:
    words: set[str] = set()
    for s in specs():
        words |= {s.name, s.package, s.display_name, s.repo.split("/")[-1], *s.aliases, *s.source_words}
        words |= {d.name for d in s.check}
    return {w.lower() for w in words} - LIBRARIES


def test_every_folder_is_registered_and_every_spec_is_its_folder():
    folders = sorted(p.name for p in (ROOT / "te_align" / "trainers").iterdir() if (p / "__init__.py").is_file())
    assert sorted(PACKAGES) == folders
    assert [s.package for s in specs()] == list(PACKAGES)
    assert len({s.name for s in specs()}) == len(PACKAGES)
    assert len({d.name for d, _ in dialects()}) == len(dialects())


def test_no_trainer_name_in_the_shared_machinery():
    pattern = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, trainer_words()), key=len, reverse=True))
                         + r")(?![\w])", re.I)
    found = []
    for entry in SHARED:
        path = ROOT / entry
        for f in sorted([path] if path.is_file() else path.rglob("*.py")):
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                for m in pattern.finditer(line):
                    found.append(f"{f.relative_to(ROOT)}:{n}: {m.group(0)!r}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
    assert pattern.search("see kohya_ss and ai-toolkit") and not pattern.search("the diffusers pipeline")


def test_every_part_a_spec_names_exists_with_its_interface():
    for s in specs():
        for d in s.check:
            mod = s.reader(d.name)
            assert callable(mod.parse) and callable(mod.detect) and isinstance(mod.RULES, tuple), (s.name, d.name)
            assert isinstance(mod.CACHES, dict), (s.name, d.name)
        if s.patch:
            mod = s.part("patch")
            assert callable(mod.detect) and callable(mod.plan), s.name
        if s.probe:
            mod = s.part("probe")
            assert callable(mod.find) and isinstance(mod.ADAPTER, type), s.name
        if s.hooks:
            assert s.part("hooks").__name__ == f"te_align.trainers.{s.package}.{s.hooks}"
        if s.names:
            s.part("names")
        for absent in ("names", "hooks", "patch", "probe"):
            if getattr(s, absent) is None:
                with pytest.raises(LookupError):
                    s.part(absent)


def test_every_list_of_trainers_is_derived_from_the_registry():
    from te_align.checking import trainers as check_trainers
    from te_align.commands.check import trainer_choices
    from te_align.parts import available, find_trainers, probe_trainers

    assert check_trainers() == tuple(d.name for s in specs() for d in s.check)
    assert trainer_choices() == ("auto", *check_trainers())
    assert available() == [s.name for s in specs() if s.patch]
    assert probe_trainers() == tuple(s.name for s in specs() if s.probe)
    found, absent = find_trainers({})
    assert len(absent) + len(found) >= len(probe_trainers())


def test_lookup_by_name_alias_package_and_dialect():
    assert registry.get("kohya").name == registry.get("sd-scripts").name == registry.get("kohya-gui").name == "kohya"
    assert registry.get("AI_Toolkit").name == "ai-toolkit"
    assert registry.lookup("nope") is None and registry.lookup("diffusers-examples", "patch") is None


def test_hooks_keep_their_short_names():
    """``te_align.hooks.<package>`` is the trainer's hooks module itself (drop-ins of earlier versions import it)."""
    for s in specs():
        if s.hooks:
            alias = importlib.import_module(f"te_align.hooks.{s.package}")
            assert alias is s.part("hooks")
    import te_align.hooks.kohya.run as run_alias

    import te_align.hooks as hooks
    from te_align.trainers.kohya.hooks import run

    assert run_alias is run and hooks.kohya is registry.get("kohya").part("hooks")  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        importlib.import_module("te_align.hooks.nope")


def test_python_m_short_name_runs_the_trainers_module():
    out = subprocess.run([sys.executable, "-m", "te_align.hooks.simpletuner", "env"], capture_output=True, text=True,
                         cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-1500:]
    assert "export TE_ALIGN_SIMPLETUNER=1" in out.stdout


def test_a_new_trainer_is_one_folder_and_one_line(tmp_path, monkeypatch):
    """A trainer folder added to the package path and one line in PACKAGES: check reads its configs (auto-detected),
    the CLI offers it, patch and probe dispatch to it, and the shared machinery was not touched."""
    folder = tmp_path / "fake_trainer"
    folder.mkdir()
    (folder / "__init__.py").write_text(textwrap.dedent('''
        from te_align.trainers import Dialect, TrainerSpec

        SPEC = TrainerSpec(name="fake", display_name="Fake Trainer", repo="someone/fake",
                           check=(Dialect("fake", "audit", "Fake TOML"),), patch="patch", probe="probe",
                           patch_path="fake checkout", probe_path="a fake checkout", env_dir="TE_ALIGN_FAKE_DIR")
    '''))
    (folder / "audit.py").write_text(textwrap.dedent('''
        from te_align.audit.parsed import Parsed
        from te_align.audit.rules import Rule, Trainer

        RULES = (Rule("t5.tokenizer.max_length", ("flux",), "t5_len", 512, "T5 length", "fake.py:1"),)
        CACHES = {}

        def detect(raw):
            return 100 if isinstance(raw.data, dict) and "fake_model" in raw.data else None

        def parse(raw, extra_args):
            trainer = Trainer("fake", RULES, lambda k, v: f"{k} = {v}", lambda k: f"remove {k}")
            return Parsed(trainer, dict(raw.data), raw.data["fake_model"], "fake_model", False, None, [], ("flux",))
    '''))
    (folder / "patch.py").write_text("def detect(path):\n    return None\n\ndef plan(detection, profile):\n    raise NotImplementedError\n")
    (folder / "probe.py").write_text(textwrap.dedent('''
        from te_align.probe.adapter import Adapter

        class ADAPTER(Adapter):
            pass

        def find(environ):
            return [], ["Fake Trainer: TE_ALIGN_FAKE_DIR is not set"]
    '''))
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "PACKAGES", (*PACKAGES, "fake_trainer"))
    registry.specs.cache_clear()
    try:
        from te_align.checking import check_file
        from te_align.commands.check import trainer_choices
        from te_align.parts import available, find_trainers, probe_trainers

        cfg = tmp_path / "job.toml"
        cfg.write_text('fake_model = "flux-dev"\nt5_len = 256\n')
        r = check_file(str(cfg))
        assert (r.trainer, r.profile, r.exit_code) == ("fake", "flux-dev", 1)
        assert [(f.setting, f.effective, f.profile) for f in r.findings if f.kind == "deviation"] == [
            ("t5.tokenizer.max_length", 256, 512)]
        assert trainer_choices()[-1] == "fake" and available()[-1] == "fake" and probe_trainers()[-1] == "fake"
        assert "Fake Trainer: TE_ALIGN_FAKE_DIR is not set" in find_trainers({})[1]
    finally:
        registry.specs.cache_clear()
        for name in [m for m in sys.modules if m.startswith("te_align.trainers.fake_trainer")]:
            del sys.modules[name]
