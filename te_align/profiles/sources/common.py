"""What every profile source shares: the build report, the one table of recipes, and the collector.

A source (a diffusers folder, a hub repo, a single-file checkpoint; see the sibling modules) is first
matched to a bundled profile, its *base*. A :class:`Collector` then gathers the values the model's
own files state, and :meth:`Collector.apply` writes them over the base, each with provenance naming
the file it came from, into a :class:`BuildReport` that lists every difference.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from te_align.errors import ProfileError
from te_align.profiles.dump import provenance_to_dict
from te_align.profiles.model import AlignmentProfile
from te_align.profiles.registry import bundled, bundled_names
from te_align.profiles.serialize import profile_from_dict, profile_to_dict, set_dict_path

logger = logging.getLogger("te_align")

SourceKind = Literal["folder", "hub", "single-file"]


# ================================================================================ the report
class Difference(NamedTuple):
    """One value the model's files state differently from the bundled profile (and that was adopted)."""

    path: str
    bundled: Any
    found: Any
    file: str


@dataclass(frozen=True)
class BuildReport:
    """What :func:`te_align.profiles.resolve.build` made of a source, and how it differs from the bundled profile it started from."""

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
                lines.append(f"    {d.path}: {show(d.bundled)} -> {show(d.found)}  ({d.file})")
        else:
            lines.append(f"  no differences from '{self.base}' ({self.confirmed} values confirmed)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return lines


def show(v: Any) -> str:
    if v is None:
        return "none"
    return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)


_LOGGED: set[tuple[str, str, str]] = set()


def log_report(report: BuildReport) -> None:
    for d in report.differences:
        key = (report.source, d.path, repr(d.found))
        if key in _LOGGED:
            continue
        _LOGGED.add(key)
        logger.warning(
            "%s: %s is %s, bundled profile '%s' has %s (from %s)",
            report.source, d.path, show(d.found), report.base, show(d.bundled), d.file,
        )
    for n in report.notes:
        key = (report.source, "note", n)
        if key not in _LOGGED:
            _LOGGED.add(key)
            logger.info("%s: %s", report.source, n)


# ======================================================== detected model -> bundled profile table
EncoderRole = Literal["clip_l", "clip_h", "clip_g", "t5xxl"]


@dataclass(frozen=True)
class Recipe:
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
RECIPES: tuple[Recipe, ...] = (
    Recipe("sd15", "StableDiffusion", (("clip_l", "text_encoder"),)),
    Recipe("sd21", "StableDiffusion", (("clip_h", "text_encoder"),)),
    Recipe("sdxl", "StableDiffusionXL", (("clip_l", "text_encoder"), ("clip_g", "text_encoder_2"))),
    Recipe("sd3-medium", "StableDiffusion3", _SD3_TE),
    Recipe("sd35-medium", "StableDiffusion3", _SD3_TE),
    Recipe("sd35-large", "StableDiffusion3", _SD3_TE),
    Recipe("flux-dev", "Flux", _FLUX_TE),
    Recipe("flux-schnell", "Flux", _FLUX_TE),
    Recipe("chroma", "Chroma", (("t5xxl", "text_encoder"),)),
    Recipe("pixart-sigma", "PixArtSigma"),
    Recipe("auraflow", "AuraFlow"),
    Recipe("lumina2", "Lumina2"),
    Recipe("hidream", "HiDreamImage", lengths="hidream",
            pipeline_sets=(("tokenizer_4", "pad_token"), ("tokenizer_4", "pad_token_id"))),
    Recipe("sana", "Sana"),
    Recipe("qwen-image", "QwenImage"),
    Recipe("wan21", "Wan"),
    Recipe("hunyuanimage-2.1", "HunyuanImage"),
)
BY_PROFILE = {r.profile: r for r in RECIPES}


def bundled_base(name: str, reason: str) -> AlignmentProfile:
    """The bundled profile a detected model starts from."""
    if name not in bundled_names():
        raise ProfileError(
            f"detected {name} ({reason}), but there is no bundled profile '{name}'; "
            f"bundled profiles: {', '.join(bundled_names()) or 'none'}"
        )
    return bundled(name)


# ========================================================================= collecting the findings
@dataclass
class Collector:
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
        base = self.base
        data = profile_to_dict(base)
        data["provenance"] = prov = provenance_to_dict(base)
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
                "note": f"the bundled profile '{base.name}' has {show(old)}",
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


def profile_name(text: str) -> str:
    slug = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")
    return slug or "built"

