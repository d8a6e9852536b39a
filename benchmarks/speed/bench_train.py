"""``te_align.train`` next to a plain diffusers + peft LoRA loop, same model, batch and precision.

The baseline has the shape of diffusers' own LoRA example scripts (train_dreambooth_lora_sd3.py /
train_dreambooth_lora_flux.py): ``add_adapter(LoraConfig(...))``, AdamW on the LoRA parameters,
``accelerator.prepare``, latents and each image's caption embeddings computed once before the loop
(their ``--cache_latents`` and pre-computed prompt embeddings), logit-normal timesteps, rectified
flow target ``noise - latents``, ``accelerator.backward``, gradient clipping, optimizer and LR
scheduler steps. te-align runs the same model with its latent and text caches on.

Each side runs in its own fresh process (so peak memory is that side's alone: peak RSS on CPU,
``torch.cuda.max_memory_allocated`` on CUDA); the sides alternate ``--repeats`` times and the
median steps/s (after ``--warmup`` steps) and the median peak are printed side by side, with the
range over the runs. "Training working set" is the peak minus the memory in use once the model is
built and each side's code is imported, i.e. what training itself adds (on CPU the whole-process
peak RSS also counts Python modules: te-align's trainer code is about 1.3 MiB of it).

    python benchmarks/speed/bench_train.py                       # tiny SD3-shaped model on CPU
    python benchmarks/speed/bench_train.py --family flux
    python benchmarks/speed/bench_train.py --device cuda --size real-sd3 --precision bf16 --resolution 1024
    python benchmarks/speed/bench_train.py --device cuda --size real-flux --precision bf16 --resolution 1024

``real-sd3`` / ``real-flux`` build random-init transformers with the SD3.5-Large / FLUX.1-dev
shapes (text encoders and VAE stay tiny: their outputs are cached on both sides).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

REAL_SD3 = {"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 38, "attention_head_dim": 64,
            "num_attention_heads": 38, "joint_attention_dim": 4096, "caption_projection_dim": 2432,
            "pooled_projection_dim": 2048, "out_channels": 16, "pos_embed_max_size": 192, "qk_norm": "rms_norm"}  # fmt: skip
REAL_FLUX = {"patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
             "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True,
             "axes_dims_rope": (16, 56, 56)}  # fmt: skip


# --------------------------------------------------------------------------------------- model
def build(family: str, size: str, dtype: Any) -> tuple[Any, str, dict[str, Any]]:
    """(pipeline, profile name, profile overrides) with tiny text encoders/VAE and a tiny or real-size denoiser."""
    import diffusers
    import torch

    import te_align
    from te_align.tiny.fit import PROFILES, architecture_overrides
    from te_align.tiny.pipelines import build_pipeline, tiny_vae

    pipe = build_pipeline(family)
    profile = PROFILES[family]
    comps = pipe.components  # the pipeline's own tiny encoders: built once
    overrides = architecture_overrides(te_align.profile(profile), comps)
    if size.startswith("real"):
        torch.manual_seed(0)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            if family == "sd3":
                cfg = dict(REAL_SD3, joint_attention_dim=comps["text_encoder_3"].config.d_model,
                           pooled_projection_dim=comps["text_encoder"].config.projection_dim + comps["text_encoder_2"].config.projection_dim)  # fmt: skip
                pipe.transformer = diffusers.SD3Transformer2DModel(**cfg)
                pipe.vae = tiny_vae(latent_channels=16, flow=True)
            else:
                cfg = dict(REAL_FLUX, joint_attention_dim=comps["text_encoder_2"].config.d_model,
                           pooled_projection_dim=comps["text_encoder"].config.hidden_size)  # fmt: skip
                pipe.transformer = diffusers.FluxTransformer2DModel(**cfg)
                pipe.vae = tiny_vae(latent_channels=16, flow=True)
        pipe.register_modules(transformer=pipe.transformer.to(dtype), vae=pipe.vae)
    return pipe, profile, overrides


def dataset(folder: Path, n: int, resolution: int) -> Path:
    from te_align.tiny.datasets import make_squares_dataset

    return make_squares_dataset(folder, n=n, sizes=((resolution, resolution),))


def peak_memory(device: str) -> int:
    import torch

    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_memory(device: str) -> int:
    """Memory in use now: allocated GPU memory, or this process's resident set (Linux /proc)."""
    import torch

    if device == "cuda":
        return int(torch.cuda.memory_allocated())
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: no floor, the working figure is the whole peak
        return 0


# --------------------------------------------------------------------------------------- sides
def run_te_align(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import csv

    import torch

    import te_align.train.loop  # noqa: F401  (the trainer's own code is loaded before the floor is read)
    from te_align.train import config_from_dict, train

    dtype = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    pipe, profile, overrides = build(args.family, args.size, torch.float32 if args.size == "tiny" else dtype)
    data = dataset(work / "data", args.batch * 2, args.resolution)
    floor = current_memory(args.device)
    cfg = config_from_dict({
        "model": {"path": "in-memory", "profile": profile, "profile_overrides": overrides},
        "data": {"path": str(data), "resolution": args.resolution, "bucket_step": 16, "min_bucket": 16},
        "train": {"max_steps": args.steps, "batch_size": args.batch, "learning_rate": 1e-4, "checkpoint_every": 0,
                  "mixed_precision": args.precision, "seed": 0, "device": args.device,
                  "gradient_checkpointing": args.gradient_checkpointing},
        "lora": {"rank": args.rank, "alpha": float(args.rank)},
        "output": {"dir": str(work / "out"), "kohya": False},
        "logging": {"progress": False, "tensorboard": False, "loss_plot": False},
    })  # fmt: skip
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train(cfg, pipeline=pipe)
    with open(work / "out" / "logs" / "train_log.csv", newline="") as f:
        elapsed = [float(r["elapsed_s"]) for r in csv.DictReader(f)]
    w = args.warmup
    return {"steps_per_s": (len(elapsed) - w) / (elapsed[-1] - elapsed[w - 1]), "peak": peak_memory(args.device), "floor": floor}


def run_baseline(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A LoRA loop of the shape of diffusers' example scripts (written here, not copied)."""
    import torch
    from accelerate import Accelerator
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3
    from peft import LoraConfig

    import te_align
    from te_align.train.data import Item, load_pixels
    from te_align.train.models import FLUX_TARGETS, SD3_TARGETS, image_ids, pack_latents, unpack_latents

    dtype = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    pipe, profile, overrides = build(args.family, args.size, torch.float32 if args.size == "tiny" else dtype)
    prof = te_align.profile(profile, **overrides)
    data = dataset(work / "data", args.batch * 2, args.resolution)
    floor = current_memory(args.device)
    accelerator = Accelerator(mixed_precision=args.precision, cpu=args.device == "cpu")
    torch.manual_seed(0)
    transformer, vae = pipe.transformer, pipe.vae
    for m in (transformer, vae, *(getattr(pipe, s.encoder_subfolder) for s in prof.slots)):
        m.requires_grad_(False)
        m.to(accelerator.device)
    targets = SD3_TARGETS if args.family == "sd3" else FLUX_TARGETS
    transformer.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank, init_lora_weights="gaussian", target_modules=targets))
    params = [p for p in transformer.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    if args.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
    lr_scheduler = get_scheduler("constant", optimizer=optimizer, num_warmup_steps=0, num_training_steps=args.steps)
    transformer, optimizer, lr_scheduler = accelerator.prepare(transformer, optimizer, lr_scheduler)

    # cached latents and prompt embeddings, as the scripts' --cache_latents / precomputed embeddings
    dists, captions = [], []
    for f in sorted(data.glob("*.png")):
        px, _ = load_pixels(Item(f, "", 1, (args.resolution,) * 2, (args.resolution,) * 2))
        with torch.no_grad():
            dists.append(vae.encode(px[None].to(accelerator.device, vae.dtype)).latent_dist)
        captions.append(f.with_suffix(".txt").read_text(encoding="utf-8"))
    # each image's own caption, encoded once (what te-align's text cache holds), picked per step
    with torch.no_grad():
        conds = te_align.encode(prof, captions, pipeline=pipe, device=accelerator.device)
    shift = getattr(vae.config, "shift_factor", None) or 0.0
    scale = vae.config.scaling_factor
    weight_dtype = dtype
    times = []
    transformer.train()
    for step in range(args.steps):
        t0 = time.perf_counter()
        rows = [(step * args.batch + i) % len(dists) for i in range(args.batch)]
        x = torch.cat([dists[r].sample() for r in rows])
        cond = {k: conds[k] if k == "text_ids" else conds[k][rows] for k in ("prompt_embeds", "pooled_prompt_embeds", "text_ids")
                if k in conds}  # fmt: skip
        x = ((x - shift) * scale).to(weight_dtype)
        noise = torch.randn_like(x)
        u = compute_density_for_timestep_sampling(weighting_scheme="logit_normal", batch_size=args.batch, logit_mean=0.0, logit_std=1.0)
        sigmas = u.to(accelerator.device, dtype=x.dtype).view(-1, 1, 1, 1)
        noisy = (1.0 - sigmas) * x + sigmas * noise
        with accelerator.autocast():
            if args.family == "sd3":
                pred = transformer(hidden_states=noisy, timestep=sigmas.flatten() * 1000,
                                   encoder_hidden_states=cond["prompt_embeds"].to(weight_dtype),
                                   pooled_projections=cond["pooled_prompt_embeds"].to(weight_dtype), return_dict=False)[0]  # fmt: skip
            else:
                h, w = x.shape[-2:]
                pred = transformer(hidden_states=pack_latents(noisy), timestep=sigmas.flatten(),
                                   guidance=torch.ones(args.batch, device=x.device, dtype=x.dtype),
                                   pooled_projections=cond["pooled_prompt_embeds"].to(weight_dtype),
                                   encoder_hidden_states=cond["prompt_embeds"].to(weight_dtype), txt_ids=cond["text_ids"],
                                   img_ids=image_ids(h, w, x.device, x.dtype), return_dict=False)[0]  # fmt: skip
                pred = unpack_latents(pred, h, w)
        weighting = compute_loss_weighting_for_sd3(weighting_scheme="none", sigmas=sigmas)
        loss = torch.mean((weighting.float() * (pred.float() - (noise - x).float()) ** 2).reshape(args.batch, -1), 1).mean()
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(params, 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        if not math.isfinite(loss.item()):
            raise SystemExit("baseline loss is not finite")
        times.append(time.perf_counter() - t0)
    w = args.warmup
    return {"steps_per_s": len(times[w:]) / sum(times[w:]), "peak": peak_memory(args.device), "floor": floor}


# ---------------------------------------------------------------------------------------- main
def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        fn = run_te_align if args.side == "te_align" else run_baseline
        print("RESULT " + json.dumps(fn(args, Path(tmp))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("sd3", "flux"), default="sd3")
    ap.add_argument("--size", choices=("tiny", "real-sd3", "real-flux"), default="tiny")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--precision", choices=("no", "bf16", "fp16"), default="no")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--resolution", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--side", choices=("te_align", "baseline"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.size != "tiny":
        args.family = args.size.split("-", 1)[1]
    if args.side:
        child(args)
        return
    passthrough = [a for a in sys.argv[1:]]
    results: dict[str, list[dict[str, Any]]] = {"baseline": [], "te_align": []}
    # a fixed glibc mmap threshold (setting it turns off glibc's dynamic one) on both sides: otherwise whether a
    # freed block goes back to the OS depends on allocation history and peak RSS jumps by several MiB
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT), MALLOC_MMAP_THRESHOLD_="131072")
    for _ in range(args.repeats):
        for side in ("baseline", "te_align"):
            out = subprocess.run([sys.executable, __file__, *passthrough, "--side", side], capture_output=True, text=True, env=env)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if out.returncode != 0 or line is None:
                sys.exit(f"{side} failed:\n{out.stderr[-3000:]}")
            results[side].append(json.loads(line[7:]))
    print(f"bench_train: {args.size} {args.family}, device {args.device}, precision {args.precision}, batch {args.batch}, "
          f"{args.resolution}px, rank {args.rank}, {args.steps} steps ({args.warmup} warm-up), {args.repeats} runs per side, "
          f"{args.threads} thread(s)")  # fmt: skip
    rows = {}
    mem = "GPU" if args.device == "cuda" else "RSS"
    for side, runs in results.items():
        sps = sorted(r["steps_per_s"] for r in runs)
        peaks = sorted(r["peak"] for r in runs)
        work = sorted(r["peak"] - r["floor"] for r in runs)
        rows[side] = (statistics.median(sps), statistics.median(peaks), statistics.median(work))
        print(f"  {side:<9} {rows[side][0]:9.2f} steps/s  {rows[side][0] * args.batch:9.2f} samples/s  peak {mem} "
              f"{rows[side][1] / 2**20:8.1f} MiB  training working set {rows[side][2] / 2**20:7.1f} MiB   "
              f"(runs: steps/s {sps[0]:.2f}..{sps[-1]:.2f}, peak {peaks[0] / 2**20:.1f}..{peaks[-1] / 2**20:.1f} MiB, "
              f"working {work[0] / 2**20:.1f}..{work[-1] / 2**20:.1f} MiB)")  # fmt: skip
    (b_sps, b_peak, b_work), (t_sps, t_peak, t_work) = rows["baseline"], rows["te_align"]
    print(f"  medians: speed te_align / baseline = {t_sps / b_sps:.3f} (>= 1.0: no slower);  peak {mem} te_align / baseline = "
          f"{t_peak / b_peak:.3f};  training working set te_align / baseline = {t_work / max(b_work, 1):.3f} (<= 1.0: no more)")  # fmt: skip

if __name__ == "__main__":
    main()
