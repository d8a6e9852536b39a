"""Per-trainer adapters: import the trainer's real encoding code and call it as the trainer does.

* ai-toolkit (``ostris-ai-toolkit`` PyPI package, or a checkout): the real ``toolkit.train_tools``
  encode functions, called with the arguments ``StableDiffusion.encode_prompt`` passes them. That
  method's module needs ai-toolkit's GPU-only dependencies (and transformers classes removed in
  transformers 5), so it is not imported: its source is parsed and the literal arguments of its
  ``train_tools.<fn>(...)`` call (e.g. Flux ``max_length=512``) are used, each evaluated with
  ``encode_prompt``'s own defaults.
* kohya (sd-scripts checkout): the real ``library.strategy_<arch>`` tokenize and text-encoding
  strategies, constructed with sd-scripts' argument defaults, tokenizers loaded through sd-scripts'
  own ``--tokenizer_cache_dir`` path.

Missing third-party imports of the trainers' modules are stood in for (:mod:`te_align.probe._stubs`);
nothing the encode paths call is a stand-in.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from te_align._git import dist_version, git_head, installed_version, read_version
from te_align.probe import ProbeError, _stubs
from te_align.probe.core import Case

TRAINERS = ("ai-toolkit", "kohya", "simpletuner", "onetrainer", "diffusers-examples")
ALIASES = {"ai_toolkit": "ai-toolkit", "aitoolkit": "ai-toolkit", "ostris": "ai-toolkit", "sd-scripts": "kohya",
           "sd_scripts": "kohya", "kohya-ss": "kohya", "kohya_ss": "kohya", "simple-tuner": "simpletuner",
           "diffusers": "diffusers-examples", "diffusers_examples": "diffusers-examples"}  # fmt: skip
#: tiny-model family (te_align.tiny.encoders.family_components) per bundled profile.
TINY_FAMILY = {"sd15": "sd15", "sd21": "sd21", "sdxl": "sdxl", "sd3-medium": "sd3", "sd35-large": "sd3",
               "sd35-medium": "sd3", "flux-dev": "flux", "flux-schnell": "flux", "chroma": "chroma",
               "pixart-sigma": "pixart-sigma", "auraflow": "auraflow", "lumina2": "lumina2", "hidream": "hidream",
               "qwen-image": "qwen-image", "wan21": "wan21", "hunyuanimage-2.1": "hunyuanimage", "sana": "sana"}  # fmt: skip

#: Third-party packages whose absence must not stop a trainer module from importing (stood in).
OPTIONAL_IMPORTS = (
    "torchvision", "cv2", "library", "leco", "networks", "optimum", "lycoris", "k_diffusion", "bitsandbytes",
    "prodigyopt", "dadaptation", "albumentations", "controlnet_aux", "timm", "kornia", "lpips", "gradio",
    "imwatermark", "torchao", "ip_adapter", "open_clip", "clip", "xformers", "lion_pytorch", "schedulefree",
)  # fmt: skip


class HooksUnavailable(Exception):
    """te-align's hooks for this trainer cannot be installed here (the reason is the message)."""


class NotImportable(ProbeError):
    """The trainer code path for a profile does not import in this environment (a measured fact, not a failure).

    ``reason`` is the import error; the matrix shows the cell as ``not importable here: <reason>``.
    """

    def __init__(self, trainer: str, profile: str, where: str, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{trainer}: {where} (profile {profile}) is not importable here: {reason}")


def _hf_quiet() -> None:
    with contextlib.suppress(Exception):
        import diffusers.utils.logging as dlog
        import transformers.utils.logging as tlog

        dlog.set_verbosity_error()
        tlog.set_verbosity_error()


class Adapter:
    name = ""
    version = "unknown"
    location = ""
    #: profile name -> short description of the trainer code path probed (set per instance).
    profiles: dict[str, str]

    def __init__(self, path: str | None) -> None:  # pragma: no cover - subclasses
        self.profiles = {}

    def profile_name(self, name: str) -> str:
        from te_align.profiles import profile as load

        canonical = load(name).name
        if canonical not in self.profiles:
            raise ProbeError(f"{self.name} {self.version} has no encoding path te-align can probe for profile "
                             f"'{canonical}'; probed profiles: {', '.join(self.profiles)}")  # fmt: skip
        return canonical

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        yield

    def case(self, profile_name: str) -> Case:
        raise NotImplementedError

    @contextlib.contextmanager
    def hooked(self, profile: Any) -> Iterator[list[str]]:
        raise HooksUnavailable("te-align has no hooks for this trainer")
        yield []  # pragma: no cover


def _tiny(profile_name: str, **replace: Any) -> tuple[Any, dict[str, Any], dict[str, Any], Any]:
    """(fitted profile, tokenizers, text encoders, diffusers pipeline) for a profile's tiny family."""
    import te_align
    from te_align.tiny.fit import fit_profile
    from te_align.tiny.pipelines import build_pipeline_for_encoding
    from te_align.tiny.tokenizers import clip_bpe_path

    try:
        clip_bpe_path()
    except FileNotFoundError as e:
        raise ProbeError(str(e)) from None
    pipe = build_pipeline_for_encoding(TINY_FAMILY[profile_name], **replace)
    comps = {k: v for k, v in pipe.components.items() if k.startswith(("tokenizer", "text_encoder")) and v is not None}
    prof = fit_profile(te_align.profile(profile_name), comps)
    toks = {k: v for k, v in comps.items() if k.startswith("tokenizer")}
    encs = {k: v for k, v in comps.items() if k.startswith("text_encoder")}
    return prof, toks, encs, pipe


def _ordered(table: dict[str, Any], kind: str) -> list[Any]:
    return [table[k] for k in sorted(table, key=lambda k: (len(k), k)) if k.startswith(kind)]


# ==============================================================================================
# ai-toolkit
# ==============================================================================================
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
                                and isinstance(node.func.value, ast.Name) and node.func.value.id == "train_tools"):  # fmt: skip
                            calls.setdefault(node.func.attr, node)
                    return calls
    return {}


class AiToolkit(Adapter):
    name = "ai-toolkit"
    #: profile -> train_tools function StableDiffusion.encode_prompt uses for it.
    FUNCTIONS: ClassVar[dict[str, str]] = {"sd15": "encode_prompts", "sd21": "encode_prompts", "sdxl": "encode_prompts_xl",
                 "sd3-medium": "encode_prompts_sd3", "sd35-large": "encode_prompts_sd3",
                 "sd35-medium": "encode_prompts_sd3", "flux-dev": "encode_prompts_flux",
                 "flux-schnell": "encode_prompts_flux", "pixart-sigma": "encode_prompts_pixart",
                 "auraflow": "encode_prompts_auraflow"}  # fmt: skip

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
                                 "and toolkit/stable_diffusion_model.py)")  # fmt: skip
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
            from te_align.probe.ai_toolkit_models import BASE_MODEL_PROFILES, LEGACY

            for p in LEGACY:
                self.profiles[p] = ("StableDiffusion.encode_prompt (where ai-toolkit's model modules import; "
                                    "else " + self.profiles.get(p, "not probed") + ")")  # fmt: skip
            for p, fam in BASE_MODEL_PROFILES.items():
                self.profiles[p] = f"{BASE_MODEL_CLASSES[fam]}.encode_prompt -> get_prompt_embeds (BaseModel)"

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
        from te_align.probe.ai_toolkit_models import import_model_classes

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
                             f"({type(e).__name__}: {e})") from None  # fmt: skip
        self._calls = _encode_prompt_calls(self._source_file.read_text(encoding="utf-8"))
        yield

    def _attn_masking_default(self) -> bool:
        try:
            mod = importlib.import_module(f"{self.prefix}toolkit.config_modules")
            return bool(getattr(mod.ModelConfig(), "attn_masking", False))
        except Exception:
            return False

    def case(self, profile_name: str) -> Case:
        from te_align.probe.ai_toolkit_models import BASE_MODEL_PROFILES, LEGACY

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
                              "its train_tools call is replayed")  # fmt: skip
        return case

    def _model_case(self, profile_name: str) -> Case:
        """The real ``StableDiffusion.encode_prompt`` / ``BaseModel.encode_prompt`` on a ``__new__``-made object."""
        from te_align.probe import ai_toolkit_models as am

        assert self.classes is not None
        prof, toks, encs, pipe = _tiny(profile_name)
        notes = [n for n in (self.classes.get("package_note"),) if n]
        if profile_name in am.BASE_MODEL_PROFILES:
            fam = am.BASE_MODEL_PROFILES[profile_name]
            model, _ = am.base_model(self.classes, fam, pipe)
            self._parts[profile_name] = ("models",)
            notes.append(f"{BASE_MODEL_CLASSES[fam]}.encode_prompt(prompts) -> get_prompt_embeds, object made with "
                         f"__new__ (no weights), model: {am.BASE_MODELS[fam][1]}")  # fmt: skip
        else:
            model = am.legacy_model(self.classes, profile_name, pipe)
            self._parts[profile_name] = ("train_tools", "legacy")
            notes.append(f"StableDiffusion.encode_prompt(prompts) with its defaults, object made with __new__ "
                         f"(no weights), model: {am.LEGACY[profile_name][0]}")  # fmt: skip
        if profile_name == "chroma":
            notes.append("prompt_attention_mask: the text length ai-toolkit's Chroma transformer uses (tokenizer mask "
                         "+ attn_padding=1, src/model.py), as a float mask like the profile's")  # fmt: skip

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
            "self.tokenizer": tok_list if many else tok_list[0], "self.text_encoder": enc_list if many else enc_list[0],
            "self.pipeline": pipe, "prompt2": None, "num_images_per_prompt": 1, "long_prompts": False,
            "max_length": None, "dropout_prob": 0.0, "force_all": False, "use_encoder_1": True, "use_encoder_2": True,
            "self.model_config.attn_masking": self._attn_masking_default(),
            "self.model_config.is_pixart_sigma": profile_name == "pixart-sigma",
        }  # fmt: skip
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
                             f"{self._source_file.name}:{call.lineno}") from None  # fmt: skip
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
    def hooked(self, profile: Any) -> Iterator[list[str]]:
        try:
            from te_align.hooks.ai_toolkit import AiToolkitHook

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


#: ai-toolkit class per BaseModel family key (te_align.probe.ai_toolkit_models.BASE_MODELS)
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


# ==============================================================================================
# kohya sd-scripts
# ==============================================================================================
class Kohya(Adapter):
    name = "kohya"
    #: tokenizer cache folder (hub id with "/" -> "_", as TokenizeStrategy._load_tokenizer) -> tiny tokenizer.
    TOKENIZER_FOLDERS: ClassVar[dict[str, tuple[str, str | None]]] = {
        "openai_clip-vit-large-patch14": ("clip", "<|endoftext|>"),
        "stabilityai_stable-diffusion-2": ("clip", "!"),
        # the laion bigG hub tokenizer pads with <|endoftext|>; sd-scripts sets pad_token_id = 0 itself
        "laion_CLIP-ViT-bigG-14-laion2B-39B-b160k": ("clip", "<|endoftext|>"),
        "google_t5-v1_1-xxl": ("t5", None),
    }

    def __init__(self, path: str | None) -> None:
        path = path or os.environ.get("TE_ALIGN_KOHYA_DIR")
        if not path:
            raise ProbeError("kohya: give --path to a kohya-ss/sd-scripts checkout (or set TE_ALIGN_KOHYA_DIR)")
        root = Path(path).expanduser()
        if not (root / "library" / "strategy_base.py").is_file():
            raise ProbeError(f"kohya: {path} is not a kohya-ss/sd-scripts checkout (no library/strategy_base.py)")
        self.root = root.resolve()
        self.location = str(self.root)
        head = git_head(self.root)
        self.version = head[:7] if head else "unknown (no git)"
        self.profiles = {
            "sd15": "SdTokenizeStrategy(v2=False) + SdTextEncodingStrategy(clip_skip=None)",
            "sd21": "SdTokenizeStrategy(v2=True) + SdTextEncodingStrategy(clip_skip=None)",
            "sdxl": "SdxlTokenizeStrategy + SdxlTextEncodingStrategy",
            **{p: "Sd3TokenizeStrategy(t5xxl_max_length=256) + Sd3TextEncodingStrategy + concat_encodings"
               for p in ("sd3-medium", "sd35-large", "sd35-medium")},
            "flux-dev": "FluxTokenizeStrategy(512) + FluxTextEncodingStrategy",
            "flux-schnell": "FluxTokenizeStrategy(256) + FluxTextEncodingStrategy",
            "chroma": "FluxTokenizeStrategy(512) + FluxTextEncodingStrategy(apply_t5_attn_mask=True) + DummyCLIPL "
                      "(flux_train_network.py --model_type chroma)",
            "lumina2": "LuminaTokenizeStrategy(system_prompt='', max_length=None) + LuminaTextEncodingStrategy "
                       "(lumina_train_network.py)",
        }  # fmt: skip

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import diffusers  # noqa: F401
        import transformers

        _hf_quiet()
        added_alias = False
        try:
            from transformers import CLIPFeatureExtractor  # noqa: F401
        except ImportError:  # removed in transformers 5; sd-scripts still imports the name
            processor = transformers.CLIPImageProcessor
            # the lazy attribute access can swap the module object in sys.modules: set it on the live one
            sys.modules["transformers"].CLIPFeatureExtractor = processor  # type: ignore[attr-defined]
            added_alias = True
        try:
            with _stubs.sandbox([self.root], [str(self.root)]), \
                    _stubs.stub_missing(("torchvision", "cv2", "bitsandbytes", "open_clip", "xformers"), [self.root]), \
                    tempfile.TemporaryDirectory(prefix="te-align-probe-kohya-") as cache:  # fmt: skip
                self.modules: dict[str, Any] = {}
                for name in ("strategy_sd", "strategy_sdxl", "strategy_sd3", "strategy_flux", "flux_utils", "strategy_lumina"):
                    try:
                        self.modules[name] = importlib.import_module(f"library.{name}")
                    except Exception as e:
                        raise ProbeError(f"kohya: cannot import library.{name} from {self.root} ({type(e).__name__}: {e})") from None
                self.cache = cache
                self._write_tokenizers(cache)
                logging.getLogger().setLevel(logging.WARNING)  # sd-scripts' setup_logging() says INFO; restored after
                yield
        finally:
            if added_alias:
                with contextlib.suppress(AttributeError):
                    delattr(sys.modules["transformers"], "CLIPFeatureExtractor")

    def _write_tokenizers(self, cache: str) -> None:
        from te_align.tiny import tokenizers as tok

        try:
            tok.clip_bpe_path()
        except FileNotFoundError as e:
            raise ProbeError(str(e)) from None
        for folder, (kind, pad) in self.TOKENIZER_FOLDERS.items():
            t = tok.clip_tokenizer(pad=pad) if kind == "clip" else tok.t5_tokenizer()
            t.save_pretrained(str(Path(cache) / folder))

    def case(self, profile_name: str) -> Case:
        import torch

        m = self.modules
        replace: dict[str, Any] = {}
        if profile_name == "sdxl":
            from te_align.tiny.encoders import clip_text_model

            # sd-scripts reads CLIP-L hidden_states[11] by index: the penultimate of the real 12 layers
            replace["text_encoder"] = clip_text_model("L", num_hidden_layers=12)
        prof, toks, encs, _ = _tiny(profile_name, **replace)
        models = _ordered(encs, "text_encoder")
        notes: list[str] = []
        run: Callable[[list[str]], dict[str, Any]]
        if profile_name in ("sd15", "sd21"):
            ts = m["strategy_sd"].SdTokenizeStrategy(profile_name == "sd21", None, self.cache)
            es = m["strategy_sd"].SdTextEncodingStrategy(None)

            def run(prompts: list[str]) -> dict[str, Any]:
                return {"prompt_embeds": es.encode_tokens(ts, models, ts.tokenize(prompts))[0]}

        elif profile_name == "sdxl":
            ts = m["strategy_sdxl"].SdxlTokenizeStrategy(None, self.cache)
            es = m["strategy_sdxl"].SdxlTextEncodingStrategy()
            notes.append("tiny CLIP-L has 12 layers here: sd-scripts reads hidden_states[11] by index")

            def run(prompts: list[str]) -> dict[str, Any]:
                h1, h2, pool = es.encode_tokens(ts, models, ts.tokenize(prompts))
                return {"prompt_embeds": torch.cat([h1, h2], dim=-1), "pooled_prompt_embeds": pool}

        elif profile_name.startswith("sd3"):
            ts = m["strategy_sd3"].Sd3TokenizeStrategy(256, self.cache)  # --t5xxl_max_token_length default
            es = m["strategy_sd3"].Sd3TextEncodingStrategy(False, False, 0.0, 0.0, 0.0)
            notes.append("sd-scripts --t5xxl_max_token_length default 256 (library/sd3_train_utils.py); "
                         "concat_encodings pads CLIP to 4096 = T5-XXL width, here to the tiny T5 width")  # fmt: skip

            def run(prompts: list[str]) -> dict[str, Any]:
                lg, t5, pooled = es.encode_tokens(ts, models, ts.tokenize(prompts))[:3]
                lg = torch.nn.functional.pad(lg, (0, t5.shape[-1] - lg.shape[-1]))
                return {"prompt_embeds": torch.cat([lg, t5], dim=-2), "pooled_prompt_embeds": pooled}

        elif profile_name.startswith("flux"):
            length = 256 if profile_name == "flux-schnell" else 512
            ts = m["strategy_flux"].FluxTokenizeStrategy(length, self.cache)
            es = m["strategy_flux"].FluxTextEncodingStrategy(apply_t5_attn_mask=False)
            notes.append(f"T5 length {length}: flux_train_network.get_tokenize_strategy's default for "
                         f"{'schnell' if length == 256 else 'dev'} (no --t5xxl_max_token_length)")  # fmt: skip

            def run(prompts: list[str]) -> dict[str, Any]:
                pooled, t5, txt_ids, _ = es.encode_tokens(ts, models, ts.tokenize(prompts))
                return {"prompt_embeds": t5, "pooled_prompt_embeds": pooled, "text_ids": txt_ids[0]}

        elif profile_name == "chroma":
            # flux_train_network.py --model_type chroma: is_schnell False -> T5 512 (no --t5xxl_max_token_length),
            # --apply_t5_attn_mask asserted on, CLIP-L replaced by flux_utils.DummyCLIPL (zero pooled output)
            ts = m["strategy_flux"].FluxTokenizeStrategy(512, self.cache)
            es = m["strategy_flux"].FluxTextEncodingStrategy(apply_t5_attn_mask=True)
            chroma_models = [m["flux_utils"].DummyCLIPL(), models[0]]
            notes.append("flux_train_network.py --model_type chroma: T5 length 512 (is_schnell False), "
                         "--apply_t5_attn_mask required, flux_utils.DummyCLIPL in CLIP-L's place")  # fmt: skip
            notes.append("prompt_attention_mask: the text length Chroma's transformer uses "
                         "(library/chroma_models.py: mask.sum() + attn_padding=1, clipped), as a float mask like the profile's")  # fmt: skip

            def run(prompts: list[str]) -> dict[str, Any]:
                _, t5, txt_ids, mask = es.encode_tokens(ts, chroma_models, ts.tokenize(prompts))
                length = torch.clip(mask.sum(dim=-1).to(torch.int64) + 1, 0, mask.shape[1])
                used = (torch.arange(mask.shape[1])[None, :] < length[:, None]).to(t5.dtype)
                return {"prompt_embeds": t5, "prompt_attention_mask": used, "text_ids": txt_ids[0]}

        elif profile_name == "lumina2":
            ts = self._lumina_tokenize_strategy(toks["tokenizer"])
            es = m["strategy_lumina"].LuminaTextEncodingStrategy()
            notes.append("lumina_train_network.py defaults: --system_prompt '' (no system prompt), "
                         "--gemma2_max_token_length None -> 256; LuminaTokenizeStrategy's hub download of "
                         "google/gemma-2-2b answered with the tiny Gemma tokenizer (a fresh copy)")  # fmt: skip

            def run(prompts: list[str]) -> dict[str, Any]:
                hidden, _, mask = es.encode_tokens(ts, models, ts.tokenize(prompts))
                return {"prompt_embeds": hidden, "prompt_attention_mask": mask}

        else:  # pragma: no cover - guarded by profile_name()
            raise ProbeError(f"kohya: no probe for {profile_name}")
        return Case(prof, toks, encs, run, notes)

    def _lumina_tokenize_strategy(self, tokenizer: Any) -> Any:
        """sd-scripts' real ``LuminaTokenizeStrategy.__init__`` with its hub download answered locally.

        It calls ``AutoTokenizer.from_pretrained("google/gemma-2-2b", cache_dir=--tokenizer_cache_dir)`` (a hub
        cache, not the local-folder convention of the other strategies). That one call is answered with a
        fresh copy of the tiny Gemma tokenizer; the rest of ``__init__`` (padding side, system prompt, max
        length) runs as written. A copy, because ``__init__`` sets ``padding_side`` on the object it gets.
        """
        import transformers

        mod = self.modules["strategy_lumina"]
        folder = Path(self.cache) / mod.GEMMA_ID.replace("/", "_")
        if not folder.is_dir():
            tokenizer.save_pretrained(str(folder))
        asked: list[str] = []

        class _LocalHub:
            @staticmethod
            def from_pretrained(model_id: str, *args: Any, **kwargs: Any) -> Any:
                asked.append(model_id)
                kwargs.pop("cache_dir", None)
                return transformers.AutoTokenizer.from_pretrained(str(folder), *args, **kwargs)

        original = mod.AutoTokenizer
        mod.AutoTokenizer = _LocalHub
        try:
            ts = mod.LuminaTokenizeStrategy(None, None, self.cache)  # --system_prompt "" / --gemma2_max_token_length
        finally:
            mod.AutoTokenizer = original
        if asked != [mod.GEMMA_ID]:
            raise ProbeError(f"kohya: LuminaTokenizeStrategy asked for tokenizers {asked}, expected [{mod.GEMMA_ID!r}]")
        return ts

    @contextlib.contextmanager
    def hooked(self, profile: Any) -> Iterator[list[str]]:
        try:
            from te_align.hooks import kohya as hk

            hk.uninstall()
            installed = hk.install(profile=profile)
        except Exception as e:
            raise HooksUnavailable(f"{type(e).__name__}: {e}") from None
        if not installed:
            raise HooksUnavailable("disabled by TE_ALIGN=off")
        try:
            yield ["hooks: te_align.hooks.kohya.install(profile=...)"]
        finally:
            hk.uninstall()


# SimpleTuner: te_align.probe.simpletuner; the diffusers example scripts: te_align.probe.diffusers_examples


def adapter_for(trainer: str, path: str | None) -> Adapter:
    key = ALIASES.get(trainer.lower(), trainer.lower())
    if key not in TRAINERS:
        from te_align.errors import closest

        raise ProbeError(f"unknown trainer '{trainer}'; known: {', '.join(TRAINERS)}{closest(trainer, TRAINERS)}")
    if key == "onetrainer":  # te_align/probe/onetrainer.py
        from te_align.probe.onetrainer import OneTrainer

        return OneTrainer(path)  # type: ignore[return-value]
    if key == "diffusers-examples":
        from te_align.probe.diffusers_examples import DiffusersExamples

        return DiffusersExamples(path)  # type: ignore[return-value]
    if key == "simpletuner":
        from te_align.probe.simpletuner import SimpleTunerProbe

        return SimpleTunerProbe(path)  # type: ignore[return-value]
    cls = {"ai-toolkit": AiToolkit, "kohya": Kohya}[key]
    return cls(path)
