"""One way in for profile overrides (te_align.profiles.overrides): every entry point (keyword arguments, config
tables, --set, TE_ALIGN_OVERRIDES) resolves source + overrides through one function and one typed validator, and
the profile `profile show --json` prints loads back as a profile. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import te_align
from te_align.cli import main
from te_align.errors import ProfileError
from te_align.profiles import bundled_names, profile_from_dict
from te_align.profiles.overrides import apply_overrides, env_overrides, merge, parse_set, resolve

FLUX_DEV = 'pretrained_model_name_or_path = "/models/flux1-dev.safetensors"\nt5xxl = "/m/t5xxl.safetensors"\nae = "/m/ae.sft"\n'


@pytest.mark.parametrize("name", sorted(bundled_names()))
def test_profile_show_json_loads_back_as_the_same_profile(name: str, tmp_path: Path, capsys) -> None:
    assert main(["profile", "show", name, "--json"]) == 0
    out = tmp_path / "p.json"
    out.write_text(capsys.readouterr().out, encoding="utf-8")
    original = te_align.profile(name)
    loaded = te_align.profile(str(out))
    assert loaded.fingerprint() == original.fingerprint()
    assert loaded.to_dict() == original.to_dict()


def test_profile_show_json_with_set_loads_back_and_check_reads_it(tmp_path: Path, capsys) -> None:
    assert main(["profile", "show", "flux-dev", "--json", "--set", "t5_max_length=256"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "p.json").write_text(text, encoding="utf-8")
    loaded = te_align.profile(str(tmp_path / "p.json"))
    assert loaded.slot("t5").tokenizer.max_length == 256
    assert loaded.fingerprint() == json.loads(text)["fingerprint"] == te_align.profile("flux-dev", t5_max_length=256).fingerprint()
    cfg = tmp_path / "c.toml"
    cfg.write_text(FLUX_DEV + "t5xxl_max_token_length = 256\n", encoding="utf-8")
    assert main(["check", str(cfg), "--profile", str(tmp_path / "p.json")]) == 0
    assert "aligned" in capsys.readouterr().out


def test_an_edited_profile_json_with_its_old_fingerprint_is_refused(tmp_path: Path) -> None:
    data = te_align.profile("sd35-large").to_dict()
    data["fingerprint"] = te_align.profile("sd35-large").fingerprint()
    data["slots"]["t5"]["tokenizer"]["max_length"] = 77
    with pytest.raises(ProfileError, match=r"key 'fingerprint': fingerprint [0-9a-f]{16} does not match"):
        profile_from_dict(data)
    del data["fingerprint"]
    assert profile_from_dict(data).slot("t5").tokenizer.max_length == 77


def test_check_set_applies_to_the_profile_checked_against(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(FLUX_DEV + "t5xxl_max_token_length = 256\n", encoding="utf-8")
    assert main(["check", str(cfg)]) == 1
    capsys.readouterr()
    assert main(["check", str(cfg), "--set", "t5_max_length=256"]) == 0
    out = capsys.readouterr().out
    assert "profile flux-dev with --set t5_max_length=256" in out and "aligned" in out
    assert main(["check", str(cfg), "--json", "--set", "t5_max_length=256"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["results"][0]["overrides"] == {"t5_max_length": 256}
    assert main(["check", str(cfg), "--set", "t5_max_lenght=256"]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith("te-align: error: --set: key 't5_max_lenght': unknown override for profile 'flux-dev' "
                              "(did you mean: t5_max_length")  # fmt: skip
    assert cap.err.count("\n") == 1 and cap.out == ""


def test_every_way_in_gives_the_same_profile(monkeypatch) -> None:
    want = te_align.profile("flux-schnell", t5_max_length=512).fingerprint()
    assert resolve("flux-schnell", ("--set", parse_set(["t5_max_length=512"]))).fingerprint() == want
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", '{"t5.max_length": 512}')
    assert resolve("flux-schnell", env=True).fingerprint() == want
    assert resolve("flux-schnell", ("cfg", {"slots.t5.tokenizer.max_length": 512})).fingerprint() == want
    # explicit layers win over the environment; later layers over earlier ones
    assert resolve("flux-schnell", ("kw", {"t5_max_length": 256}), env=True).slot("t5").tokenizer.max_length == 256
    merged, origins = merge(("env", {"a": 1, "b": 2}), ("--set", {"a": 3}))
    assert merged == {"b": 2, "a": 3} and origins == {"a": "--set", "b": "env"}


def test_errors_name_where_the_override_came_from(monkeypatch) -> None:
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", '{"t5_max_length": "long"}')
    with pytest.raises(ProfileError) as e:
        resolve("sd35-large", ("--set", {"clip_l_layer": -2}), env=True)
    assert str(e.value) == ("TE_ALIGN_OVERRIDES: key 't5_max_length': invalid override for profile 'sd35-large': "
                            "expected an integer, got 'long'")
    with pytest.raises(ProfileError, match=r"^model\.profile_overrides: key 'clip_l_layer': invalid override .*outside"):
        resolve("sd35-large", ("model.profile_overrides", {"clip_l_layer": 40}))
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", "[1]")
    with pytest.raises(ProfileError, match="TE_ALIGN_OVERRIDES must be a JSON object, got list"):
        env_overrides()
    monkeypatch.setenv("TE_ALIGN_OVERRIDES", "{oops")
    with pytest.raises(ProfileError, match="TE_ALIGN_OVERRIDES is not valid JSON"):
        env_overrides()


def test_the_validator_is_typed_and_replaces_fields() -> None:
    base = te_align.profile("sd35-large")
    p = apply_overrides(base, {"t5_max_length": 77, "t5.padding": "longest", "clip_l_train_dropout": 0.25,
                               "empty_prompt": "zeros"})  # fmt: skip
    assert (p.slot("t5").tokenizer.max_length, p.slot("t5").tokenizer.padding, p.slot("clip_l").train_dropout,
            p.empty_prompt) == (77, "longest", 0.25, "zeros")
    assert p.slot("t5").encoder is base.slot("t5").encoder  # untouched parts are the same objects
    assert p.provenance_of("slots.t5.tokenizer.max_length").status == "override"
    unset = apply_overrides(base, {"t5.padding": None})  # None: the field's default
    assert unset.slot("t5").tokenizer.padding == "max_length"
    assert apply_overrides(base, {"clip_l_train_dropout": 1}).slot("clip_l").train_dropout == 1.0  # int -> float
    with pytest.raises(ProfileError, match="expected true or false"):
        apply_overrides(base, {"t5.masks.encoder": "yes"})


def test_parse_set_reads_toml_scalars_and_python_booleans() -> None:
    assert parse_set(["a=512", "b=true", "c=True", 'd="x y"', "e=plain text", "f=0.5", "g=1e3"]) == {
        "a": 512, "b": True, "c": True, "d": "x y", "e": "plain text", "f": 0.5, "g": 1000.0}
    with pytest.raises(ProfileError, match="key '--override': expected KEY=VALUE"):
        parse_set(["novalue"], origin="--override")
