"""The tiny expression language that says how slot outputs combine into conditioning tensors.

    prompt_embeds        = "seq(padw(feat(clip_l.hidden, clip_g.hidden), t5.hidden), t5.hidden)"
    pooled_prompt_embeds = "feat(clip_l.pooled, clip_g.pooled)"
    text_ids             = "text_ids(t5.hidden)"

A reference is ``SLOT.ATTR``; a call is ``NAME(ARG, ...)``; an argument may also be an integer.
This module only parses, checks and types outputs (no torch); ``te_align.encoding`` evaluates.
:func:`output_specs` types every output of a profile once (:class:`Output`: embeddings, mask or
token ids; shared by the batch or not; which dimension is the batch), so nothing downstream
guesses what a tensor is from its name.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from te_align.errors import ProfileError, closest

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles.model import AlignmentProfile

#: Attributes a slot reference may name.
ATTRS: dict[str, str] = {
    "hidden": "the selected hidden states (B, S, D), or (L, B, S, D) for layer = 'all'",
    "pooled": "the pooled embedding (B, D)",
    "mask": "the tokenizer attention mask after windowing/trimming (B, S)",
    "denoiser_mask": "the mask handed to the denoiser, with the profile's extra visible pad tokens (B, S)",
    "ids": "the token ids (B, S)",
}

OutputKind = Literal["embeds", "mask", "ids"]

#: What each attribute is: embeddings (zeroed for an empty prompt under ``empty_prompt = "zeros"``),
#: a mask or token ids (never zeroed).
ATTR_KINDS: dict[str, OutputKind] = {
    "hidden": "embeds",
    "pooled": "embeds",
    "mask": "mask",
    "denoiser_mask": "mask",
    "ids": "ids",
}

#: Functions: name -> (min args, max args or None, description).
FUNCTIONS: dict[str, tuple[int, int | None, str]] = {
    "feat": (1, None, "concatenate along the feature (last) dimension"),
    "seq": (1, None, "concatenate along the sequence dimension"),
    "padw": (2, 2, "zero-pad the last dimension to the width of the second argument (tensor or integer)"),
    "text_ids": (1, 1, "zeros of shape (sequence length, 3): Flux-style text position ids"),
    "text_ids_4d": (1, 1, "FLUX.2 text position ids (batch, sequence length, 4) int64: (t, h, w, l) = (0, 0, 0, position)"),
}


@dataclass(frozen=True)
class Ref:
    slot: str
    attr: str


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Ref | Call | int, ...]


Node = Ref | Call | int

_TOKEN = re.compile(r"\s*(?:(?P<num>-?\d+)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)|(?P<punct>[(),]))")


def _tokenize(text: str, key: str, file: str | None) -> list[str]:
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ProfileError(f"cannot parse expression {text!r} at position {pos}", file=file, key=key)
        out.append(m.group(m.lastgroup or "punct"))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


@functools.lru_cache(maxsize=256)
def parse_expression(text: str, *, key: str = "expression", file: str | None = None) -> Node:
    """Parse an output expression (cached: nodes are immutable)."""
    toks = _tokenize(text, key, file)
    i = 0

    def fail(msg: str) -> ProfileError:
        return ProfileError(f"{msg} in expression {text!r}", file=file, key=key)

    def parse() -> Node:
        nonlocal i
        if i >= len(toks):
            raise fail("unexpected end")
        tok = toks[i]
        i += 1
        if re.fullmatch(r"-?\d+", tok):
            return int(tok)
        if tok in "(),":
            raise fail(f"unexpected '{tok}'")
        if i < len(toks) and toks[i] == "(":
            if tok not in FUNCTIONS:
                raise fail(f"unknown function '{tok}'{closest(tok, FUNCTIONS)}")
            i += 1
            args: list[Node] = []
            while True:
                if i < len(toks) and toks[i] == ")" and not args:
                    i += 1
                    break
                args.append(parse())
                if i >= len(toks):
                    raise fail("missing ')'")
                if toks[i] == ",":
                    i += 1
                    continue
                if toks[i] == ")":
                    i += 1
                    break
                raise fail(f"expected ',' or ')' but found '{toks[i]}'")
            lo, hi, _ = FUNCTIONS[tok]
            if len(args) < lo or (hi is not None and len(args) > hi):
                want = f"{lo}" if hi == lo else f"{lo} or more" if hi is None else f"{lo} to {hi}"
                raise fail(f"{tok}() takes {want} arguments, got {len(args)}")
            return Call(tok, tuple(args))
        if "." not in tok:
            raise fail(f"expected SLOT.ATTR or a function call, got '{tok}'")
        slot, attr = tok.split(".", 1)
        if attr not in ATTRS:
            raise fail(f"unknown attribute '{attr}'{closest(attr, ATTRS)}")
        return Ref(slot, attr)

    node = parse()
    if i != len(toks):
        raise fail(f"unexpected '{toks[i]}' after the end")
    return node


def refs(node: Node) -> list[Ref]:
    if isinstance(node, Ref):
        return [node]
    if isinstance(node, Call):
        return [r for a in node.args for r in refs(a)]
    return []


def check_expression(text: str, slots: tuple[str, ...], *, key: str, file: str | None = None) -> Node:
    node = parse_expression(text, key=key, file=file)
    for r in refs(node):
        if r.slot not in slots:
            raise ProfileError(
                f"expression names slot '{r.slot}', which the profile does not have{closest(r.slot, slots)}",
                file=file,
                key=key,
            )
    return node


# ------------------------------------------------------------------------------ typed outputs
#: Functions whose result has no batch dimension (one tensor shared by every prompt), and its kind.
_SHARED_FUNCTIONS: dict[str, OutputKind] = {"text_ids": "ids"}
#: Functions whose result is batched and of a kind of its own, whatever their argument is.
_BATCHED_FUNCTIONS: dict[str, OutputKind] = {"text_ids_4d": "ids"}


@dataclass(frozen=True)
class Output:
    """One conditioning tensor of a profile, typed from its expression.

    ``kind``: ``embeds`` (hidden states, pooled embeddings), ``mask`` or ``ids`` (token or position
    ids). ``shared``: one tensor for the whole batch (Flux's ``text_ids``: (sequence, 3)).
    ``batch_dim``: the dimension that indexes prompts, None when shared; 1 for a layer stack
    (``layer = "all"``: (layers, batch, sequence, width), HiDream's Llama), else 0.
    """

    name: str
    expr: str
    kind: OutputKind
    shared: bool
    batch_dim: int | None

    @property
    def node(self) -> Node:
        return parse_expression(self.expr, key=f"outputs.{self.name}")


def _kind(node: Node, key: str, text: str) -> tuple[OutputKind, bool] | None:
    """(kind, shared) of a node; None for an integer argument."""
    if isinstance(node, int):
        return None
    if isinstance(node, Ref):
        return ATTR_KINDS[node.attr], False
    if node.fn in _SHARED_FUNCTIONS:
        return _SHARED_FUNCTIONS[node.fn], True
    if node.fn in _BATCHED_FUNCTIONS:
        return _BATCHED_FUNCTIONS[node.fn], False
    args = node.args[:1] if node.fn == "padw" else node.args  # padw's second argument only gives a width
    found = {k for a in args if (k := _kind(a, key, text)) is not None}
    if len(found) != 1:
        kinds = " and ".join(sorted(f"{'shared ' if sh else ''}{k}" for k, sh in found))
        raise ProfileError(f"{node.fn}() combines {kinds or 'no tensors'} in expression {text!r}", key=key)
    return found.pop()


@functools.lru_cache(maxsize=256)
def _typed(outputs: tuple[tuple[str, str], ...], stacked: frozenset[str]) -> tuple[Output, ...]:
    out = []
    for name, text in outputs:
        key = f"outputs.{name}"
        node = parse_expression(text, key=key)
        typed = _kind(node, key, text)
        if typed is None:
            raise ProfileError(f"expression {text!r} is a number, not a tensor", key=key)
        kind, shared = typed
        layered = any(r.slot in stacked and r.attr == "hidden" for r in refs(node))
        out.append(Output(name, text, kind, shared, None if shared else 1 if layered else 0))
    return tuple(out)


def output_specs(profile: AlignmentProfile) -> tuple[Output, ...]:
    """The profile's outputs, typed, in profile order (cached: profiles are immutable)."""
    stacked = frozenset(s.name for s in profile.slots if s.encoder.layer == "all")
    return _typed(profile.outputs, stacked)
