"""Learning rate per base for the effects matrix, fixed by a rule on the profile arm alone, before any row runs.

Pilot runs of the null rows (seed 0, profile conditioning in both arms) at the planned learning rate 1e-3 showed the
SD3- and Flux-shaped bases forgetting the colours they knew within 300 steps (known-colour readings 0-25%) and the
SD 1.5-shaped base barely learning pink. The rule, written into ``benchmarks/effects/bench_effects.md`` before this ran:
for each base, train the profile arm only (arm B of the base's null preset; pilot seed 100, not an analysis seed) at
learning rates 1e-4, 3e-4 and 1e-3, and take the highest at which the known colours are still read at >= 50% at the
300-step checkpoint (no catastrophic forgetting); if none qualifies, 1e-4. No arm A is trained, so no deviation's
effect is seen.

    python benchmarks/effects/effects_calibrate.py [--bases sd3 flux sd15 sdxl chroma] [--out benchmarks/effects/calibration.json]

The klein base (issue 49; once shipped), before any klein row runs, into a file of its own beside the others (as
calibration-sdxl.json and calibration-chroma.json; the default --out would be overwritten), its chosen rate then set in
every klein preset:

    python benchmarks/effects/effects_calibrate.py --bases klein --out FILE
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

#: the null row whose profile arm is trained; a base without a null row (sd15, sdxl, chroma) uses the SD3 null settings on itself
NULL = {"sd3": "world-sd3-null", "flux": "world-flux-null", "sd15": "world-sd3-null", "sdxl": "world-sd3-null",
        "chroma": "world-sd3-null", "klein": "world-klein-null"}
RATES = (1e-4, 3e-4, 1e-3)
PILOT_SEED = 100


def one(base: str, lr: float, out: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    from te_align.ab.preset import load_preset, train_config_dict
    from te_align.ab.runner import _Evaluator, _world_data, _world_overrides, resolve_model, split_data
    from te_align.profiles.overrides import resolve
    from te_align.train import config_from_dict
    from te_align.train.loop import train

    p = copy.deepcopy(load_preset(NULL[base]))
    assert p.world is not None
    if NULL[base] != f"world-{base}-null":  # no null row of its own: the SD3 null preset's settings on this base
        p.profile, p.world.base = base, base
    p.train["train"]["learning_rate"] = lr
    model = f"world:{base}"
    prof = resolve(p.profile, ("base", _world_overrides(p, None, model) or None))
    path = resolve_model(model)
    folder = out / f"{base}-{lr:g}"
    data = _world_data(p, folder / "data", print, data_seed=p.world.data_seed + PILOT_SEED)
    train_dir, val_dir = split_data(data, folder / "data", p.eval.holdout)
    (folder / "B.toml").write_text(prof.to_toml(), encoding="utf-8")
    t0 = time.perf_counter()
    cfg = config_from_dict(train_config_dict(p, model=path, data=str(train_dir), out=str(folder / "run"), profile=str(folder / "B.toml"),
                                             seed=PILOT_SEED))  # fmt: skip
    res = train(cfg)
    state = {"runs": {f"{PILOT_SEED}/B": {"seed": PILOT_SEED, "arm": "B", "dir": str(folder / "run"), "steps": res.steps}}, "divergence": []}
    ev = _Evaluator(p, model_path=path, prof_a=prof, prof_b=prof, train_dir=train_dir, out_dir=folder, max_steps=None, say=print)
    ev.run(state, [f"{PILOT_SEED}/B"], seed=PILOT_SEED, train_dir=train_dir, val_dir=val_dir, save=lambda: None)
    curve = state["runs"][f"{PILOT_SEED}/B"]["curve"]
    return {"base": base, "lr": lr, "seconds": time.perf_counter() - t0,
            "curve": [[s, {k: c[k] for k in ("hit", "false", "net", "known", "exact", "extra")}] for s, c in curve]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bases", nargs="*", default=["sd3", "flux", "sd15"])
    ap.add_argument("--out", default="benchmarks/effects/calibration.json")
    ap.add_argument("--work", default="te-align-calibration")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(b, lr) for b in args.bases for lr in RATES]
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = list(pool.map(one, [b for b, _ in jobs], [lr for _, lr in jobs], [Path(args.work)] * len(jobs)))
    chosen = {}
    for b in args.bases:
        ok = [r["lr"] for r in runs if r["base"] == b and r["curve"][-1][1]["known"] >= 0.5]
        chosen[b] = max(ok) if ok else min(RATES)
        for r in runs:
            if r["base"] == b:
                last = r["curve"][-1][1]
                print(f"{b} lr {r['lr']:g}: 300 steps hit {last['hit']:.2f} known {last['known']:.2f} false {last['false']:.2f}; "
                      f"curve net {sum(c['net'] for _, c in r['curve']) / len(r['curve']):+.3f} ({r['seconds']:.0f} s)")
        print(f"{b}: chosen learning rate {chosen[b]:g}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rule": "highest lr with known >= 0.5 at 300 steps", "pilot_seed": PILOT_SEED, "runs": runs,
                                          "chosen": chosen}, indent=1), encoding="utf-8")  # fmt: skip


if __name__ == "__main__":
    main()
