"""diffusion-pipe probe adapter: each model class's real text-encoder functions from a checkout
(``TE_ALIGN_DIFFUSION_PIPE_DIR`` or ``--path``).

The model class (``models/<type>.py``) is made with ``__new__`` and given te-align's tiny diffusers pipeline (its
``__init__`` loads checkpoints; every class but Lumina 2 reaches the pipeline's components through
``self.diffusers_pipeline``, Lumina 2 holds ``tokenizer`` / ``text_encoder`` itself). Then, as the caching code does,
``get_call_text_encoder_fn(text_encoder)`` is asked for each text encoder and called on the captions, and the
results are put together as the class's ``prepare_inputs`` puts them together for the transformer (the lines are
named in each case's notes). Imports the encode paths never call (DeepSpeed, ComfyUI, the model submodules, …) are
stood in for.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from te_align._git import git_head
from te_align.probe import ProbeError, _stubs
from te_align.probe.adapter import Adapter, HooksUnavailable, _hf_quiet, _tiny
from te_align.probe.core import Case
from te_align.probe.matrix import Found
from te_align.trainers.api import find_checkout
from te_align.trainers.diffusion_pipe import SPEC, names

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from te_align.profiles import AlignmentProfile

# Function-local te_align imports in this module: load what only one command needs when it runs.

#: diffusion-pipe's text-encoder outputs by its names (a tensor; Qwen-Image: each caption's rows).
Calls = Callable[[list[str]], dict[str, Any]]
#: What a model's ``prepare_inputs`` hands the transformer for some prompts, by the profile's output names.
Run = Callable[[list[str]], dict[str, "torch.Tensor"]]

ENV_DIR = str(SPEC.env_dir)  # the trainer's one environment variable (its spec)
#: Packages diffusion-pipe's modules import at the top that these encode paths never call.
OPTIONAL = (
    "deepspeed", "comfy", "comfy_api", "torchvision", "imageio", "wandb", "multiprocess", "src", "Lumina_2",
    "hyvideo", "hi_diffusers", "hyimage", "ltx_video", "omnigen2", "cosmos1", "einops", "datasets", "av",
    "cv2", "optimi", "bitsandbytes", "unsloth", "flash_attn", "sageattention", "torchaudio", "loguru", "timm",
    "decord", "peft", "sentencepiece",
)
#: profile -> the model type probed for it.
PROFILES = {
    "flux-dev": "flux", "flux-schnell": "flux", "sd3-medium": "sd3", "sd35-large": "sd3",
    "sd35-medium": "sd3", "chroma": "chroma", "lumina2": "lumina_2", "qwen-image": "qwen_image",
    "auraflow": "auraflow",
}


def checkout_root(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    if not (p / "models" / "flux.py").is_file() or not (p / "utils" / "dataset.py").is_file():
        raise ProbeError(f"diffusion-pipe: {path} is not a tdrussell/diffusion-pipe checkout (no models/flux.py)")
    return p.resolve()


class DiffusionPipe(Adapter):
    name = "diffusion-pipe"

    def __init__(self, path: str | None) -> None:
        path = path or os.environ.get(ENV_DIR)
        if not path:
            raise ProbeError(f"diffusion-pipe: give --path to a tdrussell/diffusion-pipe checkout (or set {ENV_DIR})")
        self.root = checkout_root(path)
        self.location = str(self.root)
        head = git_head(self.root)
        self.version = head[:7] if head else "unknown (no git)"
        self.profiles = {p: f"models/{names.BY_TYPE[t].module}.py {names.BY_TYPE[t].cls}.get_call_text_encoder_fn"
                         for p, t in PROFILES.items()}
        self.modules: dict[str, ModuleType] = {}

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import diffusers  # noqa: F401  (decide optional packages before any stand-in exists)
        import transformers  # noqa: F401

        _hf_quiet()
        with _stubs.sandbox([self.root], [str(self.root)]), _stubs.stub_missing(OPTIONAL, [self.root]):
            for t in sorted(set(PROFILES.values())):
                mod = f"models.{names.BY_TYPE[t].module}"
                try:
                    self.modules[t] = importlib.import_module(mod)
                except Exception as e:
                    raise ProbeError(f"diffusion-pipe: cannot import {mod} from {self.root} ({type(e).__name__}: {e})") from None
            yield

    def case(self, profile_name: str) -> Case:
        t = PROFILES[profile_name]
        mt = names.BY_TYPE[t]
        prof, toks, encs, pipe = _tiny(profile_name)
        notes_extra: list[str] = []
        obj = getattr(self.modules[t], mt.cls).__new__(getattr(self.modules[t], mt.cls))
        obj.config = {"model": {"type": t, "dtype": "float32", "max_sequence_length": 256}}
        obj.model_config = obj.config["model"]
        if t == "lumina_2":
            obj.tokenizer, obj.text_encoder = toks["tokenizer"], encs["text_encoder"]
        elif t == "chroma":  # the T5 of a FLUX.1 diffusers folder (models/chroma.py:143)
            from types import SimpleNamespace

            obj.diffusers_pipeline = SimpleNamespace(tokenizer_2=toks["tokenizer"], text_encoder_2=encs["text_encoder"],
                                                     tokenizer_max_length=77)
            notes_extra = ["the T5 tokenizer and encoder in a FLUX.1 pipeline's tokenizer_2 / text_encoder_2 "
                           "(models/chroma.py:143)"]
        else:
            obj.diffusers_pipeline = pipe
        if t == "auraflow":
            obj.max_sequence_length = obj.model_config["max_sequence_length"]  # auraflow.py:28 ([model] is required)
        encoders = {"flux": ("text_encoder", "text_encoder_2"), "sd3": ("text_encoder", "text_encoder_2", "text_encoder_3"),
                    "chroma": ("text_encoder_2",)}.get(t, ("text_encoder",))
        notes = [f"{mt.cls}.get_call_text_encoder_fn(text_encoder)(captions, is_video) for "
                 f"{', '.join(encoders)}, object made with __new__ and te-align's tiny pipeline"]

        def calls(prompts: list[str]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for attr in encoders:
                fn = obj.get_call_text_encoder_fn(getattr(obj, attr))  # looked up per call (hooks)
                args = [prompts, [False] * len(prompts)]
                if len(inspect.signature(fn).parameters) == 3:
                    args.append(None)
                out.update(fn(*args))
            return out

        if t == "chroma":
            notes += notes_extra
        run: Run = _COMBINE[t](calls, notes)
        if profile_name == "flux-schnell":
            notes.append("FLUX.1 schnell: the same call as dev (models/flux.py:307-322 passes no T5 length)")
        return Case(prof, toks, encs, run, notes)

    @contextlib.contextmanager
    def hooked(self, profile: AlignmentProfile) -> Iterator[list[str]]:
        try:
            from te_align.trainers.diffusion_pipe import hooks

            hooks.uninstall()
            t = PROFILES[profile.name]
            installed = hooks.install(profile=profile, types=(t,), cache=False)
        except Exception as e:
            raise HooksUnavailable(f"{type(e).__name__}: {e}") from None
        if not installed:
            raise HooksUnavailable("disabled by TE_ALIGN=off")
        try:
            yield [f"hooks: te_align.trainers.diffusion_pipe.hooks.install(profile=..., types=('{t}',))"]
        finally:
            hooks.uninstall()


# ------------------------------------------------------------------------------------ prepare_inputs
def _flux(calls: Calls, notes: list[str]) -> Run:
    notes.append("prepare_inputs hands the transformer t5_embed and clip_embed (models/flux.py:324-346); text_ids: "
                 "zeros built there, not compared")

    def run(prompts: list[str]) -> dict[str, torch.Tensor]:
        out = calls(prompts)
        return {"prompt_embeds": out["t5_embed"], "pooled_prompt_embeds": out["clip_embed"]}

    return run


def _sd3(calls: Calls, notes: list[str]) -> Run:
    import torch

    notes.append("prepare_inputs concatenates CLIP-L/G, pads them to T5's width and appends T5 (models/sd3.py:109-123)")

    def run(prompts: list[str]) -> dict[str, torch.Tensor]:
        out = calls(prompts)
        clip = torch.cat([out["prompt_embed"], out["prompt_2_embed"]], dim=-1)
        clip = torch.nn.functional.pad(clip, (0, out["t5_prompt_embed"].shape[-1] - clip.shape[-1]))
        return {"prompt_embeds": torch.cat([clip, out["t5_prompt_embed"]], dim=-2),
                "pooled_prompt_embeds": torch.cat([out["pooled_prompt_embed"], out["pooled_prompt_2_embed"]], dim=-1)}

    return run


def _chroma(calls: Calls, notes: list[str]) -> Run:
    import torch

    notes.append("prompt_attention_mask: the text length Chroma's transformer attends to (the T5 mask plus one padding "
                 "token, modify_mask_to_attend_padding(…, 1): models/chroma.py:389-403), as a float mask like the "
                 "profile's; text_ids: zeros built in prepare_inputs, not compared")

    def run(prompts: list[str]) -> dict[str, torch.Tensor]:
        out = calls(prompts)
        mask = out["t5_attention_mask"]
        length = torch.clip(mask.sum(dim=-1).to(torch.int64) + 1, 0, mask.shape[1])
        used = (torch.arange(mask.shape[1])[None, :] < length[:, None]).to(out["t5_embed"].dtype)
        return {"prompt_embeds": out["t5_embed"], "prompt_attention_mask": used}

    return run


def _lumina(calls: Calls, notes: list[str]) -> Run:
    notes.append("captions without a caption_prefix (the dataset default, utils/dataset.py:733-763); prepare_inputs "
                 "hands the transformer prompt_embeds and prompt_masks (models/lumina_2.py:139-143)")

    def run(prompts: list[str]) -> dict[str, torch.Tensor]:
        out = calls(prompts)
        return {"prompt_embeds": out["prompt_embeds"], "prompt_attention_mask": out["prompt_masks"]}

    return run


def _qwen(calls: Calls, notes: list[str]) -> Run:
    import torch

    notes.append("each caption's real tokens are cached and padded to the batch's longest with the mask "
                 "(models/qwen_image.py:394-412; the mask is bool there, compared as int64)")

    def run(prompts: list[str]) -> dict[str, torch.Tensor]:
        rows = calls(prompts)["prompt_embeds"]
        longest = max(r.shape[0] for r in rows)
        embeds = torch.stack([torch.cat([u, u.new_zeros(longest - u.size(0), u.size(1))]) for u in rows])
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for i, r in enumerate(rows):
            mask[i, : r.shape[0]] = 1
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    return run


def _aura(calls: Calls, notes: list[str]) -> Run:
    notes.append("AuraFlowPipeline.encode_prompt(max_sequence_length=[model] max_sequence_length = 256); only "
                 "prompt_embeds is kept (models/auraflow.py:99-103)")

    def run(prompts: list[str]) -> dict[str, torch.Tensor]:
        return {"prompt_embeds": calls(prompts)["prompt_embeds"]}

    return run


_COMBINE = {"flux": _flux, "sd3": _sd3, "chroma": _chroma, "lumina_2": _lumina, "qwen_image": _qwen, "auraflow": _aura}
ADAPTER = DiffusionPipe


def find(environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
    """A diffusion-pipe checkout in ``TE_ALIGN_DIFFUSION_PIPE_DIR``."""
    return find_checkout(environ, SPEC, Found)
