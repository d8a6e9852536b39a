"""Why do the tiny world models barely read their prompts? The conditioning gap early in pretraining, per variant.

    PYTHONPATH=$PWD python benchmarks/bench_pretrain_signal.py --family sdxl --variant profile --steps 600 \
        --vae-from RUN/model-STEP
    ... --variant onehot      # the text replaced by an oracle: one-hot colour / shape / position per object
    ... --variant whitened    # the denoiser's text-input layers initialised on whitened conditioning
    ... --variant profile --config '{"lr": 3e-3}'

Trains the family's denoiser (``PretrainConfig.for_family``, batch 16, 8 latent channels, the autoencoder
of ``--vae-from``) on ``--train-size`` world scenes and prints ``pretrain.conditioning_gap`` of the raw (not
EMA) weights on 64 held-out scenes every ``--every`` steps: how much worse the x0 prediction gets with the
captions rolled by one, at t = 0.3 / 0.6 / 0.9. Variants:

* ``profile``: the recipe (the family's profile on the tiny frozen encoders).
* ``onehot``: an upper bound on what better text encoders could give: each caption replaced by a sequence
  whose token 1 + j holds a one-hot of object j's colour, shape and position (value 3), the pooled vector the
  colour counts; same widths as the profile's outputs. If the gap grows no faster than ``profile``, the
  encoders are not what holds the denoiser back.
* ``whitened``: ``profile``, with the denoiser's text-input layers (SDXL: every cross-attention ``to_k`` /
  ``to_v`` and the pooled columns of ``add_embedding.linear_1``; SD3 / Flux: ``context_embedder`` and the pooled
  text embedder) re-initialised as a random projection of the conditioning whitened on the training captions
  (the directions that vary between captions, rather than between positions, scaled to unit variance).

Also prints the share of the conditioning's second moment that varies between captions (per position for
the first tokens), the number behind "the tiny encoders' outputs are mostly the same for every caption".
"""

from __future__ import annotations

import argparse
import json
import time


def caption_share(table: object) -> str:
    out = []
    for key, v in table.tensors.items():  # type: ignore[attr-defined]
        v = v.double()
        mu = v.mean(0, keepdim=True)
        line = f"{key}: between-caption share {float(((v - mu) ** 2).mean() / (v**2).mean()):.3f}"
        if v.dim() == 3:
            per = ((v - mu) ** 2).mean((0, 2)) / (v**2).mean((0, 2))
            line += " (tokens 0-7: " + " ".join(f"{float(x):.2f}" for x in per[:8]) + ")"
        out.append(line)
    return "; ".join(out)


def onehot(samples: list, seq: tuple[int, int], pooled: int) -> tuple[object, object]:
    import torch

    from te_align.tiny import world

    cols, shapes, pos = list(world.COLOURS), list(world.SHAPES), list(world.POSITIONS)
    pe = torch.zeros(len(samples), *seq)
    po = torch.zeros(len(samples), pooled)
    for i, s in enumerate(samples):
        for j, o in enumerate(s.objects):
            pe[i, 1 + j, cols.index(o.colour)] = 3
            pe[i, 1 + j, len(cols) + shapes.index(o.shape)] = 3
            pe[i, 1 + j, len(cols) + len(shapes) + pos.index(o.position)] = 3
            po[i, cols.index(o.colour)] += 3
    return pe, po


def _whitener(x: object, n: int = 1024) -> tuple[object, object]:
    """(A, mean): rows of A project onto the directions whose variance is mostly between captions, unit variance."""
    import torch

    x3 = x[:n].double()  # type: ignore[index]
    if x3.dim() == 2:
        x3 = x3[:, None]
    d = x3.shape[-1]
    resid = (x3 - x3.mean(0, keepdim=True)).reshape(-1, d)
    flat = x3.reshape(-1, d)
    cov_t = torch.cov(flat.T)
    cov_r = resid.T @ resid / resid.shape[0]
    s, u = torch.linalg.eigh(cov_t)
    s = s.clamp_min(float(s.max()) * 1e-6)
    inv = u @ torch.diag(s.rsqrt()) @ u.T
    lam, q = torch.linalg.eigh(inv @ cov_r @ inv)
    a = q[:, lam >= 0.25].T @ inv
    return a.float(), flat.mean(0).float()


def whiten_inputs(model: object, table: object, family: str) -> None:
    import torch

    a, mu = _whitener(table.tensors["prompt_embeds"])  # type: ignore[attr-defined]
    ap, mup = _whitener(table.tensors["pooled_prompt_embeds"])  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(123)

    def fresh(out: int, proj: object) -> object:
        return torch.randn(out, proj.shape[0], generator=gen) / proj.shape[0] ** 0.5 @ proj  # type: ignore[attr-defined]

    with torch.no_grad():
        if family == "sdxl":
            centre = torch.eye(mu.shape[0]) - torch.outer(mu, mu) / mu.dot(
                mu
            )  # bias-free layers: the mean projected out
            for name, mod in model.named_modules():  # type: ignore[attr-defined]
                if name.endswith("attn2"):
                    for lin in (mod.to_k, mod.to_v):
                        lin.weight.copy_(fresh(lin.out_features, a) @ centre)
            l1 = model.add_embedding.linear_1  # type: ignore[attr-defined]
            w = fresh(l1.out_features, ap)
            l1.weight[:, : ap.shape[1]] = w
            l1.bias.sub_(w @ mup)
            return
        for lin, proj, mean in (
            (model.context_embedder, a, mu),
            (model.time_text_embed.text_embedder.linear_1, ap, mup),
        ):  # type: ignore[attr-defined]
            w = fresh(lin.out_features, proj)
            lin.weight.copy_(w)
            lin.bias.copy_(-(w @ mean))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=("sd3", "flux", "sdxl"), required=True)
    ap.add_argument("--variant", choices=("profile", "onehot", "whitened"), default="profile")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--train-size", type=int, default=4000)
    ap.add_argument("--vae-from", required=True, help="a saved pipeline folder whose autoencoder is reused")
    ap.add_argument("--config", default="{}", help="JSON of further PretrainConfig fields")
    args = ap.parse_args()

    import diffusers
    import torch
    import transformers

    from te_align.tiny import pretrain, world

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    diffusers.logging.set_verbosity_error()
    fields = {"vae_channels": (16, 32), "latent_channels": 8, "batch": 16, "train_size": args.train_size,
              "steps": args.steps, **json.loads(args.config)}  # fmt: skip
    cfg = pretrain.PretrainConfig.for_family(args.family, **fields)
    vae = diffusers.AutoencoderKL.from_pretrained(args.vae_from, subfolder="vae")
    prep = pretrain.prepare(cfg, lambda r: None, vae=vae)
    table = prep["table"]
    seq, pooled = (
        tuple(table.tensors["prompt_embeds"].shape[1:]),
        table.tensors["pooled_prompt_embeds"].shape[1],
    )
    print(f"{args.family} {args.variant} {fields}: {caption_share(table)}", flush=True)
    val = world.make_dataset(
        64, 20_000, split="base", concept=cfg.concept(), image_size=cfg.image_size, tokenizer=False
    )
    val_latents = pretrain.encode_latents(prep["vae"], [s.image for s in val])
    val_table = pretrain.encode_captions(prep["profile"], prep["components"], [s.caption for s in val])
    if args.variant == "onehot":
        table.tensors["prompt_embeds"], table.tensors["pooled_prompt_embeds"] = onehot(
            prep["train"], seq, pooled
        )
        val_table.tensors["prompt_embeds"], val_table.tensors["pooled_prompt_embeds"] = onehot(
            val, seq, pooled
        )
    model = pretrain.new_transformer(cfg, seq[-1], pooled)
    if args.variant == "whitened":
        whiten_inputs(model, table, args.family)
    state = {"transformer": model, "ema": None, "optimizer_state": None}
    t0 = time.perf_counter()

    def show(step: int) -> None:
        gap = pretrain.conditioning_gap(cfg, state["transformer"], val_latents, val_table)
        print(f"step {step:>5} {time.perf_counter() - t0:7.0f}s  gap % " + "  ".join(f"t={k:g}: {v:+.2f}" for k, v in gap.items()),
              flush=True)  # fmt: skip

    show(0)
    for start in range(0, args.steps, args.every):
        state = pretrain.train_transformer(
            cfg, prep["latents"], table, prep["dropout"], transformer=state["transformer"], ema=state["ema"],
            optimizer_state=state["optimizer_state"], start_step=start, stop_step=start + args.every,
            captions=prep["captions"],
        )  # fmt: skip
        show(start + args.every)


if __name__ == "__main__":
    main()
