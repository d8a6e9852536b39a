"""te_align.apply(pipe, profile): real diffusers pipelines at tiny sizes encode by the profile, bit-identical
to te_align.encode on the same components (the tensors the denoiser receives are captured by a forward pre-hook)."""

from __future__ import annotations

import pytest
import torch

import te_align
from te_align.encoding.core import encode_uncond
from te_align.errors import TeAlignError
from te_align.integrations.diffusers import applied_profile, remove
from te_align.tiny.fit import fit_profile
from te_align.tiny.pipelines import build_pipeline

PROMPT = "a photo of a red cube on a table"


def _capture(pipe):
    seen: dict = {}
    mod = pipe.transformer if hasattr(pipe, "transformer") else pipe.unet
    mod.register_forward_pre_hook(lambda m, a, k: seen.__setitem__("k", k), with_kwargs=True)
    return seen


def _run(pipe, seen, **kw):
    pipe.set_progress_bar_config(disable=True)
    pipe(height=32, width=32, num_inference_steps=1, output_type="latent", generator=torch.Generator().manual_seed(0), **kw)
    return seen.pop("k")


def test_flux_schnell_samples_at_256_not_512():
    pipe = build_pipeline("flux-schnell")
    seen = _capture(pipe)
    before = _run(pipe, seen, prompt=PROMPT)
    assert before["encoder_hidden_states"].shape[1] == 512  # FluxPipeline's default, for schnell too
    prof = fit_profile(te_align.profile("flux-schnell"), pipe)
    assert te_align.apply(pipe, prof) is pipe
    assert applied_profile(pipe) is prof
    after = _run(pipe, seen, prompt=PROMPT)
    ref = te_align.encode(prof, PROMPT, pipeline=pipe)
    assert after["encoder_hidden_states"].shape == (1, 256, 96)
    assert torch.equal(after["encoder_hidden_states"], ref["prompt_embeds"])
    assert torch.equal(after["pooled_projections"], ref["pooled_prompt_embeds"])
    assert torch.equal(after["txt_ids"], ref["text_ids"])
    remove(pipe)
    assert type(pipe).__name__ == "FluxPipeline" and applied_profile(pipe) is None
    assert _run(pipe, seen, prompt=PROMPT)["encoder_hidden_states"].shape[1] == 512


def test_sd3_negative_is_the_profiles_empty_prompt_and_images_per_prompt_repeat():
    pipe = build_pipeline("sd3")
    seen = _capture(pipe)
    prof = fit_profile(te_align.profile("sd35-large"), pipe)
    te_align.apply(pipe, prof)
    got = _run(pipe, seen, prompt=[PROMPT, "a blue sphere"], num_images_per_prompt=2)
    cond = te_align.encode(prof, [PROMPT, "a blue sphere"], pipeline=pipe)
    neg = encode_uncond(prof, 2, pipeline=pipe)
    ehs = got["encoder_hidden_states"]  # CFG: negatives first, then prompts, each repeated twice
    assert ehs.shape == (8, 77 + 256, 96)
    assert torch.equal(ehs[4:], cond["prompt_embeds"].repeat_interleave(2, dim=0))
    assert torch.equal(ehs[:4], neg["prompt_embeds"].repeat_interleave(2, dim=0))
    assert torch.equal(got["pooled_projections"][4:], cond["pooled_prompt_embeds"].repeat_interleave(2, dim=0))


def test_sdxl_empty_negative_is_zeros_and_a_given_negative_is_encoded():
    pipe = build_pipeline("sdxl")
    seen = _capture(pipe)
    prof = fit_profile(te_align.profile("sdxl"), pipe)
    te_align.apply(pipe, prof)
    got = _run(pipe, seen, prompt=PROMPT)
    ref = te_align.encode(prof, PROMPT, pipeline=pipe)
    assert torch.equal(got["encoder_hidden_states"][1:], ref["prompt_embeds"])
    assert torch.count_nonzero(got["encoder_hidden_states"][:1]) == 0
    got = _run(pipe, seen, prompt=PROMPT, negative_prompt="blurry")
    neg = te_align.encode(prof, "blurry", pipeline=pipe, negative=True)
    assert torch.equal(got["encoder_hidden_states"][:1], neg["prompt_embeds"])


def test_sd15_matches_encode():
    pipe = build_pipeline("sd15")
    seen = _capture(pipe)
    prof = fit_profile(te_align.profile("sd15"), pipe)
    te_align.apply(pipe, prof)
    got = _run(pipe, seen, prompt=PROMPT)
    assert torch.equal(got["encoder_hidden_states"][1:], te_align.encode(prof, PROMPT, pipeline=pipe)["prompt_embeds"])
    assert torch.equal(got["encoder_hidden_states"][:1], encode_uncond(prof, 1, pipeline=pipe)["prompt_embeds"])


def test_refusals():
    pipe = build_pipeline("sd15")
    with pytest.raises(TeAlignError, match="profile 'flux-dev' is a flux profile, but StableDiffusionPipeline samples sd1"):
        te_align.apply(pipe, "flux-dev")
    with pytest.raises(TeAlignError, match=r"te_align\.apply supports FluxPipeline"):
        te_align.apply(object(), "sd15")
    flux = build_pipeline("flux-schnell")
    te_align.apply(flux, fit_profile(te_align.profile("flux-schnell"), flux))
    with pytest.raises(TeAlignError, match="prompt_2 is not used"):
        flux(prompt=PROMPT, prompt_2="other", height=32, width=32, num_inference_steps=1, output_type="latent")
