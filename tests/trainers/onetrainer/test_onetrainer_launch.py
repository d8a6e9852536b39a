"""Real OneTrainer training launches through the patched ``scripts/train.py`` (LoRA on CPU, tiny models).

Needs a OneTrainer checkout (TE_ALIGN_ONETRAINER_DIR) and the python of an environment that runs it
(TE_ALIGN_ONETRAINER_PYTHON; ``tools/onetrainer_env.sh`` builds one). The checkout is copied and patched with
``te-align patch``; OneTrainer then trains in subprocesses. SD 1.5: hooked (te-align's log lines, the text cache
in the profile-fingerprinted folder, every cached embedding equal to ``te_align.encode`` in that environment),
with ``TE_ALIGN=off`` (OneTrainer's own cache, no te-align folder), hooked again on OneTrainer's own cache (stale
entries counted) and hooked with a text-encoder LoRA (trained through the hooked ``encode_text``). SD3: hooked
(T5 cached at the profile's 256 tokens; OneTrainer's own length is 77); FLUX.1-dev: hooked (T5 at 512;
OneTrainer's default is 77). Then ``te-align unpatch`` restores every byte. The runs' files are made by
:mod:`tests.support.onetrainer_run` in the OneTrainer environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ENV_DIR = "TE_ALIGN_ONETRAINER_DIR"
ENV_PYTHON = "TE_ALIGN_ONETRAINER_PYTHON"
ROOT = os.environ.get(ENV_DIR)
PYTHON = os.environ.get(ENV_PYTHON)
REPO = Path(__file__).resolve().parents[3]
TIMEOUT = 300
STEPS = 2  # tests.support.onetrainer_run: 4 images, batch size 2, one epoch
SUPPORT = "tests.support.onetrainer_run"

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
class Checkout:
    root: Path
    before: dict[str, tuple[bytes, int]]
    base: Path
    patch: subprocess.CompletedProcess[str]


@dataclass
class Family:
    """One family's files and launches: ``runs`` maps a launch name to its output (see :func:`_launch`)."""

    name: str
    dir: Path
    overrides: dict[str, Any]
    runs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def profile(self) -> Any:
        import te_align
        from tests.support.onetrainer_run import RUNS

        return te_align.profile(RUNS[self.name].profile, **self.overrides)

    def out(self, run: str) -> str:
        return self.runs[run].stdout + self.runs[run].stderr


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Checkout:
    base = tmp_path_factory.mktemp("onetrainer_launch")
    root = base / "OneTrainer"
    shutil.copytree(str(ROOT), root, ignore=shutil.ignore_patterns(".git", "venv", "__pycache__", "workspace*"))
    before = _tree(root)
    # the files only (TE_ALIGN_NO_INSTALL, i.e. --no-install): the launches run this repository's te_align
    # from PYTHONPATH, and patch must not install a wheel into (nor unpatch remove it from) the trainer's python
    patch = _run([sys.executable, "-m", "te_align", "patch", str(root)], REPO, TE_ALIGN_NO_INSTALL="1")
    return Checkout(root, before, base, patch)


def _family(checkout: Checkout, name: str, launches: dict[str, tuple[dict[str, Any], bool]]) -> Family:
    """Build ``name``'s files, then launch ``scripts/train.py`` once per entry of ``launches``: run name ->
    (config changes, hooked: the fitted profile's overrides in TE_ALIGN_OVERRIDES, else TE_ALIGN=off). A run
    other than "hooked" gets its own cache, workspace and output folders; one whose changes name
    ``copy_cache_from`` starts from a copy of that run's cache."""
    fam_dir = checkout.base / name
    _run([str(PYTHON), "-m", SUPPORT, "build", str(fam_dir), name], REPO)
    fam = Family(name, fam_dir, json.loads((fam_dir / "overrides.json").read_text(encoding="utf-8")))
    for run, (changes, hooked) in launches.items():
        env = {"TE_ALIGN_OVERRIDES": json.dumps(fam.overrides)} if hooked else {"TE_ALIGN": "off"}
        cfg = json.loads((fam_dir / "config.json").read_text(encoding="utf-8"))
        changes = dict(changes)
        source = changes.pop("copy_cache_from", None)
        if run != "hooked":
            cfg.update(cache_dir=str(fam_dir / f"cache-{run}"), workspace_dir=str(fam_dir / f"workspace-{run}"),
                       output_model_destination=str(fam_dir / f"out-{run}" / "lora.safetensors"))  # fmt: skip
        cfg.update(changes)
        if source is not None:
            shutil.copytree(fam_dir / f"cache-{source}", cfg["cache_dir"])
        path = fam_dir / f"config-{run}.json"
        path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        fam.runs[run] = _run([str(PYTHON), "scripts/train.py", "--config-path", str(path)], checkout.root, **env)
    return fam


@pytest.fixture(scope="module")
def sd15(checkout: Checkout) -> Family:
    return _family(checkout, "sd15", {
        "hooked": ({}, True),
        "off": ({}, False),
        "stale": ({"only_cache": True, "copy_cache_from": "off"}, True),  # hooked on OneTrainer's own cache
        # LoRA on the text encoder too: no text cache, encode_text runs the encoder with gradients
        "te": ({"text_encoder": {"weight_dtype": "FLOAT_32", "train": True}, "samples": []}, True),
    })  # fmt: skip


@pytest.fixture(scope="module")
def sd3(checkout: Checkout) -> Family:
    return _family(checkout, "sd3", {"hooked": ({}, True)})


@pytest.fixture(scope="module")
def flux(checkout: Checkout) -> Family:
    return _family(checkout, "flux", {"hooked": ({}, True)})


def _cached(folder: Path) -> list[dict[str, Any]]:
    """Every cached caption entry (mgds DiskCache: <group>/variation-<n>/<index>.pt, a dict of tensors)."""
    import torch

    items = [torch.load(p, weights_only=False, map_location="cpu") for p in sorted(folder.rglob("*.pt"))
             if p.name != "aggregate.pt"]  # fmt: skip
    assert items, f"no cached text under {folder}"
    return items


def _assert_cache_equals_te_align_encode(fam: Family, folder: Path) -> dict[str, Any]:
    """Each cached entry equals te_align.encode of its caption exactly (the reference the build step computed in
    the OneTrainer environment); every caption is cached once. Returns the first entry."""
    import torch
    from safetensors import safe_open

    from tests.support.onetrainer_run import CAPTIONS, REFERENCE, RUNS

    with safe_open(str(fam.dir / REFERENCE), framework="pt") as f:
        assert f.metadata()["fingerprint"] == fam.profile().fingerprint()  # the same profile in both environments
        want = {k: f.get_tensor(k) for k in f.keys()}
    token_keys = [t for t, _, _, _ in RUNS[fam.name].cache_keys.values()]
    items = _cached(folder)
    matched = []
    for item in items:
        i = next(i for i in range(len(CAPTIONS)) if all(torch.equal(item[t], want[f"{i}/{t}"]) for t in token_keys))
        keys = [k.split("/", 1)[1] for k in want if k.startswith(f"{i}/")]
        assert {k for k in item if item[k] is not None} == set(keys)
        for k in keys:
            assert torch.equal(item[k], want[f"{i}/{k}"]), (fam.name, i, k)
        matched.append(i)
    assert sorted(matched) == list(range(len(CAPTIONS)))
    return items[0]


def test_sd15_hooked_launch_trains_and_announces_te_align(sd15: Family) -> None:
    from te_align.trainers.onetrainer.hooks import cache_folder

    out, p = sd15.out("hooked"), sd15.profile()
    assert "te-align: OneTrainer hooks active (" in out
    assert (f"te-align: OneTrainer StableDiffusionBaseDataLoader data loader tokenizes (1) and encodes (1) by profile "
            f"sd15 (fingerprint {p.fingerprint()[:12]})") in out  # fmt: skip
    assert f"te-align: OneTrainer text cache keyed by profile sd15: {sd15.dir / 'cache' / 'text' / cache_folder(p)}" in out
    assert (sd15.dir / "out" / "lora.safetensors").is_file()
    # the sampler's prompt goes through the hooked encode_text (text=...): one image after each step
    assert len(list((sd15.dir / "workspace" / "samples").rglob("*.jpg"))) == STEPS


def test_sd15_text_cache_is_the_profiles_and_equals_te_align_encode(sd15: Family) -> None:
    from te_align.trainers.onetrainer.hooks import cache_folder

    text = sd15.dir / "cache" / "text"
    assert [c.name for c in text.iterdir()] == [cache_folder(sd15.profile())]
    _assert_cache_equals_te_align_encode(sd15, text / cache_folder(sd15.profile()))


def test_sd15_te_align_off_runs_onetrainer_unmodified(sd15: Family) -> None:
    import torch

    from te_align.trainers.onetrainer.hooks import CACHE_PREFIX

    assert "te-align" not in sd15.out("off")
    assert (sd15.dir / "out-off" / "lora.safetensors").is_file()
    text = sd15.dir / "cache-off" / "text"
    assert not [c.name for c in text.iterdir() if c.name.startswith(CACHE_PREFIX)]
    off = {tuple(it["tokens"].tolist()): it["text_encoder_hidden_state"] for it in _cached(text)}
    on = {tuple(it["tokens"].tolist()): it["text_encoder_hidden_state"] for it in _cached(sd15.dir / "cache" / "text")}
    assert set(off) == set(on)  # the same tokens (CLIP at 77 either way) ...
    assert all(not torch.equal(off[k], on[k]) for k in off)  # ... OneTrainer's last layer vs the profile's penultimate


def test_sd15_stale_cache_entries_are_counted_and_re_encoded(sd15: Family) -> None:
    """Hooked on a cache OneTrainer made without te-align: its 4 caption entries are named stale (mgds'
    aggregate.pt is no entry), left in place, and the texts re-encoded into the profile's folder."""
    from te_align.trainers.onetrainer.hooks import cache_folder

    p = sd15.profile()
    text = sd15.dir / "cache-stale" / "text"
    assert (f"te-align: 4 cached text-encoder file(s) in {text} were made without te-align or with another profile; "
            f"texts are re-encoded by profile sd15 into {cache_folder(p)}") in sd15.out("stale")  # fmt: skip
    old = [c.name for c in (sd15.dir / "cache-off" / "text").iterdir()]
    assert sorted(c.name for c in text.iterdir()) == sorted([*old, cache_folder(p)])
    assert len(_cached(text / cache_folder(p))) == 4


def test_sd15_text_encoder_lora_trains_through_the_hooked_encode_text(sd15: Family) -> None:
    """Text encoder trained: nothing cached, the hooked encode_text encodes the batch's tokens with gradients by
    the profile's penultimate layer, so the LoRA of every layer but the last is trained and the last gets none."""
    from safetensors.torch import load_file

    assert ("StableDiffusionBaseDataLoader data loader tokenizes (1) and encodes (0) by profile sd15"
            in sd15.out("te"))  # fmt: skip
    assert not (sd15.dir / "cache-te" / "text").exists()
    lora = load_file(str(sd15.dir / "out-te" / "lora.safetensors"))
    ups = {k: bool(v.abs().sum() > 0) for k, v in lora.items() if k.startswith("lora_te_") and k.endswith("lora_up.weight")}
    last = f"lora_te_text_model_encoder_layers_{sd15.overrides['slots.clip_l.encoder.num_layers'] - 1}_"
    assert len(ups) == 6 * sd15.overrides["slots.clip_l.encoder.num_layers"]  # q, k, v, out, fc1, fc2 per layer
    assert {k: trained for k, trained in ups.items() if k.startswith(last)} == dict.fromkeys(
        [k for k in ups if k.startswith(last)], False)  # fmt: skip
    assert all(trained for k, trained in ups.items() if not k.startswith(last))


def test_sd3_hooked_launch_caches_t5_at_the_profiles_256_tokens(sd3: Family) -> None:
    from te_align.trainers.onetrainer.hooks import cache_folder

    p = sd3.profile()
    out = sd3.out("hooked")
    assert (f"te-align: OneTrainer StableDiffusion3BaseDataLoader data loader tokenizes (3) and encodes (3) by profile "
            f"sd3-medium (fingerprint {p.fingerprint()[:12]})") in out  # fmt: skip
    assert (sd3.dir / "out" / "lora.safetensors").is_file()
    assert len(list((sd3.dir / "workspace" / "samples").rglob("*.jpg"))) == STEPS
    text = sd3.dir / "cache" / "text"
    assert [c.name for c in text.iterdir()] == [cache_folder(p)]
    first = _assert_cache_equals_te_align_encode(sd3, text / cache_folder(p))
    assert first["tokens_3"].shape == (256,) and first["text_encoder_3_hidden_state"].shape == (256, 96)


def test_flux_hooked_launch_caches_t5_at_the_profiles_512_tokens(flux: Family) -> None:
    from te_align.trainers.onetrainer.hooks import cache_folder

    p = flux.profile()
    assert (f"te-align: OneTrainer FluxBaseDataLoader data loader tokenizes (2) and encodes (2) by profile flux-dev "
            f"(fingerprint {p.fingerprint()[:12]})") in flux.out("hooked")  # fmt: skip
    assert (flux.dir / "out" / "lora.safetensors").is_file()
    text = flux.dir / "cache" / "text"
    assert [c.name for c in text.iterdir()] == [cache_folder(p)]
    first = _assert_cache_equals_te_align_encode(flux, text / cache_folder(p))
    assert first["tokens_2"].shape == (512,) and first["text_encoder_2_hidden_state"].shape == (512, 96)


def _has_pyside6() -> bool:
    return subprocess.run([str(PYTHON), "-c", "import PySide6"], capture_output=True, check=False).returncode == 0


def test_gui_training_start_goes_through_te_align(checkout: Checkout, sd15: Family) -> None:
    """The patched Qt GUI (``scripts/train_ui_qt.py``), driven headless: its "start training" trains in the GUI's
    process with te-align's hooks, and the text cache is the profile's, equal to ``te_align.encode``."""
    from te_align.trainers.onetrainer.hooks import cache_folder

    if not _has_pyside6():
        pytest.skip(f"OneTrainer's GUI needs PySide6, which {ENV_PYTHON}={PYTHON} cannot import")
    cfg = json.loads((sd15.dir / "config.json").read_text(encoding="utf-8"))
    cfg.update(cache_dir=str(sd15.dir / "cache-gui"), workspace_dir=str(sd15.dir / "workspace-gui"),
               output_model_destination=str(sd15.dir / "out-gui" / "lora.safetensors"), samples=[],
               output_model_format="LEGACY_LORA")  # the GUI loads the format as given (train.py migrates SAFETENSORS)  # fmt: skip
    for folder in ("cache-gui", "workspace-gui", "out-gui"):  # the GUI's form requires existing folders
        (sd15.dir / folder).mkdir(exist_ok=True)
    path = sd15.dir / "config-gui.json"
    path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    # the GUI runs in the checkout and saves its presets there: a copy of the patched checkout keeps the original
    # copy byte-comparable for the unpatch test
    gui_root = checkout.base / "OneTrainer-gui"
    if not gui_root.exists():
        shutil.copytree(checkout.root, gui_root)
    proc = _run([str(PYTHON), "-m", "tests.support.onetrainer_gui", str(gui_root), str(path)], gui_root,
                QT_QPA_PLATFORM="offscreen", TE_ALIGN_OVERRIDES=json.dumps(sd15.overrides))  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "gui: training started: True" in out and "gui: training finished" in out
    assert "te-align: OneTrainer hooks active (" in out
    assert (sd15.dir / "out-gui" / "lora.safetensors").is_file()
    text = sd15.dir / "cache-gui" / "text"
    assert [c.name for c in text.iterdir()] == [cache_folder(sd15.profile())]
    _assert_cache_equals_te_align_encode(sd15, text / cache_folder(sd15.profile()))


def test_unpatch_restores_every_byte(checkout: Checkout, sd15: Family, sd3: Family, flux: Family) -> None:
    """After every launch (the fixtures ran them): ``te-align unpatch`` gives back the copied checkout exactly."""
    assert "replace scripts/train.py" in checkout.patch.stdout
    assert sd15.runs and sd3.runs and flux.runs
    _run([sys.executable, "-m", "te_align", "unpatch", str(checkout.root)], REPO)
    assert _tree(checkout.root) == checkout.before
