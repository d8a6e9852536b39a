"""The bundled profiles: they load, equal the official-config snapshots, cite a source for every
behaviour value, keep the recorded disagreements between sources, and round-trip (no torch)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from te_align import _toml as tomllib
from te_align.profiles import bundled, bundled_names, profile_from_dict
from te_align.profiles.model import STATUSES, AlignmentProfile, EncoderSpec, MaskSpec, SlotSpec, TokenizerSpec
from te_align.profiles.official import official_repos, official_snapshot
from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The research record the snapshots were compiled from (tools/snapshot_official.py); not in the repository.
RESEARCH_JSON = Path(os.environ.get("TE_ALIGN_RESEARCH_JSON") or "TE_ALIGN_RESEARCH_JSON-is-not-set")

EXPECTED_NAMES = [
    "anima",
    "auraflow",
    "chroma",
    "flux-dev",
    "flux-schnell",
    "flux2-dev",
    "flux2-klein-4b",
    "flux2-klein-9b",
    "hidream",
    "hunyuanimage-2.1",
    "ideogram4",
    "krea2",
    "ltx2",
    "lumina2",
    "pixart-sigma",
    "qwen-image",
    "qwen-image-edit",
    "qwen-image-edit-2509",
    "qwen-image-edit-2511",
    "sana",
    "sd15",
    "sd15-nai",
    "sd21",
    "sd3-medium",
    "sd35-large",
    "sd35-medium",
    "sdxl",
    "sdxl-pony",
    "wan21",
    "z-image",
]

#: Profiles held to the strict provenance checks (all of them).
NEW_PROFILES = list(EXPECTED_NAMES)

#: Bundled profile -> the repo id its official-config snapshot is filed under.
SNAPSHOT_REPO = {
    "sd15": "runwayml/stable-diffusion-v1-5",
    "sd21": "stabilityai/stable-diffusion-2-1",
    "sdxl": "stabilityai/stable-diffusion-xl-base-1.0",
    # community bases load their architecture's encoder files: the same snapshot holds for them
    "sd15-nai": "runwayml/stable-diffusion-v1-5",
    "sdxl-pony": "stabilityai/stable-diffusion-xl-base-1.0",
    "sd3-medium": "stabilityai/stable-diffusion-3-medium-diffusers",
    "sd35-large": "stabilityai/stable-diffusion-3.5-large",
    "sd35-medium": "stabilityai/stable-diffusion-3.5-medium",
    "flux-dev": "black-forest-labs/FLUX.1-dev",
    "flux-schnell": "black-forest-labs/FLUX.1-schnell",
    "chroma": "lodestones/Chroma",
    "pixart-sigma": "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS",
    "auraflow": "fal/AuraFlow",
    "lumina2": "Alpha-VLLM/Lumina-Image-2.0",
    "hidream": "HiDream-ai/HiDream-I1-Full",
    "sana": "Efficient-Large-Model/Sana_1600M_1024px_diffusers",
    "qwen-image": "Qwen/Qwen-Image",
    "wan21": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
}
#: Bundled profiles without an official-config snapshot: the research hf_configs.json has no entry for
#: their repo, so nothing is compared to official values; their provenance says code / inferred instead.
NO_SNAPSHOT = {
    "anima": "circlestone-labs/Anima-Base-v1.0-Diffusers",
    "hunyuanimage-2.1": "hunyuanvideo-community/HunyuanImage-2.1-Diffusers",
    # No entry in the research either, and no copy of their config files whose source can be cited was read:
    # their model_index / encoder values are inferred (pipeline type hints, the Qwen-Image encoder copy).
    "qwen-image-edit": "Qwen/Qwen-Image-Edit",
    "qwen-image-edit-2509": "Qwen/Qwen-Image-Edit-2509",
    "qwen-image-edit-2511": "Qwen/Qwen-Image-Edit-2511",
    "flux2-dev": "black-forest-labs/FLUX.2-dev",
    "flux2-klein-4b": "black-forest-labs/FLUX.2-klein-4B",
    "flux2-klein-9b": "black-forest-labs/FLUX.2-klein-9B",
    "z-image": "Tongyi-MAI/Z-Image-Turbo",
    "krea2": "krea/Krea-2-Raw",
    "ideogram4": "ideogram-ai/ideogram-v4",
    "ltx2": "Lightricks/LTX-2",
}

#: Output names = the keywords of each diffusers pipeline's __call__ for the positive conditioning,
#: in the order encode_prompt returns them (text_ids: returned by encode_prompt, passed as txt_ids).
EXPECTED_OUTPUTS = {
    "sd15": ("prompt_embeds",),
    "sd21": ("prompt_embeds",),
    "sdxl": ("prompt_embeds", "pooled_prompt_embeds"),
    "sd15-nai": ("prompt_embeds",),
    "sdxl-pony": ("prompt_embeds", "pooled_prompt_embeds"),
    "sd3-medium": ("prompt_embeds", "pooled_prompt_embeds"),
    "sd35-medium": ("prompt_embeds", "pooled_prompt_embeds"),
    "sd35-large": ("prompt_embeds", "pooled_prompt_embeds"),
    "flux-dev": ("prompt_embeds", "pooled_prompt_embeds", "text_ids"),
    "flux-schnell": ("prompt_embeds", "pooled_prompt_embeds", "text_ids"),
    "chroma": ("prompt_embeds", "text_ids", "prompt_attention_mask"),
    "pixart-sigma": ("prompt_embeds", "prompt_attention_mask"),
    "auraflow": ("prompt_embeds", "prompt_attention_mask"),
    "lumina2": ("prompt_embeds", "prompt_attention_mask"),
    "hidream": ("prompt_embeds_t5", "prompt_embeds_llama3", "pooled_prompt_embeds"),
    "sana": ("prompt_embeds", "prompt_attention_mask"),
    "qwen-image": ("prompt_embeds", "prompt_embeds_mask"),
    "qwen-image-edit": ("prompt_embeds", "prompt_embeds_mask"),
    "qwen-image-edit-2509": ("prompt_embeds", "prompt_embeds_mask"),
    "qwen-image-edit-2511": ("prompt_embeds", "prompt_embeds_mask"),
    "hunyuanimage-2.1": ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_mask_2"),
    "wan21": ("prompt_embeds",),
    # AnimaTextEncoderStep.encode_prompt's dict / intermediate outputs (inputs of AnimaTextConditioningStep)
    "anima": ("qwen_prompt_embeds", "qwen_attention_mask", "t5_input_ids", "t5_attention_mask"),
    "flux2-dev": ("prompt_embeds", "text_ids"),
    "flux2-klein-4b": ("prompt_embeds", "text_ids"),
    "flux2-klein-9b": ("prompt_embeds", "text_ids"),
    # ZImagePipeline.encode_prompt returns a list; te-align's re-padded form carries its mask beside it
    "z-image": ("prompt_embeds", "prompt_embeds_mask"),
    "krea2": ("prompt_embeds", "prompt_embeds_mask"),
    "ideogram4": ("prompt_embeds", "prompt_attention_mask"),
    "ltx2": ("prompt_embeds", "prompt_attention_mask"),
}

SLOT_NAMES = {"clip_l", "clip_g", "clip_h", "t5", "gemma", "llama", "qwen", "qwen3", "mistral", "byt5"}

#: Snapshot statuses that are checked for exact equality (hf_configs.md: "Keep status in the
#: snapshot and let tests assert exact equality only on official, derived-copy and code values").
STRICT = {"official", "derived-copy", "code"}

#: Component config keys -> EncoderSpec field. torch_dtype / transformers_version / _name_or_path
#: are not compared: re-saved copies rewrite them (hf_configs.md).
ENCODER_KEYS = {
    "hidden_size": "hidden_size",
    "d_model": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_layers": "num_layers",
    "projection_dim": "projection_dim",
    "max_position_embeddings": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "architectures": "cls",
}
#: Encoder-config token ids are the tokenizer's real ids only for T5-family configs; every HF CLIP
#: text config keeps the legacy bos 0 / eos 2 / pad 1 (hf_configs.md, "CLIP eos_token_id = 2").
T5_CONFIG_IDS = {"pad_token_id": "pad_token_id", "eos_token_id": "eos_token_id"}
T5_MODEL_TYPES = {"t5", "umt5"}
#: Tokenizer config keys -> TokenizerSpec field. ``tokenizer_class`` is compared against the class
#: model_index loads; the text encoder's own ``tokenizer_class`` hint is not mapped (Wan's says
#: T5Tokenizer while model_index loads T5TokenizerFast).
TOKENIZER_KEYS = {
    "tokenizer_class": "cls",
    "pad_token": "pad_token",
    "bos_token": "bos_token",
    "eos_token": "eos_token",
}
NOT_COMPARED = {"torch_dtype", "transformers_version", "_name_or_path"}

_TOKEN_WITH_ID = re.compile(r"^(\S+) \(id (\d+)")
_NAME_WITH_NOTE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) \(")


@pytest.fixture(scope="module", params=EXPECTED_NAMES)
def prof(request: pytest.FixtureRequest) -> AlignmentProfile:
    return bundled(request.param)


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def _is_leaf(node: Any) -> bool:
    return isinstance(node, dict) and {"value", "source", "status"} <= node.keys()


# ------------------------------------------------------------------------------- loading, names
def test_bundled_names_are_the_expected_ones():
    assert bundled_names() == EXPECTED_NAMES


def test_every_profile_loads_with_known_slot_names_and_component_folders(prof: AlignmentProfile):
    assert prof.slots
    for slot in prof.slots:
        assert slot.name in SLOT_NAMES
        if slot.tokenizer_only:  # no encoder folder; the tokenizer keeps the pipeline's component name
            assert slot.encoder_subfolder == "" and re.fullmatch(r"[a-z0-9]+_tokenizer", slot.tokenizer_subfolder)
            continue
        tok = re.fullmatch(r"tokenizer(_[2-9])?", slot.tokenizer_subfolder)
        enc = re.fullmatch(r"text_encoder(_[2-9])?", slot.encoder_subfolder)
        assert tok and enc, (slot.tokenizer_subfolder, slot.encoder_subfolder)
        assert tok.group(1) == enc.group(1), f"{slot.name}: tokenizer and encoder folders do not pair up"
    encoded = [s for s in prof.slots if not s.tokenizer_only]
    assert len({s.encoder_subfolder for s in encoded}) == len(encoded)


def test_output_names_are_the_pipeline_keywords_in_encode_prompt_order(prof: AlignmentProfile):
    assert prof.output_names == EXPECTED_OUTPUTS[prof.name]


def test_aliases_are_unique_across_profiles_and_resolve():
    owner: dict[str, str] = {}
    for name in EXPECTED_NAMES:
        p = bundled(name)
        for alias in {_norm(a) for a in (p.name, *p.aliases)}:
            assert alias not in owner, f"alias '{alias}' of {name} is already used by {owner[alias]}"
            owner[alias] = name
        for alias in p.aliases:
            assert bundled(alias).name == name
        # a community base names its architecture's repo (the encoder files it loads): that repo is the architecture's
        assert bundled(p.repo).name == COMMUNITY_BASES.get(name, (name,))[0]


#: Community base -> (its architecture's profile, the behaviour paths where their recipes differ).
COMMUNITY_BASES: dict[str, tuple[str, set[str]]] = {
    "sd15-nai": ("sd15", {"slots.clip_l.encoder.layer"}),
    # clip skip 2 on SDXL is SDXL's own penultimate layer: the same behaviour, another published source
    "sdxl-pony": ("sdxl", set()),
}


@pytest.mark.parametrize("name", sorted(COMMUNITY_BASES))
def test_a_community_base_differs_from_its_architecture_only_where_its_source_says(name: str):
    arch, paths = COMMUNITY_BASES[name]
    base, p = bundled(arch), bundled(name)
    assert (p.family, p.repo, p.pipeline) == (base.family, base.repo, base.pipeline)
    a, b = base.behaviour(), p.behaviour()
    assert a.keys() == b.keys() and {k for k in a if a[k] != b[k]} == paths
    for path in paths:  # each difference cites its base's own published source
        assert p.provenance_of(path).status == "official", path
    assert (p.fingerprint() == base.fingerprint()) == (not paths)


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("pony", "sdxl-pony"),
        ("pony-diffusion-v6-xl", "sdxl-pony"),
        ("sd1-nai", "sd15-nai"),
        ("animefull", "sd15-nai"),
        ("sd1.5", "sd15"),
        ("sd-1.5", "sd15"),
        ("runwayml/stable-diffusion-v1-5", "sd15"),
        ("stable-diffusion-v1-5/stable-diffusion-v1-5", "sd15"),
        ("sd2.1", "sd21"),
        ("stabilityai/stable-diffusion-xl-base-1.0", "sdxl"),
        ("stabilityai/stable-diffusion-3-medium-diffusers", "sd3-medium"),
        ("sd3.5-medium", "sd35-medium"),
        ("flux1-dev", "flux-dev"),
        ("black-forest-labs/FLUX.1-dev", "flux-dev"),
        ("flux1-schnell", "flux-schnell"),
        ("black-forest-labs/FLUX.1-schnell", "flux-schnell"),
        ("lodestones/Chroma", "chroma"),
        ("PixArt-alpha/PixArt-Sigma-XL-2-1024-MS", "pixart-sigma"),
        ("fal/AuraFlow", "auraflow"),
        ("Alpha-VLLM/Lumina-Image-2.0", "lumina2"),
        ("HiDream-ai/HiDream-I1-Full", "hidream"),
        ("Efficient-Large-Model/Sana_1600M_1024px_diffusers", "sana"),
        ("Qwen/Qwen-Image", "qwen-image"),
        ("wan2.1", "wan21"),
        ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "wan21"),
        ("tencent/HunyuanImage-2.1", "hunyuanimage-2.1"),
        ("hunyuanvideo-community/HunyuanImage-2.1-Diffusers", "hunyuanimage-2.1"),
        ("hunyuanimage-2.1-distilled", "hunyuanimage-2.1"),
        ("hunyuanvideo-community/HunyuanImage-2.1-Distilled-Diffusers", "hunyuanimage-2.1"),
        ("circlestone-labs/Anima-Base-v1.0-Diffusers", "anima"),
        ("circlestone-labs/Anima", "anima"),
        ("Qwen/Qwen-Image-Edit", "qwen-image-edit"),
        ("Qwen/Qwen-Image-Edit-2509", "qwen-image-edit-2509"),
        ("Qwen/Qwen-Image-Edit-2511", "qwen-image-edit-2511"),
        ("Lightricks/LTX-2", "ltx2"),
        ("ltx-2.3", "ltx2"),
        ("diffusers/LTX-2.3-Diffusers", "ltx2"),
    ],
)
def test_common_spellings_resolve(alias: str, name: str):
    assert bundled(alias).name == name


# --------------------------------------------------------------------------- round trip, hashes
def test_round_trips_through_toml_and_json(prof: AlignmentProfile):
    assert profile_from_dict(tomllib.loads(prof.to_toml())) == prof
    assert profile_from_dict(json.loads(prof.to_json())) == prof


#: Profiles whose behaviour is really identical: SD3 Medium, SD3.5 Medium and SD3.5 Large share the
#: encoders, the StableDiffusion3Pipeline text path and (per the SD3 paper) the dropout.
#: Qwen-Image-Edit-2509 and 2511 are separate model versions run by the same QwenImageEditPlusPipeline text path
#: (same template, prefix, condition-image area); they are declared identical here on purpose, each its own profile
#: so a version is never read as the other.
SAME_BEHAVIOUR = [{"sd3-medium", "sd35-medium", "sd35-large"}, {"qwen-image-edit-2509", "qwen-image-edit-2511"},
                  {"sdxl", "sdxl-pony"}]


def test_fingerprints_are_distinct_except_identical_behaviour():
    prints = {n: bundled(n).fingerprint() for n in EXPECTED_NAMES}
    for group in SAME_BEHAVIOUR:
        assert len({prints[n] for n in group}) == 1, {n: prints[n] for n in group}
        assert len({json.dumps(bundled(n).behaviour(), sort_keys=True) for n in group}) == 1
    representatives = [n for n in EXPECTED_NAMES if not any(n in g and n != min(g) for g in SAME_BEHAVIOUR)]
    values = [prints[n] for n in representatives]
    assert len(set(values)) == len(values), prints


def test_fingerprints_are_stable():
    # A change here means a behaviour value (or the behaviour schema) changed: update deliberately.
    # Adding a field to TokenizerSpec / EncoderSpec / MaskSpec also changes every fingerprint, because
    # the behaviour dict lists every field (default-valued ones included).
    assert bundled("sd35-large").fingerprint() == "69729c9c4c664279"
    assert bundled("flux-schnell").fingerprint() == "0457a35dad4626fe"


# ----------------------------------------------------------------------- official-config snapshot
def _class_or_token(value: Any) -> Any:
    """A snapshot value as a comparable value, or None when it is a prose description."""
    if isinstance(value, list):
        return value[0] if len(value) == 1 else None
    if isinstance(value, str) and re.search(r"\s", value):
        m = _NAME_WITH_NOTE.match(value)
        return m.group(1) if m else None
    return value


def _snapshot_checks(p: AlignmentProfile) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """(snapshot key, snapshot value, profile value) for every strict snapshot value the mapping
    covers, plus the strict keys skipped as prose."""
    if p.name in NO_SNAPSHOT:
        return [], []
    snap = official_snapshot(SNAPSHOT_REPO[p.name])
    checks: list[tuple[str, Any, Any]] = []
    prose: list[str] = []

    def add(key: str, leaf: dict[str, Any], actual: Any, *, token_id: int | str | None = "n/a") -> None:
        if leaf["status"] not in STRICT:
            return
        raw = leaf["value"]
        if isinstance(raw, str) and (m := _TOKEN_WITH_ID.match(raw)):
            checks.append((key, m.group(1), actual))
            if token_id != "n/a":
                checks.append((key + " (id)", int(m.group(2)), token_id))
            return
        value = _class_or_token(raw)
        if value is None and raw is not None:
            prose.append(key)
            return
        checks.append((key, value, actual))

    mi = snap["model_index"]
    if mi["status"] in STRICT:
        index = mi["value"]
        add("model_index._class_name", {**mi, "value": index["_class_name"]}, p.pipeline)
        for slot in p.slots:
            for folder, actual in (
                (slot.encoder_subfolder, slot.encoder.cls),
                (slot.tokenizer_subfolder, slot.tokenizer.cls),
            ):
                entry = index.get(folder)
                assert isinstance(entry, list), f"model_index has no {folder}"
                add(f"model_index.{folder}", {**mi, "value": entry[1]}, actual)

    comps = snap["components"]
    for slot in p.slots:
        enc = comps.get(slot.encoder_subfolder, {})
        for key, leaf in enc.items():
            if key in ENCODER_KEYS:
                add(f"{slot.encoder_subfolder}.{key}", leaf, getattr(slot.encoder, ENCODER_KEYS[key]))
        model_type = enc.get("model_type", {}).get("value")
        if model_type in T5_MODEL_TYPES:
            for key, fld in T5_CONFIG_IDS.items():
                if key in enc:
                    add(f"{slot.encoder_subfolder}.{key}", enc[key], getattr(slot.tokenizer, fld))
        tok = comps.get(slot.tokenizer_subfolder, {})
        for key, leaf in tok.items():
            if key in TOKENIZER_KEYS:
                fld = TOKENIZER_KEYS[key]
                token_id = getattr(slot.tokenizer, fld + "_id") if fld != "cls" else "n/a"
                add(
                    f"{slot.tokenizer_subfolder}.{key}", leaf, getattr(slot.tokenizer, fld), token_id=token_id
                )
        if slot.tokenizer.cls == "CLIPTokenizer" and "model_max_length" in tok:
            # these pipelines tokenize CLIP with tokenizer.model_max_length
            if p.family in {"sd1", "sd2", "sdxl", "sd3", "flux"}:
                add(
                    f"{slot.tokenizer_subfolder}.model_max_length",
                    tok["model_max_length"],
                    slot.tokenizer.max_length,
                )
    return checks, prose


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_profile_equals_the_official_snapshot(name: str):
    p = bundled(name)
    checks, _ = _snapshot_checks(p)
    wrong = [(key, want, got) for key, want, got in checks if want != got]
    assert not wrong, f"{name}: snapshot value != profile value: {wrong}"


#: Snapshots whose mapped values are all inferred / unconfirmed, so nothing is compared exactly.
NOTHING_STRICT = {"chroma", "flux-schnell", "lumina2", *NO_SNAPSHOT}
#: Strict values that are prose rather than a value (checked by hand against the profile).
KNOWN_PROSE = {
    # "T5Tokenizer in tokenizer_config.json (model_index loads T5TokenizerFast)"
    "flux-dev": ["tokenizer_2.tokenizer_class"],
    "sd3-medium": ["tokenizer_3.tokenizer_class"],
    "sd35-medium": ["tokenizer_3.tokenizer_class"],
    "sd35-large": ["tokenizer_3.tokenizer_class"],
    # "set to eos_token by the pipeline (<|eot_id|>, id 128009 ...)"
    "hidream": ["tokenizer_4.pad_token"],
}


def test_snapshot_comparison_covers_the_strict_values():
    # Guards against the mapping silently matching nothing, or skipping new values as prose.
    counts = {}
    for name in EXPECTED_NAMES:
        checks, prose = _snapshot_checks(bundled(name))
        counts[name] = len(checks)
        assert prose == KNOWN_PROSE.get(name, []), (name, prose)
        assert (len(checks) == 0) == (name in NOTHING_STRICT), (name, len(checks))
    assert sum(counts.values()) >= 200, counts


def test_every_profile_has_a_snapshot_and_every_snapshot_a_profile():
    assert sorted(set(SNAPSHOT_REPO.values())) == official_repos()
    assert set(SNAPSHOT_REPO) | set(NO_SNAPSHOT) == set(EXPECTED_NAMES) and not set(SNAPSHOT_REPO) & set(NO_SNAPSHOT)
    for name, repo in SNAPSHOT_REPO.items():
        p = bundled(name)
        assert official_snapshot(p.repo)["repo"] == repo
    for name, repo in NO_SNAPSHOT.items():
        assert bundled(name).repo == repo and repo not in official_repos()
        statuses = {pv.status for _, pv in bundled(name).provenance}
        # no value read from the official repo is claimed; derived-copy (a copy of an official config found in a
        # trainer's repo, e.g. musubi-tuner's Qwen3-4B config for FLUX.2 klein and Z-Image) is allowed
        assert "official" not in statuses


def _leaves(node: Any) -> list[dict[str, Any]]:
    if _is_leaf(node):
        return [node]
    if isinstance(node, dict):
        return [leaf for v in node.values() for leaf in _leaves(v)]
    return []


def test_snapshot_leaves_are_value_source_status():
    for repo in official_repos():
        snap = official_snapshot(repo)
        leaves = [
            leaf
            for key in ("model_index", "components", "pipeline_defaults")
            for leaf in _leaves(snap.get(key, {}))
        ]
        assert leaves and all(leaf["status"] in STATUSES for leaf in leaves), repo
        assert _is_leaf(snap["model_index"]), repo
        for comp in snap["components"].values():
            assert all(_is_leaf(v) for v in comp.values()), repo


def test_pipeline_default_lengths_are_the_profile_value_or_an_alternative(prof: AlignmentProfile):
    if prof.name in NO_SNAPSHOT:
        return
    defaults = official_snapshot(SNAPSHOT_REPO[prof.name]).get("pipeline_defaults", {})
    leaf = defaults.get("max_sequence_length")
    if not leaf or leaf["status"] not in STRICT or not isinstance(leaf["value"], int):
        return
    for slot in prof.slots:
        if slot.tokenizer.cls == "CLIPTokenizer":
            continue
        path = f"slots.{slot.name}.tokenizer.max_length"
        pv = prof.provenance_of(path)
        alternatives = [a.value for a in pv.alternatives] if pv else []
        assert leaf["value"] == slot.tokenizer.max_length or leaf["value"] in alternatives, path


def _load_tool() -> Any:
    return load_script("tools/snapshot_official.py")


def test_snapshot_generator_keeps_every_leaf(tmp_path: Path):
    tool = _load_tool()
    leaf = {"value": 768, "source": "copy", "status": "derived-copy"}
    research = {
        "_meta": {"title": "t"},
        "models": {
            "org/model-a": {
                "aliases": ["other/model-a"],
                "model_index": {"value": {"_class_name": "XPipeline"}, "source": "s", "status": "official"},
                "components": {"text_encoder": {"hidden_size": leaf, "torch_dtype": leaf}},
                "pipeline_defaults": {"max_sequence_length": {"value": 77, "source": "c", "status": "code"}},
            }
        },
    }
    docs = tool.build_snapshots(research, "research.json", "0" * 64)
    written = tool.write_snapshots(docs, tmp_path)
    assert [p.name for p in written] == ["org--model-a.json"]
    doc = json.loads(written[0].read_text(encoding="utf-8"))
    assert doc["components"]["text_encoder"]["torch_dtype"] == leaf
    assert doc["pipeline_defaults"]["max_sequence_length"]["value"] == 77
    assert doc["aliases"] == ["other/model-a"]
    assert doc["snapshot"]["research_file"] == "research.json"


@pytest.mark.skipif(not RESEARCH_JSON.is_file(), reason="TE_ALIGN_RESEARCH_JSON (path of the research hf_configs.json) is not set")
def test_bundled_snapshots_match_the_research_json():
    tool = _load_tool()
    raw = RESEARCH_JSON.read_bytes()
    import hashlib

    docs = tool.build_snapshots(json.loads(raw), RESEARCH_JSON.name, hashlib.sha256(raw).hexdigest())
    for repo, doc in docs.items():
        assert official_snapshot(repo) == doc, f"{repo}: rerun tools/snapshot_official.py"


# ---------------------------------------------------------------------------------- provenance
def test_every_behaviour_path_has_provenance(prof: AlignmentProfile):
    missing = [path for path in prof.behaviour_paths() if prof.provenance_of(path) is None]
    assert not missing, missing


#: Fields that need an entry of their own on every slot (not one inherited from the slot's config source).
ALWAYS_OWN = (
    "tokenizer.max_length",
    "encoder.layer",
    "encoder.final_layer_norm",
    "encoder.pooled",
    "train_dropout",
)
#: Instead of the encoder fields, a tokenizer-only slot needs an entry of its own for this.
TOKENIZER_ONLY_OWN = ("tokenizer.max_length", "train_dropout", "tokenizer_only")
#: Fields that need an entry of their own whenever they differ from the schema default.
OWN_WHEN_SET = {
    "tokenizer": (
        "text_transform",
        "absent_text",
        "template",
        "system_prompt",
        "negative_template",
        "drop_start_tokens",
        "token_window",
        "text_cleaning",
        "tokenize_max_length",
        "padding_side",
        "min_length",
        "min_length_pad_id",
    ),
    "encoder": ("per_sample",),
    "masks": ("repad", "denoiser_extra_pad_tokens", "denoiser_mask_dtype", "encoder_mask_dtype"),
}
_DEFAULTS = {
    "tokenizer": {f.name: f.default for f in fields(TokenizerSpec)},
    "encoder": {f.name: f.default for f in fields(EncoderSpec)},
    "masks": {f.name: f.default for f in fields(MaskSpec)},
}


def _own_entry_gaps(p: AlignmentProfile) -> list[str]:
    own = dict(p.provenance)
    gaps = [k for k in ("family", "empty_prompt") if k not in own]
    gaps += [f"outputs.{n}" for n in p.output_names if f"outputs.{n}" not in own]
    for slot in p.slots:
        base = f"slots.{slot.name}"
        if base not in own:
            gaps.append(base)
        always = TOKENIZER_ONLY_OWN if slot.tokenizer_only else ALWAYS_OWN
        gaps += [f"{base}.{f}" for f in always if f"{base}.{f}" not in own]
        if not any(k == f"{base}.masks" or k.startswith(f"{base}.masks.") for k in own):
            gaps.append(f"{base}.masks")
        for part, names in OWN_WHEN_SET.items():
            spec = getattr(slot, part)
            for fname in names:
                if fname in _DEFAULTS[part] and getattr(spec, fname) != _DEFAULTS[part][fname]:
                    if f"{base}.{part}.{fname}" not in own:
                        gaps.append(f"{base}.{part}.{fname}")
    return gaps


@pytest.mark.parametrize("name", NEW_PROFILES)
def test_key_values_have_their_own_provenance(name: str):
    gaps = _own_entry_gaps(bundled(name))
    assert not gaps, f"{name}: no provenance entry of its own for {gaps}"


def test_provenance_statuses_are_known(prof: AlignmentProfile):
    for path, pv in prof.provenance:
        assert pv.status in STATUSES and pv.status != "override", path
        assert pv.source.strip(), path
        for alt in pv.alternatives:
            assert alt.status in STATUSES and alt.source.strip(), path


# ------------------------------------------------------------------- disagreements as alternatives
def _alternatives(p: AlignmentProfile, path: str) -> list[Any]:
    pv = dict(p.provenance).get(path)
    assert pv is not None, f"{p.name}: {path} has no provenance entry of its own"
    return [a.value for a in pv.alternatives]


@pytest.mark.parametrize(
    ("name", "path", "value", "alternatives"),
    [
        ("flux-schnell", "slots.t5.tokenizer.max_length", 256, {512}),
        ("flux-dev", "slots.t5.tokenizer.max_length", 512, set()),
        ("qwen-image", "slots.qwen.tokenizer.max_length", 512, {1024}),
        ("wan21", "slots.t5.tokenizer.max_length", 512, {226}),
        ("sd3-medium", "slots.t5.tokenizer.max_length", 256, {77, 154, 512}),
        ("sd35-medium", "slots.t5.tokenizer.max_length", 256, {77, 154, 512}),
        ("sd35-large", "slots.t5.tokenizer.max_length", 256, {77, 154, 512}),
        ("qwen-image-edit", "slots.qwen.tokenizer.max_length", 512, {1024}),
        ("qwen-image-edit-2509", "slots.qwen.tokenizer.max_length", 512, {1024}),
        ("qwen-image-edit-2511", "slots.qwen.tokenizer.max_length", 512, {1024}),
    ],
)
def test_disagreements_are_recorded_as_alternatives(name: str, path: str, value: Any, alternatives: set[Any]):
    p = bundled(name)
    assert p.get(path) == value
    assert alternatives <= set(_alternatives(p, path))
    assert value not in _alternatives(p, path)


@pytest.mark.parametrize("name", ["qwen-image-edit", "qwen-image-edit-2509", "qwen-image-edit-2511"])
def test_qwen_image_edit_lengths_are_declared_not_applied(name: str):
    # These profiles have no official snapshot (NO_SNAPSHOT), so test_pipeline_default_lengths_... cannot check
    # them; the fact differs from the other families: __call__'s max_sequence_length (512) and the 1024 cap are
    # never applied (the processor gets padding=True only), so the profile does not truncate and pads to the longest.
    t = bundled(name).slot("qwen").tokenizer
    assert (t.max_length, t.truncation, t.padding, t.drop_start_tokens) == (512, False, "longest", 64)
    assert _alternatives(bundled(name), "slots.qwen.tokenizer.max_length") == [1024]


def test_sd3_family_records_the_untruncated_reference_tokenizer():
    for name in ("sd3-medium", "sd35-medium", "sd35-large"):
        p = bundled(name)
        assert False in _alternatives(p, "slots.t5.tokenizer.truncation")


def test_qwen_image_records_both_lengths():
    t = bundled("qwen-image").slot("qwen").tokenizer
    assert (t.max_length, t.tokenize_max_length, t.drop_start_tokens) == (512, 1024 + 34, 34)


# ------------------------------------------------------------------------ family-specific recipes
QWEN_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
LUMINA_SYSTEM = (
    "You are an assistant designed to generate superior images with the superior degree of image-text "
    "alignment based on textual prompts or user prompts."
)
SANA_INSTRUCTION_LINES = (
    "Given a user prompt, generate an 'Enhanced prompt' that provides detailed visual descriptions suitable for image generation. Evaluate the level of detail in the user prompt:",
    "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, and spatial relationships to create vivid and concrete scenes.",
    "- If the prompt is already detailed, refine and enhance the existing details slightly without overcomplicating.",
    "Here are examples of how to transform or refine prompts:",
    "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round shape, sleeping peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.",
    "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, featuring glowing street lamps, a diverse crowd of people in colorful clothing, and a double-decker bus passing by towering glass skyscrapers.",
    "Please generate only the enhanced description for the prompt below and avoid including any additional commentary or evaluations:",
    "User Prompt: ",
)


def _slot(name: str, slot: str) -> SlotSpec:
    return bundled(name).slot(slot)


def _layer(enc: EncoderSpec) -> tuple[Any, bool, str]:
    return enc.layer, enc.final_layer_norm, enc.pooled


def test_sd15_and_sd21():
    s = _slot("sd15", "clip_l")
    assert _layer(s.encoder) == ("last", True, "none")
    assert (s.tokenizer.max_length, s.tokenizer.pad_token_id) == (77, 49407)
    assert bundled("sd15").outputs == (("prompt_embeds", "clip_l.hidden"),)
    h = _slot("sd21", "clip_h")
    assert _layer(h.encoder) == ("last", True, "none")
    assert (h.encoder.num_layers, h.encoder.hidden_size, h.encoder.projection_dim) == (23, 1024, 512)
    assert (h.tokenizer.pad_token, h.tokenizer.pad_token_id) == ("!", 0)
    assert bundled("sd21").provenance_of("slots.clip_h.tokenizer.pad_token").status == "inferred"


def test_sdxl():
    p = bundled("sdxl")
    assert p.empty_prompt == "zeros"
    assert _layer(p.slot("clip_l").encoder) == ("penultimate", False, "none")
    assert _layer(p.slot("clip_g").encoder) == ("penultimate", False, "text_embeds")
    g = p.slot("clip_g").tokenizer
    assert (g.pad_token, g.pad_token_id) == ("!", 0)
    assert dict(p.outputs) == {
        "prompt_embeds": "feat(clip_l.hidden, clip_g.hidden)",
        "pooled_prompt_embeds": "clip_g.pooled",
    }


def test_flux():
    for name in ("flux-dev", "flux-schnell"):
        p = bundled(name)
        assert _layer(p.slot("clip_l").encoder) == ("last", True, "pooler_output")
        assert p.slot("t5").masks == MaskSpec()
        assert dict(p.outputs)["text_ids"] == "text_ids(t5.hidden)"


def test_chroma():
    t5 = _slot("chroma", "t5")
    assert t5.tokenizer.max_length == 512
    assert (
        t5.masks.encoder,
        t5.masks.zero_padded,
        t5.masks.denoiser,
        t5.masks.denoiser_extra_pad_tokens,
    ) == (True, False, True, 1)
    assert dict(bundled("chroma").outputs)["prompt_attention_mask"] == "t5.denoiser_mask"


def test_pixart_sigma_and_auraflow():
    px = _slot("pixart-sigma", "t5")
    assert (px.tokenizer.max_length, px.tokenizer.text_cleaning) == (300, "pixart")
    assert (px.masks.encoder, px.masks.zero_padded, px.masks.denoiser) == (True, False, True)
    af = _slot("auraflow", "t5")
    assert (af.tokenizer.max_length, af.encoder.cls, af.encoder.hidden_size) == (
        256,
        "UMT5EncoderModel",
        2048,
    )
    assert (af.masks.encoder, af.masks.zero_padded, af.masks.denoiser) == (True, True, False)


def test_lumina2():
    g = _slot("lumina2", "gemma")
    assert _layer(g.encoder) == ("penultimate", False, "none")
    assert (g.tokenizer.max_length, g.tokenizer.padding_side) == (256, "right")
    assert g.tokenizer.template == "{system_prompt} <Prompt Start> {prompt}"
    assert g.tokenizer.system_prompt == LUMINA_SYSTEM
    assert g.tokenizer.negative_template == "{prompt}"
    assert (g.masks.encoder, g.masks.denoiser) == (True, True)


def test_hidream():
    p = bundled("hidream")
    assert [s.name for s in p.slots] == ["clip_l", "clip_g", "t5", "llama"]
    assert all(s.tokenizer.max_length == 128 for s in p.slots)
    assert p.slot("clip_l").encoder.pooled == p.slot("clip_g").encoder.pooled == "text_embeds"
    assert (p.slot("t5").masks.encoder, p.slot("llama").masks.encoder) == (True, True)
    assert p.slot("llama").encoder.layer == "all"
    assert p.slot("llama").tokenizer.pad_token == p.slot("llama").tokenizer.eos_token
    assert dict(p.outputs)["pooled_prompt_embeds"] == "feat(clip_l.pooled, clip_g.pooled)"
    assert not any(s.masks.denoiser for s in p.slots)


def test_sana():
    g = _slot("sana", "gemma")
    assert _layer(g.encoder) == ("last", True, "none")
    assert (g.tokenizer.max_length, g.tokenizer.token_window, g.tokenizer.text_cleaning) == (
        300,
        "bos_and_tail",
        "lower",
    )
    assert g.tokenizer.template == "{system_prompt}{prompt}"
    assert g.tokenizer.system_prompt == "\n".join(SANA_INSTRUCTION_LINES)
    assert g.tokenizer.negative_template == "{prompt}"
    assert (g.masks.encoder, g.masks.denoiser) == (True, True)


def test_qwen_image():
    q = _slot("qwen-image", "qwen")
    assert q.tokenizer.template == q.tokenizer.negative_template == QWEN_TEMPLATE
    assert (q.tokenizer.padding, q.tokenizer.drop_start_tokens) == ("longest", 34)
    assert (q.encoder.layer, q.encoder.final_layer_norm) == (-1, False)
    assert (q.masks.encoder, q.masks.denoiser, q.masks.repad) == (True, True, "batch_longest")


def test_hunyuanimage():
    p = bundled("hunyuanimage-2.1")
    q, b = p.slot("qwen"), p.slot("byt5")
    # Qwen-Image's chat template without the assistant turn
    assert q.tokenizer.template == q.tokenizer.negative_template == QWEN_TEMPLATE.removesuffix("\n<|im_start|>assistant\n")
    assert (q.tokenizer.max_length, q.tokenizer.padding, q.tokenizer.drop_start_tokens) == (1000, "max_length", 34)
    assert q.tokenizer.tokenize_max_length is None  # the tokenizer gets max_length + drop_start_tokens = 1034
    assert (q.encoder.layer, q.encoder.final_layer_norm, q.masks.repad) == (-3, False, "none")
    assert (q.masks.encoder, q.masks.denoiser) == (True, True)
    assert (b.tokenizer.cls, b.tokenizer.max_length, b.tokenizer.padding) == ("ByT5Tokenizer", 128, "max_length")
    assert (b.tokenizer.text_transform, b.tokenizer.absent_text) == ("quoted_text", "zeros")
    assert (b.encoder.cls, b.encoder.hidden_size, b.encoder.layer, b.encoder.final_layer_norm) == ("T5EncoderModel", 1472, "last", True)
    assert b.encoder.per_sample and (b.masks.encoder, b.masks.encoder_mask_dtype, b.masks.denoiser) == (True, "float", True)
    assert dict(p.outputs) == {
        "prompt_embeds": "qwen.hidden",
        "prompt_embeds_mask": "qwen.denoiser_mask",
        "prompt_embeds_2": "byt5.hidden",
        "prompt_embeds_mask_2": "byt5.denoiser_mask",
    }
    # sd-scripts' values are kept as alternatives
    assert 1024 in _alternatives(p, "slots.qwen.tokenizer.max_length")
    assert "longest" in _alternatives(p, "slots.qwen.tokenizer.padding")


def test_wan21():
    t5 = _slot("wan21", "t5")
    assert (t5.tokenizer.max_length, t5.tokenizer.text_cleaning) == (512, "wan")
    assert (t5.encoder.cls, t5.encoder.vocab_size) == ("UMT5EncoderModel", 256384)
    assert (t5.masks.encoder, t5.masks.denoiser, t5.masks.repad) == (True, False, "max_length")


def test_anima():
    p = bundled("anima")
    q, t5 = p.slot("qwen"), p.slot("t5")
    assert (p.pipeline, p.empty_prompt) == ("AnimaModularPipeline", "encode")
    assert (q.encoder.cls, q.encoder.hidden_size, q.encoder.num_layers) == ("Qwen3Model", 1024, 28)
    assert _layer(q.encoder) == ("last", True, "none")
    assert (q.tokenizer.padding, q.tokenizer.max_length, q.tokenizer.padding_side) == ("longest", 512, "right")
    assert (q.tokenizer.min_length, q.tokenizer.min_length_pad_id) == (1, 0)  # the zero-length batch case
    assert (q.masks.encoder, q.masks.zero_padded, q.masks.denoiser) == (True, True, True)
    assert t5.tokenizer_only and t5.encoder_subfolder == "" and t5.tokenizer_subfolder == "t5_tokenizer"
    assert (t5.tokenizer.cls, t5.tokenizer.padding, t5.tokenizer.max_length) == ("T5TokenizerFast", "longest", 512)
    assert not any(path.startswith("slots.t5.encoder") for path in p.behaviour_paths())
    assert dict(p.outputs) == {
        "qwen_prompt_embeds": "qwen.hidden",
        "qwen_attention_mask": "qwen.denoiser_mask",
        "t5_input_ids": "t5.ids",
        "t5_attention_mask": "t5.denoiser_mask",
    }
    # sd-scripts' fixed 512 padding is recorded as the alternative of both paddings
    assert "max_length" in _alternatives(p, "slots.qwen.tokenizer.padding")
    assert "max_length" in _alternatives(p, "slots.t5.tokenizer.padding")


def test_tokenizer_only_slots_are_validated():
    data = json.loads(bundled("anima").to_json())
    bad = json.loads(json.dumps(data))
    bad["outputs"]["t5_hidden"] = "t5.hidden"
    with pytest.raises(Exception, match="tokenizer_only: it gives ids, mask and denoiser_mask"):
        profile_from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["slots"]["t5"]["encoder"] = {"cls": "T5EncoderModel", "hidden_size": 8, "num_layers": 1}
    with pytest.raises(Exception, match="no encoder table"):
        profile_from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["slots"]["t5"]["masks"]["zero_padded"] = True
    with pytest.raises(Exception, match=r"masks\.zero_padded must be false"):
        profile_from_dict(bad)
    bad = json.loads(json.dumps(data))
    del bad["slots"]["qwen"]["tokenizer"]["min_length"]
    with pytest.raises(Exception, match="min_length_pad_id needs a min_length"):
        profile_from_dict(bad)


def test_the_alias_table_read_from_the_files_headers_equals_the_loaded_profiles():
    """check resolves a name from each file's top-level keys alone; that must give what the loaded profiles say."""
    from te_align.profiles import registry

    full: dict[str, str] = {}
    for name in sorted(registry._bundled_files()):
        p = registry._load_bundled(name)
        for alias in (p.name, *p.aliases):
            full.setdefault(registry._norm(alias), name)
    assert registry._alias_table() == full
