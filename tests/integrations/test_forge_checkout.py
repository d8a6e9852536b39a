"""Forge's own text engines from a checkout (TE_ALIGN_FORGE_DIR), built as its backend/diffusion_engine/<family>.py
builds them, on Forge's encoder classes holding te-align's tiny weights: where they give te_align.encode's tensors
and where they do not (the inference notes of `te-align check --for forge`)."""

from __future__ import annotations

import os

import pytest
import torch

import te_align
from te_align.encoding import encode
from te_align.errors import TeAlignError
from te_align.integrations import forge
from te_align.tiny.fit import fit_profile

DIR = os.environ.get(forge.ENV)
if not DIR:
    pytest.skip(f"{forge.ENV} (a Forge checkout) is not set", allow_module_level=True)
try:
    forge.import_forge(DIR)
except TeAlignError as e:
    pytest.skip(f"Forge from {forge.ENV} does not import: {e} (pip install -e '.[test]' installs gguf)",
                allow_module_level=True)

_BUILT: dict = {}


def _family(family):
    if family not in _BUILT:
        pipe = forge.pipeline(family)
        _BUILT[family] = (pipe, forge.engines(family, pipe))
    return _BUILT[family]


def _both(family, name, prompt):
    pipe, eng = _family(family)
    p = fit_profile(te_align.profile(name), pipe)
    got = forge.conditioning(family, eng, prompt)
    with torch.no_grad():
        ref = encode(p, [prompt], pipeline=pipe)
    return got, ref


def test_flux_t5_padded_to_256_never_cut_and_weights_read():
    got, ref = _both("flux", "flux-schnell", "a photo of a cat")
    assert got["crossattn"].shape == ref["prompt_embeds"].shape == (1, 256, 96)  # schnell's 256 = Forge's minimum
    assert (got["crossattn"] - ref["prompt_embeds"]).abs().max() < 1e-5  # Forge's own T5 code, same weights
    assert torch.equal(got["pooled"], ref["pooled_prompt_embeds"])  # transformers' CLIP in both
    dev, ref_dev = _both("flux", "flux-dev", "a photo of a cat")
    assert dev["crossattn"].shape[1] == 256 and ref_dev["prompt_embeds"].shape[1] == 512
    weighted, plain = _both("flux", "flux-schnell", "a photo of a (cat:1.2)")
    assert weighted["crossattn"].shape == plain["prompt_embeds"].shape
    assert (weighted["crossattn"] - plain["prompt_embeds"]).abs().max() > 1e-2  # read as a weight, not as text


def test_chroma_t5_not_padded():
    pipe, _ = _family("chroma")
    got, ref = _both("chroma", "chroma", "a photo of a cat")
    n = len(pipe.tokenizer("a photo of a cat").input_ids)  # the tokens and EOS, no padding (min_length=1)
    assert got["crossattn"].shape[1] == n and ref["prompt_embeds"].shape[1] == 512


@pytest.mark.parametrize(("family", "name"), [("sdxl", "sdxl"), ("sd15", "sd15")])
def test_clip_families_as_trained_for_a_short_plain_prompt(family, name):
    got, ref = _both(family, name, "a photo of a cat")
    assert torch.equal(got["crossattn"], ref["prompt_embeds"])
    if "pooled" in got:
        assert torch.equal(got["pooled"], ref["pooled_prompt_embeds"])
    text = "a very long prompt " * 30
    n = len(_family(family)[0].tokenizer(text).input_ids) - 2  # without BOS and EOS
    long, ref_long = _both(family, name, text)
    assert n == 120 and ref_long["prompt_embeds"].shape[1] == 77  # the profile cuts at 77
    assert long["crossattn"].shape[1] == 2 * 77  # Forge: two 75-token chunks, each with BOS and EOS
