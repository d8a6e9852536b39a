"""The shared hook machinery: all-or-nothing install, refusal naming every problem, TE_ALIGN=off."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from typing import ClassVar

import pytest

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
