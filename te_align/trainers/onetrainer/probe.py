"""Probe adapter for Nerogar/OneTrainer: each model's real ``encode_text`` on tiny encoders.

Plain (no hooks), the probe calls ``<Family>Model.encode_text(text=...)``, OneTrainer's own tokenization
(the sampling / new-embedding path, with the lengths its data loader uses: FLUX.1 ``text_encoder_2_sequence_length``
is passed TrainConfig's default 77, as the data loader tokenizes with it), one prompt per call (its signature
takes one ``str``; Chroma takes the group as a list, as its pruning is per batch), and feeds the result
through the model's own ``combine_text_encoder_output`` where OneTrainer has one (SDXL, SD3).

Hooked, it runs the training path: each caption tokenized as the hooked data loader's ``Tokenize`` does
(one caption per item, stacked into the batch), then ``encode_text(tokens_N=..., masks)`` on the batch.

The model objects are made with their own ``__init__(ModelType)`` and get the tiny tokenizers and
encoders as attributes; OneTrainer's modules import with stand-ins for missing optional packages
(:mod:`te_align.probe._stubs`; e.g. ``gguf``, ``parse``), none of which the encode path calls.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from te_align._git import git_head
from te_align.probe import ProbeError, _stubs
from te_align.probe.adapter import TINY_FAMILY, Adapter, HooksUnavailable, NotImportable, _hf_quiet
from te_align.probe.core import Case
from te_align.probe.matrix import Found
from te_align.profiles import profile as _profile
from te_align.tiny.fit import fit_profile
from te_align.trainers.api import find_checkout
from te_align.trainers.onetrainer import SPEC
from te_align.trainers.onetrainer.hooks import FAMILIES, RUN, _slots, loader_tokens

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path; load what only one command needs when it runs.

#: Environment variable naming a OneTrainer checkout (matrix and tests).
ENV_DIR = str(SPEC.env_dir)  # the trainer's one environment variable (its spec)
#: Optional packages OneTrainer's model modules import at the top that the encode path never calls.
OPTIONAL = ("gguf", "parse", "torchvision", "cv2", "bitsandbytes", "torchao", "optimum", "imagesize", "av",
            "scenedetect", "yt_dlp", "pooch", "omegaconf", "imwatermark", "open_clip", "dadaptation",
            "lion_pytorch", "prodigyopt", "schedulefree", "pytorch_optimizer", "prodigyplus", "adv_optm",
            "tensorboard", "customtkinter", "matplotlib", "scipy", "deepdiff", "psutil", "nvidia")


def mgds_dirs() -> list[Path]:
    """Where OneTrainer's data loader package ``mgds`` is installed (none: the data loader does not import)."""
    import importlib.util

    spec = importlib.util.find_spec("mgds")
    return [Path(p) for p in spec.submodule_search_locations] if spec is not None and spec.submodule_search_locations else []


def diffusers_gguf_dir() -> Path:
    """diffusers' GGUF quantizer package: OneTrainer imports its ``utils`` at the top, which imports ``gguf``."""
    import diffusers

    return Path(diffusers.__file__).parent / "quantizers" / "gguf"


def checkout_root(path: str | os.PathLike[str]) -> Path:
    """A OneTrainer checkout (has ``modules/model/BaseModel.py`` and ``scripts/train.py``), or ProbeError."""
    p = Path(path).expanduser()
    if not (p / "modules" / "model" / "BaseModel.py").is_file() or not (p / "scripts" / "train.py").is_file():
        raise ProbeError(f"onetrainer: {path} is not a OneTrainer checkout (no modules/model/BaseModel.py and scripts/train.py)")
    return p


class OneTrainer(Adapter):
    name = "onetrainer"
    #: profile -> (model class, ModelType member, OneTrainer encoder count).
    MODELS: ClassVar[dict[str, tuple[str, str, int]]] = {
        "sd15": ("StableDiffusionModel", "STABLE_DIFFUSION_15", 1),
        "sd21": ("StableDiffusionModel", "STABLE_DIFFUSION_21", 1),
        "sdxl": ("StableDiffusionXLModel", "STABLE_DIFFUSION_XL_10_BASE", 2),
        "sd3-medium": ("StableDiffusion3Model", "STABLE_DIFFUSION_3", 3),
        "sd35-large": ("StableDiffusion3Model", "STABLE_DIFFUSION_35", 3),
        "flux-dev": ("FluxModel", "FLUX_DEV_1", 2), "chroma": ("ChromaModel", "CHROMA_1", 1),
        "pixart-sigma": ("PixArtAlphaModel", "PIXART_SIGMA", 1), "sana": ("SanaModel", "SANA", 1),
        "hidream": ("HiDreamModel", "HI_DREAM_FULL", 4), "qwen-image": ("QwenModel", "QWEN", 1),
    }

    def __init__(self, path: str | None) -> None:
        path = path or os.environ.get(ENV_DIR)
        if not path:
            raise ProbeError(f"onetrainer: no --path to a OneTrainer checkout and {ENV_DIR} is not set")
        self.root = checkout_root(path)
        head = git_head(self.root)
        self.version = head[:7] if head else "unknown (no git)"
        self.location = str(self.root)
        self.profiles = {p: f"{cls}.encode_text" for p, (cls, _, _) in self.MODELS.items()}
        self._hooked = False


    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import diffusers  # noqa: F401  (decide optional packages before any stand-in exists)
        import transformers  # noqa: F401

        _hf_quiet()
        roots = [self.root, *mgds_dirs()]
        with _stubs.sandbox(roots, [str(self.root)]), _stubs.stub_missing(OPTIONAL, roots), \
                _stubs.stub_missing(("gguf",), [diffusers_gguf_dir()]):
            try:
                self.model_type = importlib.import_module("modules.util.enum.ModelType").ModelType
            except Exception as e:
                raise ProbeError(f"onetrainer: cannot import modules.util.enum.ModelType from {self.root} "
                                 f"({type(e).__name__}: {e})") from None
            yield

    def model(self, profile_name: str, toks: dict[str, Any], encs: dict[str, Any]) -> Any:
        """A OneTrainer model object of the profile's class with the tiny components as its encoders."""
        cls_name, mt, n = self.MODELS[profile_name]
        try:
            cls = getattr(importlib.import_module(f"modules.model.{cls_name}"), cls_name)
        except Exception as e:
            raise NotImportable(self.name, profile_name, f"modules.model.{cls_name}", f"{type(e).__name__}: {e}") from None
        model = cls(self.model_type[mt])
        names = ["tokenizer", "tokenizer_2", "tokenizer_3", "tokenizer_4"]
        for i in range(n):
            suffix = "" if n == 1 else f"_{i + 1}"
            setattr(model, f"tokenizer{suffix}", toks[names[i]])
            setattr(model, f"text_encoder{suffix}", encs[names[i].replace("tokenizer", "text_encoder")])
        return model

    def case(self, profile_name: str) -> Case:
        prof, toks, encs = tiny_components(profile_name)
        model = self.model(profile_name, toks, encs)
        cls_name = self.MODELS[profile_name][0]
        extra: dict[str, Any] = {"text_encoder_2_sequence_length": 77} if cls_name == "FluxModel" else {}
        notes = [f"{cls_name}.encode_text, object made with {cls_name}(ModelType.{self.MODELS[profile_name][1]})"]
        if cls_name not in ("ChromaModel", "QwenModel"):
            notes.append("without hooks: one prompt per encode_text call (its text is one str), so differences of "
                         "~1e-6 can come from the batch shape, not from OneTrainer's settings")
        if cls_name == "StableDiffusionModel" and clip_text_model_view(model.text_encoder):
            notes.append("the installed transformers' CLIPTextModel has no .text_model (OneTrainer pins transformers "
                         "5.5.4, which has): the tiny encoder gets text_model.final_layer_norm = its final_layer_norm")
        if cls_name == "FluxModel":
            notes.append("text_ids: OneTrainer builds them in the transformer call, not compared; "
                         "text_encoder_2_sequence_length=77 (TrainConfig default)")

        def outputs(out: Any) -> dict[str, Any]:
            import torch

            if cls_name == "StableDiffusionModel":
                return {"prompt_embeds": out}
            if cls_name in ("StableDiffusionXLModel", "StableDiffusion3Model"):
                emb, pooled = model.combine_text_encoder_output(*out)
                return {"prompt_embeds": emb, "pooled_prompt_embeds": pooled}
            if cls_name == "FluxModel":
                return {"prompt_embeds": out[0], "pooled_prompt_embeds": out[1]}
            if cls_name == "HiDreamModel":
                t5, llama, pooled = model.combine_text_encoder_output(*out)
                return {"prompt_embeds_t5": t5, "prompt_embeds_llama3": llama, "pooled_prompt_embeds": pooled}
            if cls_name == "QwenModel":  # a bool mask; compared in the profile's mask dtype
                want = {"int64": torch.long, "bool": torch.bool}.get(prof.slots[0].masks.denoiser_mask_dtype, out[0].dtype)
                return {"prompt_embeds": out[0], "prompt_embeds_mask": out[1].to(want)}
            mask = out[1].to(out[0].dtype) if cls_name == "ChromaModel" else out[1]  # Chroma: a bool mask
            return {"prompt_embeds": out[0], "prompt_attention_mask": mask}

        def plain(prompts: list[str]) -> dict[str, Any]:
            import torch

            if cls_name in ("ChromaModel", "QwenModel"):  # a list of prompts, pruned per batch
                return outputs(model.encode_text(train_device=torch.device("cpu"), batch_size=len(prompts), text=prompts))
            rows = [outputs(model.encode_text(train_device=torch.device("cpu"), batch_size=1, text=p, **extra)) for p in prompts]
            return {k: torch.cat([r[k] for r in rows], dim=1 if k == "prompt_embeds_llama3" else 0) for k in rows[0]}

        def hooked(prompts: list[str]) -> dict[str, Any]:
            import torch

            fam = next(f for f in FAMILIES.values() if f.model_class == cls_name)
            p = RUN.profile_for(model, fam)
            kwargs: dict[str, Any] = {}
            for e, slot in _slots(p, fam, model):
                tok = getattr(model, e.tokenizer)
                parts = [loader_tokens(slot, tok, x) for x in prompts]  # one caption per data loader item
                kwargs[e.tokens] = torch.cat([ids for ids, _ in parts])
                if e.mask is not None:
                    kwargs[e.mask] = torch.cat([m for _, m in parts])
            return outputs(model.encode_text(train_device=torch.device("cpu"), batch_size=len(prompts), **kwargs, **extra))

        def run(prompts: list[str]) -> dict[str, Any]:
            with torch_no_grad():
                return hooked(prompts) if self._hooked else plain(prompts)

        return Case(prof, toks, encs, run, notes)

    @contextlib.contextmanager
    def hooked(self, profile: AlignmentProfile) -> Iterator[list[str]]:
        try:
            from te_align.trainers.onetrainer import hooks as hooks

            installed = hooks.install(profile=profile, parts=("models",))
        except Exception as e:
            raise HooksUnavailable(f"{type(e).__name__}: {e}") from None
        if not installed:
            raise HooksUnavailable("disabled by TE_ALIGN=off")
        self._hooked = True
        try:
            yield ["hooks: te_align.trainers.onetrainer.hooks parts=('models',); captions tokenized as the hooked data loader "
                   "tokenizes them (one per item), then encode_text(tokens_N=...)"]
        finally:
            self._hooked = False
            hooks.uninstall()


def tiny_components(profile_name: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(fitted profile, tokenizers, text encoders) of the profile's tiny family (:mod:`te_align.tiny`)."""
    from te_align.tiny.pipelines import build_pipeline_for_encoding
    from te_align.tiny.tokenizers import clip_bpe_path

    try:
        clip_bpe_path()
    except FileNotFoundError as e:
        raise ProbeError(str(e)) from None
    pipe = build_pipeline_for_encoding(TINY_FAMILY.get(profile_name, profile_name))
    comps = {k: v for k, v in pipe.components.items() if k.startswith(("tokenizer", "text_encoder")) and v is not None}
    prof = fit_profile(_profile(profile_name), comps)
    return prof, {k: v for k, v in comps.items() if k.startswith("tokenizer")}, {k: v for k, v in comps.items() if k.startswith("text_encoder")}


def clip_text_model_view(encoder: Any) -> bool:
    """Give a transformers >= 5.6 ``CLIPTextModel`` (no ``.text_model``) the ``text_model.final_layer_norm``
    OneTrainer's ``encode_clip`` reads (transformers 5.5.4, which OneTrainer pins, has it). True if added."""
    import types

    if hasattr(encoder, "text_model") or not hasattr(encoder, "final_layer_norm"):
        return False
    object.__setattr__(encoder, "text_model", types.SimpleNamespace(final_layer_norm=encoder.final_layer_norm))
    return True


@contextlib.contextmanager
def torch_no_grad() -> Iterator[None]:
    import torch

    with torch.no_grad():
        yield


ADAPTER = OneTrainer


def find(environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
    """A OneTrainer checkout in ``TE_ALIGN_ONETRAINER_DIR``."""
    return find_checkout(environ, SPEC, Found)
