"""The yardstick users know: diffusers' example LoRA scripts against ``te-align train``, same tiny model and work.

``examples/dreambooth/train_dreambooth_lora_sd3.py`` and ``train_dreambooth_lora_flux.py`` from a diffusers
checkout (``$TE_ALIGN_DIFFUSERS_EXAMPLES_DIR``: the checkout, its ``examples`` folder or ``examples/dreambooth``)
run as their users run them (``python SCRIPT --flags``: no accelerate config is needed for one CPU process), and
``te-align train CONFIG.toml`` (``python -m te_align train``) runs a config built to do the same work:

* the same saved diffusers folder (te_align.tiny's SD3- / Flux-shaped pipeline with real CLIP BPE tokenizers),
  the same images (``--images`` squares at ``--resolution``; the script's folder holds the images only, te-align's
  the same images with a caption file each, holding the script's ``--instance_prompt``);
* fp32 on CPU (``--mixed_precision no`` / ``mixed_precision = "no"``), batch, LoRA rank (alpha = rank) on the
  scripts' default target modules, AdamW with the scripts' defaults (lr 1e-4, betas 0.9/0.999, eps 1e-8,
  weight decay 1e-4, constant schedule, grad-norm clip 1.0), seed, steps, logit-normal timesteps (``--weighting_scheme
  logit_normal``; Flux's guidance input 1.0 on both sides);
* T5 length: the profile's (SD3.5: 256, ``--max_sequence_length 256``, which is what ``te-align check`` gives the
  SD3 script as its fix; FLUX.1-dev: 512, the script's default), CLIP at 77 on both sides;
* latents computed once before the loop and sampled from their distribution each step (``--cache_latents`` /
  ``cache_latents = true``, ``latent_sample = "sample"``), the caption encoded before the loop (the scripts'
  instance prompt / te-align's text cache), text encoders and VAE freed afterwards (te-align's ``free_encoders``;
  the SD3 script ``del``s them; the Flux script keeps its encoders and encodes the prompt again every step, as it
  does for its users: ``benchmarks/yardstick/bench_yardstick.md`` gives the lines);
* no validation, no intermediate checkpoints; loss logged every step to TensorBoard (the scripts' default
  ``--report_to tensorboard`` / ``logging.tensorboard = true``), a progress bar on both sides. What each side does
  after its last step is its own: the script saves the LoRA and then loads the whole pipeline again with the LoRA
  ("Final inference", which generates no image without ``--validation_prompt``); te-align saves the LoRA, its
  metadata and run record.

Each run is a fresh process (both sides under the same small wrapper, this file's ``--run``), with
``OMP_NUM_THREADS`` (default 1) for both. Measured per run: the whole process's wall and CPU time (user +
system, from the parent), the time to the end of the first optimizer step, steps/s and steps per CPU-second
over the steps after ``--warmup`` (from timestamps taken after every optimizer step by a global
``torch.optim`` step hook the wrapper registers, the same for both sides), and the peak resident set
``VmHWM`` of the child (``bench_train_scale._peak_rss``). The sides alternate (A, B, then B, A in the next
round, ...) for ``--rounds`` rounds and the medians are printed with the ratios te-align vs script (speed:
script time / te-align time; memory: te-align / script), and each run's figures.

The scripts import torchvision for their PIL transforms only. When ``import torchvision.transforms`` fails
(the torchvision wheel's compiled operators are built for one torch release), the script gets the stand-in
package ``benchmarks/yardstick/yardstick_torchvision`` (Resize, CenterCrop, RandomCrop, RandomHorizontalFlip,
ToTensor, Normalize, Compose, ``functional.crop``) through an ``__import__`` in its own globals
(:func:`script_import`): only the script's ``import torchvision`` statements see it, diffusers and
transformers still find no torchvision. The first output line says which was used. A script whose other
top-level imports are missing is skipped with one line naming them.

    TE_ALIGN_DIFFUSERS_EXAMPLES_DIR=path/to/diffusers python benchmarks/yardstick/bench_yardstick.py
    python benchmarks/yardstick/bench_yardstick.py --family sd3 --resolution 128 --steps 40 --rounds 3

Measured numbers and the command that made them: ``benchmarks/yardstick/bench_yardstick.md``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
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
HERE = Path(__file__).resolve().parent
ENV = "TE_ALIGN_DIFFUSERS_EXAMPLES_DIR"
STANDIN = HERE / "yardstick_torchvision"
SCRIPTS = {"sd3": "train_dreambooth_lora_sd3.py", "flux": "train_dreambooth_lora_flux.py"}
INSTANCE_PROMPT = "a photo of sks square"


# --------------------------------------------------------------------------------------- locating
def examples_dir(given: str | None) -> Path | None:
    """The ``examples/dreambooth`` folder from a diffusers checkout, its ``examples`` or that folder; else None."""
    if not given:
        return None
    p = Path(given).expanduser()
    for cand in (p / "examples" / "dreambooth", p / "dreambooth", p):
        if (cand / SCRIPTS["sd3"]).is_file():
            return cand.resolve()
    return None


def top_level_imports(script: Path) -> list[str]:
    """Top-level package names a script imports unconditionally (module-level ``import`` / ``from`` statements)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return list(dict.fromkeys(names))


def missing_imports(script: Path, standin: bool) -> list[str]:
    """The script's top-level imports this interpreter cannot find (torchvision counts as found with the stand-in)."""
    out = []
    for name in top_level_imports(script):
        if name == "torchvision" and standin:
            continue
        if name in sys.stdlib_module_names:
            continue
        if importlib.util.find_spec(name) is None:
            out.append(name)
    return out


def torchvision_loads(env: dict[str, str]) -> bool:
    """Whether ``import torchvision.transforms`` works in a fresh interpreter with ``env``."""
    proc = subprocess.run([sys.executable, "-c", "import torchvision.transforms, torchvision.transforms.functional"],
                          capture_output=True, text=True, env=env)  # fmt: skip
    return proc.returncode == 0


# --------------------------------------------------------------------------------------- the same work, twice
def script_argv(family: str, model: Path, images: Path, out: Path, args: argparse.Namespace) -> list[str]:
    """The example script's command line (after the script path)."""
    return [
        "--pretrained_model_name_or_path", str(model), "--instance_data_dir", str(images),
        "--instance_prompt", INSTANCE_PROMPT, "--output_dir", str(out), "--resolution", str(args.resolution),
        "--train_batch_size", str(args.batch), "--rank", str(args.rank), "--max_train_steps", str(args.steps),
        "--learning_rate", "1e-4", "--lr_scheduler", "constant", "--optimizer", "AdamW", "--mixed_precision", "no",
        "--max_sequence_length", str(t5_length(family)), "--weighting_scheme", "logit_normal", "--cache_latents",
        "--checkpointing_steps", str(args.steps + 1), "--seed", "0", "--report_to", "tensorboard",
        *(["--guidance_scale", "1.0", "--lora_alpha", str(args.rank)] if family == "flux" else []),
    ]  # fmt: skip


def t5_length(family: str) -> int:
    """T5 tokens per caption of the profile te-align trains the family with (SD3.5: 256, FLUX.1-dev: 512)."""
    import te_align
    from te_align.tiny.fit import PROFILES

    return next(s.tokenizer.max_length for s in te_align.profile(PROFILES[family]).slots if s.name == "t5")


def te_align_config(family: str, model: Path, data: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The ``te-align train`` config (as a mapping; :func:`toml_text` writes it) doing the script's work."""
    from te_align.tiny.fit import PROFILES, profile_overrides

    return {
        "model": {"path": str(model), "profile": PROFILES[family], "profile_overrides": profile_overrides(family),
                  "dtype": "float32", "quantize": "none", "free_encoders": True},
        "data": {"path": str(data), "resolution": args.resolution, "enable_bucketing": False, "cache_latents": True,
                 "latent_sample": "sample", "cache_text": True, "random_flip": False},
        "lora": {"rank": args.rank, "alpha": float(args.rank)},
        "train": {"seed": 0, "batch_size": args.batch, "max_steps": args.steps, "learning_rate": 1e-4,
                  "lr_scheduler": "constant", "optimizer": "adamw", "adam_beta1": 0.9, "adam_beta2": 0.999,
                  "adam_epsilon": 1e-8, "weight_decay": 1e-4, "max_grad_norm": 1.0, "mixed_precision": "no",
                  "gradient_checkpointing": False, "checkpoint_every": 0, "guidance": 1.0, "device": "cpu"},
        "output": {"dir": str(out), "kohya": False},
        "logging": {"every": 1, "progress": True, "tensorboard": True, "loss_plot": False},
    }  # fmt: skip


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def toml_text(raw: dict[str, Any]) -> str:
    """TOML for a two-level config mapping (tables of scalars, lists, and one nested table level)."""
    lines: list[str] = []
    for section, table in raw.items():
        nested = {k: v for k, v in table.items() if isinstance(v, dict)}
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
        for name, sub in nested.items():
            lines.append(f"[{section}.{name}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in sub.items()]
        lines.append("")
    return "\n".join(lines)


def make_data(work: Path, n: int, resolution: int) -> tuple[Path, Path]:
    """(the script's image-only folder, te-align's folder of the same images with the instance prompt as caption)."""
    import shutil

    from te_align.tiny.datasets import make_squares_dataset

    te = make_squares_dataset(work / "data_te_align", n=n, sizes=((resolution, resolution),))
    script = work / "data_script"
    script.mkdir()
    for png in sorted(te.glob("*.png")):
        shutil.copyfile(png, script / png.name)
        png.with_suffix(".txt").write_text(INSTANCE_PROMPT, encoding="utf-8")
    return script, te


# --------------------------------------------------------------------------------------- one run (child)
def script_import(standin: str) -> Any:
    """An ``__import__`` that answers ``torchvision`` / ``torchvision.*`` with the package ``standin`` (importable
    by that name) and every other import as usual; put into a script's globals, it affects that script only."""
    import builtins
    import importlib

    real_import = builtins.__import__

    def _import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level != 0 or name.split(".", 1)[0] != "torchvision":
            return real_import(name, globals, locals, fromlist, level)
        leaf = importlib.import_module(standin + name[len("torchvision"):])
        if not fromlist:
            return importlib.import_module(standin)
        for item in fromlist:
            if not hasattr(leaf, item):
                importlib.import_module(f"{leaf.__name__}.{item}")
        return leaf

    return _import


def run_child(spec: dict[str, Any]) -> int:
    """Run the example script or ``te-align`` in this process; write peak RSS and step times to ``spec['result']``."""
    import builtins
    import runpy

    sys.path.insert(0, str(ROOT / "benchmarks" / "speed"))  # bench_train_scale: a sibling study's folder
    from bench_train_scale import _peak_rss
    from torch.optim.optimizer import register_optimizer_step_post_hook

    stamps: list[float] = []
    cpu: list[float] = []

    def stamp(*_: Any) -> None:
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())

    register_optimizer_step_post_hook(stamp)
    start = time.perf_counter()
    code, error = 0, ""
    try:
        if spec["side"] == "script":
            sys.argv = [spec["script"], *spec["argv"]]
            sys.path.insert(0, str(Path(spec["script"]).parent))
            own: dict[str, Any] = {}
            if spec.get("standin"):
                own["__builtins__"] = dict(vars(builtins), __import__=script_import(STANDIN.name))
            runpy.run_path(spec["script"], init_globals=own, run_name="__main__")
        else:
            sys.argv = ["te-align", *spec["argv"]]
            runpy.run_module("te_align", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        error = "" if code == 0 else str(e.code)
    except BaseException as e:  # the result file says what failed; the parent prints one line
        code, error = 1, f"{type(e).__name__}: {e}".splitlines()[0]
    result = {"peak": _peak_rss(), "stamps": [s - start for s in stamps], "cpu": cpu, "code": code, "error": error}
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return code


# --------------------------------------------------------------------------------------- parent
def steps_per_s(stamps: list[float], warmup: int) -> float:
    """Optimizer steps per second over the steps after the first ``warmup`` ones."""
    n = len(stamps)
    if n <= warmup or warmup < 1:
        return float("nan")
    return (n - warmup) / (stamps[-1] - stamps[warmup - 1])


def launch(side: str, family: str, work: Path, run_id: str, spec_extra: dict[str, Any], env: dict[str, str],
           args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    out = work / f"out_{run_id}"
    result = work / f"result_{run_id}.json"
    spec = {"side": side, "result": str(result), **spec_extra}
    if side == "script":
        spec["argv"] = script_argv(family, work / family, work / "data_script", out, args)
    else:
        cfg = work / f"config_{run_id}.toml"
        cfg.write_text(toml_text(te_align_config(family, work / family, work / "data_te_align", out, args)), encoding="utf-8")
        spec["argv"] = ["train", str(cfg)]
    log = work / f"log_{run_id}.txt"
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run", json.dumps(spec)],
                              stdout=f, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    if not result.is_file():
        tail = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
        return {"error": f"exit {proc.returncode}: {tail[-1] if tail else 'no output'}"}
    r = json.loads(result.read_text(encoding="utf-8"))
    if r["code"] != 0 or len(r["stamps"]) != args.steps:
        tail = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
        why = r["error"] or (tail[-1] if tail else "")
        return {"error": f"exit {r['code']}, {len(r['stamps'])}/{args.steps} steps: {why}"}
    return {"wall": wall, "cpu": cpu_s, "first_step": r["stamps"][0], "peak": r["peak"],
            "steps_per_s": steps_per_s(r["stamps"], args.warmup), "steps_per_cpu_s": steps_per_s(r["cpu"], args.warmup)}


def median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["sd3", "flux", "both"], default="both")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of steps/s (the first ones)")
    ap.add_argument("--rounds", type=int, default=5, help="runs per side; the sides alternate, medians are printed")
    ap.add_argument("--resolution", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both sides")
    ap.add_argument("--examples", default=os.environ.get(ENV, ""),
                    help=f"diffusers checkout, its examples or examples/dreambooth folder (default ${ENV})")
    ap.add_argument("--keep", default="", help="copy the work folder (models, data, configs, logs) here")
    ap.add_argument("--run", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        return run_child(json.loads(args.run))
    if args.warmup < 1 or args.steps <= args.warmup:
        print(f"bench_yardstick: --steps ({args.steps}) must be larger than --warmup ({args.warmup}), which must be >= 1")
        return 2
    folder = examples_dir(args.examples)
    if folder is None:
        why = f"{ENV} is not set" if not args.examples else f"{args.examples} has no examples/dreambooth/{SCRIPTS['sd3']}"
        print(f"bench_yardstick: {why} (give --examples or {ENV}: a huggingface/diffusers checkout)")
        return 2
    sys.path.insert(0, str(ROOT))
    os.environ.update(HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error")  # building the model quietly
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                CUDA_VISIBLE_DEVICES="", WANDB_MODE="disabled", PYTHONUNBUFFERED="1")  # fmt: skip
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    te_env = dict(base, PYTHONPATH=os.pathsep.join([str(ROOT), *inherited]))
    script_env = dict(base, PYTHONPATH=os.pathsep.join(inherited))
    standin = not torchvision_loads(script_env)
    families = ["sd3", "flux"] if args.family == "both" else [args.family]
    runnable = []
    for family in families:
        missing = missing_imports(folder / SCRIPTS[family], standin)
        if missing:
            print(f"bench_yardstick: {SCRIPTS[family]} cannot run here: missing {', '.join(missing)} "
                  f"(pip install {' '.join(missing)})")  # fmt: skip
        else:
            runnable.append(family)
    if not runnable:
        return 2
    head = _git_head(folder)
    print(f"diffusers examples: {folder} ({head}); torchvision: "
          f"{'stand-in (benchmarks/yardstick/yardstick_torchvision)' if standin else 'installed'}")
    print(f"CPU fp32, {args.resolution}px, batch {args.batch}, rank {args.rank}, {args.steps} steps (steps/s after "
          f"{args.warmup}), {args.images} images, OMP_NUM_THREADS={args.threads}, {args.rounds} rounds alternating")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        from te_align.tiny.pipelines import build_model_folder

        for family in runnable:
            build_model_folder(family, work / family)
        make_data(work, args.images, args.resolution)
        for family in runnable:
            results[family] = {"script": [], "te-align": []}
            for r in range(args.rounds):
                order = ["script", "te-align"] if r % 2 == 0 else ["te-align", "script"]
                for side in order:
                    res = launch(side, family, work, f"{family}_{side}_{r}", {"script": str(folder / SCRIPTS[family]), "standin": standin},
                                 script_env if side == "script" else te_env, args)  # fmt: skip
                    results[family][side].append(res)
                    if "error" in res:
                        print(f"  {family} {side} round {r + 1}: {res['error']}")
        if args.keep:
            import shutil

            shutil.copytree(work, args.keep, dirs_exist_ok=True)
    print()
    print(f"{'family':<6} {'side':<9} {'wall s':>7} {'CPU s':>6} {'1st step s':>10} {'steps/s':>8} {'steps/CPU-s':>11} "
          f"{'peak MiB':>9}   runs")  # fmt: skip
    for family, sides in results.items():
        for side, runs in sides.items():
            ok = [x for x in runs if "error" not in x]
            print(f"{family:<6} {side:<9} {median(ok, 'wall'):>7.1f} {median(ok, 'cpu'):>6.1f} {median(ok, 'first_step'):>10.1f} "
                  f"{median(ok, 'steps_per_s'):>8.2f} {median(ok, 'steps_per_cpu_s'):>11.2f} {median(ok, 'peak') / 2**20:>9.0f}"
                  f"   {len(ok)}/{len(runs)}")  # fmt: skip
    print()
    print("te-align vs script, medians (target: speed >= 1.00x, peak RSS <= 1.00x); speed = script time / te-align time")
    print(f"{'family':<6} {'steps/s':>8} {'steps/CPU-s':>11} {'whole wall':>10} {'whole CPU':>9} {'peak RSS':>9}")
    for family, sides in results.items():
        te = [x for x in sides["te-align"] if "error" not in x]
        sc = [x for x in sides["script"] if "error" not in x]
        print(f"{family:<6} {median(te, 'steps_per_s') / median(sc, 'steps_per_s'):>7.2f}x "
              f"{median(te, 'steps_per_cpu_s') / median(sc, 'steps_per_cpu_s'):>10.2f}x "
              f"{median(sc, 'wall') / median(te, 'wall'):>9.2f}x {median(sc, 'cpu') / median(te, 'cpu'):>8.2f}x "
              f"{median(te, 'peak') / median(sc, 'peak'):>8.2f}x")  # fmt: skip
        for side, runs in (("script", sc), ("te-align", te)):
            per_run = ", ".join(f"{x['steps_per_s']:.1f}" for x in runs)
            walls = ", ".join(f"{x['wall']:.1f}" for x in runs)
            peaks = ", ".join(f"{x['peak'] / 2**20:.0f}" for x in runs)
            print(f"       {side:<8} per run: steps/s {per_run}; wall s {walls}; peak MiB {peaks}")
    return 0


def _git_head(folder: Path) -> str:
    proc = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    return f"diffusers {proc.stdout.strip()}" if proc.returncode == 0 else "no git"


if __name__ == "__main__":
    raise SystemExit(main())
