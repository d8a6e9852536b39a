"""Profiles built from a model's own files: a diffusers folder, a hub repo id or a ``.safetensors`` checkpoint.

Every source is first matched to a bundled profile (the *base*: ``model_index.json`` ``_class_name`` plus
the transformer / text-encoder configs that tell variants apart, or tensor names and shapes in a
checkpoint header). The values the model's own files state then replace the bundled ones, each with
provenance naming the file it came from, and every difference is reported in a :class:`BuildReport`.

Only JSON files and safetensors *headers* are read: this module imports no torch, transformers or
diffusers, and from the hub it downloads nothing but small config files.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from te_align.errors import ProfileError
from te_align.profiles.model import AlignmentProfile, SlotSpec

logger = logging.getLogger("te_align")

SourceKind = Literal["folder", "hub", "single-file"]

#: Safetensors headers larger than this are refused (real checkpoints have headers of a few MB at most).
MAX_HEADER_BYTES = 100 * 1024 * 1024

#: The only files fetched from the hub: model_index.json and the small JSON configs beside the weights.
HUB_PATTERNS = (
    "model_index.json",
    "*/config.json",
    "scheduler/scheduler_config.json",
    "tokenizer*/tokenizer_config.json",
    "tokenizer*/special_tokens_map.json",
    "tokenizer*/added_tokens.json",
)

_CHECKPOINT_SUFFIXES = (".safetensors", ".sft")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?")


# ================================================================================ the report
class Difference(NamedTuple):
    """One value the model's files state differently from the bundled profile (and that was adopted)."""

    path: str
    bundled: Any
    found: Any
    file: str


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build` made of a source, and how it differs from the bundled profile it started from."""

    profile: AlignmentProfile
    #: Name of the bundled profile the build started from.
    base: str
    kind: SourceKind
    #: The source as given (folder path, ``owner/name[@revision]``, checkpoint path).
    source: str
    #: Why the source was matched to ``base``.
    reason: str
    differences: list[Difference] = field(default_factory=list)
    #: Findings that were not adopted, files that were missing, and other remarks.
    notes: list[str] = field(default_factory=list)
    #: How many values read from the source agreed with the bundled profile.
    confirmed: int = 0

    def summary_lines(self) -> list[str]:
        lines = [
            f"built profile '{self.profile.name}' from {self.kind} {self.source}",
            f"  matched bundled profile '{self.base}': {self.reason}",
        ]
        if self.differences:
            n = len(self.differences)
            lines.append(
                f"  {n} value{'s differ' if n != 1 else ' differs'} from '{self.base}' and "
                f"{'were' if n != 1 else 'was'} taken from the source ({self.confirmed} confirmed):"
            )
            for d in self.differences:
                lines.append(f"    {d.path}: {_show(d.bundled)} -> {_show(d.found)}  ({d.file})")
        else:
            lines.append(f"  no differences from '{self.base}' ({self.confirmed} values confirmed)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return lines


def _show(v: Any) -> str:
    if v is None:
        return "none"
    return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)


# ============================================================================ public entry points
def build(source: str | Path) -> BuildReport:
    """Build a profile from a diffusers folder, a ``.safetensors`` checkpoint or a hub repo id.

    Hub ids may carry a revision: ``owner/name@revision``.
    """
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        return _build_tree(_Tree.local(path, text), kind="folder", source=text, hint=path.resolve().name)
    if path.is_file():
        if path.suffix.lower() in _CHECKPOINT_SUFFIXES:
            return _build_checkpoint(path, text)
        if path.name == "model_index.json":
            parent = path.parent
            return _build_tree(_Tree.local(parent, str(parent)), kind="folder", source=str(parent), hint=parent.resolve().name)
        raise ProfileError(
            "expected a diffusers model folder, a .safetensors checkpoint or a hub repo id "
            "(pickle checkpoints such as .ckpt, .bin and .pt are never opened)",
            file=text,
        )
    if not isinstance(source, Path) and _HUB_ID.fullmatch(text):
        repo_id, _, revision = text.partition("@")
        return _build_hub(repo_id, revision or None)
    if path.suffix.lower() in _CHECKPOINT_SUFFIXES:
        raise ProfileError("no such checkpoint file", file=text)
    raise ProfileError("no such model folder or checkpoint, and not a hub repo id (owner/name)", file=text)


def from_folder(path: str | Path) -> AlignmentProfile:
    """The profile of a local diffusers-format folder (differences are logged once)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ProfileError("not a folder (expected a diffusers-format model folder with model_index.json)", file=str(path))
    report = _build_tree(_Tree.local(p, str(path)), kind="folder", source=str(path), hint=p.resolve().name)
    _log(report)
    return report.profile


def from_hub(repo_id: str, revision: str | None = None) -> AlignmentProfile:
    """The profile of a hub repo, from its config files only (differences are logged once)."""
    report = _build_hub(repo_id, revision)
    _log(report)
    return report.profile


def from_single_file(path: str | Path) -> AlignmentProfile:
    """The profile of a single-file ``.safetensors`` checkpoint, from its header (differences are logged once)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ProfileError("no such checkpoint file", file=str(path))
    report = _build_checkpoint(p, str(path))
    _log(report)
    return report.profile


_LOGGED: set[tuple[str, str, str]] = set()


def _log(report: BuildReport) -> None:
    for d in report.differences:
        key = (report.source, d.path, repr(d.found))
        if key in _LOGGED:
            continue
        _LOGGED.add(key)
        logger.warning(
            "%s: %s is %s, bundled profile '%s' has %s (from %s)",
            report.source, d.path, _show(d.found), report.base, _show(d.bundled), d.file,
        )
    for n in report.notes:
        key = (report.source, "note", n)
        if key not in _LOGGED:
            _LOGGED.add(key)
            logger.info("%s: %s", report.source, n)


# ================================================================ family -> bundled profile table
EncoderRole = Literal["clip_l", "clip_h", "clip_g", "t5xxl"]


@dataclass(frozen=True)
class _Recipe:
    #: Bundled profile name.
    profile: str
    #: diffusers pipeline class without ``Pipeline`` and without variant words (Img2Img, Inpaint, ...).
    pipeline: str
    #: Text encoders a single-file checkpoint may embed: role -> diffusers encoder subfolder.
    encoders: tuple[tuple[EncoderRole, str], ...] = ()
    #: ``clip``: CLIP slots take tokenizer model_max_length, other slots get max_sequence_length from the
    #: pipeline. ``hidream``: CLIP slots get min(max_sequence_length, 218), the others
    #: min(max_sequence_length, model_max_length).
    lengths: Literal["clip", "hidream"] = "clip"
    #: (tokenizer subfolder, field) pairs the pipeline sets itself, whatever the files say.
    pipeline_sets: tuple[tuple[str, str], ...] = ()


_SD3_TE: tuple[tuple[EncoderRole, str], ...] = (("clip_l", "text_encoder"), ("clip_g", "text_encoder_2"), ("t5xxl", "text_encoder_3"))
_FLUX_TE: tuple[tuple[EncoderRole, str], ...] = (("clip_l", "text_encoder"), ("t5xxl", "text_encoder_2"))

#: The one table mapping detected models to bundled profiles.
RECIPES: tuple[_Recipe, ...] = (
    _Recipe("sd15", "StableDiffusion", (("clip_l", "text_encoder"),)),
    _Recipe("sd21", "StableDiffusion", (("clip_h", "text_encoder"),)),
    _Recipe("sdxl", "StableDiffusionXL", (("clip_l", "text_encoder"), ("clip_g", "text_encoder_2"))),
    _Recipe("sd3-medium", "StableDiffusion3", _SD3_TE),
    _Recipe("sd35-medium", "StableDiffusion3", _SD3_TE),
    _Recipe("sd35-large", "StableDiffusion3", _SD3_TE),
    _Recipe("flux-dev", "Flux", _FLUX_TE),
    _Recipe("flux-schnell", "Flux", _FLUX_TE),
    _Recipe("chroma", "Chroma", (("t5xxl", "text_encoder"),)),
    _Recipe("pixart-sigma", "PixArtSigma"),
    _Recipe("auraflow", "AuraFlow"),
    _Recipe("lumina2", "Lumina2"),
    _Recipe("hidream", "HiDreamImage", lengths="hidream",
            pipeline_sets=(("tokenizer_4", "pad_token"), ("tokenizer_4", "pad_token_id"))),
    _Recipe("sana", "Sana"),
    _Recipe("qwen-image", "QwenImage"),
    _Recipe("wan21", "Wan"),
    _Recipe("hunyuanimage-2.1", "HunyuanImage"),
)
_BY_PROFILE = {r.profile: r for r in RECIPES}

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


def _bundled_base(name: str, reason: str) -> AlignmentProfile:
    from te_align.profiles.registry import bundled, bundled_names

    if name not in bundled_names():
        raise ProfileError(
            f"detected {name} ({reason}), but there is no bundled profile '{name}'; "
            f"bundled profiles: {', '.join(bundled_names()) or 'none'}"
        )
    return bundled(name)


# ===================================================================================== file access
@dataclass(frozen=True)
class _Tree:
    """A diffusers-format folder, with how its files are named in messages and provenance."""

    root: Path
    prefix: str

    @classmethod
    def local(cls, root: Path, shown: str) -> _Tree:
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
        raw = path.read_bytes()
    except OSError as e:
        raise ProfileError(f"cannot read: {e.strerror}", file=label) from None
    try:
        data = json.loads(raw.decode("utf-8"))
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


# ========================================================================= collecting the findings
@dataclass
class _Collector:
    """Values read from a source, compared against the bundled profile, then applied."""

    base: AlignmentProfile
    status: str
    findings: dict[str, tuple[Any, str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def found(self, path: str, value: Any, file: str, detail: str) -> None:
        """Adopt ``value`` at ``path`` (first finding wins)."""
        self.findings.setdefault(path, (value, file, detail))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def apply(self, *, name: str, kind: SourceKind, source: str, reason: str, repo: str) -> BuildReport:
        from te_align.profiles.serialize import profile_from_dict, profile_to_dict, set_dict_path

        base = self.base
        data = profile_to_dict(base)
        prov = data["provenance"]
        differences: list[Difference] = []
        confirmed = 0
        for path, (value, file, detail) in self.findings.items():
            old = base.get(path)
            if value == old and type(value) is type(old):
                confirmed += 1
                continue
            set_dict_path(data, path, value)
            before = base.provenance_of(path)
            entry: dict[str, Any] = {
                "source": f"{file} {detail}".strip(),
                "status": self.status,
                "note": f"the bundled profile '{base.name}' has {_show(old)}",
            }
            if before is not None:
                entry["alternatives"] = [
                    {"value": old if old is not None else "none", "source": before.source, "status": before.status}
                ]
            prov[path] = entry
            differences.append(Difference(path, old, value, file))
        data["name"] = name
        data["display_name"] = f"{base.display_name} (built from {source})"
        data["repo"] = repo
        data["aliases"] = []
        data["description"] = (
            f"Built by te-align from {kind} {source}, starting from the bundled profile '{base.name}' "
            f"({reason}); {len(differences)} value(s) taken from the source differ. {base.description}"
        ).strip()
        try:
            profile = profile_from_dict(data)
        except ProfileError as e:
            where = f" (key '{e.key}')" if e.key else ""
            raise ProfileError(
                f"the values read from {source} do not make a valid profile{where}: {e.message}"
            ) from None
        return BuildReport(
            profile=profile,
            base=base.name,
            kind=kind,
            source=source,
            reason=reason,
            differences=differences,
            notes=list(self.notes),
            confirmed=confirmed,
        )


def _profile_name(text: str) -> str:
    slug = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")
    return slug or "built"


# ============================================================================== diffusers folders
def _build_tree(tree: _Tree, *, kind: SourceKind, source: str, hint: str, repo: str = "") -> BuildReport:
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
    base = _bundled_base(name, reason)
    recipe = _BY_PROFILE[name]
    out = _Collector(base, status="official")
    for slot in base.slots:
        _read_encoder(tree, model_index, slot, out)
        _read_tokenizer(tree, model_index, slot, recipe, out)
    return out.apply(name=_profile_name(hint), kind=kind, source=source, reason=reason, repo=repo)


def _detect_folder(tree: _Tree, model_index: dict[str, Any], class_name: str, hint: str) -> tuple[str, str]:
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


def _pick_sd(tree: _Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
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


def _pick_sdxl(tree: _Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
    listed, _ = _component_class(model_index, "text_encoder")
    listed2, _ = _component_class(model_index, "text_encoder_2")
    if listed2 and not listed:
        raise ProfileError(
            "an SDXL refiner (text_encoder_2 only, no text_encoder) conditions on OpenCLIP bigG alone; "
            "there is no bundled profile for it",
            file=tree.label("model_index.json"),
        )
    return "sdxl", "SDXL base (text_encoder + text_encoder_2)"


def _pick_sd3(tree: _Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
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


def _pick_flux(tree: _Tree, model_index: dict[str, Any], hint: str) -> tuple[str, str]:
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


_FOLDER_PICKERS: dict[str, Callable[[_Tree, dict[str, Any], str], tuple[str, str]]] = {
    "StableDiffusion": _pick_sd,
    "StableDiffusionXL": _pick_sdxl,
    "StableDiffusion3": _pick_sd3,
    "Flux": _pick_flux,
}


def _read_encoder(tree: _Tree, model_index: dict[str, Any], slot: SlotSpec, out: _Collector) -> None:
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
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ProfileError(f"expected a token string or an object with 'content', got {value!r}", file=label, key=key)


class _TokenIds:
    """Token -> id from the small files of a tokenizer folder (the big ones only when needed)."""

    def __init__(self, tree: _Tree, sub: str, tokenizer_config: dict[str, Any]) -> None:
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
    tree: _Tree, model_index: dict[str, Any], slot: SlotSpec, recipe: _Recipe, out: _Collector
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
            out.note(f"{sub}: {key} is {_show(v_tc)} in tokenizer_config.json but {_show(v_sm)} in special_tokens_map.json; using {_show(value)}")
        current = getattr(spec, key)
        if key in fixed or f"{key}_id" in fixed:
            if value != current:
                out.note(f"{rel} {key} {_show(value)} not adopted: the pipeline sets it itself (profile: {_show(current)})")
            continue
        if value is None or current is None:
            if value != current:
                out.note(f"{rel} {key} is {_show(value)}; the profile keeps {_show(current)}")
            continue
        out.found(f"{where}.{key}", value, tree.label(rel), key)
        hit = ids.lookup(value)
        if hit is not None:
            out.found(f"{where}.{key}_id", hit[0], tree.label(hit[1]), f"id of {_show(value)}")
        elif value != current and getattr(spec, f"{key}_id") is not None:
            out.found(f"{where}.{key}_id", None, tree.label(rel), f"(no id for {_show(value)} in the files read)")
    _read_max_length(tree, tc, tc_rel, slot, recipe, out)
    side = tc.get("padding_side")
    if isinstance(side, str) and side != spec.padding_side:
        out.note(f"{tc_rel} padding_side {side!r} not adopted (profile: {spec.padding_side!r}; some pipelines force it)")


def _read_max_length(
    tree: _Tree, tc: dict[str, Any], rel: str, slot: SlotSpec, recipe: _Recipe, out: _Collector
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


# ==================================================================================== hub repos
def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def _hub_cache_dir() -> str | None:
    """The hub cache, read from the environment now (huggingface_hub reads it once, at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.path.expandvars(os.environ[var]))
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.path.expandvars(os.environ["HF_HOME"])), "hub")
    return None


def _hub_offline() -> bool:
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        flag = _env_flag(var)
        if flag is not None:
            return flag
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _download_hub(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # pragma: no cover - a dependency of te-align
        raise ProfileError("reading hub repos needs the huggingface_hub package (pip install huggingface_hub)") from None
    offline = _hub_offline()
    cache_dir = _hub_cache_dir()
    shown_cache = cache_dir or constants.HF_HUB_CACHE
    where = f"hub repo '{repo_id}'" + (f" (revision {revision})" if revision else "")
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            allow_patterns=list(HUB_PATTERNS),
            local_files_only=offline,
        )
    except GatedRepoError:
        raise ProfileError(
            f"{where} is gated: accept its licence on huggingface.co and log in (hf auth login or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ProfileError(f"{where} not found on the Hugging Face hub (or private and no token was given)") from None
    except RevisionNotFoundError:
        raise ProfileError(f"{where}: no such revision on the Hugging Face hub") from None
    except HFValidationError as e:
        raise ProfileError(f"'{repo_id}' is not a valid hub repo id: {_first_line(e)}") from None
    except LocalEntryNotFoundError:
        if offline:
            raise ProfileError(
                f"{where} is not in the Hugging Face cache ({shown_cache}) and HF_HUB_OFFLINE is set; "
                "run once with network access or pass a local model folder"
            ) from None
        raise ProfileError(
            f"{where}: the Hugging Face hub could not be reached and the repo is not in the cache ({shown_cache})"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise ProfileError(f"{where}: cannot download its config files: {_first_line(e)}") from None
    except Exception as e:  # network errors from the HTTP client huggingface_hub uses
        if type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests", "urllib3"):
            raise ProfileError(f"{where}: cannot download its config files: {_first_line(e)}") from None
        raise
    return Path(folder)


def _build_hub(repo_id: str, revision: str | None) -> BuildReport:
    folder = _download_hub(repo_id, revision)
    commit = folder.name
    shown = f"{repo_id}@{revision or commit[:12]}"
    tree = _Tree(folder, f"{shown}/")
    if not tree.exists("model_index.json"):
        raise ProfileError(
            f"hub repo '{repo_id}' has no model_index.json: not a diffusers-format repo "
            "(for a single-file checkpoint, download the .safetensors file and pass its path)"
        )
    source = repo_id + (f"@{revision}" if revision else "")
    return _build_tree(tree, kind="hub", source=source, hint=repo_id.split("/")[-1], repo=repo_id)


# ========================================================================== single-file checkpoints
@dataclass(frozen=True)
class _Header:
    shapes: dict[str, tuple[int, ...]]
    metadata: dict[str, str]


def read_safetensors_header(path: str | Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Tensor shapes and ``__metadata__`` of a ``.safetensors`` file, reading the header only."""
    h = _read_header(Path(path), str(path))
    return h.shapes, h.metadata


def _read_header(path: Path, label: str) -> _Header:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ProfileError(f"not a safetensors file: {size} bytes is too short for a header", file=label)
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES:
                raise ProfileError(
                    f"safetensors header of {n} bytes is over the {MAX_HEADER_BYTES // (1024 * 1024)} MB limit "
                    "(not a safetensors file, or a damaged one)",
                    file=label,
                )
            if n < 2 or 8 + n > size:
                raise ProfileError(
                    f"malformed safetensors file: header length {n} does not fit a {size}-byte file", file=label
                )
            raw = f.read(n)
    except OSError as e:
        raise ProfileError(f"cannot read: {e.strerror}", file=label) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"malformed safetensors header: not valid JSON ({e})", file=label) from None
    if not isinstance(data, dict):
        raise ProfileError("malformed safetensors header: expected a JSON object", file=label)
    shapes: dict[str, tuple[int, ...]] = {}
    metadata: dict[str, str] = {}
    for key, info in data.items():
        if key == "__metadata__":
            if isinstance(info, dict):
                metadata = {str(k): str(v) for k, v in info.items()}
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("dtype"), str)
            or not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ProfileError(
                f"malformed safetensors header: tensor '{key}' lacks a dtype string and a list of sizes", file=label
            )
        shapes[key] = tuple(shape)
    if not shapes:
        raise ProfileError("the safetensors file holds no tensors", file=label)
    return _Header(shapes, metadata)


_DM_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def _denoiser_keys(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The denoiser's tensors with the LDM / ComfyUI prefix removed (bare files pass through)."""
    for prefix in _DM_PREFIXES:
        found = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
        if found:
            return found
    return shapes


def _indices(keys: Iterable[str], pattern: str) -> set[int]:
    rx = re.compile(pattern)
    return {int(m.group(1)) for k in keys if (m := rx.match(k))}


_UNET_WIDTHS = {768: "sd15", 1024: "sd21", 2048: "sdxl"}
_UNET_TO_K = (
    re.compile(r"input_blocks\.\d+\.1\.transformer_blocks\.\d+\.attn2\.to_k\.weight$"),
    re.compile(r"down_blocks\.\d+\.attentions\.\d+\.transformer_blocks\.\d+\.attn2\.to_k\.weight$"),
)


def _detect_checkpoint(h: _Header, label: str) -> tuple[str, str, list[str]]:
    """(bundled profile, reason, notes) for a checkpoint, from tensor names and shapes."""
    keys = h.shapes
    dm = _denoiser_keys(keys)
    notes: list[str] = []

    def has(*names: str) -> bool:
        return any(n in dm for n in names)

    # --- families te-align does not cover, checked first because they share key names with covered ones
    if has("single_stream_modulation.lin.weight", "early_stream_modulations.image.lin.weight"):
        raise ProfileError("this is a FLUX.2-type transformer; there is no bundled profile for it", file=label)
    if has("txt_in.text_norm.weight"):
        raise ProfileError("this is a Qwen-Image 2.x transformer; there is no bundled profile for it", file=label)

    # --- SD3 / SD3.5 MMDiT (original keys; diffusers keys below)
    joint = _indices(dm, r"joint_blocks\.(\d+)\.")
    if joint:
        dual = _indices(dm, r"joint_blocks\.(\d+)\.x_block\.attn2\.")
        return _sd3_variant(len(joint), bool(dual), "joint_blocks", label)

    # --- Chroma before FLUX: it has double_blocks too
    if any(k.startswith("distilled_guidance_layer.") for k in dm):
        return "chroma", "distilled_guidance_layer.* (Chroma's modulation approximator)", notes

    if _indices(dm, r"double_blocks\.(\d+)\.") and _indices(dm, r"single_blocks\.(\d+)\."):
        return _flux_variant(dm, has("guidance_in.in_layer.weight", "guidance_in.in_layer.bias"), "guidance_in.*", "img_in.weight", notes)

    blocks = _indices(dm, r"transformer_blocks\.(\d+)\.")
    if blocks and _indices(dm, r"single_transformer_blocks\.(\d+)\."):
        return _flux_variant(
            dm, has("time_text_embed.guidance_embedder.linear_1.weight"),
            "time_text_embed.guidance_embedder.*", "x_embedder.weight", notes,
        )
    if blocks and has("context_embedder.weight") and has("pos_embed.pos_embed"):
        dual = _indices(dm, r"transformer_blocks\.(\d+)\.attn2\.")
        return _sd3_variant(len(blocks), bool(dual), "transformer_blocks (diffusers SD3Transformer2DModel)", label)
    if has("txt_norm.weight") and any(k.startswith("transformer_blocks.0.img_mod.") for k in dm):
        notes.append("Qwen-Image-Edit checkpoints share this transformer; their prompt template differs from Qwen-Image's")
        return "qwen-image", "txt_norm + transformer_blocks.*.img_mod (Qwen-Image transformer)", notes

    # --- UNets: the cross-attention width tells SD 1.x / 2.x / XL apart
    for rx in _UNET_TO_K:
        for k, shape in dm.items():
            if rx.match(k) and len(shape) == 2:
                width = shape[1]
                if width == 1280:
                    raise ProfileError(
                        "an SDXL refiner UNet (cross-attention width 1280, OpenCLIP bigG only); there is no bundled profile for it",
                        file=label,
                    )
                if width not in _UNET_WIDTHS:
                    raise ProfileError(
                        f"a UNet with cross-attention width {width} matches no bundled profile "
                        "(768 = SD 1.x, 1024 = SD 2.x, 2048 = SDXL)",
                        file=label,
                    )
                name = _UNET_WIDTHS[width]
                inp = dm.get("input_blocks.0.0.weight") or dm.get("conv_in.weight")
                if inp is not None and len(inp) == 4 and inp[1] != 4:
                    notes.append(f"the UNet takes {inp[1]} input channels (inpainting / instruct variant); same text conditioning")
                return name, f"UNet cross-attention width {width} ({k} {list(shape)})", notes

    # --- text encoders alone still tell the SD families apart (e.g. a UNet saved under another prefix)
    if any(k.startswith("conditioner.embedders.1.model.") for k in keys):
        return "sdxl", "conditioner.embedders.1 (OpenCLIP bigG of SDXL)", notes
    if any(k.startswith("conditioner.embedders.0.model.") for k in keys):
        raise ProfileError("an SDXL refiner (OpenCLIP bigG only); there is no bundled profile for it", file=label)
    if any(k.startswith("cond_stage_model.model.") for k in keys):
        return "sd21", "cond_stage_model.model.* (OpenCLIP ViT-H of SD 2.x)", notes
    if any(k.startswith("cond_stage_model.transformer.") for k in keys):
        return "sd15", "cond_stage_model.transformer.* (CLIP ViT-L of SD 1.x)", notes

    # --- other transformers, original key names as diffusers' single-file loader knows them
    if all(k in dm for k in ("double_layers.0.attn.w2q.weight", "double_layers.0.attn.w1q.weight", "cond_seq_linear.weight", "t_embedder.mlp.0.weight")):
        return "auraflow", "double_layers.* + cond_seq_linear (AuraFlow MMDiT)", notes
    if has("double_stream_blocks.0.block.adaLN_modulation.1.bias"):
        return "hidream", "double_stream_blocks.* (HiDream-I1)", notes
    if has("cap_embedder.0.weight") and not has("layers.0.adaLN_modulation.0.weight"):
        return "lumina2", "cap_embedder.* (Lumina-Image 2.0 NextDiT)", notes
    if has("head.modulation"):
        pe = dm.get("patch_embedding.weight")
        if pe and pe[0] != 1536:
            notes.append(f"a {pe[0]}-wide Wan transformer (the bundled profile is Wan2.1 T2V 1.3B; the text conditioning is the same UMT5 recipe)")
        return "wan21", "head.modulation (Wan transformer)", notes

    raise ProfileError(_unrecognised(keys), file=label)


def _unrecognised(keys: dict[str, tuple[int, ...]]) -> str:
    names = list(keys)
    if any(".lora_" in k or "lora_down" in k or k.startswith(("lora_unet_", "lora_te")) for k in names):
        what = "it looks like a LoRA, which has no text-encoder recipe of its own"
    elif any(k.startswith(("text_model.", "encoder.block.", "transformer.resblocks.", "shared.")) for k in names):
        what = "it looks like a standalone text encoder; pass the model checkpoint or folder"
    elif any(k.startswith(("encoder.down.", "decoder.up.", "encoder.down_blocks.")) for k in names):
        what = "it looks like a VAE; pass the model checkpoint or folder"
    else:
        what = f"first tensors: {', '.join(names[:3])}"
    return (
        f"cannot tell which model this checkpoint holds from its {len(names)} tensor names ({what}); recognised: "
        "SD 1.x/2.x/XL UNets (model.diffusion_model.input_blocks.*), SD3/3.5 (joint_blocks.*), "
        "FLUX.1 (double_blocks.* / single_blocks.*), Chroma (distilled_guidance_layer.*), "
        "diffusers transformers (transformer_blocks.*), AuraFlow, HiDream, Lumina 2, Qwen-Image, Wan"
    )


def _sd3_variant(depth: int, dual: bool, what: str, label: str) -> tuple[str, str, list[str]]:
    reason = f"{depth} {what}" + (" with dual attention (x_block.attn2 / attn2)" if dual else "")
    if depth == 38 and not dual:
        return "sd35-large", reason, []
    if depth == 24 and dual:
        return "sd35-medium", reason, []
    if depth == 24:
        return "sd3-medium", reason, []
    raise ProfileError(
        f"an SD3 MMDiT with {reason} matches no bundled profile "
        "(24 = sd3-medium, 24 + dual attention = sd35-medium, 38 = sd35-large)",
        file=label,
    )


def _flux_variant(
    dm: dict[str, tuple[int, ...]], guidance: bool, guidance_keys: str, img_in: str, notes: list[str]
) -> tuple[str, str, list[str]]:
    if not guidance:
        return "flux-schnell", f"double/single blocks without {guidance_keys} (FLUX.1-schnell)", notes
    shape = dm.get(img_in)
    if shape is not None and len(shape) == 2 and shape[1] != 64:
        notes.append(f"{img_in} takes {shape[1]} channels (FLUX.1 Fill / Depth / Canny); same text conditioning as FLUX.1-dev")
    return "flux-dev", f"double/single blocks with {guidance_keys} (guidance-distilled FLUX.1-dev)", notes


# ---- text encoders embedded in a checkpoint: (role, key prefix, layout)
_EMBEDDED_TE: tuple[tuple[EncoderRole, str, Literal["hf-clip", "open-clip", "t5"]], ...] = (
    ("clip_l", "cond_stage_model.transformer.text_model.", "hf-clip"),
    ("clip_h", "cond_stage_model.model.", "open-clip"),
    ("clip_l", "conditioner.embedders.0.transformer.text_model.", "hf-clip"),
    ("clip_g", "conditioner.embedders.1.model.", "open-clip"),
    ("clip_l", "text_encoders.clip_l.transformer.text_model.", "hf-clip"),
    ("clip_g", "text_encoders.clip_g.transformer.text_model.", "hf-clip"),
    ("t5xxl", "text_encoders.t5xxl.transformer.", "t5"),
)


def _measure_te(
    shapes: dict[str, tuple[int, ...]], role: EncoderRole, prefix: str, layout: str, notes: list[str]
) -> dict[str, tuple[int, str]]:
    """Encoder values measurable from tensor shapes: field -> (value, evidence)."""
    sub = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
    found: dict[str, tuple[int, str]] = {}

    def shape_of(key: str, rank: int) -> tuple[int, ...] | None:
        s = sub.get(key)
        return s if s is not None and len(s) == rank else None

    if layout == "hf-clip":
        emb = shape_of("embeddings.token_embedding.weight", 2)
        pos = shape_of("embeddings.position_embedding.weight", 2)
        layers = _indices(sub, r"encoder\.layers\.(\d+)\.")
        layer_what = "encoder.layers.*"
        root = prefix[: -len("text_model.")]
        proj = shapes.get(root + "text_projection.weight")
        proj_dim = (proj[0], f"{root}text_projection.weight {list(proj)}") if proj and len(proj) == 2 else None
        emb_key, pos_key = "embeddings.token_embedding.weight", "embeddings.position_embedding.weight"
    elif layout == "open-clip":
        emb = shape_of("token_embedding.weight", 2)
        pos = shape_of("positional_embedding", 2)
        layers = _indices(sub, r"transformer\.resblocks\.(\d+)\.")
        layer_what = "transformer.resblocks.*"
        proj = sub.get("text_projection")
        proj_dim = (proj[1], f"{prefix}text_projection {list(proj)}") if proj and len(proj) == 2 and role != "clip_h" else None
        emb_key, pos_key = "token_embedding.weight", "positional_embedding"
    else:
        emb_key = "shared.weight" if "shared.weight" in sub else "encoder.embed_tokens.weight"
        emb = shape_of(emb_key, 2)
        pos = None
        pos_key = ""
        layers = _indices(sub, r"encoder\.block\.(\d+)\.")
        layer_what = "encoder.block.*"
        proj_dim = None
    if emb is not None:
        found["hidden_size"] = (emb[1], f"tensor {prefix}{emb_key} {list(emb)}")
        found["vocab_size"] = (emb[0], f"tensor {prefix}{emb_key} {list(emb)}")
    if pos is not None:
        found["max_position_embeddings"] = (pos[0], f"tensor {prefix}{pos_key} {list(pos)}")
    if layers:
        count = max(layers) + 1
        if role == "clip_h":
            notes.append(
                f"{prefix}: the checkpoint holds {count} OpenCLIP blocks; diffusers drops the last "
                f"(SD 2.x conditions on the penultimate one), leaving {count - 1} encoder layers"
            )
            found["num_layers"] = (count - 1, f"{count} {prefix}{layer_what} blocks, the last one unused")
        else:
            found["num_layers"] = (count, f"{count} {prefix}{layer_what} blocks")
    if proj_dim is not None:
        found["projection_dim"] = (proj_dim[0], f"tensor {proj_dim[1]}")
    return found


def _build_checkpoint(path: Path, shown: str) -> BuildReport:
    h = _read_header(path, shown)
    name, reason, notes = _detect_checkpoint(h, shown)
    base = _bundled_base(name, reason)
    recipe = _BY_PROFILE[name]
    out = _Collector(base, status="inferred")
    for n in notes:
        out.note(n)
    arch = h.metadata.get("modelspec.architecture")
    if arch:
        out.note(f"__metadata__ modelspec.architecture is {arch!r}")
    subfolders = dict(recipe.encoders)
    seen = False
    for role, prefix, layout in _EMBEDDED_TE:
        if not any(k.startswith(prefix) for k in h.shapes):
            continue
        seen = True
        sub = subfolders.get(role)
        slot = next((s for s in base.slots if s.encoder_subfolder == sub), None) if sub else None
        if slot is None:
            out.note(f"the checkpoint also holds a text encoder under {prefix} that {base.name} does not use")
            continue
        measured_notes: list[str] = []
        measured = _measure_te(h.shapes, role, prefix, layout, measured_notes)
        for n in measured_notes:
            out.note(n)
        for fname, (value, evidence) in measured.items():
            if getattr(slot.encoder, fname) is None and fname != "hidden_size" and fname != "num_layers":
                continue
            out.found(f"slots.{slot.name}.encoder.{fname}", value, shown, evidence)
    if not seen:
        out.note("the checkpoint holds no text encoders; encoder values are the bundled ones")
    return out.apply(name=_profile_name(path.stem), kind="single-file", source=shown, reason=reason, repo="")
