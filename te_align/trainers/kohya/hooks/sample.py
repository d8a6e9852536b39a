"""Sample images during kohya-ss/sd-scripts training, conditioned by the profile as training is.

Every sample path of sd-scripts 48d368f and how it encodes the prompts:

* SD1.x/2.x (``train_network.py``, ``train_db.py``, ``fine_tune.py``, ``train_textual_inversion.py``):
  ``library/train_util.py:6250 sample_images`` -> ``sample_images_common`` (:6360) builds
  ``StableDiffusionLongPromptWeightingPipeline``; its ``_encode_prompt``
  (``library/lpw_stable_diffusion.py:561-618``) calls the module's own ``get_weighted_text_embeddings``
  (:270-402): the tokenizer directly, up to 3 chunks (``max_embeddings_multiples=3``, whatever
  ``--max_token_length``), ``--clip_skip``, EOS padding, weights with the mean restored. **Hooked
  here** (:func:`lpw_embeddings_wrapper`).
* SDXL (``sdxl_train*.py``): ``library/sdxl_train_util.py:380 sample_images`` ->
  ``sample_images_common`` with ``SdxlStableDiffusionLongPromptWeightingPipeline``, whose
  ``__call__`` encodes through the strategies' weighted path
  (``library/sdxl_lpw_stable_diffusion.py:839-852``: ``tokenize_with_weights`` +
  ``encode_tokens_with_weights``), hooked in :mod:`te_align.trainers.kohya.hooks.weights`. The module's
  ``get_weighted_text_embeddings`` (:296) is not called by any sample path.
* Both pipelines' ``__call__`` turn a missing negative prompt (``None``) into ``""``
  (``lpw_stable_diffusion.py:590-591``, ``sdxl_lpw_stable_diffusion.py:849``). Where the profile's
  ``empty_prompt`` is ``"zeros"`` (SDXL: ``force_zeros_for_empty_prompt``) the official pipeline uses
  zero embeddings for a missing negative prompt; :func:`pipeline_call_wrapper` marks it
  (:data:`MISSING_NEGATIVE`) so the hooked encoding returns zeros. An explicit ``""`` is encoded, as
  officially.
* Through the hooked ``tokenize`` + ``encode_tokens`` already (no code of their own): Flux
  ``library/flux_train_utils.py:139 sample_image_inference`` (:198-210), SD3
  ``library/sd3_train_utils.py:473`` (:526-538), Lumina 2 ``library/lumina_train_util.py:249``
  (:284-358, negatives with ``is_negative=True``), Anima ``library/anima_train_utils.py:466 _sample_image_inference``
  (:510-513), HunyuanImage ``hunyuan_image_train_network.py:147`` (:200-215); and the sample-prompt
  TE-output caches of ``flux_train_network.py:268``, ``sd3_train_network.py:246``,
  ``lumina_train_network.py:175``, ``anima_train_network.py:201``,
  ``hunyuan_image_train_network.py:483`` (covered where that architecture is hooked).

The hooked SD1/2 embeddings take training's profile, hidden layer, and chunk setting (the tokenize
strategy's ``--max_token_length``: n chunks of 77, else 77-token truncation), and apply the prompt
weights with :mod:`te_align.encoding.weights` by the lpw pipeline's formula.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from te_align._lazy import lazy_module
from te_align.hooks.base import mark_wrapper
from te_align.trainers.kohya.hooks import slots
from te_align.trainers.kohya.hooks.run import (
    RUN,
    chunk_options,
    profile_for,
    tokenize_strategy,
    with_clip_skip,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedTokenizerBase

    from te_align.encoding import weights as _weights
    from te_align.trainers.kohya.hooks.archs import Arch
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _weights = lazy_module("te_align.encoding.weights")


class LpwPipeline(Protocol):
    """What the hooked embeddings read of sd-scripts' SD1/2 lpw pipeline (``pipe``)."""

    tokenizer: PreTrainedTokenizerBase
    text_encoder: torch.nn.Module


class MissingNegative(str):
    """A negative prompt that was not given: the text ``""``, but truthy, so sd-scripts'
    ``negative_prompt or ""`` hands this object (not a fresh ``""``) to the hooked encoding."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "MISSING_NEGATIVE"


MISSING_NEGATIVE = MissingNegative("")


def pipeline_call_wrapper(arch: Arch, original: Callable[..., object]) -> Callable[..., object]:
    """The lpw pipeline's ``__call__``: a missing negative prompt is marked where the profile makes it zeros."""

    def __call__(
        self: object,
        prompt: str | Sequence[str],
        negative_prompt: str | Sequence[str] | None = None,
        *args: object,
        **kwargs: object,
    ) -> object:
        if negative_prompt is None:
            p = profile_for(arch.name, tokenize_strategy() or self)
            if p.empty_prompt == "zeros":
                RUN.once(
                    f"sample:zeros:{arch.name}",
                    "te-align: sample images: a missing negative prompt becomes zero embeddings (profile %s empty_prompt "
                    "= zeros, as the official pipeline); sd-scripts would encode \"\"", p.name,
                )
                negative_prompt = MISSING_NEGATIVE
        return original(self, prompt, negative_prompt, *args, **kwargs)

    return mark_wrapper(__call__, original)


def lpw_embeddings(
    arch: Arch,
    pipe: LpwPipeline,
    prompt: str | Sequence[str],
    uncond_prompt: str | Sequence[str] | None = None,
    max_embeddings_multiples: int | None = 3,
    no_boseos_middle: bool | None = False,
    skip_parsing: bool | None = False,
    skip_weighting: bool | None = False,
    clip_skip: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``get_weighted_text_embeddings`` of the SD1/2 lpw pipeline (``arch``: sd), by the profile."""

    strategy = tokenize_strategy()
    p = with_clip_skip(profile_for(arch.name, strategy or pipe), clip_skip)
    slot = p.slots[0]
    tokenizer = getattr(strategy, "tokenizer", None) or pipe.tokenizer
    opts = chunk_options(arch.chunkable, strategy)
    chunks = opts.long_prompt_chunks
    RUN.once(
        "sample:sd",
        "te-align: sample images (SD lpw pipeline) follow profile %s as training does: layer %s%s, %s (sd-scripts samples "
        "with up to %s chunks whatever --max_token_length); prompt weights applied as the lpw pipeline does "
        "(library/lpw_stable_diffusion.py:389-398: hidden x weight, rescaled to the unweighted mean)%s",
        p.name, slot.encoder.layer, " + final norm" if slot.encoder.final_layer_norm else "",
        f"{chunks} chunks of 77" if chunks else "77-token truncation", max_embeddings_multiples,
        "" if clip_skip in (None, 1) else f"; --clip_skip {clip_skip} as in training",
    )
    parse = not skip_parsing
    weigh = parse and not skip_weighting

    def embed(texts: list[str]) -> torch.Tensor:
        plain = [str(t) for t in texts]
        ids, mask, weights = _weights.tokenize_slot_weighted(
            slot, tokenizer, plain, options=opts, parse=parse
        )
        hidden = slots.slot_encode(p, slot.name, pipe.text_encoder, ids, mask).hidden
        if weigh:
            hidden = _weights.weight_hidden_states(hidden, weights.to(hidden.dtype), restore_mean=True)
        if p.empty_prompt == "zeros":
            hidden = slots.zero_rows(hidden, [isinstance(t, MissingNegative) for t in texts])
        return hidden

    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    text_embeddings = embed(prompts)
    if uncond_prompt is None:
        return text_embeddings, None
    uncond = [uncond_prompt] if isinstance(uncond_prompt, str) else list(uncond_prompt)
    return text_embeddings, embed(uncond)


def lpw_embeddings_wrapper(arch: Arch, original: Callable[..., object]) -> Callable[..., object]:
    """The replacement of ``get_weighted_text_embeddings``: :func:`lpw_embeddings` (same parameters and
    defaults, pinned by the declared target) under the original's name."""

    def get_weighted_text_embeddings(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        return lpw_embeddings(arch, *args, **kwargs)

    return mark_wrapper(get_weighted_text_embeddings, original)
