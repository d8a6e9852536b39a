"""Profiles under bad input: ``profile build -o`` never replaces a file without ``--force`` (and then
keeps a backup), never writes into the model it reads, creates no folders; out-of-range overrides,
empty or odd sources, deeply nested files and named pipes are one line each, never a hang."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import te_align
from te_align.cli import main
from te_align.errors import ProfileError
from te_align.profiles import bundled
from tests.support.files import diffusers_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return diffusers_folder(tmp_path / "m", bundled("sd35-large"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return code, err


def test_build_refuses_to_replace_without_force_and_keeps_a_backup(folder: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "mine.toml"
    out.write_text("# my notes\n", encoding="utf-8")
    code, err = run(capsys, "profile", "build", str(folder), "-o", str(out))
    assert code == 2 and "exists: pass --force" in err and "\n" not in err
    assert out.read_text(encoding="utf-8") == "# my notes\n"
    code, err = run(capsys, "profile", "build", str(folder), "-o", str(out), "--force")
    assert code == 0 and "mine.toml.bak" in err
    assert (tmp_path / "mine.toml.bak").read_text(encoding="utf-8") == "# my notes\n"
    assert te_align.profile(str(out)).fingerprint() == te_align.profile(str(folder)).fingerprint()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left


def test_build_never_writes_into_the_model_it_reads(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = folder / "model_index.json"
    before = index.read_bytes()
    for target in (index, folder / "profile.toml", folder / "text_encoder" / "p.json"):
        for extra in ((), ("--force",)):
            code, err = run(capsys, "profile", "build", str(folder), "-o", str(target), *extra)
            assert code == 2 and "inside the model folder it reads" in err and "\n" not in err, err
    assert index.read_bytes() == before
    assert not (folder / "profile.toml").exists() and not (folder / "model_index.json.bak").exists()


def test_build_creates_no_folders_and_wants_a_profile_suffix(folder: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, err = run(capsys, "profile", "build", str(folder), "-o", str(tmp_path / "new" / "deep" / "p.toml"))
    assert code == 2 and "does not exist (create it first" in err and not (tmp_path / "new").exists()
    code, err = run(capsys, "profile", "build", str(folder), "-o", str(tmp_path / "p.yaml"))
    assert code == 2 and ".toml or .json" in err
    (tmp_path / "d.toml").mkdir()
    code, err = run(capsys, "profile", "build", str(folder), "-o", str(tmp_path / "d.toml"), "--force")
    assert code == 2 and "is a folder" in err


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"t5_max_length": 10**12}, r"t5_max_length.*must be in \[1, 65536\]"),
    ({"t5_hidden_size": -4096}, r"t5_hidden_size.*must be in \[1, 65536\]"),
    ({"clip_l_num_layers": 0}, r"clip_l_num_layers.*must be in \[1, 1024\]"),
    ({"t5_dtype": "float99"}, r"t5_dtype.*expected one of float32"),
    ({"t5_train_dropout": 1.5}, r"t5_train_dropout.*probability"),
    ({"t5_max_length": "512"}, r"t5_max_length.*expected an integer"),
])  # fmt: skip
def test_out_of_range_overrides_are_refused(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ProfileError, match=needle):
        te_align.profile("sd35-large", **overrides)


def test_sensible_overrides_still_apply() -> None:
    p = te_align.profile("sd35-large", t5_max_length=77, clip_l_layer=-2, t5_dtype="bf16")
    assert p.get("slots.t5.tokenizer.max_length") == 77 and p.get("slots.clip_l.encoder.layer") == -2


def test_empty_missing_and_odd_sources_say_what_they_are(tmp_path: Path) -> None:
    for source in ("", "   "):
        with pytest.raises(ProfileError, match=r"empty profile source .*bundled profile name"):
            te_align.profile(source)
    with pytest.raises(ProfileError, match=r"got NoneType"):
        te_align.profile(None)  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match=r"missing\.toml: no such profile file"):
        te_align.profile(str(tmp_path / "missing.toml"))
    with pytest.raises(ProfileError, match=r"nope: no such model folder or checkpoint"):
        te_align.profile(str(tmp_path / "nope"))
    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match=r"is a named pipe \(FIFO\)"):
        te_align.profile(str(fifo))
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    with pytest.raises(ProfileError, match=r"symlink loop"):
        te_align.profile(str(loop))


def test_deeply_nested_profile_files_and_configs_are_one_line(tmp_path: Path, folder: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    (tmp_path / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000, encoding="utf-8")
    for name in ("deep.json", "deep.toml"):
        code, err = run(capsys, "profile", "show", str(tmp_path / name))
        assert code == 2 and "nested too deeply" in err and "\n" not in err, err
    (folder / "text_encoder" / "config.json").write_text("{\"a\":" * 100_000 + "1" + "}" * 100_000, encoding="utf-8")
    code, err = run(capsys, "profile", "build", str(folder))
    assert code == 2 and "text_encoder/config.json" in err and "nested too deeply" in err
    code, err = run(capsys, "profile", "show", "sd35-large", "--set", "t5_max_length=" + "[" * 100_000 + "]" * 100_000)
    assert code == 2 and "nested too deeply" in err
