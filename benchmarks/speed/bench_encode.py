"""``te_align.encode`` next to the official pipeline's ``encode_prompt``, and a cache hit next to a fresh encode.

Side by side in one run, on the same tiny random-weight encoders (te_align.tiny) and the same prompt
batch, interleaved so machine noise hits both sides alike. Prints the median time of each side and
the ratio ``pipeline / te_align`` (>= 1.0 means te-align is no slower), then ``fresh / cache hit``.

Run from the repository root: ``python benchmarks/speed/bench_encode.py [--repeats N] [--families sd35-large,flux-dev]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CALLS = {
    "sd15": ("sd15", lambda pipe, x, p: pipe.encode_prompt(x, "cpu", 1, False)),
    "sdxl": ("sdxl", lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", do_classifier_free_guidance=False)),
    "sd35-large": ("sd3", lambda pipe, x, p: pipe.encode_prompt(
        prompt=x, prompt_2=None, prompt_3=None, device="cpu", do_classifier_free_guidance=False,
        max_sequence_length=p.slot("t5").tokenizer.max_length)),
    "flux-dev": ("flux", lambda pipe, x, p: pipe.encode_prompt(
        prompt=x, prompt_2=None, device="cpu", max_sequence_length=p.slot("t5").tokenizer.max_length)),
    "chroma": ("chroma", lambda pipe, x, p: pipe.encode_prompt(
        x, device="cpu", do_classifier_free_guidance=False, max_sequence_length=p.slot("t5").tokenizer.max_length)),
    "qwen-image": ("qwen-image", lambda pipe, x, p: pipe.encode_prompt(x, device="cpu", max_sequence_length=512)),
}  # fmt: skip

PROMPTS = [
    "a photo of a cat sitting on a windowsill, golden hour, 35mm",
    "wow!!! a dog!",
    "(masterpiece:1.2), 1girl, solo, looking at viewer, city street at night, neon lights, rain",
    "",
    "café 東京 🐱 " * 6,
    "a very long prompt " * 30,
    "sketch",
    "an oil painting of a lighthouse in a storm, dramatic lighting",
]


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--families", default=",".join(CALLS))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    import te_align
    from te_align.encoding.cache.keys import hash_text_encoders
    from te_align.encoding.cache.store import EmbeddingCache
    from te_align.tiny.fit import fit_profile
    from te_align.tiny.pipelines import build_pipeline_for_encoding

    torch.set_num_threads(args.threads)
    for name in ("diffusers", "transformers"):
        import logging

        logging.getLogger(name).setLevel(logging.ERROR)

    print(f"batch of {len(PROMPTS)} prompts, {args.repeats} interleaved repeats, {args.threads} thread(s)\n")
    print(f"{'profile':<12}{'pipeline ms':>12}{'te_align ms':>12}{'ratio':>8}   {'fresh ms':>9}{'hit ms':>9}{'ratio':>8}")
    for name in args.families.split(","):
        family, call = CALLS[name]
        pipe = build_pipeline_for_encoding(family)
        p = fit_profile(te_align.profile(name), pipe)
        encoders = {s.name: getattr(pipe, s.encoder_subfolder) for s in p.slots}
        with torch.no_grad():
            call(pipe, PROMPTS, p)  # warm-up both sides
            te_align.encode(p, PROMPTS, pipeline=pipe)
            ref, ours = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                call(pipe, PROMPTS, p)
                t1 = time.perf_counter()
                te_align.encode(p, PROMPTS, pipeline=pipe)
                t2 = time.perf_counter()
                ref.append(t1 - t0)
                ours.append(t2 - t1)
        def encode_fn(captions: list[str], p=p, pipe=pipe) -> te_align.encoding.Conditioning:
            return te_align.encode(p, captions, pipeline=pipe)

        with tempfile.TemporaryDirectory() as tmp:
            te_hash = hash_text_encoders(encoders, {s.name: getattr(pipe, s.tokenizer_subfolder) for s in p.slots})
            fresh, hit = [], []
            for i in range(args.repeats):
                cache = EmbeddingCache(Path(tmp) / str(i), p, te_hash)
                t0 = time.perf_counter()
                cache.get_or_encode(PROMPTS, encode_fn)
                t1 = time.perf_counter()
                cache.get_or_encode(PROMPTS, encode_fn)
                t2 = time.perf_counter()
                assert cache.stats.hits == len(PROMPTS), cache.stats
                fresh.append(t1 - t0)
                hit.append(t2 - t1)
        r, o, f, h = map(_median_ms, (ref, ours, fresh, hit))
        print(f"{name:<12}{r:>12.2f}{o:>12.2f}{r / o:>8.2f}   {f:>9.2f}{h:>9.2f}{f / h:>8.1f}")
    print("\nratio = pipeline / te_align (>= 1.0: te_align is no slower); cache ratio = fresh encode+store / hit")


if __name__ == "__main__":
    main()
