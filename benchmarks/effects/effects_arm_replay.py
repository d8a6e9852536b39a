"""Train one arm of an effects-matrix row for a few steps, at full size, and compare its training losses with the
committed per-seed result: an arm whose draws a trainer change keeps must reproduce them to the digit.

    python benchmarks/effects/effects_arm_replay.py ROW SEED ARM [--steps 3] [--results benchmarks/effects/results]

Used before a re-run that takes a row's arm B from its committed results (amendments 9 and 11 of
benchmarks/effects/bench_effects.md). The arm is trained exactly as the row's unit trains it (the row's world data for that
seed, its profile, its settings; single thread), in a scratch folder that is deleted afterwards. Prints each step's
loss beside the committed one (8 significant digits, as the results keep them) and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def replay(row: str, seed: int, arm: str, steps: int, results: Path) -> list[tuple[int, float, float]]:
    """(step, loss now, loss committed) for the first ``steps`` steps of ``arm`` of ``row`` at ``seed``."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TE_ALIGN_THREADS", "1")
    from te_align.ab import runner
    from te_align.ab.matrix import matrix_presets
    from te_align.ab.preset import train_config_dict
    from te_align.profiles.overrides import resolve
    from te_align.train import config_from_dict
    from te_align.train.loop import train

    p = next((x for x in matrix_presets() if x.name == row), None)
    if p is None or p.world is None:
        raise SystemExit(f"no world row {row!r}")
    committed = json.loads((results / row / f"seed-{seed}.json").read_text(encoding="utf-8"))
    want = {int(s): float(v) for s, v in committed["arms"][arm]["losses"][:steps]}
    with tempfile.TemporaryDirectory(prefix="arm-replay-") as tmp:
        root = Path(tmp)
        data_seed = seed if p.world.per_seed_data else p.world.data_seed
        data = runner._world_data(p, root / "data", lambda _: None, data_seed=data_seed)
        train_dir, _ = runner.split_data(data, root / "data", p.eval.holdout)
        if arm == "A" and p.baseline.kind == "positive" and not p.baseline.cut_before:
            train_dir = runner._arm_data(p, train_dir, root, seed)
        model = runner.resolve_model(f"world:{p.world.base}")
        base = resolve(p.profile, ("model.profile_overrides", runner._world_overrides(p, None, f"world:{p.world.base}") or None))
        prof = p.arm_profiles(base)[0 if arm == "A" else 1]
        prof_path = root / "profile.toml"
        prof_path.write_text(prof.to_toml(), encoding="utf-8")
        raw = train_config_dict(p, model=model, data=str(train_dir), out=str(root / "run"), profile=str(prof_path),
                                seed=seed, max_steps=steps, arm=arm)
        raw["output"]["dir"] = str(root / "run")
        got = {int(s): float(v) for s, v in train(config_from_dict(raw)).losses}
    return [(s, got.get(s, float("nan")), want[s]) for s in sorted(want)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("row")
    ap.add_argument("seed", type=int)
    ap.add_argument("arm", choices=("A", "B"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "effects" / "results")
    a = ap.parse_args(argv)
    rows = replay(a.row, a.seed, a.arm, a.steps, a.results)
    same = 0
    for step, now, then in rows:
        ok = f"{now:.8g}" == f"{then:.8g}"
        same += ok
        print(f"{a.row} seed {a.seed} arm {a.arm} step {step}: {now:.8g} (committed {then:.8g}){'' if ok else '  DIFFERS'}")
    print(f"{same} of {len(rows)} steps reproduce the committed loss")
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
