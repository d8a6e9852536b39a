"""Ship a pretrained shapes-world base into the package (maintainers).

    python tools/ship_base.py --name sd3 --run RUNS/sd3 --step 20000 [--dest DIR] [--eval-n 64] [--threads 1]

Takes the pipeline folder ``RUN/model-STEP`` written by ``tools/world_build.py base``, rounds it to float16 (what
is shipped) and writes into the world data root (default ``world/te_align_world``):

* the shared parts once: ``encoders/{clip_l,clip_g,t5}`` and ``vae`` (a second base must bring bit-identical
  ones, else it is refused: every base shares them); a base with an encoder folder of its own
  (:data:`te_align.tiny.bases.ENCODERS`, e.g. chroma's ``t5_cased``) ships only the encoder folders it uses;
* ``<name>/<denoiser>/`` and ``<name>/scheduler/``;
* ``<name>/base.json``: the base's family, profile and fitted profile overrides, the world it was trained on and
  the concept held out, its sampling settings (what ``pipe(prompt)`` uses), the pretraining record (config,
  samples seen, training seconds, threads, device and the autoencoder's and encoders' own records, read from the
  runs' ``log.jsonl``), and the SHA-256 of every file the base uses.

Then it loads the shipped base exactly as users do (``te_align.tiny.bases.load``: hash check, materialize, the
official pipeline) and evaluates it on held-out prompts with plain calls ``pipe(prompt, generator=...)``:
``--eval-n`` prompts per caption style of the base's world (dataset seed 20000, pink never among them), seed i for
prompt i, read by the world's reader. The result goes into ``base.json["metrics"]``. Numbers in the docs about a
base come from its ``base.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]

from te_align.tiny import bases  # noqa: E402

#: The sampling settings of every base (fixed before any base was trained; the study's and the A/B presets'
#: accuracy settings): 16 steps, classifier-free guidance 4 against the profile's empty prompt, 32 px.
SAMPLING: dict[str, dict[str, Any]] = {
    "sd3": {"num_inference_steps": 16, "guidance_scale": 4.0, "height": 32, "width": 32},
    "flux": {"num_inference_steps": 16, "true_cfg_scale": 4.0, "negative_prompt": "", "max_sequence_length": 256,
             "height": 32, "width": 32},
    "sdxl": {"num_inference_steps": 16, "guidance_scale": 4.0, "height": 32, "width": 32},
    "sd15": {"num_inference_steps": 16, "guidance_scale": 4.0, "height": 32, "width": 32},
    # ChromaPipeline.__call__'s guidance_scale is true classifier-free guidance against negative_prompt
    # (diffusers 0.42.1 pipelines/chroma/pipeline_chroma.py:596-614, 869-882); T5 256: recipe.PROFILE_CHANGES
    "chroma": {"num_inference_steps": 16, "guidance_scale": 4.0, "negative_prompt": "",
               "max_sequence_length": 256, "height": 32, "width": 32},
    # Flux2KleinPipeline(is_distilled=False): guidance_scale is true classifier-free guidance against the encoded ""
    # (diffusers 0.42.1 pipelines/flux2/pipeline_flux2_klein.py:595-596, 749-760, 864-877); the Qwen3 window 512
    "klein": {"num_inference_steps": 16, "guidance_scale": 4.0, "max_sequence_length": 512, "height": 32, "width": 32},
}  # fmt: skip


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


#: An encoder folder of the world data named otherwise than the encoder of the set it was saved from (world_build.py
#: encoders; :data:`world_pretrain.encoders.COMPONENTS`): a base's own continued copy.
SET_FOLDER = {"t5_cased": "t5"}


def _save_half(module: Any, folder: Path) -> None:
    import copy

    import torch

    half = copy.deepcopy(module).to(torch.float16)
    half.save_pretrained(str(folder), safe_serialization=True)
    # save_pretrained records the folder it was loaded from: a path on the machine that trained it, not shipped
    config = folder / "config.json"
    data = json.loads(config.read_text(encoding="utf-8"))
    if data.pop("_name_or_path", None) is not None:
        config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _same_files(a: Path, b: Path) -> bool:
    fa = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    return fa == fb and all((a / r).read_bytes() == (b / r).read_bytes() for r in fa)


def _put_shared(tmp: Path, dest: Path) -> None:
    """Move ``tmp`` to ``dest``, or check that ``dest`` holds the same bytes (shared by every base)."""
    if dest.exists():
        if not _same_files(tmp, dest):
            raise SystemExit(f"{dest}: differs from this base's; every world base must share the same encoders and "
                             "autoencoder (retrain the base on the shipped ones, or reship every base)")  # fmt: skip
        shutil.rmtree(tmp)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)


def _portable(value: Any, runs: Path) -> Any:
    """A run's absolute folder as ``RUNS/<relative>`` (the root of the runs), so no machine's path is shipped."""
    if isinstance(value, str) and value.startswith("/"):
        path = Path(value)
        return f"RUNS/{path.relative_to(runs).as_posix()}" if path.is_relative_to(runs) else f".../{path.name}"
    return value


def pretrain_record(run: Path, step: int) -> dict[str, Any]:
    """What the base's run logged: its config, samples seen and training seconds at ``step``, and the records of the
    autoencoder and encoders it used (their own ``log.jsonl``, found from the config)."""
    rs = _records(run / "log.jsonl")
    config = [r for r in rs if r.get("phase") == "config"][-1]
    ev = next(r for r in rs if r.get("phase") == "eval" and r.get("step") == step)
    out: dict[str, Any] = {
        "command": "python tools/world_build.py base",
        "config": {k: _portable(v, run.resolve().parent) for k, v in config.items() if k not in ("time", "phase")},
        "steps": step, "samples_seen": ev.get("samples"), "train_seconds": ev["train_seconds"],
        "eval_during_training": {k: ev[k] for k in ("all", "visible", "tags", "short", "long") if k in ev},
        "resumed": any(r.get("phase") == "resume" for r in rs),
    }  # fmt: skip
    vae_run = Path(config["vae_from"]).parent
    vae_rs = _records(vae_run / "log.jsonl")
    if vae_rs:
        saved = next((r for r in vae_rs if r.get("phase") == "vae_saved"), {})
        rts = [r for r in vae_rs if r.get("phase") == "vae_roundtrip"]
        out["vae"] = {"command": "python tools/world_build.py vae", "train_seconds": saved.get("train_seconds"),
                      "config": {k: v for k, v in vae_rs[0].items() if k.startswith("vae_") or k in ("image_size", "train_size", "seed")},
                      "roundtrip": {r["world"]: {k: r[k] for k in ("object_accuracy", "colour", "shape", "position")}
                                    for r in rts[-2:]}}  # fmt: skip
    bn = [r for r in rs if r.get("phase") == "vae_bn"]
    if bn:  # klein: the autoencoder's BatchNorm statistics, set from seeded full-world renders before training
        out["vae_bn"] = {k: bn[-1][k] for k in ("renders", "seed", "mean", "var")}
    enc = Path(config["encoders"]) if config.get("encoders") else None
    if enc is not None and (enc / "encoders.json").is_file():
        command = "python tools/world_build.py " + ("klein-encoder" if config.get("family") == "klein" else "encoders")
        out["encoders"] = encoder_record(enc, command)
    # a base trained on the shipped parts (world_build.py base --vae DATA/vae --encoders DATA/encoders)
    for part, folder in (("vae", Path(config["vae_from"])), ("encoders", enc)):
        if part not in out and folder is not None:
            record = shipped_part_record(folder, part)
            if record is not None:
                out[part] = record
    return out


def encoder_record(folder: Path, command: str) -> dict[str, Any]:
    """An encoder set's own record (``encoders.json``) under ``command``; a set continued from another (``init``)
    carries that one's record as ``init_record``: the shipped shared set's (chroma's T5), or the earlier set's own,
    link by link (the klein base's chain of Qwen3 sets)."""
    out = {"command": command, **json.loads((folder / "encoders.json").read_text(encoding="utf-8"))}
    init = out.get("config", {}).get("init")
    if init:
        start = Path(init) if Path(init).is_absolute() else ROOT / init
        record = shipped_part_record(start, "encoders")
        if record is None and (start / "encoders.json").is_file():
            record = encoder_record(start, command)
        if record is not None:
            out["init_record"] = record
    return out


def shipped_part_record(folder: Path, part: str) -> dict[str, Any] | None:
    """The training record of a shared part (``vae`` or ``encoders``) when ``folder`` is that part inside a world
    data root: copied from the ``base.json`` of a base shipped there whose recorded hashes its files still have."""
    root = folder.resolve().parent
    if folder.resolve() != (root / part).resolve():
        return None
    for name in bases.shipped(root):
        info = bases.base_info(name, root)
        mine = {rel: digest for rel, digest in info["files"].items() if rel.startswith(f"{part}/")}
        record = info.get("pretrain", {}).get(part)
        if mine and record and all(bases._sha256(root / rel) == digest for rel, digest in mine.items()):
            return dict(record)
    return None


def evaluate(pipe: Any, name: str, world_name: str, held_out: str, per_style: int) -> dict[str, Any]:
    """Held-out accuracy of a loaded base with plain calls ``pipe(prompt, generator=...)``."""
    import numpy as np
    import torch
    from world_pretrain import recipe

    from te_align.tiny import world

    attribute, _, value = held_out.partition("=")
    concept = world.Concept(attribute, value) if held_out else None
    prompts = [s for style in ("tags", "short", "long") for s in
               recipe.heldout_set(per_style, 20_000, style, concept, space=world.SPACES[world_name])]  # fmt: skip
    images = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for i, s in enumerate(prompts):
            out = pipe(s.caption, generator=torch.Generator().manual_seed(i), output_type="np").images[0]
            images.append(np.clip(np.rint(out * 255), 0, 255).astype(np.uint8))
    seconds = time.perf_counter() - t0
    res: dict[str, Any] = {"all": world.evaluate(images, [s.scene for s in prompts])}
    for style in ("tags", "short", "long"):
        sel = [k for k, s in enumerate(prompts) if s.style == style]
        res[style] = world.evaluate([images[k] for k in sel], [prompts[k].scene for k in sel])
    vis = recipe.visible(recipe.fitted_profile(bases.BASES[name].family), prompts)
    sel = [k for k, v in enumerate(vis) if v]
    res["visible"] = {**world.evaluate([images[k] for k in sel], [prompts[k].scene for k in sel]), "prompts": float(len(sel))}
    res.update({"prompts": len(prompts), "dataset_seed": 20_000, "per_style": per_style, "sample_seeds": f"0..{len(prompts) - 1}",
                "call": "pipe(prompt, generator=torch.Generator().manual_seed(i)) with the base's sampling settings",
                "seconds": round(seconds, 1)})  # fmt: skip
    res["_images"] = images
    res["_prompts"] = [s.caption for s in prompts]
    return res


def ship_pipeline(pipe: Any, name: str, root: Path, *, encoders: dict[str, Any], vae: Any, world: str, held_out: str,
                  pretrain: dict[str, Any], sampling: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Write base ``name`` (``pipe``'s denoiser and scheduler, the shared ``encoders`` and ``vae``) into the world data
    root ``root`` with its ``base.json`` (no metrics yet); returns the manifest."""
    import torch
    from world_pretrain import recipe

    spec = bases.BASES[name]
    # the pipeline must have been trained with exactly the shared parts
    for comp, (folder, _) in bases.ENCODERS[spec.family].items():
        mine = {k.removeprefix("text_model."): v for k, v in getattr(pipe, comp).state_dict().items()}
        shared = {k.removeprefix("text_model."): v for k, v in encoders[folder].state_dict().items()}
        for k, v in mine.items():
            if k not in shared or not torch.equal(v.half(), shared[k].half()):
                raise SystemExit(f"{name}: {comp} differs from the shared {folder} encoder at {k}")
    for k, v in pipe.vae.state_dict().items():
        if k.startswith("bn.") and spec.family == "klein":  # the statistics travel in base.json (pretrain.vae_bn)
            continue
        if not torch.equal(v.half(), vae.state_dict()[k].half()):
            raise SystemExit(f"{name}: the autoencoder differs from the shared one at {k}")
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=".ship-"))
    try:
        for folder in encoders:
            _save_half(encoders[folder], work / folder)
            _put_shared(work / folder, root / "encoders" / folder)
        _save_half(vae, work / "vae")
        _put_shared(work / "vae", root / "vae")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base_dir = root / name
    shutil.rmtree(base_dir, ignore_errors=True)
    base_dir.mkdir(parents=True)
    denoiser = getattr(pipe, spec.denoiser)
    _save_half(denoiser, base_dir / spec.denoiser)
    pipe.scheduler.save_pretrained(str(base_dir / "scheduler"))
    used = sorted({f"encoders/{f}" for f, _ in bases.ENCODERS[spec.family].values()} | {"vae", name})
    files = {p.relative_to(root).as_posix(): bases._sha256(p)
             for top in used for p in sorted((root / top).rglob("*")) if p.is_file() and p.name != bases.MANIFEST}  # fmt: skip
    if spec.family == "klein":  # the shipped autoencoder is the shared one; the pipeline's statistics are in base.json
        bn = pretrain.get("vae_bn")
        if bn is None or bn["mean"] != recipe.vae_bn_record(pipe.vae)["mean"] or bn["var"] != recipe.vae_bn_record(pipe.vae)["var"]:
            raise SystemExit(f"{name}: pretrain.vae_bn is missing or differs from the pipeline's autoencoder BatchNorm")
    fitted = recipe.fitted_overrides(spec.family)  # the tiny encoders' numbers and chroma's T5 256
    info: dict[str, Any] = {
        "format": bases.FORMAT, "name": name, "family": spec.family, "profile": spec.profile, "pipeline": spec.pipeline,
        "denoiser_class": type(denoiser).__name__, "world": world, "held_out": held_out,
        "sampling": dict(sampling or SAMPLING[name]), "profile_overrides": fitted, "pretrain": pretrain, "metrics": {},
        "files": files,
    }  # fmt: skip
    (base_dir / bases.MANIFEST).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return info


def ship_encoders(family: str, folder: str) -> dict[str, Any]:
    """The encoder folders a base of ``family`` ships (name -> module, float16 values), from the run's encoder set.

    The shared set's three folders; a base with a folder of its own (chroma's t5_cased: the shared T5 continued)
    ships only the folders it uses; the klein base its klein encoder set's Qwen3 (``encoders/qwen3_klein``)."""
    from world_pretrain import recipe
    from world_pretrain.encoders import COMPONENTS

    if family == "klein":
        return {"qwen3_klein": recipe._components("klein", folder)["text_encoder"]}
    enc = recipe._components("sd3", folder)  # the shared set: CLIP-L and CLIP-G with projection, T5
    used = {name for name, _ in bases.ENCODERS[family].values()}
    shared = ("clip_l", "clip_g", "t5")
    names = shared if used <= set(shared) else sorted(used)
    return {name: enc[COMPONENTS[SET_FOLDER.get(name, name)]] for name in names}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True, choices=list(bases.BASES))
    ap.add_argument("--run", required=True, help="the base's world_build.py output folder")
    ap.add_argument("--step", type=int, required=True, help="ship RUN/model-STEP")
    ap.add_argument("--dest", default=None, help="world data root (default: the package's world/te_align_world)")
    ap.add_argument("--eval-n", type=int, default=64, help="held-out prompts per caption style")
    ap.add_argument("--grid", default=None, help="also write a grid of the first 24 evaluation samples here (PNG)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import diffusers
    import torch
    from world_pretrain import recipe

    torch.set_num_threads(args.threads)
    diffusers.logging.set_verbosity_error()
    spec = bases.BASES[args.name]
    run = Path(args.run)
    root = Path(args.dest) if args.dest else bases.data_root()
    record = pretrain_record(run, args.step)
    cfg = record["config"]
    paths = [r for r in _records(run / "log.jsonl") if r.get("phase") == "config"][-1]  # the run's own folders
    pipe = getattr(diffusers, spec.pipeline).from_pretrained(str(run / f"model-{args.step}"), dtype=torch.float32)
    vae = diffusers.AutoencoderKL.from_pretrained(paths["vae_from"])
    recipe._round_to_half(vae)
    encoders = ship_encoders(spec.family, paths["encoders"])
    info = ship_pipeline(pipe, args.name, root, encoders=encoders, vae=vae, world=cfg["world"], held_out=cfg["held_out"],
                         pretrain=record)  # fmt: skip
    with tempfile.TemporaryDirectory() as cache:
        loaded = bases.load(args.name, cache_dir=Path(cache) / "base", source=root)
        ev = evaluate(loaded, args.name, cfg["world"], cfg["held_out"], args.eval_n)
    images, prompts = ev.pop("_images"), ev.pop("_prompts")
    info["metrics"] = {"heldout": ev}
    (root / args.name / bases.MANIFEST).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if args.grid:
        from te_align.tiny import world

        world.grid(images[:: max(1, len(images) // 24)][:24], prompts[:: max(1, len(images) // 24)][:24], columns=6,
                   label_lines=6).save(args.grid)  # fmt: skip
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    v = ev["visible"]
    print(json.dumps({"dest": str(root / args.name), "world_data_bytes": size, "visible_prompts": v["prompts"],
                      "colour": v["colour"], "position": v["position"], "shape": v["shape"],
                      "objects_exact": v["object_accuracy"]}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
