"""A/B presets: which trainer default arm A emulates, and the shared training and evaluation settings.

A preset is a TOML file (``presets/<profile>/<name>.toml`` or ``presets/tiny-demo.toml``)::

    name = "sd35-large-vs-simpletuner"
    profile = "sd35-large"                      # arm B: the bundled profile (the official conditioning)
    model = "stabilityai/stable-diffusion-3.5-large"
    description = "..."

    [baseline]                                  # arm A: how the trainer conditions by default
    trainer = "simpletuner"
    version = "SimpleTuner 4.8.0"
    behaviour = "T5 at 154 tokens (tokenizer_max_length defaults to 154, capped at 154)"
    why = "the profile trains T5 at 256 tokens (the official pipeline)"
    source = "bghira/SimpleTuner@bc8e6ab simpletuner/helpers/models/sd3/model.py:848-865"
    overrides = { t5_max_length = 154 }         # profile.with_overrides(...)

    [train]                                     # te_align.train config sections (model/data paths are set by the runner)
    data = { resolution = 1024 }
    lora = { rank = 16 }
    train = { max_steps = 1000, learning_rate = 1e-4 }

    [eval]
    every = 250                                 # checkpoint + validation loss every N steps
    ...

Arm A is ``profile.with_overrides(baseline.overrides)``: every trainer difference is a profile value
(e.g. kohya's CLIP-G "!" is ``clip_g.tokenizer.pad_token_in_prompt = "text"``), validated and fingerprinted.
Both arms train with :func:`te_align.train.train` on the same data, seeds, steps and hyper-parameters.
This module imports no torch.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_align import _schema as schema
from te_align.errors import TeAlignError, closest


class ABError(TeAlignError):
    """A preset, dataset or A/B output folder the A/B runner cannot use."""


TRAINERS = ("kohya", "ai-toolkit", "onetrainer", "simpletuner")

#: Keys of [train] that the runner owns (set per arm) and a preset may not set.
_RUNNER_KEYS = {
    "model": {"path", "profile", "profile_overrides", "config"},
    "data": {"path", "cache_dir"},
    "train": {"seed", "checkpoint_every", "checkpoints_keep"},
    "output": {"dir", "name", "kohya"},
}


@dataclass
class Baseline:
    trainer: str = ""
    version: str = ""
    behaviour: str = ""
    why: str = ""
    source: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalSettings:
    #: Checkpoint and validation loss every N optimizer steps (0 = only the end).
    every: int = 0
    #: Validation images held out of --data when it has no val/ folder (fraction of the images).
    holdout: float = 0.2
    #: Fixed flow times t in (0, 1) (eps/v models: t * (num_train_timesteps - 1)); empty = 8 equally spaced.
    timesteps: list[float] = field(default_factory=list)
    #: Seed of the fixed noise: validation image i uses noise drawn from noise_seed + i.
    noise_seed: int = 1234
    #: Side of the square validation crops (0 = data.resolution).
    resolution: int = 0
    #: Sample prompts and seeds (identical for both arms).
    prompts: list[str] = field(default_factory=list)
    sample_seeds: list[int] = field(default_factory=lambda: [0])
    sample_steps: int = 20
    guidance_scale: float = 5.0
    sample_size: int = 0
    #: Default number of training seeds (``--seeds`` overrides).
    seeds: int = 1


@dataclass
class Preset:
    name: str
    profile: str
    baseline: Baseline
    model: str = ""
    description: str = ""
    train: dict[str, Any] = field(default_factory=dict)
    eval: EvalSettings = field(default_factory=EvalSettings)
    source: str = ""

    def arm_profiles(self, base: Any = None) -> tuple[Any, Any]:
        """(arm A, arm B) profiles: B is ``base`` (default: the bundled profile), A is B with the baseline overrides."""
        import te_align

        b = base if base is not None else te_align.profile(self.profile)
        a = b.with_overrides(self.baseline.overrides) if self.baseline.overrides else b
        return a, b

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source", None)
        return d


def presets_root() -> Path:
    """The bundled ``presets/`` folder: the repository's, or its copy in an installed wheel."""
    from te_align._shipped import shipped_dir

    root = shipped_dir("presets")
    if root is None:
        raise ABError("te-align's bundled presets are missing from this installation (reinstall te-align)")
    return root


def list_presets() -> dict[str, Path]:
    """Bundled A/B presets (TOML files with a [baseline] table) by name."""
    out: dict[str, Path] = {}
    root = presets_root()
    if root.is_dir():
        for p in sorted(root.rglob("*.toml")):
            try:
                data = tomllib.loads(p.read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError):
                continue
            if isinstance(data, dict) and "baseline" in data:
                out[str(data.get("name") or p.stem)] = p
    return out


def preset_from_dict(data: dict[str, Any], *, file: str = "") -> Preset:
    """Validate a preset mapping: keys, baseline trainer, overrides (against the profile), [train] sections."""
    import te_align
    from te_align.train.config import SECTIONS, TrainError, config_from_dict

    preset = dataclasses.replace(schema.build(Preset, data, file=file, error=ABError, exclude=("source",)), source=file)
    baseline, ev = preset.baseline, preset.eval
    if baseline.trainer not in TRAINERS:
        raise ABError(f"expected one of {', '.join(TRAINERS)}, got {baseline.trainer!r}", file=file, key="baseline.trainer")
    for key in ("behaviour", "why", "source"):
        if not getattr(baseline, key):
            raise ABError("missing: every baseline names the documented behaviour, why it differs and its source", file=file, key=f"baseline.{key}")
    if not baseline.overrides:
        raise ABError("arm A must differ from the profile: set overrides", file=file, key="baseline")
    try:
        a, b = preset.arm_profiles()
    except TeAlignError as e:
        raise ABError(f"profile / overrides: {e}", file=file, key="baseline.overrides") from None
    if a.fingerprint() == b.fingerprint():
        raise ABError("the overrides leave the profile's behaviour unchanged: both arms would be identical", file=file, key="baseline.overrides")
    for section, values in preset.train.items():
        if section not in SECTIONS:
            raise ABError(f"unknown section{closest(section, list(SECTIONS)) or ''}", file=file, key=f"train.{section}")
        if not isinstance(values, dict):
            raise ABError("expected a table", file=file, key=f"train.{section}")
        owned = _RUNNER_KEYS.get(section, set()) & set(values)
        if owned:
            raise ABError(f"set by the A/B runner per arm, not by a preset: {', '.join(sorted(owned))}", file=file, key=f"train.{section}")
    if preset.train.get("lora", {}).get("text_encoders"):
        raise ABError("A/B presets train the denoiser only (the arms differ in conditioning)", file=file, key="train.lora.text_encoders")
    try:
        config_from_dict(train_config_dict(preset, model="model", data="data", out="out", profile=b.name, seed=0))
    except TrainError as e:
        raise ABError(f"[train]: {e}", file=file) from None
    if ev.every < 0 or not 0.0 < ev.holdout < 1.0 or ev.seeds < 1 or ev.sample_steps < 1:
        raise ABError("every >= 0, 0 < holdout < 1, seeds >= 1, sample_steps >= 1", file=file, key="eval")
    if any(not 0.0 < t < 1.0 for t in ev.timesteps):
        raise ABError("timesteps must lie in (0, 1)", file=file, key="eval.timesteps")
    if not ev.prompts:
        raise ABError("needs at least one sample prompt", file=file, key="eval.prompts")
    te_align.profile(preset.profile)  # a bundled name or a file
    return preset


def train_config_dict(preset: Preset, *, model: str, data: str, out: str, profile: str, seed: int, max_steps: int | None = None) -> dict[str, Any]:
    """The te_align.train config of one arm (identical for both arms apart from ``profile`` and ``out``)."""
    raw: dict[str, Any] = {k: dict(v) for k, v in preset.train.items()}
    raw.setdefault("model", {}).update({"path": model, "profile": profile})
    raw.setdefault("data", {})["path"] = data
    tr = raw.setdefault("train", {})
    tr.update({"seed": 42 + seed, "checkpoint_every": preset.eval.every or 1_000_000_000, "checkpoints_keep": 0})
    if max_steps is not None:
        tr["max_steps"] = max_steps
        tr["epochs"] = 0
    raw["output"] = {"dir": out, "name": "lora", "kohya": False}
    raw.setdefault("logging", {}).setdefault("progress", False)
    raw["logging"].setdefault("tensorboard", False)
    raw["sample"] = {}
    return raw


def load_preset(name_or_path: str | Path) -> Preset:
    """A preset by bundled name (``tiny-demo``, ``sd35-large``…) or from a TOML file."""
    p = Path(name_or_path).expanduser()
    if not p.is_file():
        known = list_presets()
        if str(name_or_path) not in known:
            raise ABError(f"no such preset{closest(str(name_or_path), list(known)) or ''}; bundled: {', '.join(known)}", file=str(name_or_path))
        p = known[str(name_or_path)]
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ABError(f"not valid TOML: {e}", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ABError(f"cannot read: {e}", file=str(p)) from None
    return preset_from_dict(data, file=str(p))


__all__ = ["ABError", "Baseline", "EvalSettings", "Preset", "list_presets", "load_preset", "preset_from_dict",
           "presets_root", "train_config_dict"]  # fmt: skip
