"""The probe: a trainer's real encoding code vs :func:`te_align.encode`, on the same tiny models.

Both sides get the same tokenizers and random-weight encoders (:mod:`te_align.tiny`), the
profile is fitted to their sizes (behaviour fields untouched), and every prompt group of the standard
suite is encoded as one batch by each side. Per output tensor the result holds the per-prompt shapes
on both sides, the max abs difference and the mean cosine similarity (over the overlapping region
when the shapes differ) and which prompts differ at all. Nothing is estimated: a cell says
"identical" only when ``torch.equal`` holds for every prompt.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from te_align.encoding import encode as _encode
from te_align.encoding.text import render
from te_align.probe.errors import ProbeError
from te_align.profiles.expr import output_specs

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.

_LONG_WORDS = " ".join(f"word{i} cat, dog!" for i in range(400))


# ------------------------------------------------------------------------------ prompt suite
def _at_limit(slot: Any, tokenizer: Any) -> str:
    """A prompt whose rendered text has exactly the slot's max_length tokens (special tokens included).

    For a slot that encodes only part of the prompt (``text_transform``, e.g. HunyuanImage's quoted
    glyph text) the words are put in quotes, so that part is what reaches the limit.
    """
    from te_align.encoding.core import tokenize_length

    target = tokenize_length(slot, tokenizer)
    quoted = slot.tokenizer.text_transform != "none"

    def prompt(words: list[str]) -> str:
        body = " ".join(words)
        return f'a sign that says "{body}"' if quoted else body

    def count(words: list[str]) -> int:
        text = render(slot.tokenizer, prompt(words))
        return len(tokenizer(text, add_special_tokens=slot.tokenizer.add_special_tokens)["input_ids"])

    words: list[str] = []
    while count(words) < target:
        for w in ("cat", "a", "x", ",", "."):
            if count([*words, w]) <= target:
                words.append(w)
                break
        else:
            break
    # one short (byte-level tokenizers, where every word adds an even count): lengthen the last word
    while words and count(words) < target and count([*words[:-1], words[-1] + "x"]) <= target:
        words[-1] += "x"
    return prompt(words)


def prompt_suite(profile: Any, tokenizers: Mapping[str, Any]) -> dict[str, list[str]]:
    """The standard prompt suite (the groups of ``tests/encoding/test_parity.py``), one batch per group.

    ``tokenizers`` maps diffusers component names (``tokenizer``, ``tokenizer_2``...) to tokenizers.
    """
    first, last = profile.slots[0], profile.slots[-1]
    suite = {
        "empty": [""],
        "one word": ["cat"],
        f"at limit ({first.name})": [_at_limit(first, tokenizers[first.tokenizer_subfolder])],
        "far over limit": [_LONG_WORDS],
        "exclamation marks": ["wow!!! a cat! on a mat!", "!"],
        "unicode and emoji": ["café crème, 東京の猫 🐱🎉 naïve résumé"],
        "newlines": ["a cat\non a mat\n\n  with   spaces  "],
        "weight syntax": ["(cat:1.2), [dog], ((masterpiece)), <lora:foo:0.8>"],
        "mixed batch": ["", "cat", "a very long prompt " * 40, "!!", "short & sweet"],
    }
    if last.name != first.name:
        suite[f"at limit ({last.name})"] = [_at_limit(last, tokenizers[last.tokenizer_subfolder])]
    return suite


# ------------------------------------------------------------------------------ results
@dataclass
class TensorComparison:
    """One output tensor over the whole suite. Shapes are per prompt (batch dimension removed)."""

    name: str
    trainer_shape: tuple[int, ...] | None
    profile_shape: tuple[int, ...]
    shape_match: bool
    #: Over the overlapping region when shapes differ; None when the trainer does not produce it.
    max_abs_diff: float | None
    mean_cosine: float | None
    #: Labels (``group[i]``) of the prompts whose tensors are not bit-identical.
    differing: list[str] = field(default_factory=list)
    compared: int = 0

    @property
    def identical(self) -> bool:
        return self.trainer_shape is not None and self.shape_match and not self.differing

    def summary(self) -> str:
        if self.trainer_shape is None:
            return f"{self.name}: not produced by the trainer"
        if self.identical:
            return f"{self.name}: identical"
        parts = []
        if not self.shape_match:
            parts.append(f"shape {_shape(self.trainer_shape)} vs profile {_shape(self.profile_shape)}")
        if self.max_abs_diff is not None:
            where = " (overlap)" if not self.shape_match else ""
            parts.append(f"max|Δ| {self.max_abs_diff:.3g}{where}, cos {self.mean_cosine:.4f}")
        parts.append(f"{len(self.differing)}/{self.compared} prompts differ")
        return f"{self.name}: " + ", ".join(parts)


def _shape(s: Sequence[int]) -> str:
    return str(tuple(s))


@dataclass
class ProbeResult:
    trainer: str
    version: str
    location: str
    profile: str
    hooks: bool
    tensors: list[TensorComparison]
    prompts: dict[str, str]
    notes: list[str] = field(default_factory=list)

    @property
    def aligned(self) -> bool:
        return all(t.identical for t in self.tensors if t.trainer_shape is not None)

    def summary(self) -> str:
        produced = [t for t in self.tensors if t.trainer_shape is not None]
        missing = [t.name for t in self.tensors if t.trainer_shape is None]
        tail = f" (not produced by the trainer: {', '.join(missing)})" if missing else ""
        if self.aligned:
            return "identical: " + ", ".join(t.name for t in produced) + tail
        return "differs: " + "; ".join(t.summary() for t in produced if not t.identical) + tail

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aligned"] = self.aligned
        for t, src in zip(d["tensors"], self.tensors, strict=True):
            t["identical"] = src.identical
        return d


# ------------------------------------------------------------------------------ comparison
@dataclass
class Case:
    """One trainer x profile, ready to run: the fitted profile, the shared components, the trainer call."""

    profile: Any
    tokenizers: dict[str, Any]
    text_encoders: dict[str, Any]
    #: prompts -> {output name: tensor}, batch in each output's batch dimension (the profile's typed
    #: outputs: first, except e.g. HiDream's Llama layer stack; none for shared outputs such as text_ids).
    run: Callable[[list[str]], dict[str, Any]]
    notes: list[str] = field(default_factory=list)


class _Acc:
    def __init__(self, name: str, profile_shape: tuple[int, ...]) -> None:
        self.name = name
        self.profile_shape = profile_shape
        self.trainer_shape: tuple[int, ...] | None = None
        self.shape_match = True
        self.max_abs: float = 0.0
        self.cos: list[float] = []
        self.differing: list[str] = []
        self.compared = 0
        self.missing = False


def _compare_item(acc: _Acc, label: str, got: Any, want: Any) -> None:
    import torch

    acc.compared += 1
    shape = tuple(got.shape)
    if acc.trainer_shape is None:
        acc.trainer_shape = shape
    if shape != tuple(want.shape):
        if acc.shape_match:  # report the first mismatch with the profile's shape for the same prompt
            acc.profile_shape = tuple(want.shape)
            acc.trainer_shape = shape
        acc.shape_match = False
    same = shape == tuple(want.shape) and got.dtype == want.dtype and torch.equal(got, want)
    if not same:
        acc.differing.append(label)
    if got.dim() != want.dim():
        return
    region = tuple(slice(0, min(a, b)) for a, b in zip(got.shape, want.shape, strict=True))
    a = got[region].detach().to(torch.float64).flatten()
    b = want[region].detach().to(torch.float64).flatten()
    if a.numel():
        acc.max_abs = max(acc.max_abs, float((a - b).abs().max()))
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 and nb == 0.0:
        acc.cos.append(1.0)
    elif na == 0.0 or nb == 0.0:
        acc.cos.append(0.0)
    else:
        acc.cos.append(float(a @ b) / (na * nb))


def compare(case: Case, suite: Mapping[str, list[str]] | None = None) -> tuple[list[TensorComparison], dict[str, str]]:
    """Run ``case`` and :func:`te_align.encode` over the suite; one comparison per profile output."""
    import torch

    suite = suite if suite is not None else prompt_suite(case.profile, case.tokenizers)
    accs: dict[str, _Acc] = {}
    labels: dict[str, str] = {}
    outputs = {o.name: o for o in output_specs(case.profile)}
    for group, prompts in suite.items():
        with torch.no_grad():
            want = _encode(case.profile, prompts, tokenizers=case.tokenizers, text_encoders=case.text_encoders)
            got = case.run(list(prompts))
        for name in want:
            ref = want[name]
            batched = outputs[name].batch_dim is not None  # a shared output (text_ids) is compared whole
            d = outputs[name].batch_dim or 0
            if name not in accs:
                shape = tuple(ref.shape)
                accs[name] = _Acc(name, shape[:d] + shape[d + 1 :] if batched else shape)
            acc = accs[name]
            if name not in got or got[name] is None:
                acc.missing = True
                continue
            out = got[name]
            if not batched:
                _compare_item(acc, group, out, ref)
                continue
            if out.dim() <= d or out.shape[d] != ref.shape[d]:
                raise ProbeError(f"{name}: the trainer returned {tuple(out.shape)} for {ref.shape[d]} prompts (batch dim {d})")
            for i in range(ref.shape[d]):
                label = f"{group}[{i}]" if len(prompts) > 1 else group
                labels[label] = prompts[i]
                _compare_item(acc, label, out.select(d, i), ref.select(d, i))
    result = []
    for acc in accs.values():
        if acc.missing:
            result.append(TensorComparison(acc.name, None, acc.profile_shape, False, None, None, [], 0))
            continue
        cos = sum(acc.cos) / len(acc.cos) if acc.cos else math.nan
        result.append(TensorComparison(acc.name, acc.trainer_shape, acc.profile_shape, acc.shape_match,
                                       acc.max_abs, cos, acc.differing, acc.compared))
    return result, labels


# ------------------------------------------------------------------------------ entry point
@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Probe conditions: te-align's hook log lines off (warnings only) and one intra-op thread.

    Tiny models spend their time in thread hand-offs: one thread is many times faster, and both sides
    run under the same setting. Both are restored afterwards.
    """
    import torch

    log = logging.getLogger("te_align")
    level = log.level
    threads = torch.get_num_threads()
    log.setLevel(logging.WARNING)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        log.setLevel(level)
        torch.set_num_threads(threads)
