"""``te-align probe --trainer diffusers-examples``: the diffusers example training scripts' own prompt encoding.

Each script is imported from its file (a diffusers checkout at ``--path`` or ``$TE_ALIGN_DIFFUSERS_EXAMPLES_DIR``:
the checkout root, its ``examples`` folder, or one of ``examples/dreambooth`` / ``examples/text_to_image``), its
real ``parse_args`` gives the argument defaults (a minimal command line: model, instance data folder and prompt),
and its real ``tokenize_prompt`` / ``encode_prompt`` are called the way its ``main()`` calls them when the text
encoders are not trained (``compute_text_embeddings``). Missing import-only dependencies of the scripts
(torchvision, datasets, wandb …) are stood in for (:mod:`te_align.probe._stubs`); nothing the encode path calls is
a stand-in.

There are no te-align hooks for these scripts: they are plain files run as they are, and every deviation te-align
finds in them is fixed by the script's own flag (``te-align check`` names it). The "with hooks" run is therefore
the script **with te-align check's fix flags** (``--max_sequence_length 256`` for SD3), which shows the fix makes
the script's encoding identical to the profile.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._git import git_head
from te_align.audit import check_path
from te_align.probe import ProbeError, _stubs
from te_align.probe.adapter import Adapter, _hf_quiet, _ordered, _tiny
from te_align.probe.core import Case
from te_align.probe.matrix import Found
from te_align.trainers.api import find_checkout
from te_align.trainers.diffusers_examples import SPEC

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

ENV = str(SPEC.env_dir)  # the trainer's one environment variable (its spec)

#: Import-only third-party packages of the scripts (their encode paths use none of them).
OPTIONAL_IMPORTS = ("torchvision", "datasets", "wandb", "bitsandbytes", "prodigyopt", "cv2", "tensorboard",
                    "xformers", "torchao")


@dataclass(frozen=True)
class Probed:
    script: str
    folder: str
    how: str


#: profile -> the script whose encode path is probed.
PROBED: dict[str, Probed] = {
    "sd15": Probed("train_dreambooth_lora.py", "dreambooth",
                   "tokenize_prompt(tokenizer, prompts, args.tokenizer_max_length) + encode_prompt(text_encoder, "
                   "input_ids, attention_mask, args.text_encoder_use_attention_mask)"),
    "sdxl": Probed("train_dreambooth_lora_sdxl.py", "dreambooth", "encode_prompt(text_encoders, tokenizers, prompts)"),
    "sd3-medium": Probed("train_dreambooth_lora_sd3.py", "dreambooth",
                         "encode_prompt(text_encoders, tokenizers, prompts, args.max_sequence_length)"),
    "flux-dev": Probed("train_dreambooth_lora_flux.py", "dreambooth",
                       "encode_prompt(text_encoders, tokenizers, prompts, args.max_sequence_length)"),
}
_SAME = {"sd21": "sd15", "sd35-large": "sd3-medium", "sd35-medium": "sd3-medium", "flux-schnell": "flux-dev"}
PROBED = {name: PROBED[_SAME.get(name, name)] for name in ("sd15", "sd21", "sdxl", "sd3-medium", "sd35-large",
                                                            "sd35-medium", "flux-dev", "flux-schnell")}


def _root(path: str | None) -> Path:
    """The ``examples`` folder of a diffusers checkout, from a checkout root, ``examples`` or one of its folders."""
    given = path or os.environ.get(ENV)
    if not given:
        raise ProbeError(f"diffusers-examples: give --path to a huggingface/diffusers checkout (or set {ENV})")
    p = Path(given).expanduser()
    for cand in (p / "examples", p, p.parent):
        if (cand / "dreambooth" / "train_dreambooth_lora_sd3.py").is_file():
            return cand.resolve()
    raise ProbeError(f"diffusers-examples: {given} is not a diffusers checkout (no examples/dreambooth/"
                     "train_dreambooth_lora_sd3.py)")


def load_script(root: Path, folder: str, script: str) -> Any:
    """Import one example script from its file (call inside :func:`te_align.probe._stubs.sandbox`)."""
    file = root / folder / script
    if not file.is_file():
        raise ProbeError(f"diffusers-examples: no {folder}/{script} under {root}")
    name = "te_align_dx_" + file.stem
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ProbeError(f"diffusers-examples: cannot import {folder}/{script} ({type(e).__name__}: {e})") from None
    return module


def script_args(module: Any, data_dir: str, extra: list[str] = ()) -> Any:  # type: ignore[assignment]
    """The script's own ``parse_args`` on a minimal command line (its defaults for everything else)."""
    argv = ["--pretrained_model_name_or_path", "tiny", "--instance_data_dir", data_dir, "--instance_prompt", "a photo",
            *extra]
    try:
        return module.parse_args(argv)
    except SystemExit as e:  # argparse: a flag this script does not have
        raise ProbeError(f"diffusers-examples: {module.__name__} rejected {' '.join(argv)} (exit {e.code})") from None


class DiffusersExamples(Adapter):
    """Adapter (see :class:`te_align.probe.adapter.Adapter`) for the diffusers example scripts."""

    name = "diffusers-examples"

    def __init__(self, path: str | None) -> None:
        self.root = _root(path)
        head = git_head(self.root.parent)
        self.version = head[:7] if head else "unknown (no git)"
        self.location = str(self.root)
        self.profiles = {p: f"examples/{v.folder}/{v.script}: {v.how}" for p, v in PROBED.items()}
        self.modules: dict[str, Any] = {}
        #: flags te-align check gives as the fix, while :meth:`hooked` is active
        self.fix: list[str] = []


    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import diffusers  # noqa: F401  (decide optional packages before any stand-in exists)
        import transformers  # noqa: F401

        _hf_quiet()
        with _stubs.sandbox([self.root]), _stubs.stub_missing(OPTIONAL_IMPORTS, [self.root]), \
                tempfile.TemporaryDirectory(prefix="te-align-probe-dx-") as data:
            self.data_dir = data
            self.modules = {}
            yield

    def _module(self, probed: Probed) -> Any:
        if probed.script not in self.modules:
            self.modules[probed.script] = load_script(self.root, probed.folder, probed.script)
        return self.modules[probed.script]

    def case(self, profile_name: str) -> Case:
        import torch

        probed = PROBED[profile_name]
        mod = self._module(probed)
        prof, toks, encs, _ = _tiny(profile_name)
        tok_list, enc_list = _ordered(toks, "tokenizer"), _ordered(encs, "text_encoder")
        parsed: dict[tuple[str, ...], Any] = {}

        def current() -> Any:
            """The script's args for the flags in force now (:meth:`hooked` adds the fix flags)."""
            key = tuple(self.fix)
            if key not in parsed:
                parsed[key] = script_args(mod, self.data_dir, list(key))
            return parsed[key]

        args = current()
        shown = ", ".join(f"{k}={getattr(args, k)!r}" for k in ("max_sequence_length", "tokenizer_max_length",
                                                                 "text_encoder_use_attention_mask") if hasattr(args, k))
        notes = [f"examples/{probed.folder}/{probed.script}: {probed.how}; its parse_args defaults: {shown or '-'}"]

        if probed.script == "train_dreambooth_lora.py":
            def run(prompts: list[str]) -> dict[str, Any]:
                a = current()
                inputs = mod.tokenize_prompt(tok_list[0], prompts, tokenizer_max_length=a.tokenizer_max_length)
                out = mod.encode_prompt(enc_list[0], inputs.input_ids, inputs.attention_mask,
                                        text_encoder_use_attention_mask=a.text_encoder_use_attention_mask)
                return {"prompt_embeds": out}

        elif probed.script == "train_dreambooth_lora_sdxl.py":
            def run(prompts: list[str]) -> dict[str, Any]:
                embeds, pooled = mod.encode_prompt(enc_list, tok_list, prompts)
                return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

        elif probed.script == "train_dreambooth_lora_sd3.py":
            notes.append("the script pads CLIP to the T5 width (4096 for T5-XXL), here to the tiny T5 width")

            def run(prompts: list[str]) -> dict[str, Any]:
                embeds, pooled = mod.encode_prompt(enc_list, tok_list, prompts, current().max_sequence_length)
                return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

        else:  # FLUX.1
            def run(prompts: list[str]) -> dict[str, Any]:
                embeds, pooled, text_ids = mod.encode_prompt(enc_list, tok_list, prompts,
                                                             current().max_sequence_length)
                return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled, "text_ids": text_ids}

        def guarded(prompts: list[str]) -> dict[str, Any]:
            with torch.no_grad():
                return run(prompts)

        return Case(prof, toks, encs, guarded, notes)

    @contextlib.contextmanager
    def hooked(self, profile: AlignmentProfile) -> Iterator[list[str]]:
        """No hooks exist for these scripts: the run with te-align check's fix flags instead."""
        self.fix = fix_flags(profile)
        try:
            yield [("no te-align hooks for the example scripts; this run uses the flags te-align check gives as "
                    "the fix: " + (" ".join(self.fix) if self.fix else "none needed"))]
        finally:
            self.fix = []


def fix_flags(profile: Any) -> list[str]:
    """The flags ``te-align check`` gives for this profile's probed script at its defaults."""
    probed = PROBED[profile.name if profile.name in PROBED else _base(profile.name)]
    from te_align.trainers import registry

    result = check_path("<probe>", registry().check_languages(),
                        profile=profile.name if profile.name in PROBED else _base(profile.name),
                        command=["accelerate", "launch", probed.script])
    out: list[str] = []
    for f in result.findings:
        if f.kind == "deviation" and f.fix.startswith("--"):
            out += f.fix.split()
    return out


def _base(name: str) -> str:
    """A fitted profile keeps its bundled name; fall back to the family's probed profile."""
    return name.split("+", 1)[0]


ADAPTER = DiffusersExamples


def find(environ: Mapping[str, str]) -> tuple[list[Found], list[str]]:
    """A diffusers checkout in ``TE_ALIGN_DIFFUSERS_EXAMPLES_DIR``."""
    return find_checkout(environ, SPEC, Found)
