"""The profile fields of LLM text encoders: tapped layer lists, their combination, and the thinking switch."""

from __future__ import annotations

import re

import pytest
import torch

import te_align
from te_align.encoding.core import combine_layers
from te_align.encoding.text import render, template_prefix, template_suffix
from te_align.errors import ProfileError
from te_align.profiles.model import TokenizerSpec

QWEN3 = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{thinking}"
OFF = "<think>\n\n</think>\n\n"


def _states() -> list[torch.Tensor]:
    # two layers, batch 1, sequence 2, width 2: layer k holds 10k + position-and-width counters
    return [torch.tensor([[[10 * k + 1, 10 * k + 2], [10 * k + 3, 10 * k + 4]]]) for k in (1, 2)]


def test_concat_puts_the_layers_side_by_side_in_list_order():
    got = combine_layers("concat", _states())
    assert got.tolist() == [[[11, 12, 21, 22], [13, 14, 23, 24]]]
    # FLUX.2's own formulation: stack on dim 1, permute, reshape
    out = torch.stack(_states(), dim=1)
    b, n, s, d = out.shape
    assert torch.equal(got, out.permute(0, 2, 1, 3).reshape(b, s, n * d))


def test_interleave_is_width_major_and_stack_keeps_a_layer_axis():
    assert combine_layers("interleave", _states()).tolist() == [[[11, 21, 12, 22], [13, 23, 14, 24]]]
    stacked = combine_layers("stack", _states())
    assert tuple(stacked.shape) == (1, 2, 2, 2)
    assert stacked[0, 1].tolist() == [[13, 14], [23, 24]]


@pytest.mark.parametrize(("thinking", "tail"), [(True, ""), (False, OFF)])
def test_the_thinking_place_is_filled_by_the_switch(thinking, tail):
    spec = TokenizerSpec(cls="Qwen2Tokenizer", max_length=512, template=QWEN3, enable_thinking=thinking, thinking_off_text=OFF)
    assert render(spec, "a red cube") == f"<|im_start|>user\na red cube<|im_end|>\n<|im_start|>assistant\n{tail}"
    assert template_prefix(spec) == "<|im_start|>user\n"
    assert template_suffix(spec) == f"<|im_end|>\n<|im_start|>assistant\n{tail}"


def _qwen_image() -> te_align.AlignmentProfile:
    return te_align.profile("qwen-image")


def test_a_layer_list_is_an_override_with_its_own_fingerprint_and_checked_indices():
    p = _qwen_image()
    q = p.with_overrides({"qwen.layer": [9, 18, 27]})
    assert q.slot("qwen").encoder.layer == (9, 18, 27)
    assert q.fingerprint() != p.fingerprint()
    assert "layer=9,18,27 (concat)" in repr(q)
    with pytest.raises(ProfileError, match="layer index 29 is outside hidden_states of a 28-layer encoder"):
        p.with_overrides({"qwen.layer": [9, 29]})
    with pytest.raises(ProfileError, match="layer_combine applies to a list of layers"):
        p.with_overrides({"qwen.layer_combine": "stack"})


def test_a_thinking_place_needs_the_switch():
    p = _qwen_image()
    with pytest.raises(ProfileError, match="enable_thinking is not set"):
        p.with_overrides({"qwen.template": QWEN3})
    q = p.with_overrides({"qwen.template": QWEN3, "qwen.enable_thinking": False, "qwen.thinking_off_text": OFF})
    assert render(q.slot("qwen").tokenizer, "x").endswith("assistant\n" + OFF)


def test_profiles_without_the_new_fields_keep_their_fingerprints():
    # the values fingerprint version 1 hashed: adding enable_thinking, thinking_off_text and layer_combine changed none
    assert _qwen_image().fingerprint() == "cc02949d8077a7ed"


# ------------------------------------------------------------------ condition images (edit slots, [slots.X.images])
#: Fingerprints of every bundled profile before the images table existed (e799773): a slot without images
#: hashes exactly what it did.
BEFORE_IMAGES = {
    "anima": "749c21a05bd1d92e", "auraflow": "4e9574a2c45b6b96", "chroma": "6fc0b1b801ce2e84",
    "flux-dev": "22fbd05825cc268d", "flux-schnell": "0457a35dad4626fe", "hidream": "679d3cfbe61cf160",
    "hunyuanimage-2.1": "bee1dfdcdad17f3a", "lumina2": "ead6b791a7fe8939", "pixart-sigma": "62531ac55feb44c1",
    "qwen-image": "cc02949d8077a7ed", "sana": "31c8036359b112a3", "sd15": "9370320943d6c410",
    "sd21": "748fb968e632841f", "sd3-medium": "69729c9c4c664279", "sd35-large": "69729c9c4c664279",
    "sd35-medium": "69729c9c4c664279", "sdxl": "aa85fc557ea00a8c", "wan21": "5d73f379521a6186",
}  # fmt: skip


def test_profiles_without_images_keep_their_fingerprints():
    from te_align.profiles import bundled, bundled_names

    without = [n for n in bundled_names() if all(s.images is None for s in bundled(n).slots)]
    assert set(BEFORE_IMAGES) <= set(without)  # profiles added since have no "before"
    for name in BEFORE_IMAGES:
        assert bundled(name).fingerprint() == BEFORE_IMAGES[name], name
        assert not any(".images." in path for path in bundled(name).behaviour_paths()), name


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("area", "big", "expected an integer"),
        ("area", True, "expected an integer"),
        ("area", -5, "expected a pixel area of at least 784"),
        ("resize", "round_16", "expected one of 'round_32'"),
        ("resample", "box", "expected one of 'lanczos' | 'bicubic' | 'bilinear' | 'nearest'"),
        ("prefix", 3, "expected a string"),
        ("prefix", "Picture {k}: ", "the prefix may hold only the {n} place"),
        ("processor_subfolder", " ", "expected the processor's component name"),
        ("bogus", 1, "unknown key"),
    ],
)
def test_a_bad_image_value_is_one_profile_error_naming_its_key(key, value, message):
    from te_align import _toml as tomllib
    from te_align.profiles import profile_from_dict

    data = tomllib.loads(te_align.profile("qwen-image-edit-2509").to_toml())
    data["slots"]["qwen"]["images"][key] = value
    with pytest.raises(ProfileError, match=re.escape(message)) as err:
        profile_from_dict(data)
    assert err.value.key == f"slots.qwen.images.{key}"
    assert "\n" not in str(err.value)


def test_an_image_override_round_trips_with_its_own_fingerprint():
    import json

    from te_align import _toml as tomllib
    from te_align.profiles import profile_from_dict

    p = te_align.profile("qwen-image-edit-2509")
    q = p.with_overrides({"qwen.images.area": 512 * 512, "slots.qwen.images.resample": "bicubic"})
    assert (q.slot("qwen").images.area, q.slot("qwen").images.resample) == (262144, "bicubic")
    assert q.provenance_of("slots.qwen.images.area").status == "override"
    assert q.fingerprint() != p.fingerprint()
    assert profile_from_dict(tomllib.loads(q.to_toml())) == q
    assert profile_from_dict(json.loads(q.to_json())) == q
    assert p.with_overrides({"qwen.images.area": 147456}).fingerprint() == p.fingerprint()  # the profile's own value
    with pytest.raises(ProfileError, match=r"must be in \[784, 67108864\]") as err:
        p.with_overrides({"qwen.images.area": 0})
    assert err.value.key == "qwen.images.area"
    with pytest.raises(ProfileError, match="unknown override"):  # a text-only profile has no images table
        _qwen_image().with_overrides({"qwen.images.area": 512 * 512})
def test_text_ids_4d_is_zero_time_height_width_and_the_position():
    """FLUX.2's text ids (Flux2Pipeline._prepare_text_ids): (batch, sequence, 4) int64 rows (0, 0, 0, position),
    the same for every prompt, whatever the states' dtype."""
    from te_align.encoding.core import flux2_text_ids

    ids = flux2_text_ids(torch.zeros(2, 3, 5, dtype=torch.bfloat16))
    assert ids.dtype == torch.int64 and ids.shape == (2, 3, 4)
    expected = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2]])
    assert torch.equal(ids[0], expected) and torch.equal(ids[1], expected)


def test_conditioning_unpad_keeps_the_masked_positions_per_prompt():
    """Conditioning.unpad gives one (length_i, width) tensor per prompt: the rows where the mask is set."""
    from te_align.encoding.conditioning import Conditioning

    embeds = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    cond = Conditioning({"prompt_embeds": embeds, "prompt_embeds_mask": mask}, "x", "0" * 16)
    first, second = cond.unpad("prompt_embeds", "prompt_embeds_mask")
    assert torch.equal(first, torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
    assert torch.equal(second, torch.tensor([[6.0, 7.0]]))
    # a bool mask selects the same rows
    cond_b = Conditioning({"prompt_embeds": embeds, "m": mask.bool()}, "x", "0" * 16)
    assert [t.shape[0] for t in cond_b.unpad("prompt_embeds", "m")] == [2, 1]
# ------------------------------------------------------------------ Krea 2 / Ideogram 4 / LTX-2 engine steps
def _qwen_slot(**tokenizer: object) -> te_align.profiles.model.SlotSpec:
    import dataclasses

    slot = _qwen_image().slot("qwen")
    return dataclasses.replace(slot, tokenizer=dataclasses.replace(slot.tokenizer, **tokenizer))


def test_the_suffix_after_padding_goes_behind_the_pad():
    from te_align.encoding.core import tokenize_slot
    from te_align.tiny.tokenizers import qwen2_tokenizer

    tok = qwen2_tokenizer()
    slot = _qwen_slot(padding="max_length", max_length=40, drop_start_tokens=34, tokenize_max_length=None,
                      suffix_after_padding=True)
    ids, mask = tokenize_slot(slot, tok, ["cat"])
    suffix = tok("<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    assert len(suffix) == 5 and ids.shape == (1, 74)
    assert ids[0, -5:].tolist() == suffix and mask[0, -5:].tolist() == [1] * 5
    real = len(tok(render(slot.tokenizer, "cat")[: -len("<|im_end|>\n<|im_start|>assistant\n")])["input_ids"])
    assert mask[0, :real].all() and not mask[0, real:-5].any()
    assert ids[0, real:-5].eq(tok.pad_token_id).all()


def test_real_token_positions_skip_the_padding():
    from te_align.encoding.core import real_token_positions

    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 0, 1, 1, 1]])
    assert real_token_positions(mask).tolist() == [[0, 1, 1, 1, 2], [0, 0, 0, 1, 2]]


def test_the_denoiser_mask_is_the_tokenizer_mask_where_no_pad_stays_visible():
    from te_align.encoding.core import denoiser_mask

    slot = _qwen_slot()
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 1, 1]])
    assert denoiser_mask(slot, mask, torch.float32).tolist() == mask.tolist()


def test_a_prompt_over_the_length_is_refused_when_the_profile_does_not_truncate():
    from te_align.encoding.core import tokenize_slot
    from te_align.errors import EncodingError
    from te_align.tiny.tokenizers import qwen2_tokenizer

    tok = qwen2_tokenizer()
    slot = _qwen_slot(truncation=False, refuse_over_length=True, padding="max_length", padding_side="left",
                      max_length=60, drop_start_tokens=0, tokenize_max_length=None, pad_token_id=0)
    ids, mask = tokenize_slot(slot, tok, ["cat", ""])
    assert ids.shape == (2, 60) and mask[:, -1].all() and not mask[:, 0].any() and ids[:, 0].eq(0).all()
    with pytest.raises(EncodingError, match=r"prompt 1 has .* tokens .* over the 60 .* does not truncate"):
        tokenize_slot(slot, tok, ["cat", "cat " * 60])


def test_decoder_layer_taps_take_the_last_layer_before_the_final_norm():
    from te_align.encoding.core import run_encoder, select_layer
    from te_align.tiny.encoders import qwen3_vl_model
    from te_align.tiny.tokenizers import qwen2_tokenizer

    tok = qwen2_tokenizer()
    enc = qwen3_vl_model(tok, num_hidden_layers=3)
    import dataclasses

    slot = _qwen_slot()
    slot = dataclasses.replace(slot, encoder=dataclasses.replace(
        slot.encoder, layer=(0, 2), layer_combine="stack", layer_taps="decoder_layers", num_layers=3, hidden_size=32))
    ids = torch.tensor([tok("a cat")["input_ids"]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        tapped = select_layer(slot, enc, run_encoder(slot, enc, ids, mask))
        ref = enc(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert torch.equal(tapped[:, :, 0], ref[1])  # decoder layer 0 = hidden_states[1]
    assert not torch.equal(tapped[:, :, 1], ref[3])  # hidden_states[3] is normed, the tap is not
    assert torch.equal(enc.language_model.norm(tapped[:, :, 1]), ref[3])


def test_strip_cleaning():
    spec = TokenizerSpec(cls="GemmaTokenizer", max_length=8, text_cleaning="strip")
    assert render(spec, "  a cat \n") == "a cat"
