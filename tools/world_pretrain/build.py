"""``python tools/world_build.py``: pretrain the shapes-world parts, deterministic and resumable.

    python tools/world_build.py vae --out OUT/vae                       # the shared autoencoder
    python tools/world_build.py encoders --out OUT/encoders             # the shared text encoders
    python tools/world_build.py klein-encoder --out OUT/encoders-klein  # the klein base's Qwen3 (resumable)
    python tools/world_build.py base sd3 --out OUT/sd3 --vae OUT/vae --encoders OUT/encoders \\
        --steps 20000 --eval-at 5000,10000,20000 [--resume] [--device cuda] [--config JSON]
    python tools/world_build.py all sd3 --out OUT                       # all three, with each part's defaults

Every part writes ``log.jsonl`` (one JSON record per line: config, data, losses, evaluations, timings) into its
folder. ``base`` evaluates held-out prompts at ``--eval-at`` (samples with the official pipeline, read by the
world's reader), saves the pipeline folder ``model-<step>`` and a grid there, logs the conditioning gap every
``--gap-every`` steps, and keeps ``checkpoint.pt`` (denoiser, EMA, optimizer, step, written atomically at every
stop), so ``--resume`` continues a killed run with the weights an uninterrupted one would have: training is
seeded per step. CPU by default (``--threads``); ``--device cuda`` runs the denoiser under bf16 autocast.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from pathlib import Path
from typing import Any

from world_pretrain import recipe

#: The held-out prompts of every evaluation: dataset seed, prompts per caption style.
EVAL_SEED = 20_000
GAP_SCENES = 64


class Log:
    """Append-only JSON lines with a wall-clock stamp."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = path.open("a", encoding="utf-8")

    def __call__(self, r: dict[str, Any]) -> None:
        self.f.write(json.dumps({"time": round(time.time(), 1), **r}) + "\n")
        self.f.flush()


def _setup(threads: int) -> None:
    import diffusers
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    diffusers.logging.set_verbosity_error()


def _config(family: str, args: argparse.Namespace) -> recipe.PretrainConfig:
    fields = json.loads(args.config)
    for key in ("steps",):
        if getattr(args, key, None) is not None:
            fields[key] = getattr(args, key)
    if getattr(args, "encoders", None):
        fields["encoders"] = str(Path(args.encoders).resolve())
    return recipe.PretrainConfig.for_family(family, **fields)


# --------------------------------------------------------------------------------------------------
# vae
# --------------------------------------------------------------------------------------------------


def build_vae(args: argparse.Namespace) -> Path:
    """Train the autoencoder on the whole world (every concept, the full scene space) and save ``OUT/vae``."""
    from te_align.tiny import world

    out = Path(args.out)
    dest = out / "vae"
    if (dest / "config.json").is_file():
        return dest
    log = Log(out / "log.jsonl")
    cfg = _config("sd3", args)
    log({"phase": "config", "part": "vae", **cfg.as_dict(), "threads": args.threads})
    t0 = time.perf_counter()
    data = world.make_dataset(cfg.train_size, cfg.seed, image_size=cfg.image_size, tokenizer=False, style_mix=cfg.style_mix)
    held = world.make_dataset(300, 10_000, image_size=cfg.image_size, tokenizer=False)
    held_simple = world.make_dataset(300, 10_000, image_size=cfg.image_size, tokenizer=False, space=world.SIMPLE)
    log({"phase": "data", "samples": len(data), "seconds": round(time.perf_counter() - t0, 1)})

    def evaluate(step: int, vae: Any) -> None:
        for name, samples in (("full", held), ("simple", held_simple)):
            log({"phase": "vae_roundtrip", "vae_step": step, "world": name, **recipe.vae_roundtrip_accuracy(vae, samples)})

    t0 = time.perf_counter()
    vae = recipe.train_vae(cfg, [s.image for s in data], log, callback=evaluate, callback_every=args.eval_every)
    recipe._round_to_half(vae)
    seconds = time.perf_counter() - t0
    evaluate(cfg.vae_steps, vae)
    tmp = out / "vae.partial"
    vae.save_pretrained(str(tmp), safe_serialization=True)
    tmp.rename(dest)
    log({"phase": "vae_saved", "train_seconds": round(seconds, 1), "threads": args.threads})
    return dest


# --------------------------------------------------------------------------------------------------
# encoders
# --------------------------------------------------------------------------------------------------


def build_encoders(args: argparse.Namespace) -> Path:
    """Pretrain the shared text encoders on world captions and save them into ``OUT``."""
    from world_pretrain import encoders

    out = Path(args.out)
    if (out / encoders.MANIFEST).is_file():
        return out
    try:
        cfg = encoders.EncoderConfig(**json.loads(args.config))
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"world_build.py encoders --config: {exc}") from None
    log = Log(out / "log.jsonl")
    log({"phase": "config", "part": "encoders", **cfg.as_dict(), "threads": args.threads})
    comps, metrics = encoders.pretrain_encoders(cfg, log)
    metrics["threads"] = args.threads
    return _publish(out, lambda tmp: encoders.save_encoders(comps, tmp, config=cfg.as_dict(), metrics=metrics))


def _publish(out: Path, save: Any) -> Path:
    """Write an encoder set with ``save(folder)`` into ``OUT.partial``, then move its files into ``OUT`` (whose
    manifest, written last by the move of its file, marks the set complete)."""
    tmp = out.with_name(out.name + ".partial")
    save(tmp)
    for p in tmp.iterdir():
        p.rename(out / p.name)
    tmp.rmdir()
    return out


def build_klein_encoder(args: argparse.Namespace) -> Path:
    """Pretrain the klein base's Qwen3 text encoder on world captions (:mod:`world_pretrain.klein_encoder`) into
    ``OUT``; a killed run resumes from ``OUT/work/checkpoint.pt`` when started again with the same config."""
    from world_pretrain import klein_encoder

    out = Path(args.out)
    if (out / klein_encoder.MANIFEST).is_file():
        return out
    try:
        cfg = klein_encoder.KleinEncoderConfig(**json.loads(args.config))
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"world_build.py klein-encoder --config: {exc}") from None
    log = Log(out / "log.jsonl")
    log({"phase": "config", "part": "klein-encoder", **cfg.as_dict(), "threads": args.threads})
    done = klein_encoder.pretrain_klein_encoder(cfg, out / "work", log, stop_after=args.stop_after)
    if done is None:
        return out
    model, metrics = done
    metrics["threads"] = args.threads
    return _publish(out, lambda tmp: klein_encoder.save_klein_encoder(model, tmp, config=cfg.as_dict(), metrics=metrics))


# --------------------------------------------------------------------------------------------------
# the base
# --------------------------------------------------------------------------------------------------


def _save_checkpoint(path: Path, cfg: recipe.PretrainConfig, state: dict[str, Any], t_train: float) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save({"config": cfg.as_dict(), "step": state["step"], "train_seconds": t_train,
                "transformer": state["transformer"].state_dict(), "ema": state["ema"].state_dict(),
                "optimizer_state": state["optimizer_state"]}, tmp)  # fmt: skip
    tmp.replace(path)


def _load_checkpoint(path: Path, cfg: recipe.PretrainConfig, prep: dict[str, Any]) -> tuple[dict[str, Any], float]:
    import torch

    ck = torch.load(path, weights_only=False, map_location="cpu")
    saved = recipe.complete_config(ck["config"])  # fields added since it was saved: at their defaults
    # the total step count may grow (the learning rate is warm-up then constant, so it does not depend on it)
    if {**saved, "steps": None} != {**cfg.as_dict(), "steps": None}:
        raise SystemExit(f"{path}: saved for another configuration; run without --resume or with the same flags")
    if ck["step"] > cfg.steps:
        raise SystemExit(f"{path}: saved at step {ck['step']}, past --steps {cfg.steps}")
    table = prep["table"]
    pooled = table.tensors.get("pooled_prompt_embeds")
    model = recipe.new_transformer(cfg, table.tensors["prompt_embeds"].shape[-1], 0 if pooled is None else pooled.shape[-1])
    model.load_state_dict(ck["transformer"])
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    ema.load_state_dict(ck["ema"])
    return {"transformer": model, "ema": ema, "optimizer_state": ck["optimizer_state"], "step": ck["step"]}, float(
        ck["train_seconds"]
    )


def evalset(cfg: recipe.PretrainConfig, per_style: int) -> list[Any]:
    """The held-out prompts: ``per_style`` of each caption style from dataset seed :data:`EVAL_SEED`."""
    return [s for style in ("tags", "short", "long")
            for s in recipe.heldout_set(per_style, EVAL_SEED, style, cfg.concept(), space=cfg.space)]  # fmt: skip


def build_base(args: argparse.Namespace) -> Path:
    """Pretrain ``args.family``'s denoiser on the saved autoencoder and encoders, evaluating as it goes."""
    import diffusers
    import torch

    from te_align.tiny import world

    out = Path(args.out)
    log = Log(out / "log.jsonl")
    cfg = _config(args.family, args)
    device = torch.device(args.device)
    log({"phase": "config", "part": "base", **cfg.as_dict(), "threads": args.threads, "device": str(device),
         "vae_from": str(args.vae)})  # fmt: skip
    vae = diffusers.AutoencoderKL.from_pretrained(str(args.vae))
    prep = recipe.prepare(cfg, log, vae=vae, cond_cache=args.cond_cache or None)
    vae = prep["vae"]
    if args.device != "cpu":
        prep["latents"] = prep["latents"].to(device)
        prep["table"] = recipe.ConditioningTable({k: v.to(device) for k, v in prep["table"].tensors.items()},
                                                 prep["table"].captions, prep["table"].shared)  # fmt: skip
    styles = [s.style for s in prep["train"]]
    prompts = evalset(cfg, args.eval_n)
    state: dict[str, Any] = {"transformer": None, "ema": None, "optimizer_state": None, "step": 0}
    t_train = 0.0
    ckpt_path = out / "checkpoint.pt"
    if args.resume and ckpt_path.exists():
        state, t_train = _load_checkpoint(ckpt_path, cfg, prep)
        log({"phase": "resume", "step": state["step"], "train_seconds": round(t_train, 1)})
    from world_pretrain.diagnostics import conditioning_gap

    gap_set = world.make_dataset(GAP_SCENES, EVAL_SEED, split="base" if cfg.concept() else "all", concept=cfg.concept(),
                                 image_size=cfg.image_size, tokenizer=False, space=cfg.space)  # fmt: skip
    gap_latents = recipe.encode_latents(vae, [s.image for s in gap_set])
    gap_table = recipe.encode_captions(prep["profile"], prep["components"], [s.caption for s in gap_set])
    points = sorted({int(x) for x in args.eval_at.split(",") if x} | {cfg.steps})
    points = [p for p in points if state["step"] < p <= cfg.steps]
    stop_after = getattr(args, "stop_after", 0) or cfg.steps
    for point in points:
        stops = list(range(state["step"] + args.gap_every, point, args.gap_every)) if args.gap_every > 0 else []
        for stop in [*stops, point]:
            if state["step"] >= stop_after:
                log({"phase": "stopped", "step": state["step"], "train_seconds": round(t_train, 1)})
                return out
            stop = min(stop, stop_after)
            t0 = time.perf_counter()
            state = recipe.train_transformer(
                cfg, prep["latents"], prep["table"], prep["dropout"], transformer=state["transformer"], ema=state["ema"],
                optimizer_state=state["optimizer_state"], start_step=state["step"], stop_step=stop, log=log,
                captions=prep["captions"], styles=styles, device=device,
            )  # fmt: skip
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_train += time.perf_counter() - t0
            if args.gap_every > 0:
                gap = conditioning_gap(cfg, state["ema"], gap_latents, gap_table)
                log({"phase": "gap", "step": state["step"], "samples": state["step"] * cfg.batch, "model": "ema",
                     **{f"t{k:g}": round(v, 3) for k, v in gap.items()}})  # fmt: skip
            _save_checkpoint(ckpt_path, cfg, state, t_train)
        if state["step"] < point:  # stopped by --stop-after between two evaluation points
            log({"phase": "stopped", "step": state["step"], "train_seconds": round(t_train, 1)})
            return out
        ema_cpu = copy.deepcopy(state["ema"]).to("cpu")
        pipe = recipe.build_pipeline(ema_cpu, vae, cfg, prep["components"])
        if point == points[0]:
            log({"phase": "sizes", **recipe.model_sizes(pipe)})
        t0 = time.perf_counter()
        ev = recipe.evaluate_pipeline(pipe, prompts, steps=args.sample_steps, guidance=args.guidance)
        images = ev.pop("images")
        log({"phase": "eval", "step": state["step"], "samples": state["step"] * cfg.batch, "train_seconds": round(t_train, 1),
             "eval_seconds": round(time.perf_counter() - t0, 1), "guidance": args.guidance,
             "sample_steps": args.sample_steps, **ev})  # fmt: skip
        pick = list(range(0, len(prompts), max(1, len(prompts) // 12)))[:12]
        world.grid([images[k] for k in pick], [prompts[k].caption[:120] for k in pick], columns=6).save(
            out / f"grid-{state['step']}.png"
        )
        pipe.save_pretrained(str(out / f"model-{state['step']}"), safe_serialization=True)
    return out


# --------------------------------------------------------------------------------------------------
# one command per base
# --------------------------------------------------------------------------------------------------

#: The shipped bases' recipes (benchmarks/learnability/bench_learnability.md says how each was chosen): PretrainConfig fields on
#: top of the family's defaults, steps, and evaluation points; ``encoders``: EncoderConfig fields of the base's own
#: encoder set, continued from the shared one (``init`` is the shared set), when it does not use the shared set.
_SIMPLE = {"batch": 16, "train_size": 20000, "world": "simple"}
RECIPES: dict[str, dict[str, Any]] = {
    # amendment 4: 2,000 steps (32 k samples), where S3 met colour and position; the SD3 base is S3
    "sd3": {"config": _SIMPLE, "steps": 2000, "eval_at": [1000], "gap_every": 250},
    "flux": {"config": _SIMPLE, "steps": 2000, "eval_at": [1000], "gap_every": 500},
    # amendments 5 and 6: colour 76% (SDXL) and 87.9% (SD 1.5) at 2,000 steps, so continued once to 4,000
    "sd15": {"config": _SIMPLE, "steps": 4000, "eval_at": [1000, 2000, 3000], "gap_every": 500},
    # amendment 7: X1, cross-attention at every UNet level, continued once from 4,000 to 8,000 steps
    "sdxl": {
        "config": {**_SIMPLE, "unet_cross_attention": "all"},
        "steps": 8000,
        "eval_at": [1000, 2000, 3000, 4000, 6000],
        "gap_every": 500,
    },
    # amendments 8-9 missed colour on the shared encoders (2,000, 4,000, 8,000 steps); amendment 11: its own T5, the
    # shared one continued 4,000 steps on captions whose words are capitalised with probability 0.1, then 8,000 steps
    "chroma": {
        "config": _SIMPLE,
        "steps": 8000,
        "eval_at": [4000, 6000],
        "gap_every": 500,
        "encoders": {"train_only": ["t5"], "steps": 4000, "case": 0.1},
    },
    # issue 49 (benchmarks/klein/bench_klein.md section 1, amendment 13): 4,000 steps, evaluated at 2,000, on its own
    # Qwen3 (tools/world_pretrain/klein_encoder.py) written as a chain, each set continued from the one before: the
    # first 2,000 steps, 2,000 more (decision 4), then 2,000 on varied, recased captions at next-token weight 0.1 (13b)
    "klein": {
        "config": _SIMPLE,
        "steps": 4000,
        "eval_at": [2000],
        "gap_every": 500,
        "klein_encoders": [
            ("encoders-klein", {}),
            ("encoders-klein-2", {"init": "encoders-klein"}),
            ("encoders-klein-13b", {"init": "encoders-klein-2", "insert": 0.1, "delete": 0.1, "case": 0.1, "lm_weight": 0.1}),
        ],
    },
}


def build_klein_chain(out: Path, chain: list[tuple[str, dict[str, Any]]], threads: int) -> Path:
    """Write (or resume) each klein encoder set of ``chain`` into ``OUT/NAME``, an ``init`` naming an earlier set of
    the chain; returns the last set."""
    folders = [
        build_klein_encoder(argparse.Namespace(out=str(out / name), threads=threads, stop_after=0, config=json.dumps(
            {**cfg, "init": str(out / cfg["init"])} if "init" in cfg else cfg)))
        for name, cfg in chain
    ]  # fmt: skip
    return folders[-1]


def build_all(args: argparse.Namespace) -> Path:
    """The autoencoder and encoders (once, shared) and ``args.family``'s base with its chosen recipe, into ``OUT``."""
    recipe_ = RECIPES.get(args.family)
    if recipe_ is None:
        raise SystemExit(f"no chosen recipe for {args.family} yet; known: {', '.join(RECIPES) or 'none'}")
    out = Path(args.out)
    # the base's own Qwen3, written by world_pretrain.klein_encoder (not build_encoders), first
    klein_set = build_klein_chain(out, recipe_["klein_encoders"], args.threads) if "klein_encoders" in recipe_ else None
    vae = build_vae(argparse.Namespace(out=str(out), threads=args.threads, config="{}", eval_every=1000))
    if klein_set is not None:
        enc = klein_set
    else:
        enc = build_encoders(argparse.Namespace(out=str(out / "encoders"), threads=args.threads, config="{}"))
    if klein_set is None and "encoders" in recipe_:  # the base's own encoder set, continued from the shared one (e.g. chroma's cased T5)
        own = {"init": str(enc), **recipe_["encoders"]}
        enc = build_encoders(argparse.Namespace(out=str(out / f"encoders-{args.family}"), threads=args.threads,
                                                config=json.dumps(own)))  # fmt: skip
    ns = argparse.Namespace(
        out=str(out / args.family), threads=args.threads, config=json.dumps(recipe_["config"]), family=args.family,
        vae=str(vae), encoders=str(enc), steps=recipe_["steps"], eval_at=",".join(map(str, recipe_["eval_at"])),
        eval_n=args.eval_n, sample_steps=16, guidance=4.0, gap_every=recipe_.get("gap_every", 500), resume=True,
        device=args.device, stop_after=0, cond_cache=getattr(args, "cond_cache", ""),
    )  # fmt: skip
    return build_base(ns)


# --------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="world_build.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="part", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", required=True)
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--config", default="{}", help="JSON of further config fields")

    p = sub.add_parser("vae", help="the autoencoder (shared by every base)")
    common(p)
    p.add_argument("--eval-every", type=int, default=1000, help="round-trip evaluation every N VAE steps")
    p = sub.add_parser("encoders", help="the text encoders (shared by every base)")
    common(p)
    p = sub.add_parser("klein-encoder", help="the klein base's Qwen3 text encoder (resumable)")
    common(p)
    p.add_argument("--stop-after", type=int, default=0, help="stop after this step's checkpoint (a time box); "
                   "the same command continues")  # fmt: skip
    p = sub.add_parser("base", help="a family's denoiser")
    common(p)
    p.add_argument("family", choices=list(recipe.FAMILIES))
    p.add_argument("--vae", required=True, help="folder of the autoencoder (world_build.py vae's OUT/vae)")
    p.add_argument("--encoders", default="", help="folder of the text encoders (default: the tiny random ones)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-at", default="", help="comma-separated steps to evaluate at (and the last step)")
    p.add_argument("--eval-n", type=int, default=32, help="held-out prompts per caption style")
    p.add_argument("--sample-steps", type=int, default=16)
    p.add_argument("--guidance", type=float, default=4.0)
    p.add_argument("--gap-every", type=int, default=250, help="conditioning gap every N steps (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (same config)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--stop-after", type=int, default=0, help="stop after this step (a time box); --resume continues")
    p.add_argument("--cond-cache", default="", help="keep the encoded captions in this folder for other runs")
    p = sub.add_parser("all", help="autoencoder, encoders and a family's base with its chosen recipe (resumable)")
    p.add_argument("family", choices=list(recipe.FAMILIES))
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-n", type=int, default=32, help="held-out prompts per caption style")
    p.add_argument("--device", default="cpu")
    p.add_argument("--cond-cache", default="", help="keep the encoded captions in this folder (a resume skips encoding)")
    args = ap.parse_args(argv)
    _setup(args.threads)
    if args.part == "vae":
        build_vae(args)
    elif args.part == "encoders":
        build_encoders(args)
    elif args.part == "klein-encoder":
        build_klein_encoder(args)
    elif args.part == "all":
        build_all(args)
    else:
        build_base(args)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
