"""A diagnosis after the swap study, not part of its plan: is the unswapped baseline at lr 1e-4 losing its colours,
or is it over-guided at the study's fixed CFG 4?

The swap study (``benchmarks/swap/bench_swap.md``) samples every checkpoint at the base's guidance scale 4. Its unswapped
baseline, fine-tuned at 1e-4, falls from 0.91 to 0.34 exact over 1000 steps while its validation loss is lower than at
1e-3. This script trains that baseline cell again, exactly as the study does (plan settings, ``swap_study._load``,
``_train_config`` and ``Evaluator``), for the given seeds at both rates, and samples the study's 32 probe prompts with
the finished weights, and with the base's, at several guidance scales. Writes ``benchmarks/swap/cfg-check.json``::

    OMP_NUM_THREADS=1 python benchmarks/swap/swap_cfg_check.py --out swap-study [--seeds 0]

It decides nothing in the study: its verdicts stand as read by the plan's rules at CFG 4.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "swap"))

import swap_study  # noqa: E402

OUT = ROOT / "benchmarks" / "swap" / "cfg-check.json"
GUIDANCE = (1.0, 1.5, 2.0, 3.0, 4.0)


def check(out: Path, seeds: list[int]) -> dict[str, Any]:
    import torch

    from te_align.tiny import bases
    from te_align.train import train

    torch.set_num_threads(1)
    settings = swap_study.Settings()
    train_dir, val_dir = swap_study.prepare_data(settings, out)
    evaluator = swap_study.Evaluator(settings, val_dir)

    def sweep(pipe: Any, profile: Any) -> dict[str, dict[str, float]]:
        got = {}
        for g in GUIDANCE:
            evaluator.settings = replace(settings, guidance=g)
            metrics, _ = evaluator(pipe, profile)
            got[f"{g:g}"] = {k: round(metrics[k], 4) for k in ("exact", "colour", "shape", "position", "drawn")}
            print(f"  cfg {g:g}: " + ", ".join(f"{k} {v:.3f}" for k, v in got[f"{g:g}"].items()), flush=True)
        return got

    result: dict[str, Any] = {"plan": settings.hash(), "guidance": list(GUIDANCE), "probes": settings.probes, "runs": {}}
    for seed in seeds:
        for lr in sorted(settings.rates):
            cell = swap_study.Cell(f"baseline-{swap_study.rate_tag(lr)}", lr)
            pipe, profile, _ = swap_study._load(settings, cell, seed, train_dir)
            if "base" not in result:
                print("the base, untrained:", flush=True)
                result["base"] = sweep(pipe, profile)
            unit = out / "cfg-check" / cell.name / f"seed-{seed}"
            unit.mkdir(parents=True, exist_ok=True)
            profile_file = unit / "profile.toml"
            profile_file.write_text(profile.to_toml(), encoding="utf-8")
            cfg = swap_study._train_config(settings, cell, seed, unit, train_dir, out / "cache", profile_file,
                                           str(bases.materialize(settings.base)))  # fmt: skip
            t0 = time.perf_counter()
            train(cfg, pipeline=pipe, stop_after=settings.steps)
            print(f"{cell.name} seed {seed}: {settings.steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
            result["runs"][f"{cell.name}:{seed}"] = sweep(pipe, profile)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="swap-study", help="the swap study's working folder (data and caches are reused)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = check(Path(args.out).expanduser(), [int(s) for s in args.seeds.split(",") if s])
    OUT.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"written: {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
