"""The shared hook machinery: all-or-nothing install, refusal naming every problem, TE_ALIGN=off."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from typing import ClassVar

import pytest

from te_align.errors import ProfileError
from te_align.hooks import Hook, HookError, Target
from te_align.hooks.base import mark_wrapper

TRAINER = textwrap.dedent('''
    VERSION = "1.2.3"

    def tokenize(text, max_length=77):
        return ["tok", text, max_length]

    class Base:
        def encode(self, tokens, mask=None):
            return ("base", tokens, mask)

    class Child(Base):
        def own(self, x):
            return ("own", x)

        @staticmethod
        def helper(a, b):
            return a + b
''')


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    name = f"fake_trainer_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(TRAINER)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    yield module
    sys.modules.pop(name, None)


def hooked(original):
    """The wrapper factory of every fake target: the original's result, tagged."""
    return mark_wrapper(lambda *a, **k: ("hooked", original(*a, **k)), original)


@dataclass
class FakeHook(Hook):
    module: str = ""
    extra: tuple[Target, ...] = ()
    #: wrapper factory of Child.own (a test swaps it for one that fails)
    own_wrap: object = hooked
    name = "fake"
    supported: ClassVar[dict[str, str]] = {"1.2.3": "1.2.x"}

    def targets(self):
        return (
            Target(self.module, "tokenize", ("text", "max_length"), wrap=hooked),
            Target(self.module, "Child.encode", ("self", "tokens", "mask"), wrap=hooked),
            Target(self.module, "Child.own", ("self", "x"), wrap=self.own_wrap),
            Target(self.module, "Child.helper", ("a", "b"), wrap=hooked),  # a staticmethod: stays one
            *self.extra,
        )

    def detect_version(self):
        return sys.modules[self.module].VERSION


def test_install_wraps_every_target_and_uninstall_restores(trainer):
    hook = FakeHook(module=trainer.__name__)
    base_encode = trainer.Base.__dict__["encode"]
    assert hook.install() is True
    assert trainer.tokenize("a") == ("hooked", ["tok", "a", 77])
    c = trainer.Child()
    assert c.encode([1]) == ("hooked", ("base", [1], None))
    assert c.own(2) == ("hooked", ("own", 2))
    assert trainer.Child.helper(1, 2) == ("hooked", 3) and isinstance(trainer.Child.__dict__["helper"], staticmethod)
    assert trainer.Base().encode([1]) == ("base", [1], None)  # the base class is untouched
    assert hook.install() is True and len(hook.installed) == 4  # idempotent
    hook.uninstall()
    assert trainer.tokenize("a") == ["tok", "a", 77]
    assert "encode" not in trainer.Child.__dict__  # inherited method: the override is removed
    assert trainer.Base.__dict__["encode"] is base_encode
    assert trainer.Child.helper(1, 2) == 3
    hook.uninstall()  # idempotent


def test_missing_and_changed_targets_refuse_and_change_nothing(trainer):
    hook = FakeHook(
        module=trainer.__name__,
        extra=(
            Target(trainer.__name__, "Child.gone", ("self",)),
            Target(trainer.__name__, "tokenize", ("text", "length")),
            Target("no_such_trainer_module", "x"),
        ),
    )
    with pytest.raises(HookError) as exc:
        hook.install()
    msg = str(exc.value)
    assert "trainer version 1.2.3" in msg and "verified with 1.2.x" in msg
    assert f"{trainer.__name__}.Child.gone: not found" in msg
    assert "signature changed: expected (text, length), found (text, max_length)" in msg
    assert "cannot import no_such_trainer_module" in msg
    assert trainer.tokenize("a") == ["tok", "a", 77] and not hook.is_installed


def test_te_align_off_is_a_noop(trainer, monkeypatch):
    monkeypatch.setenv("TE_ALIGN", "off")
    hook = FakeHook(module=trainer.__name__)
    assert hook.install() is False
    assert trainer.tokenize("a") == ["tok", "a", 77]


def test_second_instance_does_not_wrap_a_wrapper(trainer):
    first = FakeHook(module=trainer.__name__)
    first.install()
    second = FakeHook(module=trainer.__name__)
    with pytest.raises(HookError, match="already wrapped"):
        second.install()
    assert trainer.tokenize("a") == ("hooked", ["tok", "a", 77])  # still exactly one layer
    first.uninstall()
    assert trainer.tokenize("a") == ["tok", "a", 77]


def test_failure_half_way_restores_what_was_replaced(trainer):
    def boom(original):
        raise RuntimeError("boom")

    hook = FakeHook(module=trainer.__name__, own_wrap=boom)
    with pytest.raises(RuntimeError, match="boom"):
        hook.install()
    assert trainer.tokenize("a") == ["tok", "a", 77]
    assert "encode" not in trainer.Child.__dict__
    assert not hook.is_installed


def test_a_target_without_a_wrapper_is_refused(trainer):
    @dataclass
    class NoWrap(FakeHook):
        def targets(self):
            return (*super().targets(), Target(self.module, "Base.encode", ("self", "tokens", "mask")))

    hook = NoWrap(module=trainer.__name__)
    with pytest.raises(HookError, match=r"Base\.encode: the target names no wrapper"):
        hook.install()
    assert trainer.tokenize("a") == ["tok", "a", 77] and not hook.is_installed


@pytest.mark.parametrize(("value", "off"), [("off", True), (" OFF ", True), ("0", True), ("False", True), ("no", True),
                                            ("disabled", True), ("on", False), ("1", False), ("", False)])  # fmt: skip
def test_one_off_word_list(monkeypatch, value, off):
    from te_align.hooks import OFF_WORDS, hooks_disabled

    monkeypatch.setenv("TE_ALIGN", value)
    assert hooks_disabled() is off
    assert OFF_WORDS == ("off", "0", "false", "no", "disabled")


# ------------------------------------------------------------------------------------ the one lifecycle
@dataclass
class ProfileHook(Hook):
    """A trainer hook that supplies only a target and its wrapper: the wrapper encodes by the user's profile."""

    module: str = ""
    flavour: str = "a"
    name = "profiled"
    supported: ClassVar[dict[str, str]] = {"1.2.3": "1.2.x"}

    def targets(self):
        def wrap(original):
            return mark_wrapper(lambda text, max_length=77: ("profiled", self.user.profile("sd35-large").slot("t5")
                                                             .tokenizer.max_length, text), original)

        return (Target(self.module, "tokenize", ("text", "max_length"), wrap=wrap),)


def test_lifecycle_reads_the_environment_validates_first_and_is_idempotent(trainer, monkeypatch, caplog):
    import logging

    from te_align.hooks.base import Lifecycle

    life = Lifecycle("Fake", ProfileHook)
    monkeypatch.delenv("TE_ALIGN", raising=False)
    monkeypatch.delenv("TE_ALIGN_PROFILE", raising=False)
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", '{"t5_max_length": 128}')
    with caplog.at_level(logging.INFO, logger="te_align"):
        assert life.install(module=trainer.__name__)
    assert trainer.tokenize("x") == ("profiled", 128, "x")
    assert "te-align: Fake hooks active (1.2.x)" in caplog.text
    assert 'user overrides for Fake: {"t5_max_length": 128} [TE_ALIGN_OVERRIDES]' in caplog.text
    first = trainer.tokenize
    # the same options again: the new settings (explicit overrides win over the environment), nothing re-wrapped
    assert life.install(None, {"t5_max_length": 64}, module=trainer.__name__)
    assert trainer.tokenize is first and trainer.tokenize("y") == ("profiled", 64, "y")
    # other options: uninstall, then install anew
    assert life.install(module=trainer.__name__, flavour="b") and trainer.tokenize is not first
    # a bad environment or a bad override is one line before anything changes
    life.uninstall()
    assert trainer.tokenize("z") == ["tok", "z", 77]
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", "[1]")
    with pytest.raises(HookError, match="TE_ALIGN_OVERRIDES must be a JSON object"):
        life.install(module=trainer.__name__)
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", "{}")
    monkeypatch.setenv("TE_ALIGN_PROFILE", "sd35-large")
    with pytest.raises(ProfileError, match="install\\(\\): key 't5_max_lenght': unknown override"):
        life.install(None, {"t5_max_lenght": 1}, module=trainer.__name__)
    assert not life.is_installed() and trainer.tokenize("z") == ["tok", "z", 77]
    monkeypatch.setenv("TE_ALIGN", "off")
    with caplog.at_level(logging.INFO, logger="te_align"):
        assert life.install(module=trainer.__name__) is False
    assert "te-align: Fake hooks disabled by TE_ALIGN=off; Fake runs unmodified" in caplog.text


def test_every_trainer_hook_takes_its_settings_from_the_one_lifecycle():
    """Each trainer's hooks module has a Lifecycle and reads TE_ALIGN_PROFILE / TE_ALIGN_OVERRIDES only through it."""
    import inspect
    import re

    from te_align.hooks.base import Lifecycle
    from te_align.trainers import specs

    for spec in specs():
        if not spec.hooks:
            continue
        module = spec.part("hooks")
        assert any(isinstance(v, Lifecycle) for v in vars(module).values()), spec.name
        source = inspect.getsource(module)
        assert not re.search(r"environ(?:\.get)?\(?\[?\s*(?:ENV_OVERRIDES|\"TE_ALIGN_OVERRIDES\")", source), spec.name
        assert "env_overrides(" not in source, spec.name


def test_simpletuner_hook_reads_te_align_overrides(monkeypatch):
    """SimpleTuner's hook picks each model's profile from its config and applies TE_ALIGN_OVERRIDES, like the others."""
    from types import SimpleNamespace

    from te_align.hooks.base import settings
    from te_align.trainers.simpletuner.hooks import SimpleTunerHook

    monkeypatch.delenv("TE_ALIGN_PROFILE", raising=False)
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", '{"t5_max_length": 154}')
    model = SimpleNamespace(config=SimpleNamespace(model_family="sd3", model_flavour="large",
                                                   pretrained_model_name_or_path="stabilityai/stable-diffusion-3.5-large"))
    p = SimpleTunerHook().profile_for(model, "sd3")
    assert (p.name, p.slot("t5").tokenizer.max_length) == ("sd35-large", 154)
    assert p.provenance_of("slots.t5.tokenizer.max_length").status == "override"
    hook = SimpleTunerHook()
    hook.configure(settings(None, {"t5_max_length": 77}))  # install(**overrides) over the environment
    assert hook.profile_for(model, "sd3").slot("t5").tokenizer.max_length == 77
    assert SimpleTunerHook(profile="sd3-medium").profile_for(model, "sd3").slot("t5").tokenizer.max_length == 154


def test_console_lines_reach_a_root_handler_a_library_left_at_warning():
    """A library's ``logging.debug()`` at import (torchao 0.10, which ai-toolkit pins) runs an implicit
    ``basicConfig()``: a stderr root handler at WARNING. te-align's INFO lines then go through that handler
    (they were dropped); a level the process set for ``te_align`` is left as it is."""
    import os
    import subprocess
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    code = ("import logging; logging.debug('a library at import'); from te_align.hooks.base import log_to_console, "
            "logger; log_to_console(); log_to_console(); logger.info('te-align: one line')")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert (proc.stdout, proc.stderr) == ("", "INFO:te_align:te-align: one line\n")
    kept = code.replace("log_to_console(); log_to_console();", "logger.setLevel(logging.WARNING); log_to_console();")
    proc = subprocess.run([sys.executable, "-c", kept], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert (proc.stdout, proc.stderr) == ("", "")
