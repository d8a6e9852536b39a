"""Chance-level readings of a world run's evaluations: the same samples read against other prompts' objects.

    OMP_NUM_THREADS=1 python benchmarks/world/bench_rescore.py RUN --step 2000 [--step 1000 ...]

Re-samples ``RUN/model-STEP`` exactly as ``tools/world_build.py base`` evaluated it (its config from
``RUN/log.jsonl``: the run's world, 32 prompts per caption style from dataset seed 20000, 16 steps, CFG 4, seed i
for prompt i; deterministic, so the images are the run's own) and scores the visible prompts twice: against their
own objects (must equal the logged evaluation) and against the objects of the prompt before them (the list
rolled by one). The second is what a model that ignores its text would read as: the chance level of that run's
samples, spurious objects and best-match pairing included (study amendment 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--step", type=int, action="append", required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import diffusers
    import torch
    from world_pretrain import build, recipe

    from te_align.tiny import world

    torch.set_num_threads(args.threads)
    diffusers.logging.set_verbosity_error()
    run = Path(args.run)
    rs = [json.loads(x) for x in (run / "log.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    config = [r for r in rs if r.get("phase") == "config"][-1]
    fields = {k: v for k, v in config.items() if k in recipe.PretrainConfig.__dataclass_fields__}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    cfg = recipe.PretrainConfig(**fields)
    prompts = build.evalset(cfg, 32)
    spec = recipe.FAMILIES[cfg.family]
    for step in args.step:
        logged = next(r for r in rs if r.get("phase") == "eval" and r.get("step") == step)
        pipe = getattr(diffusers, spec.pipeline).from_pretrained(str(run / f"model-{step}"))
        ev = recipe.evaluate_pipeline(pipe, prompts, steps=logged["sample_steps"], guidance=logged["guidance"])
        images = ev.pop("images")
        sel = [k for k, v in enumerate(recipe.visible(recipe.fitted_profile(cfg.family), prompts)) if v]
        own = world.evaluate([images[k] for k in sel], [prompts[k].scene for k in sel])
        rolled = world.evaluate([images[k] for k in sel], [prompts[sel[i - 1]].scene for i in range(len(sel))])
        same = all(abs(own[k] - logged["visible"][k]) < 1e-9 for k in ("colour", "shape", "position", "object_accuracy"))
        row = {"run": run.name, "step": step, "matches_log": same,
               **{f"own_{k}": round(own[k], 4) for k in ("colour", "shape", "position", "object_accuracy")},
               **{f"rolled_{k}": round(rolled[k], 4) for k in ("colour", "shape", "position", "object_accuracy")}}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
