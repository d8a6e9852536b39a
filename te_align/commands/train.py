"""``te-align train CONFIG.toml [--resume [CHECKPOINT] | --overwrite] [--check] [--estimate]``: LoRA training aligned by the model's profile."""

from __future__ import annotations

import argparse

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path; load what only one command needs when it runs.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a LoRA with every caption encoded by the model's profile")
    p.add_argument("config", metavar="CONFIG.toml", help="training config (see examples/train/)")
    p.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="CHECKPOINT",
        help="continue from the newest intact checkpoint in the output folder, or from CHECKPOINT",
    )
    p.add_argument("--overwrite", action="store_true",
                   help="start over in an output folder that holds a previous run (its files are moved into "
                        "OUTPUT/replaced-<time>/, nothing is deleted)")
    p.add_argument("--check", action="store_true",
                   help="validate the config, profile, device, output folder and dataset, and exit (loads no model)")
    p.add_argument("--max-steps", type=int, default=None, help="override train.max_steps")
    p.add_argument("--estimate", action="store_true",
                   help="print the memory the run needs per device (models built on the meta device, nothing big "
                        "loads) and exit; exit 1 when it does not fit, naming settings that would")
    p.add_argument("--memory", type=float, default=None, metavar="GIB",
                   help="with --estimate: the device memory to fit in (default: the GPU's, else system RAM)")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    import logging

    from te_align.train.config import TrainError, load_config

    cfg = load_config(args.config)
    if args.max_steps is not None:
        if args.max_steps < 1:
            raise TrainError(f"must be >= 1, got {args.max_steps}", key="--max-steps")
        cfg.train.max_steps = args.max_steps
    resume = args.resume
    if isinstance(resume, str) and not resume:
        raise TrainError("expected a checkpoint folder after --resume, got an empty string", key="--resume")
    if args.check:
        from te_align.train.preflight import check_run

        logging.basicConfig(level=logging.WARNING, format="te-align: %(message)s")
        notes = check_run(cfg, resume=resume, overwrite=args.overwrite)
        print(f"{args.config}: ok (model {cfg.model.path}, {', '.join(notes)}, data {cfg.data.path})")
        return 0
    if args.estimate:
        from te_align.train.estimate import estimate, refusal, report

        est = estimate(cfg, available=int(args.memory * 2**30) if args.memory else None)
        print(report(est, cfg))
        if not est.fits:
            import sys

            print(f"te-align: {refusal(est)}", file=sys.stderr)
            return 1
        return 0
    logging.basicConfig(level=logging.INFO, format="te-align: %(message)s")
    from te_align.train.loop import train

    result = train(cfg, resume=resume, overwrite=args.overwrite)
    if result.lora_path is not None:
        print(f"LoRA: {result.lora_path}")
    if result.kohya_path is not None:
        print(f"kohya/ComfyUI: {result.kohya_path}")
    print(f"{result.steps} steps, profile {result.profile_name} ({result.fingerprint}), output {result.output_dir}")
    return 0
