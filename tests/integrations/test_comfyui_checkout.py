"""ComfyUI's real code from a checkout (TE_ALIGN_COMFYUI_DIR): its own text-encoder objects on tiny random weights
with its shipped tokenizers. (a) the stock CLIPTextEncode deviates from te_align.encode where the research says;
(b) the te-align node equals te_align.encode bit for bit (te_align.encode run on ComfyUI's own encoder modules),
and is within float rounding of te_align.encode on transformers' encoders holding the same weights; the node uses
ComfyUI's loaded modules (no copy) and its LoRA-patched weights."""

from __future__ import annotations

import re

import pytest

from tests.support.comfyui import comfyui_or_skip

DIR = comfyui_or_skip()  # one skip reason for the module when ComfyUI or one of its requirements is missing

import nodes  # noqa: E402  (ComfyUI's, from the checkout)
import torch  # noqa: E402

from te_align.encoding import encode  # noqa: E402
from te_align.integrations.comfyui import tiny  # noqa: E402
from te_align.integrations.comfyui.encode import NodeError, check_family, components, to_conditioning  # noqa: E402
from te_align.integrations.comfyui.nodes import TeAlignEmptyNegative, TeAlignTextEncode  # noqa: E402

PROMPTS = ["a photo of a cat", "", "wow!!! a (cat:1.2) on a mat!", "a very long prompt " * 30]
_BUILT: dict = {}


def _tiny(family):
    if family not in _BUILT:
        _BUILT[family] = tiny.build(family, DIR)
    return _BUILT[family]


CASES = [(f, n) for f, names in tiny.PROFILES.items() for n in names]


@pytest.mark.parametrize(("family", "name"), CASES)
def test_node_equals_te_align_encode(family, name):
    tc = _tiny(family)
    p = tiny.fitted_profile(name, tc)
    toks, encs = components(tc.clip, p)
    hf_toks, hf_encs = tiny.reference_components(p, tc)
    for prompt in PROMPTS:
        ref = encode(p, [prompt], tokenizers=toks, text_encoders=encs)
        want = to_conditioning(p, ref)
        got = TeAlignTextEncode().encode(tc.clip, p, prompt)["result"]
        cond = got[0]
        assert torch.equal(cond[0][0], want[0][0]), (name, prompt)
        assert set(cond[0][1]) == set(want[0][1]) | ({"guidance"} if family == "flux" else set())
        for k, v in want[0][1].items():
            assert torch.equal(cond[0][1][k], v)
        # same weights in transformers' implementation: float rounding only
        hf = encode(p, [prompt], tokenizers=hf_toks, text_encoders=hf_encs)
        first = p.output_names[0]
        assert hf[first].shape == ref[first].shape
        assert (hf[first] - ref[first]).abs().max() < 1e-4
        assert got[1].startswith(f"profile {p.name} · fingerprint {p.fingerprint()}")


def test_stock_deviations_flux_sd3_sdxl_sd1():
    flux = _tiny("flux")
    dev = tiny.fitted_profile("flux-dev", flux)
    stock = nodes.CLIPTextEncode().encode(flux.clip, "a photo of a cat")[0]
    assert stock[0][0].shape[1] == 256  # ComfyUI: T5 min 256
    assert TeAlignTextEncode().encode(flux.clip, dev, "a photo of a cat")["result"][0][0][0].shape[1] == 512
    schnell = tiny.fitted_profile("flux-schnell", flux)
    toks, encs = components(flux.clip, schnell)
    ref = encode(schnell, ["a photo of a cat"], tokenizers=toks, text_encoders=encs)
    assert torch.equal(stock[0][0], ref["prompt_embeds"])  # schnell at 256: the same for a short plain prompt
    weighted = nodes.CLIPTextEncode().encode(flux.clip, "a (cat:1.2)")[0][0][0]
    ref_w = encode(schnell, ["a (cat:1.2)"], tokenizers=toks, text_encoders=encs)["prompt_embeds"]
    assert not torch.equal(weighted, ref_w)  # ComfyUI reads (cat:1.2) as a weight, also for T5
    sd3 = _tiny("sd3")
    assert nodes.CLIPTextEncode().encode(sd3.clip, "a cat")[0][0][0].shape[1] == 77 + 77  # T5 min 77
    p3 = tiny.fitted_profile("sd35-large", sd3)
    assert TeAlignTextEncode().encode(sd3.clip, p3, "a cat")["result"][0][0][0].shape[1] == 77 + 256
    sdxl = _tiny("sdxl")
    px = tiny.fitted_profile("sdxl", sdxl)
    neg = TeAlignEmptyNegative().encode(sdxl.clip, px)["result"][0][0]
    assert torch.count_nonzero(neg[0]) == 0 and torch.count_nonzero(neg[1]["pooled_output"]) == 0
    stock_empty = nodes.CLIPTextEncode().encode(sdxl.clip, "")[0][0][0]
    assert torch.count_nonzero(stock_empty) > 0  # ComfyUI encodes "" (zeros only via ConditioningZeroOut)
    sized = TeAlignTextEncode().encode(sdxl.clip, px, "a cat", width=1024, height=768)["result"][0][0][1]
    assert (sized["width"], sized["height"], sized["crop_w"], sized["target_height"]) == (1024, 768, 0, 768)


def test_no_copy_and_lora_patches_are_used():
    tc = _tiny("sd1")
    p = tiny.fitted_profile("sd15", tc)
    _, encs = components(tc.clip, p)
    assert encs["clip_l"].module is tc.clip.cond_stage_model.clip_l.transformer
    assert list(encs["clip_l"].parameters()) == []
    before = TeAlignTextEncode().encode(tc.clip, p, "a cat")["result"][0][0][0]
    patched = tc.clip.clone()
    key = "clip_l.transformer.text_model.encoder.layers.0.mlp.fc1.bias"
    w = dict(patched.cond_stage_model.named_parameters())[key]
    patched.add_patches({key: (torch.ones_like(w),)}, 1.0)  # a weight diff, as a CLIP LoRA adds
    after = TeAlignTextEncode().encode(patched, p, "a cat")["result"][0][0][0]
    stock_after = nodes.CLIPTextEncode().encode(patched, "a cat")[0][0][0]
    assert not torch.equal(before, after)
    assert torch.equal(after, stock_after)  # a plain prompt: the node and ComfyUI agree on the patched weights


def _blocked_line(out):
    """The one line a blocked node result carries (ComfyUI's ExecutionBlocker on both outputs, and the node text)."""
    from comfy_execution.graph_utils import ExecutionBlocker

    first, second = out["result"]
    assert isinstance(first, ExecutionBlocker) and isinstance(second, ExecutionBlocker)
    assert first.message == second.message == out["ui"]["text"][0] and "\n" not in first.message
    return first.message


def test_bad_input_is_one_line():
    sd1 = _tiny("sd1")
    line = _blocked_line(TeAlignTextEncode().encode(sd1.clip, "flux-dev", "a cat"))
    assert line.startswith("te-align Text Encode: the clip input is a sd1 text encoder (SD1ClipModel), but profile "
                           "'flux-dev' is for flux models")
    assert re.fullmatch(r"te-align Text Encode: unknown profile 'sdx1'.*sdxl.*",
                        _blocked_line(TeAlignTextEncode().encode(sd1.clip, "sdx1", "a cat")))
    assert "no LoRA is chosen" in _blocked_line(TeAlignTextEncode().encode(sd1.clip, "from LoRA", "a cat"))
    assert _blocked_line(TeAlignEmptyNegative().encode(sd1.clip, "sdxl")).startswith(
        "te-align Empty Negative: the clip input is a sd1 text encoder")
    assert "not a ComfyUI CLIP object" in _blocked_line(TeAlignTextEncode().encode(object(), "sd15", "a cat"))
    with pytest.raises(NodeError, match="not a ComfyUI CLIP object"):  # the check raises; the nodes block
        check_family(object(), tiny.fitted_profile("sd15", sd1))


@pytest.mark.parametrize("projection", ["model", "absent", "random"])
def test_sd3_clip_l_pooled_is_unprojected(projection):
    """SD3's CLIP-L pooled output is unprojected (Stability's reference; its projection is the identity). ComfyUI
    leaves text_projection uninitialised when the CLIP-L file has none; the node never reads it, so its pooled output
    equals te_align.encode on transformers' CLIP-L with the identity projection, and ComfyUI's own, in every case."""
    tc = tiny.build("sd3", DIR, clip_l_projection=projection)
    p = tiny.fitted_profile("sd35-large", tc)
    w = tc.clip.cond_stage_model.clip_l.transformer.text_projection.weight
    assert torch.equal(w, torch.eye(w.shape[0])) == (projection == "model")
    hf_toks, hf_encs = tiny.reference_components(p, tc)
    assert torch.equal(hf_encs["clip_l"].text_projection.weight, torch.eye(w.shape[0]))
    for prompt in ("a photo of a cat", ""):
        got = TeAlignTextEncode().encode(tc.clip, p, prompt)["result"][0][0][1]["pooled_output"]
        ref = encode(p, [prompt], tokenizers=hf_toks, text_encoders=hf_encs)["pooled_prompt_embeds"]
        assert got.shape == ref.shape == (1, 32 + 48)
        assert torch.isfinite(got).all() and (got - ref).abs().max() < 1e-4
        stock = nodes.CLIPTextEncode().encode(tc.clip, prompt)[0][0][1]["pooled_output"]
        assert torch.equal(got, stock)  # a plain prompt: ComfyUI's pooled output is the same


def test_lumina2_is_refused_with_the_reason():
    """ComfyUI's Lumina 2 encoder (SentencePiece tokenizer from the weights file, Gemma-2 without attention
    soft-capping) cannot give the lumina2 profile's tensors: the node says so in one line, whatever profile input."""
    tc = _tiny("lumina2")
    assert type(tc.clip.tokenizer.gemma2_2b.tokenizer).__name__ == "SPieceTokenizer"
    reason = (r"te-align (Text Encode|Empty Negative): Lumina 2 cannot be encoded by its profile on ComfyUI's encoder: "
              r"ComfyUI's Gemma-2 tokenizes with the SentencePiece model .* soft-capping.*")
    for profile in ("lumina2", "from LoRA", "flux-dev"):
        assert re.fullmatch(reason, _blocked_line(TeAlignTextEncode().encode(tc.clip, profile, "a cat")))
    assert re.fullmatch(reason, _blocked_line(TeAlignEmptyNegative().encode(tc.clip, "lumina2")))
    stock = nodes.CLIPTextEncode().encode(tc.clip, "a cat")[0][0]  # ComfyUI's own node still encodes it
    assert stock[0].shape[-1] == 64 and "attention_mask" in stock[1]
