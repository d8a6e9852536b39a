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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from te_align.hooks import kohya
from te_align.hooks.base import mark_wrapper

if TYPE_CHECKING:  # pragma: no cover
    from te_align.hooks.kohya import Arch
    from te_align.profiles import AlignmentProfile

#: Where sd-scripts applies the weights (for the log).
_SOURCES = {"sd": "library/strategy_sd.py:108-130", "sdxl": "library/strategy_sdxl.py:195-219"}


class NegativeWeights(list):  # type: ignore[type-arg]
    """Weights of a batch with absent negative prompts (``zero_rows``) whose profile makes them zeros."""

    zero_rows: list[bool]


def _announce(arch: Arch, p: AlignmentProfile, strategy: Any) -> None:
    if arch.name == "lumina":
        kohya._RUN.once(
            "weighted:lumina",
            "te-align: --weighted_captions (lumina): captions tokenized and encoded by profile %s; sd-scripts applies no "
            "prompt weights to Gemma 2 (library/strategy_lumina.py:74-89,125-144), so captions are encoded as written, "
            "weight syntax included, as without te-align", p.name,
        )  # fmt: skip
        return
    chunks = kohya._chunk_options(arch.name, strategy).long_prompt_chunks
    sdxl = arch.name == "sdxl"
    kohya._RUN.once(
        f"weighted:{arch.name}",
        "te-align: weighted prompts (%s: %s): tokens, pad token%s, %s and hidden layers follow profile %s; prompt "
        "weights ((word:1.2), (word), [word]) are parsed and applied as sd-scripts does (%s): hidden states x per-token "
        "weight, no renormalisation%s",
        arch.name, "--weighted_captions and sample images" if sdxl else "--weighted_captions", ", CLIP-G '!' rule" if sdxl else "",
        f"{chunks} chunks of 77" if chunks else "77-token truncation", p.name, _SOURCES[arch.name],
        ", pooled output unweighted" if sdxl else "",
    )  # fmt: skip


def tokenize_weighted(arch: Arch, strategy: Any, text: Any) -> Any:
    """SD/SDXL ``tokenize_with_weights`` by the profile: ([ids per encoder], [weights per encoder]), (B, 1, L)."""
    from te_align.encoding.weights import tokenize_slot_weighted
    from te_align.hooks.kohya_sample import MissingNegative

    texts = [text] if isinstance(text, str) else list(text)
    p = kohya.profile_for(arch.name, strategy)
    kohya._note_setting_differences(arch, strategy, p)
    _announce(arch, p, strategy)
    opts = kohya._chunk_options(arch.name, strategy)
    plain = [str(t) for t in texts]
    ids_list, weights_list = [], []
    for slot, tok in kohya._slot_tokenizers(arch, strategy, p):
        ids, _mask, weights = tokenize_slot_weighted(slot, tok, plain, options=opts)
        ids_list.append(ids.unsqueeze(1))
        weights_list.append(weights.unsqueeze(1))
    absent = [isinstance(t, MissingNegative) for t in texts]
    if any(absent):
        marked = NegativeWeights(weights_list)
        marked.zero_rows = absent
        return ids_list, marked
    return ids_list, weights_list


def _weigh(hidden: Any, weights: Any) -> Any:
    """sd-scripts' strategy weighting of one encoder's hidden states, dtype behaviour included."""
    from te_align.encoding.weights import weight_hidden_states

    w = weights[:, 0] if weights.dim() == 3 else weights
    out = weight_hidden_states(hidden, w)
    # sd-scripts multiplies by float32 weights: one 77-token chunk takes the product's promoted dtype
    # (strategy_sd.py:122), several chunks are written back into the hidden states' own dtype (:125-128)
    return out if hidden.shape[1] <= 77 else out.to(hidden.dtype)


def encode_weighted(arch: Arch, self: Any, tokenize_strategy: Any, models: Sequence[Any], tokens: Any, weights: Any) -> Any:
    """SD/SDXL ``encode_tokens_with_weights``: the hooked encoding, then sd-scripts' weighting."""

    out = kohya._encode(arch, self, tokenize_strategy, models, tokens)
    if arch.name == "sd":
        result = [_weigh(out[0], weights[0])]
    else:
        result = [_weigh(out[0], weights[0]), _weigh(out[1], weights[1]), out[2]]
    rows = getattr(weights, "zero_rows", None)
    if rows is not None and kohya.profile_for(arch.name, tokenize_strategy).empty_prompt == "zeros":
        result = [kohya._zero_rows(t, rows) for t in result]
    return result


# ------------------------------------------------------------------------------ replacements
def tokenize_with_weights_wrapper(arch: Arch, original: Any) -> Any:
    if arch.name == "lumina":

        def tokenize_with_weights_lumina(self: Any, text: Any) -> Any:
            import torch

            p = kohya.profile_for(arch.name, self)
            _announce(arch, p, self)
            ids, mask = kohya._tokenize(arch, self, text)
            return ids, mask, [torch.ones_like(t) for t in ids]

        return mark_wrapper(tokenize_with_weights_lumina, original)

    def tokenize_with_weights(self: Any, text: Any) -> Any:
        return tokenize_weighted(arch, self, text)

    return mark_wrapper(tokenize_with_weights, original)


def encode_tokens_with_weights_wrapper(arch: Arch, original: Any) -> Any:
    if arch.name == "lumina":

        def encode_tokens_with_weights_lumina(self: Any, tokenize_strategy: Any, models: Any, tokens: Any, weights: Any) -> Any:
            return kohya._encode(arch, self, tokenize_strategy, models, tokens)

        return mark_wrapper(encode_tokens_with_weights_lumina, original)

    def encode_tokens_with_weights(self: Any, tokenize_strategy: Any, models: Any, tokens_list: Any, weights_list: Any) -> Any:
        return encode_weighted(arch, self, tokenize_strategy, models, tokens_list, weights_list)

    return mark_wrapper(encode_tokens_with_weights, original)
