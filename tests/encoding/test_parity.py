"""Parity: ``te_align.encode`` equals the official diffusers pipeline's ``encode_prompt``, bit for bit.

For every bundled family whose pipeline exists in the installed diffusers, the real pipeline class is
built with tiny random-weight encoders and real-convention tokenizers (te_align.tiny), and both
encoders run on the same prompt suite. ``torch.equal`` plus equal dtypes is required for every named
tensor. Pipelines are called under ``torch.no_grad()``, as their ``__call__`` runs them (T5 gives
slightly different float results with autograd recording on, so the comparison must fix the mode).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import te_align
from te_align.encoding.core import tokenize_length
from te_align.encoding.text import render
from te_align.errors import EncodingError
from te_align.probe.core import prompt_suite as standard_prompt_suite
from te_align.profiles import AlignmentProfile
from te_align.tiny.fit import fit_profile
from te_align.tiny.pipelines import build_pipeline_for_encoding, missing_pipeline


@dataclass(frozen=True)
class Case:
    """How to call one family's ``encode_prompt`` and name what it returns."""

    profile: str
    family: str  # te_align.tiny family
    call: Callable[[Any, list[str], AlignmentProfile], tuple]
    returns: tuple[str | None, ...]  # output name per returned position (None = not compared)
    #: Where the pipeline returns a tensor in another layout, how ours maps onto it (documented quirks).
    to_pipeline_layout: Callable[[str, torch.Tensor, te_align.encoding.Conditioning], torch.Tensor] | None = None
    #: Constructor arguments of the pipeline besides its text components (Wan 2.2's expert boundary).
    build: tuple[tuple[str, Any], ...] = ()
    #: Edit models: the condition images te_align.encode gets for a batch of n prompts (as the user has them),
    #: or None for text only; ``call`` gives the pipeline the same images as its ``__call__`` prepares them.
    images: Callable[[int], list[Any]] | None = None
    #: The pipeline refuses a prompt past the limit (Ideogram 4: no truncation); te-align must refuse it too.
    refuses_past_limit: bool = False


def _auraflow_layout(key: str, t: torch.Tensor, cond: te_align.encoding.Conditioning) -> torch.Tensor:
    """AuraFlow's encode_prompt returns the mask expanded to the embeddings and flattened to (B, S * D)."""
    if key != "prompt_attention_mask":
        return t
    return t.unsqueeze(-1).expand(cond["prompt_embeds"].shape).reshape(t.shape[0], -1)


def _z_image_layout(key: str, t: torch.Tensor, cond: te_align.encoding.Conditioning) -> Any:
    """Z-Image's encode_prompt returns a list of (length_i, width) tensors, the padding stripped per sample: the
    documented way back from te-align's re-padded tensor and its mask is Conditioning.unpad."""
    return cond.unpad(key, "prompt_embeds_mask") if key == "prompt_embeds" else t


def _t5_len(p: AlignmentProfile, slot: str = "t5") -> int:
    return p.slot(slot).tokenizer.max_length


#: What AnimaTextEncoderStep.encode_prompt returns (a dict), in its order; the negatives are checked separately.
ANIMA_KEYS = ("qwen_prompt_embeds", "qwen_attention_mask", "t5_input_ids", "t5_attention_mask")


def _anima(pipe: Any, prompts: list[str], p: AlignmentProfile, negative: list[str] | None = None) -> tuple:
    """The modular pipeline's text step, called as its __call__ does (CFG on: negatives prepared)."""
    from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep

    out = AnimaTextEncoderStep.encode_prompt(
        pipe, prompts, negative_prompt=negative, prepare_unconditional_embeds=True,
        max_sequence_length=_t5_len(p, "qwen"), device=torch.device("cpu"), dtype=pipe.text_encoder.dtype,
    )  # fmt: skip
    return (*(out[k] for k in ANIMA_KEYS), *(out[f"negative_{k}"] for k in ANIMA_KEYS))


def _image(w: int, h: int, seed: int) -> Any:
    import numpy as np
    from PIL import Image

    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8"))


def _edit_images(n: int) -> list[Any]:
    """One condition image per prompt (sizes and aspect ratios vary), as the user has them."""
    return [_image(48 + 8 * (k % 3), 40 + 12 * (k % 2), k) for k in range(n)]


def _edit_prepared(pipe: Any, images: list[Any]) -> list[Any]:
    """The images as QwenImageEditPipeline.__call__ hands them to encode_prompt: image_processor.resize to
    calculate_dimensions(1024 * 1024, w / h) (pipeline_qwenimage_edit.py:623-624, :661)."""
    import importlib

    module = importlib.import_module(type(pipe).__module__)
    out = []
    for im in images:
        w, h = module.calculate_dimensions(1024 * 1024, im.size[0] / im.size[1])[:2]
        out.append(pipe.image_processor.resize(im, h, w))
    return out


def _sana_instruction() -> list[str]:
    from diffusers import SanaPipeline

    return inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default


def _ideogram4(pipe: Any, prompts: list[str], p: AlignmentProfile) -> tuple:
    """Ideogram 4's packed prompt_embeds cut to the text part (the image part must be zeros), and the text mask read
    from its indicator (LLM_TOKEN_INDICATOR on the real text tokens)."""
    from diffusers.models.transformers.transformer_ideogram4 import LLM_TOKEN_INDICATOR

    n = _t5_len(p, "qwen")
    embeds, _, _, indicator = pipe.encode_prompt(prompts, grid_h=2, grid_w=3, max_sequence_length=n, device="cpu")
    assert embeds.shape[1] == n + 6 and not embeds[:, n:].any()
    return embeds[:, :n], (indicator[:, :n] == LLM_TOKEN_INDICATOR).long()


def _clip_skip_1(pipe: Any) -> Any:
    """The SD pipeline, where its clip_skip path can run: it reads ``text_encoder.text_model.final_layer_norm``, which
    transformers 5's CLIPTextModel no longer has (the layer norm is ``text_encoder.final_layer_norm`` there)."""
    import transformers

    if not hasattr(pipe.text_encoder, "text_model"):
        pytest.skip(f"diffusers' encode_prompt clip_skip path reads text_encoder.text_model.final_layer_norm, which "
                    f"CLIPTextModel of transformers {transformers.__version__} does not have "
                    "(test_nai_penultimate_layer_is_hidden_states_minus_2_through_the_final_norm checks the values)")
    return pipe


CASES: dict[str, Case] = {
    "sd15": Case("sd15", "sd15", lambda pipe, x, p: pipe.encode_prompt(x, "cpu", 1, False), ("prompt_embeds", None)),
    # the NovelAI lineage's clip skip 2 is diffusers' clip_skip=1: hidden_states[-2] through final_layer_norm
    # (pipeline_stable_diffusion.py encode_prompt's clip_skip path)
    "sd15-nai": Case("sd15-nai", "sd15", lambda pipe, x, p: _clip_skip_1(pipe).encode_prompt(x, "cpu", 1, False,
                                                                                            clip_skip=1),
                     ("prompt_embeds", None)),
    "sd21": Case("sd21", "sd21", lambda pipe, x, p: pipe.encode_prompt(x, "cpu", 1, False), ("prompt_embeds", None)),
    "sdxl": Case(
        "sdxl", "sdxl",
        lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", do_classifier_free_guidance=False),
        ("prompt_embeds", None, "pooled_prompt_embeds", None),
    ),
    # Pony's clip skip 2 is SDXL's own penultimate layer: diffusers' SDXL pipeline with clip_skip None (its clip_skip=1
    # would be hidden_states[-3])
    "sdxl-pony": Case(
        "sdxl-pony", "sdxl",
        lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", do_classifier_free_guidance=False),
        ("prompt_embeds", None, "pooled_prompt_embeds", None),
    ),
    **{
        name: Case(
            name, "sd3",
            lambda pipe, x, p: pipe.encode_prompt(
                prompt=x, prompt_2=None, prompt_3=None, device="cpu", do_classifier_free_guidance=False,
                max_sequence_length=_t5_len(p),
            ),
            ("prompt_embeds", None, "pooled_prompt_embeds", None),
        )
        for name in ("sd3-medium", "sd35-large", "sd35-medium")
    },
    **{
        name: Case(
            name, "flux",
            lambda pipe, x, p: pipe.encode_prompt(prompt=x, prompt_2=None, device="cpu", max_sequence_length=_t5_len(p)),
            ("prompt_embeds", "pooled_prompt_embeds", "text_ids"),
        )
        for name in ("flux-dev", "flux-schnell")
    },
    # FLUX.1 Kontext: FluxKontextPipeline.encode_prompt (a copy of FluxPipeline's) against the flux-dev profile
    "flux-kontext": Case(
        "flux-kontext", "flux-kontext",
        lambda pipe, x, p: pipe.encode_prompt(prompt=x, prompt_2=None, device="cpu", max_sequence_length=_t5_len(p)),
        ("prompt_embeds", "pooled_prompt_embeds", "text_ids"),
    ),
    "chroma": Case(
        "chroma", "chroma",
        lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", do_classifier_free_guidance=False, max_sequence_length=_t5_len(p)),
        ("prompt_embeds", "text_ids", "prompt_attention_mask", None, None, None),
    ),
    "pixart-sigma": Case(
        "pixart-sigma", "pixart-sigma",
        lambda pipe, x, p: pipe.encode_prompt(
            x, do_classifier_free_guidance=False, device="cpu", clean_caption=True, max_sequence_length=_t5_len(p)
        ),
        ("prompt_embeds", "prompt_attention_mask", None, None),
    ),
    "auraflow": Case(
        "auraflow", "auraflow",
        lambda pipe, x, p: pipe.encode_prompt(x, do_classifier_free_guidance=False, device="cpu", max_sequence_length=_t5_len(p)),
        ("prompt_embeds", "prompt_attention_mask", None, None),
        _auraflow_layout,
    ),
    "lumina2": Case(
        "lumina2", "lumina2",
        lambda pipe, x, p: pipe.encode_prompt(
            x, do_classifier_free_guidance=False, device="cpu", max_sequence_length=_t5_len(p, "gemma")
        ),
        ("prompt_embeds", "prompt_attention_mask", None, None),
    ),
    "sana": Case(
        "sana", "sana",
        lambda pipe, x, p: pipe.encode_prompt(
            x, do_classifier_free_guidance=False, device="cpu", max_sequence_length=_t5_len(p, "gemma"),
            complex_human_instruction=_sana_instruction(),
        ),
        ("prompt_embeds", "prompt_attention_mask", None, None),
    ),
    "qwen-image": Case(
        "qwen-image", "qwen-image",
        lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", max_sequence_length=_t5_len(p, "qwen")),
        ("prompt_embeds", "prompt_embeds_mask"),
    ),
    # Qwen-Image-Edit: one condition image per prompt; encode_prompt(prompts, image=[one per prompt]) runs the batch
    # in one processor call (each text's <|image_pad|> takes the next image), as te_align.encode does
    "qwen-image-edit": Case(
        "qwen-image-edit", "qwen-image-edit",
        lambda pipe, x, p: pipe.encode_prompt(x, image=_edit_prepared(pipe, _edit_images(len(x))), device="cpu"),
        ("prompt_embeds", "prompt_embeds_mask"),
        images=_edit_images,
    ),
    # Qwen-Image-Edit-2509 / 2511 text only: QwenImageEditPlusPipeline.encode_prompt with image=None writes no
    # "Picture N:" prefix (pipeline_qwenimage_edit_plus.py:240-247); 2511's profile is the same behaviour
    "qwen-image-edit-2509": Case(
        "qwen-image-edit-2509", "qwen-image-edit-plus",
        lambda pipe, x, p: pipe.encode_prompt(x, image=None, device="cpu"),
        ("prompt_embeds", "prompt_embeds_mask"),
    ),
    "hunyuanimage-2.1": Case(
        "hunyuanimage-2.1", "hunyuanimage",
        lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", batch_size=len(x)),
        ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_mask_2"),
    ),
    "hidream": Case(
        "hidream", "hidream",
        lambda pipe, x, p: pipe.encode_prompt(
            prompt=x, prompt_2=None, prompt_3=None, prompt_4=None, device="cpu", do_classifier_free_guidance=False,
            max_sequence_length=_t5_len(p),
        ),
        ("prompt_embeds_t5", None, "prompt_embeds_llama3", None, "pooled_prompt_embeds", None),
    ),
    "anima": Case("anima", "anima", _anima, (*ANIMA_KEYS, None, None, None, None)),
    **{
        name: Case(
            profile, "wan21",
            lambda pipe, x, p: pipe.encode_prompt(
                x, do_classifier_free_guidance=False, device="cpu", max_sequence_length=_t5_len(p)
            ),
            ("prompt_embeds", None),
            build=build,
        )
        # Wan 2.2 A14B: WanPipeline built with a two-expert boundary (0.875, the T2V-A14B boundary of the Wan 2.2
        # reference config, not read here: any value shows it); encode_prompt reads neither it nor transformer_2
        # (pipeline_wan.py:158-279), so the Wan 2.2 repo ids are aliases of the wan21 profile
        for name, profile, build in (("wan21", "wan21", ()), ("wan22", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", (("boundary_ratio", 0.875),)))
    },
    "flux2-dev": Case(
        "flux2-dev", "flux2",
        lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", max_sequence_length=_t5_len(p, "mistral")),
        ("prompt_embeds", "text_ids"),
    ),
    **{
        name: Case(
            name, "flux2-klein",
            lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", max_sequence_length=_t5_len(p, "qwen3")),
            ("prompt_embeds", "text_ids"),
        )
        for name in ("flux2-klein-4b", "flux2-klein-9b")
    },
    "z-image": Case(
        "z-image", "z-image",
        lambda pipe, x, p: pipe.encode_prompt(
            list(x), device="cpu", do_classifier_free_guidance=False, max_sequence_length=_t5_len(p, "qwen3")
        ),  # a copy: ZImagePipeline._encode_prompt writes the chat-templated text back into the list it is given
        ("prompt_embeds", None),
        _z_image_layout,
    ),
    "krea2": Case(
        "krea2", "krea2",
        lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", max_sequence_length=_t5_len(p, "qwen")),
        ("prompt_embeds", "prompt_embeds_mask"),
    ),
    "ideogram4": Case("ideogram4", "ideogram4", _ideogram4, ("prompt_embeds", "prompt_attention_mask"), refuses_past_limit=True),
    "ltx2": Case(
        "ltx2", "ltx2",
        lambda pipe, x, p: pipe.encode_prompt(
            x, do_classifier_free_guidance=False, device="cpu", max_sequence_length=_t5_len(p, "gemma")
        ),
        ("prompt_embeds", "prompt_attention_mask", None, None),
    ),
}  # fmt: skip


def _setup(name: str) -> tuple[Any, AlignmentProfile]:
    reason = missing_pipeline(CASES[name].family)  # e.g. diffusers 0.32 (sd-scripts' pin) has no QwenImagePipeline
    if reason:
        pytest.skip(reason)
    return _built(name)


@functools.cache
def _built(name: str) -> tuple[Any, AlignmentProfile]:
    case = CASES[name]
    pipe = build_pipeline_for_encoding(case.family, **dict(case.build))
    return pipe, fit_profile(te_align.profile(case.profile), pipe)


def prompt_suite(p: AlignmentProfile, pipe: Any) -> dict[str, list[str]]:
    """The standard prompt suite (te_align.probe.core), checking its at-limit prompts are exact."""
    tokenizers = {s.tokenizer_subfolder: getattr(pipe, s.tokenizer_subfolder) for s in p.slots}
    suite = standard_prompt_suite(p, tokenizers)
    for slot in {p.slots[0].name: p.slots[0], p.slots[-1].name: p.slots[-1]}.values():
        (text,) = suite[f"at limit ({slot.name})"]
        tok = tokenizers[slot.tokenizer_subfolder]
        rendered = render(slot.tokenizer, text)
        n = len(tok(rendered, add_special_tokens=slot.tokenizer.add_special_tokens)["input_ids"])
        assert n == tokenize_length(slot, tok), f"at-limit prompt for {slot.name} has {n} tokens"
    return suite


def _pipeline_outputs(name: str, prompts: list[str]) -> dict[str, torch.Tensor]:
    pipe, p = _setup(name)
    case = CASES[name]
    with torch.no_grad():
        result = case.call(pipe, prompts, p)
    assert len(result) == len(case.returns), f"{name}: encode_prompt returned {len(result)} values"
    return {n: t for n, t in zip(case.returns, result, strict=True) if n is not None}


def _assert_equal(name: str, label: str, ref: dict[str, torch.Tensor], ours: te_align.encoding.Conditioning) -> None:
    assert list(ours) == [n for n in CASES[name].returns if n is not None] or set(ref) <= set(ours), (
        f"{name}: outputs {list(ours)} vs pipeline {list(ref)}"
    )
    layout = CASES[name].to_pipeline_layout
    for key, expected in ref.items():
        got = layout(key, ours[key], ours) if layout else ours[key]
        if isinstance(expected, list):  # one tensor per prompt (Z-Image): every element equal
            assert isinstance(got, list) and len(got) == len(expected), f"{name} [{label}] {key}: list lengths differ"
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                assert g.dtype == e.dtype and g.shape == e.shape, f"{name} [{label}] {key}[{i}]: {g.dtype} {tuple(g.shape)} != {e.dtype} {tuple(e.shape)}"
                assert torch.equal(g, e), f"{name} [{label}] {key}[{i}]: values differ"
            continue
        if expected is None:
            # Qwen-Image returns no mask when every position is real; ours must then be all ones.
            assert bool(got.all()), f"{name} [{label}] {key}: the pipeline says no masking is needed but ours masks"
            continue
        assert got.dtype == expected.dtype, f"{name} [{label}] {key}: dtype {got.dtype} != {expected.dtype}"
        assert got.shape == expected.shape, f"{name} [{label}] {key}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
        if not torch.equal(got, expected):
            diff = (got.double() - expected.double()).abs().max().item()
            raise AssertionError(f"{name} [{label}] {key}: values differ (max abs diff {diff:.3g})")


@pytest.mark.parametrize("name", sorted(CASES))
def test_encode_equals_pipeline_encode_prompt(name):
    pipe, p = _setup(name)
    for label, prompts in prompt_suite(p, pipe).items():
        if CASES[name].refuses_past_limit and label == "far over limit":
            with pytest.raises(ValueError, match="exceeds max_sequence_length"):
                _pipeline_outputs(name, prompts)
            with pytest.raises(te_align.errors.EncodingError, match="does not truncate"):
                te_align.encode(p, prompts, pipeline=pipe)
            continue
        ref = _pipeline_outputs(name, prompts)
        images = CASES[name].images
        ours = te_align.encode(p, prompts, pipeline=pipe, images=images(len(prompts)) if images else None)
        _assert_equal(name, label, ref, ours)


def test_wan22_case_runs_the_two_expert_pipeline():
    pipe, p = _setup("wan22")
    assert pipe.config.boundary_ratio == 0.875 and p.name == "wan21"


def test_flux_schnell_profile_differs_from_pipeline_default_and_matches_it_at_256():
    """The schnell profile deliberately uses 256 T5 tokens; the pipeline default is 512."""
    pipe, p = _setup("flux-schnell")
    assert p.slot("t5").tokenizer.max_length == 256
    prompts = ["a cat", "far " * 600]
    with torch.no_grad():
        default = pipe.encode_prompt(prompt=prompts, prompt_2=None, device="cpu")
    ours = te_align.encode(p, prompts, pipeline=pipe)
    assert default[0].shape[1] == 512 and ours["prompt_embeds"].shape[1] == 256
    _assert_equal("flux-schnell", "256", _pipeline_outputs("flux-schnell", prompts), ours)


def test_anima_negative_and_uncond_equal_the_pipeline():
    """Anima prepares the unconditional branch itself (CFG on by default): "" or the negative prompt
    through the same two tokenizers and Qwen3; a batch of "" hits the zero-length Qwen case."""
    pipe, p = _setup("anima")
    for prompts, negative in ((["a cat", "far " * 600], None), (["a cat", "x"], ["blurry, low quality", ""]), (["", ""], None)):
        with torch.no_grad():
            result = _anima(pipe, prompts, p, negative)
        ref = dict(zip(ANIMA_KEYS, result[len(ANIMA_KEYS) :], strict=True))
        neg = negative or [""] * len(prompts)
        _assert_equal("anima", f"negative {neg!r}", ref, te_align.encode(p, neg, pipeline=pipe, negative=True))
        if negative is None:
            _assert_equal("anima", "uncond", ref, te_align.encoding.encode_uncond(p, len(prompts), pipeline=pipe))
    # the empty batch: one Qwen position, id 0 (not the pad token), mask 0, zero states
    cond = te_align.encode(p, ["", ""], pipeline=pipe)
    assert cond["qwen_prompt_embeds"].shape[1] == 1 and not cond["qwen_prompt_embeds"].any()
    assert cond["qwen_attention_mask"].tolist() == [[0], [0]]
    assert cond["t5_input_ids"].tolist() == [[1], [1]] and cond["t5_attention_mask"].tolist() == [[1], [1]]


#: Prompts whose quoted text reaches HunyuanImage's ByT5 slot (extract_glyph_text: '...', "...", ‘...’, “...”).
GLYPH_PROMPTS: dict[str, list[str]] = {
    "double quotes": ['a neon sign that says "OPEN 24/7"'],
    "single quotes": ["a poster reading 'SALE 50%' in red"],
    "chinese quotes": ["招牌上写着“欢迎光临”", "a label with ‘café crème’ on it"],
    "multiple quotes": ['"A" then \'b\' then “中文” then ‘d’ then "E"'],
    "apostrophes": ["the cat's toy and the dog's bone"],
    "empty quotes": ['a blank sign ""'],
    "over 128 bytes": ['a banner "' + "a long line of text, " * 12 + '"'],
    "mixed batch": ["a cat", 'a sign "HELLO"', "", "it's a 'x'", "“标题” on top", "far " * 600],
    "glyph only": ['"x"'],
}


def test_hunyuanimage_glyph_prompts_equal_the_pipeline():
    """HunyuanImage encodes the quoted text of each prompt with ByT5, one prompt at a time; prompts
    without quoted text get zeros and a zero mask, also inside a batch with glyph text."""
    pipe, p = _setup("hunyuanimage-2.1")
    for label, prompts in GLYPH_PROMPTS.items():
        ref = _pipeline_outputs("hunyuanimage-2.1", prompts)
        ours = te_align.encode(p, prompts, pipeline=pipe)
        _assert_equal("hunyuanimage-2.1", label, ref, ours)
    glyph = te_align.encode(p, GLYPH_PROMPTS["mixed batch"], pipeline=pipe)
    assert glyph["prompt_embeds_mask_2"].any(dim=1).tolist() == [False, True, False, True, True, False]
    assert not glyph["prompt_embeds_2"][[0, 2, 5]].any()
    # the empty prompt (negative / dropped caption) is the chat template with no text and zero ByT5
    uncond = te_align.encode(p, [""], pipeline=pipe, negative=True)
    _assert_equal("hunyuanimage-2.1", "negative ''", _pipeline_outputs("hunyuanimage-2.1", [""]), uncond)


@pytest.mark.parametrize(("profile", "family", "n_images"), [
    ("qwen-image-edit", "qwen-image-edit", 1),
    ("qwen-image-edit-2509", "qwen-image-edit-plus", 1),
    ("qwen-image-edit-2509", "qwen-image-edit-plus", 2),
    ("qwen-image-edit-2511", "qwen-image-edit-plus", 2),
])
def test_qwen_image_edit_with_images_equals_the_pipeline(profile, family, n_images):
    """encode_prompt is called with the condition image(s) as __call__ prepares them: resized with the pipeline's
    own image_processor.resize to its calculate_dimensions(area, w / h) (1024² for Edit, CONDITION_IMAGE_SIZE 384²
    for Plus); te_align.encode gets the images as the user has them and resizes by the profile. One prompt per
    call: the pipelines give every prompt of a batch the same images, which their processor accepts for one."""
    import importlib

    reason = missing_pipeline(family)
    if reason:
        pytest.skip(reason)
    pipe = build_pipeline_for_encoding(family)
    p = fit_profile(te_align.profile(profile), pipe)
    module = importlib.import_module(type(pipe).__module__)
    area = getattr(module, "CONDITION_IMAGE_SIZE", 1024 * 1024)
    images = [_image(64, 48, 0), _image(40, 72, 1)][:n_images]
    prepared = []
    for im in images:
        w, h = module.calculate_dimensions(area, im.size[0] / im.size[1])[:2]
        prepared.append(pipe.image_processor.resize(im, h, w))
    tok = pipe.tokenizer
    for label, prompt in {"short": "make it red", "empty": "", "long": "a red cube " * 60, "past the limit": "far " * 1200}.items():
        with torch.no_grad():
            ref = pipe.encode_prompt([prompt], image=prepared if n_images > 1 else prepared[0], device="cpu")
        ours = te_align.encode(p, [prompt], pipeline=pipe, images=[images])
        assert ours["prompt_embeds"].dtype == ref[0].dtype and torch.equal(ours["prompt_embeds"], ref[0]), f"{profile} [{label}]"
        if ref[1] is None:
            assert bool(ours["prompt_embeds_mask"].all())
        else:
            assert torch.equal(ours["prompt_embeds_mask"], ref[1])
    assert len(tok("far " * 1200)["input_ids"]) > p.slot("qwen").tokenizer.max_length  # past the declared 1024, kept whole


def test_qwen_image_edit_plus_batch_is_each_prompt_alone_padded_to_the_longest():
    """QwenImageEditPlusPipeline has no batch of image prompts: __call__ refuses batch_size > 1
    (pipeline_qwenimage_edit_plus.py:681-686) and encode_prompt writes every image's "Picture N:" before every
    prompt, so its processor refuses two prompts with one image (it counts <|image_pad|>). te_align.encode runs a
    batch one prompt at a time, as the pipeline asks, each sample equal to encode_prompt([prompt], image=its
    images), re-padded with zeros (mask 0) to the batch's longest."""
    import importlib

    reason = missing_pipeline("qwen-image-edit-plus")
    if reason:
        pytest.skip(reason)
    pipe = build_pipeline_for_encoding("qwen-image-edit-plus")
    p = fit_profile(te_align.profile("qwen-image-edit-2511"), pipe)
    module = importlib.import_module(type(pipe).__module__)
    per_prompt = [[_image(64, 48, 0)], [_image(40, 72, 1), _image(56, 56, 2)], [_image(48, 48, 3)]]
    prompts = ["make it red", "put the cat from picture 2 on the sofa of picture 1 " * 3, ""]
    refs = []
    with torch.no_grad():
        for prompt, images in zip(prompts, per_prompt, strict=True):
            prepared = []
            for im in images:
                w, h = module.calculate_dimensions(module.CONDITION_IMAGE_SIZE, im.size[0] / im.size[1])[:2]
                prepared.append(pipe.image_processor.resize(im, h, w))
            refs.append(pipe.encode_prompt([prompt], image=prepared, device="cpu")[0])
        # the pipeline's own batch refuses: transformers 5.23's processor with a ValueError naming image_pad, 5.12's
        # (the floor) by running out of images (StopIteration)
        with pytest.raises((ValueError, StopIteration)) as refused:
            pipe.encode_prompt(prompts[:2], image=prepared, device="cpu")
        assert refused.type is StopIteration or "image_pad" in str(refused.value)
    ours = te_align.encode(p, prompts, pipeline=pipe, images=per_prompt)
    longest = max(r.shape[1] for r in refs)
    assert ours["prompt_embeds"].shape == (3, longest, refs[0].shape[2])
    for i, ref in enumerate(refs):
        n = ref.shape[1]
        assert torch.equal(ours["prompt_embeds"][i, :n], ref[0]), i
        assert not ours["prompt_embeds"][i, n:].any() and ours["prompt_embeds"].dtype == ref.dtype
        assert ours["prompt_embeds_mask"][i].tolist() == [1] * n + [0] * (longest - n)


def test_qwen_image_edit_refuses_text_only_and_a_second_image_as_its_pipeline_does():
    """QwenImageEditPipeline's template holds one image's place: its processor refuses text only and a text
    with one <|image_pad|> given two images; te_align.encode refuses both in one EncodingError naming the rule."""
    reason = missing_pipeline("qwen-image-edit")
    if reason:
        pytest.skip(reason)
    pipe, p = _setup("qwen-image-edit")
    with torch.no_grad(), pytest.raises(ValueError, match="image_pad"):
        pipe.encode_prompt(["make it red"], image=None, device="cpu")
    with pytest.raises(EncodingError, match="needs one condition image per prompt"):
        te_align.encode(p, ["make it red"], pipeline=pipe)
    with pytest.raises(EncodingError, match="exactly one condition image per prompt"):
        te_align.encode(p, ["make it red"], pipeline=pipe, images=[_edit_images(2)])
    with pytest.raises(EncodingError, match="caption dropout"):
        te_align.encode(p, ["make it red"], pipeline=pipe, images=_edit_images(1), drop=[True])
#: Profiles whose template is a chat template rendered by the tokenizer: (case name, slot, apply_chat_template kwargs).
CHAT_TEMPLATES: dict[str, tuple[str, dict[str, Any]]] = {
    "flux2-klein-4b": ("qwen3", {"add_generation_prompt": True, "enable_thinking": False}),
    "flux2-klein-9b": ("qwen3", {"add_generation_prompt": True, "enable_thinking": False}),
    "z-image": ("qwen3", {"add_generation_prompt": True, "enable_thinking": True}),
}


@pytest.mark.parametrize("name", sorted(CHAT_TEMPLATES))
def test_the_template_literal_is_the_real_chat_template_rendering(name):
    """The profile's template text equals what the tokenizer's real Jinja chat template renders, as the pipeline
    calls it, for plain, empty and template-like prompts."""
    pipe, p = _setup(name)
    slot_name, kwargs = CHAT_TEMPLATES[name]
    spec = p.slot(slot_name).tokenizer
    tok = getattr(pipe, p.slot(slot_name).tokenizer_subfolder)
    for prompt in ("a red cat", "", "two\nlines <think> x </think>", "far " * 40):
        real = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, **kwargs)
        assert render(spec, prompt) == real
        assert render(spec, prompt, negative=True) == real


def test_klein_at_the_training_script_layers_equals_the_pipeline_called_with_them():
    """diffusers' klein training script taps hidden layers (10, 20, 30) (its --text_encoder_out_layers default);
    the profile overridden to them equals Flux2KleinPipeline.encode_prompt called with them, and differs from the
    pipeline's own (9, 18, 27)."""
    pipe, p = _setup("flux2-klein-4b")
    q = p.with_overrides({"qwen3.layer": [10, 20, 30]})
    prompts = ["a cat", "far " * 600, ""]
    with torch.no_grad():
        ref = pipe.encode_prompt(prompts, device="cpu", text_encoder_out_layers=(10, 20, 30))
    ours = te_align.encode(q, prompts, pipeline=pipe)
    assert torch.equal(ours["prompt_embeds"], ref[0]) and torch.equal(ours["text_ids"], ref[1])
    default = te_align.encode(p, prompts, pipeline=pipe)
    assert default["prompt_embeds"].shape == ours["prompt_embeds"].shape
    assert not torch.equal(default["prompt_embeds"], ours["prompt_embeds"])
    # each third of the width is one tapped layer: none of (9, 18, 27) equals any of (10, 20, 30)
    w = pipe.text_encoder.config.hidden_size
    for k in range(3):
        assert not torch.equal(default["prompt_embeds"][..., k * w : (k + 1) * w], ours["prompt_embeds"][..., k * w : (k + 1) * w])


def test_z_image_negative_is_the_empty_prompt_through_the_template():
    """ZImagePipeline.encode_prompt with CFG and no negative prompt encodes "" per prompt (thinking on, same template);
    a given negative prompt goes the same way. Both equal te-align's negative encoding, element for element."""
    pipe, p = _setup("z-image")
    for prompts, negative in ((["a cat", "far " * 600], None), (["a cat", "x"], ["blurry, low quality", ""])):
        with torch.no_grad():
            _, neg = pipe.encode_prompt(list(prompts), device="cpu", negative_prompt=None if negative is None else list(negative))
        ours = te_align.encode(p, negative or [""] * len(prompts), pipeline=pipe, negative=True)
        _assert_equal("z-image", f"negative {negative!r}", {"prompt_embeds": neg}, ours)


def test_flux2_dev_img_tokens_are_dropped_as_the_pipeline_drops_them():
    """Flux2Pipeline's format_input removes "[IMG]" from each prompt before the chat template (so the Pixtral
    processor's image-token count cannot change under truncation); te-align's drop_img_tokens equals it, also past
    the limit, and the prompt encodes as the same prompt written without "[IMG]"."""
    pipe, p = _setup("flux2-dev")
    prompts = ["[IMG]a cat [IMG] on a mat[IMG]", "[IMG]", "[IMG][IMG] " + "far " * 600, "[INST] x [/INST]"]
    ref = _pipeline_outputs("flux2-dev", prompts)
    ours = te_align.encode(p, prompts, pipeline=pipe)
    _assert_equal("flux2-dev", "[IMG] prompts", ref, ours)
    plain = te_align.encode(p, [x.replace("[IMG]", "") for x in prompts], pipeline=pipe)
    assert torch.equal(plain["prompt_embeds"], ours["prompt_embeds"])


def test_flux2_dev_template_literal_is_the_chat_template_rendering():
    """The profile's template with FLUX.2's system message equals what the tokenizer's chat template renders for
    the conversation Flux2Pipeline builds (format_input: the system message and the prompt as text blocks, no
    generation prompt). The template rendered is Mistral-Small-3.1-24B-Instruct-2503's own (the processor FLUX.2 [dev]
    ships), shipped verbatim from llama.cpp's copy of it."""
    pipe, p = _setup("flux2-dev")  # skips first where diffusers has no FLUX.2 (sd-scripts pins 0.32)
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    from te_align.tiny.tokenizers import mistral_small_chat_template

    template = mistral_small_chat_template()
    # the copy is verbatim: ggml-org/llama.cpp@9190da2 models/templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja
    assert (len(template), hashlib.sha256(template.encode()).hexdigest()[:16]) == (6660, "773c8c8c2ffb59c8")
    assert pipe.tokenizer.chat_template == template
    spec = p.slot("mistral").tokenizer
    assert spec.system_prompt == pipe.system_message
    for prompt in ("a red cat", "", "two\nlines", "far " * 40):
        (conversation,) = format_input([prompt], system_message=pipe.system_message)
        real = pipe.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
        assert render(spec, prompt) == real
    ids = pipe.tokenizer(render(spec, "a cat"), add_special_tokens=False)["input_ids"]
    assert ids[:2] == [1, 17] and ids[-1] == 4  # <s> [SYSTEM_PROMPT] ... [/INST], one BOS


def test_flux2_dev_trainer_system_message_alternative_differs():
    """OneTrainer's and SimpleTuner's system message (a space for the newline) is an official alternative; the
    profile overridden to it encodes differently from Flux2Pipeline."""
    pipe, p = _setup("flux2-dev")
    (alt,) = [a for key, pv in p.provenance if key == "slots.mistral.tokenizer.system_prompt" for a in pv.alternatives]
    q = p.with_overrides({"mistral.system_prompt": alt.value})
    assert alt.value == pipe.system_message.replace("\n", " ")
    a, b = te_align.encode(p, ["a cat"], pipeline=pipe), te_align.encode(q, ["a cat"], pipeline=pipe)
    assert not torch.equal(a["prompt_embeds"], b["prompt_embeds"])
def test_ltx2_stripped_prompts_negatives_and_uncond_equal_the_pipeline():
    """LTX-2 strips every prompt (the negative too) before tokenizing; with guidance on a missing negative prompt
    is "" through the same function, which te-align's unconditional branch must equal."""
    pipe, p = _setup("ltx2")
    n = _t5_len(p, "gemma")
    prompts, negative = ["  a cat on a mat \n", "\ta dog", " ", "x"], ["  blurry, low quality ", "", "\n", "jpeg"]
    for neg in (negative, None):
        with torch.no_grad():
            result = pipe.encode_prompt(prompts, neg, device="cpu", max_sequence_length=n)
        names = ("prompt_embeds", "prompt_attention_mask")
        _assert_equal("ltx2", "stripped", dict(zip(names, result[:2], strict=True)), te_align.encode(p, prompts, pipeline=pipe))
        ref_neg = dict(zip(names, result[2:], strict=True))
        if neg is None:
            _assert_equal("ltx2", "uncond", ref_neg, te_align.encoding.encode_uncond(p, len(prompts), pipeline=pipe))
        else:
            _assert_equal("ltx2", "negative", ref_neg, te_align.encode(p, neg, pipeline=pipe, negative=True))
    # the stripped text is what is tokenized: "  a cat on a mat \n" equals "a cat on a mat", whitespace-only equals ""
    same = te_align.encode(p, ["a cat on a mat", "a dog", "", "x"], pipeline=pipe)
    assert torch.equal(same["prompt_embeds"], te_align.encode(p, prompts, pipeline=pipe)["prompt_embeds"])
    # the pipeline forces left padding on its tokenizer; te-align pads left from the profile, whatever the tokenizer says
    pipe.tokenizer.padding_side = "right"
    try:
        ours = te_align.encode(p, prompts, pipeline=pipe)
    finally:
        pipe.tokenizer.padding_side = "left"
    assert torch.equal(ours["prompt_embeds"], same["prompt_embeds"]) and ours["prompt_attention_mask"][:, -1].all()


def test_nai_penultimate_layer_is_hidden_states_minus_2_through_the_final_norm():
    """sd15-nai by value, in any transformers: what diffusers' clip_skip=1, sd-scripts' clip_skip 2 and ComfyUI's
    CLIPSetLastLayer -2 compute for SD 1.x, the penultimate hidden state through CLIP's final layer norm (NovelAI's
    recipe); and it is not sd15's last_hidden_state."""
    pipe, p = _setup("sd15-nai")
    prompts = ["a red dress", "hatsune miku, red dress, long hair, twintails"]
    ids = pipe.tokenizer(prompts, padding="max_length", max_length=pipe.tokenizer.model_max_length, truncation=True,
                         return_tensors="pt").input_ids
    enc = pipe.text_encoder
    norm = enc.text_model.final_layer_norm if hasattr(enc, "text_model") else enc.final_layer_norm
    with torch.no_grad():
        out = enc(ids, output_hidden_states=True)
        want = norm(out.hidden_states[-2])
    got = te_align.encode(p, prompts, pipeline=pipe)["prompt_embeds"]
    assert got.dtype == want.dtype and got.shape == want.shape == (2, 77, enc.config.hidden_size)
    assert torch.equal(got, want)
    last = te_align.encode(fit_profile(te_align.profile("sd15"), pipe), prompts, pipeline=pipe)["prompt_embeds"]
    assert torch.equal(last, out.last_hidden_state) and not torch.equal(last, got)
