"""What a family's conditioning carries: linear read-outs of the object's attributes (study proxy P2).

    OMP_NUM_THREADS=1 python benchmarks/world/bench_probe.py [--family sd3] [--encoders RUNS/encoders] [--n 3000]

Encodes ``--n`` captions of the simple world (pink left out; dataset seed 30000) with the family's profile on the
tiny random encoders, or on the pretrained ones of ``--encoders``, then fits read-outs on two thirds and scores
the rest (``world_pretrain.diagnostics.probe_conditioning``): linear on the pooled vector, linear on the mean of
the sequence, and attention pooling (a learned query) then linear. Prints one markdown row per read-out with the
accuracy for colour, shape, position and size, and the share of test prompts whose object is visible (described
inside some slot's window), which caps the sequence read-outs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "tools"), str(Path(__file__).resolve().parents[2])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="sd3")
    ap.add_argument("--encoders", default="")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--world", default="simple")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch
    from world_pretrain import diagnostics, recipe

    from te_align.tiny import world

    torch.set_num_threads(args.threads)
    cfg = recipe.PretrainConfig.for_family(args.family, world=args.world, encoders=args.encoders)
    samples = world.make_dataset(args.n, 30_000, image_size=None, tokenizer=False, split="base", concept=cfg.concept(),
                                 space=cfg.space)  # fmt: skip
    t0 = time.perf_counter()
    comps = recipe._components(cfg.family, cfg.encoders)
    table = recipe.encode_captions(recipe.fitted_profile(cfg.family), comps, [s.caption for s in samples])
    enc_s = time.perf_counter() - t0
    n_train = 2 * args.n // 3
    res = diagnostics.probe_conditioning(table, samples, n_train)
    vis = recipe.visible(recipe.fitted_profile(cfg.family), samples[n_train:])
    label = "pretrained" if args.encoders else "tiny random"
    print(f"{args.family}, {label} encoders, {args.world} world: {args.n} captions encoded in {enc_s:.0f} s; "
          f"{sum(vis)}/{len(vis)} test prompts visible")  # fmt: skip
    print("| encoders | read-out | colour | shape | position | size |\n| --- | --- | ---: | ---: | ---: | ---: |")
    for name, accs in res.items():
        print(f"| {label} | {name} | " + " | ".join(f"{100 * accs[a]:.1f}%" for a in diagnostics.PROBE_ATTRIBUTES) + " |")


if __name__ == "__main__":
    main()
