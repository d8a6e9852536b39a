"""Forge's own text-processing engines from a checkout, on tiny weights, for the inference matrix.

Forge (lllyasviel/stable-diffusion-webui-forge) turns prompts into conditioning with
``backend.text_processing.classic_engine.ClassicTextProcessingEngine`` (CLIP) and
``backend.text_processing.t5_engine.T5TextProcessingEngine`` (T5), built per model family in
``backend/diffusion_engine/<family>.py`` with family-specific arguments (clip skip, final layer norm, pooled output,
T5 minimum length). :func:`engines` builds those engines exactly as Forge's family files do, on Forge's own encoder
classes (``backend.nn.clip.IntegratedCLIP`` around transformers' CLIP, ``backend.nn.t5.IntegratedT5``: Forge's T5
code) holding the weights of te-align's tiny diffusers components, and :func:`conditioning` combines their outputs as
the family's ``get_learned_conditioning`` does. Nothing of Forge is copied here.

The engines import ``modules.shared`` for one value, ``opts.emphasis`` (how ``(word:1.2)`` weights are applied);
that module is Forge's web-UI settings and needs gradio, so :func:`import_forge` puts a stand-in holding Forge's
default for it (``"Original"``, modules/shared_options.py:179) in its place and records it in :data:`STAND_INS`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, TypeAlias

from te_align.errors import TeAlignError

if TYPE_CHECKING:
    import torch
    from diffusers import DiffusionPipeline
    from transformers import CLIPTextModel, PreTrainedTokenizerBase, T5EncoderModel

#: A Forge text-processing engine: prompts -> conditioning (and the pooled output, where it returns one).
ForgeEngine: TypeAlias = "Callable[[list[str]], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]"

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.

ENV = "TE_ALIGN_FORGE_DIR"
#: family -> bundled profiles compared (the families whose Forge engines take te-align's tiny encoders).
PROFILES: dict[str, tuple[str, ...]] = {
    "flux": ("flux-dev", "flux-schnell"), "sdxl": ("sdxl",), "sd15": ("sd15",), "chroma": ("chroma",),
}
#: Families Forge samples that are not compared, and why (one line each).
NOT_COMPARED: dict[str, str] = {
    "sd35-large": "Forge's SD3.5 engine feeds zeros [B, 256, 4096] for T5 unless sd3_enable_t5 is set and pads CLIP to "
                  "a fixed 4096 width (backend/diffusion_engine/sd35.py:107-125), which te-align's tiny encoders "
                  "(96 wide) cannot be given; the check notes cover it",
}
#: Module -> what stands in for it and why (shown in the matrix).
STAND_INS: dict[str, str] = {}
#: Where the Forge rows' setup is not Forge's web UI as shipped, and why (shown in the matrix).
BRIDGES: tuple[str, ...] = (
    "transformers 5's CLIPTextModel is the text tower itself; Forge (which pins transformers 4.46.1) reaches it as "
    "`.text_model` (classic_engine.py:85,127-139), so the class Forge is given aliases `text_model` to itself",
    "Forge's T5 code takes the attention width to be the model width (backend/nn/t5.py:201 passes model_dim as inner_dim to :74-79, as in T5-XXL), so "
    "its tiny T5 has d_kv = d_model / num_heads",
    "Forge's \"Original\" emphasis divides the conditioning by its mean (emphasis.py:29-33), which an untrained "
    "CLIP's final layer norm makes exactly 0 (NaN), so the tiny CLIPs carry seeded layer-norm biases, as trained ones do",
    "no textual-inversion folder is read",
)
#: Forge's default for the one web-UI setting its text engines read.
EMPHASIS_DEFAULT = "Original"


def import_forge(path: str | None = None) -> None:
    """Import Forge's text engines from the checkout at ``path`` (default: $TE_ALIGN_FORGE_DIR); one line on failure,
    naming what is missing."""
    path = path or os.environ.get(ENV)
    if not path:
        raise TeAlignError(f"{ENV} is not set (the folder of a Forge checkout)")
    if not os.path.isfile(os.path.join(path, "backend", "text_processing", "t5_engine.py")):
        raise TeAlignError(f"{ENV}={path} is not a Forge checkout (no backend/text_processing/t5_engine.py)")
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        import backend.args as forge_args  # Forge's command-line flags, parsed with parse_known_args
        import torch

        if not torch.cuda.is_available():
            forge_args.args.always_cpu = True  # Forge's --always-cpu: no CUDA here
        if "modules.shared" not in sys.modules:
            shared = ModuleType("modules.shared")
            shared.opts = SimpleNamespace(emphasis=EMPHASIS_DEFAULT)  # type: ignore[attr-defined]
            sys.modules["modules.shared"] = shared
            STAND_INS["modules.shared"] = (f"Forge's web-UI settings, which import gradio: the engines read only "
                                           f"opts.emphasis, given Forge's default {EMPHASIS_DEFAULT!r} "
                                           "(modules/shared_options.py:179)")
        for name in ("backend.memory_management", "backend.nn.clip", "backend.nn.t5",
                     "backend.text_processing.classic_engine", "backend.text_processing.t5_engine"):
            importlib.import_module(name)
    except ImportError as e:
        raise TeAlignError(f"Forge at {path} does not import here: missing {e.name or e}") from None
    except (AssertionError, RuntimeError, SystemExit) as e:  # a CUDA check or Forge's argument parser
        raise TeAlignError(f"Forge at {path} does not import here: {type(e).__name__}: {e}".splitlines()[0]) from None


def _clip_class() -> type:
    """transformers' CLIPTextModel as Forge reads it: Forge (which pins transformers 4.46.1) reaches the tower through
    ``.text_model`` (classic_engine.py:85,127-139); transformers 5's CLIPTextModel is the tower itself, so the one
    difference is an alias ``text_model`` to itself."""
    from transformers import CLIPTextModel

    class CLIPTextModelAsForgeReadsIt(CLIPTextModel):
        @property
        def text_model(self) -> CLIPTextModel:
            return self

    return CLIPTextModelAsForgeReadsIt


def _clip(hf: CLIPTextModel) -> torch.nn.Module:
    """Forge's IntegratedCLIP holding ``hf``'s weights, built as Forge's loader builds every CLIP (backend/loader.py:72:
    transformers' CLIPTextModel with a text projection added); its own copy, as the classic engine wraps the token
    embedding in place."""
    from backend.nn.clip import IntegratedCLIP

    model = IntegratedCLIP(_clip_class(), hf.config, add_text_projection=True)
    state = {k.removeprefix("text_model."): v for k, v in hf.state_dict().items()}
    missing, unexpected = model.transformer.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "text_projection.weight"]:  # CLIP-L files carry no projection
        raise TeAlignError(f"Forge's CLIP does not take the encoder's weights: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    return model.eval()


def _t5(hf: T5EncoderModel) -> torch.nn.Module:
    """Forge's own T5 (IntegratedT5) holding ``hf``'s (a transformers T5EncoderModel) weights."""
    from backend.nn.t5 import IntegratedT5

    cfg = hf.config.to_dict()
    model = IntegratedT5({k: cfg[k] for k in ("num_layers", "d_model", "d_ff", "dense_act_fn", "is_gated_act",
                                              "num_heads", "vocab_size", "model_type")})
    state = {k: v for k, v in hf.state_dict().items() if k != "encoder.embed_tokens.weight"}
    missing, unexpected = model.transformer.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise TeAlignError(f"Forge's T5 does not take transformers' T5 weights: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    return model.eval()


#: The T5 slot's component per family.
T5_COMPONENT = {"flux": "text_encoder_2", "chroma": "text_encoder"}


def pipeline(family: str) -> DiffusionPipeline:
    """The tiny diffusers pipeline of ``family`` (te-align's components) whose encoders Forge's classes can hold.

    Forge's T5 code takes the attention's inner width to be the model width (backend/nn/t5.py:201 passes model_dim as inner_dim to :74-79, as in every
    released T5-XXL: 64 heads of 64); the tiny T5 is replaced by one of the same config with ``d_kv = d_model /
    num_heads`` (seeded)."""
    import torch
    import transformers

    from te_align.tiny.pipelines import build_pipeline_for_encoding

    pipe = build_pipeline_for_encoding(family)
    comp = T5_COMPONENT.get(family)
    if comp is not None:
        cfg = getattr(pipe, comp).config.to_dict()
        cfg["d_kv"] = cfg["d_model"] // cfg["num_heads"]
        with torch.random.fork_rng():
            torch.manual_seed(29)
            t5 = transformers.T5EncoderModel(transformers.T5Config(**cfg)).eval()
        pipe = build_pipeline_for_encoding(family, **{comp: t5})
    # Every trained CLIP's final layer norm has a bias; an untrained one (bias 0) makes the conditioning's mean exactly
    # 0, and Forge's "Original" emphasis divides by that mean (emphasis.py:29-33): NaN. Seeded biases, as trained.
    g = torch.Generator().manual_seed(30)
    for comp_name in ("text_encoder", "text_encoder_2"):
        enc = getattr(pipe, comp_name, None)
        for name, mod in (enc.named_modules() if enc is not None else ()):
            if name.endswith("final_layer_norm") and getattr(mod, "bias", None) is not None:
                with torch.no_grad():
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
    return pipe


def engines(family: str, pipe: DiffusionPipeline) -> dict[str, ForgeEngine]:
    """Forge's engines of ``family`` with the arguments its ``backend/diffusion_engine/<family>.py`` passes, on
    ``pipe``'s (a tiny diffusers pipeline's) tokenizers and encoder weights. No textual-inversion folder is read."""
    from backend.args import dynamic_args
    from backend.text_processing.classic_engine import ClassicTextProcessingEngine
    from backend.text_processing.t5_engine import T5TextProcessingEngine

    emphasis = dynamic_args["emphasis_name"]

    def classic(enc: CLIPTextModel, tok: PreTrainedTokenizerBase, key: str, **kw: bool | int) -> ForgeEngine:
        return ClassicTextProcessingEngine(text_encoder=_clip(enc), tokenizer=tok, embedding_dir=None, embedding_key=key,
                                           embedding_expected_shape=enc.config.hidden_size, emphasis_name=emphasis, **kw)

    if family == "flux":  # flux.py:56-74
        return {"l": classic(pipe.text_encoder, pipe.tokenizer, "clip_l", text_projection=False, minimal_clip_skip=1,
                             clip_skip=1, return_pooled=True, final_layer_norm=True),
                "t5": T5TextProcessingEngine(text_encoder=_t5(pipe.text_encoder_2), tokenizer=pipe.tokenizer_2,
                                             emphasis_name=emphasis)}
    if family == "chroma":  # chroma.py:38-43
        return {"t5": T5TextProcessingEngine(text_encoder=_t5(pipe.text_encoder), tokenizer=pipe.tokenizer,
                                             emphasis_name=emphasis, min_length=1)}
    if family == "sdxl":  # sdxl.py:44-70
        return {"l": classic(pipe.text_encoder, pipe.tokenizer, "clip_l", text_projection=False, minimal_clip_skip=2,
                             clip_skip=2, return_pooled=False, final_layer_norm=False),
                "g": classic(pipe.text_encoder_2, pipe.tokenizer_2, "clip_g", text_projection=True, minimal_clip_skip=2,
                             clip_skip=2, return_pooled=True, final_layer_norm=False)}
    if family == "sd15":  # sd15.py:39-51, clip skip 1 (modules/processing.py:472, shared_options.py:183)
        return {"l": classic(pipe.text_encoder, pipe.tokenizer, "clip_l", text_projection=False, minimal_clip_skip=1,
                             clip_skip=1, return_pooled=False, final_layer_norm=True)}
    raise TeAlignError(f"no Forge engines for family {family!r}; compared: {', '.join(PROFILES)}")


def conditioning(family: str, eng: dict[str, ForgeEngine], prompt: str) -> dict[str, torch.Tensor]:
    """``{"crossattn": ..., "pooled": ...}`` for one positive prompt, combined as the family's
    ``get_learned_conditioning`` does (flux.py:84-97, chroma.py:55-57, sdxl.py:85-121, sd15.py)."""
    import torch

    with torch.inference_mode():
        if family == "flux":
            cond_l, pooled = eng["l"]([prompt])
            return {"crossattn": eng["t5"]([prompt]), "pooled": pooled}
        if family == "chroma":
            return {"crossattn": eng["t5"]([prompt])}
        if family == "sdxl":
            cond_l = eng["l"]([prompt])
            cond_g, pooled = eng["g"]([prompt])
            return {"crossattn": torch.cat([cond_l, cond_g], dim=2), "pooled": pooled}
        return {"crossattn": eng["l"]([prompt])}


__all__ = ["BRIDGES", "ENV", "NOT_COMPARED", "PROFILES", "STAND_INS", "conditioning", "engines", "import_forge", "pipeline"]
