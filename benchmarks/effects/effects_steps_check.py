"""Sampler steps for the effects matrix, chosen by a check on the shipped bases (no LoRA), before any row runs.

For each base: 48 probe prompts in new wording (``te_align.tiny.world.phrasings``; known colours, every shape,
36 short, 6 long, 6 very long) sampled with the base's own settings (16 steps) and with fewer steps, conditioned
by the base's profile; each image read back by the world's reader. The rule, written into
``benchmarks/effects/bench_effects.md`` before this ran: the matrix samples with the fewest steps in (8, 12) whose
readings agree with the 16-step readings on at least 95% of the prompts (asked colour at the asked position)
on every base, and whose hit rate is within 3 points of the 16-step rate; otherwise 16.

    python benchmarks/effects/effects_steps_check.py [--out benchmarks/effects/steps_check.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/effects/steps_check.json")
    ap.add_argument("--bases", nargs="*", default=["sd3", "flux", "sd15"])
    args = ap.parse_args()

    import torch

    from te_align.ab.accuracy import read_probes, sample_prompts
    from te_align.profiles.overrides import resolve
    from te_align.tiny.bases import base_info, materialize
    from te_align.tiny.world import SHAPES
    from te_align.tiny.world.phrasings import probe_prompts

    torch.set_num_threads(1)
    prompts = probe_prompts(7, colour="*", shapes=SHAPES, lengths=[("short", 36), ("long", 6), ("very long", 6)],
                            stream="steps-check")  # fmt: skip
    result: dict = {"prompts": [p.to_dict() for p in prompts], "bases": {}}
    for name in args.bases:
        info = base_info(name)
        import diffusers

        # the official class (the shipped loader's call-defaults wrapper is not needed: every argument is given)
        pipe = getattr(diffusers, info["pipeline"]).from_pretrained(str(materialize(name)), dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        prof = resolve(info["profile"], ("base.json profile_overrides", info.get("profile_overrides") or None))
        s = info["sampling"]
        guidance = float(s.get("guidance_scale", s.get("true_cfg_scale", 4.0)))
        rows = {}
        for steps in (16, 12, 8):
            t0 = time.perf_counter()
            images = sample_prompts(pipe, prof, [p.text for p in prompts], steps=steps, guidance=guidance, size=int(s["width"]), seed=0)
            reads = read_probes(images, [p.objects for p in prompts], concept_colour="pink")
            rows[steps] = {"seconds": time.perf_counter() - t0, "hits": [r["hit"] for r in reads]}
        ref = rows[16]["hits"]
        for steps, r in rows.items():
            r["hit_rate"] = sum(r["hits"]) / len(r["hits"])
            r["agreement"] = sum(a == b for a, b in zip(r["hits"], ref, strict=True)) / len(ref)
            print(f"{name}: {steps:2d} steps: hit rate {r['hit_rate']:.3f}, agreement with 16 steps {r['agreement']:.3f}, {r['seconds']:.1f} s")
        result["bases"][name] = {str(k): v for k, v in rows.items()}
    ok = [st for st in (8, 12) if all(
        result["bases"][b][str(st)]["agreement"] >= 0.95
        and abs(result["bases"][b][str(st)]["hit_rate"] - result["bases"][b]["16"]["hit_rate"]) <= 0.03 for b in args.bases)]
    result["chosen_steps"] = min(ok) if ok else 16
    print(f"chosen: {result['chosen_steps']} steps")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
