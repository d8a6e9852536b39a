"""``te-align check CONFIG --dataset [DIR]``: the token lengths of the user's own captions per encoder slot, counted
with real tokenizers (te_align/tiny's CLIP BPE, T5 Unigram, Gemma and Qwen byte-level BPE, written to a tmp folder laid
out as a diffusers model folder) after the trainer's caption handling, read from real caption files; the valueless
``--dataset`` reading the folders the config names (sd-scripts' dataset_config, ai-toolkit's datasets); the one line
for a missing tokenizer and for an undecodable caption file; the length findings measured on the captions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from te_align.audit.dataset import distribution, load_counter  # noqa: E402
from te_align.checking import check_file  # noqa: E402
from te_align.cli import main  # noqa: E402
from te_align.profiles import profile  # noqa: E402
from te_align.tiny import tokenizers as tiny  # noqa: E402

CIRCLE = "a red circle"  # three CLIP BPE tokens: "a</w>", "red</w>", "circle</w>"
KOHYA_SOURCE = ("[kohya-ss/sd-scripts@48d368f library/train_util.py:822-915,1946-1967, library/config_util.py:"
                "408-463]")


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the machine's Hugging Face cache: tokenizers come from the tmp folders each test writes."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))


@pytest.fixture(scope="module")
def flux_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FLUX.1 model folder's tokenizers: CLIP-L at tokenizer/, T5 at tokenizer_2/."""
    root = tmp_path_factory.mktemp("flux-model")
    tiny.clip_tokenizer().save_pretrained(str(root / "tokenizer"))
    # a tokenizer.json beside vocab.json/merges.txt, as HF's CLIP-L folders have (transformers 4 writes none for the
    # Python CLIPTokenizer): the fast class converts and saves it
    transformers.CLIPTokenizerFast.from_pretrained(str(root / "tokenizer")).save_pretrained(str(root / "tokenizer"))
    tiny.t5_tokenizer().save_pretrained(str(root / "tokenizer_2"))
    return root


def _t5_len(text: str) -> int:
    """T5's token count through transformers' own tokenizer call (the oracle, not te-align's counting path)."""
    return len(tiny.t5_tokenizer()(text)["input_ids"])


def _captions(folder: Path, repeats: list[int], ext: str = ".txt") -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for i, k in enumerate(repeats):
        text = " ".join([CIRCLE] * k)
        (folder / f"{i:02d}{ext}").write_text(text + "\nsecond line: sd-scripts reads the first line only\n",
                                              encoding="utf-8")
        texts.append(text)
    return texts


def _kohya(tmp_path: Path, model: Path, t5_length: int = 64, prefix: str = "photo of") -> tuple[Path, list[str]]:
    img = tmp_path / "img"
    texts = _captions(img, [1, 10, 20, 24, 25, 30])
    (img / "ignored.caption").write_text(" ".join(["word"] * 500), encoding="utf-8")  # not caption_extension
    (tmp_path / "dataset.toml").write_text(
        f'[general]\ncaption_extension = ".txt"\ncaption_prefix = "{prefix}"\nshuffle_caption = true\n'
        f'keep_tokens = 1\n\n[[datasets]]\nresolution = 1024\n\n  [[datasets.subsets]]\n  image_dir = "{img.as_posix()}"\n',
        encoding="utf-8")
    cfg = tmp_path / "flux.toml"
    cfg.write_text(f'pretrained_model_name_or_path = "{model.as_posix()}"\nt5xxl = "t5xxl_fp16.safetensors"\n'
                   f'ae = "ae.safetensors"\nt5xxl_max_token_length = {t5_length}\n'
                   f'dataset_config = "{(tmp_path / "dataset.toml").as_posix()}"\n', encoding="utf-8")
    return cfg, texts


def test_kohya_dataset_config_read_by_the_valueless_flag(tmp_path: Path, flux_model: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """sd-scripts FLUX.1 with t5xxl_max_token_length 64: `--dataset` with no folder reads the dataset_config's subset
    with its caption_extension (.txt, not .caption), first line, caption_prefix; CLIP-L and T5 counted by the model
    folder's tokenizers; the T5 cut is an error counted on the captions."""
    cfg, texts = _kohya(tmp_path, flux_model)
    t5 = [_t5_len("photo of " + t) for t in texts]
    cut = sum(n > 64 for n in t5)
    assert 0 < cut < len(texts)
    assert main(["check", str(cfg), "--dataset"]) == 1
    out = capsys.readouterr().out
    img = tmp_path / "img"
    d = distribution(t5)
    expected = [
        f"  dataset: 6 captions in {img.as_posix()}",
        '    caption handling: .txt files, this folder only (no sub-folders), first line only, split at ",", each tag '
        'stripped, and joined with ", " (prefix and suffix included), prefix "photo of", shuffle_caption (keeps the '
        f"length), keep_tokens = 1 (keeps the length) {KOHYA_SOURCE}",
        # CLIP-L: 3 tokens per "a red circle", 2 for "photo of", BOS and EOS
        f"    clip_l (CLIPTokenizer, {(flux_model / 'tokenizer').as_posix()}): tokens per caption min 7 · median 64 · "
        "p90 94 · p99 94 · max 94",
        "      at 77 (the trainer's and the official length): 2 of 6 captions (33%) lose tokens past 77",
        f"    t5 (T5TokenizerFast, {(flux_model / 'tokenizer_2').as_posix()}): tokens per caption min {d['min']} · "
        f"median {d['median']} · p90 {d['p90']} · p99 {d['p99']} · max {d['max']}",
        f"      at 64 (the trainer's length): {cut} of 6 captions ({round(100 * cut / 6)}%) lose tokens past 64",
        "      at 512 (the official length): 0 of 6 captions are longer",
    ]
    assert out.endswith("\n".join(expected) + "\n"), out
    f = next(f for f in check_file(str(cfg), dataset_report=True).findings if f.setting == "t5.tokenizer.max_length")
    assert f.severity == "error"
    assert f.message.endswith(f"Severity: {cut} of your 6 captions ({round(100 * cut / 6)}%) lose tokens past 64 "
                              "(counted with the t5 tokenizer)")


def test_json_carries_the_stats(tmp_path: Path, flux_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, texts = _kohya(tmp_path, flux_model)
    assert main(["check", str(cfg), "--dataset", "--json"]) == 1
    ds = json.loads(capsys.readouterr().out)["results"][0]["dataset"]
    assert ds["captions"] == 6 and ds["folders"] == [(tmp_path / "img").as_posix()] and ds["undecodable"] == []
    clip, t5 = ds["slots"]
    assert clip == {"slot": "clip_l", "tokenizer_cls": "CLIPTokenizer", "tokenizer": str(flux_model / "tokenizer"),
                    "trainer_length": 77, "official_length": 77,
                    "tokens": {"min": 7, "median": 64, "p90": 94, "p99": 94, "max": 94},
                    "longer_than_trainer_length": 2, "longer_than_official_length": 2, "padding_seen": False}
    t5_counts = [_t5_len("photo of " + t) for t in texts]
    assert t5["tokens"] == distribution(t5_counts)
    assert (t5["trainer_length"], t5["official_length"], t5["padding_seen"]) == (64, 512, True)
    assert t5["longer_than_trainer_length"] == sum(n > 64 for n in t5_counts)
    assert t5["longer_than_official_length"] == 0


def test_no_caption_reaching_either_length_is_padding_only(tmp_path: Path, flux_model: Path) -> None:
    """T5 at 256 against 512 with short captions: no token is cut; FLUX.1's T5 attends to its padding (no mask), so
    a warning that says so, not an error."""
    cfg, _ = _kohya(tmp_path, flux_model, t5_length=256)
    for p in (tmp_path / "img").glob("0[345].txt"):
        p.unlink()  # the three longest
    r = check_file(str(cfg), dataset_report=True)
    f = next(f for f in r.findings if f.setting == "t5.tokenizer.max_length")
    assert f.severity == "warning"
    assert ("Severity: none of your 3 captions has more than 256 tokens (t5 tokenizer): no token is cut, only padding "
            "differs (256 against 512 positions), and the model sees the padding (no mask), so at most a warning"
            ) in f.message
    assert r.dataset is not None
    assert "at 256 (the trainer's length): 0 of 3 captions are longer; only padding differs" in "\n".join(
        r.dataset["lines"])  # type: ignore[arg-type]


def test_a_masked_encoder_length_that_cuts_nothing_is_a_note(tmp_path: Path) -> None:
    """sd-scripts Lumina 2 with gemma2_max_token_length 128 against 256 and short captions: Gemma's padding is
    masked, so the finding changes nothing for this dataset (a note); the trainer adds no system prompt (system_prompt
    unset) where the profile's template has one, so both counts are given."""
    model = tmp_path / "model"
    tiny.gemma_tokenizer().save_pretrained(str(model / "tokenizer"))
    _captions(tmp_path / "img", [1, 2])
    cfg = tmp_path / "lumina.toml"
    cfg.write_text(f'pretrained_model_name_or_path = "{model.as_posix()}"\ngemma2 = "g.safetensors"\nae = "ae.sft"\n'
                   f'gemma2_max_token_length = 128\ntrain_data_dir = "{(tmp_path / "img").as_posix()}"\n'
                   'caption_extension = ".txt"\n', encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    f = next(f for f in r.findings if f.setting == "gemma.tokenizer.max_length")
    assert f.severity == "info"
    assert f.message.endswith("Severity: none of your 2 captions has more than 128 (trainer) or 256 (profile) tokens "
                              "(gemma tokenizer): only padding differs and the model does not see it, so this changes "
                              "nothing for this dataset")
    gemma = r.dataset["slots"][0]  # type: ignore[index]
    spec = profile("lumina2").slot("gemma").tokenizer
    oracle = tiny.gemma_tokenizer()
    plain = [len(oracle(" ".join([CIRCLE] * k))["input_ids"]) for k in (1, 2)]
    templated = [len(oracle(spec.template.replace("{system_prompt}", spec.system_prompt or "").replace(
        "{prompt}", " ".join([CIRCLE] * k)))["input_ids"]) for k in (1, 2)]
    assert gemma["tokens"] == distribution(plain)
    assert gemma["tokens_with_profile_template"] == distribution(templated)
    assert templated[0] > plain[0]


def test_ai_toolkit_datasets_read_with_the_trigger_word(tmp_path: Path, flux_model: Path) -> None:
    """ai-toolkit: the valueless --dataset reads datasets[].folder_path with caption_ext; tags are re-joined with
    ", " and the trigger word goes first where the caption lacks it (or replaces [trigger])."""
    img = tmp_path / "data"
    img.mkdir()
    (img / "a.md").write_text("a red circle,on white", encoding="utf-8")
    (img / "b.md").write_text("[trigger] a red circle", encoding="utf-8")
    (img / "c.txt").write_text(" ".join(["word"] * 300), encoding="utf-8")  # not caption_ext
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        "job: extension\nconfig:\n  name: t\n  process:\n    - type: sd_trainer\n      trigger_word: sks\n"
        f"      datasets:\n        - folder_path: {img.as_posix()}\n          caption_ext: md\n"
        f"      model:\n        name_or_path: {flux_model.as_posix()}\n        is_flux: true\n", encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    assert r.dataset is not None and r.dataset["captions"] == 2, r.dataset
    clip = r.dataset["slots"][0]  # type: ignore[index]
    # "sks a red circle, on white" and "sks a red circle": CLIP counts through transformers' own call
    oracle = tiny.clip_tokenizer()
    want = sorted(len(oracle(t)["input_ids"]) for t in ("sks a red circle, on white", "sks a red circle"))
    assert (clip["tokens"]["min"], clip["tokens"]["max"]) == (want[0], want[1])
    assert r.dataset["handling"] == [  # type: ignore[index]
        '.md files, kept as written (not stripped), split at "," and joined with ", ", trigger word "sks" (for '
        "[trigger]/[name], else put first) [ostris/ai-toolkit@27a03a9 toolkit/dataloader_mixins.py:350-353,411-436, "
        "toolkit/prompt_utils.py:715-745, toolkit/config_modules.py:941-944, toolkit/data_loader.py:437-441]"]


def test_a_missing_tokenizer_is_one_line_and_the_bounds_still_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Offline, with neither the model folder nor the hub cache holding a tokenizer: one line per slot saying what is
    needed, and the byte/word bounds at each length."""
    cfg, _ = _kohya(tmp_path, tmp_path / "no-such-model")
    assert main(["check", str(cfg), "--dataset"]) == 1
    out = capsys.readouterr().out
    assert ("    t5 tokenizer (T5TokenizerFast) not found: pass --tokenizer-dir DIR (a model folder with tokenizer_2/, "
            "or the tokenizer's own folder) or download black-forest-labs/FLUX.1-dev's tokenizer_2/ (huggingface-cli "
            "download black-forest-labs/FLUX.1-dev --include 'tokenizer_2/*')\n"
            "      byte/word bounds at 64 (the trainer's length): 3 of 6 captions certainly longer (more words), 5 may "
            "be (more bytes)\n"
            "      byte/word bounds at 512 (the official length): 0 of 6 captions certainly longer (more words), 0 may "
            "be (more bytes)\n") in out, out
    # "photo of" + 3k words: more than 76 words for k >= 25; more than 75 bytes (13k + 8) for k >= 6
    assert ("      byte/word bounds at 77 (the trainer's and the official length): 2 of 6 captions certainly longer "
            "(more words), 5 may be (more bytes)\n") in out
    assert "    clip_l tokenizer (CLIPTokenizer) not found" in out


def test_tokenizer_dir_and_the_hub_cache(tmp_path: Path, flux_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--tokenizer-dir DIR (a model folder) is looked in first; the hub cache's snapshot of the profile's repo is
    read from its folder layout (refs/main names the snapshot)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    cfg, _ = _kohya(tmp_path, tmp_path / "no-such-model")
    r = check_file(str(cfg), dataset_report=True, tokenizer_dirs=[str(flux_model)])
    assert [s["tokenizer"] for s in r.dataset["slots"]] == [  # type: ignore[index]
        str(flux_model / "tokenizer"), str(flux_model / "tokenizer_2")]
    repo = tmp_path / "cache" / "models--black-forest-labs--FLUX.1-dev"
    snap = repo / "snapshots" / "abc123"
    tiny.t5_tokenizer().save_pretrained(str(snap / "tokenizer_2"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123", encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    slots = r.dataset["slots"]  # type: ignore[index]
    assert slots[1]["tokenizer"] == str(snap / "tokenizer_2") and "missing" not in slots[1]
    assert slots[0]["missing"].startswith("clip_l tokenizer (CLIPTokenizer) not found")
    # sd-scripts' own CLIP-L id, the config's model path, the profile's repo, in that order
    assert slots[0]["looked_in"] == ["openai/clip-vit-large-patch14 in the hub cache",
                                     f"{(tmp_path / 'no-such-model').as_posix()} (not here)", str(snap / "tokenizer"),
                                     f"(hub cache: {tmp_path / 'cache'})"]


def test_an_undecodable_caption_file_is_one_line_and_a_partial_verdict(tmp_path: Path, flux_model: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg, _ = _kohya(tmp_path, flux_model)
    (tmp_path / "img" / "98.txt").write_bytes(b"caf\xe9 au lait")
    (tmp_path / "img" / "99.txt").write_bytes(b"\xff\xfe")
    assert main(["check", str(cfg), "--dataset"]) == 2
    cap = capsys.readouterr()
    bad = (tmp_path / "img" / "98.txt").as_posix()
    assert cap.err == (f"te-align: error: {bad}: not UTF-8 text (byte 0xe9 at offset 3), in a caption file; 1 other "
                       "caption file(s) not UTF-8 either, skipped; the dataset figures are on the other 6 caption(s), "
                       "a partial verdict\n")
    assert f"  dataset: 6 captions in {(tmp_path / 'img').as_posix()} (2 not UTF-8, left out: a partial verdict)\n" \
        in cap.out
    assert "Traceback" not in cap.err


def test_a_config_that_names_no_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "flux.toml"
    cfg.write_text('t5xxl = "t5.safetensors"\nae = "ae.safetensors"\n', encoding="utf-8")
    main(["check", str(cfg), "--dataset"])
    assert "  dataset: the config names no dataset; pass --dataset DIR\n" in capsys.readouterr().out
    (tmp_path / "flux.toml").write_text('t5xxl = "t5.safetensors"\nae = "ae.safetensors"\ntrain_data_dir = "gone"\n',
                                        encoding="utf-8")
    main(["check", "--dataset", str(cfg)])  # the config right after a bare --dataset
    assert "  dataset: the config names gone, which is not here; pass --dataset DIR\n" in capsys.readouterr().out


def test_an_explicit_dir_keeps_the_trainers_handling_of_that_folder(tmp_path: Path, flux_model: Path) -> None:
    cfg, _ = _kohya(tmp_path, flux_model)
    r = check_file(str(cfg), dataset=[str(tmp_path / "img")], dataset_report=True)
    assert r.dataset["captions"] == 6 and r.dataset["handling"][0].startswith(  # type: ignore[index]
        '.txt files, this folder only (no sub-folders), first line only, split at ","')
    other = tmp_path / "other"
    _captions(other, [2], ext=".caption")
    r = check_file(str(cfg), dataset=[str(other)], dataset_report=True)
    assert r.dataset["captions"] == 1 and r.dataset["handling"] == [".txt/.caption files"]  # type: ignore[index]


@pytest.mark.parametrize("make", ["clip_tokenizer", "t5_tokenizer", "qwen2_tokenizer", "gemma_tokenizer"])
def test_the_counting_path_equals_transformers(tmp_path: Path, make: str) -> None:
    """te-align counts through the tokenizer.json's fast tokenizer (no transformers import); its counts equal
    transformers' own tokenizer call on the same folder, special tokens included."""
    tok = getattr(tiny, make)()
    tok.save_pretrained(str(tmp_path / "tok"))
    spec = profile({"clip_tokenizer": "sd15", "t5_tokenizer": "flux-dev", "qwen2_tokenizer": "qwen-image",
                    "gemma_tokenizer": "lumina2"}[make]).slots[-1].tokenizer
    texts = ["a red circle", "Ünïcödé, tags, and   spaces!", "<|im_start|> x", " ".join(["word"] * 90), ""]
    counter = load_counter(tmp_path / "tok", spec)
    assert counter(texts) == [len(tok(t, add_special_tokens=spec.add_special_tokens)["input_ids"]) for t in texts]


def test_distribution_is_nearest_rank() -> None:
    assert distribution(list(range(1, 101))) == {"min": 1, "median": 50, "p90": 90, "p99": 99, "max": 100}
    assert distribution([5]) == {"min": 5, "median": 5, "p90": 5, "p99": 5, "max": 5}


def test_without_tokenizers_installed_it_says_what_is_needed(tmp_path: Path, flux_model: Path) -> None:
    """The core alone (no tokenizers, no transformers importable): one line per slot naming the package, the bounds
    still reported, no traceback."""
    import subprocess
    import sys

    cfg, _ = _kohya(tmp_path, flux_model)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "tests" / "support" / "no_extras.py"), "check", str(cfg),
                          "--dataset"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert (f"    t5 tokenizer at {flux_model / 'tokenizer_2'}: counting tokens needs the tokenizers package (pip "
            "install tokenizers)\n      byte/word bounds at 64 (the trainer's length): 3 of 6 captions certainly "
            "longer (more words), 5 may be (more bytes)\n") in out.stdout, out.stdout


def test_only_dataset_imports_a_tokenizer_library(tmp_path: Path, flux_model: Path) -> None:
    """`check` without --dataset imports neither tokenizers nor transformers; with it and tokenizer.json folders,
    tokenizers only (no transformers, no torch)."""
    import re
    import subprocess
    import sys

    cfg, _ = _kohya(tmp_path, flux_model)

    def imported(*extra: str) -> set[str]:
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "te_align", "check", str(cfg), *extra],
                             capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
        assert out.returncode == 1, out.stderr[-2000:]
        return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", out.stderr, re.M)}

    plain = imported()
    assert not {"tokenizers", "transformers", "torch"} & plain
    counted = imported("--dataset")
    assert "tokenizers" in counted
    assert not {"transformers", "torch"} & counted


def test_musubi_dataset_config_with_the_chat_template(tmp_path: Path) -> None:
    """musubi-tuner's Qwen-Image caching command: the dataset_config's image_directory with its caption_extension
    (from [general]); each caption counted inside Qwen-Image's chat template, the 34 template-prefix tokens dropped
    (what the encoder keeps), against musubi's 1024 and the profile's 512."""
    model = tmp_path / "model"
    tiny.qwen2_tokenizer().save_pretrained(str(model / "tokenizer"))
    img = tmp_path / "img"
    texts = _captions(img, [1, 200], ext=".md")
    ds = tmp_path / "dataset.toml"
    ds.write_text(f'[general]\nresolution = [1024, 1024]\ncaption_extension = ".md"\nbatch_size = 1\n\n[[datasets]]\n'
                  f'image_directory = "{img.as_posix()}"\n', encoding="utf-8")
    r = check_file("<command line>", command=["python", "qwen_image_cache_text_encoder_outputs.py", "--dataset_config",
                                              str(ds), "--text_encoder", "q.safetensors"],
                   dataset_report=True, tokenizer_dirs=[str(model)])
    qwen = r.dataset["slots"][0]  # type: ignore[index]
    spec = profile("qwen-image").slot("qwen").tokenizer
    oracle = tiny.qwen2_tokenizer()
    # musubi-tuner reads the whole file, stripped: the second line is part of the caption
    whole = [t + "\nsecond line: sd-scripts reads the first line only" for t in texts]
    kept = [len(oracle(spec.template.replace("{prompt}", t))["input_ids"]) - 34 for t in whole]
    assert qwen["tokens"] == distribution(kept)
    assert (qwen["trainer_length"], qwen["official_length"]) == (1024, 512)
    assert qwen["longer_than_trainer_length"] == sum(n > 1024 for n in kept)
    assert qwen["longer_than_official_length"] == sum(n > 512 for n in kept) == 1


def test_diffusion_pipe_prefix_is_joined_as_is(tmp_path: Path, flux_model: Path) -> None:
    """diffusion-pipe: the valueless --dataset reads [[directory]] path (IMAGE.txt, whole file, stripped) with the
    dataset's caption_prefix put before the caption without a space; the tokenizers from [model] diffusers_path."""
    img = tmp_path / "img"
    img.mkdir()
    (img / "a.txt").write_text("a red circle\n", encoding="utf-8")
    (tmp_path / "dataset.toml").write_text(f"resolutions = [1024]\ncaption_prefix = 'photo of '\n\n[[directory]]\n"
                                           f"path = '{img.as_posix()}'\nnum_repeats = 1\n", encoding="utf-8")
    cfg = tmp_path / "train.toml"
    cfg.write_text(f"output_dir = '{(tmp_path / 'out').as_posix()}'\ndataset = '{(tmp_path / 'dataset.toml').as_posix()}'\n"
                   "epochs = 1\nmicro_batch_size_per_gpu = 1\n\n[model]\ntype = 'flux'\n"
                   f"diffusers_path = '{flux_model.as_posix()}'\ndtype = 'bfloat16'\n\n[adapter]\ntype = 'lora'\nrank = 4\n"
                   "\n[optimizer]\ntype = 'adamw_optimi'\nlr = 2e-5\n", encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    assert r.dataset is not None and r.dataset["captions"] == 1, (r.findings, r.dataset)
    assert r.dataset["handling"] == ['.txt files, this folder only (no sub-folders), prefix "photo of " [tdrussell/diffusion-pipe@8f83dbf '  # type: ignore[index]
                                     "utils/dataset.py:48-57,628,646-658,734,751-763]"]
    clip = r.dataset["slots"][0]  # type: ignore[index]
    assert clip["tokenizer"] == str(flux_model / "tokenizer")
    assert clip["tokens"]["max"] == 7  # BOS photo of a red circle EOS


def test_simpletuner_textfile_backends_only(tmp_path: Path, flux_model: Path) -> None:
    """SimpleTuner: the valueless --dataset reads the local image backends of data_backend_config whose
    caption_strategy is "textfile" (IMAGE.txt as is, each non-empty line a caption, instance_prompt + " " first with
    prepend_instance_prompt); a backend left at the default "filename" strategy is named, not read."""
    text_dir, name_dir = tmp_path / "txt", tmp_path / "named"
    text_dir.mkdir()
    name_dir.mkdir()
    (text_dir / "a.txt").write_text("a red circle\n\na blue square", encoding="utf-8")
    (name_dir / "b.txt").write_text(" ".join(["word"] * 300), encoding="utf-8")
    backends = [
        {"id": "t", "type": "local", "instance_data_dir": text_dir.as_posix(), "caption_strategy": "textfile",
         "prepend_instance_prompt": True, "instance_prompt": "sks"},
        {"id": "n", "type": "local", "instance_data_dir": name_dir.as_posix()},
        {"id": "text-embeds", "type": "local", "dataset_type": "text_embeds", "default": True, "cache_dir": "c"},
    ]
    (tmp_path / "multidatabackend.json").write_text(json.dumps(backends), encoding="utf-8")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "lora", "model_family": "flux", "model_flavour": "dev",
                               "pretrained_model_name_or_path": flux_model.as_posix(),
                               "data_backend_config": (tmp_path / "multidatabackend.json").as_posix()}),
                   encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    assert r.dataset is not None and r.dataset["captions"] == 2, (r.findings, r.dataset)
    clip = r.dataset["slots"][0]  # type: ignore[index]
    assert clip["tokenizer"] == str(flux_model / "tokenizer")
    assert (clip["tokens"]["min"], clip["tokens"]["max"]) == (6, 6)  # BOS sks a red circle EOS / … blue square …
    lines = r.dataset["lines"]  # type: ignore[index]
    assert (f"  not read: {name_dir.as_posix()}: caption_strategy 'filename': SimpleTuner does not take these captions "
            "from .txt files") in lines
    assert r.dataset["handling"][0].startswith(  # type: ignore[index]
        '.txt files, kept as written (not stripped), prefix "sks", each line a caption [bghira/SimpleTuner@bc8e6ab')


def test_onetrainer_concepts_file(tmp_path: Path, flux_model: Path) -> None:
    """OneTrainer: the valueless --dataset reads the concepts file concept_file_name names (beside the config here),
    each enabled concept's path without sub-folders, IMAGE.txt with each non-empty line a caption; a "filename"
    concept is named, not read. FLUX.1-dev's T5 at 77 (OneTrainer's) cuts the long caption: an error counted."""
    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "examples" / "onetrainer" / "flux_lora.json").read_text(encoding="utf-8"))
    img, names, sub = tmp_path / "img", tmp_path / "names", tmp_path / "img" / "sub"
    sub.mkdir(parents=True)
    names.mkdir()
    (img / "a.txt").write_text("a red circle\n  \n" + " ".join([CIRCLE] * 40) + "\n", encoding="utf-8")
    (sub / "b.txt").write_text(" ".join([CIRCLE] * 90), encoding="utf-8")  # include_subdirectories is false
    (tmp_path / "concepts.json").write_text(json.dumps([
        {"name": "c", "path": img.as_posix(), "enabled": True, "text": {"prompt_source": "sample"}},
        {"name": "n", "path": names.as_posix(), "text": {"prompt_source": "filename"}},
        {"name": "off", "path": sub.as_posix(), "enabled": False},
    ]), encoding="utf-8")
    data.update(base_model_name=flux_model.as_posix(), concept_file_name="concepts.json")
    cfg = tmp_path / "flux.json"
    cfg.write_text(json.dumps(data), encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    assert r.dataset is not None and r.dataset["captions"] == 2, r.dataset
    clip = r.dataset["slots"][0]  # type: ignore[index]
    assert clip["tokens"] == {"min": 5, "median": 5, "p90": 122, "p99": 122, "max": 122}  # 3 and 120 + BOS/EOS
    assert (f"  not read: {names.as_posix()}: prompt_source 'filename': the captions are the image file names"
            in r.dataset["lines"])  # type: ignore[operator]
    t5 = next(f for f in r.findings if f.setting == "t5.tokenizer.max_length")
    assert (t5.severity, t5.effective) == ("error", 77)
    assert "Severity: 1 of your 2 captions (50%) lose tokens past 77 (counted with the t5 tokenizer)" in t5.message


def test_the_progress_bar_shows_on_a_terminal_after_a_second() -> None:
    import io

    from te_align.audit.dataset import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    quick = Terminal()
    bar = Progress(10, "t5 tokens", stream=quick)
    bar.update(5)
    bar.close()
    assert quick.getvalue() == ""  # under a second: nothing
    slow = Terminal()
    bar = Progress(10, "t5 tokens", stream=slow)
    bar.start -= 2.0
    bar.update(5)
    assert slow.getvalue() == "\r  t5 tokens [###############...............] 5/10"
    pipe = io.StringIO()  # not a terminal: never
    bar = Progress(10, "t5 tokens", stream=pipe)
    bar.start -= 2.0
    bar.update(5)
    assert pipe.getvalue() == ""


def test_the_flag_placement(tmp_path: Path, flux_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`check --dataset CONFIG [CONFIG]`: a file given to the valueless flag is a config; --tokenizer-dir alone is one
    error line."""
    cfg, _ = _kohya(tmp_path, flux_model)
    assert main(["check", "--dataset", str(cfg), str(cfg)]) == 1
    assert capsys.readouterr().out.count("  dataset: 6 captions in ") == 2
    assert main(["check", str(cfg), "--tokenizer-dir", str(flux_model)]) == 2
    assert capsys.readouterr().err == ("te-align: error: --tokenizer-dir goes with --dataset (it says where the "
                                       "tokenizers that count your captions are)\n")


def test_kohya_re_joins_tags_when_it_shuffles(tmp_path: Path, flux_model: Path) -> None:
    """sd-scripts with shuffle_caption: prefix, then the caption split at caption_separator, each tag stripped, joined
    with ", " ("photo of" + " " + "red ,  circle,,square" becomes "photo of red, circle, , square"); without it the
    first line as written."""
    cfg, _ = _kohya(tmp_path, flux_model)
    for p in (tmp_path / "img").glob("*.txt"):
        p.unlink()
    (tmp_path / "img" / "a.txt").write_text("red ,  circle,,square", encoding="utf-8")
    oracle = tiny.clip_tokenizer()
    r = check_file(str(cfg), dataset_report=True)
    want = len(oracle("photo of red, circle, , square")["input_ids"])
    assert want != len(oracle("photo of red ,  circle,,square")["input_ids"])
    assert r.dataset["slots"][0]["tokens"]["max"] == want  # type: ignore[index]
    ds = tmp_path / "dataset.toml"
    ds.write_text(ds.read_text(encoding="utf-8").replace("shuffle_caption = true", "shuffle_caption = false"),
                  encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    assert r.dataset["slots"][0]["tokens"]["max"] == len(  # type: ignore[index]
        oracle("photo of red ,  circle,,square")["input_ids"])


def test_onetrainer_tag_shuffling_re_joins(tmp_path: Path, flux_model: Path) -> None:
    """OneTrainer with text.enable_tag_shuffling: tags split at tag_delimiter, stripped, empty ones dropped, joined
    with the delimiter and a space ("red ;; circle;square" with ";" becomes "red; circle; square")."""
    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "examples" / "onetrainer" / "flux_lora.json").read_text(encoding="utf-8"))
    img = tmp_path / "img"
    img.mkdir()
    (img / "a.txt").write_text("red ;; circle;square", encoding="utf-8")
    data.update(base_model_name=flux_model.as_posix(), concepts=[
        {"name": "c", "path": img.as_posix(), "text": {"enable_tag_shuffling": True, "tag_delimiter": ";"}}])
    cfg = tmp_path / "flux.json"
    cfg.write_text(json.dumps(data), encoding="utf-8")
    r = check_file(str(cfg), dataset_report=True)
    oracle = tiny.clip_tokenizer()
    assert r.dataset["slots"][0]["tokens"]["max"] == len(oracle("red; circle; square")["input_ids"])  # type: ignore[index]
    assert r.dataset["handling"][0].startswith(  # type: ignore[index]
        '.txt files, this folder only (no sub-folders), split at ";", each tag stripped, empty tags dropped, and joined '
        'with "; ", each line a caption, enable_tag_shuffling (keeps the length)')
