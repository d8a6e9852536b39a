"""What te-align's core needs from the environment, and the one line that says what to install when it is missing.

The core (``pip install te-align``) requires no torch, transformers or diffusers: inside a trainer it uses the
trainer's own, and ``check``, ``patch`` and ``profile`` never import them. What needs them says so in one line
naming the ``pip install`` that adds them, never with a traceback:

- ``encode``: te_align.encode / apply, ``te-align cache``, ``probe``, ``inspect`` in an environment of the user's
  own (inside a trainer the trainer's libraries are used);
- ``train``: ``te-align train``, ``ab``, ``demo``, ``swap``, the world bases: te-align's own environment.
"""

from __future__ import annotations

import sys

from te_align.errors import TeAlignError

#: import name -> (distribution, the extras that provide it; the first is named)
PROVIDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("torch", ("encode", "train")),
    "transformers": ("transformers", ("encode", "train")),
    "diffusers": ("diffusers", ("encode", "train")),
    "huggingface_hub": ("huggingface-hub", ("encode", "train")),
    "tokenizers": ("tokenizers", ("encode", "train")),
    "safetensors": ("safetensors", ("encode", "train")),
    "ftfy": ("ftfy", ("encode", "train")),
    "bs4": ("beautifulsoup4", ("encode", "train")),
    "accelerate": ("accelerate", ("train",)),
    "peft": ("peft", ("train",)),
    "numpy": ("numpy", ("train",)),
    "PIL": ("pillow", ("train",)),
    "tensorboard": ("tensorboard", ("train",)),
    "bitsandbytes": ("bitsandbytes", ("bnb",)),
}

#: te-align modules (and CLI commands) whose missing libraries the train extra adds; everything else: encode
TRAIN_PARTS = ("te_align.train", "te_align.ab", "te_align.swap", "te_align.tiny", "train", "ab", "demo", "swap")


class MissingExtra(TeAlignError, ImportError):
    """A library a feature needs is not installed; the message names the ``pip install`` that adds it."""

    def __init__(self, message: str, *, module: str = "") -> None:
        super().__init__(message)
        self.module = module  # the library's import name ("torch"), when it is one of PROVIDED

    def said_of(self, doing: str, part: str) -> MissingExtra:
        """The same error said of ``doing`` run as ``part`` (the CLI names its command and the extra that command
        needs, not the module that needed the library)."""
        return missing(self.module, doing, part) if self.module in PROVIDED else self


def missing(module: str, doing: str, part: str) -> MissingExtra:
    """The error for library ``module`` (an import name in PROVIDED) missing while ``doing`` ran as ``part``."""
    extra = extra_for(part, module)
    inside = (" (inside a trainer's or ComfyUI's environment, te-align uses the ones installed there)"
              if extra == "encode" else "")
    return MissingExtra(f"{doing} needs {PROVIDED[module][0]}, which is not installed in this Python "
                        f"({sys.executable}); add it with: pip install \"te-align[{extra}]\"{inside}", module=module)


def extra_for(part: str, module: str) -> str:
    """The extra to name for ``module`` (an import name) missing in ``part`` (a te-align module or command)."""
    extras = PROVIDED[module][1]
    wanted = "train" if part.startswith(TRAIN_PARTS) else "encode"
    return wanted if wanted in extras else extras[0]


def missing_module(e: BaseException) -> str | None:
    """The top-level import name of a library te-align's extras provide that ``e`` says is missing, else None."""
    if not isinstance(e, ModuleNotFoundError) or not e.name:
        return None
    top = e.name.split(".")[0]
    return top if top in PROVIDED else None


def missing_extra(e: BaseException, part: str, what: str | None = None) -> MissingExtra | None:
    """A :class:`MissingExtra` for ``e`` (raised while ``part`` ran), or None when ``e`` is not a missing library
    of te-align's extras (a real bug keeps its traceback)."""
    top = missing_module(e)
    return None if top is None else missing(top, what or part, part)
