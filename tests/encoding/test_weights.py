"""Prompt weights (te_align.encoding.weights): the A1111 / sd-scripts parser and the alignment to a profile's tokens.

Expected parses are sd-scripts 48d368f's (``library/strategy_base.py:89-172``, the docstring examples
of ``parse_prompt_attention`` included); the comparison against sd-scripts' own function runs in
tests/trainers/kohya/test_kohya_integration.py when a checkout is given.
"""

from __future__ import annotations

import pytest
import torch

from te_align.encoding.weights import (
    parse_prompt_weights,
    strip_prompt_weights,
    tokenize_slot_weighted,
    weight_hidden_states,
)

R, S = 1.1, 1 / 1.1


@pytest.mark.parametrize(
    "text, expect",
    [
        ("normal text", [("normal text", 1.0)]),
        ("", [("", 1.0)]),
        ("an (important) word", [("an ", 1.0), ("important", R), (" word", 1.0)]),
        ("(unbalanced", [("unbalanced", R)]),
        ("[unbalanced", [("unbalanced", S)]),
        ("\\(literal\\]", [("(literal]", 1.0)]),
        ("(unnecessary)(parens)", [("unnecessaryparens", R)]),
        # sd-scripts' docstring example: nesting multiplies, in sd-scripts' order (bit-exact floats)
        (
            "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
            [("a ", 1.0), ("house", 1.3 * R * R), (" ", R), ("on", R * S), (" a ", R), ("hill", 0.5 * R), (", sun, ", R),
             ("sky", R * R * R * R), (".", R)],
        ),
        ("(a:1.5)", [("a", 1.5)]),
        ("(a: 1.5)", [("a: 1.5", R)]),  # a space before the number: literal text in a (…) bracket
        ("(a:1.5 )", [("a:1.5 ", R)]),
        ("(a:+2)(b:-0.5)(c:.5)", [("a", 2.0), ("b", -0.5), ("c", 0.5)]),
        ("a:1.2) b", [("a:1.2) b", 1.0)]),  # ":1.2)" without an open "(" is text
        ("close) and] here", [("close) and] here", 1.0)]),
        ("((a):2)", [("a", R * 2.0)]),
        ("[[a]]", [("a", S * S)]),
        ("(a [b] c)", [("a ", R), ("b", R * S), (" c", R)]),
        ("\\\\ back \\slash", [("\\ back slash", 1.0)]),  # "\\" is a backslash, a lone "\" is dropped
        ("C:\\path", [("C:path", 1.0)]),
        ("cat BREAK dog", [("cat BREAK dog", 1.0)]),  # BREAK means nothing to sd-scripts' training parser
        ("(cat)s", [("cat", R), ("s", 1.0)]),
    ],
)  # fmt: skip
def test_parser(text, expect):
    assert parse_prompt_weights(text) == expect
    assert strip_prompt_weights(text) == "".join(t for t, _ in expect)


@pytest.mark.parametrize("text", ["(a:1.2.3)", "(a:.)"])
def test_malformed_numbers_raise_as_in_sd_scripts(text):
    with pytest.raises(ValueError, match="is not a number"):
        parse_prompt_weights(text)


def _tok(pad: str = "<|endoftext|>"):
    from te_align.tiny.tokenizers import clip_tokenizer

    return clip_tokenizer(pad=pad)


def _slot(profile: str, name: str):
    import te_align

    return te_align.profile(profile).slot(name)


def test_ids_are_the_profile_tokens_of_the_stripped_prompt_and_weights_align():
    from te_align.encoding.core import tokenize_slot

    slot, tok = _slot("sd15", "clip_l"), _tok()
    ids, mask, w = tokenize_slot_weighted(slot, tok, ["a (red:1.5) [cat], wow", "plain"])
    ref_ids, ref_mask = tokenize_slot(slot, tok, ["a red cat, wow", "plain"])
    assert torch.equal(ids, ref_ids) and torch.equal(mask, ref_mask) and w.dtype == torch.float32
    assert w[0, :7].tolist() == pytest.approx([1.0, 1.0, 1.5, S, 1.0, 1.0, 1.0]) and bool((w[0, 7:] == 1).all())
    assert bool((w[1] == 1).all())


def test_a_token_takes_the_weight_of_the_piece_it_starts_in():
    slot, tok = _slot("sd15", "clip_l"), _tok()
    _, _, w = tokenize_slot_weighted(slot, tok, ["(cat)s sat", "big(cat) sat"])
    assert w[0, :4].tolist() == pytest.approx([1.0, R, 1.0, 1.0])  # "cats" is one token, starting in "(cat)"
    assert w[1, :5].tolist() == pytest.approx([1.0, 1.0, R, 1.0, 1.0])  # "big", "cat</w>": two tokens


def test_clip_g_exclamation_pad_rule_and_chunks():
    import copy

    from te_align.encoding.core import EncodeOptions, tokenize_slot

    slot = _slot("sdxl", "clip_g")
    tok = copy.deepcopy(_tok())
    tok.add_special_tokens({"pad_token": "!"})  # the hub tokenizer_2: "!" is the pad token (id 0)
    long = " ".join(f"w{i}" for i in range(50)) + " (wow!:2) end"
    opts = EncodeOptions(long_prompt_chunks=3, pad_chunks=True)
    ids, _, w = tokenize_slot_weighted(slot, tok, ["(wow!:2)", long], options=opts)
    assert torch.equal(ids, tokenize_slot(slot, tok, ["wow!", strip_prompt_weights(long)], options=opts)[0])
    assert ids.shape == w.shape == (2, 231)
    assert ids[0, 1:3].tolist() == [tok.convert_tokens_to_ids("wow</w>"), 0] and w[0, 1:3].tolist() == [2.0, 2.0]
    n = len(tok(strip_prompt_weights(long), add_special_tokens=False)["input_ids"])
    body = [k for k in range(231) if k % 77 not in (0, 76)][:n]  # each chunk: BOS, 75 body, EOS
    weighted = [k for k in range(231) if w[1, k] != 1.0]
    assert weighted == body[n - 3 : n - 1] and all(w[1, k] == 2.0 for k in weighted)  # "wow", "!" (before "end")


def test_template_slot_and_tokenizer_without_offsets():
    """A templated slot (Lumina 2's system prompt): template tokens weigh 1; a tokenizer without
    offsets (transformers 4 slow classes) gives the same weights by matching the pieces."""
    from te_align.tiny.tokenizers import gemma_tokenizer

    slot = _slot("lumina2", "gemma")
    fast = gemma_tokenizer()
    ids, _, w = tokenize_slot_weighted(slot, fast, ["a (cat:1.3) sat"])
    toks = fast.convert_ids_to_tokens(ids[0].tolist())
    assert [t for t, x in zip(toks, w[0].tolist(), strict=True) if x != 1.0] == ["▁cat"]

    class Slow:
        is_fast = False
        padding_side = "right"

        def __init__(self, inner):
            self.inner = inner

        def __call__(self, *a, **k):
            k.pop("return_offsets_mapping", None)
            return self.inner(*a, **k)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    _, _, w_slow = tokenize_slot_weighted(slot, Slow(fast), ["a (cat:1.3) sat"])
    assert torch.equal(w_slow, w)
    clip, tok = _slot("sd15", "clip_l"), _tok()
    prompts = ["(cat)s sat", "big(cat) sat", "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).", "wow!! (x)y"]
    assert torch.equal(tokenize_slot_weighted(clip, Slow(tok), prompts)[2], tokenize_slot_weighted(clip, tok, prompts)[2])


def test_weight_hidden_states_formulas():
    torch.manual_seed(0)
    h = torch.randn(2, 5, 3)
    w = torch.tensor([[1.0, 2.0, 1.0, 0.5, 1.0], [1.0] * 5])
    assert torch.equal(weight_hidden_states(h, w), h * w.unsqueeze(-1))
    out = weight_hidden_states(h, w, restore_mean=True)
    assert torch.allclose(out.mean(dim=(-2, -1)), h.mean(dim=(-2, -1)), atol=1e-6)
    assert torch.equal(out[1], h[1])  # all-ones weights leave the states bit-identical
    assert weight_hidden_states(h.half(), w).dtype == torch.float32  # sd-scripts' float32 weights promote
