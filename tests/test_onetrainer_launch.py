"""A real OneTrainer training launch through the patched ``scripts/train.py`` (SD 1.5 LoRA on CPU, tiny model).

Needs a OneTrainer checkout (TE_ALIGN_ONETRAINER_DIR) and the python of an environment that runs it
(TE_ALIGN_ONETRAINER_PYTHON; ``tools/onetrainer_env.sh`` builds one). The checkout is copied, patched with
``te-align patch``, and trained twice in subprocesses: hooked (te-align's log lines, the text cache in the
profile-fingerprinted folder, every cached embedding equal to ``te_align.encode`` in that environment) and with
``TE_ALIGN=off`` (OneTrainer's own cache, no te-align folder); then ``te-align unpatch`` restores every byte.
The run's files are made by :mod:`tests.support.onetrainer_run` in the OneTrainer environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV_DIR = "TE_ALIGN_ONETRAINER_DIR"
ENV_PYTHON = "TE_ALIGN_ONETRAINER_PYTHON"
ROOT = os.environ.get(ENV_DIR)
PYTHON = os.environ.get(ENV_PYTHON)
REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 300
STEPS = 2  # tests.support.onetrainer_run: 4 images, batch size 2, one epoch

pytestmark = pytest.mark.skipif(
    not (ROOT and PYTHON),
    reason=f"set {ENV_DIR} to a Nerogar/OneTrainer checkout and {ENV_PYTHON} to the python of an environment "
    "that runs it (tools/onetrainer_env.sh builds one)",
)


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o7777)
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    """The subprocesses' environment: this repository's te_align first, one thread, offline, no bytecode
    written into the checkout (so that unpatch can be compared byte for byte)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_ALIGN") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1", TOKENIZERS_PARALLELISM="false", **extra)  # fmt: skip
    return env


def _run(cmd: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(**extra), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


@dataclass
class Launch:
    checkout: Path
    before: dict[str, tuple[bytes, int]]
    run_dir: Path
    overrides: dict[str, object]
    patch: subprocess.CompletedProcess[str]
    hooked: subprocess.CompletedProcess[str]
    off: subprocess.CompletedProcess[str]
    stale: subprocess.CompletedProcess[str]
    unpatch: subprocess.CompletedProcess[str]
    after: dict[str, tuple[bytes, int]]


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    base = tmp_path_factory.mktemp("onetrainer_launch")
    checkout = base / "OneTrainer"
    shutil.copytree(str(ROOT), checkout, ignore=shutil.ignore_patterns(".git", "venv", "__pycache__", "workspace*"))
    before = _tree(checkout)
    run_dir = base / "run"
    _run([str(PYTHON), "-m", "tests.support.onetrainer_run", "build", str(run_dir)], REPO)
    overrides = json.loads((run_dir / "overrides.json").read_text(encoding="utf-8"))
    for name, changes in (("off", {}), ("stale", {"only_cache": True})):  # "stale": hooked, caching only
        cfg = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        cfg.update(cache_dir=str(run_dir / f"cache-{name}"), workspace_dir=str(run_dir / f"workspace-{name}"),
                   output_model_destination=str(run_dir / f"out-{name}" / "lora.safetensors"), **changes)  # fmt: skip
        (run_dir / f"config-{name}.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    te_align_cli = [sys.executable, "-m", "te_align"]
    on = {"TE_ALIGN_OVERRIDES": json.dumps(overrides)}
    patch = _run([*te_align_cli, "patch", str(checkout)], REPO)
    train = [str(PYTHON), "scripts/train.py", "--config-path"]
    hooked = _run([*train, str(run_dir / "config.json")], checkout, **on)
    off = _run([*train, str(run_dir / "config-off.json")], checkout, TE_ALIGN="off")
    shutil.copytree(run_dir / "cache-off", run_dir / "cache-stale")  # OneTrainer's own cache, then hooked
    stale = _run([*train, str(run_dir / "config-stale.json")], checkout, **on)
    unpatch = _run([*te_align_cli, "unpatch", str(checkout)], REPO)
    yield Launch(checkout, before, run_dir, overrides, patch, hooked, off, stale, unpatch, _tree(checkout))


def _profile(launch: Launch):
    import te_align

    return te_align.profile("sd15", **launch.overrides)


def _cached(folder: Path) -> list[dict]:
    """Every cached text item (mgds DiskCache: <group>/variation-<n>/<index>.pt, a dict of tensors)."""
    import torch

    items = [torch.load(p, weights_only=False, map_location="cpu") for p in sorted(folder.rglob("*.pt"))
             if p.name != "aggregate.pt"]  # fmt: skip
    assert items, f"no cached text under {folder}"
    return items


def test_hooked_launch_trains_and_announces_te_align(launch: Launch) -> None:
    from te_align.hooks.onetrainer import cache_folder

    out = launch.hooked.stdout + launch.hooked.stderr
    p = _profile(launch)
    assert "te-align: OneTrainer hooks active (" in out
    assert (f"te-align: OneTrainer StableDiffusionBaseDataLoader data loader tokenizes (1) and encodes (1) by profile "
            f"sd15 (fingerprint {p.fingerprint()[:12]})") in out  # fmt: skip
    assert f"te-align: OneTrainer text cache keyed by profile sd15: {launch.run_dir / 'cache' / 'text' / cache_folder(p)}" in out
    assert (launch.run_dir / "out" / "lora.safetensors").is_file()
    # the sampler's prompt goes through the hooked encode_text (text=...): one image after each step
    assert len(list((launch.run_dir / "workspace" / "samples").rglob("*.jpg"))) == STEPS


def test_hooked_text_cache_is_the_profiles_and_equals_te_align_encode(launch: Launch) -> None:
    import torch
    from safetensors import safe_open

    from te_align.hooks.onetrainer import cache_folder

    p = _profile(launch)
    text = launch.run_dir / "cache" / "text"
    assert [c.name for c in text.iterdir()] == [cache_folder(p)]
    ref = launch.run_dir / "reference.safetensors"
    _run([str(PYTHON), "-m", "tests.support.onetrainer_run", "encode", str(launch.run_dir), str(ref)], REPO)
    with safe_open(str(ref), framework="pt") as f:
        assert f.metadata()["fingerprint"] == p.fingerprint()  # the same profile in both environments
        want = {k: f.get_tensor(k) for k in f.keys()}
    n = sum(1 for k in want if k.startswith("tokens_"))
    matched = set()
    for item in _cached(text / cache_folder(p)):
        i = next(i for i in range(n) if torch.equal(item["tokens"], want[f"tokens_{i}"]))
        assert torch.equal(item["text_encoder_hidden_state"], want[f"prompt_embeds_{i}"])
        matched.add(i)
    assert matched == set(range(n))


def test_te_align_off_runs_onetrainer_unmodified(launch: Launch) -> None:
    import torch

    from te_align.hooks.onetrainer import CACHE_PREFIX

    out = launch.off.stdout + launch.off.stderr
    assert "te-align" not in out
    assert (launch.run_dir / "out-off" / "lora.safetensors").is_file()
    text = launch.run_dir / "cache-off" / "text"
    assert not [c.name for c in text.iterdir() if c.name.startswith(CACHE_PREFIX)]
    off = {tuple(it["tokens"].tolist()): it["text_encoder_hidden_state"] for it in _cached(text)}
    on = {tuple(it["tokens"].tolist()): it["text_encoder_hidden_state"] for it in _cached(text.parent.parent / "cache" / "text")}
    assert set(off) == set(on)  # same tokens (CLIP at 77 either way) ...
    assert all(not torch.equal(off[k], on[k]) for k in off)  # ... OneTrainer's last layer vs the profile's penultimate


def test_stale_cache_entries_are_counted_and_re_encoded(launch: Launch) -> None:
    """Hooked on a cache OneTrainer made without te-align: its 4 caption entries are named stale (mgds'
    aggregate.pt is no entry), left in place, and the texts re-encoded into the profile's folder."""
    from te_align.hooks.onetrainer import cache_folder

    p = _profile(launch)
    text = launch.run_dir / "cache-stale" / "text"
    out = launch.stale.stdout + launch.stale.stderr
    assert (f"te-align: 4 cached text-encoder file(s) in {text} were made without te-align or with another profile; "
            f"texts are re-encoded by profile sd15 into {cache_folder(p)}") in out  # fmt: skip
    old = [c.name for c in (launch.run_dir / "cache-off" / "text").iterdir()]
    assert sorted(c.name for c in text.iterdir()) == sorted([*old, cache_folder(p)])
    assert len(_cached(text / cache_folder(p))) == 4


def test_unpatch_restores_every_byte(launch: Launch) -> None:
    assert "scripts/train.py" in launch.patch.stdout
    assert launch.after == launch.before
