"""``python -m te_align.train CONFIG.toml [--resume [CHECKPOINT]]`` (works under ``accelerate launch -m``)."""

from __future__ import annotations

import sys

from te_align.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
