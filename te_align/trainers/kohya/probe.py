"""kohya sd-scripts probe adapter: the real ``library.strategy_<arch>`` tokenize and text-encoding strategies,
constructed with sd-scripts' argument defaults, tokenizers loaded through sd-scripts' own ``--tokenizer_cache_dir``
path."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from te_align._git import git_head
from te_align.probe import ProbeError, _stubs
from te_align.probe.adapter import (
    Adapter,
    HooksUnavailable,
    _hf_quiet,
    _ordered,
    _tiny_text,
)
from te_align.probe.core import Case
from te_align.probe.matrix import Found
from te_align.trainers.api import find_checkout
from te_align.trainers.kohya import SPEC

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path; load what only one command needs when it runs.


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
        path = path or os.environ.get(ENV_DIR)
        if not path:
            raise ProbeError(f"kohya: give --path to a kohya-ss/sd-scripts checkout (or set {ENV_DIR})")
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
            **{
                p: "Sd3TokenizeStrategy(t5xxl_max_length=256) + Sd3TextEncodingStrategy + concat_encodings"
                for p in ("sd3-medium", "sd35-large", "sd35-medium")
            },
            "flux-dev": "FluxTokenizeStrategy(512) + FluxTextEncodingStrategy",
            "flux-schnell": "FluxTokenizeStrategy(256) + FluxTextEncodingStrategy",
            "chroma": (
                "FluxTokenizeStrategy(512) + FluxTextEncodingStrategy(apply_t5_attn_mask=True) + DummyCLIPL "
                "(flux_train_network.py --model_type chroma)"
            ),
            "lumina2": (
                "LuminaTokenizeStrategy(system_prompt='', max_length=None) + LuminaTextEncodingStrategy "
                "(lumina_train_network.py)"
            ),
        }

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
                    tempfile.TemporaryDirectory(prefix="te-align-probe-kohya-") as cache:
                self.modules: dict[str, Any] = {}
                for name in ("strategy_sd", "strategy_sdxl", "strategy_sd3", "strategy_flux", "flux_utils", "strategy_lumina"):
                    try:
                        self.modules[name] = importlib.import_module(f"library.{name}")
                    except Exception as e:
                        hint = ("; sd-scripts' own requirements are missing in this Python: pip install "
                                "\"te-align[kohya-test]\" (einops, imagesize) or sd-scripts' requirements.txt"
                                if isinstance(e, ModuleNotFoundError) else "")
                        raise ProbeError(f"kohya: cannot import library.{name} from {self.root} ({type(e).__name__}: "
                                         f"{e}){hint}") from None
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
        prof, toks, encs = _tiny_text(profile_name, **replace)
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
                         "concat_encodings pads CLIP to 4096 = T5-XXL width, here to the tiny T5 width")

            def run(prompts: list[str]) -> dict[str, Any]:
                lg, t5, pooled = es.encode_tokens(ts, models, ts.tokenize(prompts))[:3]
                lg = torch.nn.functional.pad(lg, (0, t5.shape[-1] - lg.shape[-1]))
                return {"prompt_embeds": torch.cat([lg, t5], dim=-2), "pooled_prompt_embeds": pooled}

        elif profile_name.startswith("flux"):
            length = 256 if profile_name == "flux-schnell" else 512
            ts = m["strategy_flux"].FluxTokenizeStrategy(length, self.cache)
            es = m["strategy_flux"].FluxTextEncodingStrategy(apply_t5_attn_mask=False)
            notes.append(f"T5 length {length}: flux_train_network.get_tokenize_strategy's default for "
                         f"{'schnell' if length == 256 else 'dev'} (no --t5xxl_max_token_length)")

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
                         "--apply_t5_attn_mask required, flux_utils.DummyCLIPL in CLIP-L's place")
            notes.append("prompt_attention_mask: the text length Chroma's transformer uses "
                         "(library/chroma_models.py: mask.sum() + attn_padding=1, clipped), as a float mask like the profile's")

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
                         "google/gemma-2-2b answered with the tiny Gemma tokenizer (a fresh copy)")

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
    def hooked(self, profile: AlignmentProfile) -> Iterator[list[str]]:
        try:
            from te_align.trainers.kohya import hooks as hk

            hk.uninstall()
            installed = hk.install(profile=profile)
        except Exception as e:
            raise HooksUnavailable(f"{type(e).__name__}: {e}") from None
        if not installed:
            raise HooksUnavailable("disabled by TE_ALIGN=off")
        try:
            yield ["hooks: te_align.trainers.kohya.hooks.install(profile=...)"]
        finally:
            hk.uninstall()




ADAPTER = Kohya
ENV_DIR = str(SPEC.env_dir)  # the trainer's one environment variable (its spec)


def find(environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
    """An sd-scripts checkout in ``TE_ALIGN_KOHYA_DIR`` (``te-align matrix``)."""
    return find_checkout(environ, SPEC, Found)
