"""Seconds per training step of candidate world denoisers (forward, backward, AdamW), on random inputs.

    OMP_NUM_THREADS=1 python benchmarks/world/bench_world_steps.py [--batch 32] [--threads 1] [--only sd3]

Each candidate is the family's real diffusers class at a tiny size, fed what its pipeline feeds it (SD3: 77 + 256
text tokens; Flux schnell: 256 T5 tokens, dev 512; Chroma: 256 or 512 T5 tokens with its transformer
mask; SDXL / SD 1.5: 77 CLIP tokens) on 16 x 16 x 8 latents (32 px images through the world autoencoder).
``--only chroma`` also times the Flux base's size beside it. Two untimed steps, then the mean of ``--steps``.
The machine is shared: run candidates in one call so their times are measured side by side, and note the load.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="sd3, flux, chroma, sdxl or sd15")
    args = ap.parse_args()

    import diffusers
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b = args.batch

    def bench(name: str, model: torch.nn.Module, fwd) -> None:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for i in range(args.steps + 2):
            if i == 2:
                t0 = time.perf_counter()
            loss = fwd().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        dt = (time.perf_counter() - t0) / args.steps
        n = sum(p.numel() for p in model.parameters())
        print(f"| {name} | {b} | {dt:.3f} | {b / dt:.0f} | {n / 1e6:.2f} |", flush=True)

    print(f"load average {os.getloadavg()[0]:.1f}, {args.threads} thread(s)")
    print("| denoiser | batch | s/step | samples/s | params (M) |\n| --- | ---: | ---: | ---: | ---: |")
    if args.only in ("", "sd3"):
        for w, layers in ((64, 4), (64, 2), (32, 4), (32, 2)):
            hd = 32 if w == 64 else 16
            m = diffusers.SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=8, out_channels=8, num_layers=layers,
                                                attention_head_dim=hd, num_attention_heads=w // hd, joint_attention_dim=96,
                                                caption_projection_dim=w, pooled_projection_dim=80, pos_embed_max_size=8)  # fmt: skip
            x, c, p, t = torch.randn(b, 8, 16, 16), torch.randn(b, 333, 96), torch.randn(b, 80), torch.rand(b) * 1000
            bench(f"SD3 width {w}, {layers} layers", m,
                  lambda m=m, x=x, c=c, p=p, t=t: m(hidden_states=x, encoder_hidden_states=c, pooled_projections=p, timestep=t).sample)  # fmt: skip
    if args.only in ("", "flux"):
        for w, layers, single, seq in ((64, 2, 2, 256), (32, 1, 2, 256), (32, 1, 1, 256), (32, 1, 1, 512)):
            hd = 32 if w == 64 else 16
            m = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=32, num_layers=layers, num_single_layers=single,
                                                 attention_head_dim=hd, num_attention_heads=w // hd, joint_attention_dim=96,
                                                 pooled_projection_dim=32, guidance_embeds=False,
                                                 axes_dims_rope=(4, 14, 14) if hd == 32 else (2, 6, 8))  # fmt: skip
            x, c, p, t = torch.randn(b, 64, 32), torch.randn(b, seq, 96), torch.randn(b, 32), torch.rand(b)
            ids, tids = torch.zeros(64, 3), torch.zeros(seq, 3)
            bench(f"Flux width {w}, {layers}+{single} blocks, T5 {seq}", m,
                  lambda m=m, x=x, c=c, p=p, t=t, ids=ids, tids=tids: m(hidden_states=x, encoder_hidden_states=c, pooled_projections=p,
                                                                       timestep=t, img_ids=ids, txt_ids=tids, guidance=None).sample)  # fmt: skip
    if args.only == "chroma":  # the Flux base's size, measured beside the Chroma candidates
        m = diffusers.FluxTransformer2DModel(
            patch_size=1,
            in_channels=32,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=32,
            num_attention_heads=2,
            joint_attention_dim=96,
            pooled_projection_dim=32,
            guidance_embeds=False,
            axes_dims_rope=(4, 14, 14),
        )
        x, c, p, t = torch.randn(b, 64, 32), torch.randn(b, 256, 96), torch.randn(b, 32), torch.rand(b)
        ids, tids = torch.zeros(64, 3), torch.zeros(256, 3)
        bench(
            "Flux width 64, 2+2 blocks, T5 256 (the flux base)",
            m,
            lambda m=m, x=x, c=c, p=p, t=t, ids=ids, tids=tids: m(
                hidden_states=x, encoder_hidden_states=c, pooled_projections=p, timestep=t, img_ids=ids,
                txt_ids=tids, guidance=None,
            ).sample,
        )
    if args.only in ("", "chroma"):
        # the chroma family's size (world_pretrain.recipe FAMILY_DEFAULTS) at T5 256 and 512, and the approximator
        # at Chroma's 5 layers; the mask as ChromaPipeline builds it: 40 visible text tokens (a short caption and
        # one padding token, float, as pipelines/chroma/pipeline_chroma.py:249-251) and ones for the 64 image tokens
        for seq, hidden, depth in ((256, 64, 2), (512, 64, 2), (256, 64, 5)):
            m = diffusers.ChromaTransformer2DModel(
                patch_size=1,
                in_channels=32,
                num_layers=2,
                num_single_layers=2,
                attention_head_dim=32,
                num_attention_heads=2,
                joint_attention_dim=96,
                axes_dims_rope=(4, 14, 14),
                approximator_num_channels=64,
                approximator_hidden_dim=hidden,
                approximator_layers=depth,
            )
            x, c, t = torch.randn(b, 64, 32), torch.randn(b, seq, 96), torch.rand(b)
            text = (torch.arange(seq) < 40).float().expand(b, seq)
            mask = torch.cat([text, torch.ones(b, 64, dtype=torch.bool)], dim=1)
            ids, tids = torch.zeros(64, 3), torch.zeros(seq, 3)
            bench(
                f"Chroma width 64, 2+2 blocks, approximator {depth} x {hidden}, T5 {seq}",
                m,
                lambda m=m, x=x, c=c, t=t, ids=ids, tids=tids, mask=mask: m(
                    hidden_states=x, encoder_hidden_states=c, timestep=t, img_ids=ids, txt_ids=tids,
                    attention_mask=mask,
                ).sample,
            )
    for fam in ("sdxl", "sd15"):
        if args.only not in ("", fam):
            continue
        for ch in ((32, 64, 64), (32, 64), (16, 32, 32)):
            n = len(ch)
            kw: dict = {"attention_head_dim": [c // 16 for c in ch], "norm_num_groups": 8}
            if fam == "sdxl":
                kw.update(down_block_types=["DownBlock2D"] + ["CrossAttnDownBlock2D"] * (n - 1),
                          up_block_types=["CrossAttnUpBlock2D"] * (n - 1) + ["UpBlock2D"], cross_attention_dim=80,
                          use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=16,
                          projection_class_embeddings_input_dim=6 * 16 + 48)  # fmt: skip
            else:
                kw.update(down_block_types=["CrossAttnDownBlock2D"] * (n - 1) + ["DownBlock2D"],
                          up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * (n - 1), cross_attention_dim=32)  # fmt: skip
            m = diffusers.UNet2DConditionModel(sample_size=16, in_channels=8, out_channels=8, layers_per_block=1,
                                               block_out_channels=ch, **kw)  # fmt: skip
            x, t = torch.randn(b, 8, 16, 16), torch.randint(0, 1000, (b,))
            c = torch.randn(b, 77, 80 if fam == "sdxl" else 32)
            extra = {"added_cond_kwargs": {"text_embeds": torch.randn(b, 48), "time_ids": torch.zeros(b, 6)}} if fam == "sdxl" else {}
            bench(f"{'SDXL' if fam == 'sdxl' else 'SD 1.5'} UNet {ch}", m,
                  lambda m=m, x=x, t=t, c=c, extra=extra: m(x, t, encoder_hidden_states=c, **extra).sample)  # fmt: skip


if __name__ == "__main__":
    main()
