"""``te-align swap BASE --encoder T5_FOLDER --out NEW_FOLDER [--reset MODE] [--stats MODE] [--shift]``:
replace a model's text encoder by a new one plus a trainable projection, scaled to the old statistics."""

from __future__ import annotations

import argparse

from te_align import _quiet
from te_align._lazy import lazy_module

# Lazy: te_align.swap imports torch (transformers, diffusers); kept off ``te-align --help``, the CLI's cold
# path, like what only this command needs.
_paths = lazy_module("te_align._paths")
_profile_overrides = lazy_module("te_align.profiles.overrides")
_swap = lazy_module("te_align.swap")
_study = lazy_module("te_align.swap.study")

#: Kept here (not imported from te_align.swap) so that ``te-align --help`` imports no torch.
RESET_CHOICES = ("none", "cross", "qk", "all")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "swap",
        help="replace a model's text encoder (e.g. SD1.5's CLIP by T5) plus a projection scaled to the old statistics",
        description="Write a new diffusers model folder whose text encoder is ENCODER followed by a trainable projection "
        "to the width the denoiser attends to. The projection's output scale (and with --shift, its shift) is set by "
        "measuring the base model's conditioning on the captions and matching it; both are printed. Denoiser layers "
        "are re-initialised as --reset says. The folder carries its own profile (te_align_profile.toml).",
    )
    p.add_argument("base", help="base model: a diffusers folder, hub id or single-file .safetensors checkpoint")
    p.add_argument("--encoder", required=True, help="the new text encoder: a transformers folder (config.json + weights)")
    p.add_argument("--tokenizer", default=None, help="its tokenizer folder (default: the encoder folder)")
    p.add_argument("--out", default=None, help="the new model folder (must not exist); not with --report")
    p.add_argument("--report", action="store_true",
                   help="write nothing: measure BASE's and ENCODER's statistics and print them beside what te-align's "
                   "swap study measured (which reset, scaling and rate recovered, with intervals)")
    p.add_argument("--profile", default="auto", help="the base model's profile: auto (read from BASE), a bundled name or a file")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="profile override for the base profile (repeatable), e.g. clip_l_hidden_size=32")
    p.add_argument("--config", default="", help="for a single-file BASE: the diffusers folder or hub id with its configs")
    p.add_argument("--reset", default="cross", help="denoiser layers re-initialised: " + ", ".join(RESET_CHOICES)
                   + " (default cross)")
    p.add_argument("--stats", default="global", help="match one mean/std over all values (global, default) or one per channel")
    p.add_argument("--shift", action="store_true", help="match the mean too (default: only the std)")
    p.add_argument("--captions", default=None, help="a text file with one caption per line to measure on (default: a built-in set)")
    p.add_argument("--max-length", type=int, default=None, help="token length of the new slot (default: the old slot's)")
    p.add_argument("--encoder-mask", action="store_true", help="pass the attention mask into the new encoder")
    p.add_argument("--projection", default=None, help="a .safetensors file with 'weight' (out, in) and 'bias' to start from")
    p.add_argument("--name", default=None, help="name of the new profile (default: BASEPROFILE-SLOT-swap)")
    p.add_argument("--seed", type=int, default=0, help="seed of the projection init and the reset layers (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_swap)


def _overrides(items: list[str]) -> dict[str, object]:
    return _profile_overrides.parse_set(items, origin="--override")


def _captions(path: str | None) -> list[str] | None:
    if path is None:
        return None
    raw = _paths.read_bytes(path, _swap.SwapError, what="captions file")
    try:
        lines = [x.strip() for x in raw.decode("utf-8-sig").splitlines()]
    except UnicodeDecodeError as e:
        raise _swap.SwapError(f"not UTF-8 text (byte {e.start})", file=path, key="--captions") from None
    lines = [x for x in lines if x]
    if not lines:
        raise _swap.SwapError("no captions (expected one caption per line)", file=path, key="--captions")
    return lines


def _fmt(stats: dict[str, object]) -> str:
    text = f"mean {stats['mean']:+.6f}  std {stats['std']:.6f}"
    if "std_min" in stats:
        text += f"  (per channel: std {stats['std_min']:.6f} .. {stats['std_max']:.6f})"
    return text


def cmd_swap(args: argparse.Namespace) -> int:
    import json
    import logging

    if args.report and args.out is not None:
        raise _swap.SwapError("--report writes nothing; leave out --out (or drop --report to write the folder)", key="--out")
    if not args.report and args.out is None:
        raise _swap.SwapError("give --out (the new model folder to write) or --report (measure and print only)", key="--out")
    _swap.check_request(args.reset, args.stats, args.out)
    captions = _captions(args.captions)
    # the report is the output: no loading bars, and no "Expected types for text_encoder" (the swap's own class);
    # TE_ALIGN_QUIET=0 shows both (te_align/_quiet.py), and each is back as it was once the swap is done
    diffusers_logger = logging.getLogger("diffusers")
    level = diffusers_logger.level
    if _quiet.quiet():
        diffusers_logger.setLevel(logging.ERROR)
    try:
        with _quiet.no_progress_bars():
            report, _ = _swap.swap(
                args.base, args.encoder, args.out, tokenizer=args.tokenizer, captions=captions,
                profile=args.profile, profile_overrides=_overrides(args.override), config=args.config,
                reset=args.reset, stats=args.stats, shift=args.shift, seed=args.seed, max_length=args.max_length,
                encoder_mask=args.encoder_mask, projection=args.projection, name=args.name,
            )
    finally:
        diffusers_logger.setLevel(level)
    data = report.as_dict()
    study = _study.summary() if args.report else None
    if args.json:
        if args.report:
            data = {"measured": data, "study": study}
        print(json.dumps(data, indent=1, sort_keys=True))
        return 0
    where = args.out if not args.report else f"{args.base} (nothing written)"
    print(f"{where}: {report.profile.name} (fingerprint {report.profile.fingerprint()})")
    print(f"  statistics ({report.target.mode}, {report.target.positions} positions of {report.target.captions} captions):")
    print(f"    base model          {_fmt(data['target'])}")
    print(f"    new, before scaling {_fmt(data['before'])}")
    print(f"    new, after scaling  {_fmt(data['after'])}")
    scale = data["scale"]
    print(f"  output scale {scale if isinstance(scale, list) else f'{scale:.6f}'}"
          + ("" if data["shift"] == 0.0 else f", shift {data['shift']}"))
    print(f"  reset {report.reset}: {len(report.reset_layers)} layers re-initialised (seed {report.seed})")
    if args.report:
        target = data["target"]["std"]
        print("\n".join(_study.report_lines(study, base_std=target if isinstance(target, float) else None)))
    return 0
