"""Peak memory and speed of ``te-align train`` at a size where the text encoders dominate, side by side in one run:
text encoders + VAE freed after caching vs kept, fp8 (and, on CUDA, int8 / nf4) base vs bf16, and the
``--estimate`` figure next to each measured peak.

The model is Flux-shaped (tiny CLIP and VAE from ``te_align.tiny``, a T5 encoder and a transformer of the
``--size`` below), saved once as a bf16 diffusers folder; every variant trains it from that folder in its
own fresh process, so each peak is that variant's alone. Peak memory: on CPU the process's peak resident
set (``VmHWM``: weights, activations, caches, and the runtime torch and the libraries take, which the
estimate also counts as the resident set after imports and the tokenizers); on CUDA ``torch.cuda.max_memory_allocated``.
Speed: steps/s after ``--warmup`` steps, from the run's own CSV log.

    python benchmarks/speed/bench_train_scale.py                         # medium size, CPU, bf16
    python benchmarks/speed/bench_train_scale.py --size tiny --steps 4
    python benchmarks/speed/bench_train_scale.py --device cuda --size large

Measured (CPU, 2 shared cores under other load, so steps/s is noisy; OMP_NUM_THREADS=1; est/peak is the
``--estimate`` peak over the measured ``VmHWM``):

    python benchmarks/speed/bench_train_scale.py --size medium --precision no --resolution 256 --steps 4 --warmup 1 \
        --only "encoders freed" "encoders kept"      (then --only "fp8 base, freed" in a second run)
    parameters: transformer 36,792,336, vae 43,619, text_encoder 1,609,216, text_encoder_2 206,079,488
    variant                   peak MiB  vs freed  estimate  est/peak
    encoders freed                1655     1.00x      1789      1.08
    encoders kept                 2231     1.35x      2395      1.07
    fp8 base, freed               1775     1.07x      1789      1.01
    (the estimate's largest phase for the freed runs is loading: the bf16 T5 converted to float32 beside
     its mapped file)

    the same with --glibc-heap --only "encoders freed" (glibc's dynamic mmap threshold, no steady_cpu_heap):
    encoders freed                2835               1789      0.63     (steps/s 0.05 vs 0.04 above: within this
                                                                         machine's noise)

    python benchmarks/speed/bench_train_scale.py --size tiny --steps 4 --resolution 64 --t5-length 64
    variant                   peak MiB  vs freed  estimate  est/peak
    encoders freed                 488     1.00x       464      0.95
    encoders kept                  490     1.00x       466      0.95
    fp8 base, freed                488     1.00x       463      0.95

The medium size in bf16 (the default ``--precision``) ran for minutes per step on this CPU and was not
measured here.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: T5 encoder and Flux transformer shapes per size (the CLIP encoder and the VAE stay tiny).
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {"t5": {}, "transformer": {}},
    "medium": {"t5": {"d_model": 1024, "d_ff": 2816, "d_kv": 64, "num_heads": 16, "num_layers": 16},
               "transformer": {"num_layers": 2, "num_single_layers": 4, "attention_head_dim": 64,
                               "num_attention_heads": 8, "axes_dims_rope": (16, 24, 24)}},
    "large": {"t5": {"d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24},
              "transformer": {"num_layers": 4, "num_single_layers": 8, "attention_head_dim": 128,
                              "num_attention_heads": 24, "axes_dims_rope": (16, 56, 56)}},
}  # fmt: skip


def build_folder(size: str, folder: Path) -> None:
    """Save the Flux-shaped pipeline of ``size`` in bf16 at ``folder``."""
    import diffusers
    import torch
    import transformers

    from te_align.tiny.pipelines import build_pipeline

    pipe = build_pipeline("flux")
    shape = SIZES[size]
    torch.manual_seed(0)
    if shape["t5"]:
        conf = pipe.text_encoder_2.config.to_dict()
        conf.update(shape["t5"])
        pipe.text_encoder_2 = transformers.T5EncoderModel(transformers.T5Config(**conf))
    if shape["transformer"]:
        conf = dict(pipe.transformer.config)
        conf = {k: v for k, v in conf.items() if not k.startswith("_")}
        conf.update(shape["transformer"], joint_attention_dim=pipe.text_encoder_2.config.d_model)
        pipe.transformer = diffusers.FluxTransformer2DModel(**conf)
    pipe.register_modules(transformer=pipe.transformer, text_encoder_2=pipe.text_encoder_2)
    pipe.to(torch.bfloat16)
    pipe.save_pretrained(str(folder), safe_serialization=True)


def make_config(folder: Path, data: Path, out: Path, args: argparse.Namespace, variant: dict[str, Any]) -> Any:
    # the profile fitted to the saved encoders, from their configs and tokenizers (no weights are loaded)
    import transformers

    import te_align
    from te_align.tiny.fit import PROFILES, architecture_overrides
    from te_align.train import config_from_dict

    comps = {"text_encoder": transformers.CLIPTextConfig.from_pretrained(str(folder / "text_encoder")),
             "text_encoder_2": transformers.T5Config.from_pretrained(str(folder / "text_encoder_2")),
             "tokenizer": transformers.AutoTokenizer.from_pretrained(str(folder / "tokenizer")),
             "tokenizer_2": transformers.AutoTokenizer.from_pretrained(str(folder / "tokenizer_2"))}  # fmt: skip

    class Wrap:  # architecture_overrides reads ``component.config``
        def __init__(self, c: Any) -> None:
            self.config = c

    overrides = architecture_overrides(te_align.profile(PROFILES["flux"]), {
        k: (Wrap(v) if k.startswith("text_encoder") else v) for k, v in comps.items()})  # fmt: skip
    overrides["slots.t5.tokenizer.max_length"] = args.t5_length
    raw: dict[str, Any] = {
        "model": {"path": str(folder), "profile": PROFILES["flux"], "profile_overrides": overrides},
        "data": {"path": str(data), "resolution": args.resolution, "bucket_step": 16, "min_bucket": 16,
                 "max_bucket": 4096, "latent_sample": "mean"},
        "train": {"max_steps": args.steps, "batch_size": args.batch, "learning_rate": 1e-4, "checkpoint_every": 0,
                  "mixed_precision": args.precision, "seed": 0, "device": args.device,
                  "gradient_checkpointing": args.gradient_checkpointing},
        "lora": {"rank": args.rank, "alpha": float(args.rank)},
        "output": {"dir": str(out), "kohya": False},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    }  # fmt: skip
    for key, value in variant.items():
        section, name = key.split(".")
        raw[section][name] = value
    return config_from_dict(raw)


def _peak_rss() -> int:
    """This process's peak resident set: ``VmHWM`` of its own address space. Not ``ru_maxrss``: that starts at
    the parent's resident set at the fork (Linux keeps the larger across ``exec``), and this benchmark's parent
    has just built the model."""
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One variant in this (fresh) process: the estimate, then the training; peak memory and steps/s."""
    import torch

    import te_align.train.loop  # noqa: F401  (imported before the estimate reads the runtime's resident set)
    from te_align.train import train
    from te_align.train.estimate import estimate

    args = argparse.Namespace(**spec["args"])
    if args.glibc_heap:  # glibc's dynamic mmap threshold, as without te_align.train.estimate.steady_cpu_heap
        import te_align.train.estimate as estimate_module

        estimate_module.steady_cpu_heap = lambda: False
    cfg = make_config(Path(spec["folder"]), Path(spec["data"]), Path(spec["out"]), args, spec["variant"])
    est = estimate(cfg, options=False)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train(cfg)
    with open(Path(spec["out"]) / "logs" / "train_log.csv", newline="") as f:
        elapsed = [float(r["elapsed_s"]) for r in csv.DictReader(f)]
    w = args.warmup
    if args.device == "cuda":
        peak = int(torch.cuda.max_memory_allocated())
    else:
        peak = _peak_rss()
    return {"peak": peak, "estimate": est.peak("device"), "steps_per_s": (len(elapsed) - w) / (elapsed[-1] - elapsed[w - 1]),
            "params": est.params}  # fmt: skip


VARIANTS: dict[str, dict[str, Any]] = {
    "encoders freed": {},
    "encoders kept": {"model.free_encoders": False},
    "fp8 base, freed": {"model.quantize": "fp8"},
    "int8 base, freed": {"model.quantize": "int8"},
    "nf4 base, freed": {"model.quantize": "nf4"},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=list(SIZES), default="medium")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["no", "bf16", "fp16"], default="bf16")
    ap.add_argument("--resolution", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--t5-length", type=int, default=64, help="T5 tokens per caption (the profile's 512 is slow on CPU)")
    ap.add_argument("--glibc-heap", action="store_true",
                    help="train with glibc's default (dynamic) mmap threshold instead of the trainer's fixed one")
    ap.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all that run on the device)")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))))
        return 0
    from te_align.tiny.datasets import make_squares_dataset

    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", "1")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_folder(args.size, work / "model")
        data = make_squares_dataset(work / "data", n=args.images, sizes=((args.resolution, args.resolution),))
        names = args.only or [n for n in VARIANTS if args.device == "cuda" or not n.startswith(("int8", "nf4"))]
        for i, name in enumerate(names):
            spec = {"args": {k: v for k, v in vars(args).items() if k not in ("child", "only", "json")}, "folder": str(work / "model"),
                    "data": str(data), "out": str(work / f"out{i}"), "variant": VARIANTS[name]}  # fmt: skip
            proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, env=env)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                results[name] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
            else:
                results[name] = json.loads(line[len("RESULT "):])
    base = results.get("encoders freed", {})
    print(f"te-align train, Flux-shaped {args.size} ({args.device}, {args.precision}, {args.resolution}px, batch {args.batch}, "
          f"rank {args.rank}, {args.steps} steps{', checkpointing' if args.gradient_checkpointing else ''}"
          f"{', glibc default heap' if args.glibc_heap else ''})")  # fmt: skip
    if "params" in base:
        print("parameters: " + ", ".join(f"{k} {v:,}" for k, v in base["params"].items()))
    print(f"{'variant':<24} {'peak MiB':>9} {'vs freed':>9} {'estimate':>9} {'est/peak':>9} {'steps/s':>8} {'speed vs freed':>15}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<24} {r['error']}")
            continue
        rel = r["peak"] / base["peak"] if "peak" in base else float("nan")
        speed = r["steps_per_s"] / base["steps_per_s"] if "steps_per_s" in base else float("nan")
        print(f"{name:<24} {r['peak'] / 2**20:>9.0f} {rel:>8.2f}x {r['estimate'] / 2**20:>9.0f} {r['estimate'] / r['peak']:>9.2f} "
              f"{r['steps_per_s']:>8.2f} {speed:>14.2f}x")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
