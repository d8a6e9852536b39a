"""kohya-ss/sd-scripts ``--weighted_captions`` under te-align's kohya hooks.

sd-scripts' weighted path is ``TokenizeStrategy.tokenize_with_weights`` +
``TextEncodingStrategy.encode_tokens_with_weights`` (sd-scripts 48d368f: SD1/2
``library/strategy_sd.py:43,108``, SDXL ``library/strategy_sdxl.py:40,195``, Lumina 2
``library/strategy_lumina.py:74,125``, base ``library/strategy_base.py:76,310``). It is taken by
``train_network.py`` / ``train_db.py`` / ``fine_tune.py`` / ``sdxl_train.py`` with
``--weighted_captions``, by SDXL's TE-output caching with ``is_weighted``, and by every SDXL sample
image (``library/sdxl_lpw_stable_diffusion.py:842-852``).

With the hooks both are replaced. What the profile decides follows the profile, exactly as the
hooked ``tokenize`` / ``encode_tokens``: tokenizer call, pad token, CLIP-G "!" rule, truncation or
long-prompt chunks (``--max_token_length``), hidden layer and norm, pooled output. The weights are
sd-scripts': the A1111 syntax parsed as sd-scripts parses it, aligned to the profile's tokens
(:mod:`te_align.encoding.weights`), applied as sd-scripts applies them:

* SD1/2 and SDXL: hidden states times the per-token weight, no renormalisation; pooled (SDXL)
  unweighted (``strategy_sd.py:117-128``, ``strategy_sdxl.py:204-217``).
* Lumina 2: no weights: sd-scripts tokenizes the caption as written (weight syntax included) and
  returns weights of 1 that the encoder ignores (``strategy_lumina.py:74-89,125-144``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from te_align._lazy import lazy_module
from te_align.hooks.base import mark_wrapper
from te_align.trainers.kohya.hooks import slots
from te_align.trainers.kohya.hooks.run import RUN, chunk_options, profile_for
from te_align.trainers.kohya.hooks.sample import MissingNegative

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from te_align.encoding import weights as _weights
    from te_align.profiles import AlignmentProfile
    from te_align.trainers.kohya.hooks.archs import Arch, Models, Outputs, Tokens
else:  # imported on first use: keeps torch off this module's import (the CLI's cold path)
    _weights = lazy_module("te_align.encoding.weights")


class NegativeWeights(list):  # type: ignore[type-arg]
    """Weights of a batch with absent negative prompts (``zero_rows``) whose profile makes them zeros."""

    zero_rows: list[bool]


def _announce(arch: Arch, p: AlignmentProfile, strategy: object) -> None:
    chunks = chunk_options(arch.chunkable, strategy).long_prompt_chunks
    w = arch.weighted
    RUN.once(
        f"weighted:{arch.name}",
        "te-align: weighted prompts (%s: %s): tokens, pad token%s, %s and hidden layers follow profile %s; prompt "
        "weights ((word:1.2), (word), [word]) are parsed and applied as sd-scripts does (%s): hidden states x per-token "
        "weight, no renormalisation%s",
        arch.name, "--weighted_captions and sample images" if w.samples else "--weighted_captions",
        ", CLIP-G '!' rule" if "clip_g" in arch.slots else "", f"{chunks} chunks of 77" if chunks else "77-token truncation",
        p.name, w.source, ", pooled output unweighted" if w.pooled else "",
    )


def _announce_unweighted(arch: Arch, p: AlignmentProfile) -> None:
    RUN.once(
        f"weighted:{arch.name}",
        "te-align: --weighted_captions (%s): captions tokenized and encoded by profile %s; sd-scripts applies no "
        "prompt weights to %s (%s), so captions are encoded as written, weight syntax included, as without te-align",
        arch.name, p.name, arch.weighted.encoder, arch.weighted.source,
    )


def tokenize_weighted(
    arch: Arch, strategy: object, text: str | Sequence[str]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """SD/SDXL ``tokenize_with_weights`` by the profile: ([ids per encoder], [weights per encoder]), (B, 1, L)."""
    texts = [text] if isinstance(text, str) else list(text)
    p = profile_for(arch.name, strategy)
    slots.note_setting_differences(arch, strategy, p)
    _announce(arch, p, strategy)
    opts = chunk_options(arch.chunkable, strategy)
    plain = [str(t) for t in texts]
    ids_list, weights_list = [], []
    for slot, tok in slots.slot_tokenizers(arch, strategy, p):
        ids, _mask, weights = _weights.tokenize_slot_weighted(slot, tok, plain, options=opts)
        ids_list.append(ids.unsqueeze(1))
        weights_list.append(weights.unsqueeze(1))
    absent = [isinstance(t, MissingNegative) for t in texts]
    if any(absent):
        marked = NegativeWeights(weights_list)
        marked.zero_rows = absent
        return ids_list, marked
    return ids_list, weights_list


def _weigh(hidden: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sd-scripts' strategy weighting of one encoder's hidden states, dtype behaviour included."""
    w = weights[:, 0] if weights.dim() == 3 else weights
    out = _weights.weight_hidden_states(hidden, w)
    # sd-scripts multiplies by float32 weights: one 77-token chunk takes the product's promoted dtype
    # (strategy_sd.py:122), several chunks are written back into the hidden states' own dtype (:125-128)
    return out if hidden.shape[1] <= 77 else out.to(hidden.dtype)


def encode_weighted(
    arch: Arch,
    self: object,
    tokenize_strategy: object,
    models: Models,
    tokens: Tokens,
    weights: Sequence[torch.Tensor],
) -> Outputs:
    """SD/SDXL ``encode_tokens_with_weights``: the hooked encoding, then sd-scripts' weighting of each encoder's
    hidden states (the outputs before ``weighted.hidden_outputs``; the rest, e.g. SDXL's pooled, unweighted)."""
    out = slots.encode(arch, self, tokenize_strategy, models, tokens)
    n = arch.weighted.hidden_outputs
    result = [_weigh(out[i], weights[i]) for i in range(n)] + list(out[n:])
    rows = getattr(weights, "zero_rows", None)
    if rows is not None and profile_for(arch.name, tokenize_strategy).empty_prompt == "zeros":
        result = [slots.zero_rows(t, rows) for t in result]
    return result


# ------------------------------------------------------------------------------ replacements
def tokenize_with_weights_wrapper(arch: Arch, original: Callable[..., object]) -> Callable[..., object]:
    """``tokenize_with_weights``: the profile's tokens with sd-scripts' weights (or, where sd-scripts applies
    none, the plain hooked tokens and weights of 1)."""
    if not arch.weighted.applied:

        def tokenize_with_weights_unweighted(
            self: object, text: str | Sequence[str]
        ) -> tuple[torch.Tensor | None, torch.Tensor | None, list[torch.Tensor]]:
            import torch

            _announce_unweighted(arch, profile_for(arch.name, self))
            ids, mask = slots.tokenize(arch, self, text)
            return ids, mask, [torch.ones_like(t) for t in ids]

        return mark_wrapper(tokenize_with_weights_unweighted, original)

    def tokenize_with_weights(
        self: object, text: str | Sequence[str]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return tokenize_weighted(arch, self, text)

    return mark_wrapper(tokenize_with_weights, original)


def encode_tokens_with_weights_wrapper(arch: Arch, original: Callable[..., object]) -> Callable[..., object]:
    """``encode_tokens_with_weights``: the hooked encoding with sd-scripts' weighting (or none, where it has none)."""
    if not arch.weighted.applied:

        def encode_tokens_with_weights_unweighted(
            self: object, tokenize_strategy: object, models: Models, tokens: Tokens, weights: object
        ) -> Outputs:
            return slots.encode(arch, self, tokenize_strategy, models, tokens)

        return mark_wrapper(encode_tokens_with_weights_unweighted, original)

    def encode_tokens_with_weights(
        self: object,
        tokenize_strategy: object,
        models: Models,
        tokens_list: Tokens,
        weights_list: Sequence[torch.Tensor],
    ) -> Outputs:
        return encode_weighted(arch, self, tokenize_strategy, models, tokens_list, weights_list)

    return mark_wrapper(encode_tokens_with_weights, original)
