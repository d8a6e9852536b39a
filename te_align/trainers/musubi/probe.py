"""musubi-tuner probe adapter: its real encoding code from a checkout (``TE_ALIGN_MUSUBI_DIR`` or ``--path``).

* Qwen-Image: ``musubi_tuner.qwen_image.qwen_image_utils.get_qwen_prompt_embeds`` (what
  ``qwen_image_cache_text_encoder_outputs.py`` and the training script's sample prompts call) on te-align's tiny
  Qwen2.5-VL; each caption's real tokens are kept as the caching script stores them
  (qwen_image_cache_text_encoder_outputs.py:98-101) and batched as training does (padded to the batch's longest,
  with the mask of the real tokens: qwen_image_train_network.py:513-524).
* Wan: ``musubi_tuner.wan.modules.t5.T5EncoderModel.__call__`` with musubi-tuner's own umT5 module
  (``T5Encoder``) built at te-align's tiny size and given the tiny UMT5EncoderModel's weights; the outputs are
  zero-padded to ``text_len`` as ``WanModel.forward`` does (wan/modules/model.py:872-874). The object and its
  ``HuggingfaceTokenizer`` are made with ``__new__`` and given the tiny tokenizer (their ``__init__`` loads a
  checkpoint and a hub tokenizer); ``__call__`` and the tokenizer's cleaning run as written.

Third-party imports the encode paths never call (OpenCV, PyAV, voluptuous, …) are stood in for.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._git import git_head
from te_align.probe import ProbeError, _stubs
from te_align.probe.adapter import Adapter, HooksUnavailable, _hf_quiet, _tiny_text
from te_align.probe.core import Case
from te_align.probe.matrix import Found
from te_align.trainers.api import find_checkout
from te_align.trainers.musubi import SPEC

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.

ENV_DIR = str(SPEC.env_dir)  # the trainer's one environment variable (its spec)
#: Packages musubi-tuner's modules import at the top that these encode paths never call.
OPTIONAL = (
    "cv2", "av", "voluptuous", "easydict", "torchvision", "bitsandbytes", "sageattention", "flash_attn",
    "xformers", "einops", "toml", "tqdm", "sentencepiece", "gradio", "matplotlib", "prompt_toolkit",
    "ascii_magic", "sensecraft", "imageio", "decord", "kornia", "timm", "lycoris", "prodigyopt",
    "schedulefree", "library", "transformers_stream_generator", "qwen_vl_utils",
)

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile


def checkout_root(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    if not (p / "src" / "musubi_tuner" / "qwen_image" / "qwen_image_utils.py").is_file():
        raise ProbeError(f"musubi: {path} is not a kohya-ss/musubi-tuner checkout (no src/musubi_tuner/qwen_image)")
    return p.resolve()


def umt5_state_dict(hf: Any) -> dict[str, Any]:
    """A Hugging Face ``UMT5EncoderModel``'s weights under musubi-tuner's ``T5Encoder`` names (the same umT5)."""
    sd = hf.state_dict()
    out = {"token_embedding.weight": sd["shared.weight"], "norm.weight": sd["encoder.final_layer_norm.weight"]}
    for i in range(hf.config.num_layers):
        b = f"encoder.block.{i}.layer"
        out.update({
            f"blocks.{i}.norm1.weight": sd[f"{b}.0.layer_norm.weight"],
            **{f"blocks.{i}.attn.{x}.weight": sd[f"{b}.0.SelfAttention.{x}.weight"] for x in "qkvo"},
            f"blocks.{i}.pos_embedding.embedding.weight": sd[f"{b}.0.SelfAttention.relative_attention_bias.weight"],
            f"blocks.{i}.norm2.weight": sd[f"{b}.1.layer_norm.weight"],
            f"blocks.{i}.ffn.gate.0.weight": sd[f"{b}.1.DenseReluDense.wi_0.weight"],
            f"blocks.{i}.ffn.fc1.weight": sd[f"{b}.1.DenseReluDense.wi_1.weight"],
            f"blocks.{i}.ffn.fc2.weight": sd[f"{b}.1.DenseReluDense.wo.weight"],
        })
    return out


@contextlib.contextmanager
def _cuda_default() -> Iterator[None]:
    """``T5EncoderModel.__init__``'s default ``device=torch.cuda.current_device()`` is evaluated when
    ``wan/modules/t5.py`` is imported (line 458), which fails on a machine without CUDA: during the import it is
    answered with device 0 (the probe never uses that default)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_device = original  # type: ignore[assignment]


class Musubi(Adapter):
    name = "musubi"

    def __init__(self, path: str | None) -> None:
        path = path or os.environ.get(ENV_DIR)
        if not path:
            raise ProbeError(f"musubi: give --path to a kohya-ss/musubi-tuner checkout (or set {ENV_DIR})")
        self.root = checkout_root(path)
        self.location = str(self.root)
        head = git_head(self.root)
        self.version = head[:7] if head else "unknown (no git)"
        self.profiles = {
            "qwen-image": "qwen_image_utils.get_qwen_prompt_embeds (the caching script's call), cached per caption "
                          "and batched as training does",
            "wan21": "T5EncoderModel.__call__ (musubi-tuner's umT5 at the tiny size) + WanModel's padding to text_len",
        }
        self.modules: dict[str, Any] = {}

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import diffusers  # noqa: F401  (decide optional packages before any stand-in exists)
        import transformers  # noqa: F401

        _hf_quiet()
        src = self.root / "src"
        with _stubs.sandbox([src], [str(src)]), _stubs.stub_missing(OPTIONAL, [src]), _cuda_default():
            for name in ("qwen_image.qwen_image_utils", "wan.modules.t5", "wan.modules.tokenizers"):
                try:
                    self.modules[name] = importlib.import_module(f"musubi_tuner.{name}")
                except Exception as e:
                    raise ProbeError(f"musubi: cannot import musubi_tuner.{name} from {src} ({type(e).__name__}: {e})") from None
            yield

    def case(self, profile_name: str) -> Case:
        if profile_name == "qwen-image":
            return self._qwen()
        if profile_name == "wan21":
            return self._wan()
        raise ProbeError(f"musubi: no probe for {profile_name}")  # pragma: no cover - guarded by profile_name()

    def _qwen(self) -> Case:
        import torch

        prof, toks, encs = _tiny_text("qwen-image")
        utils = self.modules["qwen_image.qwen_image_utils"]
        tokenizer, vlm = toks["tokenizer"], encs["text_encoder"]

        def run(prompts: list[str]) -> dict[str, Any]:
            embed, mask = utils.get_qwen_prompt_embeds(tokenizer, vlm, prompts)  # looked up per call (hooks)
            rows = [e[: int(m.bool().sum())] for e, m in zip(embed, mask, strict=True)]
            longest = max(r.shape[0] for r in rows)
            out = torch.stack([torch.nn.functional.pad(r, (0, 0, 0, longest - r.shape[0])) for r in rows])
            keep = torch.zeros(len(rows), longest, dtype=torch.long)
            for i, r in enumerate(rows):
                keep[i, : r.shape[0]] = 1
            return {"prompt_embeds": out, "prompt_embeds_mask": keep}

        notes = ["get_qwen_prompt_embeds(tokenizer, vlm, prompts); each caption cut to its real tokens as the caching "
                 "script stores it (qwen_image_cache_text_encoder_outputs.py:98-101), batched as training does "
                 "(qwen_image_train_network.py:513-524; training passes the mask as bool, compared here as int64)"]
        return Case(prof, toks, encs, run, notes)

    def _wan(self) -> Case:
        import torch

        prof, toks, encs = _tiny_text("wan21")
        t5mod = self.modules["wan.modules.t5"]
        tokmod = self.modules["wan.modules.tokenizers"]
        hf = encs["text_encoder"]
        cfg = hf.config
        model = t5mod.T5Encoder(cfg.vocab_size, cfg.d_model, cfg.num_heads * cfg.d_kv, cfg.d_ff, cfg.num_heads,
                                cfg.num_layers, cfg.relative_attention_num_buckets, shared_pos=False, dropout=0.1)
        model.load_state_dict(umt5_state_dict(hf), strict=True)
        model = model.eval().requires_grad_(False).to(hf.dtype)
        length = prof.slot("t5").tokenizer.max_length
        tokenizer = tokmod.HuggingfaceTokenizer.__new__(tokmod.HuggingfaceTokenizer)
        tokenizer.name, tokenizer.seq_len, tokenizer.clean = "te-align tiny umt5", length, "whitespace"
        tokenizer.tokenizer, tokenizer.vocab_size = toks["tokenizer"], toks["tokenizer"].vocab_size
        encoder = t5mod.T5EncoderModel.__new__(t5mod.T5EncoderModel)
        encoder.text_len, encoder.dtype, encoder.device = length, hf.dtype, torch.device("cpu")
        encoder.checkpoint_path = encoder.tokenizer_path = None
        encoder.model, encoder.tokenizer = model, tokenizer
        self.wan_encoder = encoder  # the T5EncoderModel object the case calls (tests encode with its module too)

        def run(prompts: list[str]) -> dict[str, Any]:
            with torch.no_grad():
                context = encoder(prompts, torch.device("cpu"))  # T5EncoderModel.__call__ (hooked when installed)
            padded = torch.stack([torch.cat([u, u.new_zeros(length - u.size(0), u.size(1))]) for u in context])
            return {"prompt_embeds": padded}

        notes = [f"T5EncoderModel.__call__ with musubi-tuner's T5Encoder at the tiny size ({cfg.num_layers} layers, "
                 f"d_model {cfg.d_model}) holding the tiny UMT5EncoderModel's weights, text_len {length}, "
                 "clean='whitespace' (wan/modules/t5.py:506); zero-padded to text_len as WanModel.forward does "
                 "(wan/modules/model.py:872-874)"]
        return Case(prof, toks, encs, run, notes)

    @contextlib.contextmanager
    def hooked(self, profile: AlignmentProfile) -> Iterator[list[str]]:
        try:
            from te_align.trainers.musubi import hooks

            hooks.uninstall()
            part = "qwen" if profile.family == "qwen-image" else "wan"
            installed = hooks.install(profile=profile, parts=(part,))
        except Exception as e:
            raise HooksUnavailable(f"{type(e).__name__}: {e}") from None
        if not installed:
            raise HooksUnavailable("disabled by TE_ALIGN=off")
        try:
            notes = [f"hooks: te_align.trainers.musubi.hooks.install(profile=..., parts=('{part}',))"]
            if part == "wan":
                notes.append("hooked, the tokens, mask, layer and padding are the profile's; the umT5 forward is "
                             "musubi-tuner's own T5Encoder, whose float rounding differs from transformers' "
                             "UMT5EncoderModel (te_align.encode runs the latter here)")
            yield notes
        finally:
            hooks.uninstall()


ADAPTER = Musubi


def find(environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
    """A musubi-tuner checkout in ``TE_ALIGN_MUSUBI_DIR``."""
    return find_checkout(environ, SPEC, Found)
