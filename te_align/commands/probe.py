"""``te-align probe`` (one trainer x profile, measured) and ``te-align matrix`` (every trainer found x family).

Exit codes of ``probe``: 0 identical, 1 the trainer's encoding differs from the profile, 2 bad input.
Torch and the trainers are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from te_align.trainers import specs

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path; load what only one command needs when it runs.


def register(sub: argparse._SubParsersAction) -> None:
    probed = [s for s in specs() if s.probe]
    where = "; ".join(f"{s.name}: {s.probe_help}" for s in probed)
    listed = ", ".join(s.name for s in probed[:-1]) + f" or {probed[-1].name}"
    found = ", ".join(f"${s.env_dir}" for s in probed if s.env_dir)
    p = sub.add_parser(
        "probe",
        help="run a trainer's real prompt encoding on tiny models and measure how it differs from the profile",
        description=f"Import the trainer's real encoding code ({where}), run it and "
                    "te_align.encode on the same tiny random-weight encoders over the standard prompt suite, and "
                    "report per output tensor: shapes, max abs difference, mean cosine similarity, prompts that "
                    "differ. Exit 0 identical, 1 differs, 2 bad input.",
    )
    p.add_argument("--trainer", required=True, metavar="T",
                   help=listed)
    p.add_argument("--path", metavar="INSTALL", help="the trainer's checkout or package folder (default: its environment variable, or the installed package)")
    p.add_argument("--profile", required=True, metavar="NAME", help="bundled profile name or alias")
    p.add_argument("--hooks", action="store_true", help="measure with te-align's hooks for the trainer installed")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.set_defaults(func=cmd_probe)

    m = sub.add_parser(
        "matrix",
        help="probe every trainer found x every family it supports, with and without te-align's hooks",
        description=f"Trainers: the checkouts named by {found}, and installed packages where a trainer has one. "
                    "Writes a markdown table (to --out atomically, else to stdout). Exit 0 with a table; 2 when "
                    "nothing is probed (no trainer found here, or none probes the --profile asked for), in one line "
                    "with nothing written.",
    )
    m.add_argument("--out", metavar="FILE", help="write the markdown table here (e.g. matrix.md)")
    m.add_argument("--profile", action="append", metavar="NAME", help="only these profiles (repeatable)")
    m.add_argument("--json", action="store_true", help="print the measurements as JSON")
    m.add_argument("--inference", action="store_true",
                   help="the inference matrix instead: diffusers pipelines, ComfyUI stock, ComfyUI + te-align node, "
                        "Forge (ComfyUI from $TE_ALIGN_COMFYUI_DIR, Forge from $TE_ALIGN_FORGE_DIR)")
    m.set_defaults(func=cmd_matrix)


def _fmt_shape(s: Iterable[int] | None) -> str:
    return "-" if s is None else str(tuple(s))


def cmd_probe(args: argparse.Namespace) -> int:
    from te_align.parts import probe

    r = probe(args.trainer, args.profile, args.path, hooks=args.hooks)
    code = 0 if r.aligned else 1
    if args.json:
        print(json.dumps(r.to_dict(), indent=2, ensure_ascii=False))
        return code
    print(f"te-align probe: {r.trainer} {r.version} ({r.location})")
    print(f"profile {r.profile}, {'with' if r.hooks else 'without'} te-align hooks; {len(r.prompts)} prompts "
          "(standard suite), tiny random-weight encoders, real-convention tokenizers")
    print()
    rows = [("tensor", "trainer shape", "profile shape", "max|Δ|", "mean cos", "differ")]
    for t in r.tensors:
        if t.trainer_shape is None:
            rows.append((t.name, "not produced", _fmt_shape(t.profile_shape), "-", "-", "-"))
            continue
        diff = "0" if t.identical else f"{t.max_abs_diff:.3g}" + ("*" if not t.shape_match else "")
        rows.append((t.name, _fmt_shape(t.trainer_shape), _fmt_shape(t.profile_shape), diff,
                     f"{t.mean_cosine:.4f}", f"{len(t.differing)}/{t.compared}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if any(t.trainer_shape is not None and not t.shape_match for t in r.tensors):
        print("* over the overlapping region (shapes differ)")
    order = list(r.prompts)  # a shared output (text_ids) is labelled by its group, not by prompt
    differing = sorted({label for t in r.tensors for label in t.differing if label in r.prompts}, key=order.index)
    if differing:
        print()
        print("prompts that differ:")
        for label in differing:
            text = r.prompts[label]
            shown = text if len(text) <= 60 else text[:57] + "..."
            print(f"  {label}: {json.dumps(shown, ensure_ascii=False)}")
    for n in r.notes:
        print(f"note: {n}")
    print()
    print("result: " + ("identical to the profile" if r.aligned else "DIFFERS from the profile"))
    return code


def cmd_matrix(args: argparse.Namespace) -> int:
    if getattr(args, "inference", False):
        from te_align.integrations.matrix import inference_matrix

        text = inference_matrix()
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
            print(f"te-align matrix --inference: written to {args.out}")
        else:
            print(text, end="")
        return 0
    from te_align._atomic import atomic_file
    from te_align.parts import find_trainers, run_matrix
    from te_align.probe import ProbeError

    found, absent = find_trainers()
    m = run_matrix(trainers=found, profiles=args.profile)
    m.absent[:0] = absent  # the trainers not found here, first, as run_matrix lists them when it looks itself
    if not m.rows:  # an empty table is no answer: say why in one line, write nothing
        if found:
            names = ", ".join(sorted({f.trainer for f in found}))
            why = f"no trainer found here ({names}) probes {'it' if len(args.profile or []) < 2 else 'them'}"
        else:
            envs = ", ".join(s.env_dir for s in specs() if s.probe and s.env_dir)
            why = f"no trainer found here; set {envs} to a checkout, or install a trainer's package"
        what = f" for {', '.join(args.profile)}" if args.profile else ""
        print(f"te-align: error: nothing to probe{what}: {why} (te-align matrix --help)", file=sys.stderr)
        return 2
    if args.out:
        with atomic_file(Path(args.out), "w", error=ProbeError) as fh:
            fh.write(m.markdown())
    if args.json:
        print(json.dumps(m.to_dict(), indent=2, ensure_ascii=False))
    elif args.out:
        print(f"te-align matrix: {len(m.rows)} rows written to {args.out}")
        for a in m.absent:
            print(f"  not probed: {a}")
    else:
        print(m.markdown(), end="")
    return 0
