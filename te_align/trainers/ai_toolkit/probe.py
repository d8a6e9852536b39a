"""ai-toolkit probe adapter: its real ``toolkit.train_tools`` encode functions (and, in a checkout whose model modules
import, ``StableDiffusion.encode_prompt`` / ``BaseModel.encode_prompt``) next to :func:`te_align.encode`.

``toolkit.stable_diffusion_model`` needs ai-toolkit's GPU-only dependencies (and transformers classes removed in
transformers 5), so where it does not import its source is parsed and the literal arguments of its
``train_tools.<fn>(...)`` call (e.g. Flux ``max_length=512``) are used, each evaluated with ``encode_prompt``'s own
defaults.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from te_align._git import dist_version, installed_version, read_version
from te_align.probe import ProbeError, _stubs
from te_align.probe.adapter import (
    OPTIONAL_IMPORTS,
    Adapter,
    HooksUnavailable,
    NotImportable,
    _hf_quiet,
    _ordered,
    _tiny,
)
from te_align.probe.core import Case
from te_align.probe.matrix import Found
from te_align.trainers.ai_toolkit import SPEC
from te_align.trainers.ai_toolkit import probe_models as am
from te_align.trainers.ai_toolkit.probe_models import BASE_MODEL_PROFILES, LEGACY, import_model_classes
from te_align.trainers.api import checkout

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.


class _Unevaluable(Exception):
    pass


def _eval_arg(node: ast.AST, env: dict[str, Any]) -> Any:
    """Evaluate one argument expression of ai-toolkit's call with ``encode_prompt``'s defaults."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        dotted = ast.unparse(node)
        if dotted in env:
            return env[dotted]
        raise _Unevaluable(dotted)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval_arg(node.operand, env)
    if isinstance(node, ast.IfExp):
        return _eval_arg(node.body if _eval_arg(node.test, env) else node.orelse, env)
    raise _Unevaluable(ast.unparse(node))


def _encode_prompt_calls(source: str) -> dict[str, ast.Call]:
    """First ``train_tools.<fn>(...)`` call per function inside ``StableDiffusion.encode_prompt``."""
    tree = ast.parse(source)
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "StableDiffusion":
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "encode_prompt":
                    calls: dict[str, ast.Call] = {}
                    for node in ast.walk(fn):
                        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                and isinstance(node.func.value, ast.Name) and node.func.value.id == "train_tools"):
                            calls.setdefault(node.func.attr, node)
                    return calls
    return {}


class AiToolkit(Adapter):
    name = "ai-toolkit"
    #: profile -> train_tools function StableDiffusion.encode_prompt uses for it.
    FUNCTIONS: ClassVar[dict[str, str]] = {
        "sd15": "encode_prompts", "sd21": "encode_prompts", "sdxl": "encode_prompts_xl",
        "sd3-medium": "encode_prompts_sd3", "sd35-large": "encode_prompts_sd3",
        "sd35-medium": "encode_prompts_sd3", "flux-dev": "encode_prompts_flux",
        "flux-schnell": "encode_prompts_flux", "pixart-sigma": "encode_prompts_pixart",
        "auraflow": "encode_prompts_auraflow",
    }

    def __init__(self, path: str | None) -> None:
        self.profiles = {p: f"toolkit.train_tools.{fn} as StableDiffusion.encode_prompt calls it" for p, fn in self.FUNCTIONS.items()}
        if path is None:
            spec = importlib.util.find_spec("ostris_ai_toolkit")
            if spec is None or not spec.submodule_search_locations:
                raise ProbeError("ai-toolkit: ostris-ai-toolkit is not installed and no --path to an ai-toolkit checkout was given")
            root = Path(next(iter(spec.submodule_search_locations)))
            self.layout, self.root, self.sys_path = "pypi", root, None
        else:
            p = Path(path).expanduser()
            if not p.is_dir():
                raise ProbeError(f"ai-toolkit: {path} is not a folder")
            if (p / "toolkit" / "train_tools.py").is_file() and (p / "toolkit" / "stable_diffusion_model.py").is_file():
                if p.name == "ostris_ai_toolkit":
                    self.layout, self.root, self.sys_path = "pypi", p, str(p.parent)
                else:
                    self.layout, self.root, self.sys_path = "current", p, str(p)
            elif (p / "ostris_ai_toolkit" / "toolkit" / "train_tools.py").is_file():
                self.layout, self.root, self.sys_path = "pypi", p / "ostris_ai_toolkit", str(p)
            else:
                raise ProbeError(f"ai-toolkit: {path} is not an ai-toolkit installation (no toolkit/train_tools.py "
                                 "and toolkit/stable_diffusion_model.py)")
        self.prefix = "ostris_ai_toolkit." if self.layout == "pypi" else ""
        if self.layout == "pypi":
            found = installed_version("ostris-ai-toolkit") if path is None else dist_version(self.root.parent, "ostris_ai_toolkit")
            self.version = found or "unknown"
        else:
            self.version = read_version(self.root / "version.py") or "unknown"
        self.location = str(self.root)
        self._calls: dict[str, ast.Call] = {}
        self._source_file = self.root / "toolkit" / "stable_diffusion_model.py"
        self.classes: dict[str, Any] | None = None
        self.model_error: str | None = None
        self._parts: dict[str, tuple[str, ...]] = {}
        if self.layout == "current":
            for p in LEGACY:
                self.profiles[p] = ("StableDiffusion.encode_prompt (where ai-toolkit's model modules import; "
                                    "else " + self.profiles.get(p, "not probed") + ")")
            for p, fam in BASE_MODEL_PROFILES.items():
                self.profiles[p] = f"{BASE_MODEL_CLASSES[fam]}.encode_prompt -> get_prompt_embeds (BaseModel)"

    def label(self, path: str | None) -> str:
        return f"{self.name} {self.version}" + (" (PyPI)" if path is None else "")

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import diffusers  # noqa: F401  (decide optional packages before any stand-in exists)
        import transformers  # noqa: F401

        _hf_quiet()
        with _stubs.sandbox([self.root], [self.sys_path] if self.sys_path else []), _albumentations_offline():
            if self.layout == "current":
                self._import_models()
            with _stubs.stub_missing(OPTIONAL_IMPORTS, [self.root]):
                yield from self._session_train_tools()

    def _import_models(self) -> None:
        """ai-toolkit's model classes, imported for real (no stand-ins); else the reason, kept for the cells."""
        self.classes, self.model_error = None, None
        try:
            self.classes = import_model_classes()
        except Exception as e:
            self.model_error = f"{type(e).__name__}: {e}"

    def _session_train_tools(self) -> Iterator[None]:
        if self.layout == "pypi":
            _stubs.register_package_without_init("ostris_ai_toolkit")
        try:
            self.train_tools = importlib.import_module(f"{self.prefix}toolkit.train_tools")
        except Exception as e:
            raise ProbeError(f"ai-toolkit: cannot import {self.prefix}toolkit.train_tools from {self.root} "
                             f"({type(e).__name__}: {e})") from None
        self._calls = _encode_prompt_calls(self._source_file.read_text(encoding="utf-8"))
        yield

    def _attn_masking_default(self) -> bool:
        try:
            mod = importlib.import_module(f"{self.prefix}toolkit.config_modules")
            return bool(getattr(mod.ModelConfig(), "attn_masking", False))
        except Exception:
            return False

    def case(self, profile_name: str) -> Case:
        model_level = self.layout == "current" and (profile_name in BASE_MODEL_PROFILES or profile_name in LEGACY)
        if model_level and self.classes is not None:
            return self._model_case(profile_name)
        if model_level and profile_name not in self.FUNCTIONS:
            fam = BASE_MODEL_PROFILES.get(profile_name)
            where = f"{BASE_MODEL_CLASSES[fam]}.encode_prompt" if fam else "StableDiffusion.encode_prompt"
            raise NotImportable(self.name, profile_name, where, str(self.model_error))
        case = self._train_tools_case(profile_name)
        if model_level:
            case.notes.append(f"StableDiffusion.encode_prompt is not importable here ({self.model_error}): "
                              "its train_tools call is replayed")
        return case

    def _model_case(self, profile_name: str) -> Case:
        """The real ``StableDiffusion.encode_prompt`` / ``BaseModel.encode_prompt`` on a ``__new__``-made object."""
        assert self.classes is not None
        prof, toks, encs, pipe = _tiny(profile_name)
        notes = [n for n in (self.classes.get("package_note"),) if n]
        if profile_name in am.BASE_MODEL_PROFILES:
            fam = am.BASE_MODEL_PROFILES[profile_name]
            model, _ = am.base_model(self.classes, fam, pipe)
            self._parts[profile_name] = ("models",)
            notes.append(f"{BASE_MODEL_CLASSES[fam]}.encode_prompt(prompts) -> get_prompt_embeds, object made with "
                         f"__new__ (no weights), model: {am.BASE_MODELS[fam][1]}")
        else:
            model = am.legacy_model(self.classes, profile_name, pipe)
            self._parts[profile_name] = ("train_tools", "legacy")
            notes.append(f"StableDiffusion.encode_prompt(prompts) with its defaults, object made with __new__ "
                         f"(no weights), model: {am.LEGACY[profile_name][0]}")
        if profile_name == "chroma":
            notes.append("prompt_attention_mask: the text length ai-toolkit's Chroma transformer uses (tokenizer mask "
                         "+ attn_padding=1, src/model.py), as a float mask like the profile's")

        def run(prompts: list[str]) -> dict[str, Any]:
            log = logging.getLogger(type(model.pipeline).__module__)  # HiDream's pipeline logs every truncation
            level = log.level
            log.setLevel(logging.ERROR)
            try:
                return _prompt_embeds_outputs(profile_name, model.encode_prompt(prompts))
            finally:
                log.setLevel(level)

        return Case(prof, toks, encs, run, notes)

    def _train_tools_case(self, profile_name: str) -> Case:
        self._parts[profile_name] = ("train_tools",)
        fn_name = self.FUNCTIONS[profile_name]
        call = self._calls.get(fn_name)
        if call is None:
            raise ProbeError(f"ai-toolkit: StableDiffusion.encode_prompt in {self._source_file} does not call train_tools.{fn_name}")
        fn = getattr(self.train_tools, fn_name)  # for the signature; run() looks it up per call (hooks)
        prof, toks, encs, pipe = _tiny(profile_name)
        tok_list, enc_list = _ordered(toks, "tokenizer"), _ordered(encs, "text_encoder")
        many = fn_name in ("encode_prompts_xl", "encode_prompts_sd3", "encode_prompts_flux")
        env: dict[str, Any] = {
            "self.tokenizer": tok_list if many else tok_list[0],
            "self.text_encoder": enc_list if many else enc_list[0],
            "self.pipeline": pipe, "prompt2": None, "num_images_per_prompt": 1, "long_prompts": False,
            "max_length": None, "dropout_prob": 0.0, "force_all": False, "use_encoder_1": True,
            "use_encoder_2": True,
            "self.model_config.attn_masking": self._attn_masking_default(),
            "self.model_config.is_pixart_sigma": profile_name == "pixart-sigma",
        }
        params = list(inspect.signature(fn).parameters)
        kwargs: dict[str, Any] = {}
        shown: list[str] = []
        prompt_param = None
        try:
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Name) and arg.id == "prompt":
                    prompt_param = params[i]
                    continue
                kwargs[params[i]] = _eval_arg(arg, env)
            for kw in call.keywords:
                if kw.arg is None:
                    raise _Unevaluable("**kwargs")
                if isinstance(kw.value, ast.Name) and kw.value.id == "prompt":
                    prompt_param = kw.arg
                    continue
                kwargs[kw.arg] = _eval_arg(kw.value, env)
                if not kw.arg.startswith(("tokenizer", "text_encoder", "pipeline")):
                    shown.append(f"{kw.arg}={ast.unparse(kw.value)}→{kwargs[kw.arg]!r}")
        except _Unevaluable as e:
            raise ProbeError(f"ai-toolkit: cannot evaluate argument {e} of train_tools.{fn_name}(...) at "
                             f"{self._source_file.name}:{call.lineno}") from None
        if prompt_param is None:
            raise ProbeError(f"ai-toolkit: train_tools.{fn_name}(...) at {self._source_file.name}:{call.lineno} gets no prompt")
        rel = "toolkit/stable_diffusion_model.py"
        notes = [f"ai-toolkit call ({rel}:{call.lineno}): train_tools.{fn_name}(" + ", ".join(shown) + ")"]
        if fn_name in ("encode_prompts_flux",):
            notes.append("text_ids: ai-toolkit builds zero txt_ids in the transformer call, not compared")

        def run(prompts: list[str]) -> dict[str, Any]:
            out = getattr(self.train_tools, fn_name)(**{prompt_param: prompts}, **kwargs)
            if fn_name == "encode_prompts":
                return {"prompt_embeds": out}
            if fn_name == "encode_prompts_pixart":
                return {"prompt_embeds": out[0], "prompt_attention_mask": out[1]}
            if fn_name == "encode_prompts_auraflow":
                mask = out[1]
                return {"prompt_embeds": out[0], "prompt_attention_mask": mask[..., 0] if mask.dim() == 3 else mask}
            return {"prompt_embeds": out[0], "pooled_prompt_embeds": out[1]}

        return Case(prof, toks, encs, run, notes)

    @contextlib.contextmanager
    def hooked(self, profile: AlignmentProfile) -> Iterator[list[str]]:
        try:
            from te_align.trainers.ai_toolkit.hooks import AiToolkitHook

            parts = self._parts.get(profile.name, ("train_tools",))
            hook = AiToolkitHook(profile=profile, layout=self.layout, parts=parts)
            installed = hook.install()
        except Exception as e:  # the hook module is someone else's work in progress: never fail the probe
            raise HooksUnavailable(f"{type(e).__name__}: {e}") from None
        if not installed:
            raise HooksUnavailable("disabled by TE_ALIGN=off")
        try:
            why = "" if parts != ("train_tools",) else " (StableDiffusion.encode_prompt is not called on this path)"
            yield [f"hooks: AiToolkitHook parts={parts}{why}"]
        finally:
            hook.uninstall()


def _prompt_embeds_outputs(profile_name: str, pe: Any) -> dict[str, Any]:
    """ai-toolkit's ``PromptEmbeds`` as the profile's output names."""
    import torch

    embeds, pooled, mask = pe.text_embeds, getattr(pe, "pooled_embeds", None), getattr(pe, "attention_mask", None)
    if profile_name == "hidream":
        t5, llama = embeds
        return {"prompt_embeds_t5": t5, "prompt_embeds_llama3": llama, "pooled_prompt_embeds": pooled}
    out: dict[str, Any] = {"prompt_embeds": embeds}
    if pooled is not None:
        out["pooled_prompt_embeds"] = pooled
    if mask is not None:
        if profile_name == "qwen-image":
            out["prompt_embeds_mask"] = mask
        elif profile_name == "chroma":
            length = torch.clip(mask.sum(dim=-1).to(torch.int64) + 1, 0, mask.shape[1])
            out["prompt_attention_mask"] = (torch.arange(mask.shape[1])[None, :] < length[:, None]).to(embeds.dtype)
        else:  # AuraFlow's mask comes expanded over the embedding width
            out["prompt_attention_mask"] = mask[..., 0] if mask.dim() == 3 else mask
    return out


#: ai-toolkit class per BaseModel family key (te_align.trainers.ai_toolkit.probe_models.BASE_MODELS)
BASE_MODEL_CLASSES = {"chroma": "ChromaModel", "hidream": "HidreamModel", "qwen-image": "QwenImageModel", "wan": "Wan21"}


@contextlib.contextmanager
def _albumentations_offline() -> Iterator[None]:
    """albumentations asks PyPI for updates when imported; NO_ALBUMENTATIONS_UPDATE=1 for the session."""
    key = "NO_ALBUMENTATIONS_UPDATE"
    before = os.environ.get(key)
    os.environ.setdefault(key, "1")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)




ADAPTER = AiToolkit
ENV_DIR = str(SPEC.env_dir)  # the trainer's one environment variable (its spec)


def find(environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
    """The installed ostris-ai-toolkit package and/or a checkout in ``TE_ALIGN_AI_TOOLKIT_DIR``."""
    found = []
    installed = importlib.util.find_spec("ostris_ai_toolkit") is not None
    if installed:
        found.append(Found("ai-toolkit", None, "installed ostris-ai-toolkit package"))
    root = checkout(environ, SPEC)
    if root:
        found.append(Found("ai-toolkit", root, f"{ENV_DIR}={root}"))
    if not found:
        return [], [f"ai-toolkit: ostris-ai-toolkit is not installed and {ENV_DIR} is not set"]
    return found, []
