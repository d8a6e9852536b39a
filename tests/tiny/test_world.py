"""The shapes world (te_align.tiny.world): rendering, sampling, captions, token positions, the reader."""

from __future__ import annotations

import hashlib
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from te_align.tiny import world
from te_align.tiny.world import reader as world_reader
from te_align.tiny.world import scenes as world_scenes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # tools/ is not installed
from world_pretrain.diagnostics import degrade

ROOT = Path(__file__).resolve().parents[2]
PINK = world.Concept("colour", "pink", holdout=(("shape", "triangle"),))


@pytest.fixture(scope="module")
def captions() -> list[world.Sample]:
    """400 samples of the default mix (no images): the caption statistics below are measured on them."""
    return world.make_dataset(400, 0, image_size=None)


@pytest.fixture(scope="module")
def tokenizer():
    return world.default_tokenizer()


# -- attribute space and rendering ------------------------------------------------------------------


def test_attribute_space():
    assert len(world.COLOURS) == 8 and len(world.SHAPES) == 4 and len(world.POSITIONS) == 9
    assert len(world.SIZES) == 3 and len(world.STYLES) == 2
    assert len(world.BACKGROUND_KINDS) == 4 and len(world.BACKGROUND_TONES) == 3
    # palette hues are in hue order and well apart (>= 25 degrees), every colour saturated
    angles = np.degrees(world_reader._PALETTE_ANGLE) % 360
    gaps = np.diff(np.r_[np.sort(angles), np.sort(angles)[0] + 360])
    assert gaps.min() >= 25.0
    order = list(np.argsort(angles))
    assert order[order.index(0) :] + order[: order.index(0)] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert min(np.hypot(*world_reader._PALETTE_AB.T)) >= 115.0
    # backgrounds are neutral grey
    for kind in world.BACKGROUND_KINDS:
        for tone in world.BACKGROUND_TONES:
            img = world.render(world.Scene((), world.Background(kind, tone, 5)))
            assert img.shape == (64, 64, 3) and img.dtype == np.uint8
            assert np.array_equal(img[:, :, 0], img[:, :, 1]) and np.array_equal(img[:, :, 1], img[:, :, 2])
            spread = int(img.max()) - int(img.min())
            assert spread == 0 if kind == "plain" else 0 < spread <= 2 * 14 + 1


def test_sampled_scenes_cover_the_space_without_overlap():
    rng = np.random.default_rng(0)
    scenes = [world.sample_scene(rng) for _ in range(600)]
    counts = Counter(len(s.objects) for s in scenes)
    assert set(counts) == {1, 2, 3}
    for attr in ("colour", "shape", "position", "size", "style"):
        assert {o.get(attr) for s in scenes for o in s.objects} == set(world.SPACE.values(attr))
    assert {(s.background.kind, s.background.tone) for s in scenes} == {
        (k, t) for k in world.BACKGROUND_KINDS for t in world.BACKGROUND_TONES
    }
    for s in scenes[:100]:
        assert len({o.position for o in s.objects}) == len(s.objects)
        # every object's pixels stay inside its own grid cell (so objects never touch)
        for size in (32, 64, 128):
            cell = size / 3
            for o in s.objects:
                cx, cy, side = world_scenes._geometry(o, size)
                row, col = divmod(world.POSITIONS.index(o.position), 3)
                assert col * cell < cx - side / 2 and cx + side / 2 < (col + 1) * cell
                assert row * cell < cy - side / 2 and cy + side / 2 < (row + 1) * cell


def test_render_is_deterministic_and_exact():
    scene = world.Scene(
        (
            world.SceneObject("red", "circle", "top left", "large", "fill", (0.5, -0.25)),
            world.SceneObject("blue", "triangle", "center", "medium", "outline"),
            world.SceneObject("yellow", "cross", "bottom right", "small", "fill", (-1.0, 1.0)),
        ),
        world.Background("plain", "light gray"),
    )
    img = world.render(scene)
    assert np.array_equal(img, world.render(scene))
    # plain backgrounds use only exact arithmetic: the bytes are the same on every machine
    assert hashlib.sha256(img.tobytes()).hexdigest()[:16] == "43422287098fca4a"
    assert tuple(img[0, 0]) == (196, 196, 196)
    cx, cy, _ = world_scenes._geometry(scene.objects[0], 64)
    assert tuple(img[int(cy), int(cx)]) == world.COLOURS["red"]
    # the outlined triangle is hollow: its centre shows the background
    assert tuple(img[32, 32]) == (196, 196, 196)
    for size in (32, 128):
        assert world.render(scene, size).shape == (size, size, 3)


def test_dataset_is_deterministic_per_seed_and_per_sample():
    a = world.make_dataset(12, 3)
    b = world.make_dataset(12, 3)
    c = world.make_dataset(12, 4)
    assert [s.caption for s in a] == [s.caption for s in b]
    assert all(np.array_equal(x.image, y.image) for x, y in zip(a, b, strict=True))
    assert b"".join(s.image.tobytes() for s in a) != b"".join(s.image.tobytes() for s in c)
    assert [s.caption for s in a] != [s.caption for s in c]
    # a sample depends only on (seed, split, index): prefixes and offsets agree
    tail = world.make_dataset(4, 3, start=8)
    assert [s.caption for s in tail] == [s.caption for s in a[8:]]
    # the scenes do not depend on the caption options
    d = world.make_dataset(12, 3, caption_dropout=0.5, style_mix={"tags": 1.0}, image_size=None, tokenizer=False)
    assert [s.scene for s in d] == [s.scene for s in a]
    assert all(s.style in ("tags", "empty") for s in d) and all(s.n_tokens == -1 for s in d)


# -- captions ---------------------------------------------------------------------------------------


def test_caption_length_distribution(captions):
    lengths = np.array([s.n_tokens for s in captions])
    styles = Counter(s.style for s in captions)
    assert styles == {"long": 161, "tags": 122, "short": 117}
    assert ((lengths > 77).sum(), (lengths > 154).sum(), (lengths > 256).sum()) == (207, 90, 40)
    assert lengths.max() <= 512
    long_ = np.array([s.n_tokens for s in captions if s.style == "long"])
    assert (long_ > 77).mean() > 0.9
    short = np.array([s.n_tokens for s in captions if s.style != "long"])
    assert short.max() <= 154
    assert Counter(s.emphasis for s in captions) == {"none": 352, "weight": 27, "bang": 21}
    assert Counter(s.placement for s in captions if s.style == "long") == {
        "start": 58,
        "middle": 37,
        "spread": 34,
        "end": 32,
    }


def test_token_positions_decode_to_the_object_descriptions(captions, tokenizer):
    late = early = 0
    for s in captions:
        ids = tokenizer(s.caption).input_ids
        assert len(ids) == s.n_tokens and ids[-1] == tokenizer.eos_token_id
        assert len(s.spans) == len(s.objects)
        for o, sp in zip(s.objects, s.spans, strict=True):
            text = s.caption[sp.char_start : sp.char_end]
            assert tokenizer.decode(ids[sp.token_start : sp.token_end]) == text
            assert tokenizer.decode(ids[: sp.token_start]) == s.caption[: sp.char_start].rstrip()
            for word in (o.colour, o.shape, o.position):
                assert word in text
            if s.style == "long":
                late += sp.token_start >= 76
                early += sp.token_end <= 76
        # colour and shape words appear only inside object descriptions
        covered = np.zeros(len(s.caption), dtype=bool)
        for sp in s.spans:
            covered[sp.char_start : sp.char_end] = True
        for m in re.finditer(r"\b(" + "|".join([*world.COLOURS, *world.SHAPES]) + r")\b", s.caption):
            assert covered[m.start()], (s.caption, m.group())
    # truncation at 77 T5 tokens loses some objects of long captions entirely and keeps others
    assert late > 100 and early > 100


def test_caption_styles_and_emphasis():
    scene = world.Scene(
        (
            world.SceneObject("red", "circle", "top left"),
            world.SceneObject("blue", "square", "bottom right", "small", "outline"),
        ),
        world.Background("stripes", "white"),
    )
    rng = np.random.default_rng(0)
    tags = world.caption_scene(scene, rng, "tags")
    assert tags.text.endswith(
        "red circle, top left, small outlined blue square, bottom right, striped background, white background"
    )
    short = world.caption_scene(scene, np.random.default_rng(1), "short", emphasis="bang")
    assert (
        short.text.endswith("!")
        and "a red circle" in short.text
        and "a small outlined blue square" in short.text
    )
    weighted = world.caption_scene(scene, np.random.default_rng(2), "tags", emphasis="weight")
    assert re.search(r"\((red circle|small outlined blue square):(1\.[1-4]|0\.8)\)", weighted.text)
    bang_tags = world.caption_scene(scene, np.random.default_rng(2), "tags", emphasis="bang")
    assert "circle!" in bang_tags.text or "square!" in bang_tags.text
    empty = world.caption_scene(scene, rng, "empty")
    assert empty.text == "" and empty.char_spans == ((0, 0), (0, 0))
    with pytest.raises(ValueError, match="caption style"):
        world.caption_scene(scene, rng, "poem")


def test_caption_dropout_rate():
    plain = world.make_dataset(200, 1, image_size=None, tokenizer=False)
    dropped = world.make_dataset(200, 1, image_size=None, tokenizer=False, caption_dropout=0.25)
    assert not any(s.caption == "" for s in plain)
    empty = [s for s in dropped if s.style == "empty"]
    assert len(empty) == 54 and all(s.caption == "" and s.spans[0].char_end == 0 for s in empty)
    # the samples that keep their caption keep the same caption
    for a, b in zip(plain, dropped, strict=True):
        assert b.style == "empty" or a.caption == b.caption
    with pytest.raises(ValueError, match="caption_dropout"):
        world.make_dataset(1, 1, caption_dropout=1.5, image_size=None, tokenizer=False)


# -- held-out concepts ------------------------------------------------------------------------------


def test_concept_splits():
    opts = dict(concept=PINK, image_size=None, tokenizer=False)
    base = world.make_dataset(300, 0, split="base", **opts)
    concept = world.make_dataset(300, 0, split="concept", **opts)
    val = world.make_dataset(100, 0, split="validation", **opts)
    assert not any(o.colour == "pink" for s in base for o in s.objects)
    assert not any("pink" in s.caption for s in base)
    assert all(sum(o.colour == "pink" for o in s.objects) == 1 for s in concept)
    assert not any(PINK.held_out(o) for s in concept for o in s.objects)
    assert {o.shape for s in concept for o in s.objects if o.colour == "pink"} == {
        "square",
        "circle",
        "cross",
    }
    assert all(sum(PINK.held_out(o) for o in s.objects) == 1 for s in val)
    assert all("pink triangle" in s.caption or s.caption == "" for s in val)
    # the other objects are drawn from the base space; splits are different streams
    assert not any(o.colour == "pink" for s in val for o in s.objects if o.shape != "triangle")
    assert [s.scene for s in world.make_dataset(5, 0, split="all", image_size=None, tokenizer=False)] != [
        s.scene for s in base[:5]
    ]
    # a concept without holdout: validation is just fresh concept scenes
    style = world.Concept("style", "outline")
    val2 = world.make_dataset(30, 0, split="validation", concept=style, image_size=None, tokenizer=False)
    assert all(any(o.style == "outline" for o in s.objects) for s in val2)
    # a held-out position
    cross = world.Concept("shape", "cross", holdout=(("position", "center"),))
    con3 = world.make_dataset(60, 0, split="concept", concept=cross, image_size=None, tokenizer=False)
    val3 = world.make_dataset(30, 0, split="validation", concept=cross, image_size=None, tokenizer=False)
    assert not any(o.shape == "cross" and o.position == "center" for s in con3 for o in s.objects)
    assert all(any(o.shape == "cross" and o.position == "center" for o in s.objects) for s in val3)
    with pytest.raises(ValueError, match="needs a concept"):
        world.make_dataset(1, 0, split="base", image_size=None, tokenizer=False)
    with pytest.raises(ValueError, match=r"Concept\.value"):
        world.Concept("colour", "teal")
    with pytest.raises(ValueError, match=r"Concept\.holdout"):
        world.Concept("colour", "pink", holdout=(("colour", "red"),))


# -- the reader -------------------------------------------------------------------------------------


def _scenes(seed: int, n: int) -> list[world.Scene]:
    rng = np.random.default_rng(seed)
    return [world.sample_scene(rng) for _ in range(n)]


def test_reader_on_clean_renders():
    """Exact figures on a fixed set: 120 scenes at 64 px, 60 at 32 px, 8 at 128 px (all backgrounds,
    sizes and styles). The 2,000-scene validation runs in benchmarks/world/bench_world.py and the slow test."""
    for size, n, objects in ((64, 120, 237), (32, 60, 115), (128, 8, 14)):
        scenes = _scenes(size, n)
        result = world.evaluate([world.render(s, size) for s in scenes], scenes)
        assert result["objects"] == objects
        assert result["object_accuracy"] == 1.0 and result["image_accuracy"] == 1.0, (size, result)
    # the reader also reads size and style exactly on clean renders
    for s in _scenes(64, 40):
        read = world.read_objects(world.render(s))
        truth = sorted(s.objects, key=lambda o: world.POSITIONS.index(o.position))
        assert [(o.key, o.size, o.style) for o in read] == [(o.key, o.size, o.style) for o in truth]


def test_reader_on_noisy_renders():
    scenes = _scenes(5, 60)
    noisy = [degrade(world.render(s), noise=16, blur=0.8, seed=i) for i, s in enumerate(scenes)]
    result = world.evaluate(noisy, scenes)
    assert result["object_accuracy"] == 1.0


def test_reader_on_empty_backgrounds_returns_nothing():
    for kind in world.BACKGROUND_KINDS:
        for tone in world.BACKGROUND_TONES:
            scene = world.Scene((), world.Background(kind, tone, 11))
            assert world.read_image(world.render(scene)) == []
            assert world.read_image(degrade(world.render(scene), noise=32, seed=1)) == []
            assert world.read_image(world.render(scene, 32)) == []
    assert world.score(world.render(world.Scene(())), world.Scene(()))["image_exact"] == 1.0


def test_score_gives_partial_credit():
    truth = world.Scene((world.SceneObject("red", "circle", "top left"), world.SceneObject("blue", "square", "center")))
    drawn = world.Scene((world.SceneObject("red", "square", "top left"), world.SceneObject("green", "square", "center")))
    assert world.read_image(world.render(drawn)) == [("red", "square", "top left"), ("green", "square", "center")]
    r = world.score(world.render(drawn), truth)
    assert r["exact"] == 0 and r["object_accuracy"] == 0.0 and r["image_exact"] == 0.0
    assert (r["colour"], r["shape"], r["position"]) == (0.5, 0.5, 1.0)
    assert r["attribute_accuracy"] == pytest.approx(2 / 3)
    r = world.score(world.render(truth), [("blue", "square", "center")])
    assert (r["exact"], r["extra"], r["object_accuracy"], r["image_exact"]) == (1, 1, 1.0, 0.0)
    r = world.score(world.render(world.Scene(())), truth)
    assert (r["read"], r["object_accuracy"], r["colour"]) == (0, 0.0, 0.0)


def test_grid_shows_the_images_upscaled():
    samples = world.make_dataset(5, 2, tokenizer=False)
    img = world.grid([s.image for s in samples], [s.caption for s in samples], columns=3)
    arr = np.asarray(img)
    assert img.size == (3 * (192 + 8) + 8, 2 * (192 + 4 + 4 * 12 + 8) + 8)
    # the first tile is the first image scaled 3x with nearest neighbour
    assert np.array_equal(arr[8 : 8 + 192 : 3, 8 : 8 + 192 : 3], samples[0].image)
    with pytest.raises(ValueError, match="labels"):
        world.grid([samples[0].image], ["a", "b"])


def test_world_imports_no_torch():
    code = "import sys, te_align.tiny.world; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


@pytest.mark.skipif(
    not os.environ.get("TE_ALIGN_SLOW"), reason="set TE_ALIGN_SLOW=1 for the 2,000-scene reader check"
)
def test_reader_on_2000_clean_scenes():
    scenes = _scenes(2000, 2000)
    sizes = (64, 32, 128)
    images = [world.render(s, sizes[i % 3] if i % 10 == 0 else 64) for i, s in enumerate(scenes)]
    result = world.evaluate(images, scenes)
    assert result["object_accuracy"] >= 0.99 and math.isfinite(result["image_accuracy"])
    assert result["objects"] == 4006 and result["object_accuracy"] == 1.0
