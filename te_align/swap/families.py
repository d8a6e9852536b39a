"""What differs between families when a text encoder is swapped: one row per family, the logic exists once.

A row names the denoiser component, the config key that states the conditioning width it takes, the
text slot that is replaced and, per reset mode, the module-name patterns (regular expressions, matched
with ``re.search`` against ``named_modules()`` names) of the layers re-initialised. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Reset modes, in the order ``--help`` lists them.
RESET_MODES = ("none", "cross", "qk", "all")
RESET_HELP = {
    "none": "keep every denoiser layer",
    "cross": "re-initialise the text cross-attention (UNet attn2 to_q/to_k/to_v/to_out.0; MMDiT add_*_proj/to_add_out)",
    "qk": "re-initialise the cross-attention query and key only (attn2 to_q/to_k; MMDiT add_q_proj/add_k_proj)",
    "all": "re-initialise every attention projection (UNet attn1 and attn2; MMDiT to_* and add_*)",
}

#: SD-style UNet: attn1 is self-attention, attn2 attends to the text (diffusers' BasicTransformerBlock).
UNET_RESET: dict[str, tuple[str, ...]] = {
    "none": (),
    "cross": (r"\.attn2\.(to_q|to_k|to_v|to_out\.0)$",),
    "qk": (r"\.attn2\.(to_q|to_k)$",),
    "all": (r"\.attn[12]\.(to_q|to_k|to_v|to_out\.0)$",),
}
#: Joint-attention transformers (SD3 / Flux MMDiT): the text stream's projections are add_*_proj / to_add_out.
MMDIT_RESET: dict[str, tuple[str, ...]] = {
    "none": (),
    "cross": (r"\.attn\.(add_q_proj|add_k_proj|add_v_proj|to_add_out)$",),
    "qk": (r"\.attn\.(add_q_proj|add_k_proj)$",),
    "all": (r"\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)$",),
}


@dataclass(frozen=True)
class SwapFamily:
    """One row: how a family's text slot is swapped."""

    family: str
    #: Pipeline attribute of the denoiser.
    denoiser: str
    #: Key of the denoiser's config that states the conditioning width it attends to.
    width_key: str
    #: The profile slot that is replaced (its tokenizer / text_encoder subfolders are reused).
    slot: str
    #: The output whose statistics are measured and matched.
    output: str
    reset: dict[str, tuple[str, ...]]
    #: False: the row is written down but not yet built or tested end to end (named in the error).
    supported: bool = True
    note: str = ""


FAMILIES: dict[str, SwapFamily] = {
    "sd1": SwapFamily("sd1", "unet", "cross_attention_dim", "clip_l", "prompt_embeds", UNET_RESET),
    "sd2": SwapFamily("sd2", "unet", "cross_attention_dim", "clip_h", "prompt_embeds", UNET_RESET),
    # SDXL concatenates two CLIP slots and takes CLIP-G's pooled output: a swap must also produce the
    # pooled embedding, which the projected encoder does not yet do.
    "sdxl": SwapFamily("sdxl", "unet", "cross_attention_dim", "clip_g", "prompt_embeds", UNET_RESET, supported=False,
                       note="SDXL also needs a pooled embedding from the new encoder"),
    "sd3": SwapFamily("sd3", "transformer", "joint_attention_dim", "t5", "prompt_embeds", MMDIT_RESET, supported=False,
                      note="SD3 combines three slots and pooled CLIP outputs"),
}


__all__ = ["FAMILIES", "MMDIT_RESET", "RESET_HELP", "RESET_MODES", "UNET_RESET", "SwapFamily"]
