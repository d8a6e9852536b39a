"""``te-align probe --trainer simpletuner``: SimpleTuner's own ``<Model>._encode_prompts`` on tiny models.

SimpleTuner (a checkout at ``--path`` / ``$TE_ALIGN_SIMPLETUNER_DIR``, or the installed package) is imported with
stand-ins for import-only packages it lacks here (torchvision, lycoris, fastapi …; :mod:`te_align.probe._stubs`).
Each probed model class is made with ``__new__`` (no weights) and given what ``_encode_prompts`` reads: the
tiny tokenizers and encoders in SimpleTuner's ``TEXT_ENCODER_CONFIGURATION`` order, an accelerator device, the
model's own pipeline class built around them, and a config whose text settings SimpleTuner's real
``check_user_config`` fills in from its defaults (SD3: T5 154). With hooks, :class:`te_align.trainers.simpletuner.hooks.
SimpleTunerHook` is installed on the same classes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._git import git_head
from te_align.probe import ProbeError, _stubs
from te_align.probe.adapter import Adapter, HooksUnavailable, _hf_quiet, _ordered, _tiny
from te_align.probe.core import Case
from te_align.probe.matrix import Found
from te_align.trainers.api import checkout
from te_align.trainers.simpletuner import SPEC
from te_align.trainers.simpletuner.hooks import FAMILIES, SimpleTunerHook

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

ENV = str(SPEC.env_dir)  # the trainer's one environment variable (its spec)
#: Import-only packages SimpleTuner's model modules need besides torch/transformers/diffusers/accelerate/peft.
OPTIONAL_IMPORTS = ("torchvision", "lycoris", "fastapi", "pandas", "starlette", "pydantic_settings", "sse_starlette",
                    "uvicorn", "wandb", "bitsandbytes", "optimum", "torchao", "cv2", "boto3", "botocore",
                    "decord", "torchaudio", "sentencepiece_stub", "xformers", "deepspeed", "prodigyopt",
                    "came_pytorch", "schedulefree", "lion_pytorch", "timm", "open_clip", "imageio",
                    "imageio_ffmpeg", "av", "trainingsample", "pillow_jxl", "pillow_avif", "atomicwrites",
                    "dotenv", "psutil", "toml", "colorama", "huggingface_hub_stub")

#: profile -> key of te_align.trainers.simpletuner.hooks.FAMILIES, and the config SimpleTuner is given.
PROBED: dict[str, tuple[str, dict[str, Any]]] = {
    "sd15": ("sd1x", {"model_family": "sd1x", "model_flavour": "1.5"}),
    "sd21": ("sd1x", {"model_family": "sd1x", "model_flavour": "2.1"}),
    "sdxl": ("sdxl", {"model_family": "sdxl"}),
    "sd3-medium": ("sd3", {"model_family": "sd3", "model_flavour": "medium"}),
    "sd35-large": ("sd3", {"model_family": "sd3", "model_flavour": "large"}),
    "sd35-medium": ("sd3", {"model_family": "sd3", "model_flavour": "medium"}),
    "flux-dev": ("flux", {"model_family": "flux", "model_flavour": "dev", "validation_num_inference_steps": 28}),
    # schnell stops unless --flux_fast_schedule (flux/model.py:1144-1148); no assistant LoRA is loaded here
    "flux-schnell": ("flux", {"model_family": "flux", "model_flavour": "schnell", "flux_fast_schedule": True,
                              "validation_num_inference_steps": 4, "disable_assistant_lora": True}),
    "pixart-sigma": ("pixart", {"model_family": "pixart_sigma"}),
    "chroma": ("chroma", {"model_family": "chroma"}),
    "auraflow": ("auraflow", {"model_family": "auraflow"}),
    "sana": ("sana", {"model_family": "sana"}),
    "lumina2": ("lumina2", {"model_family": "lumina2", "validation_num_inference_steps": 30}),
    "hidream": ("hidream", {"model_family": "hidream"}),
    "qwen-image": ("qwen_image", {"model_family": "qwen_image", "model_flavour": "v1.0"}),
    "wan21": ("wan", {"model_family": "wan", "model_flavour": "t2v-480p-1.3b-2.1",
                      "validation_num_inference_steps": 30}),
}

#: SimpleTuner config defaults the probed text paths and ``check_user_config`` read (the rest read as None).
CONFIG_DEFAULTS: dict[str, Any] = {
    "tokenizer_max_length": None, "i_know_what_i_am_doing": False, "t5_padding": "unmodified",
    "aspect_bucket_alignment": 64, "base_model_precision": "no_change", "unet_attention_slice": False,
    "controlnet": False, "sd3_clip_uncond_behaviour": "empty_string", "sd3_t5_uncond_behaviour": None,
    "flux_attention_masked_training": False, "prediction_type": None, "pretrained_model_name_or_path": "tiny",
    "attention_mechanism": "diffusers",
}


#: What SimpleTuner's ``simpletuner/helpers/training/diffusers_overrides.py`` changes in diffusers when imported
#: (every model module imports it): (module, owner in it, attributes). :meth:`SimpleTunerProbe.session` puts them
#: back, so diffusers' own ``QwenImagePipeline`` encodes as diffusers does again after a probe.
DIFFUSERS_PATCHED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("diffusers", "QwenImagePipeline", ("_get_qwen_prompt_embeds", "_simpletuner_original_get_qwen_prompt_embeds")),
    ("diffusers.models.transformers.transformer_qwenimage", "QwenDoubleStreamAttnProcessor2_0",
     ("__call__", "_simpletuner_original_call")),
    ("diffusers.models.attention_processor", "Attention",
     ("fuse_projections", "unfuse_projections", "_original_fuse_projections", "_original_unfuse_projections")),
    ("diffusers.loaders.lora_base", "LoraBaseMixin",
     ("unfuse_lora", "_simpletuner_unfuse_lora_tracking_patch", "_simpletuner_original_unfuse_lora")),
    ("diffusers.models.attention_dispatch", "TemplatedRingAnythingAttention", ("forward",)),
    ("diffusers.models.attention_dispatch", "", (
        "_cudnn_attention_backward_op", "_native_flash_attention_backward_op",
        "_simpletuner_original_cudnn_attention_backward_op", "_simpletuner_original_native_flash_attention_backward_op",
        "_simpletuner_templated_attention_backward_layout_patch")),
)
_MISSING = object()


@contextlib.contextmanager
def _diffusers_restored() -> Iterator[None]:
    """Undo :data:`DIFFUSERS_PATCHED` (and the flash hub-kernel names it rewrites) on the way out."""
    saved: list[tuple[Any, str, Any]] = []
    for module, owner, attrs in DIFFUSERS_PATCHED:
        try:
            obj = importlib.import_module(module)
            obj = getattr(obj, owner) if owner else obj
        except Exception:  # not in this diffusers: SimpleTuner cannot patch it either
            continue
        saved += [(obj, a, obj.__dict__.get(a, _MISSING) if isinstance(obj, type) else getattr(obj, a, _MISSING))
                  for a in attrs]
    try:
        from diffusers.models import attention_dispatch

        for config in getattr(attention_dispatch, "_HUB_KERNELS_REGISTRY", {}).values():
            saved += [(config, a, getattr(config, a, _MISSING)) for a in ("wrapped_forward_attr", "wrapped_backward_attr")]
    except Exception:
        pass
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            try:
                if value is _MISSING:
                    if attr in getattr(obj, "__dict__", {}):
                        delattr(obj, attr)
                else:
                    setattr(obj, attr, value)
            except (AttributeError, TypeError):
                pass


class _Config:
    """A SimpleTuner config namespace: set values, else the defaults above, else None (like an unset flag)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update({**CONFIG_DEFAULTS, **values})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _all_real(embeds: Any) -> Any:
    """The mask a None stands for: every position of ``embeds`` (batch, seq, dim) real, int64."""
    import torch

    return torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)


class _Accelerator:
    def __init__(self) -> None:
        import torch

        self.device = torch.device("cpu")
        self.num_processes = 1
        self.is_main_process = True


def _root(path: str | None) -> tuple[Path, str | None]:
    given = path or os.environ.get(ENV)
    if given:
        p = Path(given).expanduser()
        if (p / "simpletuner" / "helpers" / "models" / "common.py").is_file():
            return p.resolve(), str(p.resolve())
        raise ProbeError(f"simpletuner: {given} is not a bghira/SimpleTuner checkout (no "
                         "simpletuner/helpers/models/common.py)")
    spec = importlib.util.find_spec("simpletuner")
    if spec is None or not spec.submodule_search_locations:
        raise ProbeError(f"simpletuner: not installed; give --path to a bghira/SimpleTuner checkout (or set {ENV})")
    return Path(next(iter(spec.submodule_search_locations))).parent, None


class SimpleTunerProbe(Adapter):
    """Adapter (see :class:`te_align.probe.adapter.Adapter`) for SimpleTuner's model classes."""

    name = "simpletuner"

    def __init__(self, path: str | None) -> None:
        self.root, self.sys_path = _root(path)
        head = git_head(self.root)
        self.version = self._version() + (f" ({head[:7]})" if head else "")
        self.location = str(self.root)
        self.profiles = {p: f"{FAMILIES[f].cls}._encode_prompts (model_family {cfg['model_family']!r})"
                         for p, (f, cfg) in PROBED.items()}
        self.modules: dict[str, Any] = {}

    def _version(self) -> str:
        import re

        try:
            text = (self.root / "simpletuner" / "__init__.py").read_text(encoding="utf-8")
        except OSError:
            return "unknown"
        m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M)
        return m.group(1) if m else "unknown"


    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import diffusers  # noqa: F401  (decide optional packages before any stand-in exists)
        import transformers  # noqa: F401

        _hf_quiet()
        with _diffusers_restored(), _stubs.sandbox([self.root], [self.sys_path] if self.sys_path else []), \
                _stubs.stub_missing(OPTIONAL_IMPORTS, [self.root]):
            self.modules = {}
            level = logging.getLogger().level
            try:
                yield
            finally:
                logging.getLogger().setLevel(level)

    def _module(self, family: str) -> Any:
        mod = FAMILIES[family].module
        if mod not in self.modules:
            try:
                self.modules[mod] = importlib.import_module(mod)
            except Exception as e:
                raise ProbeError(f"simpletuner: cannot import {mod} from {self.root} ({type(e).__name__}: {e})") from None
            for name in ("simpletuner", mod):
                logging.getLogger(name).setLevel(logging.ERROR)
        return self.modules[mod]

    def _sana_default(self) -> Any:
        """SimpleTuner's default ``sana_complex_human_instruction`` as its argument parsing leaves it: the field's
        ``default_value`` in ``simpletuner/helpers/models/field_registry/sana.py`` (read from the checkout's source
        at run time; importing it imports every SimpleTuner model, which transformers 5 cannot), split into lines,
        each stripped, empty ones dropped (``simpletuner/helpers/configuration/cmd_args.py:355-390``)."""
        import ast

        file = self.root / "simpletuner" / "helpers" / "models" / "field_registry" / "sana.py"
        raw = None
        try:
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.keyword) and node.arg == "default_value":
                    value = node.value
                    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "join"
                            and isinstance(value.func.value, ast.Constant) and len(value.args) == 1):
                        raw = value.func.value.value.join(ast.literal_eval(value.args[0]))
                    else:
                        raw = ast.literal_eval(value)
                    break
        except (OSError, SyntaxError, ValueError) as e:
            raise ProbeError(f"simpletuner: cannot read the default sana_complex_human_instruction from {file} "
                             f"({type(e).__name__}: {e})") from None
        if not isinstance(raw, str):
            raise ProbeError(f"simpletuner: {file} has no text default for sana_complex_human_instruction")
        return [line.strip() for line in raw.splitlines() if line.strip()]

    def model(self, profile_name: str, toks: dict[str, Any], encs: dict[str, Any], pipe: Any) -> Any:
        """A ``__new__``-made SimpleTuner model of the profile's family with the tiny components."""
        family, cfg = PROBED[profile_name]
        mod = self._module(family)
        cls = getattr(mod, FAMILIES[family].cls)
        model = cls.__new__(cls)
        model.config = _Config(**cfg)
        if family == "sana":
            model.config.sana_complex_human_instruction = self._sana_default()
        model.accelerator = _Accelerator()
        model.tokenizers = _ordered(toks, "tokenizer")
        model.text_encoders = _ordered(encs, "text_encoder")
        model.model = None
        try:
            model.check_user_config()  # SimpleTuner's own defaults for the text settings (SD3: T5 154)
        except Exception as e:
            raise ProbeError(f"simpletuner: {cls.__name__}.check_user_config failed on the probe's config "
                             f"({type(e).__name__}: {e})") from None
        text2img = next(k for k in cls.PIPELINE_CLASSES if getattr(k, "name", str(k)).upper().endswith("TEXT2IMG"))
        pcls = cls.PIPELINE_CLASSES[text2img]
        params = inspect.signature(pcls.__init__).parameters
        components = {k: v for k, v in pipe.components.items() if k in params}
        try:
            pipeline = pcls(**components)
        except Exception as e:
            raise ProbeError(f"simpletuner: cannot build {pcls.__name__} around the tiny components "
                             f"({type(e).__name__}: {e})") from None
        model.pipelines = {text2img: pipeline}
        # QwenImage._encode_prompts goes through get_pipeline, which attaches get_vae() (loaded from the hub
        # when unset); the probe has no VAE and the text path does not use one: the pipeline's own (None) stays
        model.get_vae = lambda: getattr(pipeline, "vae", None)
        return model

    def case(self, profile_name: str) -> Case:
        family, cfg = PROBED[profile_name]
        prof, toks, encs, pipe = _tiny(profile_name)
        model = self.model(profile_name, toks, encs, pipe)
        returns = FAMILIES[family].returns
        c = model.config
        notes = [f"{FAMILIES[family].cls}._encode_prompts(prompts) on a __new__-made model; config after SimpleTuner's "
                 f"check_user_config: model_family={cfg['model_family']!r}, tokenizer_max_length="
                 f"{c.tokenizer_max_length!r}, t5_padding={c.t5_padding!r}"]
        if any(r.endswith("?") for r in returns):
            notes.append("a mask SimpleTuner returns as None (every position real) is compared as all ones (int64)")
        if any(r.endswith("@empty") for r in returns):
            notes.append("the empty prompt's embeds SimpleTuner also returns per prompt (cached as attention_masks) "
                         "are not a profile output of the prompts (not compared here)")
        if "t5_mask" in returns:
            notes.append("the T5 tokenizer mask SimpleTuner also returns is not a profile output (not compared); "
                         "text_ids: SimpleTuner repeats them over the batch, the first is compared")

        pipe_log = logging.getLogger(type(next(iter(model.pipelines.values()))).__module__)

        def run(prompts: list[str]) -> dict[str, Any]:
            level = pipe_log.level
            pipe_log.setLevel(logging.ERROR)  # pipelines log every truncated prompt (the suite has long ones)
            try:
                out = model._encode_prompts(prompts)
            finally:
                pipe_log.setLevel(level)
            values = out if isinstance(out, tuple) else (out,)
            got = {}
            for name, v in zip(returns, values, strict=True):
                if name.endswith("@batch"):  # SimpleTuner repeats a shared output over the batch: compare one
                    got[name.split("@", 1)[0]] = v[0]
                elif name.endswith("?"):  # None = every position real (the pipeline's own shorthand)
                    got[name[:-1]] = v if v is not None else _all_real(values[0])
                elif name != "t5_mask" and "@" not in name:  # @empty: not a profile output of these prompts
                    got[name] = v
            return got

        return Case(prof, toks, encs, run, notes)

    @contextlib.contextmanager
    def hooked(self, profile: AlignmentProfile) -> Iterator[list[str]]:
        family = next((f for p, (f, _) in PROBED.items() if p == profile.name), None)
        if family is None:
            raise HooksUnavailable(f"no SimpleTuner hook for profile {profile.name}")
        hook = SimpleTunerHook(profile=profile, families=(family,), cache=False)
        try:
            installed = hook.install()
        except Exception as e:
            raise HooksUnavailable(f"{type(e).__name__}: {e}") from None
        if not installed:
            raise HooksUnavailable("disabled by TE_ALIGN=off")
        try:
            yield [f"hooks: SimpleTunerHook(families=({family!r},)) on {hook.installed[0].target.label}"]
        finally:
            hook.uninstall()


ADAPTER = SimpleTunerProbe


def find(environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
    """A checkout in ``TE_ALIGN_SIMPLETUNER_DIR``, else the installed simpletuner package."""
    root = checkout(environ, SPEC)
    if root:
        return [Found("simpletuner", root, f"{ENV}={root}")], []
    if importlib.util.find_spec("simpletuner") is not None:
        return [Found("simpletuner", None, "installed simpletuner package")], []
    return [], [f"SimpleTuner: not installed and {ENV} is not set (path of a bghira/SimpleTuner checkout)"]
