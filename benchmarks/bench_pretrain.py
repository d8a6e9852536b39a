"""Pretrain a tiny world model (SD3-, Flux- or SDXL-shaped) and log held-out prompt accuracy against steps.

    PYTHONPATH=$PWD python benchmarks/bench_pretrain.py --out runs/sd3 --steps 4000 --eval-at 500,1000,2000,3000,4000
    PYTHONPATH=$PWD python benchmarks/bench_pretrain.py --family flux --out runs/flux --vae-from runs/sd3/model-4000

Writes ``log.jsonl`` (every record: data, VAE, encoding, training losses, evaluations) and, at each
evaluation point, the pipeline folder ``model-<step>``, a sample grid ``grid-<step>.png`` and the resumable
state ``checkpoint.pt`` (denoiser, EMA, optimizer, step; replaced atomically; also after every
``--gap-every`` stop, so a killed run loses at most that many steps). ``--resume`` continues from
it: training is seeded per step, so a resumed run gives the weights of an uninterrupted one. Every
``--gap-every`` steps the conditioning gap (``pretrain.conditioning_gap`` on 64 held-out images: how much
worse the denoiser predicts with wrong captions) is logged; it moves long before prompt accuracy does.
``--family`` picks the model and its chosen sizes (``PretrainConfig.for_family``); ``--config`` changes
fields on top. ``--time-steps N`` only measures: seconds per denoiser training step over N steps (after
2 untimed ones), logged as ``{"phase": "step_time"}`` and printed, then exits (no evaluation, nothing saved).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", default="sd3", choices=["sd3", "flux", "sdxl"])
    ap.add_argument("--time-steps", type=int, default=0, help="only measure seconds per step over N steps")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--eval-at", default="500,1000,2000,3000,4000")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=10000)
    ap.add_argument("--vae-steps", type=int, default=1500)
    ap.add_argument(
        "--vae-eval-every",
        type=int,
        default=0,
        help="VAE round-trip evaluation every N VAE steps (0: only at the end)",
    )
    ap.add_argument("--vae-eval-n", type=int, default=300, help="held-out renders for the VAE round trip")
    ap.add_argument("--eval-n", type=int, default=16, help="held-out prompts per caption style")
    ap.add_argument("--sample-steps", type=int, default=16)
    ap.add_argument("--guidance", type=float, default=4.0)
    ap.add_argument("--vae-from", default="", help="reuse the autoencoder of a saved pipeline folder")
    ap.add_argument("--config", default="{}", help="JSON of further PretrainConfig fields")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (same config)")
    ap.add_argument("--gap-every", type=int, default=250, help="conditioning gap every N steps (0: never)")
    args = ap.parse_args()

    import diffusers
    import torch
    import transformers

    from te_align.tiny import pretrain, world

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    diffusers.logging.set_verbosity_error()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = (out / "log.jsonl").open("a", encoding="utf-8")

    def log(r: dict) -> None:
        r = {"time": round(time.time(), 1), **r}
        logf.write(json.dumps(r) + "\n")
        logf.flush()

    fields = {
        "steps": args.steps,
        "train_size": args.train_size,
        "vae_steps": args.vae_steps,
        **json.loads(args.config),
    }
    if args.time_steps > 0:
        fields["steps"] = args.time_steps + 2
    cfg = pretrain.PretrainConfig.for_family(args.family, **fields)
    log({"phase": "config", **cfg.as_dict(), "threads": args.threads})
    held_imgs = world.make_dataset(args.vae_eval_n, 10_000, image_size=cfg.image_size, tokenizer=False)

    def vae_eval(step: int, vae: object) -> None:
        t0 = time.perf_counter()
        rt = pretrain.vae_roundtrip_accuracy(vae, held_imgs)
        log({"phase": "vae_roundtrip", "vae_step": step, "heldout_renders": len(held_imgs), **rt,
             "eval_seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip

    reused = (
        diffusers.AutoencoderKL.from_pretrained(args.vae_from, subfolder="vae") if args.vae_from else None
    )
    prep = pretrain.prepare(
        cfg, log, vae_callback=vae_eval, vae_callback_every=args.vae_eval_every, vae=reused
    )
    vae = prep["vae"]
    if args.time_steps > 0:
        common = (cfg, prep["latents"], prep["table"], prep["dropout"])
        warm = pretrain.train_transformer(*common, captions=prep["captions"], stop_step=2)
        t0 = time.perf_counter()
        done = pretrain.train_transformer(
            *common, captions=prep["captions"], transformer=warm["transformer"], ema=warm["ema"],
            optimizer_state=warm["optimizer_state"], start_step=2,
        )  # fmt: skip
        seconds = (time.perf_counter() - t0) / args.time_steps
        params = sum(p.numel() for p in done["transformer"].parameters())
        record = {"phase": "step_time", "family": cfg.family, "batch": cfg.batch, "steps": args.time_steps,
                  "seconds_per_step": round(seconds, 3), "denoiser_params": params}  # fmt: skip
        log(record)
        print(json.dumps(record))
        return
    if reused is None and (args.vae_eval_every <= 0 or cfg.vae_steps % args.vae_eval_every):
        vae_eval(cfg.vae_steps, vae)
    evalset = [
        s
        for style in ("tags", "short", "long")
        for s in pretrain.heldout_set(args.eval_n, 20_000, style, cfg.concept())
    ]
    state = {"transformer": None, "ema": None, "optimizer_state": None, "step": 0}
    t_train = 0.0
    ckpt_path = out / "checkpoint.pt"
    if args.resume and ckpt_path.exists():
        state, t_train = _load_checkpoint(ckpt_path, cfg, prep)
        log({"phase": "resume", "step": state["step"], "train_seconds": round(t_train, 1)})
    gap_set = world.make_dataset(64, 20_000, split="base" if cfg.concept() else "all", concept=cfg.concept(),
                                 image_size=cfg.image_size, tokenizer=False)  # fmt: skip
    gap_latents = pretrain.encode_latents(vae, [s.image for s in gap_set])
    gap_table = pretrain.encode_captions(prep["profile"], prep["components"], [s.caption for s in gap_set])
    points = [int(x) for x in args.eval_at.split(",") if x and int(x) > state["step"]]
    for point in points:
        stops = (
            list(range(state["step"] + args.gap_every, point, args.gap_every)) if args.gap_every > 0 else []
        )
        for stop in [*stops, point]:
            t0 = time.perf_counter()
            state = pretrain.train_transformer(
                cfg,
                prep["latents"],
                prep["table"],
                prep["dropout"],
                transformer=state["transformer"],
                ema=state["ema"],
                optimizer_state=state["optimizer_state"],
                start_step=state["step"],
                stop_step=stop,
                log=log,
                captions=prep["captions"],
            )
            t_train += time.perf_counter() - t0
            if args.gap_every > 0:
                gap = pretrain.conditioning_gap(cfg, state["ema"], gap_latents, gap_table)
                log(
                    {
                        "phase": "gap",
                        "step": state["step"],
                        "model": "ema",
                        **{f"t{k:g}": round(v, 3) for k, v in gap.items()},
                    }
                )
            _save_checkpoint(ckpt_path, cfg, state, t_train)  # a killed run loses at most --gap-every steps
        pipe = pretrain.build_pipeline(state["ema"], vae, cfg, prep["components"])
        if point == points[0]:
            log({"phase": "sizes", **pretrain.model_sizes(pipe)})
        t0 = time.perf_counter()
        ev = pretrain.evaluate_pipeline(pipe, evalset, steps=args.sample_steps, guidance=args.guidance)
        images = ev.pop("images")
        log(
            {
                "phase": "eval",
                "step": state["step"],
                "train_seconds": round(t_train, 1),
                "eval_seconds": round(time.perf_counter() - t0, 1),
                "guidance": args.guidance,
                "sample_steps": args.sample_steps,
                **ev,
            }
        )
        world.grid(
            images[:: max(1, len(images) // 12)][:12],
            [s.caption[:120] for s in evalset[:: max(1, len(images) // 12)][:12]],
            columns=6,
        ).save(out / f"grid-{state['step']}.png")
        pipe.save_pretrained(str(out / f"model-{state['step']}"), safe_serialization=True)
        if state["step"] >= cfg.steps:
            break


def _save_checkpoint(path: Path, cfg: object, state: dict, t_train: float) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save({"config": cfg.as_dict(), "step": state["step"], "train_seconds": t_train,  # type: ignore[attr-defined]
                "transformer": state["transformer"].state_dict(), "ema": state["ema"].state_dict(),
                "optimizer_state": state["optimizer_state"]}, tmp)  # fmt: skip
    tmp.replace(path)


def _load_checkpoint(path: Path, cfg: object, prep: dict) -> tuple[dict, float]:
    import copy

    import torch

    from te_align.tiny import pretrain

    ck = torch.load(path, weights_only=False)
    if ck["config"] != cfg.as_dict():  # type: ignore[attr-defined]
        raise SystemExit(
            f"{path}: saved for another configuration; run without --resume or with the same flags"
        )
    table = prep["table"]
    model = pretrain.new_transformer(cfg, table.tensors["prompt_embeds"].shape[-1],
                                     table.tensors["pooled_prompt_embeds"].shape[-1])  # fmt: skip
    model.load_state_dict(ck["transformer"])
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    ema.load_state_dict(ck["ema"])
    state = {"transformer": model, "ema": ema, "optimizer_state": ck["optimizer_state"], "step": ck["step"]}
    return state, float(ck["train_seconds"])


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
