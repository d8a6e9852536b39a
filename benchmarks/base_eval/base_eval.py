"""Score the shipped world bases on prompts new in wording (the plan: benchmarks/base_eval/bench_base_eval.md).

    python benchmarks/base_eval/base_eval.py novelty               # the prompts against the training captions (no model)
    python benchmarks/base_eval/base_eval.py score [--only sd3]    # sample and read every prompt (resumable)
    python benchmarks/base_eval/base_eval.py table                 # the docs/world.md table from the committed results
    python benchmarks/base_eval/base_eval.py score --pipeline RUN/model-4000 --label sdxl-X1 --family sdxl [--call JSON]
                                                         # a candidate base (not shipped): base_eval/candidates/

``score`` writes one JSON line per prompt to ``benchmarks/base_eval/results/<base>.jsonl`` (prompt index, text,
style, what was asked, what the reader read) as it goes and skips the prompts already there, so an interrupted run
resumes. ``table`` and the summary (``benchmarks/base_eval/summary.json``) are computed from those lines only.
Every number in the docs about these prompts comes from here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from te_align.tiny.world import evalset  # noqa: E402

OUT = ROOT / "benchmarks" / "base_eval"
RESULTS = OUT / "results"
#: Fixed in the plan before any base was scored.
N_PER_STYLE = 200
SEED = 0
#: Chance of each reading for a prompt of the simple world without pink: 7 colours, 4 shapes, 9 positions.
CHANCE = {"colour": 1 / 7, "shape": 1 / 4, "position": 1 / 9, "exact_as_asked": 1 / (7 * 4 * 9)}
TARGETS = {"colour": 0.90, "position": 0.80}
#: The tests' fixed sample: the first prompts of each style (re-measured through the shipped pipeline).
TEST_SAMPLE = 4


def prompts(seed: int = SEED) -> list[evalset.EvalPrompt]:
    return evalset.eval_set(N_PER_STYLE, seed)


# ---------------------------------------------------------------------------------------------- novelty
def training_captions() -> dict[str, list[str]]:
    """The captions every shipped base's parts were trained on, regenerated from their recorded seeds and sizes:
    the denoisers' (20,000 scenes of the simple world, seed 0, pink never shown) and the text encoders' (24,000:
    12,000 of the full world and 12,000 of the simple one, seed 0, pink never shown)."""
    from te_align.tiny import bases, world

    pink = world.Concept("colour", "pink")
    out: dict[str, list[str]] = {}
    sizes = set()
    for name in bases.shipped():
        cfg = bases.base_info(name)["pretrain"]["config"]
        sizes.add((cfg["train_size"], cfg["seed"], cfg["world"], cfg["held_out"], cfg.get("style_mix")))
    for n, seed, space, held, mix in sorted(sizes, key=str):
        if held != "colour=pink":
            raise SystemExit(f"a shipped base holds out {held!r}; the plan assumes colour=pink")
        data = world.make_dataset(n, seed, image_size=None, tokenizer=False, split="base", concept=pink,
                                  space=world.SPACES[space], style_mix=mix)  # fmt: skip
        out[f"denoiser: {n} scenes of the {space} world, seed {seed}"] = [s.caption for s in data]
    enc = bases.base_info(bases.shipped()[0])["pretrain"]["encoders"]["config"]
    caps: list[str] = []
    per = [enc["captions"] // len(enc["worlds"]) + (k < enc["captions"] % len(enc["worlds"]))
           for k in range(len(enc["worlds"]))]  # fmt: skip
    for space, m in zip(enc["worlds"], per, strict=True):
        data = world.make_dataset(m, enc["seed"], space=world.SPACES[space], image_size=None, tokenizer=False,
                                  split="base", concept=pink)  # fmt: skip
        caps += [s.caption for s in data]
    out[f"text encoders: {enc['captions']} captions ({' + '.join(enc['worlds'])} worlds), seed {enc['seed']}"] = caps
    return out


def old_heldout() -> dict[str, list[tuple[str, tuple[tuple[str, str, str, str], ...]]]]:
    """The 192 prompts tools/ship_base.py scored the bases on (64 per style, dataset seed 20000, the simple world,
    pink never shown: its ``heldout_set``, regenerated here without images), as (caption, scene objects)."""
    from te_align.tiny import world

    pink = world.Concept("colour", "pink")
    out = {}
    for style in evalset.STYLES:
        data = world.make_dataset(64, 20_000, image_size=None, tokenizer=False, style_mix={style: 1.0},
                                  split="base", concept=pink, space=world.SIMPLE)  # fmt: skip
        out[style] = [(s.caption, tuple((o.colour, o.shape, o.position, o.size) for o in s.objects)) for s in data]
    return out


def novelty() -> dict[str, dict[str, object]]:
    """The new prompts against every training set (all counts 0 when new in wording), and, for comparison, how
    many of the old held-out prompts occur word for word in a training set and how many scenes they describe."""
    ps = prompts()
    sets = training_captions()
    out: dict[str, dict[str, object]] = {what: dict(evalset.novelty(ps, caps)) for what, caps in sets.items()}
    old = old_heldout()
    seen = {c for caps in sets.values() for c in caps}
    out["old held-out prompts (tools/ship_base.py)"] = {
        "prompts per style": 64,
        "occur word for word in a training set": {st: sum(c in seen for c, _ in rows) for st, rows in old.items()},
        "distinct scenes behind the 192 prompts": len({scene for rows in old.values() for _, scene in rows}),
        "the three styles describe the same scenes": len({tuple(sc for _, sc in rows) for rows in old.values()}) == 1,
    }
    return out


# ---------------------------------------------------------------------------------------------- scoring
def _read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _candidate(folder: Path, family: str, call: dict[str, object]) -> object:
    """A pipeline folder written by ``tools/world_build.py base`` (not shipped), called with its family's shipped
    sampling settings plus ``call``."""
    import diffusers

    sys.path.insert(0, str(ROOT / "tools"))
    from ship_base import SAMPLING

    pipe = diffusers.DiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    if family not in SAMPLING:
        raise SystemExit(f"base_eval.py score --family: expected one of {', '.join(SAMPLING)}, got {family!r}")
    settings = {**SAMPLING[family], **call}

    def run(text: str, **kwargs: object) -> object:
        # by keyword: Flux2KleinPipeline's first positional argument is `image`
        return pipe(prompt=text, **{**settings, **kwargs})

    return run


def _scores(name: str, seed: int, *, candidate: bool) -> Path:
    """Where :func:`score` writes ``name``'s lines: a shipped base's or a candidate's file for the plan's draw, and
    ``base_eval/diagnostic/NAME-seedS.jsonl`` for another draw."""
    if seed != SEED:
        return OUT / "diagnostic" / f"{name}-seed{seed}.jsonl"
    return OUT / "candidates" / f"{name}.jsonl" if candidate else RESULTS / f"{name}.jsonl"


def score(name: str, *, limit: int | None = None, folder: Path | None = None, family: str = "",
          call: dict[str, object] | None = None, seed: int = SEED, shard: tuple[int, int] = (0, 1)) -> None:  # fmt: skip
    """Score shipped base ``name``, or (``folder``) a candidate pipeline folder under the label ``name``.

    ``seed`` other than the plan's draws another prompt set of the same generator (a diagnosis: prompts that no
    decision was taken on); its lines go to ``base_eval/diagnostic/NAME-seedS.jsonl`` and no table reads them.
    ``shard`` (k, n): only the prompts whose index is k modulo n, so n processes score one set side by side (each
    appends whole lines; a resume skips what either wrote)."""
    import numpy as np
    import torch

    from te_align.tiny import world

    torch.set_num_threads(1)
    ps = prompts(seed)[:limit]
    path = _scores(name, seed, candidate=folder is not None)
    done = {r["i"] for r in _read(path)}
    todo = [(i, p) for i, p in enumerate(ps) if i not in done and i % shard[1] == shard[0]]
    print(f"{name}: {len(todo)} of {len(ps)} prompts to score", flush=True)
    if not todo:
        return
    pipe = world.base(name, cache_dir=OUT / ".cache") if folder is None else _candidate(folder, family, call or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with torch.no_grad(), path.open("a", encoding="utf-8") as f:
        for i, p in todo:
            t = time.perf_counter()
            out = pipe(p.text, generator=torch.Generator().manual_seed(i), output_type="np").images[0]
            image = np.clip(np.rint(out * 255), 0, 255).astype(np.uint8)
            read = [list(r) for r in world.read_image(image)]
            row = {"i": i, **p.to_dict(), "read": read, "seconds": round(time.perf_counter() - t, 3)}
            f.write(json.dumps(row) + "\n")
            f.flush()
    print(f"{name}: {len(todo)} prompts in {time.perf_counter() - t0:.0f} s", flush=True)


# ---------------------------------------------------------------------------------------------- summary
def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion k / n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


def row_scores(row: dict) -> dict[str, float]:
    from te_align.tiny.world import score_keys

    truth = [(row["colour"], row["shape"], row["position"])]
    s = score_keys(truth, [tuple(r) for r in row["read"]])
    return {"colour": s["colour"], "shape": s["shape"], "position": s["position"], "object_exact": s["exact"],
            "exact_as_asked": s["image_exact"], "spurious": s["extra"], "nothing_read": float(not row["read"])}  # fmt: skip


PROPORTIONS = ("colour", "position", "shape", "object_exact", "exact_as_asked", "nothing_read")


def summarise(rows: Sequence[dict]) -> dict[str, object]:
    scores = [row_scores(r) for r in rows]
    n = len(scores)
    out: dict[str, object] = {"prompts": n}
    for key in PROPORTIONS:
        k = int(sum(s[key] for s in scores))
        lo, hi = wilson(k, n)
        out[key] = {"k": k, "rate": k / n if n else math.nan, "ci95": [lo, hi]}
    sp = [s["spurious"] for s in scores]
    mean = statistics.fmean(sp) if sp else math.nan
    half = 1.96 * statistics.stdev(sp) / math.sqrt(n) if n > 1 else math.nan
    out["spurious_per_image"] = {"mean": mean, "ci95": [mean - half, mean + half]}
    return out


def meets(s: dict) -> bool:
    """Whether one draw's :func:`summarise` meets the plan's rules (as :func:`table`'s verdicts read them): every rate
    in :data:`TARGETS` reached, and shape's interval above :data:`CHANCE`."""
    return all(s[k]["rate"] >= t for k, t in TARGETS.items()) and s["shape"]["ci95"][0] > CHANCE["shape"]


def decide(label: str, seeds: Sequence[int]) -> int:
    """Print a candidate's colour / position / shape on each draw in ``seeds`` and the verdict: 0 when every draw is
    complete (``N_PER_STYLE`` x 3 prompts) and :func:`meets` the targets; 3 when a complete draw misses; else 1 (a draw
    is incomplete)."""
    states = []
    for seed in seeds:
        path = _scores(label, seed, candidate=True)
        rows = _read(path)
        s = summarise(rows)
        state = "incomplete" if len({r["i"] for r in rows}) != 3 * N_PER_STYLE else "meets" if meets(s) else "misses"
        parts = ", ".join(f"{k} {s[k]['k']}/{len(rows)} = {_pct(s[k])}" for k in ("colour", "position", "shape"))  # type: ignore[index]
        print(f"{label}, seed {seed} ({path.relative_to(OUT)}): {parts}: {state}")
        states.append(state)
    verdict = 3 if "misses" in states else 1 if "incomplete" in states else 0
    print(f"{label}: " + {0: "SHIPS (every draw meets the targets)", 3: "NOT SHIPPED (a draw misses the targets)",
                          1: "undecided (a draw is incomplete)"}[verdict])  # fmt: skip
    return verdict


def summary() -> dict[str, object]:
    from te_align.tiny import bases

    out: dict[str, object] = {"plan": "benchmarks/base_eval/bench_base_eval.md", "n_per_style": N_PER_STYLE, "seed": SEED,
                              "chance": CHANCE, "targets": TARGETS, "bases": {}}  # fmt: skip
    for name in bases.shipped():
        rows = _read(RESULTS / f"{name}.jsonl")
        if not rows:
            continue
        base = {"all": summarise(rows)}
        for style in evalset.STYLES:
            base[style] = summarise([r for r in rows if r["style"] == style])
        base["seconds_per_prompt"] = statistics.median(r["seconds"] for r in rows)
        base["before"] = bases.base_info(name)["metrics"]["heldout"]["visible"]
        out["bases"][name] = base  # type: ignore[index]
    candidates = {}
    for path in sorted((OUT / "candidates").glob("*.jsonl")):
        rows = _read(path)
        cand = {"all": summarise(rows), **{st: summarise([r for r in rows if r["style"] == st]) for st in evalset.STYLES}}
        candidates[path.stem] = cand
    if candidates:
        out["candidates"] = candidates
    # other prompt draws of the same generator (--seed N): diagnoses, and a fresh draw an amendment judges on
    draws = {path.stem: summarise(_read(path)) for path in sorted((OUT / "diagnostic").glob("*-seed*.jsonl"))}
    if draws:
        out["other_draws"] = draws
    return out


def _pct(d: dict) -> str:
    lo, hi = d["ci95"]
    return f"{d['rate']:.1%} [{lo:.1%}, {hi:.1%}]"


def table(s: dict) -> str:
    lines = [
        "| base | prompts | colour | position | shape (chance 25%) | exactly as asked | spurious / image | "
        "before: colour / position / shape / objects exact (190 visible, grammar wording) |",
        "| --- | ---: | --- | --- | --- | --- | ---: | --- |",
    ]
    every = {**s["bases"], **{f"{k} (candidate, not shipped)": v for k, v in s.get("candidates", {}).items()}}
    for name, b in every.items():
        a, before = b["all"], b.get("before")
        sp = a["spurious_per_image"]
        lines.append(
            f"| {name} | {a['prompts']} | {_pct(a['colour'])} | {_pct(a['position'])} | {_pct(a['shape'])} | "
            f"{_pct(a['exact_as_asked'])} | {sp['mean']:.2f} [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] | "
            + (f"{before['colour']:.1%} / {before['position']:.1%} / {before['shape']:.1%} / "
               f"{before['object_accuracy']:.1%} |" if before else "- |")
        )
    lines += ["", "By prompt style (colour / position / shape / exactly as asked):", "",
              "| base | " + " | ".join(evalset.STYLES) + " |", "| --- |" + " --- |" * len(evalset.STYLES)]  # fmt: skip
    for name, b in every.items():
        cells = [f"{b[st]['colour']['rate']:.0%} / {b[st]['position']['rate']:.0%} / {b[st]['shape']['rate']:.0%} / "
                 f"{b[st]['exact_as_asked']['rate']:.0%}" for st in evalset.STYLES]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Verdicts (the plan's rules):", ""]
    for name, b in every.items():
        a = b["all"]
        parts = []
        for key, target in TARGETS.items():
            rate, lo = a[key]["rate"], a[key]["ci95"][0]
            verdict = "met" if rate >= target else "NOT met"
            if rate >= target:
                verdict += " (interval clears it)" if lo >= target else " (interval does not clear it)"
            parts.append(f"{key} >= {target:.0%}: {verdict}")
        shape_lo = a["shape"]["ci95"][0]
        parts.append("shape above chance" if shape_lo > CHANCE["shape"] else "shape NOT above chance")
        lines.append(f"- **{name}**: " + "; ".join(parts) + ".")
    if s.get("other_draws"):
        lines += ["", "Other prompt draws of the same generator (`score --seed N`; no table above reads them):", "",
                  "| base, draw | prompts | colour | position | shape | exactly as asked |", "| --- | ---: | --- | --- | --- | --- |"]  # fmt: skip
        for name, a in s["other_draws"].items():
            lines.append(f"| {name} | {a['prompts']} | {_pct(a['colour'])} | {_pct(a['position'])} | "
                         f"{_pct(a['shape'])} | {_pct(a['exact_as_asked'])} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("novelty")
    sc = sub.add_parser("score")
    sc.add_argument("--only", action="append", default=None)
    sc.add_argument("--limit", type=int, default=None, help="score only the first N prompts (timing)")
    sc.add_argument("--shard", default="0/1", help="K/N: score only prompts K modulo N (N processes side by side)")
    sc.add_argument("--pipeline", type=Path, default=None,
                    help="a candidate base's pipeline folder (tools/world_build.py base); needs --label and --family")
    sc.add_argument("--label", default="", help="the candidate's name: results in base_eval/candidates/LABEL.jsonl")
    sc.add_argument("--family", default="", help="the candidate's family (its sampling settings: tools/ship_base.py)")
    sc.add_argument("--call", default="{}", help='JSON of extra call arguments, e.g. \'{"negative_prompt": ""}\'')
    sc.add_argument("--seed", type=int, default=SEED,
                    help="another prompt set of the same generator (diagnosis only: base_eval/diagnostic/)")
    sub.add_parser("table")
    de = sub.add_parser("decide", help="a candidate against the bases' targets on one or more prompt draws")
    de.add_argument("--label", required=True, help="the candidate's name (as scored: base_eval/candidates/LABEL.jsonl)")
    de.add_argument("--seeds", type=int, nargs="+", default=[SEED], help="the draws that must all meet the targets")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    shard = (0, 1)
    if args.cmd == "score":
        try:
            k, n = (int(x) for x in args.shard.split("/"))
        except ValueError:
            ap.error(f"--shard {args.shard!r}: expected K/N, e.g. 0/2")
        if not 0 <= k < n:
            ap.error(f"--shard {args.shard!r}: expected 0 <= K < N")
        shard = (k, n)
    if args.cmd == "novelty":
        result = novelty()
        print(json.dumps(result, indent=1))
        (OUT / "novelty.json").parent.mkdir(parents=True, exist_ok=True)
        (OUT / "novelty.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        new = [r for what, r in result.items() if not what.startswith("old")]
        return 0 if all(v == 0 for r in new for k, v in r.items() if k != "prompts") else 1
    if args.cmd == "score":
        from te_align.tiny import bases

        if args.pipeline is not None:
            if not (args.label and args.family):
                ap.error("--pipeline needs --label and --family")
            score(args.label, limit=args.limit, folder=args.pipeline, family=args.family, call=json.loads(args.call),
                  seed=args.seed, shard=shard)
            return 0
        for name in args.only or bases.shipped():
            score(name, limit=args.limit, seed=args.seed, shard=shard)
        return 0
    if args.cmd == "decide":
        return decide(args.label, args.seeds)
    s = summary()
    (OUT / "summary.json").write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    print(table(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
