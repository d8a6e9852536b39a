"""Does a pretrained world model use its prompts? The conditioning gap of a saved pipeline folder.

    PYTHONPATH=$PWD python benchmarks/bench_condgap.py --model RUN/model-STEP --family sdxl [--n 64]

On ``--n`` held-out world images (the held-out concept left out, dataset seed 20000), the denoiser's loss with
each image's own caption against the loss with the captions rolled by one (every image gets another image's
caption), at fixed timesteps and fixed noise. A model that uses its conditioning has a clearly larger loss with
the wrong captions; a gap near zero means the text is ignored (whatever the samples look like).
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--family", choices=("sd3", "sdxl"), required=True)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import diffusers
    import torch

    import te_align
    from te_align.tiny import pretrain, world

    torch.set_num_threads(args.threads)
    cls = diffusers.StableDiffusionXLPipeline if args.family == "sdxl" else diffusers.StableDiffusion3Pipeline
    pipe = cls.from_pretrained(args.model)
    profile = pretrain.fitted_profile(args.family)
    samples = world.make_dataset(args.n, 20_000, split="base", concept=world.Concept("colour", "pink"), image_size=32,
                                 tokenizer=False)  # fmt: skip
    x = torch.from_numpy(np.stack([s.image for s in samples])).permute(0, 3, 1, 2).float() / 127.5 - 1
    n = len(samples)
    with torch.no_grad():
        mean = pipe.vae.encode(x).latent_dist.mean
        shift = pipe.vae.config.shift_factor or 0.0
        z = (mean - shift) * pipe.vae.config.scaling_factor
        cond = te_align.encode(profile, [s.caption for s in samples], pipeline=pipe)
        gen = torch.Generator().manual_seed(0)
        print(f"{args.model}: loss with own captions vs captions rolled by one, {n} held-out images")
        for frac in (0.1, 0.3, 0.5, 0.7, 0.9):
            noise = torch.randn(z.shape, generator=gen)
            losses = {}
            for name, idx in (("own", torch.arange(n)), ("rolled", torch.roll(torch.arange(n), 1))):
                if args.family == "sdxl":
                    t = torch.full((n,), round(frac * 999), dtype=torch.long)
                    zt = pipe.scheduler.add_noise(z, noise, t)
                    ids = torch.tensor([[32, 32, 0, 0, 32, 32]] * n, dtype=torch.float32)
                    pred = pipe.unet(zt, t, encoder_hidden_states=cond["prompt_embeds"][idx],
                                     added_cond_kwargs={"text_embeds": cond["pooled_prompt_embeds"][idx], "time_ids": ids}).sample  # fmt: skip
                    target = noise
                else:
                    zt = (1 - frac) * z + frac * noise
                    pred = pipe.transformer(hidden_states=zt, encoder_hidden_states=cond["prompt_embeds"][idx],
                                            pooled_projections=cond["pooled_prompt_embeds"][idx],
                                            timestep=torch.full((n,), frac * 1000), return_dict=False)[0]  # fmt: skip
                    target = noise - z
                losses[name] = float(((pred - target) ** 2).mean())
            gap = losses["rolled"] - losses["own"]
            print(f"  t={frac:.1f}: own {losses['own']:.5f}  rolled {losses['rolled']:.5f}  gap {gap:+.5f} "
                  f"({100 * gap / losses['own']:+.2f}%)")  # fmt: skip


if __name__ == "__main__":
    main()
