"""``te-align ab run PRESET`` (A/B trainings: trainer default vs profile) and ``te-align demo``."""

from __future__ import annotations

import argparse

from te_align.errors import TeAlignError

# Function-local te_align imports in this module: load what only one command needs when it runs.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ab", help="A/B trainings: a trainer's default conditioning vs the profile, with a report")
    ab_sub = p.add_subparsers(dest="ab_command", metavar="SUBCOMMAND")
    run = ab_sub.add_parser("run", help="train both arms over N seeds, evaluate, write report.md / report.html")
    run.add_argument("preset", metavar="PRESET", help="bundled preset name (te-align ab list) or a preset .toml")
    run.add_argument("--model", default=None, metavar="PATH_OR_REPO", help="diffusers folder, hub id or .safetensors (default: the preset's)")
    run.add_argument("--data", default=None, metavar="DIR", help="images with .txt captions (train/ + val/ sub-folders, or a held-out split is made)")
    run.add_argument("--seeds", type=int, default=None, metavar="N", help="repeat both arms over N seeds (default: the preset's)")
    run.add_argument("--out", default="ab-out", metavar="DIR", help="output folder; an interrupted run resumes there (default: ab-out)")
    run.add_argument("--max-steps", type=int, default=None, help="override the preset's train.max_steps")
    run.set_defaults(func=cmd_run)
    mx = ab_sub.add_parser("matrix", help="A/B every known trainer deviation on the pretrained shapes-world bases; writes matrix.md")
    mx.add_argument("--out", default="te-align-matrix", metavar="DIR", help="output folder; resumes there (default: te-align-matrix)")
    mx.add_argument("--only", nargs="+", default=[], metavar="PRESET", help="run only these world presets (te-align ab list)")
    mx.add_argument("--seeds", type=int, default=None, metavar="N", help="seeds per deviation (default: the presets', 5)")
    mx.add_argument("--max-steps", type=int, default=None, help="override the presets' train.max_steps")
    mx.add_argument("--doc", default=None, metavar="FILE", help="also write the table to FILE (the committed evidence document)")
    mx.add_argument("--results", default=None, metavar="DIR", help="per-seed result files (default: OUT/results); resumes from them")
    mx.add_argument("--summary", default=None, metavar="FILE", help="also write the summary te-align check reads")
    mx.add_argument("--strips", default=None, metavar="DIR", help="also write each row's seed-0 sample strip (PNG) there")
    mx.add_argument("--workers", type=int, default=1, metavar="N", help="single-thread processes running units side by side (default 1)")
    mx.add_argument("--device", default="cpu", help="training device of every unit (cpu, cuda); recorded with each result")
    mx.add_argument("--dry-run", action="store_true", help="run nothing: rebuild the table from the result files")
    mx.set_defaults(func=cmd_matrix)
    ls = ab_sub.add_parser("list", help="bundled A/B presets and their baselines")
    ls.set_defaults(func=cmd_list)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])  # no subcommand: its list, exit 2 as `te-align` alone

    # the defaults as te_align.ab.demo has them (DEMO_STEPS, DEMO_SEEDS; a test keeps them equal): importing it
    # here would put the A/B machinery on the path of every --help
    d = sub.add_parser("demo", help="offline A/B on the shipped Flux-shaped world base: T5 at 512 tokens (as ai-toolkit "
                       "trains schnell) vs the schnell recipe's 256, with a report (CPU, minutes)",
                       description="One row of te-align's pre-registered effects matrix (world-flux-t5-512), live and "
                       "offline: a LoRA teaches the shipped Flux-shaped world base (a tiny FLUX.1-schnell-style model "
                       "pretrained on coloured shapes, pink never seen) the colour pink, per seed twice: arm A with T5 "
                       "at 512 tokens as ai-toolkit, diffusion-pipe and the diffusers Flux examples train schnell, arm "
                       "B by the schnell recipe (256). Both arms are sampled on probe prompts and scored by the world's "
                       "reader. Shows each phase with an ETA on stderr, then prints the verdict and the summary, and "
                       "writes OUT/ab/report.html.")
    d.add_argument("--out", default="te-align-demo", metavar="DIR", help="output folder (default: te-align-demo)")
    d.add_argument("--steps", type=int, default=None, help="training steps per arm (default: 100)")
    d.add_argument("--seeds", type=int, default=None, metavar="N", help="seeds per arm (default: 2)")
    d.set_defaults(func=cmd_demo)


def _quiet() -> None:
    """te-align's lines only: the libraries' info lines and progress bars off (not with ``TE_ALIGN_QUIET=0``)."""
    import logging
    import os

    from te_align import _quiet as quiet

    logging.basicConfig(level=logging.WARNING, format="te-align: %(message)s")
    if not quiet.quiet():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()


def _summary(result: object) -> None:
    from te_align.ab.report import fmt

    r = result  # ABResult
    print(f"\n{r.preset.name}: {r.seeds} seed(s), {r.seconds:.1f} s")  # type: ignore[attr-defined]
    for row in r.summary:  # type: ignore[attr-defined]
        print(f"  {row.metric}: A {fmt(row.a_mean)}  B {fmt(row.b_mean)}  A-B {fmt(row.diff_mean)} (sd {fmt(row.diff_sd)})")
    for d in r.divergence:  # type: ignore[attr-defined]
        print(f"  {d.tensor}: A {tuple(d.shape_a)} vs B {tuple(d.shape_b)}, max abs diff {fmt(d.max_abs_diff)}, cosine {fmt(d.cosine)}")
    print(f"report: {r.report_md}\n        {r.report_html}")  # type: ignore[attr-defined]


def _check_seeds(seeds: int | None) -> None:
    if seeds is not None and seeds < 1:  # 0 would fall back to the preset's count
        raise TeAlignError(f"must be >= 1, got {seeds}", key="--seeds")


def cmd_run(args: argparse.Namespace) -> int:
    _check_seeds(args.seeds)
    _quiet()
    from te_align.ab.runner import run_ab

    _summary(run_ab(args.preset, model=args.model, data=args.data, seeds=args.seeds, out=args.out, max_steps=args.max_steps))
    return 0


def _libraries_first() -> None:
    """A missing training library as the command's one error line (te_align.cli names the extra), before the first
    progress line: the libraries themselves load (seconds) while the progress shows it."""
    import importlib.util

    for name in ("diffusers", "transformers", "torch", "peft", "accelerate"):
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def cmd_matrix(args: argparse.Namespace) -> int:
    from te_align.ab.progress import Progress

    _libraries_first()
    with Progress("te-align ab matrix", stage="loading torch, diffusers and transformers") as progress:
        _quiet()
        from te_align.ab.matrix import run_matrix

        progress.stage("reading the plan and its results")
        rows = run_matrix(args.out, only=args.only, seeds=args.seeds, max_steps=args.max_steps, doc=args.doc,
                          results=args.results, summary=args.summary, strips=args.strips, workers=args.workers,
                          device=args.device, dry_run=args.dry_run, say=progress.say, progress=progress)  # fmt: skip
    print(f"\n{len(rows)} row(s); table: {args.out}/matrix.md")
    for r in rows:
        print(f"  {r.preset:34} {r.seeds}/{r.planned} seeds  {r.verdict}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from te_align.ab.preset import list_presets, load_preset

    lines = []  # every preset read before the first line is printed: one that cannot be read leaves no half list
    for name, path in list_presets().items():
        p = load_preset(path)
        lines.append(f"{name:34} profile {p.profile:13} vs {p.baseline.trainer}: {p.baseline.behaviour}")
    print("\n".join(lines))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    _check_seeds(args.seeds)
    from te_align.ab.progress import Progress
    from te_align.tiny.bases import data_root

    _libraries_first()
    data_root()  # the world package and its data, before the first progress line
    with Progress("te-align demo", stage="loading torch, diffusers and transformers") as progress:
        _quiet()
        from te_align.ab.demo import run_demo

        run_demo(args.out, steps=args.steps, seeds=args.seeds, say=progress.say, progress=progress)  # says its summary once
    return 0
