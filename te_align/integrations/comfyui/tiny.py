"""ComfyUI's own text-encoder objects on tiny random weights, for tests, the inference matrix and benchmarks.

:func:`build` makes a real ``comfy.sd.CLIP`` (ComfyUI's tokenizer classes with their shipped real tokenizers,
ComfyUI's model classes with tiny configs passed the way ComfyUI passes model configs, weights loaded through
``CLIP(state_dict=...)``) and the Hugging Face encoders holding the very same weights, so ComfyUI's stock
``CLIPTextEncode``, the te-align node and :func:`te_align.encode` can be compared on equal footing.

ComfyUI is imported from a checkout (:func:`import_comfyui`); nothing of it is copied here.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

from te_align._lazy import lazy_module
from te_align.errors import TeAlignError
from te_align.integrations.comfyui.encode import ComfyClip, conform_tokenizer
from te_align.profiles import profile as _profile
from te_align.tiny.fit import architecture_overrides

if TYPE_CHECKING:
    import torch
    import transformers
    from transformers import PreTrainedTokenizerBase

    from te_align.profiles.model import AlignmentProfile

# Function-local te_align imports in this module, and the lazy handle below: keep torch (transformers,
# diffusers) off this module's import, the CLI's cold path.
_tiny_encoders = lazy_module("te_align.tiny.encoders")

ENV = "TE_ALIGN_COMFYUI_DIR"
#: family -> bundled profiles compared in that family.
PROFILES: dict[str, tuple[str, ...]] = {
    "flux": ("flux-dev", "flux-schnell"), "sd3": ("sd35-large",), "sdxl": ("sdxl",), "sd1": ("sd15",), "chroma": ("chroma",),
}
#: SD3's ComfyUI code pads CLIP to a fixed 4096 wide before joining T5, so its T5 must be 4096 wide.
T5_WIDTH = {"sd3": 4096}
T5_VOCAB = 32128


#: Stand-ins installed for import dependencies that do not load here, with the reason (see :func:`_stand_in`).
STAND_INS: dict[str, str] = {}


class _Unavailable(type(sys)):  # a module whose every attribute fails when used, naming why
    def __init__(self, name: str, why: str) -> None:
        import importlib.machinery

        super().__init__(name)
        self.__why = why
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        why = self.__why

        def unavailable(*a: object, **k: object) -> NoReturn:
            raise TeAlignError(f"{self.__name__}.{attr} is not available here: {why}")

        return unavailable


def _stand_in(module: str, subs: tuple[str, ...]) -> None:
    """``module`` when it imports; else stand-ins that fail on use. ComfyUI imports torchvision at import time
    for models compared nowhere here (Stable Cascade, Cosmos, ACE); the registry's torchvision is built for the
    CUDA torch and its C extension does not load with a CPU-only torch ("operator torchvision::nms does not
    exist"). Text encoding never calls it."""
    try:
        importlib.import_module(module)
        return
    except (ImportError, RuntimeError) as e:
        why = f"{type(e).__name__}: {e}".splitlines()[0]
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        del sys.modules[name]
    for name in (module, *(f"{module}.{s}" for s in subs)):
        sys.modules[name] = _Unavailable(name, why)
    STAND_INS[module] = why


def import_comfyui(path: str | None = None) -> ModuleType:
    """Import ComfyUI from the checkout at ``path`` (default: $TE_ALIGN_COMFYUI_DIR); one line on failure."""
    path = path or os.environ.get(ENV)
    if not path:
        raise TeAlignError(f"{ENV} is not set (the folder of a ComfyUI checkout)")
    if not os.path.isfile(os.path.join(path, "comfy", "sd.py")):
        raise TeAlignError(f"{ENV}={path} is not a ComfyUI checkout (no comfy/sd.py)")
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        import comfy.options

        comfy.options.args_parsing = False  # ComfyUI's defaults, not pytest's argv
        import comfy.cli_args
        import torch

        if not torch.cuda.is_available():
            comfy.cli_args.args.cpu = True  # ComfyUI's --cpu: no CUDA here
        import transformers  # noqa: F401  (before any stand-in: it probes for torchvision itself)

        _stand_in("torchvision", ("transforms", "transforms.functional", "ops", "io"))
        for name in ("comfy.model_management", "comfy.sd", "comfy.sd1_clip", "comfy.sdxl_clip",
                     "comfy.text_encoders.sd3_clip", "comfy.text_encoders.flux", "comfy.text_encoders.pixart_t5"):
            importlib.import_module(name)
        return importlib.import_module("comfy.sd")
    except ImportError as e:
        raise TeAlignError(f"ComfyUI at {path} does not import here: missing {e.name or e}") from None


@dataclass
class TinyComfy:
    family: str
    clip: ComfyClip
    #: Hugging Face components by diffusers component name (tokenizer, text_encoder, ...), same weights as ``clip``.
    components: dict[str, PreTrainedTokenizerBase | torch.nn.Module]


def _clip_cfg(variant: str) -> dict[str, int | str]:
    v = _tiny_encoders.CLIP_VARIANTS[variant]
    return {k: v[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                              "hidden_act", "projection_dim")}


def _t5(width: int) -> transformers.T5EncoderModel:
    import torch
    import transformers

    cfg = transformers.T5Config(vocab_size=T5_VOCAB, d_model=width, d_kv=16, num_heads=2, d_ff=64, num_layers=2,
                                feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_gated_act=True,
                                layer_norm_epsilon=1e-6, relative_attention_num_buckets=32,
                                relative_attention_max_distance=128, dropout_rate=0.0)
    with torch.random.fork_rng():
        torch.manual_seed(27)
        model = transformers.T5EncoderModel(cfg).eval()
    return model


def build(family: str, comfyui_dir: str | None = None, *, clip_l_projection: str = "model") -> TinyComfy:
    """A ComfyUI CLIP object of ``family`` (flux, sd3, sdxl, sd1, chroma, lumina2) on tiny weights, and the same
    weights as Hugging Face encoders (Lumina 2: the encoder only; ComfyUI's tokenizer is SentencePiece).

    SD3's CLIP-L text projection is the identity, as the model defines it (Stability's reference initialises it so
    and never applies it; see ``UNPROJECTED_POOLED`` in :mod:`.encode`). ``clip_l_projection`` varies what
    ComfyUI is given for it: ``"model"`` (that), ``"absent"`` (a CLIP-L file without ``text_projection``, as
    ComfyUI meets it in single CLIP-L files) or ``"random"`` (a file with some other projection); the Hugging Face
    encoder keeps the model's.
    """
    import torch

    import_comfyui(comfyui_dir)
    import comfy.sd1_clip as sd1_clip
    import comfy.sdxl_clip as sdxl_clip
    import comfy.text_encoders.flux as flux
    import comfy.text_encoders.pixart_t5 as pixart
    import comfy.text_encoders.sd3_clip as sd3_clip

    clip_text_model = _tiny_encoders.clip_text_model
    clip_text_model_with_projection = _tiny_encoders.clip_text_model_with_projection

    hf: dict[str, PreTrainedTokenizerBase | torch.nn.Module] = {}
    state: dict[str, torch.Tensor] = {}
    options: dict[str, object] = {}

    def put(prefix: str, model: torch.nn.Module) -> None:
        for k, v in model.state_dict().items():
            if prefix.startswith("clip") and not k.startswith(("text_model.", "text_projection.")):
                k = f"text_model.{k}"  # transformers 5 CLIPTextModel keys have no text_model. prefix
            state[f"{prefix}.transformer.{k}"] = v.detach().clone()

    if family in ("flux", "sd1"):
        hf["text_encoder"] = clip_text_model("L")
    elif family in ("sdxl", "sd3"):
        hf["text_encoder"] = clip_text_model_with_projection("L")
        hf["text_encoder_2"] = clip_text_model_with_projection("G")
        options["clip_g_model_config"] = _clip_cfg("G")
    if family == "sd3":
        with torch.no_grad():
            proj = hf["text_encoder"].text_projection.weight
            proj.copy_(torch.eye(*proj.shape))
    if "text_encoder" in hf:
        options["clip_l_model_config"] = _clip_cfg("L")
        put("clip_l", hf["text_encoder"])
        key = "clip_l.transformer.text_projection.weight"
        if clip_l_projection == "absent":
            state.pop(key, None)
        elif clip_l_projection == "random" and key in state:
            with torch.random.fork_rng():
                torch.manual_seed(28)
                state[key] = torch.randn_like(state[key])
        elif clip_l_projection != "model":
            raise TeAlignError(f"clip_l_projection must be model, absent or random, got {clip_l_projection!r}")
    if "text_encoder_2" in hf:
        put("clip_g", hf["text_encoder_2"])
    if family in ("flux", "sd3", "chroma"):
        t5 = _t5(T5_WIDTH.get(family, 128))
        key = {"flux": "text_encoder_2", "sd3": "text_encoder_3", "chroma": "text_encoder"}[family]
        hf[key] = t5
        options["t5xxl_model_config"] = {"d_model": t5.config.d_model, "d_kv": t5.config.d_kv,
                                         "num_heads": t5.config.num_heads, "d_ff": t5.config.d_ff,
                                         "num_layers": t5.config.num_layers, "vocab_size": T5_VOCAB}
        put("t5xxl", t5)
    if family == "lumina2":
        return _build_lumina2()
    target = SimpleNamespace(params={})
    if family == "flux":
        target.clip, target.tokenizer = flux.flux_clip(), flux.FluxTokenizer
    elif family == "sd3":
        target.clip, target.tokenizer = sd3_clip.sd3_clip(), sd3_clip.SD3Tokenizer
    elif family == "sdxl":
        target.clip, target.tokenizer = sdxl_clip.SDXLClipModel, sdxl_clip.SDXLTokenizer
    elif family == "sd1":
        target.clip, target.tokenizer = sd1_clip.SD1ClipModel, sd1_clip.SD1Tokenizer
    elif family == "chroma":
        target.clip, target.tokenizer = pixart.pixart_te(), pixart.PixArtTokenizer
    else:
        raise TeAlignError(f"no tiny ComfyUI build for family '{family}'; choose one of {', '.join(PROFILES)}")
    import comfy.sd

    options["dtype"] = torch.float32
    clip = comfy.sd.CLIP(target, state_dict=state, model_options=options)
    names = {"clip_l": ("tokenizer", "clip_l"), "clip_g": ("tokenizer_2", "clip_g"), "t5xxl": (None, "t5xxl")}
    t5_tok = {"flux": "tokenizer_2", "sd3": "tokenizer_3", "chroma": "tokenizer"}
    for attr, (tok_name, _) in names.items():
        sub = getattr(clip.tokenizer, attr, None) or getattr(clip.tokenizer, f"clip_{attr}", None)
        if sub is None:
            continue
        hf[tok_name or t5_tok[family]] = sub.tokenizer
    return TinyComfy(family, clip, hf)


def _spiece_model() -> bytes:
    """A small SentencePiece BPE model with Gemma's conventions (pad 0, eos 1, bos 2, unk 3, byte fallback, no dummy
    prefix), trained here on a fixed text: what ComfyUI reads from a Gemma weights file's ``spiece_model``."""
    import io

    import sentencepiece

    from te_align.tiny.tokenizers import _sentences

    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences()), model_writer=buf, vocab_size=400, model_type="bpe", pad_id=0, eos_id=1,
        bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        byte_fallback=True, add_dummy_prefix=False, normalization_rule_name="identity", num_threads=1, minloglevel=2,
        user_defined_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"])
    return buf.getvalue()


def _build_lumina2() -> TinyComfy:
    """ComfyUI's Lumina 2 text encoder (Gemma-2, its SentencePiece tokenizer) on tiny random weights; the Hugging
    Face ``Gemma2Model`` holds the same weights. ComfyUI's Gemma-2 class fixes the head width at 256."""
    import comfy.sd
    import comfy.text_encoders.lumina2 as lumina2
    import torch
    import transformers

    spiece = _spiece_model()
    sizes = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
             "num_attention_heads": 2, "num_key_value_heads": 1}
    cfg = transformers.Gemma2Config(**sizes, head_dim=256, query_pre_attn_scalar=256, pad_token_id=0, eos_token_id=1,
                                    bos_token_id=2)
    with torch.random.fork_rng():
        torch.manual_seed(27)
        gemma = transformers.Gemma2Model(cfg).eval()
    state = {f"gemma2_2b.transformer.model.{k}": v.detach().clone() for k, v in gemma.state_dict().items()}
    target = SimpleNamespace(params={}, clip=lumina2.te(), tokenizer=lumina2.LuminaTokenizer)
    clip = comfy.sd.CLIP(target, state_dict=state, tokenizer_data={"spiece_model": torch.ByteTensor(list(spiece))},
                         model_options={"dtype": torch.float32, "gemma2_2b_model_config": sizes})
    return TinyComfy("lumina2", clip, {"text_encoder": gemma})


def fitted_profile(name: str, tiny: TinyComfy) -> AlignmentProfile:
    """Bundled profile ``name`` with the tiny encoders' architecture numbers (behaviour unchanged)."""
    p = _profile(name)
    comps = dict(tiny.components)
    for slot in p.slots:
        comps[slot.tokenizer_subfolder] = conform_tokenizer(slot, comps[slot.tokenizer_subfolder])
    return p.with_overrides(architecture_overrides(p, comps))


def reference_components(
    profile: AlignmentProfile, tiny: TinyComfy
) -> tuple[dict[str, PreTrainedTokenizerBase], dict[str, torch.nn.Module]]:
    """(tokenizers, text encoders) for :func:`te_align.encode`: ComfyUI's tokenizers in the profile's conventions
    and the Hugging Face encoders holding ComfyUI's weights."""
    toks = {s.name: conform_tokenizer(s, tiny.components[s.tokenizer_subfolder]) for s in profile.slots}
    encs = {s.name: tiny.components[s.encoder_subfolder] for s in profile.slots}
    return toks, encs


#: ComfyUI's Flux detection (comfy/model_detection.py, image_model "flux") fixes the rotary axes at (16, 56, 56), so
#: a head is 128 wide; the tiny model has one head, one double and one single block.
FLUX_AXES = (16, 56, 56)
#: TAEF1's latent scale and shift, as ComfyUI's VAELoader sets them for "taef1" (latent_formats.Flux).
TAEF1_SCALE_SHIFT = (0.3611, 0.1159)


def flux_model_files(folder: str | os.PathLike[str], tiny: TinyComfy, *, guidance: bool = True) -> dict[str, str]:
    """A tiny Flux diffusion model and VAE, written as ComfyUI's loaders read them from its model folders.

    ``folder/diffusion_models/tiny-flux.safetensors``: a diffusers-format ``FluxTransformer2DModel`` (random
    weights, fixed seed) reading ``tiny``'s T5 width and CLIP-L pooled width, which ComfyUI's UNETLoader converts
    and detects as Flux (with the guidance input when ``guidance``, as FLUX.1-dev). ``folder/vae/tiny-taef1.safetensors``:
    ComfyUI's own tiny-autoencoder layout (``taesd_decoder.*``, 16 latent channels, TAEF1's scale and shift),
    random weights. Returns the file names by ComfyUI folder name.
    """
    from pathlib import Path

    import diffusers
    import safetensors.torch
    import torch

    from te_align.tiny._seed import seed_for, seeded

    if tiny.family != "flux":
        raise TeAlignError(f"flux_model_files needs the tiny flux text encoders, got {tiny.family}")
    t5 = tiny.components["text_encoder_2"].config.d_model
    pooled = tiny.components["text_encoder"].config.hidden_size
    with seeded(seed_for(f"comfy-flux-{guidance}")):
        model = diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=sum(FLUX_AXES),
            num_attention_heads=1, joint_attention_dim=t5, pooled_projection_dim=pooled, guidance_embeds=guidance,
            axes_dims_rope=FLUX_AXES,
        )
    root = Path(folder)
    names = {"diffusion_models": "tiny-flux.safetensors", "vae": "tiny-taef1.safetensors"}
    for sub in names:
        (root / sub).mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(root / "diffusion_models" / names["diffusion_models"]))

    import comfy.taesd.taesd as taesd  # ComfyUI's layout; its convolutions are left uninitialised, so fill them

    vae = taesd.TAESD(latent_channels=16)
    g = torch.Generator().manual_seed(seed_for("comfy-taef1"))
    vae_state: dict[str, torch.Tensor] = {}
    for k, v in vae.state_dict().items():
        if k.endswith(".weight"):
            fan_in = v[0].numel()
            vae_state[k] = torch.randn(v.shape, generator=g) * (2.0 / fan_in) ** 0.5
        else:
            vae_state[k] = torch.zeros(v.shape)
    vae_state["vae_scale"] = torch.tensor(TAEF1_SCALE_SHIFT[0])
    vae_state["vae_shift"] = torch.tensor(TAEF1_SCALE_SHIFT[1])
    safetensors.torch.save_file(vae_state, str(root / "vae" / names["vae"]))
    return names


__all__ = ["ENV", "PROFILES", "TinyComfy", "build", "fitted_profile", "flux_model_files", "import_comfyui",
           "reference_components"]
