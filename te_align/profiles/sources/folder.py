"""Profiles from diffusers-format model folders (``model_index.json`` plus the component configs).

The pipeline class in ``model_index.json`` names the family; the transformer / text-encoder configs
(or, last, the folder name) tell its variants apart. The encoder configs and tokenizer files then
state widths, depths, classes, dtypes, special tokens and lengths. Only JSON files are read.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_align._paths import read_bytes
from te_align.errors import ProfileError
from te_align.profiles.model import AlignmentProfile, SlotSpec
from te_align.profiles.sources.common import (
    BY_PROFILE,
    RECIPES,
    BuildReport,
    Collector,
    Recipe,
    SourceKind,
    bundled_base,
    log_report,
    profile_name,
    show,
)


def build_folder(path: str | Path, shown: str | None = None) -> BuildReport:
    """The build report of a local diffusers-format folder (``shown``: how messages name it)."""
    p = Path(path).expanduser()
    text = str(path) if shown is None else shown
    if not p.is_dir():
        raise ProfileError("not a folder (expected a diffusers-format model folder with model_index.json)", file=text)
    return build_tree(Tree.local(p, text), kind="folder", source=text, hint=p.resolve().name)


def from_folder(path: str | Path) -> AlignmentProfile:
    """The profile of a local diffusers-format folder (differences are logged once)."""
    report = build_folder(path)
    log_report(report)
    return report.profile


#: Words a pipeline class may add to its base without changing the text conditioning.
_VARIANT_WORDS = re.compile(r"(?:Img2Img|Inpainting|Inpaint|ControlNet|Control|Union|PAG|Text2Img|Fill|Kontext|Adapter)*")


def _pipeline_base(class_name: str) -> str | None:
    if not class_name.endswith("Pipeline"):
        return None
    stem = class_name[: -len("Pipeline")]
    for base in sorted({r.pipeline for r in RECIPES}, key=len, reverse=True):
        if stem.startswith(base) and _VARIANT_WORDS.fullmatch(stem[len(base):]):
            return base
    return None


def _supported_pipelines() -> str:
    groups: dict[str, list[str]] = {}
    for r in RECIPES:
        groups.setdefault(r.pipeline, []).append(r.profile)
    return ", ".join(f"{p}Pipeline ({'/'.join(names)})" for p, names in groups.items())


# ===================================================================================== file access
@dataclass(frozen=True)
class Tree:
    """A diffusers-format folder, with how its files are named in messages and provenance."""

    root: Path
    prefix: str

    @classmethod
    def local(cls, root: Path, shown: str) -> Tree:
        return cls(root, shown.rstrip("/\\") + os.sep)

    def label(self, rel: str) -> str:
        return self.prefix + rel

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def read(self, rel: str) -> dict[str, Any] | None:
        """A JSON object from a file, or None when the file does not exist."""
        path = self.root / rel
        if not path.is_file():
            return None
        return _read_json(path, self.label(rel))


def _read_json(path: Path, label: str) -> dict[str, Any]:
    try:
        raw = read_bytes(path, ProfileError)
    except ProfileError as e:
        raise ProfileError(e.message, file=label) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ProfileError("not a usable JSON file: objects or arrays are nested too deeply", file=label) from None
    except UnicodeDecodeError:
        raise ProfileError("not valid JSON: the file is not UTF-8 text", file=label) from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", file=label) from None
    if not isinstance(data, dict):
        raise ProfileError(f"expected a JSON object at the top level, got {type(data).__name__}", file=label)
    return data


def _int_field(data: dict[str, Any], key: str, label: str, *, shown: str | None = None) -> int | None:
    if key not in data or data[key] is None:
        return None
    v = data[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ProfileError(f"expected a positive integer, got {v!r}", file=label, key=shown or key)
    return v


def _component_class(model_index: dict[str, Any], sub: str) -> tuple[bool, str | None]:
    """(listed, class) of a model_index.json component; listed is False for a missing or null entry."""
    entry = model_index.get(sub)
    if isinstance(entry, list) and len(entry) == 2:
        if entry[1] is None:
            return False, None
        return True, str(entry[1])
    return sub in model_index, None


# ============================================================================== diffusers folders
def build_tree(tree: Tree, *, kind: SourceKind, source: str, hint: str, repo: str = "") -> BuildReport:
    index_label = tree.label("model_index.json")
    model_index = tree.read("model_index.json")
    if model_index is None:
        raise ProfileError(
            "no model_index.json: not a diffusers-format model folder "
            "(a single-file checkpoint is read from its .safetensors path instead)",
            file=index_label,
        )
    class_name = model_index.get("_class_name")
    if not isinstance(class_name, str) or not class_name:
        raise ProfileError("expected the pipeline class name as a string", file=index_label, key="_class_name")
    name, reason = _detect_folder(tree, model_index, class_name, hint)
    base = bundled_base(name, reason)
    recipe = BY_PROFILE[name]
    out = Collector(base, status="official")
    for slot in base.slots:
        _read_encoder(tree, model_index, slot, out)
        _read_tokenizer(tree, model_index, slot, recipe, out)
    return out.apply(name=profile_name(hint), kind=kind, source=source, reason=reason, repo=repo)


def _detect_folder(tree: Tree, model_index: dict[str, Any], class_name: str, hint: str) -> tuple[str, str]:
    pipeline = _pipeline_base(class_name)
    why = f"model_index.json _class_name {class_name}"
    if pipeline is None:
        raise ProfileError(
            f"pipeline class '{class_name}' has no bundled profile; supported: {_supported_pipelines()}, "
            "with Img2Img / Inpaint / ControlNet / PAG variants",
            file=tree.label("model_index.json"),
            key="_class_name",
        )
    picker = _FOLDER_PICKERS.get(pipeline)
    if picker is None:
        return next(r.profile for r in RECIPES if r.pipeline == pipeline), why
    name, detail = picker(tree, model_index, hint.lower())
    return name, f"{why}; {detail}"


def _from_folder_name(hint: str, table: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
    """Last-resort variant guess: the first profile whose pattern matches the folder or repo name."""
    for name, pattern in table:
        if re.search(pattern, hint):
            return name, f"folder name '{hint}'"
    return None


def _pick_sd(tree: Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
    widths = {768: "sd15", 1024: "sd21"}
    te = tree.read("text_encoder/config.json") or {}
    width = te.get("hidden_size")
    if width in widths:
        return widths[width], f"text_encoder/config.json hidden_size {width}"
    unet = tree.read("unet/config.json") or {}
    width = unet.get("cross_attention_dim")
    if width in widths:
        return widths[width], f"unet/config.json cross_attention_dim {width}"
    by_name = _from_folder_name(hint, (("sd21", r"(?<![0-9.])2[-_.]?[01](?![0-9])|v2|sd2"), ("sd15", r"(?<![0-9.])1[-_.]?[45](?![0-9])|v1|sd1")))
    if by_name:
        return by_name
    raise ProfileError(
        "cannot tell Stable Diffusion 1.x from 2.x: neither text_encoder/config.json hidden_size nor "
        "unet/config.json cross_attention_dim is 768 (SD 1.x) or 1024 (SD 2.x)",
        file=tree.label("model_index.json"),
    )


def _pick_sdxl(tree: Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
    listed, _ = _component_class(model_index, "text_encoder")
    listed2, _ = _component_class(model_index, "text_encoder_2")
    if listed2 and not listed:
        raise ProfileError(
            "an SDXL refiner (text_encoder_2 only, no text_encoder) conditions on OpenCLIP bigG alone; "
            "there is no bundled profile for it",
            file=tree.label("model_index.json"),
        )
    return "sdxl", "SDXL base (text_encoder + text_encoder_2)"


def _pick_sd3(tree: Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
    rel = "transformer/config.json"
    cfg = tree.read(rel)
    if cfg is not None and "num_layers" in cfg:
        label = tree.label(rel)
        depth = _int_field(cfg, "num_layers", label)
        dual = cfg.get("dual_attention_layers") or []
        if not isinstance(dual, list):
            raise ProfileError(f"expected a list of layer indices, got {dual!r}", file=label, key="dual_attention_layers")
        if depth == 38 and not dual:
            return "sd35-large", f"{rel} num_layers 38"
        if depth == 24 and dual:
            return "sd35-medium", f"{rel} num_layers 24 with dual_attention_layers"
        if depth == 24:
            return "sd3-medium", f"{rel} num_layers 24, no dual_attention_layers"
        raise ProfileError(
            f"an SD3 MMDiT with {depth} layers{' and dual attention' if dual else ''} matches no bundled profile "
            "(24 = sd3-medium, 24 + dual_attention_layers = sd35-medium, 38 = sd35-large)",
            file=label,
            key="num_layers",
        )
    by_name = _from_folder_name(
        hint, (("sd35-large", r"3\.?5[-_ ]?l"), ("sd35-medium", r"3\.?5[-_ ]?m"), ("sd3-medium", r"(?<![0-9.])3[-_ ]?m"))
    )
    if by_name:
        return by_name
    raise ProfileError(
        "cannot tell SD3 medium, SD3.5 medium and SD3.5 large apart without transformer/config.json "
        "num_layers (24 / 24 with dual_attention_layers / 38)",
        file=tree.label(rel),
    )


def _pick_flux(tree: Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
    rel = "transformer/config.json"
    cfg = tree.read(rel) or {}
    guidance = cfg.get("guidance_embeds")
    if isinstance(guidance, bool):
        return ("flux-dev", f"{rel} guidance_embeds true") if guidance else ("flux-schnell", f"{rel} guidance_embeds false")
    sched_rel = "scheduler/scheduler_config.json"
    sched = tree.read(sched_rel) or {}
    dynamic = sched.get("use_dynamic_shifting")
    if isinstance(dynamic, bool):
        return (
            ("flux-dev", f"{sched_rel} use_dynamic_shifting true")
            if dynamic
            else ("flux-schnell", f"{sched_rel} use_dynamic_shifting false")
        )
    by_name = _from_folder_name(hint, (("flux-schnell", r"schnell"), ("flux-dev", r"(?<![a-z])dev(?![a-z])")))
    if by_name:
        return by_name
    raise ProfileError(
        "cannot tell FLUX.1-dev from FLUX.1-schnell: transformer/config.json has no guidance_embeds, "
        "scheduler/scheduler_config.json no use_dynamic_shifting, and the folder name says neither; "
        "use the bundled profile 'flux-dev' or 'flux-schnell' directly",
        file=tree.label(rel),
    )


_FOLDER_PICKERS: dict[str, Callable[[Tree, dict[str, Any], str], tuple[str, str]]] = {
    "StableDiffusion": _pick_sd,
    "StableDiffusionXL": _pick_sdxl,
    "StableDiffusion3": _pick_sd3,
    "Flux": _pick_flux,
}


def _read_encoder(tree: Tree, model_index: dict[str, Any], slot: SlotSpec, out: Collector) -> None:
    sub = slot.encoder_subfolder
    rel = f"{sub}/config.json"
    listed, index_cls = _component_class(model_index, sub)
    cfg = tree.read(rel)
    if cfg is None:
        if sub in model_index and not listed:
            out.note(f"model_index.json sets {sub} to null; slot {slot.name} keeps the bundled encoder values")
        else:
            out.note(f"{sub}/config.json not found; slot {slot.name} keeps the bundled encoder values")
        if index_cls:
            out.found(f"slots.{slot.name}.encoder.cls", index_cls, tree.label("model_index.json"), f"{sub} class")
        return
    label = tree.label(rel)
    inner = cfg.get("text_config")
    scopes = [cfg, inner] if isinstance(inner, dict) else [cfg]
    where = f"slots.{slot.name}.encoder"

    def first(keys: Iterable[str]) -> tuple[int | None, str]:
        for scope in scopes:
            prefix = "" if scope is cfg else "text_config."
            for k in keys:
                v = _int_field(scope, k, label, shown=prefix + k) if k in scope else None
                if v is not None:
                    return v, prefix + k
        return None, ""

    hidden, hkey = first(("hidden_size", "d_model"))
    if hidden is None:
        raise ProfileError(
            "missing: expected the text encoder's width as an integer hidden_size (or d_model in T5 configs)",
            file=label,
            key="hidden_size",
        )
    layers, lkey = first(("num_hidden_layers", "num_layers"))
    if layers is None:
        raise ProfileError(
            "missing: expected the text encoder's depth as an integer num_hidden_layers (or num_layers in T5 configs)",
            file=label,
            key="num_hidden_layers",
        )
    out.found(f"{where}.hidden_size", hidden, label, hkey)
    out.found(f"{where}.num_layers", layers, label, lkey)
    enc = slot.encoder
    for fname, keys in (
        ("projection_dim", ("projection_dim",)),
        ("max_position_embeddings", ("max_position_embeddings",)),
        ("vocab_size", ("vocab_size",)),
    ):
        value, key = first(keys)
        if value is None:
            continue
        if getattr(enc, fname) is None:
            continue  # the profile does not track it for this encoder
        out.found(f"{where}.{fname}", value, label, key)
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if index_cls:
        out.found(f"{where}.cls", index_cls, tree.label("model_index.json"), f"{sub} class")
        if arch and arch != index_cls:
            out.note(
                f"{rel} architectures[0] is {arch} but model_index.json loads {index_cls}; the profile follows model_index.json"
            )
    elif arch:
        out.found(f"{where}.cls", arch, label, "architectures[0]")
    for key in ("torch_dtype", "dtype"):
        dtype = cfg.get(key)
        if isinstance(dtype, str) and re.fullmatch(r"[a-z]+[0-9a-z_]*", dtype) and dtype != "auto":
            out.found(f"{where}.dtype", dtype, label, key)
            break


def _token_text(value: Any, label: str, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(content := value.get("content"), str):
        return content
    raise ProfileError(f"expected a token string or an object with 'content', got {value!r}", file=label, key=key)


class _TokenIds:
    """Token -> id from the small files of a tokenizer folder (the big ones only when needed)."""

    def __init__(self, tree: Tree, sub: str, tokenizer_config: dict[str, Any]) -> None:
        self.tree = tree
        self.sub = sub
        self.tables: list[tuple[str, dict[str, int]]] = []
        self.loaded: set[str] = set()
        decoder = tokenizer_config.get("added_tokens_decoder")
        if isinstance(decoder, dict):
            table = {}
            for idx, tok in decoder.items():
                text = tok.get("content") if isinstance(tok, dict) else tok
                if isinstance(text, str) and str(idx).isdigit():
                    table[text] = int(idx)
            self.tables.append((f"{sub}/tokenizer_config.json added_tokens_decoder", table))

    def _load(self, rel: str) -> None:
        if rel in self.loaded:
            return
        self.loaded.add(rel)
        data = self.tree.read(f"{self.sub}/{rel}")
        if data is None:
            return
        table: dict[str, int] = {}
        if rel == "tokenizer.json":
            for tok in data.get("added_tokens") or []:
                if isinstance(tok, dict) and isinstance(tok.get("content"), str) and isinstance(tok.get("id"), int):
                    table[tok["content"]] = tok["id"]
            model = data.get("model")
            vocab = model.get("vocab") if isinstance(model, dict) else None
            if isinstance(vocab, dict):
                for k, v in vocab.items():
                    if isinstance(v, int):
                        table.setdefault(k, v)
            elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the index
                for i, item in enumerate(vocab):
                    if isinstance(item, list) and item and isinstance(item[0], str):
                        table.setdefault(item[0], i)
        else:
            table = {k: v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)}
        self.tables.append((f"{self.sub}/{rel}", table))

    def lookup(self, token: str) -> tuple[int, str] | None:
        for rel in (None, "added_tokens.json", "vocab.json", "tokenizer.json"):
            if rel is not None:
                self._load(rel)
            for name, table in self.tables:
                if token in table:
                    return table[token], name
        return None


def _read_tokenizer(
    tree: Tree, model_index: dict[str, Any], slot: SlotSpec, recipe: Recipe, out: Collector
) -> None:
    sub = slot.tokenizer_subfolder
    where = f"slots.{slot.name}.tokenizer"
    listed, index_cls = _component_class(model_index, sub)
    tc_rel, sm_rel = f"{sub}/tokenizer_config.json", f"{sub}/special_tokens_map.json"
    tc = tree.read(tc_rel)
    sm = tree.read(sm_rel)
    if index_cls:
        out.found(f"{where}.cls", index_cls, tree.label("model_index.json"), f"{sub} class")
    if tc is None and sm is None:
        if sub in model_index and not listed:
            out.note(f"model_index.json sets {sub} to null; slot {slot.name} keeps the bundled tokenizer values")
        else:
            out.note(f"{sub}/ has no tokenizer_config.json or special_tokens_map.json; slot {slot.name} keeps the bundled tokenizer values")
        return
    tc = tc or {}
    sm = sm or {}
    if not index_cls and isinstance(tc.get("tokenizer_class"), str):
        out.found(f"{where}.cls", tc["tokenizer_class"], tree.label(tc_rel), "tokenizer_class")
    spec = slot.tokenizer
    fixed = {f for s, f in recipe.pipeline_sets if s == sub}
    ids = _TokenIds(tree, sub, tc)
    # transformers reads special_tokens_map.json over tokenizer_config.json unless the latter carries
    # added_tokens_decoder (then special_tokens_map.json is ignored).
    map_wins = "added_tokens_decoder" not in tc
    for kind in ("pad", "bos", "eos"):
        key = f"{kind}_token"
        in_tc, in_sm = key in tc, key in sm
        if not in_tc and not in_sm:
            continue
        v_tc = _token_text(tc.get(key), tree.label(tc_rel), key)
        v_sm = _token_text(sm.get(key), tree.label(sm_rel), key)
        if in_sm and (map_wins or not in_tc):
            value, rel = v_sm, sm_rel
        else:
            value, rel = v_tc, tc_rel
        if in_tc and in_sm and v_tc != v_sm:
            out.note(f"{sub}: {key} is {show(v_tc)} in tokenizer_config.json but {show(v_sm)} in special_tokens_map.json; using {show(value)}")
        current = getattr(spec, key)
        if key in fixed or f"{key}_id" in fixed:
            if value != current:
                out.note(f"{rel} {key} {show(value)} not adopted: the pipeline sets it itself (profile: {show(current)})")
            continue
        if value is None or current is None:
            if value != current:
                out.note(f"{rel} {key} is {show(value)}; the profile keeps {show(current)}")
            continue
        out.found(f"{where}.{key}", value, tree.label(rel), key)
        hit = ids.lookup(value)
        if hit is not None:
            out.found(f"{where}.{key}_id", hit[0], tree.label(hit[1]), f"id of {show(value)}")
        elif value != current and getattr(spec, f"{key}_id") is not None:
            out.found(f"{where}.{key}_id", None, tree.label(rel), f"(no id for {show(value)} in the files read)")
    _read_max_length(tree, tc, tc_rel, slot, recipe, out)
    side = tc.get("padding_side")
    if isinstance(side, str) and side != spec.padding_side:
        out.note(f"{tc_rel} padding_side {side!r} not adopted (profile: {spec.padding_side!r}; some pipelines force it)")


def _read_max_length(
    tree: Tree, tc: dict[str, Any], rel: str, slot: SlotSpec, recipe: Recipe, out: Collector
) -> None:
    raw = tc.get("model_max_length")
    if raw is None:
        return
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise ProfileError(f"expected a positive integer, got {raw!r}", file=tree.label(rel), key="model_max_length")
    spec = slot.tokenizer
    path = f"slots.{slot.name}.tokenizer.max_length"
    is_clip = spec.cls.startswith("CLIP")
    current = spec.max_length
    if raw >= 1_000_000:
        if is_clip and recipe.lengths == "clip":
            out.note(f"{rel} model_max_length is unset ({raw}); the profile keeps {current}")
        return
    if recipe.lengths == "hidream":
        if is_clip:
            if raw != current:
                out.note(f"{rel} model_max_length {raw} not adopted: the pipeline pads CLIP to min(max_sequence_length, 218)")
        elif raw < current:
            out.found(path, raw, tree.label(rel), "model_max_length (the pipeline uses min(max_sequence_length, model_max_length))")
        return
    if not is_clip:
        if raw != current:
            out.note(
                f"{rel} model_max_length {raw} not adopted: the pipeline passes max_sequence_length to this tokenizer (profile: {current})"
            )
        return
    limit = out.findings.get(f"slots.{slot.name}.encoder.max_position_embeddings", (slot.encoder.max_position_embeddings,))[0]
    if isinstance(limit, int) and raw > limit:
        out.note(f"{rel} model_max_length {raw} not adopted: it exceeds the encoder's {limit} positions (profile: {current})")
        return
    out.found(path, raw, tree.label(rel), "model_max_length")


