"""``te-align ab matrix``: every known trainer deviation A/B-tested on the pretrained shapes-world bases.

Each bundled world preset (``presets/world/*.toml``) is one row of the pre-registered plan
(``benchmarks/effects/bench_effects.md``): a deviation (arm A as a trainer conditions by default, arm B by the profile the
base was pretrained with), an inference-side row (one LoRA, sampled as an inference tool does vs by the profile),
a null control or a positive control. The unit of work is one seed of one row (``OUT/<row>/seed-<s>/``, a
resumable :func:`te_align.ab.runner.run_ab`); units run in ``workers`` single-thread processes, controls first.
After every finished unit its per-seed result is written as JSON (``RESULTS/<row>/seed-<s>.json``, with the plan's
hash), and the table is rebuilt from all result files: ``OUT/matrix.md``, ``matrix.json`` and, when asked, the
committed document (``--doc``) and the summary ``te-align check`` reads (``--summary``).

Each row's hash covers its preset, its base's files, the seeds, the primary metric and the statistics: results of a
changed row are refused, never mixed (a unit folder and a result file both carry it); a row added by an amendment leaves
the others' results valid. The table's plan hash combines the rows' hashes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from te_align import _quiet
from te_align._atomic import atomic_file
from te_align._lazy import lazy_module
from te_align._types import JSONObject, JSONValue
from te_align.ab.evaluate import Divergence
from te_align.ab.preset import ABError, Preset, load_preset, presets_root
from te_align.ab.stats import (
    NO_DIFFERENCE,
    NO_VERDICT,
    PROFILE_BETTER,
    TRAINER_BETTER,
    holm,
    holm_multipliers,
    round_to_spread,
    sd_ratio_interval,
    smallest_detectable,
    t_interval,
)
from te_align.tiny.bases import BaseError, base_info, shipped
from te_align.tiny.world import grid

if TYPE_CHECKING:  # pragma: no cover
    from te_align.ab.progress import Progress
    from te_align.ab.runner import ABResult, ArmRun

#: The A/B runner, loaded on first use: a worker process (:func:`_unit`) sets torch to one thread before it and
#: the training libraries load.
_runner = lazy_module("te_align.ab.runner")

__all__ = ["MatrixRow", "aggregate", "documented", "matrix_presets", "plan_hash", "render_effects", "row_hash", "row_result", "run_matrix"]

logger = logging.getLogger("te_align.ab")

PLAN_FORMAT = 1
RESULT_FORMAT = 1
#: Family-wise error rate of the deviation rows' verdicts (Holm across them, on the primary metric).
ALPHA = 0.05
#: Kinds of row and the order units run in (controls first: the plan reads the positive control before any row).
KIND_ORDER = {"positive": 0, "null": 1, "deviation": 2, "inference": 2}
PENDING = "pending"
#: The positive control that gates the deviation rows' verdicts (bench_effects.md, amendment 3): unless it reads
#: "profile better", the instrument is blind at this scale and the deviation and inference rows are uninformative.
GATE = "world-sd3-positive-shuffled"
UNINFORMATIVE = "uninformative (the gating positive control was not seen)"
#: Holm families (bench_effects.md, amendment 7): the first plan's deviation and inference rows are one family; rows
#: an amendment added after those verdicts were published form a family of their own, keyed by their base, so that
#: adding rows changes no published verdict.
LATER_FAMILIES: dict[str, str] = {"sdxl": "the SDXL rows (amendment 7)", "chroma": "the Chroma row (amendment 8)",
                                  "klein": "the klein rows (issue 49)"}
_FIRST_CORRECTION = "holm over deviation and inference rows, paired t p-values"
#: The second reading (issue 47): one Holm family of every deviation and inference row, whatever amendment added it.
#: It changes no pre-registered verdict (the rows' hashes are unchanged); a row whose verdict differs between its
#: pre-registered family and this one is flagged in the document and in ``check``.
ALL_ROWS = "all deviation and inference rows"
#: Power of the smallest detectable effect (:func:`te_align.ab.stats.smallest_detectable`).
POWER = 0.8
#: Secondary metrics carried in the summary ``check`` reads, by the start of their name (key: what check calls it).
SECONDARIES: tuple[tuple[str, str], ...] = (
    ("known colours", "forgetting (known colours)"),
    ("validation loss, final (profile", "validation loss (profile conditioning)"),
    ("concept hit rate", "concept hit rate"),
    ("false concept readings", "false concept readings"),
    ("spurious objects", "spurious objects per image"),
)
#: Rows whose arm A draws anew under amendment 9 of the plan (issue 47, item 1): before it, a run that dropped fewer
#: text encoders than the profile publishes skipped the dropout draws on the step's random stream, so its timesteps
#: were not arm B's. Its row hash now names the amendment (its results before it are refused, never mixed), and the
#: results it had stay on record in ``SUPERSEDED`` beside the results folder. Arm B is unchanged (its draws are as
#: before), so each unit re-runs arm A and takes arm B's committed record of the same seed.
#: Amendment 11 adds the rows whose arm A chunks long captions: the trainer grouped a batch by its captions' chunk
#: count, so their arm A trained on other batches than arm B; batches no longer depend on the encoding.
REDRAWN: dict[str, str] = {
    "world-sd3-no-encoder-dropout": "amendment 9: arm A draws the per-encoder dropout numbers arm B draws (shared timesteps)",
    "world-sd3-simpletuner-defaults": "amendment 9: arm A draws the per-encoder dropout numbers arm B draws (shared timesteps)",
    "world-sd15-max-token-225": "amendment 11: arm A trains on arm B's batches (no grouping by long-prompt chunk count)",
    "world-sdxl-max-token-225": "amendment 11: arm A trains on arm B's batches (no grouping by long-prompt chunk count)",
    "world-sdxl-pad-longest": "amendment 11: arm A trains on arm B's batches (no grouping by long-prompt chunk count)",
}
#: Where the results of the rows in :data:`REDRAWN` from before their amendment stay on record: beside the results
#: folder, one folder per amendment (:func:`superseded_folder`).
SUPERSEDED = "superseded-amendment-9"
SUPERSEDED_11 = "superseded-amendment-11"


def superseded_folder(name: str) -> str:
    """The folder (beside the results folder) holding a :data:`REDRAWN` row's results from before its amendment."""
    return SUPERSEDED_11 if REDRAWN.get(name, "").startswith("amendment 11") else SUPERSEDED
#: The positive control on the deviations' own axis (amendment 10): arm B's LoRA sampled with each probe prompt cut
#: before the concept's word. A verdict new since amendment 9 (a re-drawn row's, or one that moved with them) counts
#: only once this control reads "profile better"; until then it is pending, and if it reads otherwise, uninformative.
AXIS_GATE = "world-sd3-positive-cut"
UNINFORMATIVE_AXIS = f"uninformative (the positive control on the deviations' axis, {AXIS_GATE}, was not seen)"
#: Instrument 2 (amendment 11): concept net accuracy at the last checkpoint, one Holm family of every deviation and
#: inference row, gated by a positive control run on new seeds. Its readings of rows whose arm A ran before the
#: amendment are post hoc (the readout was chosen after seeing amendment 10's control; the rows' 300-step readings were
#: published as secondaries); only the rows in :data:`CONFIRMATORY_2` have a confirmatory reading.
GATE_2 = "world-sd3-positive-cut-confirm"
UNINFORMATIVE_2 = f"uninformative (instrument 2's confirmatory control, {GATE_2}, was not seen)"
CONFIRMATORY_2 = frozenset(n for n, why in REDRAWN.items() if why.startswith("amendment 11"))
#: Bases whose rows were pre-registered with instrument 2 as their **primary** readout (benchmarks/klein/bench_klein.md
#: decisions 7 and 10, committed before any of their units ran): per base, the positive control that gates them. Their
#: instrument-2 readings are confirmatory, Holm-adjusted over that base's rows only (not amendment 11's family of the
#: CLIP/T5-era rows, whose adjusted values they would otherwise move), their smallest detectable effect from that
#: base's null control; their curve mean is a secondary there.
INSTRUMENT_2_PRIMARY: dict[str, str] = {"klein": "world-klein-positive-cut"}
#: Rows whose seed count grew after some of their units ran, by a rule written before those units (amendment 13's power
#: rule, benchmarks/klein/bench_klein.md: the Holm-3 smallest detectable effect at 6 seeds exceeded 0.20, so the klein
#: rows and both controls run 10). Per row, the seed count its first units were recorded under: those results carry the
#: row's hash with that count and stay valid (a unit does not depend on how many seeds its row has), the new seeds
#: carry the row's present hash; anything else in the row is still refused (:func:`accepted_hashes`).
EXTENDED: dict[str, int] = {"world-klein-null": 6, "world-klein-positive-cut": 6}


def instrument_2_family(base: str) -> str:
    """The instrument-2 Holm family of a row on ``base``: ``""`` for amendment 11's family of all rows, else the base's
    own (:data:`INSTRUMENT_2_PRIMARY`)."""
    return LATER_FAMILIES.get(base, base) if base in INSTRUMENT_2_PRIMARY else ""


def holm_family(base: str) -> str:
    """The Holm family of a row on ``base``: ``""`` for the first plan's, else the amendment's name."""
    return LATER_FAMILIES.get(base, "")


@dataclass
class MatrixRow:
    preset: str
    kind: str
    trainer: str
    deviation: str
    base: str
    seeds: int = 0
    planned: int = 0
    verdict: str = "not run"
    reason: str = ""
    metrics: list[JSONObject] = field(default_factory=list)
    p_holm: float = float("nan")
    sd_ratio: tuple[float, float, float] = (float("nan"), float("nan"), float("nan"))
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    source: str = ""
    sample_as: str = ""
    overrides: JSONObject = field(default_factory=dict)
    train: JSONObject = field(default_factory=dict)
    family: str = ""
    profile: str = ""
    where: list[str] = field(default_factory=list)
    #: The Holm family the row's verdict is adjusted in (:func:`holm_family`).
    holm_family: str = ""
    #: Holm's multiplier of the row's p in its pre-registered family (:func:`te_align.ab.stats.holm_multipliers`)
    #: and the interval at the level its verdict was tested at: ``1 - alpha / multiplier`` (excludes 0 exactly when
    #: the verdict is not "no measurable difference"). Controls: the plain 95% interval.
    holm_factor: float = float("nan")
    adj_ci: tuple[float, float] = (float("nan"), float("nan"))
    #: The same in one Holm family of all deviation and inference rows (:data:`ALL_ROWS`).
    p_holm_all: float = float("nan")
    holm_factor_all: float = float("nan")
    adj_ci_all: tuple[float, float] = (float("nan"), float("nan"))
    verdict_all: str = ""
    #: Smallest detectable effect (80% power) from the null controls' spread: at the first Holm step of the row's
    #: pre-registered family (alpha / rows), of the all-rows family, and unadjusted (alpha).
    mde: float = float("nan")
    mde_all: float = float("nan")
    mde_unadjusted: float = float("nan")
    #: The paired t test and the exact sign-flip test disagree at alpha (unadjusted): one rejects, the other not.
    tests_disagree: bool = False
    #: Instrument 2 (amendment 11; :attr:`final_net`): Holm over all deviation and inference rows, the interval at
    #: its verdict's level, the verdict (gated by :data:`GATE_2`), the smallest detectable effect at the family's
    #: first Holm step, whether the two tests disagree, and whether the reading is confirmatory (else post hoc).
    p_holm_2: float = float("nan")
    holm_factor_2: float = float("nan")
    adj_ci_2: tuple[float, float] = (float("nan"), float("nan"))
    verdict_2: str = ""
    mde_2: float = float("nan")
    tests_disagree_2: bool = False
    confirmatory_2: bool = False
    #: A deviation no trainer at the commits read is known to make (the preset's ``baseline.hypothetical``).
    hypothetical: bool = False

    @property
    def kind_label(self) -> str:
        """The row's kind as the tables print it: a hypothetical deviation says so."""
        return f"{self.kind} (hypothetical)" if self.hypothetical else self.kind

    @property
    def primary(self) -> JSONObject | None:
        return next((m for m in self.metrics if m["metric"] == _runner.PRIMARY), None)

    @property
    def final_net(self) -> JSONObject | None:
        """Instrument 2's reading (:data:`te_align.ab.runner.FINAL_NET`)."""
        return next((m for m in self.metrics if m["metric"] == _runner.FINAL_NET), None)


def matrix_presets() -> list[Preset]:
    """The bundled world presets: controls first (positive, then null), then deviation and inference rows."""
    root = presets_root() / "world"
    found = [load_preset(p) for p in sorted(root.glob("*.toml"))] if root.is_dir() else []
    return sorted(found, key=lambda p: (KIND_ORDER[p.baseline.kind], p.name))


def _deviation(p: Preset) -> str:
    b = p.baseline
    if b.kind == "null":
        return "null control (arm A = arm B, own random draws)"
    if b.kind == "positive":
        if b.cut_before:
            return "positive control: arm B's LoRA sampled with each probe prompt cut before " + ", ".join(repr(w) for w in b.cut_before)
        if b.shuffle_captions:
            return "positive control: arm A's captions shuffled among its images"
        return "positive control: arm A's captions without " + ", ".join(repr(w) for w in b.remove_words)
    if b.kind == "inference":
        parts = [f"{k} = {v!r}" for k, v in b.inference_overrides.items()]
        if b.inference_chunks:
            parts.append(f"CLIP chunks (up to {b.inference_chunks})")
        return f"sampled as {b.inference_tool}: " + ", ".join(parts)
    parts = [f"{k} = {v!r}" for k, v in b.overrides.items()]
    parts += [f"train.{s}.{k} = {v!r}" for s, t in b.train.items() for k, v in t.items()]
    return ", ".join(parts) + (" (sampled as trained)" if b.sample_as == "trained" else "")


def _base_digest(name: str) -> str:
    try:
        return hashlib.sha256(json.dumps(base_info(name)["files"], sort_keys=True).encode()).hexdigest()[:16]
    except BaseError:
        return "not shipped"


def _hash(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def row_hash(p: Preset, *, seeds: int | None, max_steps: int | None) -> str:
    """The hash every result of one row carries: the row's preset, its base's files, seeds, steps, the primary metric
    and the statistics. A row added by an amendment leaves the other rows' results valid; a changed row refuses its
    old results."""
    base = p.world.base if p.world is not None else ""
    later = holm_family(base)
    correction = f"holm over the deviation and inference rows of {later}, paired t p-values" if later else _FIRST_CORRECTION
    return _hash(
        {
            "format": PLAN_FORMAT,
            "row": p.to_dict(),
            "base": _base_digest(base) if base else "",
            "seeds": seeds,
            "max_steps": max_steps,
            "primary": _runner.PRIMARY,
            "alpha": ALPHA,
            "correction": correction,
            **({"draws": REDRAWN[p.name]} if p.name in REDRAWN else {}),
        }
    )


def accepted_hashes(p: Preset, *, seeds: int | None, max_steps: int | None) -> tuple[str, ...]:
    """The hashes a result of row ``p`` may carry: its present :func:`row_hash`, and for a row in :data:`EXTENDED` the
    hash it had with the seed count its first units ran under (the row otherwise unchanged)."""
    now = row_hash(p, seeds=seeds, max_steps=max_steps)
    if p.name not in EXTENDED:
        return (now,)
    then = replace(p, eval=replace(p.eval, seeds=EXTENDED[p.name]))
    return (now, row_hash(then, seeds=seeds, max_steps=max_steps))


def plan_hash(presets: Sequence[Preset], *, seeds: int | None, max_steps: int | None) -> str:
    """The table's hash: every row's hash (shown in the document; each result carries its own row's hash)."""
    return _hash({p.name: row_hash(p, seeds=seeds, max_steps=max_steps) for p in presets})


# ------------------------------------------------------------------------------------------- units
class Reuse(TypedDict):
    """A committed per-seed result whose arm B a unit takes (:func:`_reusable`): its path under the results' parent,
    the record as read (JSON) and why its arm B is this unit's."""

    file: str
    record: dict[str, Any]
    why: str


def arm_b_key(p: Preset, *, max_steps: int | None) -> str:
    """What arm B of one seed of row ``p`` is a function of: the profile, the world data, the finetune and evaluation
    settings, the base's files and the step count; not the baseline, which only arm A reads
    (:func:`te_align.ab.preset.train_config_dict`, :meth:`te_align.ab.preset.Preset.arm_profiles`), nor the row's
    name, seed count or first seed. Two rows with the same key train and score the same arm B for a seed, to the bit
    (the klein null's and positive control's arm B records agree in every field but their timings)."""
    d = p.to_dict()
    base = p.world.base if p.world is not None else ""
    return _hash(
        {
            "profile": d["profile"],
            "model": d["model"],
            "world": d["world"],
            "train": d["train"],
            "eval": {k: v for k, v in asdict(p.eval).items() if k not in ("seeds", "first_seed")},
            "base": _base_digest(base) if base else "",
            "max_steps": max_steps,
        }
    )


def _takes_shared_b(p: Preset) -> bool:
    """A row whose unit may take arm B from another row's committed result: not one whose arm A samples arm B's own
    LoRA (an inference row, a cut-prompt control: arm A needs the trained files) and not a re-drawn row."""
    return p.baseline.kind != "inference" and not p.baseline.cut_before and p.name not in REDRAWN


def _unit(args: tuple[str, int, str, int | None, str, str, Reuse | None]) -> JSONObject:
    """One seed of one row, in a worker process (single-threaded); returns the per-seed result. ``reuse``: the
    committed result whose arm B this unit takes instead of training it again (:data:`REDRAWN`)."""
    name, seed, out, max_steps, plan, device, reuse = args
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TE_ALIGN_THREADS", "1")
    _quiet.install()
    if _quiet.quiet():  # TE_ALIGN_QUIET=0 shows the libraries' bars
        import diffusers
        import transformers

        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.disable_progress_bar()
    p = next(x for x in matrix_presets() if x.name == name)
    if device and device != "cpu":
        p.train.setdefault("train", {})["device"] = device
    t0, c0 = time.perf_counter(), time.process_time()
    lines: list[str] = []
    done = {f"{seed}/B": _arm_state(reuse["record"], seed)} if reuse else None
    result = _runner.run_ab(p, seeds=1, first_seed=seed, out=out, max_steps=max_steps, plan=plan, report=False,
                            say=lines.append, done=done)
    rec = _seed_record(p, seed, result, plan, time.perf_counter() - t0, time.process_time() - c0, device or "cpu")
    samples = rec["samples"]
    assert isinstance(samples, dict)  # _seed_record writes {arm: [paths]}
    rec["samples"] = relative_samples(samples, Path(out).parent.parent)
    if reuse:
        rec["arm_b_from"] = {"file": reuse["file"], "plan": reuse["record"]["plan"], "why": reuse["why"]}
        rec["samples"]["B"] = [str(x) for x in reuse["record"].get("samples", {}).get("B", [])]  # stored relative
    return rec


def relative_samples(samples: dict[str, list[Any]], root: Path) -> dict[str, list[str]]:
    """This run's sample paths relative to the matrix folder ``root`` (OUT/<row>/seed-<s>/...), so a committed
    result names no machine path. Only paths this run wrote: a reused arm's are already relative to its own
    matrix folder (made relative again they climbed out of it, ``../../../<machine folder>/...``)."""
    return {arm: [os.path.relpath(f, root) for f in files] for arm, files in samples.items()}


def _arm_state(rec: dict[str, Any], seed: int) -> JSONObject:
    """Arm B of a committed per-seed result as an A/B state's trained and evaluated run (:func:`_unit`'s ``reuse``)."""
    b = rec["arms"]["B"]
    return {
        "seed": seed, "arm": "B", "trained": True, "evaluated": True, "dir": "", "steps": b["steps"],
        "seconds": b["train_seconds"], "cpu_seconds": b["train_cpu_seconds"], "shares": b.get("shares", ""),
        **{k: b[k] for k in ("losses", "val", "val_own", "curve", "probes", "probe_reads")},
    }


def _reusable(res_dir: Path, name: str, seed: int) -> Reuse | None:
    """The committed result of a :data:`REDRAWN` row's seed from before its amendment, whose arm B a re-run takes."""
    if name not in REDRAWN:
        return None
    folder = superseded_folder(name)
    f = res_dir.parent / folder / name / f"seed-{seed}.json"
    if not f.is_file():
        return None
    try:
        rec = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ABError(f"unreadable result ({e})", file=str(f)) from None
    return {"file": f"{folder}/{name}/{f.name}", "record": rec, "why": REDRAWN[name]}


def shared_b(
    p: Preset,
    seed: int,
    keys: Mapping[str, str],
    results: Path,
    done: Mapping[str, list[dict[str, Any]]],
    *,
    max_steps: int | None,
    machine: str,
) -> Reuse | None:
    """A current committed result (``done``, read from ``results``) of the same seed of another row whose arm B is
    this row's (``keys``: each row's :func:`arm_b_key` at ``max_steps``), which trained its arm B itself, on a machine
    like this one (``machine``: bit-identical arm B needs the same processor, torch and transformers); the first such
    row by name. ``None``: the unit trains its own arm B."""
    if not _takes_shared_b(p):
        return None
    steps = max_steps or int(p.train.get("train", {}).get("max_steps") or 0)
    for name in sorted(n for n, key in keys.items() if key == keys[p.name] and n != p.name):
        rec = next((d for d in done.get(name, []) if int(d["seed"]) == seed), None)
        if rec is None or "arm_b_from" in rec or rec.get("machine") != machine or int(rec["arms"]["B"]["steps"]) != steps:
            continue
        why = f"arm B is {name}'s: the same profile, world data, finetune and evaluation settings and base (one computation)"
        return {"file": f"{results.name}/{name}/seed-{seed}.json", "record": rec, "why": why}
    return None


def _machine() -> str:
    """Where a unit ran, for a result that may be computed on more than one machine: the processor's architecture
    and core count, Python, torch and transformers (float rounding differs between processors and torch builds)."""
    import torch
    import transformers

    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}")


def _seed_record(
    p: Preset, seed: int, result: ABResult, plan: str, seconds: float, cpu: float, device: str
) -> JSONObject:
    arms = {}
    for r in result.runs:
        arms[r.arm] = {
            "steps": r.steps,
            "train_seconds": r.seconds,
            "train_cpu_seconds": r.cpu_seconds,
            "shares": r.shares,
            "losses": r.losses,
            "val": r.val,
            "val_own": r.val_own,
            "curve": r.curve,
            "probes": r.probes,
            "probe_reads": r.probe_reads,
            "curve_mean": r.curve_mean,
        }
    return {
        "format": RESULT_FORMAT,
        "plan": plan,
        "preset": p.name,
        "seed": seed,
        "arms": arms,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "device": device,
        "machine": _machine(),
        "samples": {r.arm: r.probe_samples for r in result.runs},
    }


def row_result(p: Preset, out: Path, seeds: list[int], *, out_dir: Path | None = None) -> ABResult:
    """One row's :class:`~te_align.ab.runner.ABResult` over the given seeds, read from its unit folders
    (``out/<row>/seed-<s>/``), for a row-level report written into ``out_dir`` (default ``out/<row>``)."""
    out_dir = Path(out_dir or out / p.name)
    runs, divergence, profiles = [], [], {}
    for s in seeds:
        unit = out / p.name / f"seed-{s}"
        try:
            state = json.loads((unit / _runner.STATE_FILE).read_text(encoding="utf-8"))
            runs += [_runner._run_from(state["runs"][f"{s}/{arm}"]) for arm in ("A", "B")]
        except (OSError, ValueError, KeyError) as e:
            raise ABError(f"no finished A/B state for seed {s} ({e})", file=str(unit)) from None
        if not divergence:
            divergence = [Divergence(**{**d, "shape_a": tuple(d["shape_a"]), "shape_b": tuple(d["shape_b"])}) for d in state.get("divergence", [])]
            profiles = {arm: str(unit / "profiles" / f"{arm}.toml") for arm in ("A", "B")}
    out_dir.mkdir(parents=True, exist_ok=True)
    return _runner.ABResult(out_dir, p, len(seeds), runs, divergence, _runner.summarize(runs, seeds), profiles=profiles)


def _strict(data: object) -> object:
    """``data`` with every NaN or infinite float as None (null): strict JSON, which any reader parses."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _strict(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_strict(v) for v in data]
    return data


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_strict(json.loads(json.dumps(data, default=float))), indent=1, sort_keys=True, allow_nan=False)
    with atomic_file(path, "w", error=ABError) as f:
        f.write(text + "\n")


def read_results(results: Path, plan: str | Mapping[str, str | tuple[str, ...]] | None = None) -> dict[str, list[JSONObject]]:
    """Per-seed results by row name (seed order). A file that does not parse, or that belongs to another plan
    (``plan``: one hash for every file, or per row name its hash or the hashes it accepts, :func:`accepted_hashes`),
    is one clear error naming it."""
    out: dict[str, list[JSONObject]] = {}
    if not results.is_dir():
        return out
    for f in sorted(results.glob("*/seed-*.json")):
        try:
            d = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ABError(f"unreadable result ({e}); delete it to run that seed again", file=str(f)) from None
        if not isinstance(d, dict) or d.get("format") != RESULT_FORMAT or not isinstance(d.get("arms"), dict):
            raise ABError(f"not a te-align matrix result (format {RESULT_FORMAT}); delete it to run that seed again", file=str(f))
        want = plan.get(str(d.get("preset"))) if isinstance(plan, Mapping) else plan
        wanted = (want,) if want is None or isinstance(want, str) else want
        if plan is not None and d.get("plan") not in wanted:
            raise ABError(
                f"a result of another plan ({d.get('plan')}; this plan is {' or '.join(map(str, wanted))}): the row changed after it ran, so "
                "it cannot be mixed in; move the results folder away to start the new plan",
                file=str(f),
            )
        out.setdefault(str(d.get("preset")), []).append(d)
    for rows in out.values():
        rows.sort(key=lambda d: int(d["seed"]))
    return out


def _runs_of(records: list[JSONObject]) -> list[ArmRun]:
    runs = []
    for d in records:
        for arm in ("A", "B"):
            a = d["arms"][arm]
            r = _runner.ArmRun(seed=int(d["seed"]), arm=arm, steps=int(a["steps"]), seconds=float(a["train_seconds"]))
            r.losses = [(int(s), float(v)) for s, v in a["losses"]]
            r.val = [(int(s), float(v)) for s, v in a["val"]]
            r.val_own = [(int(s), float(v)) for s, v in a["val_own"]]
            r.curve = [(int(s), dict(c)) for s, c in a["curve"]]
            runs.append(r)
    return runs


def aggregate(presets: Sequence[Preset], results: dict[str, list[JSONObject]], *, planned: int | None) -> list[MatrixRow]:
    """The table: per row its paired summary over the seeds so far; the verdict once every planned seed is in (Holm
    across the deviation and inference rows, on the primary metric; controls unadjusted)."""
    rows: list[MatrixRow] = []
    for p in presets:
        assert p.world is not None
        b = p.baseline
        who = {"null": "(control)", "positive": "(control)", "inference": b.inference_tool}.get(b.kind, b.trainer)
        if b.hypothetical:
            who = "(hypothetical)"
        row = MatrixRow(
            p.name,
            b.kind,
            who,
            _deviation(p),
            p.world.base,
            planned=planned or p.eval.seeds,
            source=b.source,
            sample_as=b.sample_as if b.kind == "deviation" else "",
            overrides=dict(b.overrides),
            train=dict(b.train),
            profile=p.profile,
            holm_family=holm_family(p.world.base),
            hypothetical=b.hypothetical,
        )
        try:
            row.family = str(base_info(p.world.base)["family"])
        except BaseError:
            row.reason = f"the {p.world.base} world base is not shipped yet"
            rows.append(row)
            continue
        recs = results.get(p.name, [])
        row.seeds = len(recs)
        row.seconds = sum(float(d["seconds"]) for d in recs)
        row.cpu_seconds = sum(float(d["cpu_seconds"]) for d in recs)
        row.where = sorted({str(d.get("device", "cpu")) for d in recs})
        if recs:
            summary = _runner.summarize(_runs_of(recs), [int(d["seed"]) for d in recs])
            row.metrics = [
                {
                    "metric": r.metric,
                    "a_mean": r.a_mean,
                    "a_sd": r.a_sd,
                    "b_mean": r.b_mean,
                    "b_sd": r.b_sd,
                    "diff_mean": r.diff_mean,
                    "diff_sd": r.diff_sd,
                    "ci_low": r.ci_low,
                    "ci_high": r.ci_high,
                    "verdict": r.verdict,
                    "higher_better": r.higher_better,
                    "n": r.n,
                    "p_t": r.p_t,
                    "p_signflip": r.p_signflip,
                    "a": r.a,
                    "b": r.b,
                }
                for r in summary
            ]
            prim = next((r for r in summary if r.metric == _runner.PRIMARY), None)
            if prim is not None:
                row.sd_ratio = sd_ratio_interval(prim.a, prim.b)
        rows.append(row)
    def complete(r: MatrixRow) -> bool:
        return r.kind in ("deviation", "inference") and r.primary is not None and r.seeds >= r.planned

    for name in dict.fromkeys(r.holm_family for r in rows):
        family = [r for r in rows if r.holm_family == name and complete(r)]
        ps = [float(r.primary["p_t"]) for r in family]  # type: ignore[index]
        for r, adj, c in zip(family, holm(ps), holm_multipliers(ps), strict=True):
            r.p_holm, r.holm_factor = adj, c
    everyone = [r for r in rows if complete(r)]
    ps = [float(r.primary["p_t"]) for r in everyone]  # type: ignore[index]
    for r, adj, c in zip(everyone, holm(ps), holm_multipliers(ps), strict=True):
        r.p_holm_all, r.holm_factor_all = adj, c
    noise = _spreads(rows)
    sizes = {name: sum(1 for r in rows if r.holm_family == name and complete(r)) for name in dict.fromkeys(r.holm_family for r in rows)}
    for r in rows:
        m = r.primary
        r.verdict = _verdict(r, r.p_holm, m)
        r.verdict_all = _verdict(r, r.p_holm_all, m)
        if m is None or r.reason:
            continue
        diffs = [x - y for x, y in zip(m["a"], m["b"], strict=True)]
        n = int(m["n"])
        r.tests_disagree = not _degenerate(m) and (float(m["p_t"]) < ALPHA) != (float(m["p_signflip"]) < ALPHA)
        s = noise[instrument_2_family(r.base)]
        r.mde_unadjusted = smallest_detectable(s, n, ALPHA, POWER)
        if r.kind in ("deviation", "inference"):
            r.adj_ci = t_interval(diffs, ALPHA / r.holm_factor) if r.holm_factor > 0 else (math.nan, math.nan)
            r.adj_ci_all = t_interval(diffs, ALPHA / r.holm_factor_all) if r.holm_factor_all > 0 else (math.nan, math.nan)
            r.mde = smallest_detectable(s, n, ALPHA / max(1, sizes.get(r.holm_family, 1)), POWER)
            r.mde_all = smallest_detectable(s, n, ALPHA / max(1, len(everyone)), POWER)
        else:
            r.adj_ci = r.adj_ci_all = (float(m["ci_low"]), float(m["ci_high"]))
            r.mde = r.mde_all = r.mde_unadjusted
    gate = next((r for r in rows if r.preset == GATE), None)
    if gate is not None:
        for r in rows:
            if r.kind not in ("deviation", "inference"):
                continue
            for attr in ("verdict", "verdict_all"):
                v = getattr(r, attr)
                if v.startswith((PENDING, "not run")) or v == NO_VERDICT:
                    continue
                if gate.verdict.startswith(PENDING):
                    setattr(r, attr, f"{PENDING} (the gating positive control, {GATE})")
                elif gate.verdict != PROFILE_BETTER:
                    setattr(r, attr, UNINFORMATIVE)
    _instrument_2(rows)
    return rows


def _fv(m: JSONObject, key: str) -> float:
    """A number of a metric's record (NaN where it holds none)."""
    v = m.get(key)
    return float(v) if isinstance(v, (int, float)) else math.nan


def _lv(m: JSONObject, key: str) -> list[float]:
    """A list of numbers of a metric's record (the per-seed values of an arm)."""
    v = m.get(key)
    return [float(x) for x in v if isinstance(x, (int, float))] if isinstance(v, list) else []


def _instrument_2(rows: Sequence[MatrixRow]) -> None:
    """Amendment 11's readout on every row: one Holm family of the complete deviation and inference rows, controls
    unadjusted, every deviation and inference verdict gated by :data:`GATE_2` (pending until it is complete,
    uninformative unless it reads "profile better"). Rows on a base of :data:`INSTRUMENT_2_PRIMARY` read it as their
    pre-registered primary: Holm over their base's rows, gated by their base's positive control, noise from their
    base's null control."""
    def complete(r: MatrixRow) -> bool:
        return r.kind in ("deviation", "inference") and r.final_net is not None and r.seeds >= r.planned and not r.reason

    spread = _spreads(rows, _runner.FINAL_NET)
    for name in spread:
        group = [r for r in rows if instrument_2_family(r.base) == name]
        family = [(r, m) for r in group if complete(r) and (m := r.final_net) is not None]
        ps = [_fv(m, "p_t") for _, m in family]
        for (r, _), adj, c in zip(family, holm(ps), holm_multipliers(ps), strict=True):
            r.p_holm_2, r.holm_factor_2 = adj, c
        noise = spread[name]
        for r in group:
            m = r.final_net
            r.confirmatory_2 = r.preset in CONFIRMATORY_2 or r.kind in ("positive", "null") or bool(name)
            r.verdict_2 = _verdict(r, r.p_holm_2, m)
            if m is None or r.reason:
                continue
            n = int(_fv(m, "n"))
            r.tests_disagree_2 = not _degenerate(m) and (_fv(m, "p_t") < ALPHA) != (_fv(m, "p_signflip") < ALPHA)
            if r.kind in ("deviation", "inference"):
                diffs = [x - y for x, y in zip(_lv(m, "a"), _lv(m, "b"), strict=True)]
                r.adj_ci_2 = t_interval(diffs, ALPHA / r.holm_factor_2) if r.holm_factor_2 > 0 else (math.nan, math.nan)
                r.mde_2 = smallest_detectable(noise, n, ALPHA / max(1, len(family)), POWER)
            else:
                r.adj_ci_2 = (_fv(m, "ci_low"), _fv(m, "ci_high"))
                r.mde_2 = smallest_detectable(noise, n, ALPHA, POWER)
    for r in rows:
        v = r.verdict_2
        if r.kind not in ("deviation", "inference") or v.startswith((PENDING, "not run")) or v == NO_VERDICT:
            continue
        name = INSTRUMENT_2_PRIMARY.get(r.base, GATE_2)
        gate = next((x for x in rows if x.preset == name), None)
        if gate is None or gate.verdict_2.startswith((PENDING, "not run")):
            r.verdict_2 = f"{PENDING} (instrument 2's confirmatory control, {name})"
        elif gate.verdict_2 != PROFILE_BETTER:
            r.verdict_2 = f"uninformative (instrument 2's confirmatory control, {name}, was not seen)"


def _degenerate(m: JSONObject) -> bool:
    """Fewer than 2 seeds or no spread across seeds (:attr:`te_align.ab.stats.PairedSummary.degenerate`)."""
    return int(m["n"]) < 2 or not float(m["diff_sd"]) > 0


def _verdict(r: MatrixRow, p_holm: float, m: JSONObject | None) -> str:
    """A row's verdict on the readout ``m`` (its primary metric, or instrument 2's) with ``p_holm`` (deviation and
    inference rows) or its own p (controls, unadjusted): pending until every planned seed is in, none for a
    degenerate difference."""
    if r.reason:
        return "not run"
    if m is None:
        return PENDING + f" (0 of {r.planned} seeds)"
    if r.seeds < r.planned:
        return PENDING + f" ({r.seeds} of {r.planned} seeds)"
    if _degenerate(m):
        return NO_VERDICT
    p = p_holm if r.kind in ("deviation", "inference") else float(m["p_t"])
    if math.isnan(p) or p >= ALPHA:
        return NO_DIFFERENCE
    a_higher = m["diff_mean"] > 0
    return TRAINER_BETTER if a_higher == m["higher_better"] else PROFILE_BETTER


def _spreads(rows: Sequence[MatrixRow], metric: str = _runner.PRIMARY) -> dict[str, float]:
    """:func:`_null_spread` per instrument-2 family (:func:`instrument_2_family`), the nulls a row's noise comes from:
    ``""`` pools the first plan's nulls (SD3, Flux; bases without a null of their own borrow it), a base of
    :data:`INSTRUMENT_2_PRIMARY` has its own null, on every readout."""
    families = dict.fromkeys(instrument_2_family(r.base) for r in rows)
    return {f: _null_spread([r for r in rows if instrument_2_family(r.base) == f], metric) for f in families}


def _null_spread(rows: Sequence[MatrixRow], metric: str = _runner.PRIMARY) -> float:
    """The spread of one seed's difference A - B when nothing differs: the pooled standard deviation of the
    complete null controls' per-seed differences on ``metric`` (variances weighted by their degrees of
    freedom). NaN without a complete null control."""
    num = den = 0.0
    for r in rows:
        m = next((x for x in r.metrics if x["metric"] == metric), None)
        if r.kind != "null" or m is None or r.seeds < r.planned or int(m["n"]) < 2:
            continue
        num += (int(m["n"]) - 1) * float(m["diff_sd"]) ** 2
        den += int(m["n"]) - 1
    return math.sqrt(num / den) if den else math.nan


def shared_arm_b(rows: Sequence[MatrixRow]) -> list[list[str]]:
    """Groups of two or more complete rows whose arm B gave the same per-seed primary values: one set of arm-B
    runs shared by those rows (same base, same arm-B settings, same seeds)."""
    groups: dict[tuple[object, ...], list[str]] = {}
    for r in rows:
        m = r.primary
        if m is None or r.reason:
            continue
        groups.setdefault((r.base, *m["b"]), []).append(r.preset)
    return [g for g in groups.values() if len(g) > 1]


# --------------------------------------------------------------------------------------------- run
def seed_range(p: Preset, seeds: int | None = None) -> range:
    """The seeds of a row's units: ``eval.first_seed`` on, ``seeds`` (or the preset's ``eval.seeds``) of them."""
    return range(p.eval.first_seed, p.eval.first_seed + (seeds or p.eval.seeds))


def run_matrix(
    out: str | Path = "te-align-matrix",
    *,
    only: Sequence[str] = (),
    seeds: int | None = None,
    max_steps: int | None = None,
    doc: str | Path | None = None,
    results: str | Path | None = None,
    summary: str | Path | None = None,
    strips: str | Path | None = None,
    workers: int = 1,
    device: str = "cpu",
    dry_run: bool = False,
    say: Callable[[str], None] = print,
    progress: Progress | None = None,
) -> list[MatrixRow]:
    """Run the plan's units not yet done (or those of the rows in ``only``) and rebuild the table after each.
    ``progress`` shows each running unit's phase and the ETA (:mod:`te_align.ab.progress`)."""
    t0 = time.perf_counter()
    presets = matrix_presets()
    names = {p.name for p in presets}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ABError(f"no world preset {unknown[0]!r}; known: {', '.join(sorted(names))}", key="--only")
    if seeds is not None and seeds < 1:
        raise ABError(f"must be >= 1, got {seeds}", key="--seeds")
    if workers < 1:
        raise ABError(f"must be >= 1, got {workers}", key="--workers")
    accepted = {p.name: accepted_hashes(p, seeds=seeds, max_steps=max_steps) for p in presets}
    rows_hash = {name: hashes[0] for name, hashes in accepted.items()}  # each row's present hash
    plan = _hash(rows_hash)  # plan_hash(presets, ...), from the hashes already computed
    out_dir = Path(out).expanduser()
    res_dir = Path(results).expanduser() if results is not None else out_dir / "results"
    done = read_results(res_dir, accepted)
    chosen = [p for p in presets if not only or p.name in only]
    ready = set(shipped())
    units: list[tuple[str, int]] = []
    for p in chosen:
        for s in seed_range(p, seeds):
            if p.world is not None and p.world.base in ready and not any(int(d["seed"]) == s for d in done.get(p.name, [])):
                units.append((p.name, s))
    # controls first: every control seed before any deviation seed
    units.sort(key=lambda u: (KIND_ORDER[next(p for p in presets if p.name == u[0]).baseline.kind] > 1, u[1]))
    say(f"plan {plan}: {len(units)} unit(s) to run (row x seed), {sum(len(v) for v in done.values())} done; results in {res_dir}")

    def publish() -> list[MatrixRow]:
        current = read_results(res_dir, accepted)
        shown = documented(chosen if only else presets, current)
        shown_plan = plan_hash(shown, seeds=seeds, max_steps=max_steps) if len(shown) < len(chosen if only else presets) else plan
        rows = aggregate(shown, current, planned=seeds)
        before = superseded_rows(shown, current, res_dir, planned=seeds)
        gate_new_verdicts(rows, before)
        command = _command(seeds, max_steps)
        text = render_effects(rows, command=command, plan=shown_plan, strips=Path(strips) if strips else None,
                              doc=Path(doc) if doc else None, before=before)
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_file(out_dir / "matrix.md", "w", error=ABError) as f:
            f.write(text)
        _write_json(out_dir / "matrix.json", {"plan": shown_plan, "command": command, "rows": [r.__dict__ for r in rows]})
        if doc is not None:
            with atomic_file(Path(doc), "w", error=ABError) as f:
                f.write(text)
        if summary is not None:
            _write_json(Path(summary), summary_of(rows, shown_plan, before=before))
        return rows

    if dry_run or not units:
        if strips is not None:  # the strips again, from the units' samples where this machine has them
            for recs in read_results(res_dir, accepted).values():
                for rec in recs:
                    if rec["seed"] == 0 and all(f.is_file() for arm in ("A", "B") for f in _samples(rec, arm, out_dir)):
                        _strip(rec, Path(strips), out_dir)
        return publish()
    by_name = {p.name: p for p in presets}
    machine = _machine() if any(_takes_shared_b(by_name[name]) for name, _ in units) else ""
    keys = {p.name: arm_b_key(p, max_steps=max_steps) for p in presets} if machine else {}
    tasks = [(name, s, str(out_dir / name / f"seed-{s}"), max_steps, rows_hash[name], device,
              _reusable(res_dir, name, s) or shared_b(by_name[name], s, keys, res_dir, done, max_steps=max_steps, machine=machine))
             for name, s in units]  # fmt: skip
    finished = 0
    if progress is not None:
        progress.plan([(f"{name} seed {s}", Path(folder), s, steps or int(by_name[name].train.get("train", {}).get("max_steps") or 0),
                        ("A",) if reuse else
                        ("B", "A") if by_name[name].baseline.kind == "inference" or by_name[name].baseline.cut_before else ("A", "B"))
                       for name, s, folder, steps, _plan, _device, reuse in tasks], workers=workers)  # fmt: skip

    def collect(rec: JSONObject) -> None:
        nonlocal finished
        finished += 1
        _write_json(res_dir / rec["preset"] / f"seed-{rec['seed']}.json", rec)
        if progress is not None:
            progress.unit_done(f"{rec['preset']} seed {rec['seed']}")
        if strips is not None and rec["seed"] == 0:
            _strip(rec, Path(strips), out_dir)
        say(
            f"[{finished}/{len(tasks)}] {rec['preset']} seed {rec['seed']}: primary A {rec['arms']['A']['curve_mean']:+.3f}, "
            f"B {rec['arms']['B']['curve_mean']:+.3f} ({rec['seconds']:.0f} s, {time.perf_counter() - t0:.0f} s so far)"
        )
        publish()

    if workers == 1:
        for t in tasks:
            collect(_unit(t))
    else:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            pending = {pool.submit(_unit, t) for t in tasks}
            while pending:
                ready_f, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready_f:
                    collect(fut.result())
    return publish()


def documented(presets: Sequence[Preset], results: dict[str, list[JSONObject]]) -> list[Preset]:
    """The rows the table shows (``matrix.md``, the document, the summary): once any row has a result, the rows with
    at least one; a row an amendment adds (the klein rows, issue 49) appears with its first result, so the document
    and the summary stay as they were until then. A study without any result yet shows its whole plan."""
    started = [p for p in presets if results.get(p.name)]
    return started or list(presets)


def superseded_rows(
    presets: Sequence[Preset], current: dict[str, list[JSONObject]], res_dir: Path, *, planned: int | None
) -> list[MatrixRow]:
    """The table as it stood before amendments 9 and 11: the :data:`REDRAWN` rows from their results on record
    (:func:`superseded_folder` beside the results folder), every other row from its current results (unchanged by the
    amendments). Empty when no such result is on record."""
    old = {}
    for name in REDRAWN:
        files = sorted((res_dir.parent / superseded_folder(name) / name).glob("seed-*.json"))
        if files:
            old[name] = sorted((json.loads(f.read_text(encoding="utf-8")) for f in files), key=lambda d: int(d["seed"]))
    if not old:
        return []
    return aggregate(presets, {**current, **old}, planned=planned)


def gate_new_verdicts(rows: Sequence[MatrixRow], before: Sequence[MatrixRow]) -> None:
    """Amendment 10: the verdicts new since amendment 9 (:func:`_changed`) wait for :data:`AXIS_GATE` to read
    "profile better" (pending until it is complete; uninformative if it reads otherwise). No-op without that row or
    without results on record from before amendment 9."""
    gate = next((r for r in rows if r.preset == AXIS_GATE), None)
    if gate is None or not before:
        return
    new = {r.preset for _, r in _changed(before, rows)}
    for r in rows:
        if r.kind not in ("deviation", "inference") or r.preset not in new:
            continue
        for attr in ("verdict", "verdict_all"):
            v = getattr(r, attr)
            if v.startswith((PENDING, "not run", "uninformative")) or v == NO_VERDICT:
                continue
            if gate.verdict != PROFILE_BETTER:
                waiting = gate.verdict.startswith((PENDING, "not run"))
                setattr(r, attr, f"{PENDING} (the positive control on the deviations' axis, {AXIS_GATE})" if waiting else UNINFORMATIVE_AXIS)


def _changed(before: Sequence[MatrixRow], rows: Sequence[MatrixRow]) -> list[tuple[MatrixRow, MatrixRow]]:
    """(before, now) of every row re-drawn by amendment 9 or whose verdict (either family) differs from before it."""
    now = {r.preset: r for r in rows}
    return [(b, now[b.preset]) for b in before if b.preset in now
            and (b.preset in REDRAWN or (b.verdict, b.verdict_all) != (now[b.preset].verdict, now[b.preset].verdict_all))]


def _before_section(before: Sequence[MatrixRow], rows: Sequence[MatrixRow]) -> list[str]:
    pairs = _changed(before, rows)
    if not pairs:
        return []
    lines = [
        "",
        "## Before amendments 9 and 11: the verdicts on record",
        "",
        "Before amendment 9 of the plan, arm A of the rows that remove SD3's per-encoder dropout drew no dropout numbers "
        "from the training step's random stream, so it trained on other timesteps than arm B (the noise, data order and "
        "LoRA initialisation were shared). Before amendment 11, arm A of the rows that chunk long captions trained on "
        "other batches than arm B (the trainer grouped a batch by its captions' chunk count). Each amendment gives both "
        "arms the same draws and re-runs those arms A; arm B is unchanged and taken from the same seeds' results. The "
        f"earlier results stay on record in `benchmarks/effects/{SUPERSEDED}/` and `benchmarks/effects/{SUPERSEDED_11}/`; "
        "below, each re-drawn row and each row whose verdict moved with them (Holm families share rows), as it read then "
        "and as it reads now.",
        "",
        "| row | seeds then | A - B then [95% CI] | p (Holm) then | verdict then | all-rows verdict then | A - B now [95% CI] | "
        "verdict now | all-rows verdict now |",
        "|---|---:|---|---:|---|---|---|---|---|",
    ]
    for b, r in pairs:
        mb, mr = b.primary, r.primary
        lines.append(
            f"| {b.preset} | {b.seeds} | {_ci(mb) if mb else ''} | {_p(b.p_holm)} | {b.verdict} | {b.verdict_all} | "
            f"{_ci(mr) if mr else ''} | {r.verdict} | {r.verdict_all} |"
        )
    return lines


def _command(seeds: int | None, max_steps: int | None) -> str:
    return (
        "te-align ab matrix"
        + (f" --seeds {seeds}" if seeds else "")
        + (f" --max-steps {max_steps}" if max_steps else "")
        + " --workers 2 --results benchmarks/effects/results --doc docs/effects.md --summary te_align/ab/data/effects.json"
        " --strips docs/effects"
    )


def _samples(rec: JSONObject, arm: str, out_dir: Path) -> list[Path]:
    """A result's final probe images of one arm (stored relative to the matrix folder)."""
    return [out_dir / f for f in rec.get("samples", {}).get(arm) or []]


def _strip(rec: JSONObject, folder: Path, out_dir: Path) -> Path | None:
    """A sample strip of one seed: arm A's final probe images above arm B's, with what each prompt asked."""
    from PIL import Image

    a, b = _samples(rec, "A", out_dir), _samples(rec, "B", out_dir)
    probes = rec["arms"]["A"].get("probes") or []
    if not a or not b or not probes or not all(f.is_file() for f in a + b):  # a re-drawn row's arm B has no images here
        return None
    short = [i for i, q in enumerate(probes) if q["length"] == "short"]
    concept = [i for i in short if probes[i]["objects"][0][3]]
    pick = concept[:6] + [i for i in short if not probes[i]["objects"][0][3]][:2]
    images, labels = [], []
    for arm, files in (("A", a), ("B", b)):
        for i in pick:
            with Image.open(files[i]) as im:
                images.append(im.convert("RGB").copy())
            o = probes[i]["objects"][0]
            labels.append(f"{arm}: {o[0]} {o[1]}, {o[2]}")
    path = folder / f"{rec['preset']}.png"
    folder.mkdir(parents=True, exist_ok=True)
    img = grid(images, labels, columns=len(pick), scale=3)
    tmp = path.with_suffix(".png.partial")
    img.save(tmp, format="PNG")
    tmp.replace(path)
    return path


def family_name(r: MatrixRow) -> str:
    """The pre-registered Holm family of a row, in words."""
    return r.holm_family or "the first plan's deviation and inference rows"


def summary_of(rows: Sequence[MatrixRow], plan: str, *, before: Sequence[MatrixRow] = ()) -> JSONObject:
    """What ``te-align check`` reads: per measured row its deviation, trainer, family, the primary-metric result in
    both Holm families (pre-registered and all rows) with each interval in its verdict's terms, the smallest
    detectable effect, the secondary metrics (unadjusted) and the rows it shares arm B with. Strict JSON: a
    missing number is null."""
    shared = {name: g for g in shared_arm_b(rows) for name in g}
    out = []
    for r in rows:
        m = r.primary
        secondary = {}
        for prefix, key in SECONDARIES:
            x = next((x for x in r.metrics if x["metric"].startswith(prefix)), None)
            if x is not None:
                secondary[key] = {k: x[k] for k in ("diff_mean", "ci_low", "ci_high", "p_t", "n", "higher_better", "verdict")}
                secondary[key]["terms"] = "unadjusted 95% t interval (a secondary metric: no pre-registered verdict)"
        out.append(
            {
                "preset": r.preset,
                "kind": r.kind,
                "trainer": r.trainer,
                "family": r.family,
                "profile": r.profile,
                "base": r.base,
                "overrides": r.overrides,
                "train": r.train,
                "source": r.source,
                "deviation": r.deviation,
                "verdict": r.verdict,
                "seeds": r.seeds,
                "planned": r.planned,
                "primary": None
                if m is None
                else {
                    k: m[k] for k in ("a_mean", "b_mean", "diff_mean", "ci_low", "ci_high", "p_t", "p_signflip", "n")
                },
                "p_holm": r.p_holm,
                "holm_family": family_name(r) if r.kind in ("deviation", "inference") else "",
                "adjusted_ci": list(r.adj_ci),
                "ci_terms": _terms(r, r.holm_factor, family_name(r)),
                "verdict_all": r.verdict_all,
                "p_holm_all": r.p_holm_all,
                "adjusted_ci_all": list(r.adj_ci_all),
                "ci_terms_all": _terms(r, r.holm_factor_all, ALL_ROWS),
                "family_differs": r.verdict != r.verdict_all,
                "tests_disagree": r.tests_disagree,
                "mde": r.mde,
                "mde_all": r.mde_all,
                "mde_unadjusted": r.mde_unadjusted,
                "secondary": secondary,
                "shares_arm_b_with": [x for x in shared.get(r.preset, []) if x != r.preset],
                **({"hypothetical": True} if r.hypothetical else {}),
                "instrument_2": None if r.final_net is None else {
                    **{k: _fv(r.final_net, k) for k in ("a_mean", "b_mean", "diff_mean", "ci_low", "ci_high", "p_t", "p_signflip")},
                    "n": int(_fv(r.final_net, "n")),
                    "p_holm": r.p_holm_2,
                    "adjusted_ci": list(r.adj_ci_2),
                    "ci_terms": _terms(r, r.holm_factor_2, instrument_2_family(r.base) or ALL_ROWS),
                    "verdict": r.verdict_2,
                    "mde": r.mde_2,
                    "tests_disagree": r.tests_disagree_2,
                    "confirmatory": r.confirmatory_2,
                    "metric": _runner.FINAL_NET,
                    **({"primary": True, "holm_family": instrument_2_family(r.base)} if r.base in INSTRUMENT_2_PRIMARY else {}),
                },
            }
        )
    summary: JSONObject = {"format": 1, "plan": plan, "document": "docs/effects.md", "alpha": ALPHA, "power": POWER, "rows": out}
    pairs = _changed(before, rows)
    if pairs:  # the verdicts on record before amendment 9, beside the current ones
        on_record: list[JSONValue] = [
            {
                "preset": b.preset, "seeds": b.seeds, "verdict": b.verdict, "verdict_all": b.verdict_all,
                "p_holm": b.p_holm, "p_holm_all": b.p_holm_all,
                "primary": None if b.primary is None else {k: b.primary[k] for k in ("diff_mean", "ci_low", "ci_high", "p_t", "n")},
            }
            for b, _ in pairs
        ]
        summary["before_amendment_9"] = on_record
    return summary


def _terms(r: MatrixRow, factor: float, family: str) -> str:
    """How an interval beside a verdict was made, in words."""
    if r.kind not in ("deviation", "inference"):
        return "unadjusted 95% t interval (a control, read unadjusted)"
    if math.isnan(factor):
        return "none (no verdict yet, or a degenerate difference)"
    return (f"Holm-adjusted over {family}: the t interval at {100 * (1 - ALPHA / factor):.2f}% "
            f"(the level its Holm test was held to)")


# ------------------------------------------------------------------------------------------ render
def _num(v: float, spread: float) -> str:
    return round_to_spread(v, spread)


def _ci(m: JSONObject, scale: float = 1.0) -> str:
    if math.isnan(m["ci_low"]):
        why = "1 seed" if int(m.get("n", 0)) < 2 else "no spread: no interval"
        return f"{_num(scale * m['diff_mean'], float('nan'))} ({why})"
    half = scale * (m["ci_high"] - m["ci_low"]) / 2
    return f"{_num(scale * m['diff_mean'], half)} [{_num(scale * m['ci_low'], half)}, {_num(scale * m['ci_high'], half)}]"


def _adj(r: MatrixRow, ci: tuple[float, float], metric: Mapping[str, Any] | None = None) -> str:
    """A row's difference (``metric``, default its primary) with an interval in its verdict's terms
    (``adj_ci``/``adj_ci_all``/``adj_ci_2``)."""
    m = r.primary if metric is None else metric
    if m is None:
        return ""
    return _ci({"diff_mean": m["diff_mean"], "ci_low": ci[0], "ci_high": ci[1], "n": m["n"]})


def _p(v: float) -> str:
    return "n/a" if math.isnan(v) else (f"{v:.3f}" if v >= 0.001 else "<0.001")


def _primary_2(r: MatrixRow) -> str:
    """For a control of a base whose rows read instrument 2 as their primary: that this table's reading is their
    secondary, and what their primary reads (its verdict is in instrument 2's section)."""
    if r.base not in INSTRUMENT_2_PRIMARY or not r.verdict_2:
        return ""
    return (f"; this readout is a secondary for the {r.base} rows, whose primary is instrument 2, where this control "
            f"reads {r.verdict_2}")


def _reading(rows: Sequence[MatrixRow]) -> list[str]:
    """The plain reading of the table, computed from the verdicts (no hand-written conclusion): the controls (one
    still running is named pending), then per Holm family, once every row of it has all its seeds, its deviation and
    inference rows grouped by verdict (each row's verdict already waits for the control that gates it). Nothing
    before some family is complete."""
    out = ["", "## Reading", ""]
    controls = [r for r in rows if not r.reason and r.kind in ("null", "positive")]
    if not controls:
        return []
    for r in controls:
        if r.seeds < r.planned:
            what = "Null control" if r.kind == "null" else "Positive control"
            out.append(f"- {what} **{r.preset}**: pending ({r.seeds} of {r.planned} seeds).")
        elif r.kind == "null":
            fp = "a false positive: the instrument reads noise as an effect" if r.verdict != NO_DIFFERENCE else "as it must"
            out.append(f"- Null control **{r.preset}**: {r.verdict} ({fp}){_primary_2(r)}.")
        else:
            seen = "the instrument sees it" if r.verdict == PROFILE_BETTER else "the instrument does not resolve it"
            gate = " (the gate of the deviation rows)" if r.preset == GATE else ""
            out.append(f"- Positive control **{r.preset}**{gate}: {r.verdict}; {seen}{_primary_2(r)}.")
    families: dict[str, list[MatrixRow]] = {}
    for r in rows:
        if not r.reason and r.kind in ("deviation", "inference"):
            families.setdefault(r.holm_family, []).append(r)
    if not any(all(r.seeds >= r.planned for r in ran) for ran in families.values()):
        return []
    # the first plan's family first, then the amendments' in the order they were added (not the rows' order)
    order = ["", *LATER_FAMILIES.values()]
    for name, ran in sorted(families.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
        if name:
            rows_word = "row" if len(ran) == 1 else "rows"
            out += ["", f"Adjusted on their own (Holm over {len(ran)} {rows_word}), {name}:", ""]
        if any(r.seeds < r.planned for r in ran):
            done = sum(r.seeds >= r.planned for r in ran)
            out.append(f"- Not read yet: {done} of {len(ran)} rows have all their seeds.")
            continue
        out += _family_reading(ran)
    return out


#: The Reading's verdicts in their order, with what each says.
_VERDICTS_SAY: tuple[tuple[str, str], ...] = (
    (PROFILE_BETTER, "the profile's recipe gave the better LoRA"),
    (TRAINER_BETTER, "the trainer's or tool's setting gave the better LoRA"),
    (NO_DIFFERENCE, "no difference this study resolves; each interval bounds what it could have missed"),
    (NO_VERDICT, "a degenerate difference"),
)


def _family_reading(family: Sequence[MatrixRow]) -> list[str]:
    """One Holm family's deviation and inference rows grouped by verdict. A family pre-registered on instrument 2
    (:data:`INSTRUMENT_2_PRIMARY`) is read on it, its curve mean listed after as the secondary it is."""
    if family and all(r.base in INSTRUMENT_2_PRIMARY for r in family):
        return _family_reading_2(family)
    out: list[str] = []
    if any(r.verdict == UNINFORMATIVE for r in family):
        out.append(
            f"- The {len(family)} deviation and inference rows are uninformative: the gating positive control "
            "was not seen."
        )
        return out
    out.append("- Intervals here are Holm-adjusted, in the verdict's terms (the table's adjusted column).")
    for verdict, says in _VERDICTS_SAY:
        named = [r for r in family if r.verdict == verdict]
        if verdict == NO_VERDICT and not named:
            continue
        listing = ", ".join(f"{r.preset} ({_adj(r, r.adj_ci)})" for r in named if r.primary) or "none"
        out.append(f"- **{verdict}** ({len(named)} of {len(family)}: {says}): {listing}.")
    leaning = [
        r.preset
        for r in family
        if r.verdict == NO_DIFFERENCE and r.primary and (r.primary["ci_low"] > 0 or r.primary["ci_high"] < 0)
    ]
    if leaning:
        out.append(
            f"- The table's unadjusted 95% intervals: {len(leaning)} of the rows read "
            f"{NO_DIFFERENCE!r} ({', '.join(leaning)}) have an unadjusted interval that excludes 0 but a p-value "
            "that does not survive Holm's adjustment (their adjusted interval contains 0); they are leads for a "
            "larger study, not findings."
        )
    return out


def _family_reading_2(family: Sequence[MatrixRow]) -> list[str]:
    """The reading of a family whose pre-registered primary is instrument 2 (the klein rows): its verdicts, with the
    intervals in their terms, then the table's curve mean as a secondary."""
    gate = INSTRUMENT_2_PRIMARY[family[0].base]
    out = [f"- Read on their pre-registered primary, instrument 2 (concept net accuracy at 300 steps; its section below; "
           f"gated by {gate}). Intervals Holm-adjusted, in the verdict's terms."]  # fmt: skip
    verdicts = _VERDICTS_SAY[:3]  # a degenerate one is listed with the others below
    for verdict, says in verdicts:
        named = [r for r in family if r.verdict_2 == verdict and r.final_net]
        listing = ", ".join(f"{r.preset} ({_adj(r, r.adj_ci_2, r.final_net)})" for r in named) or "none"
        out.append(f"- **{verdict}** ({len(named)} of {len(family)}: {says}): {listing}.")
    other = [r for r in family if r.verdict_2 not in {v for v, _ in verdicts}]
    if other:
        out.append("- Otherwise: " + "; ".join(f"{r.preset}: {r.verdict_2}" for r in other) + ".")
    secondary = "; ".join(f"{r.preset} {r.verdict} ({_adj(r, r.adj_ci)})" for r in family if r.primary)
    out.append(f"- The table's curve mean, a secondary for these rows (not what they were pre-registered on): {secondary}.")
    return out


def _mde(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.3f}"


def _flags(r: MatrixRow) -> str:
    """Marks beside a verdict: † its verdict differs in the all-rows family, ‡ the t and sign-flip tests disagree."""
    out = ""
    if r.kind in ("deviation", "inference") and r.verdict_all and r.verdict != r.verdict_all:
        out += " †"
    if r.tests_disagree:
        out += " ‡"
    return out


def _added_statistics(rows: Sequence[MatrixRow]) -> list[str]:
    """The second reading and the notes issue 47 asked for, computed from the same per-seed results: one Holm family
    of all deviation and inference rows, the rows whose verdict differs, the rows where the two tests disagree, the
    smallest detectable effect, degenerate differences and the shared arm-B runs."""
    done = [r for r in rows if r.primary is not None and not r.reason]
    if not done:
        return []
    everyone = [r for r in done if r.kind in ("deviation", "inference") and r.seeds >= r.planned]
    nulls = [r for r in done if r.kind == "null" and r.seeds >= r.planned and not instrument_2_family(r.base)]
    noise = _spreads(rows).get("", math.nan)
    n_seeds = max((int(r.primary["n"]) for r in done if r.primary), default=0)  # type: ignore[index]
    out = [
        "",
        "## Statistics added after the results (issue 47)",
        "",
        "Added after every verdict above was published; they change no pre-registered verdict (the rows' hashes and "
        "the table's verdict column are as planned). Each is computed by `te-align ab matrix` from the committed "
        "per-seed results.",
        "",
        f"- **One Holm family of all {len(everyone)} deviation and inference rows.** The plan adjusted the first "
        "plan's rows as one family and each amendment's rows as a family of their own (amendments 7 and 8), a rule set "
        "after the first verdicts were published. Below, every deviation and inference row is adjusted in one family; "
        "a row whose verdict differs between the two readings is marked † in the table and in `te-align check`.",
        "- **Intervals in the verdict's terms.** Holm's step-down procedure tests each row at its own level: its p is "
        "multiplied by a factor c (the adjusted p before capping at 1, divided by the row's own p). The adjusted "
        "interval is the paired t interval at confidence 1 - 0.05 / c; it excludes 0 exactly when the Holm-adjusted p "
        "is below 0.05, so a verdict and its interval never contradict each other. Controls are read unadjusted and "
        "show the plain 95% interval.",
        "- **t test and sign-flip test.** A row where one of the two (unadjusted, at 0.05) rejects and the other does "
        "not is marked ‡: the plan promised that note (bench_effects.md, *Statistics and verdicts*). With "
        f"{n_seeds} seeds the sign-flip test's smallest p is {2 / 2 ** n_seeds if n_seeds else float('nan'):.4f}.",
        "- **Degenerate differences.** A difference with fewer than 2 seeds, or the same value on every seed (zero "
        "spread), gets no interval, no t p-value and no verdict (`" + NO_VERDICT + "`), not p = 0 and a zero-width "
        "interval.",
        f"- **Smallest detectable effect.** The null controls ({', '.join(r.preset for r in nulls) or 'none complete'}) "
        "train arm A exactly as arm B with its own random draws, so their per-seed differences show how much one "
        "seed's difference varies when nothing differs. Their pooled standard deviation (variances weighted by "
        f"degrees of freedom) is s = {_mde(noise)}. A row with n seeds, tested two-sided at level a, detects a true "
        f"difference d with {POWER:.0%} power when d >= (t(1 - a/2, n - 1) + t({POWER:.2f}, n - 1)) x s / sqrt(n). "
        "The table's *smallest detectable* uses a = 0.05 / (rows in the row's pre-registered family), the strictest "
        "level Holm can hold it to (controls: 0.05); the all-rows table uses 0.05 / "
        f"{len(everyone)}. Rows on a base without a null control of its own (SD 1.5, SDXL, Chroma) borrow the SD3 and "
        "Flux nulls' spread: an assumption. Rows on a base whose rows read instrument 2 as their primary (klein) use their "
        "own base's null instead, on every readout. 'No measurable difference' means no effect of about this size or "
        "more, not no effect.",
    ]
    if everyone:
        out += [
            "",
            f"### One Holm family of all {len(everyone)} deviation and inference rows",
            "",
            "| row | base | A - B | p (t) | p (Holm, all rows) | adjusted interval (all rows) | smallest detectable "
            "(all rows) | verdict (all rows) | pre-registered verdict | differs |",
            "|---|---|---|---:|---:|---|---:|---|---|---|",
        ]
        for r in everyone:
            m = r.primary
            assert m is not None
            differs = "**yes** †" if r.verdict != r.verdict_all else "no"
            out.append(
                f"| {r.preset} | {r.base} | {_num(m['diff_mean'], (m['ci_high'] - m['ci_low']) / 2)} | {_p(m['p_t'])} | "
                f"{_p(r.p_holm_all)} | {_adj(r, r.adj_ci_all)} | {_mde(r.mde_all)} | {r.verdict_all} | {r.verdict} "
                f"({family_name(r)}) | {differs} |"
            )
        differ = [r for r in everyone if r.verdict != r.verdict_all]
        out.append("")
        if differ:
            out.append(
                "- **Verdicts that rest on their family** (†): "
                + "; ".join(f"{r.preset} reads {r.verdict!r} in {family_name(r)} (Holm p {_p(r.p_holm)}) but "
                            f"{r.verdict_all!r} among all {len(everyone)} rows (Holm p {_p(r.p_holm_all)})" for r in differ)
                + "."
            )
        else:
            out.append("- Every verdict is the same in both readings.")
    disagree = [r for r in done if r.tests_disagree]
    if disagree:
        out.append(
            "- **The two tests disagree** (‡, unadjusted at 0.05): "
            + "; ".join(f"{r.preset} (paired t p {_p(r.primary['p_t'])}, sign-flip p {_p(r.primary['p_signflip'])})"  # type: ignore[index]
                        for r in disagree)
            + ". The verdict reads the t test, as planned; the sign-flip test makes no assumption about the "
            "differences' distribution, so where it does not reject the t test's result leans on normality."
        )
    degenerate = [f"{r.preset}: {x['metric'].split(',')[0]}" for r in done for x in r.metrics
                  if x["metric"] != _runner.PRIMARY and x["n"] >= 1 and x.get("verdict") == NO_VERDICT
                  and not x["metric"].startswith(("validation loss, final (arm", "training loss", "concept exact"))]
    if degenerate:
        out.append(
            f"- **Degenerate secondary differences** (no interval, no verdict; shown as 'no spread' below): {len(degenerate)}"
            " (" + "; ".join(degenerate) + ")."
        )
    groups = shared_arm_b(rows)
    if groups:
        out += [
            "",
            "### Shared arm-B runs",
            "",
            "Arm B is the profile's recipe on a base, and a seed fixes its images, data order, noise and LoRA "
            "initialisation, so rows with the same base and arm-B settings share one set of arm-B runs (the per-seed "
            "arm-B results are identical):",
            "",
        ]
        out += [f"- {', '.join(g)} ({len(g)} rows)." for g in groups]
        out += [
            "",
            "What it means: those rows' differences are not independent. A seed whose arm B happened to do badly makes "
            "arm A look better in every row of its group at once, so rows of one group that lean the same way are partly "
            "one observation, not separate confirmations. Each row's own paired interval is still right (the pairing "
            "is by seed within the row), and Holm's adjustment holds under any dependence between rows; what does not "
            "hold is reading agreement across rows of a group as independent evidence. A group's null control, where it "
            "has one, reads its arm A against the same arm B, so it measures the seed-to-seed noise of exactly this "
            "design.",
        ]
    return out


def _instrument_2_section(rows: Sequence[MatrixRow]) -> list[str]:
    """Amendment 11's readout: every row on concept net accuracy at the last checkpoint, its gate, and which readings
    are confirmatory (rows whose arm A ran after the amendment) and which post hoc."""
    done = [r for r in rows if r.final_net is not None and not r.reason]
    if not done:
        return []
    gate = next((r for r in rows if r.preset == GATE_2), None)
    family = [r for r in done if r.kind in ("deviation", "inference") and not math.isnan(r.holm_factor_2)]
    state = ("has not run" if gate is None or gate.final_net is None else
             f"reads **{gate.verdict_2}**" + (f" ({gate.seeds} of {gate.planned} seeds)" if gate.seeds < gate.planned else ""))
    out = [
        "",
        "## Instrument 2 (amendment 11): concept net accuracy at 300 steps",
        "",
        f"A second readout of every row, added by amendment 11 after amendment 10's positive control ({AXIS_GATE}) was "
        "not seen on the primary metric: **" + _runner.FINAL_NET + "** (the primary's terms at the last checkpoint, the "
        "LoRA a user keeps; the primary's early checkpoints differ the other way in that control). One Holm family of "
        f"the {len(family)} complete deviation and inference rows with a p value (a degenerate difference has none); "
        "controls unadjusted; the adjusted interval and the "
        "smallest detectable effect as in the section above, from the null controls' spread of this readout. Its gate "
        f"is a positive control on seeds no row had used, **{GATE_2}** (seeds 6-11), which {state}; a verdict is "
        "printed only once it reads \"profile better\".",
        "",
        "**Post hoc or confirmatory.** The readout was chosen after seeing amendment 10's control, and the rows' 300-step "
        "hit and false-pink readings were published as secondaries before it, so every reading of a row whose arm A ran "
        "before the amendment is **post hoc**: shown, never used by `te-align check` to set a severity. A row whose "
        f"arm A ran after it ({', '.join(sorted(CONFIRMATORY_2))}) has a **confirmatory** reading, and `check` "
        "acts on it where the row's pre-registered verdict is uninformative.",
        "",
        "| row | kind | base | seeds | A | B | A - B [95% CI] | p (t) | p (sign-flip) | p (Holm, all rows) | adjusted "
        "interval | smallest detectable | verdict | reading |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|---|---|",
    ]
    disagree = []
    for r in done:
        m = r.final_net
        assert m is not None
        adj = _ci({"diff_mean": m["diff_mean"], "ci_low": r.adj_ci_2[0], "ci_high": r.adj_ci_2[1], "n": m["n"]})
        reading = "control" if r.kind in ("positive", "null") else ("confirmatory" if r.confirmatory_2 else "post hoc")
        out.append(
            f"| {r.preset} | {r.kind_label} | {r.base} | {r.seeds} | {_fv(m, 'a_mean'):.3f} | {_fv(m, 'b_mean'):.3f} | {_ci(m)} | "
            f"{_p(_fv(m, 'p_t'))} | {_p(_fv(m, 'p_signflip'))} | {_p(r.p_holm_2)} | {adj} | {_mde(r.mde_2)} | "
            f"**{r.verdict_2}**{' ‡' if r.tests_disagree_2 else ''} | {reading} |"
        )
        if r.tests_disagree_2:
            disagree.append(f"{r.preset} (paired t p {_p(_fv(m, 'p_t'))}, sign-flip p {_p(_fv(m, 'p_signflip'))})")
    out.append("")
    if disagree:
        out.append("- **The two tests disagree** (‡, unadjusted at 0.05): " + "; ".join(disagree) + ".")
    spread = _spreads(rows, _runner.FINAL_NET)
    line = f"- Null controls' spread of this readout: s = {_mde(spread.get('', math.nan))}"
    for base in INSTRUMENT_2_PRIMARY:  # a base with its own null for this readout (its rows' primary)
        own = spread.get(instrument_2_family(base), math.nan)
        if not math.isnan(own):
            line += f"; the {base} rows' own null: s = {_mde(own)}"
    out.append(line + ".")
    return out


def render_effects(
    rows: Sequence[MatrixRow], *, command: str, plan: str, strips: Path | None = None, doc: Path | None = None,
    before: Sequence[MatrixRow] = (),
) -> str:
    """The evidence document: the table (primary metric, interval, p-values, verdict), secondary metrics, the
    sample strips, and the method as it ran."""
    done = sum(r.seeds for r in rows)
    planned = sum(r.planned for r in rows if not r.reason)
    cpu = sum(r.cpu_seconds for r in rows)
    wall = sum(r.seconds for r in rows)
    where = sorted({w for r in rows for w in r.where}) or ["cpu"]
    lines = [
        "# Measured effects: trainer deviations A/B'd on the shapes-world bases",
        "",
        f"Generated from the per-seed results in `benchmarks/effects/results/` (plan `{plan}`, pre-registered in "
        "`benchmarks/effects/bench_effects.md`); regenerate the table without training with "
        f"`{command} --dry-run`, continue the study with the same command without `--dry-run`.",
        "",
        f"**Progress: {done} of {planned} row-seeds** ({wall / 3600:.2f} h of unit wall time, {cpu / 3600:.2f} h of CPU time, "
        f"on {', '.join(where)}; with two worker processes about {wall / 2 / 3600:.1f} h of wall time; each row's CPU "
        "minutes are in the table's last column). A row's verdict is given only once all its seeds are in.",
        "",
        f"Primary metric (pre-registered): **{_runner.PRIMARY}** — per checkpoint at 50, 100, 200 and 300 steps, the share of "
        "prompts asking for pink (on the held-out shape, in wording never used in training) drawn pink at the asked "
        "position, minus the share of prompts asking for another colour where pink was drawn; averaged over the "
        "checkpoints. Difference = A - B (higher = arm A better); 95% t interval across paired seeds (unadjusted, as "
        "pre-registered); p: paired t (Holm-adjusted within the row's pre-registered family for the verdict) and exact "
        "sign-flip. **Adjusted interval**: the same difference with the interval in its verdict's terms (see "
        "*Statistics added after the results* below): it excludes 0 exactly when the verdict names a winner. "
        "**Smallest detectable**: the smallest true difference the row's verdict would have detected with "
        f"{POWER:.0%} power, from the null controls' spread (defined below).",
        "",
        "| row | kind | trainer(s) / tool | base | seeds | A | B | A - B [95% CI] | p (t) | p (Holm) | p (sign-flip) | "
        "adjusted interval | smallest detectable | verdict | CPU min |",
        "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in rows:
        m = r.primary
        if r.reason:
            lines.append(f"| {r.preset} | {r.kind_label} | {r.trainer} | {r.base} | 0 | | | | | | | | | not run: {r.reason} | |")
            continue
        if m is None:
            lines.append(f"| {r.preset} | {r.kind_label} | {r.trainer} | {r.base} | 0 | | | | | | | | | {r.verdict} | |")
            continue
        flags = _flags(r)
        lines.append(
            f"| {r.preset} | {r.kind_label} | {r.trainer} | {r.base} | {r.seeds} | {m['a_mean']:.3f} | {m['b_mean']:.3f} | "
            f"{_ci(m)} | {_p(m['p_t'])} | {_p(r.p_holm)} | {_p(m['p_signflip'])} | {_adj(r, r.adj_ci)} | "
            f"{_mde(r.mde)} | **{r.verdict}**{flags} | {r.cpu_seconds / 60:.1f} |"
        )
    lines += _before_section(before, rows)
    lines += _reading(rows)
    lines += _added_statistics(rows)
    lines += _instrument_2_section(rows)
    lines += ["", "## What each row changes, and where it comes from", ""]
    for r in rows:
        lines.append(f"- **{r.preset}** ({r.kind_label}; {r.trainer}): {r.deviation}. Source: {r.source}.")
    lines += [
        "",
        "## Secondary metrics (final checkpoint unless named), A - B [95% CI]",
        "",
        "Unadjusted 95% t intervals; the secondary metrics have no pre-registered verdict. 'no spread' marks a "
        "degenerate difference (the same on every seed): no interval.",
        "",
        "| row | seeds | concept hit rate | known colours (forgetting) | false pink readings | spurious objects / image | "
        "validation loss (profile cond.) | spread of the primary: sd A / sd B [95% bootstrap] |",
        "|---|---:|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r.metrics:
            continue
        cells = []
        for key in ("concept hit rate", "known colours", "false concept readings", "spurious objects", "validation loss, final (profile"):
            m = next((x for x in r.metrics if x["metric"].startswith(key)), None)
            cells.append("n/a" if m is None else _ci(m))
        ratio, lo, hi = r.sd_ratio
        cells.append("n/a" if math.isnan(ratio) else f"{ratio:.2f} [{_num(lo, 0.01)}, {_num(hi, 0.01)}]")
        lines.append(f"| {r.preset} | {r.seeds} | " + " | ".join(cells) + " |")
    if strips is not None and doc is not None:
        shown = [(r, strips / f"{r.preset}.png") for r in rows if (strips / f"{r.preset}.png").is_file()]
        if shown:
            lines += [
                "",
                "## Samples: seed 0, final checkpoint, arm A (top) beside arm B (bottom)",
                "",
                "Each image is labelled with what its prompt asked (the prompts themselves are in the row's result "
                "file); short prompts only.",
                "",
            ]
            for r, png in shown:
                rel = os.path.relpath(png, doc.parent)
                lines += [f"**{r.preset}** — {r.deviation}", "", f"![{r.preset}: A above B]({rel})", ""]
    lines += _METHOD.splitlines()
    return "\n".join(lines) + "\n"


_METHOD = """## Method (as it ran)

- **Bases.** The shipped world bases (`te_align.tiny.world.base`: SD3-, Flux-, SDXL- and SD 1.5-shaped;
  `docs/world.md`), each pretrained from scratch on the shapes world with its family's profile and frozen tiny text
  encoders that were themselves pretrained on world captions. Pink never occurs in any base's pretraining data. The
  SDXL rows were added by amendment 7 of the plan, after the first plan's verdicts, and are adjusted as a family of
  their own.
- **Finetune.** Per seed, 64 images that always show pink (one filled object on white, never a pink triangle) are
  drawn from the world with the default caption mix (tags, short sentences, long captions past T5 positions 77, 154
  and 256; some with "!" or weight syntax); both arms of a seed share the images, data order, noise, timesteps and
  LoRA initialisation (a null control's arm A draws its own; the timesteps of the two rows without per-encoder
  dropout only since amendment 9, and the rows whose arm A chunks long captions batch them by chunk count, so their
  data order differs: amendment 9). LoRA rank 8 on the denoiser, batch 8, learning rate per base by the plan's calibration rule (SD3 3e-4, Flux 1e-4, SD 1.5 and SDXL 1e-3),
  300 steps, checkpoints every 50 steps. SD3 rows train with the profile's 46.4% per-encoder dropout in arm B (the
  base's recipe), SD 1.5 rows with the profile's 10% caption dropout.
- **Scoring as sampled.** At 50, 100, 200 and 300 steps, each arm samples 24 probe prompts per seed, in sentence
  frames the caption grammar never writes (`te_align.tiny.world.phrasings`): 16 ask for a pink triangle (10 short, 3
  long with the object between T5 tokens 77 and 154, 3 very long with it past T5 token 256 and CLIP token 77) and 8
  ask for another colour (6 short, 1 long, 1 very long). Sampling: the official pipeline, 16 steps (the
  pre-registered step check kept the bases' own 16: fewer steps changed the SD 1.5 base's readings), CFG 4 against the
  empty prompt, one fixed seed per prompt, conditioned as that arm's users sample it: by the profile, or as trained
  where the trainer's users carry the setting to inference (CLIP skip, long-prompt chunks), or as the inference tool
  does for the inference-side rows. The world's reader reads every image back.
- **Statistics.** Per row, the paired mean difference over 6 seeds with its 95% t interval, the paired t p-value and
  the exact sign-flip p-value (its floor with 6 seeds is 1/32); the verdict reads the primary metric alone, Holm-adjusted
  across the deviation and inference rows at 0.05; the controls are read unadjusted (the null rows give the
  false-positive rate, the positive control shows the instrument can see an effect).

## What a tiny world can and cannot tell

It can show, with the truth known, whether a deviation from the recipe a base model was pretrained with costs a LoRA
anything measurable, and in which direction. It cannot give the size of the effect on a real model: the bases are
millions of times smaller than SD3.5 or FLUX.1, their text encoders are tiny models trained on a small caption grammar
rather than language models, and a 300-step CPU finetune at 32 pixels is not a production LoRA run. "No measurable
difference" here is not evidence that a deviation is harmless at scale; a measured effect is a reason to align, not a
prediction of its size.
"""
