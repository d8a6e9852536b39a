"""One mechanism for every trainer: a table of :class:`Rule` rows per trainer, evaluated against a
config and a profile.

A row says: for models of these families, the profile value at ``path`` is produced in this trainer
by config ``key`` (``None``: hard-coded), which defaults to ``default``; ``convert`` names how a
trainer value becomes a profile value and back (for the fix). ``honoured`` says when the trainer
actually reads the key: ``always``, ``never`` (accepted but unused) or ``cached`` (only when
text-encoder outputs are cached). The tables are plain data so that a probe can reuse them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, SupportsIndex, SupportsInt, TypeAlias

from te_align.audit.findings import NOT_SETTABLE, Edit, Finding, Severity
from te_align.profiles.registry import _load_bundled

if TYPE_CHECKING:  # pragma: no cover
    from te_align.audit.captions import CaptionStats
    from te_align.profiles import AlignmentProfile
    from te_align.profiles.model import Alternative

Honoured = Literal["always", "never", "cached"]


@dataclass(frozen=True)
class ByProfile:
    """A default that depends on the profile: ``ByProfile({"flux-schnell": 256, "*": 512})``."""

    values: Mapping[str, object]

    def pick(self, profile_name: str) -> object:
        return self.values.get(profile_name, self.values.get("*"))


@dataclass(frozen=True)
class Rule:
    """One trainer fact: a config key (or hard-coded behaviour) and the profile value it produces."""

    path: str | None
    families: tuple[str, ...]
    key: str | None
    default: object
    meaning: str
    source: str
    convert: str = "same"
    honoured: Honoured = "always"
    #: Fix template in the trainer's terms; ``{key}``/``{value}`` are filled in. ``""`` = not settable.
    fix: str | None = None
    #: Severity override for deviations (``info`` for training-recipe values such as dropout).
    severity: Severity | None = None
    #: The deviation matters only for some captions: ``bang`` (captions with a literal "!") or ``over512`` (captions
    #: that can pass 512 tokens). Warning with the count when captions are visible and some are affected, else info.
    captions: str | None = None
    #: Other config keys the fix sets with ``key`` (``(("i_know_what_i_am_doing", True),)``): ``check --fix``
    #: writes them too. A ``fix`` template without ``{set}`` or ``{value}`` is words only: ``--fix`` leaves it
    #: to the user.
    also: tuple[tuple[str, object], ...] = ()
    #: Keys of ``also`` that switch off the trainer's own safety checks, each with what it does: ``check --fix``
    #: writes the fix only with ``--allow-unsafe-keys`` (:mod:`te_align.audit.policy`).
    unsafe: tuple[tuple[str, str], ...] = ()
    #: For a key the trainer ignores (``honoured`` never): the profile path its value asks for, through ``convert``
    #: (a ``clip_skip`` that an SDXL trainer ignores asks for an encoder layer). Where that is the profile's own value and the
    #: model's authors publish it (status ``official``: Pony's "clip skip 2"), the key is their recipe, which the
    #: trainer follows anyway: a note, never "remove it".
    asks: str | None = None

    def applies(self, profile_name: str, family: str) -> bool:
        return "*" in self.families or family in self.families or profile_name in self.families

    def default_for(self, profile_name: str) -> object:
        return self.default.pick(profile_name) if isinstance(self.default, ByProfile) else self.default


@dataclass
class Context:
    """What a converter may look at: the whole config (trainer key -> value) and the profile name.
    ``ran`` collects the rules that compared a profile value (see :func:`evaluate`)."""

    values: Mapping[str, object]
    profile_name: str
    cached: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    file: str = ""
    ran: list[str] = field(default_factory=list)
    #: Every word by which a profile's provenance names a trainer (:attr:`te_align.trainers.api.CheckParts.
    #: source_words`, handed down): a source naming one is a trainer's choice, not a model's.
    trainer_words: tuple[str, ...] = ()


#: A converter: a trainer value -> a profile value (``to``), or back for a fix (``back``).
ConvertFn: TypeAlias = Callable[[object, Context], object]


class Remove:
    """Marker returned by a back-converter: the fix is to remove (unset) the key."""


REMOVE = Remove()


def _int_or_none(v: object) -> int | None:
    if v is None or v == "" or not isinstance(v, (str, bytes, bytearray, SupportsInt, SupportsIndex)):
        return None  # int() of anything else raises TypeError
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------ converters
@dataclass(frozen=True)
class Converter:
    """How a trainer value becomes a profile value (``to``) and back for a fix (``back``: a value, :data:`REMOVE`,
    or LookupError when no value works), and what kind of value the config key takes (``int``, ``bool``, ``str``,
    ``fraction``, ``choice:a,b``; None: any, or the rule's default decides)."""

    to: ConvertFn
    back: ConvertFn
    kind: str | None = None


def _same(v: object, ctx: Context) -> object:
    return v


def _nonempty(v: object, ctx: Context) -> object:
    return v if isinstance(v, str) and v else None


def _nonempty_back(p: object, ctx: Context) -> object:
    return REMOVE if p in (None, "") else p


def _bool(v: object, ctx: Context) -> object:
    return _truthy(v)


def _bool_back(p: object, ctx: Context) -> object:
    return True if p else REMOVE


def _truthy(v: object) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def unsettable(p: object, ctx: Context) -> object:
    """A back-converter for values no config key can set."""
    raise LookupError


#: name -> converter. The shared ones are here; a trainer's own register themselves from its reader
#: (:func:`register`) when the reader is imported, before any of its rules is evaluated.
CONVERTERS: dict[str, Converter] = {
    "same": Converter(_same, _same),
    "bool": Converter(_bool, _bool_back, "bool"),
    "nonempty": Converter(_nonempty, _nonempty_back, "str"),
}


def register(name: str, to: ConvertFn, back: ConvertFn = unsettable,
             kind: str | None = None) -> None:
    """Add a trainer's converter (the first registration of a name wins; the same one again is a no-op)."""
    CONVERTERS.setdefault(name, Converter(to, back, kind))


# Kept for the readers' converters: a trainer value that names no number.
int_or_none = _int_or_none
truthy = _truthy
bool_back = _bool_back


# ------------------------------------------------------------------------------------ value types
_TRUE_FALSE = ("1", "0", "true", "false", "yes", "no", "on", "off")


def expected_type(rule: Rule, profile_name: str) -> str | None:
    """What a rule's config value must be: ``int``, ``bool``, ``fraction`` (0..1), ``str``, ``choice:a,b`` or None."""
    conv = CONVERTERS[rule.convert]
    if conv.kind is not None:
        return conv.kind
    if rule.convert != "same":
        return None
    d = rule.default_for(profile_name)
    if isinstance(d, bool):
        return "bool"
    if isinstance(d, int):
        return "int"
    if isinstance(d, float):
        return "fraction"
    if isinstance(d, str):
        return "str"
    return None


def value_problem(kind: str | None, v: object) -> str | None:
    """Why ``v`` is not a valid value of ``kind`` (None: fine, or unset)."""
    import math

    if kind is None or v is None:
        return None
    if kind == "int":
        if isinstance(v, bool):
            return "expected a whole number, got a true/false value"
        if isinstance(v, float):
            if not math.isfinite(v) or v != int(v):
                return f"expected a whole number, got {v!r}"
            v = int(v)
        if isinstance(v, str):
            if v.strip() == "":
                return None
            if not re.fullmatch(r"\s*[+-]?\d+\s*", v):
                return f"expected a whole number, got {v!r}"
            v = int(v)
        if not isinstance(v, int):
            return f"expected a whole number, got {type(v).__name__}"
        return None if v >= 0 else f"expected a number >= 0, got {v}"
    if kind == "bool":
        if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return None
        if isinstance(v, str) and v.strip().lower() in _TRUE_FALSE:
            return None
        return f"expected true or false, got {v!r}"
    if kind == "fraction":
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                return f"expected a number between 0 and 1, got {v!r}"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
            return f"expected a number between 0 and 1, got {v!r}"
        return None
    if kind == "str":
        return None if isinstance(v, str) else f"expected a string, got {v!r}"
    if kind.startswith("choice:"):
        choices = kind.split(":", 1)[1].split(",")
        return None if v in choices else f"expected one of {', '.join(choices)}, got {v!r}"
    return None


# ------------------------------------------------------------------------------------ evaluation
@dataclass
class Trainer:
    """A trainer's table plus how to spell keys and values in its own config language."""

    name: str
    rules: tuple[Rule, ...]
    #: ``fix_set(key, value)`` -> "t5xxl_max_token_length = 256"; ``fix_remove(key)`` -> "remove …".
    fix_set: Callable[[str, object], str]
    fix_remove: Callable[[str], str]
    key_line: Callable[[str], int | None] = lambda key: None
    #: What "no key can fix this" says for this trainer (its reader knows whether te-align patches it).
    not_settable: str = NOT_SETTABLE


def no_fix_set(key: str, value: object) -> str:
    """``fix_set`` of the :class:`Trainer` of a config that is not checked (no profile: :func:`evaluate` never runs,
    so nothing asks it for a fix)."""
    return f"no fix for {key}: te-align does not check this config"


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return a == b


def _trainer_source(text: str, words: tuple[str, ...]) -> bool:
    """Whether a provenance source names a trainer (a "trainer choice", or one of ``words``)."""
    low = text.lower()
    return "trainer choice" in low or any(w in low for w in words)


def _severity(profile: AlignmentProfile, path: str, effective: object, words: tuple[str, ...]) -> Severity:
    """``warning`` when a model or pipeline source (not another trainer) documents the effective value
    as an alternative (FLUX.1 schnell at 512: the diffusers default); ``error`` otherwise."""
    pv = profile.provenance_of(f"slots.{path}")
    if pv is not None and any(
        _same_value(_plain(a.value), effective) and not _trainer_source(a.source, words) for a in pv.alternatives
    ):
        return "warning"
    return "error"


def official_alternative(profile: AlignmentProfile, path: str, effective: object) -> Alternative | None:
    """The alternative the model's authors published (status ``official``) that ``effective`` is, or None: Lumina 2's
    other system-prompt templates. A config that uses one is told so in a note, not an error."""
    pv = profile.provenance_of(f"slots.{path}")
    return next((a for a in (pv.alternatives if pv is not None else ()) if a.status == "official"
                 and _same_value(_plain(a.value), effective)), None)


def _plain(v: object) -> object:
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return v


def evaluate(
    trainer: Trainer, profile: AlignmentProfile, ctx: Context
) -> tuple[list[Finding], dict[str, object]]:
    """Apply the trainer's table: effective values per profile path, and the findings."""
    findings: list[Finding] = []
    effective: dict[str, object] = {}
    slots = set(profile.slot_names)
    reported: set[str] = set()
    for rule in trainer.rules:
        if not rule.applies(profile.name, profile.family):
            continue
        if rule.path is not None and rule.path.split(".", 1)[0] not in slots:
            continue
        conv = CONVERTERS[rule.convert]
        to_profile, to_trainer = conv.to, conv.back
        present = rule.key is not None and rule.key in ctx.values
        default = rule.default_for(profile.name)
        raw = ctx.values[rule.key] if present and rule.key is not None else default
        problem = value_problem(expected_type(rule, profile.name), raw) if present else None
        if problem is not None and rule.key is not None:
            if rule.key not in reported:
                reported.add(rule.key)
                line = trainer.key_line(rule.key)
                where = f"{ctx.file}:{line}" if ctx.file and line else (ctx.file or "")
                findings.append(Finding(
                    kind="wrong-value", severity="error", setting=rule.key, effective=raw,
                    message=f"{where + ': ' if where else ''}wrong type/value for {rule.key}: {problem}",
                    key=rule.key, trainer_source=rule.source, line=line,
                ))
            continue
        honoured = rule.honoured == "always" or (rule.honoured == "cached" and ctx.cached)
        if present and not honoured and rule.key is not None:
            recipe = _published_recipe(rule, profile, to_profile, raw, ctx)
            if recipe is not None and rule.asks is not None and rule.key not in reported:  # a recipe has rule.asks
                reported.add(rule.key)
                findings.append(Finding(
                    kind="note", severity="info", setting=rule.key, effective=raw, key=rule.key,
                    message=(f"{rule.key} = {_show(raw)} is the recipe published for {profile.name}, "
                             f"{profile.display_name} ({recipe}); {trainer.name} does not read the key "
                             f"({rule.meaning}) and already encodes {rule.asks} = {_show(profile.get('slots.' + rule.asks))}, "
                             "which is what the value asks for: nothing to change"),
                    trainer_source=rule.source, line=trainer.key_line(rule.key)))
            elif _differs(to_profile, raw, default, ctx) and rule.key not in reported:
                reported.add(rule.key)
                when = "" if rule.honoured == "never" else " while text-encoder outputs are not cached"
                findings.append(Finding(
                    kind="unused-value",
                    severity="error" if rule.severity == "error" else "warning",
                    setting=rule.key,
                    effective=raw,
                    message=f"{rule.key} = {_show(raw)} is accepted but never used{when}: {rule.meaning}",
                    fix=trainer.fix_remove(rule.key) if rule.honoured == "never" else _cached_fix(trainer, rule),
                    key=rule.key,
                    trainer_source=rule.source,
                    line=trainer.key_line(rule.key),
                    edit=Edit(rule.key, remove=True),
                ))
            raw = default
        if rule.path is None:
            continue
        eff = to_profile(raw, ctx)
        effective[rule.path] = eff
        ctx.ran.append(f"{rule.path} ({rule.key})" if rule.key else rule.path)
        expected = profile.get(f"slots.{rule.path}")
        if _same_value(eff, expected):
            continue
        pv = profile.provenance_of(f"slots.{rule.path}")
        severity = rule.severity or _severity(profile, rule.path, eff, ctx.trainer_words)
        meaning = rule.meaning
        official = official_alternative(profile, rule.path, eff) if not rule.severity else None
        if official is not None:
            severity = "info"
            what = official.note or "published by the model's authors"
            meaning = (f"{meaning}. This is an official alternative of {profile.name}: {what} ({official.source}); "
                       f"the profile holds {_show(expected)}")
        if rule.captions:
            from te_align.audit.captions import CaptionStats

            stats = ctx.extra.get("captions")  # check stores a CaptionStats or None
            severity, meaning = _by_captions(rule.captions, stats if isinstance(stats, CaptionStats) else None, meaning)
        findings.append(Finding(
            kind="deviation",
            severity=severity,
            setting=rule.path,
            effective=eff,
            profile=expected,
            source=f"{pv.status}: {pv.source}" if pv else "",
            fix=_fix(trainer, rule, to_trainer, expected, ctx) if official is None else (
                f"keep it (an official alternative of {profile.name}); for the profile's {_show(expected)}: "
                + _fix(trainer, rule, to_trainer, expected, ctx)),
            message=meaning,
            key=rule.key,
            trainer_source=rule.source,
            line=trainer.key_line(rule.key) if present and rule.key else None,
            edit=_edit(rule, to_trainer, expected, ctx),
        ))
    return findings, effective


def _published_recipe(rule: Rule, profile: AlignmentProfile, to_profile: ConvertFn, raw: object,
                      ctx: Context) -> str | None:
    """The published source when an ignored key's value asks for what the profile holds at ``rule.asks`` and the
    model's authors publish that value (provenance status ``official``); None otherwise."""
    if rule.asks is None or rule.honoured != "never" or rule.asks.split(".", 1)[0] not in profile.slot_names:
        return None
    pv = profile.provenance_of(f"slots.{rule.asks}")
    try:
        asked = to_profile(raw, ctx)
    except Exception:  # a value the converter cannot read asks for nothing
        return None
    if pv is None or pv.status != "official" or not _same_value(asked, profile.get(f"slots.{rule.asks}")):
        return None
    return pv.source


def _by_captions(which: str, stats: CaptionStats | None, meaning: str) -> tuple[Severity, str]:
    """Severity and message of a deviation that only some captions feel."""
    what = {"bang": ('contain a literal "!"', "with_bang"),
            "over512": ("are longer than 512 bytes (so may pass 512 tokens)", "over_512_bytes")}[which]
    if stats is None:
        return "info", (f"{meaning}. It only matters for captions that {what[0]}; te-align cannot see the captions "
                        "(pass --dataset DIR to count them)")
    n = getattr(stats, what[1])
    if n == 0:
        return "info", f"{meaning}. No caption of {stats.describe()} {what[0]}, so no caption is affected"
    return "warning", f"{meaning}. {n} of {stats.describe()} {what[0]}"


def _differs(to_profile: ConvertFn, raw: object, default: object, ctx: Context) -> bool:
    try:
        return not _same_value(to_profile(raw, ctx), to_profile(default, ctx))
    except Exception:  # a value the converter cannot read still counts as set
        return raw != default


def _cached_fix(trainer: Trainer, rule: Rule) -> str:
    return (f"{trainer.fix_remove(rule.key or '')}, or turn on text-encoder output caching "
            "(then the flag reaches the encoders)")


def _fix(trainer: Trainer, rule: Rule, to_trainer: ConvertFn, expected: object, ctx: Context) -> str:
    if rule.key is None or rule.fix == "":
        return trainer.not_settable
    try:
        value = to_trainer(expected, ctx)
    except LookupError:
        return trainer.not_settable
    if value is REMOVE:
        return trainer.fix_remove(rule.key)
    if rule.fix:
        return rule.fix.format(key=rule.key, value=_literal(value), set=trainer.fix_set(rule.key, value))
    return trainer.fix_set(rule.key, value)


def _edit(rule: Rule, to_trainer: ConvertFn, expected: object, ctx: Context) -> Edit | None:
    """The fix of a deviation as data (:class:`Edit`), where a config key makes it: None when the value is
    hard-coded, no value of the key gives the profile's, or the rule's fix is words only (a template without
    the value)."""
    words_only = bool(rule.fix) and "{set}" not in (rule.fix or "") and "{value}" not in (rule.fix or "")
    if rule.key is None or rule.fix == "" or words_only:
        return None
    try:
        value = to_trainer(expected, ctx)
    except LookupError:
        return None
    if value is REMOVE:
        return Edit(rule.key, remove=True, also=rule.also, unsafe=rule.unsafe)
    return Edit(rule.key, value, also=rule.also, unsafe=rule.unsafe)


def _literal(v: object) -> str:
    import json

    return json.dumps(v, ensure_ascii=False)


def _show(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _literal(v)
    return "-" if v is None else str(v)


# -------------------------------------------------------------------------------- profile guess
#: A model name of the Pony Diffusion V6 XL line (its V5 was SD 2.1 and its V7 AuraFlow: not these).
PONY_WORDS = r"pony(?![-_ ]?(?:diffusion[-_ ]?)?v?[57](?![0-9]))|autism[-_ ]?mix"
#: A model name of the NovelAI lineage of SD 1.x: NovelAI's leaked model (animefull) and its best-known descendants.
#: A name with "xl" in it is an SDXL model of the same name (CounterfeitXL, AnythingXL), never this.
NAI_WORDS = (r"^(?!.*xl)(?=.*(?:novel[-_ ]?ai|animefull|(?<![a-z0-9])nai(?![a-z0-9])|anything[-_ ]?v?[345]"
             r"|abyss[-_ ]?orange|orange[-_ ]?mixs?|(?<![a-z0-9])aom[-_ ]?[1-3]|counterfeit))")

#: (pattern over a lower-cased model path/name, bundled profile); first match wins.
#: Newer families come first: their names also contain an older family's word ("flux", "qwen", "wan2"), and a model
#: of a family or version te-align has no profile for must never be read as another one. A hint may name a profile
#: that is not bundled (a version without a profile): ``check`` then says "not checked" and names the nearest.
_NAME_HINTS: tuple[tuple[str, str], ...] = (
    (r"flux[-_. ]?2.*klein.*9b|klein[-_ ]?9b", "flux2-klein-9b"),
    (r"flux[-_. ]?2.*klein|\bklein", "flux2-klein-4b"),
    (r"flux[-_. ]?2", "flux2-dev"),
    (r"kontext", "flux-dev"),
    (r"z[-_ ]?image", "z-image"),
    (r"qwen[-_ ]?image[-_ ]?edit[-_ ]?2509", "qwen-image-edit-2509"),
    (r"qwen[-_ ]?image[-_ ]?edit[-_ ]?2511", "qwen-image-edit-2511"),
    (r"qwen[-_ ]?image[-_ ]?edit[-_ ]?(?:plus[-_ ]?)?(\d{4})", "qwen-image-edit-\\1"),
    (r"qwen[-_ ]?image[-_ ]?edit[-_ ]?plus", "qwen-image-edit-2509"),
    (r"qwen[-_ ]?image[-_ ]?edit", "qwen-image-edit"),
    (r"qwen[-_ ]?image[-_ ]?(?:2[._-]?1|21)\b", "qwen-image-2.1"),
    (r"krea[-_ ]?2", "krea2"),
    (r"ideogram", "ideogram4"),
    (r"ltx[-_ ]?2", "ltx2"),
    (r"\bwan[-_ ]?2[._]?2", "wan22"),
    (r"schnell", "flux-schnell"),
    (r"chroma", "chroma"),
    (r"flux", "flux-dev"),
    (r"(sd|stable[-_ ]?diffusion)[-_ ]?3[._-]?5.*medium|3\.5[-_ ]?m(edium)?\b|sd35m", "sd35-medium"),
    (r"(sd|stable[-_ ]?diffusion)[-_ ]?3[._-]?5|sd35|3\.5[-_ ]?l(arge)?\b", "sd35-large"),
    (r"(sd|stable[-_ ]?diffusion)[-_ ]?3\b|sd3[-_]?m(edium)?|sd3", "sd3-medium"),
    (r"pixart", "pixart-sigma"),
    (r"aura[-_ ]?flow", "auraflow"),
    (r"lumina", "lumina2"),
    (r"hidream", "hidream"),
    (r"hunyuan[-_ ]?image", "hunyuanimage-2.1"),
    (r"qwen", "qwen-image"),
    (r"\bwan[-_ ]?2", "wan21"),
    (r"\bsana", "sana"),
    # Community bases whose recipe differs from their architecture's (each profile's provenance cites its source):
    # Pony Diffusion V6 XL and its descendants (V5 was SD 2.1, V7 AuraFlow: never these), and the NovelAI lineage of
    # SD 1.x (NovelAI's leaked animefull model, Anything, AbyssOrangeMix, Counterfeit; their XL namesakes are SDXL).
    (PONY_WORDS, "sdxl-pony"),
    (NAI_WORDS, "sd15-nai"),
    (r"xl|pony|illustrious|noobai", "sdxl"),
    (r"(sd|stable[-_ ]?diffusion)[-_ ]?(v?2[._-]?[01]?)\b|768-v", "sd21"),
    (r"(sd|stable[-_ ]?diffusion)[-_ ]?v?1[._-]?[45]|v1-5", "sd15"),
)


def guess_from_name(*names: object) -> str | None:
    """A bundled profile name guessed from model paths / repo ids, or None."""
    for name in names:
        if not isinstance(name, str) or not name:
            continue
        low = name.lower()
        for pat, prof in _NAME_HINTS:
            m = re.search(pat, low)
            if m:
                return m.expand(prof)
    return None


def family_of(profile_name: str) -> str:
    """The family of a bundled profile, by name or alias (loads that one profile file only when given its name)."""
    from te_align.profiles.registry import _bundled_files, bundled_name

    if profile_name not in _bundled_files():
        profile_name = bundled_name(profile_name) or profile_name
    return _load_bundled(profile_name).family
