"""One training step of the klein denoiser recipe as the pretraining run takes it (tools/world_pretrain, family klein).

    python benchmarks/klein/klein_recipe_step.py [--steps 20] [--warmup 5]

``recipe.train_transformer`` with ``PretrainConfig.for_family("klein")`` at batch 16: the klein transformer, 64 captions
of the simple world encoded by ``te_align.encode`` with the fitted flux2-klein-4b profile (text 512 x 96, the tiny
random Qwen3 encoder: the same shape as a klein encoder set's), caption dropout 10%, random patchified latents
(32 x 8 x 8), AdamW, EMA. One thread (``torch.set_num_threads(1)``; run it with ``OMP_NUM_THREADS=1``). Prints wall
and CPU (``time.process_time``) seconds per step after ``--warmup`` steps, and per encoded caption: on a shared
machine the CPU seconds are what one uncontended core would take.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    args = ap.parse_args(argv)

    import torch
    from world_pretrain import recipe

    from te_align.tiny import world

    torch.set_num_threads(1)
    total = args.warmup + args.steps
    cfg = recipe.PretrainConfig.for_family("klein", batch=16, train_size=64, world="simple", steps=total)
    comps = recipe._components("klein")
    profile = recipe.fitted_profile("klein")
    train = world.make_dataset(64, 0, image_size=None, tokenizer=False, space=cfg.space, split="base", concept=cfg.concept())
    captions = [s.caption for s in train]
    t0, c0 = time.perf_counter(), time.process_time()
    table = recipe.encode_captions(profile, comps, captions, 64)
    enc_wall, enc_cpu = time.perf_counter() - t0, time.process_time() - c0
    latents = torch.randn(64, 4 * cfg.latent_channels, cfg.latent_size // 2, cfg.latent_size // 2,
                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    drop = recipe.SlotDropout(profile, comps, captions[:4])
    caps = recipe.CaptionDropout(profile, comps, cfg.caption_dropout_rate)
    st = recipe.train_transformer(cfg, latents, table, drop, captions=caps, stop_step=args.warmup)
    t0, c0 = time.perf_counter(), time.process_time()
    recipe.train_transformer(cfg, latents, table, drop, captions=caps, transformer=st["transformer"], ema=st["ema"],
                             optimizer_state=st["optimizer_state"], start_step=args.warmup)  # fmt: skip
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {
        "step_wall_s": round(wall / args.steps, 4), "step_cpu_s": round(cpu / args.steps, 4),
        "encode_wall_s_per_caption": round(enc_wall / 64, 4), "encode_cpu_s_per_caption": round(enc_cpu / 64, 4),
        "text_tokens": int(table.tensors["prompt_embeds"].shape[1]), "batch": cfg.batch, "threads": torch.get_num_threads(),
        "denoiser_params": sum(p.numel() for p in st["transformer"].parameters()), "torch": torch.__version__,
    }  # fmt: skip
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
