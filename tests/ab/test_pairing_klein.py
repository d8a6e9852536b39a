"""The pairing test (``tests/ab/test_pairing.py``) for the klein rows (issue 49), on a tiny random klein world base
written into a temporary world data root (``tests/train/klein_world.py``): the shipped klein base does not exist yet.

Each row's two arms are trained for two steps by the row's own settings (``train_config_dict``, the arms' profiles) on a
smaller draw of its world data; the trainer records its draws (``te_align.train.record.recording_draws``) and the
conditioning each step hands ``Flux2Transformer2DModel`` is captured at the model. Both arms of a seed share images,
order, flips, noise, timesteps and the LoRA's initial weights, and their conditioning differs exactly as the row's
override says: arm A's (B, 512, 96) equals the pipeline's own steps done the deviating way."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from te_align.tiny.pipelines import missing_pipeline  # noqa: E402

_REASON = missing_pipeline("flux2-klein")  # diffusers < 0.37 (the trainers' old environments) has no klein classes
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)

import diffusers  # noqa: E402

from te_align.ab import runner  # noqa: E402
from te_align.ab.matrix import matrix_presets  # noqa: E402
from te_align.ab.preset import Preset, train_config_dict  # noqa: E402
from te_align.profiles.overrides import resolve  # noqa: E402
from te_align.tiny import bases  # noqa: E402
from te_align.train import config_from_dict  # noqa: E402
from te_align.train.loop import train  # noqa: E402
from te_align.train.record import recording_draws  # noqa: E402
from tests.train.klein_world import write_klein_world  # noqa: E402

STEPS = 2
ROWS = sorted(p.name for p in matrix_presets() if p.world is not None and p.world.base == "klein")


def _small(p: Preset) -> Preset:
    """The row with a smaller world draw (16 training images): the draws' layout does not depend on the data's size."""
    assert p.world is not None
    return dataclasses.replace(p, world=dataclasses.replace(p.world, train_images=16, val_images=4))


class _Arms:
    """Each arm's recorded draws and the conditioning its steps handed the transformer, trained once per distinct
    config (the rows share their arm B; the positive control trains arm B's LoRA only)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        world, self.info = write_klein_world(root / "world")
        self.model = str(bases.materialize("klein", cache_dir=root / "cache", source=world))
        self.done: dict[str, tuple[list[dict[str, Any]], list[torch.Tensor]]] = {}

    def pipe(self) -> Any:
        pipe = diffusers.Flux2KleinPipeline.from_pretrained(self.model)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def config(self, p: Preset, arm: str) -> dict[str, Any]:
        assert p.world is not None
        p = _small(p)
        folder = self.root / "data" / "seed-0"
        data = runner._world_data(p, folder, lambda _: None, data_seed=p.world.data_seed)
        train_dir, _ = runner.split_data(data, folder, p.eval.holdout)
        base = resolve(p.profile, ("model.profile_overrides", self.info["profile_overrides"]))
        prof = p.arm_profiles(base)[0 if arm == "A" else 1]
        prof_path = self.root / "profiles" / f"{prof.fingerprint()}.toml"
        prof_path.parent.mkdir(parents=True, exist_ok=True)
        prof_path.write_text(prof.to_toml(), encoding="utf-8")
        return train_config_dict(p, model=self.model, data=str(train_dir), out="", profile=str(prof_path), seed=0,
                                 max_steps=STEPS, arm=arm)  # fmt: skip

    def draws(self, p: Preset, arm: str) -> tuple[list[dict[str, Any]], list[torch.Tensor]]:
        raw = self.config(p, arm)
        key = json.dumps(raw, sort_keys=True)
        if key not in self.done:
            raw["output"]["dir"] = str(self.root / "runs" / str(len(self.done)))
            pipe = self.pipe()
            seen: list[torch.Tensor] = []
            handle = pipe.transformer.register_forward_pre_hook(
                lambda _m, _a, kw: seen.append(kw["encoder_hidden_states"].detach().clone()), with_kwargs=True)
            try:
                with recording_draws() as rec:
                    train(config_from_dict(raw), pipeline=pipe)
            finally:
                handle.remove()
            self.done[key] = (list(rec), seen)
        return self.done[key]


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> _Arms:
    return _Arms(tmp_path_factory.mktemp("pairing-klein"))


@pytest.fixture(scope="module")
def ref(arms: _Arms) -> Any:
    return arms.pipe()


def _by_hand(pipe: Any, texts: list[str], *, layers: tuple[int, ...] = (9, 18, 27), thinking: bool = False,
             template: bool = True) -> torch.Tensor:  # fmt: skip
    """The pipeline's ``_get_qwen3_prompt_embeds`` steps done by hand, each caption alone: the chat template (or not),
    right padding to 512 with truncation, the mask into Qwen3, the taps stacked per token."""
    tok, rows = pipe.tokenizer, []
    for caption in texts:
        text = (tok.apply_chat_template([{"role": "user", "content": caption}], tokenize=False, add_generation_prompt=True,
                                        enable_thinking=thinking) if template else caption)  # fmt: skip
        batch = tok([text], padding="max_length", truncation=True, max_length=512, return_tensors="pt")
        with torch.no_grad():
            out = pipe.text_encoder(**batch, output_hidden_states=True, use_cache=False)
        rows.append(torch.stack([out.hidden_states[k] for k in layers], dim=1).permute(0, 2, 1, 3).reshape(1, 512, -1))
    return torch.cat(rows)


def test_the_klein_rows_are_the_plans() -> None:
    assert ROWS == ["world-klein-layers-10-20-30", "world-klein-no-template", "world-klein-null",
                    "world-klein-positive-cut", "world-klein-thinking-on"]


@pytest.mark.parametrize("name", ROWS)
def test_both_arms_share_every_draw_but_their_setting(arms: _Arms, ref: Any, name: str) -> None:
    p = {x.name: x for x in matrix_presets()}[name]
    a, cond_a = arms.draws(p, "A")
    b, cond_b = arms.draws(p, "B")
    assert [d["step"] for d in a] == [d["step"] for d in b] == list(range(STEPS))
    assert len(cond_a) == len(cond_b) == STEPS and all(c.shape == (8, 512, 96) for c in cond_a + cond_b)
    if p.baseline.null:  # a null control's arm A draws its own randomness: the setting that differs is the seed
        assert a[0]["lora"] != b[0]["lora"] and not torch.equal(a[0]["noise"], b[0]["noise"])
        return
    assert a[0]["lora"] == b[0]["lora"] != ""  # the LoRA's initial weights
    for da, db in zip(a, b, strict=True):
        assert da["batch"] == db["batch"] and da["flips"] == db["flips"]  # images and data order
        assert torch.equal(da["noise"], db["noise"]) and da["noise"].shape == (8, 32, 8, 8)  # patchified latents' shape
        assert torch.equal(da["timesteps"], db["timesteps"])
        assert da["drop"] == db["drop"] and da["texts"] == db["texts"]
    # the conditioning: arm B's is the pipeline's own; arm A's differs exactly as the row's override says
    deviation = {
        "world-klein-layers-10-20-30": {"layers": (10, 20, 30)},
        "world-klein-thinking-on": {"thinking": True},
        "world-klein-no-template": {"template": False},
        "world-klein-positive-cut": {},  # one LoRA, arm B's: arm A differs only when sampled (cut before "pink")
    }[name]
    for step, (da, ca, cb) in enumerate(zip(a, cond_a, cond_b, strict=True)):
        texts = da["texts"]
        assert torch.equal(cb, _by_hand(ref, texts)), step
        assert torch.equal(ca, _by_hand(ref, texts, **deviation)), step
        assert torch.equal(ca, cb) is (not deviation)
    if name == "world-klein-layers-10-20-30":  # the diffusers klein script's own call
        with torch.no_grad():
            embeds, _ = ref.encode_prompt(a[0]["texts"][:1], device="cpu", text_encoder_out_layers=(10, 20, 30))
        assert torch.equal(cond_a[0][:1], embeds)
    if p.baseline.cut_before:  # the positive control trains one LoRA: arm A's run is arm B's
        assert arms.config(p, "A") == arms.config(p, "B")
