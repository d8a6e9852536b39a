"""What a run checks before it loads a model, shared by :func:`te_align.train.train` and ``te-align train --check``.

:func:`check_run` rejects, one line each, everything the run itself would reject before its first
step: the config (already validated by :mod:`te_align.train.config`), the profile and its
overrides, the family's limits (objective, text-encoder LoRA slots, encoder dropout slots, sizes
the pipeline needs), the device (``cuda`` without CUDA, fp16 on the CPU), the model path, the
output folder (a previous run there needs ``--resume`` or ``--overwrite``; a file or a read-only
folder is refused) and the dataset (scanned: every image decoded, every caption read).

An output folder *holds a previous run* when it has checkpoints or the run's LoRA files: writing
into it would replace them. ``--overwrite`` moves them (a rename, nothing is copied or deleted)
into ``<output>/replaced-<UTC time>/``; delete that folder when it is no longer needed.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from te_align._paths import describe
from te_align.profiles.resolve import is_hub_id
from te_align.train._io import writing
from te_align.train.checkpoint import latest_checkpoint, list_checkpoints
from te_align.train.config import TrainConfig, TrainError
from te_align.train.data import scan
from te_align.train.models import family_of, resolve_profile

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles.model import AlignmentProfile

#: The files and folders of a run in its output folder (``{name}`` is ``output.name``).
RUN_FILES = (
    "checkpoints",
    "{name}.safetensors",
    "{name}_kohya.safetensors",
    "{name}_full.safetensors",
    "{name}_projection.safetensors",
    "train_config.json",
    "logs",
    "samples",
    "loss.png",
)
#: The trained-weight files among them (a folder holding one holds a previous run).
WEIGHT_FILES = RUN_FILES[1:5]


def previous_run(cfg: TrainConfig) -> list[str]:
    """What of an earlier run the output folder holds (checkpoints, LoRA files); empty when none."""
    out = Path(cfg.output.dir)
    found = []
    n = len(list_checkpoints(out))
    if n:
        found.append(f"{n} checkpoint{'s' if n != 1 else ''}")
    for pattern in WEIGHT_FILES:
        name = pattern.format(name=cfg.output.name)
        if (out / name).exists():
            found.append(name)
    return found


def set_aside_previous_run(cfg: TrainConfig) -> Path | None:
    """``--overwrite``: move the earlier run's files into ``<output>/replaced-<UTC time>/``; returns that folder."""
    out = Path(cfg.output.dir)
    names = [p.format(name=cfg.output.name) for p in RUN_FILES]
    present = [n for n in names if os.path.lexists(out / n)]
    if not present:
        return None
    dest = out / time.strftime("replaced-%Y%m%d-%H%M%S", time.gmtime())
    k = 1
    while dest.exists():
        k += 1
        dest = out / time.strftime(f"replaced-%Y%m%d-%H%M%S-{k}", time.gmtime())
    with writing(dest):
        dest.mkdir()
        for n in present:
            os.replace(out / n, dest / n)
    return dest


def check_output(cfg: TrainConfig, *, resume: bool | str | Path | None, overwrite: bool) -> None:
    """Refuse an output folder the run cannot use, or one holding a previous run (without resume/overwrite)."""
    out = Path(cfg.output.dir)
    if resume and overwrite:
        raise TrainError("--resume and --overwrite contradict each other: pass one", key="--overwrite")
    for p in (out, *out.parents):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise TrainError("symlink loop in the output path", file=str(p), key="output.dir") from None
            raise TrainError(f"cannot use the output folder: {e.strerror}", file=str(p), key="output.dir") from None
        import stat

        if not stat.S_ISDIR(st.st_mode):
            raise TrainError(f"is {describe(st.st_mode)}, expected a folder for the run's output", file=str(p),
                             key="output.dir")
        if not os.access(p, os.W_OK | os.X_OK):
            why = "read-only file system" if _read_only(p) else "not writable"
            raise TrainError(f"{why}: the run cannot write its output here; choose another output.dir", file=str(p),
                             key="output.dir")
        break
    if resume:
        _check_resume(cfg, resume)
    if resume or overwrite:
        return
    found = previous_run(cfg)
    if found:
        raise TrainError(
            f"holds a previous run ({', '.join(found)}): pass --resume to continue it, --overwrite to start over "
            "(its files are moved into a replaced-<time>/ folder there), or choose another output.dir",
            file=str(out), key="output.dir",
        )


def _read_only(p: Path) -> bool:
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def check_device(cfg: TrainConfig) -> None:
    """``cuda`` without CUDA, fp16 mixed precision on the CPU (imports torch only when it must ask)."""
    t = cfg.train
    accel = t.device not in ("auto", "cpu")
    if not accel and not (t.device == "auto" and t.mixed_precision == "fp16"):
        return
    import torch

    kind = t.device.split(":")[0]
    if kind == "auto":
        if not torch.cuda.is_available():
            raise TrainError("fp16 mixed precision needs a GPU and none is available (the run would use the CPU); "
                             "use \"bf16\" or \"no\"", key="train.mixed_precision")
        return
    module = getattr(torch, kind, None)
    available = bool(module is not None and hasattr(module, "is_available") and module.is_available())
    if not available:
        raise TrainError(f"{t.device!r} is not available on this machine (torch {torch.__version__} sees no {kind} device); "
                         "use \"auto\" or \"cpu\"", key="train.device")
    if ":" in t.device and hasattr(module, "device_count"):
        index = int(t.device.split(":")[1])
        if index >= module.device_count():
            raise TrainError(f"{t.device!r}: this machine has {module.device_count()} {kind} device(s)", key="train.device")


def _vae_scale(cfg: TrainConfig) -> int | None:
    """The VAE's downscale factor from ``vae/config.json`` of a local diffusers folder (None if unknown)."""
    folder = Path(cfg.model.config or cfg.model.path).expanduser()
    try:
        data = json.loads((folder / "vae" / "config.json").read_text(encoding="utf-8"))
        channels = data.get("block_out_channels")
        return 2 ** (len(channels) - 1) if isinstance(channels, list) and channels else None
    except (OSError, ValueError, RecursionError):
        return None


def check_sizes(cfg: TrainConfig, multiple: int) -> None:
    """Bucket step and sample sizes must be multiples of what the model needs (VAE scale x patch size)."""
    if cfg.data.bucket_step % multiple:
        raise TrainError(f"must be a multiple of {multiple} for this model (VAE scale x patch size), got {cfg.data.bucket_step}",
                         key="data.bucket_step")
    for side in ("width", "height"):
        v = getattr(cfg.sample, side)
        if v % multiple:
            raise TrainError(f"must be a multiple of {multiple} for this model (VAE scale x patch size), got {v}",
                             key=f"sample.{side}")


def check_profile(cfg: TrainConfig) -> AlignmentProfile:
    """The run's profile (with overrides) and the family rules that depend on it; returns the profile."""
    profile = resolve_profile(cfg.model)
    family = family_of(profile)
    obj = cfg.train.objective
    if family.flow_native and obj not in ("auto", "flow"):
        raise TrainError(f"{family.name} models train with rectified flow only; got {obj!r}", key="train.objective")
    if obj == "flow" and not family.flow_native and family.name != "sdxl":
        raise TrainError("the flow-matching objective is available for SDXL, SD3 and Flux", key="train.objective")
    for name in cfg.lora.text_encoders:
        if name not in profile.slot_names:
            raise TrainError(f"no slot '{name}' in profile '{profile.name}' (slots: {', '.join(profile.slot_names)})",
                             key="lora.text_encoders")
        if not profile.slot(name).tokenizer.cls.startswith("CLIP"):
            raise TrainError(f"text-encoder LoRA is supported on CLIP slots only (diffusers loads no {name} LoRA)",
                             key="lora.text_encoders")
    for k in cfg.data.encoder_dropout:
        if k != "all" and k not in profile.slot_names:
            raise TrainError(f"no slot '{k}' in profile '{profile.name}' (slots: {', '.join(profile.slot_names)})",
                             key=f"data.encoder_dropout.{k}")
    scale = _vae_scale(cfg)
    if scale is not None:
        check_sizes(cfg, scale * family.patch)
    return profile


def check_model_path(cfg: TrainConfig) -> None:
    for key, value in (("model.path", cfg.model.path), ("model.config", cfg.model.config)):
        if not value:
            continue
        p = Path(value).expanduser()
        try:
            os.stat(p)
            continue
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise TrainError("symlink loop", file=value, key=key) from None
            raise TrainError(f"cannot read: {e.strerror}", file=value, key=key) from None
        if not is_hub_id(value) or value.startswith((".", "/", "~")):
            raise TrainError("no such model file or folder (and not a hub repo id owner/name)", file=value, key=key)


def _check_resume(cfg: TrainConfig, resume: bool | str | Path) -> None:
    """``--resume`` with nothing to resume from, refused before any model loads (a finished run named as such)."""
    if resume is True and latest_checkpoint(cfg.output.dir) is None:
        found = previous_run(cfg)
        finished = (f"; the run there finished ({', '.join(found)}) and kept no checkpoint: --overwrite starts "
                    "over (its files are moved into a replaced-<time>/ folder there), or choose another output.dir"
                    if found else "")
        raise TrainError(f"no checkpoint to resume from in the output folder{finished}",
                         file=str(Path(cfg.output.dir) / "checkpoints"), key="--resume")
    if resume is not True and not (Path(resume) / "state.json").is_file():
        raise TrainError("not a te-align checkpoint folder (no state.json)", file=str(resume), key="--resume")


def check_run(cfg: TrainConfig, *, resume: bool | str | Path | None = None, overwrite: bool = False, dataset: bool = True) -> list[str]:
    """Everything the run would refuse before its first step, as one :class:`TrainError`; returns notes."""
    notes: list[str] = []
    check_model_path(cfg)
    profile = check_profile(cfg)
    notes.append(f"profile {profile.name} ({profile.fingerprint()})")
    check_device(cfg)
    check_output(cfg, resume=resume, overwrite=overwrite)
    if cfg.data.cache_dir and Path(cfg.data.cache_dir).exists() and not Path(cfg.data.cache_dir).is_dir():
        raise TrainError("exists and is not a folder", file=cfg.data.cache_dir, key="data.cache_dir")
    if dataset:
        report = scan(cfg.data)
        notes.append(f"{len(report.items)} images")
        if report.unreadable:
            notes.append(f"{len(report.unreadable)} unreadable image(s) skipped")
        if report.missing_captions:
            notes.append(f"{len(report.missing_captions)} without a caption")
    return notes


__all__ = ["check_output", "check_run", "previous_run", "set_aside_previous_run"]
