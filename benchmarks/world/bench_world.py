"""The shapes world: reader accuracy on clean and degraded renders, caption lengths, speed.

Run: ``python benchmarks/world/bench_world.py [--scenes 2000] [--degraded 500]``. Prints

* reader accuracy on clean renders of ``--scenes`` random scenes at 64 px (every background, object
  size and style) and on ``--scenes // 4`` scenes at 32 px and ``--scenes // 10`` at 128 px;
* reader accuracy at 64 px on ``--degraded`` scenes degraded like generated samples: Gaussian noise
  (sigma 8, 16, 32 on 0-255), mild blur (sigma 0.8 px), JPEG quality 75 / 50 / 30 (4:2:0 chroma), and
  blur + noise 16 + JPEG 50 together;
* the caption token-length distribution (tiny T5) of 2,000 samples of the default mix;
* render, read and dataset (scene + caption + tokens + image) speed in images per second.

Fixed seeds: the numbers are the same on every run (the speeds are not).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "tools"), str(Path(__file__).resolve().parents[2])]
from world_pretrain.diagnostics import degrade  # noqa: E402

from te_align.tiny import world  # noqa: E402

DEGRADATIONS = {
    "noise sigma 8": {"noise": 8},
    "noise sigma 16": {"noise": 16},
    "noise sigma 32": {"noise": 32},
    "blur sigma 0.8 px": {"blur": 0.8},
    "JPEG q75": {"jpeg": 75},
    "JPEG q50": {"jpeg": 50},
    "JPEG q30": {"jpeg": 30},
    "blur 0.8 + noise 16 + JPEG q50": {"blur": 0.8, "noise": 16, "jpeg": 50},
}


def _scenes(seed: int, n: int) -> list[world.Scene]:
    rng = np.random.default_rng(seed)
    return [world.sample_scene(rng) for _ in range(n)]


def _row(name: str, r: dict[str, float], extra: str = "") -> None:
    print(
        f"  {name:32s} objects {r['object_accuracy'] * 100:6.2f}%  images {r['image_accuracy'] * 100:6.2f}%  "
        f"colour {r['colour'] * 100:6.2f}%  shape {r['shape'] * 100:6.2f}%  position {r['position'] * 100:6.2f}%  "
        f"extra/img {r['extra_per_image']:.3f}{extra}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenes", type=int, default=2000)
    ap.add_argument("--degraded", type=int, default=500)
    args = ap.parse_args()

    print(f"reader on clean renders (seed 2000; {args.scenes} scenes at 64 px)")
    for size, n in ((64, args.scenes), (32, args.scenes // 4), (128, args.scenes // 10)):
        scenes = _scenes(2000 + size, n)
        t0 = time.perf_counter()
        images = [world.render(s, size) for s in scenes]
        t_render = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = world.evaluate(images, scenes)
        t_read = time.perf_counter() - t0
        _row(
            f"{size} px, {n} scenes, {int(result['objects'])} objects",
            result,
            f"  | render {n / t_render:7.0f} img/s  read {n / t_read:6.1f} img/s",
        )

    print(f"reader on degraded 64 px renders (seed 7; {args.degraded} scenes)")
    scenes = _scenes(7, args.degraded)
    clean = [world.render(s) for s in scenes]
    for name, kw in DEGRADATIONS.items():
        images = [degrade(img, seed=i, **kw) for i, img in enumerate(clean)]
        _row(name, world.evaluate(images, scenes))

    print("captions (seed 0, 2000 samples, default style mix, tiny T5 tokenizer incl. </s>)")
    t0 = time.perf_counter()
    samples = world.make_dataset(2000, 0, image_size=None)
    t_caps = time.perf_counter() - t0
    lengths = np.array([s.n_tokens for s in samples])
    styles = np.array([s.style for s in samples])
    for style in ("tags", "short", "long", "all"):
        sel = lengths if style == "all" else lengths[styles == style]
        q = np.percentile(sel, [0, 50, 90, 100]).astype(int)
        print(
            f"  {style:5s} n={len(sel):4d}  min/median/p90/max {q[0]}/{q[1]}/{q[2]}/{q[3]}  "
            f"> 77: {(sel > 77).mean() * 100:5.1f}%  > 154: {(sel > 154).mean() * 100:5.1f}%  "
            f"> 256: {(sel > 256).mean() * 100:5.1f}%"
        )
    starts = [sp.token_start for s in samples if s.style == "long" for sp in s.spans]
    print(
        f"  long captions: {len(starts)} objects, described from token >= 76 (lost at T5 77): "
        f"{sum(t >= 76 for t in starts) / len(starts) * 100:.1f}%, >= 153: {sum(t >= 153 for t in starts) / len(starts) * 100:.1f}%"
    )
    print(
        f"  emphasis {dict(Counter(s.emphasis for s in samples))}  placements {dict(Counter(s.placement for s in samples if s.style == 'long'))}"
    )
    print(f"  captions + token positions: {len(samples) / t_caps:.0f} samples/s")
    t0 = time.perf_counter()
    world.make_dataset(500, 1)
    print(
        f"  full records (scene, caption, tokens, 64 px image): {500 / (time.perf_counter() - t0):.0f} samples/s"
    )


if __name__ == "__main__":
    main()
