"""te-align's world bases: tiny diffusion models pretrained on the shapes world, with their encoders and autoencoder.

Data only (float16 weights, configs and each base's ``base.json`` with its SHA-256 hashes); ``te_align.tiny.bases``
reads it. A distribution of its own so that te-align's core stays small: ``te-align train``, ``ab``, ``demo`` and
``swap`` need it, ``check``, ``patch``, the hooks and ``te_align.encode`` do not. Install it from a te-align clone
with ``pip install ./world``.
"""

from pathlib import Path

#: the folder holding one sub-folder per base, ``encoders/`` and ``vae/``
ROOT = Path(__file__).resolve().parent
