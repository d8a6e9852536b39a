"""Both arms of every effects-matrix row share every random draw except the one their setting changes (issue 47 item 1,
amendment 9 of benchmarks/effects/bench_effects.md), and runs whose draws did not depend on the arm draw exactly as before.

Each row's two arms are trained for two steps, by the row's own settings (``train_config_dict``, the arms' profiles),
on a smaller draw of its world data; the trainer records its draws (``te_align.train.record.recording_draws``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("te_align_world", reason="the world bases: pip install ./world")

from te_align.ab import runner  # noqa: E402
from te_align.ab.matrix import matrix_presets  # noqa: E402
from te_align.ab.preset import Preset, train_config_dict  # noqa: E402
from te_align.profiles.overrides import resolve  # noqa: E402
from te_align.tiny.bases import base_info, shipped  # noqa: E402
from te_align.tiny.pipelines import missing_pipeline  # noqa: E402
from te_align.train import config_from_dict  # noqa: E402
from te_align.train.data import step_generator  # noqa: E402
from te_align.train.loop import train  # noqa: E402
from te_align.train.models import FAMILIES, default_flow_shift, flow_timestep_scale, logit_normal  # noqa: E402
from te_align.train.record import recording_draws  # noqa: E402

STEPS = 2
PRESETS = {p.name: p for p in matrix_presets() if p.world is not None and p.world.base in shipped()}


def _small(p: Preset) -> Preset:
    """The row with a smaller world draw (16 training images): the draws' layout does not depend on the data's size."""
    assert p.world is not None
    return dataclasses.replace(p, world=dataclasses.replace(p.world, train_images=16, val_images=4))


class _Arms:
    """Each arm's recorded draws and config, trained once per distinct config (rows share their arm B)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, tuple[list[dict[str, Any]], Any]] = {}

    def draws(self, p: Preset, arm: str) -> tuple[list[dict[str, Any]], Any]:
        assert p.world is not None
        reason = missing_pipeline(base_info(p.world.base)["family"])
        if reason:
            pytest.skip(reason)
        p = _small(p)
        data = runner._world_data(p, self.root / "data" / p.world.base / "seed-0", lambda _: None, data_seed=p.world.data_seed)
        train_dir, _ = runner.split_data(data, self.root / "data" / p.world.base / "seed-0", p.eval.holdout)
        if arm == "A" and p.baseline.kind == "positive" and not p.baseline.cut_before:  # cut_before: arm B's LoRA
            train_dir = runner._arm_data(p, train_dir, self.root / "data" / p.name, 0)
        model = runner.resolve_model(f"world:{p.world.base}")
        base = resolve(p.profile, ("model.profile_overrides", runner._world_overrides(p, None, f"world:{p.world.base}") or None))
        prof = p.arm_profiles(base)[0 if arm == "A" else 1]
        prof_path = self.root / "profiles" / f"{prof.fingerprint()}.toml"
        prof_path.parent.mkdir(parents=True, exist_ok=True)
        prof_path.write_text(prof.to_toml(), encoding="utf-8")
        raw = train_config_dict(p, model=model, data=str(train_dir), out="", profile=str(prof_path), seed=0, max_steps=STEPS, arm=arm)
        key = json.dumps(raw, sort_keys=True)
        if key not in self.done:
            raw["output"]["dir"] = str(self.root / "runs" / str(len(self.done)))
            cfg = config_from_dict(raw)
            with recording_draws() as rec:
                train(cfg)
            self.done[key] = (list(rec), cfg)
        return self.done[key]


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> _Arms:
    return _Arms(tmp_path_factory.mktemp("pairing"))


def _encoder_dropout_differs(p: Preset) -> bool:
    return "encoder_dropout" in p.baseline.train.get("data", {})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_both_arms_share_every_draw_but_their_setting(arms: _Arms, name: str) -> None:
    p = PRESETS[name]
    a, _ = arms.draws(p, "A")
    b, _ = arms.draws(p, "B")
    assert [d["step"] for d in a] == [d["step"] for d in b] == list(range(STEPS))
    if p.baseline.null:  # a null control's arm A draws its own randomness: the setting that differs is the seed
        assert a[0]["lora"] != b[0]["lora"] and not torch.equal(a[0]["noise"], b[0]["noise"])
        return
    assert a[0]["lora"] == b[0]["lora"] != ""  # the LoRA's initial weights
    for da, db in zip(a, b, strict=True):
        assert da["batch"] == db["batch"]  # data order
        assert da["flips"] == db["flips"]
        assert torch.equal(da["noise"], db["noise"])
        assert torch.equal(da["timesteps"], db["timesteps"])
        assert da["drop"] == db["drop"]  # caption dropout
        if p.baseline.kind == "positive" and not p.baseline.cut_before:  # arm A's captions are the setting that differs
            assert da["texts"] != db["texts"]
        else:
            assert da["texts"] == db["texts"]
        if _encoder_dropout_differs(p):
            assert da["slots"] == {} and any(any(f) for f in db["slots"].values())
        else:
            assert da["slots"] == db["slots"]


def _legacy(rec: list[dict[str, Any]], cfg: Any, rates: dict[str, float], base: str) -> list[dict[str, Any]]:
    """The draws as the step stream gave them before amendment 9: noise, caption dropout, then a uniform per caption
    for each slot the run drops (``rates``, in the run's order), then timesteps, all from one stream."""
    out = []
    fam = FAMILIES["sd1" if base == "sd15" else base]
    for d in rec:
        gen = step_generator(cfg.train.seed, d["step"], 0)
        n = len(d["batch"])
        assert not cfg.data.random_flip and cfg.data.latent_sample == "mean" and not cfg.train.noise_offset
        assert not cfg.data.shuffle_tags
        noise = torch.randn(tuple(d["noise"].shape), generator=gen)
        drop = torch.rand(n, generator=gen).lt(cfg.data.caption_dropout).tolist() if cfg.data.caption_dropout > 0 else [False] * n
        slots = {s: torch.rand(n, generator=gen).lt(r).tolist() for s, r in rates.items()}
        if d["timesteps"].is_floating_point():
            t = logit_normal(n, cfg.train.flow_shift or default_flow_shift(fam), gen) * flow_timestep_scale(fam)
        else:
            t = torch.randint(0, 1000, (n,), generator=gen)
        out.append({"noise": noise, "drop": drop, "slots": slots, "timesteps": t})
    return out


@pytest.mark.parametrize("name", ["world-sd3-no-encoder-dropout", "world-flux-null", "world-sd15-dropout-zeros", "world-sdxl-dropout-encoded"])
def test_runs_whose_draws_did_not_depend_on_the_arm_draw_as_before(arms: _Arms, name: str) -> None:
    """Arm B of every SD3 row (the profile's 46.4% per encoder), runs on a profile that publishes no per-encoder rate
    (Flux, SDXL, here with SDXL's 10% caption dropout) and runs at the profile's rate (SD 1.5's 10%) draw exactly the
    numbers the single step stream gave them before; only a run that drops fewer encoders than the profile publishes
    (arm A of the SD3 dropout rows) draws its timesteps anew, as arm B's."""
    p = PRESETS[name]
    assert p.world is not None
    base = p.world.base
    published = {"sd3": {"clip_l": 0.464, "clip_g": 0.464, "t5": 0.464}, "sd15": {"clip_l": 0.1}}.get(base, {})
    for arm in ("A", "B"):
        rec, cfg = arms.draws(p, arm)
        changed = arm == "A" and _encoder_dropout_differs(p)
        rates = {} if changed else published
        expected = _legacy(rec, cfg, rates, base)
        for d, e in zip(rec, expected, strict=True):
            assert torch.equal(d["noise"], e["noise"]) and d["drop"] == e["drop"]
            assert torch.equal(d["timesteps"], e["timesteps"]) is not changed
            if not changed:
                assert d["slots"] == e["slots"]
        if changed:  # its timesteps are arm B's
            assert all(torch.equal(d["timesteps"], e["timesteps"]) for d, e in zip(rec, arms.draws(p, "B")[0], strict=True))
    assert any(any(f) for d in arms.draws(p, "B")[0] for f in d["slots"].values()) is bool(published)


def test_a_redrawn_row_reruns_arm_a_and_takes_arm_b_from_its_record(tmp_path: Path) -> None:
    """Amendment 9's re-run: a unit of a re-drawn row trains arm A alone and takes arm B from the same seed's result
    on record; arm A comes out as a unit that trains both arms gives it."""
    import shutil

    from te_align.ab.matrix import REDRAWN, SUPERSEDED, run_matrix

    name = "world-sd3-no-encoder-dropout"
    assert name in REDRAWN
    out = tmp_path / "m"
    run_matrix(out, only=[name], seeds=1, max_steps=2, say=lambda _: None)
    first = json.loads((out / "results" / name / "seed-0.json").read_text(encoding="utf-8"))
    assert "arm_b_from" not in first
    (out / SUPERSEDED / name).mkdir(parents=True)
    shutil.move(str(out / "results" / name / "seed-0.json"), str(out / SUPERSEDED / name / "seed-0.json"))
    shutil.rmtree(out / name)
    said: list[str] = []
    run_matrix(out, only=[name], seeds=1, max_steps=2, say=said.append)
    again = json.loads((out / "results" / name / "seed-0.json").read_text(encoding="utf-8"))
    assert again["arm_b_from"]["file"] == f"{SUPERSEDED}/{name}/seed-0.json" and again["arm_b_from"]["plan"] == first["plan"]
    assert again["arms"]["B"] == first["arms"]["B"]
    for key in ("losses", "val", "val_own", "curve", "probe_reads", "curve_mean"):
        assert again["arms"]["A"][key] == first["arms"]["A"][key], key
    assert not (out / name / "seed-0" / "runs" / "seed-0" / "B").exists()  # arm B was not trained again


def test_the_redrawn_rows_results_on_record_are_refused_as_current_and_no_other_rows() -> None:
    """The re-drawn rows' hashes name their amendment (9 or 11), so their results from before it (on record beside the
    results) are never mixed with the new ones; every other row keeps the hash its committed results carry."""
    from te_align.ab.matrix import (
        EXTENDED,
        REDRAWN,
        accepted_hashes,
        matrix_presets,
        row_hash,
        superseded_folder,
    )

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "effects"
    for p in matrix_presets():
        h = row_hash(p, seeds=None, max_steps=None)
        if p.name in REDRAWN:
            old = sorted((root / superseded_folder(p.name) / p.name).glob("seed-*.json"))
            assert len(old) == 6 and {json.loads(f.read_text(encoding="utf-8"))["plan"] for f in old} != {h}
        new = sorted((root / "results" / p.name).glob("seed-*.json"))
        plans = {json.loads(f.read_text(encoding="utf-8"))["seed"]: json.loads(f.read_text(encoding="utf-8"))["plan"] for f in new}
        if p.name not in EXTENDED:
            assert set(plans.values()) <= {h} and accepted_hashes(p, seeds=None, max_steps=None) == (h,)
            continue
        # a row extended by amendment 13's power rule: its first seeds carry the hash it had then, later seeds the new one
        then = accepted_hashes(p, seeds=None, max_steps=None)[1]
        assert then != h and all(plan == (then if seed < EXTENDED[p.name] else h) for seed, plan in plans.items())


def test_rows_with_one_arm_b_key_have_one_arm_b_on_record() -> None:
    """Every committed result of rows that share :func:`~te_align.ab.matrix.arm_b_key` has, seed for seed, the same arm
    B in every field but its timings (164 records in 7 groups, 5 of them of more than one row, before the klein rows ran): the key leaves out nothing arm B
    depends on, so a unit may take arm B from such a row's result (:func:`~te_align.ab.matrix.shared_b`)."""
    from te_align.ab.matrix import arm_b_key, matrix_presets

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "effects" / "results"
    groups: dict[str, list[str]] = {}
    for p in matrix_presets():
        groups.setdefault(arm_b_key(p, max_steps=None), []).append(p.name)
    compared = 0
    for names in groups.values():
        by_seed: dict[int, set[str]] = {}
        for n in names:
            for f in (root / n).glob("seed-*.json"):
                rec = json.loads(f.read_text(encoding="utf-8"))
                b = {k: v for k, v in rec["arms"]["B"].items() if k not in ("train_seconds", "train_cpu_seconds")}
                by_seed.setdefault(int(rec["seed"]), set()).add(json.dumps(b, sort_keys=True))
                compared += 1
        assert all(len(v) == 1 for v in by_seed.values()), names
    assert compared >= 164 and len([g for g in groups.values() if len(g) > 1]) == 5


def test_a_row_takes_arm_b_from_a_row_with_its_arm_b_key(tmp_path: Path) -> None:
    """A unit of a row whose arm B is another row's (same profile, world data, finetune and evaluation settings, base)
    trains arm A alone and takes arm B from that row's result of the same seed; both arms come out as a unit that trains
    both gives them. Not from a row with another key, a result of another machine or one whose arm B was taken itself;
    never for a row whose arm A samples arm B's LoRA."""
    from te_align.ab.matrix import _machine, arm_b_key, matrix_presets, read_results, run_matrix, shared_b

    presets = {p.name: p for p in matrix_presets()}
    null, row = "world-sd3-null", "world-sd3-t5-77"
    assert arm_b_key(presets[null], max_steps=2) == arm_b_key(presets[row], max_steps=2)
    alone = tmp_path / "alone"
    run_matrix(alone, only=[row], seeds=1, max_steps=2, say=lambda _: None)
    own = json.loads((alone / "results" / row / "seed-0.json").read_text(encoding="utf-8"))
    out = tmp_path / "m"
    run_matrix(out, only=[null], seeds=1, max_steps=2, say=lambda _: None)
    source = json.loads((out / "results" / null / "seed-0.json").read_text(encoding="utf-8"))
    run_matrix(out, only=[row], seeds=1, max_steps=2, say=lambda _: None)
    shared = json.loads((out / "results" / row / "seed-0.json").read_text(encoding="utf-8"))
    assert shared["arm_b_from"]["file"] == f"results/{null}/seed-0.json" and shared["arm_b_from"]["plan"] == source["plan"]
    assert shared["arms"]["B"] == source["arms"]["B"] and shared["samples"]["B"] == source["samples"]["B"]
    for key in ("losses", "val", "val_own", "curve", "probes", "probe_reads", "curve_mean"):
        assert shared["arms"]["A"][key] == own["arms"]["A"][key], key
        assert shared["arms"]["B"][key] == own["arms"]["B"][key], key
    assert not (out / row / "seed-0" / "runs" / "seed-0" / "B").exists()  # arm B was not trained again
    done = read_results(out / "results")
    machine = _machine()
    ps = {q.name: arm_b_key(q, max_steps=2) for q in presets.values()}
    unbounded = {q.name: arm_b_key(q, max_steps=None) for q in presets.values()}
    assert shared_b(presets[row], 0, ps, out / "results", done, max_steps=2, machine=machine) is not None
    assert shared_b(presets[row], 1, ps, out / "results", done, max_steps=2, machine=machine) is None  # no such seed
    assert shared_b(presets[row], 0, unbounded, out / "results", done, max_steps=None, machine=machine) is None  # other steps
    assert shared_b(presets[row], 0, ps, out / "results", done, max_steps=2, machine="elsewhere") is None
    assert shared_b(presets["world-flux-t5-77"], 0, ps, out / "results", done, max_steps=2, machine=machine) is None
    assert shared_b(presets["world-sd3-comfyui"], 0, ps, out / "results", done, max_steps=2, machine=machine) is None
    only_taken = {null: [{**source, "arm_b_from": {"file": "x"}}]}
    assert shared_b(presets[row], 0, ps, out / "results", only_taken, max_steps=2, machine=machine) is None
