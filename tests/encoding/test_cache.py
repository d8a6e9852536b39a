"""Embedding cache: keys, round trips, atomic writes, corruption recovery, concurrency, and the cache CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import re
import struct
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import te_align
from te_align.cli import main
from te_align.encoding.cache.admin import scan
from te_align.encoding.cache.keys import cache_key, canonical_options, hash_text_encoders
from te_align.encoding.cache.store import EmbeddingCache
from te_align.encoding.conditioning import Conditioning
from te_align.errors import CacheError

PROFILE = "sd35-large"


def fingerprint() -> str:
    return te_align.profile(PROFILE).fingerprint()


def custom_profile() -> te_align.AlignmentProfile:
    """A non-bundled profile with a different name and behaviour."""
    return dataclasses.replace(te_align.profile(PROFILE, t5_max_length=512), name="custom-512", aliases=())


def encode_captions(captions: list[str], fp: str | None = None, name: str = PROFILE) -> Conditioning:
    """A deterministic stand-in encoder: embeddings seeded by each caption's sha256."""
    rows = []
    for c in captions:
        seed = int(hashlib.sha256(c.encode("utf-8")).hexdigest()[:12], 16)
        rows.append(torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(seed)))
    emb = torch.cat(rows)
    return Conditioning(
        {
            "prompt_embeds": emb.to(torch.bfloat16),
            "pooled_prompt_embeds": emb[:, 0, :8].clone(),
            "text_ids": torch.zeros(6, 3),
            "attention_mask": torch.ones(len(captions), 6, dtype=torch.int64),
        },
        name,
        fp or fingerprint(),
        [len(c.split()) for c in captions],
        shared=("text_ids",),  # as the product's encoders do: a batch of 6 would otherwise slice it
    )


class Recorder:
    def __init__(self, fp: str | None = None, name: str = PROFILE) -> None:
        self.calls: list[list[str]] = []
        self.fp = fp
        self.name = name

    def __call__(self, captions: list[str]) -> Conditioning:
        self.calls.append(list(captions))
        return encode_captions(captions, self.fp, self.name)


def make_cache(d: Path, profile: object = PROFILE, te: str = "te-hash-1", options: dict | None = None) -> EmbeddingCache:
    return EmbeddingCache(d, profile, te, {"max_chunks": 1} if options is None else options)  # type: ignore[arg-type]


def entry_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*.safetensors"))


def temp_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.name.endswith(".tmp"))


def same(a: Conditioning, b: Conditioning) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


# --------------------------------------------------------------------------------- Conditioning
def test_conditioning_index_split_cat_to() -> None:
    c = encode_captions(["one two", "three", "four five six"])
    assert c.batch_size == 3 and list(c.keys()) == ["prompt_embeds", "pooled_prompt_embeds", "text_ids", "attention_mask"]
    one = c.index(1)
    assert one.batch_size == 1 and one.token_counts == [1]
    assert one["prompt_embeds"].shape == (1, 6, 16) and torch.equal(one["prompt_embeds"][0], c["prompt_embeds"][1])
    assert one["text_ids"].shape == (6, 3)  # no batch dimension: shared, not sliced
    assert torch.equal(c.index(-1)["pooled_prompt_embeds"], c["pooled_prompt_embeds"][2:3])
    with pytest.raises(IndexError):
        c.index(3)
    back = Conditioning.cat(c.split())
    assert same(back, c) and back.token_counts == c.token_counts
    half = c.to(dtype=torch.float16)
    assert half["prompt_embeds"].dtype == torch.float16 and half["attention_mask"].dtype == torch.int64
    with pytest.raises(KeyError, match="prompt_embeds"):
        c["nope"]
    explicit = Conditioning({"a": torch.zeros(2, 4), "ids": torch.zeros(2, 3)}, "x", "f", None, shared=("ids",))
    assert explicit.index(0)["ids"].shape == (2, 3) and explicit.index(0)["a"].shape == (1, 4)


def test_named_shared_tensor_survives_a_batch_as_long_as_itself(tmp_path: Path) -> None:
    # text_ids is (6, 3): a batch of exactly 6 captions must not slice it (CI once stored (1, 3))
    six = [f"caption {i}" for i in range(6)]
    batch = encode_captions(six)
    assert batch.batch_size == 6 and not batch.is_batched("text_ids")
    assert all(one["text_ids"].shape == (6, 3) for one in batch.split())
    cache = make_cache(tmp_path)
    cache.get_or_encode(six, encode_captions)
    assert all(same(make_cache(tmp_path).get(c), encode_captions([c])) for c in six)  # type: ignore[arg-type]
    # unnamed, the fallback cannot tell a (6, 3) table from a batch of 6: why encoders must name it
    unnamed = Conditioning(dict(batch.tensors), batch.profile_name, batch.fingerprint, batch.token_counts)
    assert unnamed.index(0)["text_ids"].shape == (1, 3)


# ----------------------------------------------------------------------------------------- keys
def test_cache_key_changes_with_every_input_and_only_then() -> None:
    base = ("fp-a", "te-a", "a red fox", {"max_chunks": 3, "dropout": {"policy": "none", "p": 0.1}})
    k = cache_key(*base)
    assert len(k) == 64 and k == cache_key(*base)
    # same options in another order: same key
    assert k == cache_key("fp-a", "te-a", "a red fox", {"dropout": {"p": 0.1, "policy": "none"}, "max_chunks": 3})
    variants = [
        ("fp-b", "te-a", "a red fox", base[3]),
        ("fp-a", "te-b", "a red fox", base[3]),
        ("fp-a", "te-a", "a red fox ", base[3]),
        ("fp-a", "te-a", "A red fox", base[3]),
        ("fp-a", "te-a", "a red fox", {"max_chunks": 4, "dropout": {"policy": "none", "p": 0.1}}),
        ("fp-a", "te-a", "a red fox", {"max_chunks": 3.0, "dropout": {"policy": "none", "p": 0.1}}),
        ("fp-a", "te-a", "a red fox", {"max_chunks": 3, "dropout": {"policy": "none", "p": 0.2}}),
        ("fp-a", "te-a", "a red fox", {"max_chunks": 3}),
        ("fp-a", "te-a", "a red fox", {}),
    ]
    keys = {cache_key(*v) for v in variants}
    assert len(keys) == len(variants) and k not in keys
    # the exact caption string: composed vs decomposed unicode are different captions
    cafe = "café"
    assert cache_key("f", "t", unicodedata.normalize("NFC", cafe), {}) != cache_key("f", "t", unicodedata.normalize("NFD", cafe), {})
    # no ambiguity between fields
    assert cache_key("ab", "c", "x", {}) != cache_key("a", "bc", "x", {})


def test_canonical_options_rejects_inexact_values() -> None:
    assert canonical_options({"b": [1, 2], "a": None}) == '{"a":null,"b":[1,2]}'
    for bad in ({"p": float("nan")}, {"p": float("inf")}, {"p": {1: 2}}, {"p": object()}):
        with pytest.raises(CacheError):
            canonical_options(bad)


def test_profile_te_hash_and_options_change_the_entry(tmp_path: Path) -> None:
    base = make_cache(tmp_path)
    base.put("a fox", encode_captions(["a fox"]))
    assert base.get("a fox") is not None
    other_profile = custom_profile()
    others = [
        make_cache(tmp_path, profile=other_profile),
        make_cache(tmp_path, te="te-hash-2"),
        make_cache(tmp_path, options={"max_chunks": 2}),
        make_cache(tmp_path, options={}),
    ]
    for c in others:
        assert c.key("a fox") != base.key("a fox")
        assert c.get("a fox") is None
    # an equal configuration reuses the entry, aliases included
    again = make_cache(tmp_path, profile="sd3.5-large")
    assert again.key("a fox") == base.key("a fox") and again.get("a fox") is not None
    # the wrong profile's conditioning is refused
    with pytest.raises(CacheError, match="encoded by"):
        others[0].put("a fox", encode_captions(["a fox"]))
    with pytest.raises(CacheError, match="batch of 2"):
        base.put("x", encode_captions(["x", "y"]))


def test_hash_text_encoders_covers_names_shapes_dtypes_bytes_and_buffers() -> None:
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    a.register_buffer("pos", torch.arange(5))
    b = torch.nn.Linear(2, 2)
    h = hash_text_encoders({"clip": a, "t5": b})
    assert len(h) == 64
    assert h == hash_text_encoders({"t5": b, "clip": a})  # dict order does not matter
    import copy

    a2 = copy.deepcopy(a)
    assert hash_text_encoders({"clip": a2, "t5": b}) == h
    with torch.no_grad():
        a2[0].weight[0, 0] += 1e-3
    assert hash_text_encoders({"clip": a2, "t5": b}) != h
    a3 = copy.deepcopy(a)
    a3.pos[0] = 7  # a buffer
    assert hash_text_encoders({"clip": a3, "t5": b}) != h
    assert hash_text_encoders({"clip": copy.deepcopy(a).to(torch.float16), "t5": b}) != h
    assert hash_text_encoders({"clip2": a, "t5": b}) != h  # slot names count
    assert hash_text_encoders("sha256-of-files") == "sha256-of-files"  # precomputed
    assert hash_text_encoders({"clip": "abc", "t5": b}) != hash_text_encoders({"clip": "abd", "t5": b})
    with pytest.raises(CacheError):
        hash_text_encoders("")
    with torch.device("meta"):
        meta = torch.nn.Linear(2, 2)
    with pytest.raises(CacheError, match="meta"):
        hash_text_encoders({"x": meta})


# ------------------------------------------------------------------------------- round trips
def test_get_or_encode_encodes_only_misses_in_one_batch(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    enc = Recorder()
    first = cache.get_or_encode(["a", "b", "a", "c"], enc)
    assert enc.calls == [["a", "b", "c"]]
    assert cache.stats.misses == 3 and cache.stats.written == 3 and cache.stats.hits == 0
    assert [c.batch_size for c in first] == [1, 1, 1, 1]
    second = cache.get_or_encode(["c", "d", "a"], enc)
    assert enc.calls[1] == ["d"] and cache.stats.hits == 2
    # a hit is bit-identical to what the miss returned, dtypes and order included
    assert same(second[0], first[3]) and same(second[2], first[0])
    assert second[0]["prompt_embeds"].dtype == torch.bfloat16 and second[0].token_counts == [1]
    direct = encode_captions(["a", "b", "c"]).index(0)
    assert same(second[2], direct)
    assert cache.get_or_encode([], enc) == [] and len(enc.calls) == 2
    with pytest.raises(CacheError, match="batch of 3"):
        cache.get_or_encode(["x", "y"], lambda caps: encode_captions(["x", "y", "z"]))


def test_entries_are_safetensors_with_metadata(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    path = cache.put("a red fox", encode_captions(["a red fox"]))
    key = cache.key("a red fox")
    assert path == tmp_path / key[:2] / key[2:4] / f"{key}.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        assert sorted(f.keys()) == ["attention_mask", "pooled_prompt_embeds", "prompt_embeds", "text_ids"]
    assert meta["te_align.fingerprint"] == fingerprint() and meta["te_align.profile"] == PROFILE
    assert meta["te_align.caption_sha256"] == hashlib.sha256(b"a red fox").hexdigest()
    assert json.loads(meta["te_align.options"]) == {"max_chunks": 1}
    assert meta["te_align.format_version"] == "1" and float(meta["te_align.created"]) > 0
    assert (tmp_path / ".te-align-cache.json").is_file()


def test_atomic_write_leaves_no_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_cache(tmp_path)
    cache.get_or_encode([f"caption {i}" for i in range(20)], Recorder())
    assert temp_files(tmp_path) == [] and len(entry_files(tmp_path)) == 20

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(CacheError, match=r"\.safetensors: cannot write cache entry: no space left on the device: free space"):
        cache.put("never written", encode_captions(["never written"]))
    monkeypatch.undo()
    assert temp_files(tmp_path) == [] and not cache.path("never written").exists()
    assert cache.get("never written") is None


# ---------------------------------------------------------------------------------- corruption
def _rewrite_with_other_tensors(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["extra"] = torch.zeros(1)
    save_file(tensors, str(path), metadata=meta)


def _flip_metadata_value(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"te_align.caption_sha256":"') + len(b'"te_align.caption_sha256":"')
    raw[at] = ord("0") if raw[at] != ord("0") else ord("1")
    path.write_bytes(bytes(raw))


def _flip_tensor_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))


CORRUPTIONS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "header_length": lambda p: p.write_bytes(struct.pack("<Q", 10**7) + p.read_bytes()[8:]),
    "header_json": lambda p: p.write_bytes(p.read_bytes()[:8] + b"X" + p.read_bytes()[9:]),
    "metadata_value": _flip_metadata_value,
    "tensor_bytes": _flip_tensor_byte,
    "tensor_set": _rewrite_with_other_tensors,
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupt_entry_is_reencoded_once_and_reported(tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    cache = make_cache(tmp_path)
    enc = Recorder()
    good = cache.get_or_encode(["a fox", "a hen"], enc)
    CORRUPTIONS[how](cache.path("a fox"))
    # the header-only scan sees layout damage; caption and tensor-byte checks need a read
    assert len(scan(tmp_path).corrupt) == (0 if how in ("metadata_value", "tensor_bytes") else 1)
    caplog.set_level(logging.WARNING, logger="te_align")
    again = cache.get_or_encode(["a hen", "a fox"], enc)
    assert enc.calls == [["a fox", "a hen"], ["a fox"]]
    assert cache.stats.corrupt == 1
    warnings = [r for r in caplog.records if r.name == "te_align" and "corrupt" in r.getMessage()]
    assert len(warnings) == 1 and "a fox" not in warnings[0].getMessage()  # reports the file, not the caption
    assert same(again[1], good[0]) and same(again[0], good[1])
    # repaired: a fresh cache object hits, reports nothing
    fresh = make_cache(tmp_path)
    assert fresh.get("a fox") is not None and fresh.stats.corrupt == 0 and scan(tmp_path).corrupt == []
    assert len(caplog.records) == 1


def test_tensor_byte_corruption_needs_verify(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    cache.put("a fox", encode_captions(["a fox"]))
    _flip_tensor_byte(cache.path("a fox"))
    lax = EmbeddingCache(tmp_path, PROFILE, "te-hash-1", {"max_chunks": 1}, verify=False)
    assert lax.get("a fox") is not None and lax.stats.corrupt == 0
    assert cache.get("a fox") is None and cache.stats.corrupt == 1


# --------------------------------------------------------------------------------- concurrency
def _hammer(args: tuple[str, int, int]) -> dict[str, Any]:
    directory, worker, rounds = args
    cache = make_cache(Path(directory))
    captions = [f"shared caption {i}" for i in range(8)]
    wrong = []  # (round, caption, what): reported with the stats rather than raised, so a failure says why
    for r in range(rounds):
        cache.get_or_encode([*captions[r % 3 :], f"own {worker} {r}"], encode_captions)
        for c in captions[:4]:
            cache.put(c, encode_captions([c]))  # rewrite the same keys as every other worker
        for c in captions:
            got = cache.get(c)
            if got is None or not same(got, encode_captions([c])):
                exists = cache._path(cache.key(c)).is_file()
                wrong.append((r, c, "miss" if got is None else "different", f"file exists now: {exists}"))
    return {**dataclasses.asdict(cache.stats), "wrong": wrong}


def test_concurrent_writers_do_not_corrupt_entries(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_hammer, [(str(tmp_path), w, 15) for w in range(4)])
    assert all(r["corrupt"] == 0 and r["wrong"] == [] for r in results), results
    assert sum(r["written"] for r in results) >= 4 * 15 * 4
    assert temp_files(tmp_path) == []
    files = entry_files(tmp_path)
    assert len(files) == 8 + 4 * 15
    for f in files:
        load_file(str(f))  # every file is a complete safetensors file
    check = make_cache(tmp_path)
    for i in range(8):
        c = f"shared caption {i}"
        assert same(check.get(c), encode_captions([c]))  # type: ignore[arg-type]
    assert check.stats.corrupt == 0 and scan(tmp_path).corrupt == []


# ------------------------------------------------------------------------------------------ CLI
def _two_profile_cache(d: Path) -> tuple[EmbeddingCache, EmbeddingCache]:
    a = make_cache(d)
    a.get_or_encode(["a", "b", "c"], Recorder())
    other = custom_profile()
    b = make_cache(d, profile=other)
    b.get_or_encode(["a", "b"], Recorder(other.fingerprint(), other.name))
    return a, b


def test_cache_info_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _two_profile_cache(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    bad = entry_files(tmp_path)[0]
    bad.write_bytes(b"\x00" * 5)
    assert main(["cache", "info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 entries" in out and "corrupt files: 1" in out and str(bad) in out
    assert PROFILE in out and "custom-512" in out and "not a bundled profile" in out
    assert main(["cache", "info", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["entries"] == 4 and data["corrupt"] == [str(bad)] and data["text_encoders"] == 1
    counts = {(p["profile"], p["fingerprint"]): p["entries"] for p in data["profiles"]}
    assert sum(counts.values()) == 4 and counts[(PROFILE, fingerprint())] in (2, 3)
    assert data["bytes"] == sum(f.stat().st_size for f in entry_files(tmp_path) if f != bad)


def test_cache_cli_refuses_missing_and_foreign_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["cache", "info", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err and "no such folder" in err
    foreign = tmp_path / "photos"
    (foreign / "ab" / "cd").mkdir(parents=True)
    keep = [foreign / "x.safetensors", foreign / "ab" / "cd" / ("ab" + "cd" + "0" * 60 + ".safetensors")]
    save_file({"w": torch.zeros(2)}, str(keep[0]))
    save_file({"w": torch.zeros(2)}, str(keep[1]))
    for argv in (["cache", "info", str(foreign)], ["cache", "clear", str(foreign), "--yes"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "does not look like a te-align cache" in err
    assert all(p.exists() for p in keep)


def test_cache_cli_on_te_align_trains_cache_folder_points_at_its_text_cache(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`te-align train` keeps OUTPUT/cache/text (embeddings) and OUTPUT/cache/latents: `te-align cache info
    OUTPUT/cache` said "does not look like a te-align cache"; it names the text cache (or says there is none)."""
    cache = tmp_path / "cache"
    (cache / "latents" / "1c").mkdir(parents=True)
    save_file({"latent": torch.zeros(2)}, str(cache / "latents" / "1c" / ("1c" + "0" * 62 + ".safetensors")))
    for command in ("info", "clear"):
        assert main(["cache", command, str(cache), "--yes"][: 3 if command == "info" else 4]) == 2
        assert capsys.readouterr().err == (
            f"te-align: error: {cache}: te-align train's cache folder with image latents only (latents/): no "
            "text-embedding cache (text/) was written there, and te-align cache reads only that\n")
    make_cache(cache / "text").get_or_encode(["a", "b"], Recorder())
    before = sorted(cache.rglob("*"))
    for command in ("info", "clear"):
        assert main(["cache", command, str(cache), "--yes"][: 3 if command == "info" else 4]) == 2
        assert capsys.readouterr().err == (
            f"te-align: error: {cache}: te-align train's cache folder: its text-embedding cache is {cache / 'text'} "
            f"(te-align cache {command} {cache / 'text'}); latents/ holds image latents, which te-align cache does "
            "not read\n")
    assert sorted(cache.rglob("*")) == before
    assert main(["cache", "info", str(cache / "text")]) == 0
    assert "2 entries" in capsys.readouterr().out


def test_cache_clear_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _two_profile_cache(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    stray = tmp_path / "ab" / "not-an-entry.safetensors"
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"user file")
    before = len(entry_files(tmp_path))
    # no --yes and no terminal: refuse, delete nothing
    assert main(["cache", "clear", str(tmp_path)]) == 2
    assert "pass --yes" in capsys.readouterr().err and len(entry_files(tmp_path)) == before
    # by alias: resolves to sd35-large and deletes only its entries
    assert main(["cache", "clear", str(tmp_path), "--profile", "sd3.5l", "--yes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deleted 3 entries") and "2 other entries kept" in out
    assert scan(tmp_path).profiles[0].profile == "custom-512"
    # an unknown name that entries record is matched by name
    assert main(["cache", "clear", str(tmp_path), "--profile", "custom-512", "--yes"]) == 0
    assert capsys.readouterr().out.startswith("deleted 2 entries")
    # an unknown name nothing records is an error
    assert main(["cache", "clear", str(tmp_path), "--profile", "no-such-model", "--yes"]) == 2
    assert "unknown profile" in capsys.readouterr().err
    # still a cache (marker), now empty
    assert main(["cache", "clear", str(tmp_path), "--yes"]) == 0
    assert "no entries to delete" in capsys.readouterr().out
    assert notes.read_text() == "mine" and stray.read_bytes() == b"user file"
    assert entry_files(tmp_path) == [stray]


def test_full_clear_removes_corrupt_entries_only_in_the_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = make_cache(tmp_path)
    cache.get_or_encode(["a", "b"], Recorder())
    cache.path("a").write_bytes(b"garbage")
    assert main(["cache", "clear", str(tmp_path), "-y"]) == 0
    out = capsys.readouterr().out
    assert "deleted 1 entries" in out and "1 corrupt" in out
    assert entry_files(tmp_path) == [] and [p.name for p in tmp_path.iterdir()] == [".te-align-cache.json"]
    assert cache.clear() == 0


def test_library_clear_by_profile(tmp_path: Path) -> None:
    a, b = _two_profile_cache(tmp_path)
    assert a.clear("stable-diffusion-3.5-large") == 3
    assert b.info().entries == 2
    assert b.clear() == 2 and scan(tmp_path).entries == 0


def test_tokenizer_changes_the_text_encoder_hash() -> None:
    """Same weights, a different tokenizer (CLIP-G padding with '!' vs '<|endoftext|>'): a different key."""
    from te_align.encoding.cache.keys import hash_text_encoders, hash_tokenizer
    from te_align.tiny.encoders import clip_text_model
    from te_align.tiny.tokenizers import clip_tokenizer

    enc = {"clip_g": clip_text_model("L")}
    bang, eot = clip_tokenizer(pad="!"), clip_tokenizer(pad="<|endoftext|>")
    assert hash_tokenizer(bang) == hash_tokenizer(clip_tokenizer(pad="!"))  # stable across loads
    assert hash_tokenizer(bang) != hash_tokenizer(eot)
    base = hash_text_encoders(enc)
    with_bang = hash_text_encoders(enc, {"clip_g": bang})
    assert with_bang == hash_text_encoders(enc, {"clip_g": clip_tokenizer(pad="!")})
    assert len({base, with_bang, hash_text_encoders(enc, {"clip_g": eot})}) == 3


def test_top_level_help_names_the_cache_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    """`te-align --help` said "show or clear", and `te-align cache show` is no command: it names info and clear."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    start = out.index("    cache ")
    assert " ".join(out[start:out.index("    inspect ")].split()) == (
        "cache what an embedding cache folder holds (info), or clear it (clear)")
    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    assert re.findall(r"^    (\w+) ", capsys.readouterr().out, re.M) == ["info", "clear"]


@pytest.mark.parametrize("argv", [[], ["ab"], ["cache"], ["profile"], ["comfyui"]])
def test_a_command_missing_exits_2_like_any_missing_argument(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`te-align` and `te-align ab` alone printed their help and exited 0, while `te-align cache` / `profile` /
    `comfyui` alone exit 2 (argparse: a required argument is missing); a script can trust 2 for all of them."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own exit for a required subcommand
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    assert rc == 2
    assert (out + err).startswith(f"usage: te-align{' ' + argv[0] if argv else ''} [-h]")
