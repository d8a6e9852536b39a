"""Ship a pretrained shapes-world base into the package (maintainers).

    PYTHONPATH=$PWD python tools/ship_base.py --name sd3 --model RUN/model-STEP --log RUN/log.jsonl [--eval-n 16]

Loads the pipeline folder written by ``benchmarks/bench_pretrain.py``, rounds it to float16 (what is shipped),
evaluates that rounded model on held-out prompts (the concept it never saw excluded; dataset seed 20000,
``--eval-n`` prompts per caption style, 16 Euler steps, CFG 4, sample seeds 0..N-1) and writes
``te_align/tiny/data/bases/<name>/`` with ``base.json``: the pretraining config and time from the log, the
evaluation, and every file's SHA-256. Numbers in the docs about a base come from its ``base.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True, choices=("sd3", "flux", "sdxl"))
    ap.add_argument("--model", required=True, help="pipeline folder (bench_pretrain.py model-STEP)")
    ap.add_argument("--log", required=True, help="the run's log.jsonl")
    ap.add_argument("--eval-n", type=int, default=16, help="held-out prompts per caption style")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dest", default=None, help="write here instead of the package (a dry run)")
    args = ap.parse_args()

    import sys

    import diffusers
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from world_pretrain import recipe as pretrain

    from te_align.tiny import bases

    torch.set_num_threads(args.threads)
    spec = bases.BASES[args.name]
    records = [json.loads(line) for line in Path(args.log).read_text(encoding="utf-8").splitlines() if line.strip()]
    config = next(r for r in records if r.get("phase") == "config")
    step = int(Path(args.model).name.rsplit("-", 1)[-1])
    train_seconds = next((r["train_seconds"] for r in records if r.get("phase") == "eval" and r.get("step") == step), None)
    pipe = getattr(diffusers, spec.pipeline).from_pretrained(args.model, torch_dtype=torch.float32)
    with torch.no_grad():
        for comp in pipe.components.values():
            if isinstance(comp, torch.nn.Module):
                for prm in comp.parameters():
                    prm.copy_(prm.half().float())
    cfg = pretrain.PretrainConfig(**{k: (tuple(v) if k == "vae_channels" else v) for k, v in config.items()
                                     if k in pretrain.PretrainConfig.__dataclass_fields__})  # fmt: skip
    evalset = [s for style in ("tags", "short", "long")
               for s in pretrain.heldout_set(args.eval_n, 20_000, style, cfg.concept())]  # fmt: skip
    t0 = time.perf_counter()
    ev = pretrain.evaluate_pipeline(pipe, evalset, steps=16, guidance=4.0)
    ev.pop("images")
    metrics = {"steps": step, "train_seconds": train_seconds, "threads": config.get("threads"),
               "eval": {"prompts": len(evalset), "dataset_seed": 20_000, "sample_steps": 16, "guidance": 4.0, **ev},
               "eval_seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    out = bases.ship(pipe, args.name, pretrain_config={k: v for k, v in config.items() if k not in ("time", "phase")},
                     metrics=metrics, dest=args.dest,
                     notes="pretrained by benchmarks/bench_pretrain.py; evaluated after float16 rounding by tools/ship_base.py")  # fmt: skip
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(json.dumps({"dest": str(out), "bytes": size, "object_accuracy": ev["all"]["object_accuracy"]}, indent=1))


if __name__ == "__main__":
    main()
