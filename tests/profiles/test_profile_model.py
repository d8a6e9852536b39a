"""The profile data model: overrides, fingerprint, serialization, errors, CLI (no torch)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

import te_align
from te_align import _toml as tomllib
from te_align.cli import main
from te_align.errors import ProfileError, ProfileNotFound
from te_align.profiles import profile_from_dict
from te_align.profiles.expr import output_specs, parse_expression


@pytest.fixture(scope="module")
def sd35():
    return te_align.profile("sd35-large")


def test_aliases_resolve_to_the_same_profile(sd35):
    for alias in ("SD3.5-Large", "sd35l", "stabilityai/stable-diffusion-3.5-large", "sd3.5_large"):
        assert te_align.profile(alias) is sd35


def test_override_changes_value_records_provenance_and_fingerprint(sd35):
    q = te_align.profile("sd35-large", t5_max_length=512)
    assert q.slot("t5").tokenizer.max_length == 512
    assert sd35.slot("t5").tokenizer.max_length == 256
    prov = q.provenance_of("slots.t5.tokenizer.max_length")
    assert prov.status == "override"
    assert prov.alternatives[0].value == 256
    assert q.fingerprint() != sd35.fingerprint()
    # the same override spelled three ways gives the same behaviour
    for key in ("t5.max_length", "slots.t5.tokenizer.max_length"):
        assert te_align.profile("sd35-large", **{key: 512}).fingerprint() == q.fingerprint()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("t5_max_lenght", 512, "did you mean: t5_max_length"),
        ("t5_max_length", "long", "expected an integer"),
        ("t5_padding", "sideways", "expected one of 'max_length' | 'longest'"),
        ("clip_l_max_length", 100, "exceeds the encoder's max_position_embeddings 77"),
        ("clip_l_layer", 40, "outside hidden_states"),
        ("empty_prompt", "nothing", "expected one of 'encode' | 'zeros'"),
        ("clip_l_train_dropout", 1.5, "probability"),
    ],
)
def test_bad_overrides_are_one_line_errors(key, value, message):
    with pytest.raises(ProfileError) as exc:
        te_align.profile("sd35-large", **{key: value})
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_fingerprint_ignores_provenance_and_names_but_not_behaviour(sd35):
    data = sd35.to_dict()
    data["name"] = "renamed"
    data["aliases"] = ["x"]
    data["description"] = "other words"
    data["provenance"]["slots.t5"]["source"] = "somewhere else"
    assert profile_from_dict(data).fingerprint() == sd35.fingerprint()
    for path, value in [
        ("slots.t5.masks.encoder", True),
        ("slots.clip_g.tokenizer.pad_token_id", 49407),
        ("slots.clip_l.encoder.layer", -3),
        ("outputs.pooled_prompt_embeds", "feat(clip_g.pooled, clip_l.pooled)"),
        ("empty_prompt", "zeros"),
    ]:
        assert sd35.with_overrides({path: value}).fingerprint() != sd35.fingerprint(), path


def test_every_behaviour_field_changes_the_fingerprint(sd35):
    base = sd35.fingerprint()
    behaviour = sd35.behaviour()
    assert len(behaviour) > 100
    # behaviour() is exactly what is hashed: changing any one value changes the payload
    seen = set()
    for path in behaviour:
        payload = dict(behaviour)
        payload[path] = ("changed", payload[path])
        seen.add(json.dumps(payload, sort_keys=True, default=str))
    assert len(seen) == len(behaviour)
    assert te_align.profile("sd35-large").fingerprint() == base  # stable across loads


def test_round_trips(sd35, tmp_path):
    assert profile_from_dict(tomllib.loads(sd35.to_toml())) == sd35
    assert profile_from_dict(json.loads(sd35.to_json())) == sd35
    q = sd35.with_overrides(t5_max_length=77, t5_min_length=77)
    f = tmp_path / "mine.toml"
    f.write_text(q.to_toml())
    assert te_align.profile(str(f)) == q
    g = tmp_path / "mine.json"
    g.write_text(q.to_json())
    assert te_align.profile(str(g)) == q


def test_malformed_profile_files_name_file_and_key(sd35, tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("name = 'x'\nfamily = [\n")
    with pytest.raises(ProfileError, match=r"bad\.toml: not valid TOML"):
        te_align.profile(str(f))
    data = sd35.to_dict()
    data["slots"]["t5"]["tokenizer"]["max_lenght"] = 3
    f.write_text(json.dumps(data))
    f = f.rename(tmp_path / "bad.json")
    with pytest.raises(ProfileError) as exc:
        te_align.profile(str(f))
    assert "bad.json" in str(exc.value) and "slots.t5.tokenizer.max_lenght" in str(exc.value)
    assert "did you mean: max_length" in str(exc.value)
    data = sd35.to_dict()
    data["outputs"]["prompt_embeds"] = "seq(clip_x.hidden)"
    with pytest.raises(ProfileError, match="names slot 'clip_x'"):
        profile_from_dict(data, file="p.toml")
    data = sd35.to_dict()
    data["provenance"]["slots.t5.tokenizer.max_len"] = {"source": "x", "status": "code"}
    with pytest.raises(ProfileError, match="provenance for a field that does not exist"):
        profile_from_dict(data)
    data = sd35.to_dict()
    data["provenance"]["slots.t5"]["status"] = "rumour"
    with pytest.raises(ProfileError, match="expected a status"):
        profile_from_dict(data)


def test_unknown_profile_names_closest(sd35):
    with pytest.raises(ProfileNotFound, match="did you mean: sd35-large"):
        te_align.profile("sd35-larg")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("seq(", "unexpected end"),
        ("foo(t5.hidden)", "unknown function 'foo'"),
        ("t5.hiden", "did you mean: hidden"),
        ("padw(t5.hidden)", "padw() takes 2 arguments, got 1"),
        ("seq(t5.hidden) x", "after the end"),
    ],
)
def test_expression_errors(text, message):
    with pytest.raises(ProfileError, match=re.escape(message)):
        parse_expression(text)



# ------------------------------------------------------------------------------ typed outputs
def test_outputs_are_typed_from_their_expressions():
    """Kind, sharing and batch dimension come from the expression tree, not the output's name."""

    def typed(name):
        return {o.name: (o.kind, o.shared, o.batch_dim) for o in output_specs(te_align.profile(name))}

    assert typed("flux-dev") == {"prompt_embeds": ("embeds", False, 0), "pooled_prompt_embeds": ("embeds", False, 0),
                                 "text_ids": ("ids", True, None)}  # fmt: skip
    assert typed("hidream") == {"prompt_embeds_t5": ("embeds", False, 0), "prompt_embeds_llama3": ("embeds", False, 1),
                                "pooled_prompt_embeds": ("embeds", False, 0)}  # fmt: skip
    assert typed("anima") == {"qwen_prompt_embeds": ("embeds", False, 0), "qwen_attention_mask": ("mask", False, 0),
                              "t5_input_ids": ("ids", False, 0), "t5_attention_mask": ("mask", False, 0)}  # fmt: skip
    assert typed("sd35-large")["prompt_embeds"] == ("embeds", False, 0)
    # a name says nothing: an output called "mask" that holds hidden states is embeddings
    renamed = te_align.profile("sd15").to_dict()
    renamed["outputs"] = {"mask": "clip_l.hidden", "tokens": "clip_l.ids", "visible": "clip_l.denoiser_mask"}
    renamed["provenance"] = {k: v for k, v in renamed["provenance"].items() if not k.startswith("outputs.")}
    assert [(o.kind, o.batch_dim) for o in output_specs(profile_from_dict(renamed))] == [("embeds", 0), ("ids", 0), ("mask", 0)]


def test_an_output_mixing_kinds_is_a_profile_error():
    data = te_align.profile("sdxl").to_dict()
    data["outputs"]["prompt_embeds"] = "feat(clip_l.hidden, clip_g.mask)"
    with pytest.raises(ProfileError, match=re.escape("key 'outputs.prompt_embeds': feat() combines embeds and mask")):
        profile_from_dict(data, file="mine.toml")


# ------------------------------------------------------------- tokenizer fields added after v1
#: Fingerprints of bundled profiles with CLIP slots from before ``chunkable`` and ``pad_token_in_prompt``
#: existed: embedding-cache keys depend on them.
V1_FINGERPRINTS = {"sd15": "9370320943d6c410", "sd21": "748fb968e632841f", "sdxl": "aa85fc557ea00a8c",
                   "sd35-large": "69729c9c4c664279", "flux-dev": "22fbd05825cc268d", "hidream": "679d3cfbe61cf160"}  # fmt: skip


def test_added_tokenizer_fields_keep_v1_fingerprints_and_change_them_when_set():
    for name, fp in V1_FINGERPRINTS.items():
        assert te_align.profile(name).fingerprint() == fp, name
    sdxl = te_align.profile("sdxl")
    assert sdxl.slot("clip_g").tokenizer.chunkable and sdxl.slot("clip_g").tokenizer.pad_token_in_prompt == "pad_id"
    assert not te_align.profile("flux-dev").slot("t5").tokenizer.chunkable
    assert "slots.clip_g.tokenizer.chunkable" in sdxl.behaviour_paths()
    assert "slots.clip_g.tokenizer.chunkable" not in sdxl.behaviour()  # at the value version 1 implied
    changed = {
        sdxl.with_overrides({"clip_g.tokenizer.pad_token_in_prompt": "text"}).fingerprint(),
        sdxl.with_overrides(clip_l_chunkable=False).fingerprint(),
        te_align.profile("flux-dev").with_overrides(t5_chunkable=True).fingerprint(),
    }
    assert len(changed) == 3 and not changed & {sdxl.fingerprint(), te_align.profile("flux-dev").fingerprint()}
    # a profile file written before the fields existed behaves (and hashes) as version 1 did
    old = sdxl.to_dict()
    for slot in ("clip_l", "clip_g"):
        del old["slots"][slot]["tokenizer"]["chunkable"]
    del old["slots"]["clip_g"]["tokenizer"]["pad_token_in_prompt"]
    loaded = profile_from_dict(old)
    assert loaded.slot("clip_l").tokenizer.chunkable and loaded.slot("clip_g").tokenizer.pad_token_in_prompt == "pad_id"
    assert loaded.fingerprint() == sdxl.fingerprint()
    t5 = te_align.profile("flux-dev").to_dict()["slots"]["t5"]["tokenizer"]
    assert t5["chunkable"] is False  # written out explicitly from now on
    prov = sdxl.provenance_of("slots.clip_g.tokenizer.pad_token_in_prompt")
    assert "diffusers issue #4153" in prov.source and prov.alternatives[0].value == "text"
    assert "strategy_sdxl.py:26" in prov.alternatives[0].source
    with pytest.raises(ProfileError, match=re.escape("expected one of 'pad_id' | 'text', got 'bpe'")):
        sdxl.with_overrides({"clip_g.tokenizer.pad_token_in_prompt": "bpe"})

def test_cli_show_list_diff(capsys, sd35):
    assert main(["profile", "show", "sd35-large"]) == 0
    out = capsys.readouterr().out
    assert sd35.fingerprint() in out
    assert "max_length" in out and "≠ 77" in out  # the SD3 reference-code alternative is shown
    assert main(["profile", "show", "sd35-large", "--json", "--set", "t5_max_length=512"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["slots"]["t5"]["tokenizer"]["max_length"] == 512
    assert main(["profile", "list", "--json"]) == 0
    names = [r["name"] for r in json.loads(capsys.readouterr().out)]
    assert "sd35-large" in names
    assert main(["profile", "diff", "sd35-large", "sd35-large"]) == 0
    assert "behave identically" in capsys.readouterr().out


def test_cli_list_is_a_table_with_a_header_and_aligned_columns(capsys):
    assert main(["profile", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "FAMILY", "ENCODERS", "CHECKED", "FOR"]
    starts = [lines[0].index(h) for h in ("FAMILY", "ENCODERS", "CHECKED FOR")]
    row = next(line for line in lines if line.startswith("hunyuanimage-2.1 "))  # the longest name and family
    assert row.split() == ["hunyuanimage-2.1", "hunyuanimage", "qwen+byt5", "kohya"]
    lines = lines[: lines.index("")]  # the table; the not-checked pairs follow it
    for line in lines[1:]:
        cells = line.split(maxsplit=3)
        assert [line.index(c, s) for c, s in zip(cells[1:], starts, strict=True)] == starts, line
    assert len(lines) == 1 + len(te_align.profiles())


def test_cli_errors_are_one_line_exit_2(capsys):
    assert main(["profile", "show", "nope-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("te-align: error: unknown profile 'nope-model'")
    assert err.count("\n") == 1
    assert main(["profile", "show", "sd35-large", "--set", "t5_max_length=abc"]) == 2
    assert "expected an integer" in capsys.readouterr().err


def test_cli_needs_no_torch():
    code = (
        "import sys, contextlib, io\n"
        "from te_align.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['profile', 'show', 'sd35-large']); main(['profile', 'list'])\n"
        "    main(['profile', 'diff', 'flux-dev', 'flux-schnell']); main(['cache', 'info', '.'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_atomic_writes_use_normal_permissions_and_leave_nothing_on_failure(tmp_path):
    import os

    from te_align._atomic import atomic_file
    from te_align.commands._util import write_text_atomic

    target = tmp_path / "out" / "p.toml"
    write_text_atomic(target, "x = 1\n")
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_text() == "x = 1\n"
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(RuntimeError), atomic_file(target, "w") as f:
        f.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "x = 1\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["p.toml"]


def _description_line(out: str) -> str:
    return next(line.strip() for line in out.splitlines() if line.startswith("  MMDiT"))


def test_show_description_follows_overrides(capsys):
    assert main(["profile", "show", "flux-schnell", "--set", "t5_max_length=512", "--set", "clip_l_hidden_size=32"]) == 0
    line = _description_line(capsys.readouterr().out)
    assert line == ("MMDiT with T5-XXL last_hidden_state over all 512 padded positions (no mask anywhere) as the text "
                    "sequence, CLIP-L pooler_output (32) as the pooled vector, and zero text position ids.")
    assert "256" not in line and "768" not in line
    assert main(["profile", "show", "flux-schnell"]) == 0
    assert "over all 256 padded positions" in _description_line(capsys.readouterr().out)
    # the written description keeps its placeholders (a profile file reads back the same text)
    p = te_align.profile("flux-schnell", t5_max_length=512)
    assert "{slots.t5.tokenizer.max_length}" in p.description
    assert "all 512 padded positions" in p.describe()
    assert te_align.profile("sd35-large", t5_max_length=77).describe().count("T5-XXL (77 tokens") == 1


def test_every_bundled_description_names_only_its_values():
    for p in te_align.profiles():
        text = p.describe()
        assert "{slots." not in text and "{outputs." not in text, p.name


def _placeholders(p: te_align.AlignmentProfile) -> list[str]:
    from te_align.profiles.model import _PLACEHOLDER

    return sorted({m.group(1) for m in _PLACEHOLDER.finditer(p.description)})


#: Numeric placeholders over every bundled description (a new profile's adds to it).
CHECKED_PLACEHOLDERS = 61  # sd15-nai 1, sdxl-pony 3 added


def test_every_value_a_description_names_follows_its_override():
    """Each bundled description writes the values it names as placeholders: overriding any numeric one changes the
    text, and the new value is in it; no number a profile holds is written out in the prose."""
    import re

    from te_align.profiles.model import _PLACEHOLDER

    checked = 0
    for p in te_align.profiles():
        text = p.describe()
        for path in _placeholders(p):
            value = p.get(path)
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            new = value - 1 if value > 1 or value < 0 else value + 1  # a value the override's validator accepts
            try:
                changed = p.with_overrides({path: new}).describe()
            except ProfileError:  # one less is refused by a cross-field rule (every layer of an encoder tapped): one more
                new = value + 1
                changed = p.with_overrides({path: new}).describe()
            assert changed != text, f"{p.name}: {path}"
            assert str(new) in changed or new == 1, f"{p.name}: {path}"  # 1 may be said in words ("one padding token")
            checked += 1
        # numbers left in the prose are names (ViT-L/14, Qwen2.5-VL-7B, 8-line) or the 24 layers of an original
        # encoder, never a value of this profile's max_length, hidden_size, num_layers or drop_start_tokens fields
        prose = _PLACEHOLDER.sub("", p.description)
        numbers = {int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.]*\d)", prose)}
        held = {v for s in p.slots for v in (s.tokenizer.max_length, s.tokenizer.drop_start_tokens, s.encoder.hidden_size,
                                             s.encoder.num_layers) if v > 1}  # fmt: skip
        assert not numbers & held, f"{p.name}: {sorted(numbers & held)} written out in {prose!r}"
    assert checked == CHECKED_PLACEHOLDERS


def test_descriptions_say_overridden_words_and_numbers():
    p = te_align.profile("anima").with_overrides({
        "slots.qwen.tokenizer.padding": "max_length", "slots.qwen.tokenizer.max_length": 300, "slots.qwen.encoder.layer": -2,
        "slots.qwen.masks.zero_padded": False, "slots.qwen.tokenizer.min_length": 2,
    })  # fmt: skip
    assert p.describe() == (
        "Cosmos-Predict2 DiT with Qwen3-0.6B-Base and an LLM adapter: the prompt is tokenized twice, without any "
        "template, padded to a fixed length and cut at 300 (Qwen) and 512 (T5) tokens. Qwen3's hidden_states[-2] (mask "
        "into the encoder, padded positions kept) and its mask go to the text conditioner as source; the T5 token ids "
        "and mask of the same prompt are not encoded by any model, they are the conditioner's learned query tokens. A "
        "batch whose prompts all tokenize to nothing gets 2 Qwen ids 0 with mask 0."
    )
    p = te_align.profile("sd21").with_overrides({"clip_h_max_length": 64, "slots.clip_h.encoder.layer": "penultimate",
                                                 "slots.clip_h.encoder.final_layer_norm": False})  # fmt: skip
    assert p.describe() == (
        'UNet with OpenCLIP ViT-H/14 converted to a 23-layer CLIPTextModel: its hidden_states[-2] (no final layer '
        'norm) is the penultimate layer of the original 24-layer encoder; 64 tokens padded with "!", no mask, no '
        "pooled output."
    )
    p = te_align.profile("chroma").with_overrides({"slots.t5.masks.denoiser_extra_pad_tokens": 0,
                                                   "slots.t5.masks.encoder": False})  # fmt: skip
    assert p.describe() == ("Flux-style MMDiT without CLIP: T5-XXL (512 tokens) encoded without an attention mask; the "
                            "transformer sees every real token plus no padding token.")
    # words for one value; any other is written as it is, or by the '*' words with '#' for it
    q = dataclasses.replace(te_align.profile("sd15"), description="{slots.clip_l.tokenizer.max_length|77=seventy-seven}, "
                            "{slots.clip_l.encoder.layer|*=layer #}, {slots.clip_l.encoder.pooled|text_embeds=pooled}, {nope}")
    assert q.describe() == "seventy-seven, layer last, none, {nope}"


def test_repr_is_one_screen():
    p = te_align.profile("flux-schnell")
    assert repr(p) == (
        f"<AlignmentProfile flux-schnell (family flux, fingerprint {p.fingerprint()})\n"
        "  clip_l: CLIPTokenizer max_length=77 padding=max_length; CLIPTextModel layer=last pooled=pooler_output\n"
        "  t5: T5TokenizerFast max_length=256 padding=max_length; T5EncoderModel layer=last>"
    )
    q = te_align.profile("flux-schnell", t5_max_length=512)
    assert repr(q).splitlines()[2:] == [
        "  t5: T5TokenizerFast max_length=512 padding=max_length; T5EncoderModel layer=last",
        "  overrides: slots.t5.tokenizer.max_length=512 (was 256)>",
    ]
    assert str(q) == repr(q)
    # equality, hash and the dataclass fields are as before
    assert q == te_align.profile("flux-schnell", t5_max_length=512) and hash(q) == hash(te_align.profile(
        "flux-schnell", t5_max_length=512))
    assert q != p

    assert [f.name for f in dataclasses.fields(p)][:6] == ["name", "family", "display_name", "repo", "pipeline", "slots"]
    for each in te_align.profiles():
        text = repr(each)
        assert len(text) <= 1200 and len(text.splitlines()) <= 8, each.name
        assert all(len(line) <= 160 for line in text.splitlines()), each.name
