"""The tiny expression language that says how slot outputs combine into conditioning tensors.

    prompt_embeds        = "seq(padw(feat(clip_l.hidden, clip_g.hidden), t5.hidden), t5.hidden)"
    pooled_prompt_embeds = "feat(clip_l.pooled, clip_g.pooled)"
    text_ids             = "text_ids(t5.hidden)"

A reference is ``SLOT.ATTR``; a call is ``NAME(ARG, ...)``; an argument may also be an integer.
This module only parses and checks (no torch); ``te_align.encoding`` evaluates.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from te_align.errors import ProfileError, closest

#: Attributes a slot reference may name.
ATTRS: dict[str, str] = {
    "hidden": "the selected hidden states (B, S, D), or (L, B, S, D) for layer = 'all'",
    "pooled": "the pooled embedding (B, D)",
    "mask": "the tokenizer attention mask after windowing/trimming (B, S)",
    "denoiser_mask": "the mask handed to the denoiser, with the profile's extra visible pad tokens (B, S)",
    "ids": "the token ids (B, S)",
}

#: Functions: name -> (min args, max args or None, description).
FUNCTIONS: dict[str, tuple[int, int | None, str]] = {
    "feat": (1, None, "concatenate along the feature (last) dimension"),
    "seq": (1, None, "concatenate along the sequence dimension"),
    "padw": (2, 2, "zero-pad the last dimension to the width of the second argument (tensor or integer)"),
    "text_ids": (1, 1, "zeros of shape (sequence length, 3): Flux-style text position ids"),
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
