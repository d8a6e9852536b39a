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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import te_align
from te_align import _schema as schema
from te_align import _toml as tomllib
from te_align._lazy import lazy_module
from te_align._shipped import shipped_dir
from te_align._types import JSONObject
from te_align.errors import TeAlignError, closest
from te_align.tiny.bases import BASES
from te_align.train.config import SECTIONS, TrainError, config_from_dict
from te_align.trainers import names

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles.model import AlignmentProfile
    from te_align.tiny.world.scenes import Concept

#: The shapes world (numpy), loaded when a world preset is checked: listing or loading other presets stays light.
_world = lazy_module("te_align.tiny.world")
_phrasings = lazy_module("te_align.tiny.world.phrasings")


class ABError(TeAlignError):
    """A preset, dataset or A/B output folder the A/B runner cannot use."""


#: Added to arm A's training seed in a null control.
NULL_SEED_OFFSET = 10007

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
    #: Arm A's te_align.train settings where the trainer differs outside the profile (deep-merged over
    #: [train]), e.g. ``{ data = { encoder_dropout = {} } }`` for a trainer without per-encoder dropout.
    train: dict[str, Any] = field(default_factory=dict)
    #: A null control: arm A conditions exactly as arm B (no overrides, no train settings) but draws its own
    #: training randomness (seed + NULL_SEED_OFFSET), to show how often the verdict finds a difference where
    #: only chance differs.
    null: bool = False
    #: A positive control: arm A's training captions lose these words (e.g. the concept's colour word), which
    #: destroys the concept's text signal; a study whose instrument cannot see this cannot see anything.
    positive: bool = False
    remove_words: list[str] = field(default_factory=list)
    #: A positive control whose arm A trains on the same images with their captions shuffled among them (a fixed
    #: permutation per seed): every text-image correspondence, the concept's included, is destroyed.
    shuffle_captions: bool = False
    #: A positive control on the deviations' own axis (the plan's amendment 10): arm A is the very LoRA arm B trains,
    #: sampled with each probe prompt cut just before the first of these words (whole words, any case), as a length
    #: cut there leaves it; a prompt without them is sampled whole. The concept's word never reaches the conditioning.
    cut_before: list[str] = field(default_factory=list)
    #: An inference-side row: arm A is the very LoRA arm B trains (by the profile), sampled and scored with the
    #: conditioning an inference tool gives it by default: the profile changed by ``inference_overrides`` and,
    #: with ``inference_chunks`` N >= 1, prompts over 75 CLIP tokens encoded as up to N 77-token chunks
    #: (ComfyUI). Each prompt is encoded alone, as the tool does; a prompt and its negative of different lengths
    #: are repeated to their least common multiple (ComfyUI's CONDCrossAttn.concat).
    inference_tool: str = ""
    inference_overrides: dict[str, Any] = field(default_factory=dict)
    inference_chunks: int = 0
    #: How users of the trainer sample arm A's LoRA: ``profile`` (the official pipeline: a T5 length is not carried
    #: to inference) or ``trained`` (as trained: a CLIP skip or long-prompt chunking usually is).
    sample_as: str = "profile"
    #: A deviation no trainer at the commits read is known to make (the klein plan's thinking and template rows): the
    #: row measures what the mistake would cost; every table of the matrix names it "hypothetical".
    hypothetical: bool = False

    @property
    def kind(self) -> str:
        """``null``, ``positive``, ``inference`` or ``deviation``."""
        if self.null:
            return "null"
        if self.positive:
            return "positive"
        if self.inference_overrides or self.inference_chunks:
            return "inference"
        return "deviation"

    def inference_profile(self, profile: AlignmentProfile) -> AlignmentProfile:
        """The profile arm A is sampled with (``profile`` itself for every row but an inference-side one)."""
        return profile.with_overrides(self.inference_overrides) if self.inference_overrides else profile


@dataclass
class WorldSettings:
    """A shapes-world A/B (``[world]``): the pretrained tiny base and the finetuning data drawn from the world.

    The concept (``attribute=value``) is one the base never saw; the training images always show it (never in
    a ``holdout`` combination), the validation images always show it in a held-out combination with known
    attributes. Data and answer keys are written into the A/B folder (``OUT/data``).
    """

    base: str = "sd3"
    concept: str = "colour=pink"
    holdout: list[str] = field(default_factory=lambda: ["shape=triangle"])
    train_images: int = 64
    val_images: int = 24
    data_seed: int = 0
    image_size: int = 32
    style_mix: dict[str, float] = field(default_factory=dict)
    #: The scene space the data is drawn from (``te_align.tiny.world.SPACES``): the shipped bases are pretrained on
    #: "simple" (one object on plain white); "full" is the whole world.
    space: str = "simple"
    #: Every seed draws its own finetuning and validation images (``data_seed + seed``), shared by both arms of
    #: that seed, so that the interval across seeds covers the data draw too.
    per_seed_data: bool = True

    def concept_object(self) -> Concept:
        attribute, _, value = self.concept.partition("=")
        hold = tuple(tuple(h.split("=", 1)) for h in self.holdout)
        return _world.Concept(attribute, value, holdout=hold)  # type: ignore[arg-type]


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
    #: The first seed (seeds run ``first_seed`` .. ``first_seed + seeds - 1``): a confirmatory row runs on seeds
    #: (so data and probe prompts) that no earlier row used (amendment 11 of benchmarks/effects/bench_effects.md).
    first_seed: int = 0
    #: Prompt accuracy (validation folders with a shapes-world answer key): sampler steps and guidance.
    accuracy_steps: int = 16
    accuracy_guidance: float = 4.0
    #: Shapes-world presets: checkpoint steps at which the probe prompts are sampled (the learning curve; every
    #: step must be a checkpoint, a multiple of ``every``). The primary metric is the mean over these steps.
    curve_steps: list[int] = field(default_factory=list)
    #: Probe prompts per seed in new wording (:func:`te_align.tiny.world.phrasings.probe_prompts`), by length
    #: (``short``, ``long``, ``very long``): asking for the concept in a held-out combination, and asking for
    #: other colours (false concept readings, forgetting). Empty: prompt accuracy on the validation captions.
    probe_concept: dict[str, int] = field(default_factory=dict)
    probe_control: dict[str, int] = field(default_factory=dict)


@dataclass
class Preset:
    name: str
    profile: str
    baseline: Baseline
    model: str = ""
    description: str = ""
    train: dict[str, Any] = field(default_factory=dict)
    eval: EvalSettings = field(default_factory=EvalSettings)
    world: WorldSettings | None = None
    source: str = ""

    def arm_profiles(self, base: AlignmentProfile | None = None) -> tuple[AlignmentProfile, AlignmentProfile]:
        """(arm A, arm B) profiles: B is ``base`` (default: the bundled profile), A is B with the baseline overrides."""
        b = base if base is not None else te_align.profile(self.profile)
        a = b.with_overrides(self.baseline.overrides) if self.baseline.overrides else b
        return a, b

    def to_dict(self) -> JSONObject:
        d = dataclasses.asdict(self)
        d.pop("source", None)
        if not d["baseline"]["cut_before"]:  # added by amendment 10: the other rows' hashes stay as they were
            d["baseline"].pop("cut_before")
        if not d["eval"]["first_seed"]:  # added by amendment 11: likewise
            d["eval"].pop("first_seed")
        if not d["baseline"]["hypothetical"]:  # added for the klein rows (issue 49): likewise
            d["baseline"].pop("hypothetical")
        return d


def presets_root() -> Path:
    """The bundled ``presets/`` folder: the repository's, or its copy in an installed wheel."""
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


def preset_from_dict(data: JSONObject, *, file: str = "") -> Preset:
    """Validate a preset mapping: keys, baseline trainer, overrides (against the profile), [train] sections."""
    preset = dataclasses.replace(schema.build(Preset, data, file=file, error=ABError, exclude=("source",)), source=file)
    baseline, ev = preset.baseline, preset.eval
    if baseline.trainer not in names():  # the trainer registry's names
        raise ABError(f"expected one of {', '.join(names())}, got {baseline.trainer!r}", file=file, key="baseline.trainer")
    for key in ("behaviour", "why", "source"):
        if not getattr(baseline, key):
            raise ABError("missing: every baseline names the documented behaviour, why it differs and its source", file=file, key=f"baseline.{key}")
    inference = bool(baseline.inference_overrides or baseline.inference_chunks or baseline.inference_tool)
    if baseline.null:
        if baseline.overrides or baseline.train or baseline.remove_words or baseline.shuffle_captions or inference or baseline.positive:
            raise ABError(
                "a null control has no overrides, train settings, removed words or inference settings (arm A = arm B)",
                file=file,
                key="baseline",
            )
    elif baseline.positive or baseline.remove_words or baseline.shuffle_captions or baseline.cut_before:
        if not baseline.positive or sum(map(bool, (baseline.remove_words, baseline.shuffle_captions, baseline.cut_before))) != 1:
            raise ABError(
                "a positive control (positive = true) names the words arm A's captions lose (remove_words), "
                "shuffles them (shuffle_captions = true) or cuts its probe prompts before a word (cut_before): one of "
                "them, and each only for a positive control",
                file=file,
                key="baseline.remove_words",
            )
        if baseline.overrides or baseline.train or inference:
            raise ABError("a positive control differs only in remove_words, shuffle_captions or cut_before", file=file, key="baseline")
    elif inference:
        if baseline.overrides or baseline.train:
            raise ABError(
                "an inference-side row trains one LoRA by the profile for both arms: no overrides or train settings",
                file=file,
                key="baseline",
            )
        if not baseline.inference_tool or not (baseline.inference_overrides or baseline.inference_chunks > 0):
            raise ABError(
                "an inference-side row names inference_tool and sets inference_overrides or inference_chunks >= 1",
                file=file,
                key="baseline",
            )
    elif not baseline.overrides and not baseline.train:
        raise ABError(
            "arm A must differ from the profile: set overrides or train (or null = true for a control)",
            file=file,
            key="baseline",
        )
    if baseline.sample_as not in ("profile", "trained"):
        raise ABError(f"expected profile or trained, got {baseline.sample_as!r}", file=file, key="baseline.sample_as")
    if baseline.hypothetical and baseline.kind != "deviation":
        raise ABError("only a deviation row is hypothetical (a control or an inference row is not a trainer's)", file=file,
                      key="baseline.hypothetical")
    if baseline.sample_as == "trained" and baseline.kind != "deviation":
        raise ABError("only a deviation row samples arm A as trained", file=file, key="baseline.sample_as")
    if baseline.inference_chunks < 0:
        raise ABError(f"expected an integer >= 0, got {baseline.inference_chunks}", file=file, key="baseline.inference_chunks")
    try:
        a, b = preset.arm_profiles()
    except TeAlignError as e:
        raise ABError(f"profile / overrides: {e}", file=file, key="baseline.overrides") from None
    if baseline.overrides and not baseline.train and a.fingerprint() == b.fingerprint():
        raise ABError("the overrides leave the profile's behaviour unchanged: both arms would be identical", file=file, key="baseline.overrides")
    if baseline.inference_overrides:
        try:
            inf = baseline.inference_profile(b)
        except TeAlignError as e:
            raise ABError(f"profile / inference overrides: {e}", file=file, key="baseline.inference_overrides") from None
        if inf.fingerprint() == b.fingerprint() and not baseline.inference_chunks:
            raise ABError(
                "the inference overrides leave the profile's behaviour unchanged: both arms would be identical",
                file=file,
                key="baseline.inference_overrides",
            )
    for section, values in baseline.train.items():
        if section not in SECTIONS or not isinstance(values, dict):
            raise ABError(
                f"expected a table of a [train] section{closest(section, list(SECTIONS)) or ''}",
                file=file,
                key=f"baseline.train.{section}",
            )
        owned = _RUNNER_KEYS.get(section, set()) & set(values)
        if owned:
            raise ABError(f"set by the A/B runner per arm: {', '.join(sorted(owned))}", file=file, key=f"baseline.train.{section}")
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
        for arm in ("A", "B"):
            config_from_dict(train_config_dict(preset, model="model", data="data", out="out", profile=b.name, seed=0, arm=arm))
    except TrainError as e:
        raise ABError(f"[train]: {e}", file=file) from None
    if preset.world is not None:
        _check_world(preset.world, file)
    if ev.every < 0 or not 0.0 < ev.holdout < 1.0 or ev.seeds < 1 or ev.sample_steps < 1 or ev.first_seed < 0:
        raise ABError("every >= 0, 0 < holdout < 1, seeds >= 1, sample_steps >= 1, first_seed >= 0", file=file, key="eval")
    if any(not 0.0 < t < 1.0 for t in ev.timesteps):
        raise ABError("timesteps must lie in (0, 1)", file=file, key="eval.timesteps")
    if not ev.prompts:
        raise ABError("needs at least one sample prompt", file=file, key="eval.prompts")
    _check_probes(preset, file)
    if ev.accuracy_steps < 1 or not ev.accuracy_guidance >= 1.0:
        raise ABError("accuracy_steps >= 1 and accuracy_guidance >= 1", file=file, key="eval")
    te_align.profile(preset.profile)  # a bundled name or a file
    return preset


def _check_probes(preset: Preset, file: str) -> None:
    ev = preset.eval
    for key in ("probe_concept", "probe_control"):
        for length, n in getattr(ev, key).items():
            if length not in _phrasings.LENGTHS or not isinstance(n, int) or n < 0:
                raise ABError(
                    f"expected lengths ({', '.join(_phrasings.LENGTHS)}) = counts >= 0, got {length!r} = {n!r}",
                    file=file,
                    key=f"eval.{key}",
                )
    probes = bool(ev.probe_concept or ev.probe_control)
    if probes and preset.world is None:
        raise ABError("probe prompts need a shapes-world preset ([world])", file=file, key="eval.probe_concept")
    if probes and not sum(ev.probe_concept.values()):
        raise ABError("needs at least one concept probe prompt", file=file, key="eval.probe_concept")
    if ev.curve_steps:
        if not probes:
            raise ABError("a learning curve reads the probe prompts: set eval.probe_concept", file=file, key="eval.curve_steps")
        steps = preset.train.get("train", {}).get("max_steps")
        bad = [s for s in ev.curve_steps if s < 1 or not ev.every or (s % ev.every and s != steps)]
        if bad or sorted(set(ev.curve_steps)) != list(ev.curve_steps):
            raise ABError(
                f"expected increasing checkpoint steps (multiples of eval.every = {ev.every}), got {ev.curve_steps}",
                file=file,
                key="eval.curve_steps",
            )


def _check_world(w: WorldSettings, file: str) -> None:
    try:
        w.concept_object()
    except (ValueError, TypeError) as e:
        raise ABError(
            f"{e} (expected attribute=value, e.g. colour=pink; holdout entries attribute=value)",
            file=file,
            key="world.concept",
        ) from None
    if w.base not in BASES:
        raise ABError(
            f"no pretrained world base {w.base!r}{closest(w.base, list(BASES)) or ''}; bases: {', '.join(BASES)}",
            file=file,
            key="world.base",
        )
    if w.space not in _world.SPACES:
        raise ABError(f"no scene space {w.space!r}; spaces: {', '.join(_world.SPACES)}", file=file, key="world.space")
    if w.train_images < 1 or w.val_images < 1 or w.image_size < 8 or w.data_seed < 0:
        raise ABError("train_images >= 1, val_images >= 1, image_size >= 8, data_seed >= 0", file=file, key="world")


def _merge(base: JSONObject, extra: JSONObject) -> JSONObject:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) and v else v
    return out


def train_config_dict(
    preset: Preset,
    *,
    model: str,
    data: str,
    out: str,
    profile: str,
    seed: int,
    max_steps: int | None = None,
    arm: str = "B",
) -> JSONObject:
    """The te_align.train config of one arm: identical for both arms apart from ``profile``, ``out`` and, for
    arm A, the baseline's ``train`` settings."""
    raw: JSONObject = {k: dict(v) for k, v in preset.train.items()}
    if arm == "A" and preset.baseline.train:
        raw = _merge(raw, preset.baseline.train)
    raw.setdefault("model", {}).update({"path": model, "profile": profile})
    raw.setdefault("data", {})["path"] = data
    tr = raw.setdefault("train", {})
    # a null control's arm A draws its own training randomness (data order, noise, dropout, LoRA init): with
    # the same seed both arms would be bit-identical and the control could not fail
    null_a = arm == "A" and preset.baseline.null
    tr.update(
        {
            "seed": 42 + seed + (NULL_SEED_OFFSET if null_a else 0),
            "checkpoint_every": preset.eval.every or 1_000_000_000,
            "checkpoints_keep": 0,
        }
    )
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


__all__ = [
    "ABError",
    "Baseline",
    "EvalSettings",
    "Preset",
    "WorldSettings",
    "list_presets",
    "load_preset",
    "preset_from_dict",
    "presets_root",
    "train_config_dict",
]
