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


def test_chroma_prompt_and_empty_negative_match_encode_with_their_masks():
    """ChromaPipeline: the prompt and, with no negative given, the encoded "" (what ChromaPipeline itself uses), each
    with its T5 mask (real tokens plus one pad), exactly as te_align.encode gives them."""
    pipe = build_pipeline("chroma")
    prof = fit_profile(te_align.profile("chroma", t5_max_length=64), pipe)
    te_align.apply(pipe, prof)
    kw = {"height": 32, "width": 32, "num_inference_steps": 2, "guidance_scale": 4.0, "output_type": "pt"}
    got = pipe(PROMPT, generator=torch.Generator().manual_seed(0), **kw).images
    cond = te_align.encode(prof, PROMPT, pipeline=pipe)
    neg = encode_uncond(prof, 1, pipeline=pipe)
    assert cond["prompt_embeds"].shape == (1, 64, 96) and int(cond["prompt_attention_mask"].sum()) < 64
    remove(pipe)
    ref = pipe(prompt_embeds=cond["prompt_embeds"], prompt_attention_mask=cond["prompt_attention_mask"],
               negative_prompt_embeds=neg["prompt_embeds"], negative_prompt_attention_mask=neg["prompt_attention_mask"],
               generator=torch.Generator().manual_seed(0), **kw).images  # fmt: skip
    assert torch.equal(got, ref)
    # the pipeline's own encoding (T5 at 512) gives other images: the aligned call did not fall back to it
    assert not torch.equal(pipe(PROMPT, generator=torch.Generator().manual_seed(0), **kw).images, got)


def test_flux2_klein_aligned_to_its_own_profile_samples_its_images_and_the_deviating_layers_do_not():
    """Flux2KleinPipeline (true CFG against negative_prompt_embeds; no negative_prompt): aligned to its own recipe it
    samples exactly the images of its plain call; aligned to the diffusers klein script's layers (10, 20, 30) it
    samples exactly the images of te_align.encode's embeddings (prompt and the encoded "") handed to it."""
    from te_align.tiny.pipelines import missing_pipeline

    if missing_pipeline("flux2-klein"):
        pytest.skip(missing_pipeline("flux2-klein"))
    from te_align.tiny import klein

    pipe = klein.build_klein_pipeline()
    prof = klein.klein_profile(pipe)
    kw = {"height": 32, "width": 32, "num_inference_steps": 2, "guidance_scale": 4.0, "output_type": "pt"}

    def sample(**call):
        return pipe(generator=torch.Generator().manual_seed(0), **kw, **call).images

    plain, one = sample(prompt=[PROMPT, "a blue sphere"]), sample(prompt=PROMPT)
    te_align.apply(pipe, prof)
    assert torch.equal(sample(prompt=[PROMPT, "a blue sphere"]), plain)
    deviating = prof.with_overrides({"qwen3.layer": [10, 20, 30]})
    te_align.apply(pipe, deviating)
    got = sample(prompt=PROMPT)
    cond = te_align.encode(deviating, PROMPT, pipeline=pipe)
    neg = encode_uncond(deviating, 1, pipeline=pipe)
    remove(pipe)
    ref = sample(prompt_embeds=cond["prompt_embeds"], negative_prompt_embeds=neg["prompt_embeds"])
    assert torch.equal(got, ref) and not torch.equal(got, one)
    with pytest.raises(TeAlignError, match="profile 'sd15' is a sd1 profile, but Flux2KleinPipeline samples flux2-klein"):
        te_align.apply(pipe, "sd15")
    with pytest.raises(TeAlignError, match=r"carries none; pass one, e\.g\. te_align\.apply\(pipe, 'flux2-klein-4b'\)$"):
        te_align.apply(pipe)


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


# ---------------------------------------------------------------------------------------- the shipped world bases
from te_align.tiny import bases as _bases  # noqa: E402

WORLD = _bases.shipped()


@pytest.fixture(scope="module")
def world_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("world-cache")


def _world(name, cache):
    from te_align.tiny import world

    return world.base(name, cache_dir=cache / name)


def _sample(pipe, *args, **kw):
    out = pipe(*args, num_inference_steps=2, output_type="pt", generator=torch.Generator().manual_seed(3), **kw)
    return out.images


@pytest.mark.parametrize("name", WORLD)
def test_world_base_sampling_is_identical_with_its_own_profile(name, world_cache):
    """te_align.apply(pipe, the base's own profile) on a world base (a subclass whose __call__ fills the base's
    sampling settings) samples exactly the images of the plain call: prompt, negative and call defaults included."""
    pipe = _world(name, world_cache)
    plain = _sample(pipe, "a red cube on the left")
    prof = te_align.profile(_bases.base_info(name)["profile"], **_bases.base_info(name)["profile_overrides"])
    assert prof.fingerprint() == pipe.te_align_profile.fingerprint()
    world_cls = type(pipe)
    assert te_align.apply(pipe, prof) is pipe
    assert type(pipe).__name__ == world_cls.__name__ and isinstance(pipe, world_cls)
    aligned = _sample(pipe, "a red cube on the left")  # the prompt positionally, as pipe(prompt) takes it
    assert torch.equal(aligned, plain)
    assert torch.equal(_sample(pipe, prompt="a red cube on the left"), plain)
    # a shorter window (every CLIP at once where they are concatenated, as SDXL's; the klein base's Qwen3 at 64)
    clips = {f"{s}_max_length": 32 for s in prof.slot_names if s.startswith("clip")}
    other = {"t5_max_length": 64} if "t5" in prof.slot_names else {"qwen3_max_length": 64} if "qwen3" in prof.slot_names else clips
    te_align.apply(pipe, te_align.profile(prof, **other))  # the aligned call is the one that encodes
    assert not torch.equal(_sample(pipe, "a red cube on the left"), plain)
    remove(pipe)
    assert type(pipe) is world_cls and applied_profile(pipe) is None
    assert torch.equal(_sample(pipe, "a red cube on the left"), plain)


def test_apply_without_a_profile_uses_the_one_the_pipeline_carries(world_cache):
    pipe = _world(WORLD[0], world_cache)
    te_align.apply(pipe)
    assert applied_profile(pipe) is pipe.te_align_profile
    assert applied_profile(pipe).name == _bases.BASES[WORLD[0]].profile
    plain = build_pipeline("sd15")
    with pytest.raises(TeAlignError, match=r"^te_align.apply\(pipe\) needs a profile: this StableDiffusionPipeline "
                                           r"carries none; pass one, e.g. te_align.apply\(pipe, 'sd15'\)$"):
        te_align.apply(plain)


def test_a_profile_of_other_widths_is_refused_when_applied(world_cache):
    name = "flux" if "flux" in WORLD else WORLD[0]
    pipe = _world(name, world_cache)
    spec = _bases.BASES[name]
    want = {"flux": ("profile 'flux-schnell' does not fit this FluxPipeline's text encoders: clip_l (text_encoder) is 32 "
                     "wide, the profile says 768; t5 (text_encoder_2) is 96 wide, the profile says 4096 (use the profile "
                     "the pipeline was built with, or override clip_l_hidden_size=32, t5_hidden_size=96 if this is "
                     "intended)")}
    with pytest.raises(TeAlignError) as e:
        te_align.apply(pipe, spec.profile)
    assert "\n" not in str(e.value)
    if name in want:
        assert str(e.value) == want[name]
    assert applied_profile(pipe) is None and type(pipe).__call__ is type(pipe).__mro__[1].__call__
