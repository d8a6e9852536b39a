"""A stand-in for ``torchvision``, only for ``benchmarks/yardstick/bench_yardstick.py``: the PIL transforms that diffusers'
``examples/dreambooth/train_dreambooth_lora_{sd3,flux}.py`` import at the top (``transforms`` and
``transforms.functional.crop``), for machines where the torchvision wheel does not load beside the installed
torch (its compiled operators are built for one torch release).

The benchmark hands this package to the example script's own ``import torchvision`` statements only (an
``__import__`` in the script's globals, see ``bench_yardstick.script_import``); every library keeps seeing
torchvision as not installed. Written for the benchmark from torchvision's documented behaviour of these classes
on PIL images.
"""

__version__ = "0.0+yardstick-stand-in"

from . import transforms  # ``from torchvision import transforms``

__all__ = ["transforms"]
