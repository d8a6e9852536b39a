"""``te-align check CONFIG --dataset`` over a large dataset: whole-process wall time.

Run: ``python benchmarks/speed/bench_dataset.py [--captions N] [--runs R]``. Writes N caption files (default 10,000; tag
captions of 5 to 120 words, seeded) beside an sd-scripts FLUX.1 config whose dataset_config names them, and a model
folder with te_align/tiny's real-convention CLIP (tokenizer/) and T5 (tokenizer_2/) tokenizers; then times the
real CLI, ``python -m te_align check CONFIG --dataset``, in a fresh interpreter (the caption files read, both slots
counted, the report printed) and prints the median of R runs, wall and CPU time (the CPU time shows the work where
other processes share the machine). Target: 10,000 captions in under 10 s.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORDS = ("1girl solo red circle blue square white background looking at viewer smile outdoors sky cloud tree "
         "grass sitting standing long hair short hair hat dress shirt holding flower detailed masterpiece").split()


def build(folder: Path, n: int) -> Path:
    sys.path.insert(0, str(ROOT))
    from te_align.tiny import tokenizers as tiny

    tiny.clip_tokenizer().save_pretrained(str(folder / "model" / "tokenizer"))
    tiny.t5_tokenizer().save_pretrained(str(folder / "model" / "tokenizer_2"))
    img = folder / "img"
    img.mkdir()
    rng = random.Random(0)
    for i in range(n):
        tags = [rng.choice(WORDS) for _ in range(rng.randint(5, 120))]
        (img / f"{i:06d}.txt").write_text(", ".join(tags), encoding="utf-8")
    (folder / "dataset.toml").write_text(f'[general]\ncaption_extension = ".txt"\n\n[[datasets]]\n\n'
                                         f'  [[datasets.subsets]]\n  image_dir = "{img.as_posix()}"\n', encoding="utf-8")
    cfg = folder / "flux.toml"
    cfg.write_text(f'pretrained_model_name_or_path = "{(folder / "model").as_posix()}"\nt5xxl = "t5.safetensors"\n'
                   f'ae = "ae.safetensors"\nt5xxl_max_token_length = 256\n'
                   f'dataset_config = "{(folder / "dataset.toml").as_posix()}"\n', encoding="utf-8")
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--captions", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = build(Path(tmp), args.captions)
        times, cpus = [], []
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "te_align", "check", str(cfg), "--dataset"],
                                 capture_output=True, text=True, env=env, cwd=tmp)
            times.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if out.returncode not in (0, 1):
                sys.exit(f"check failed ({out.returncode}): {out.stderr[-2000:]}")
        lines = out.stdout.splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.startswith("  dataset:"))
        print("\n".join(ln.replace(tmp, "TMP") for ln in lines[start:]))
        print(f"te-align check CONFIG --dataset, {args.captions} captions, 2 slots: median {statistics.median(times):.2f} s "
              f"over {args.runs} run(s) (min {min(times):.2f}, max {max(times):.2f}); CPU time (user + system, all "
              f"threads) median {statistics.median(cpus):.2f} s; {os.cpu_count()} CPU(s), load average "
              f"{os.getloadavg()[0]:.1f}; target < 10 s")


if __name__ == "__main__":
    main()
