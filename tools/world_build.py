"""Pretrain the shapes-world bases: ``python tools/world_build.py {vae,encoders,base} ...`` (see world_pretrain/build.py)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from world_pretrain.build import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
