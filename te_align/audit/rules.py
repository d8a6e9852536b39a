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
from typing import Any, Literal

from te_align.audit.findings import NOT_SETTABLE, Finding

Honoured = Literal["always", "never", "cached"]


@dataclass(frozen=True)
class ByProfile:
    """A default that depends on the profile: ``ByProfile({"flux-schnell": 256, "*": 512})``."""

    values: Mapping[str, Any]

    def pick(self, profile_name: str) -> Any:
        return self.values.get(profile_name, self.values.get("*"))


@dataclass(frozen=True)
class Rule:
    """One trainer fact: a config key (or hard-coded behaviour) and the profile value it produces."""

    path: str | None
    families: tuple[str, ...]
    key: str | None
    default: Any
    meaning: str
    source: str
    convert: str = "same"
    honoured: Honoured = "always"
    #: Fix template in the trainer's terms; ``{key}``/``{value}`` are filled in. ``""`` = not settable.
    fix: str | None = None
    #: Severity override for deviations (``info`` for training-recipe values such as dropout).
    severity: str | None = None
    #: The deviation matters only for some captions: ``bang`` (captions with a literal "!") or ``over512`` (captions
    #: that can pass 512 tokens). Warning with the count when captions are visible and some are affected, else info.
    captions: str | None = None

    def applies(self, profile_name: str, family: str) -> bool:
        return "*" in self.families or family in self.families or profile_name in self.families

    def default_for(self, profile_name: str) -> Any:
        return self.default.pick(profile_name) if isinstance(self.default, ByProfile) else self.default


@dataclass
class Context:
    """What a converter may look at: the whole config (trainer key -> value) and the profile name.
    ``ran`` collects the rules that compared a profile value (see :func:`evaluate`)."""

    values: Mapping[str, Any]
    profile_name: str
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    ran: list[str] = field(default_factory=list)


class Remove:
    """Marker returned by a back-converter: the fix is to remove (unset) the key."""


REMOVE = Remove()


def _int_or_none(v: Any) -> int | None:
    if v is None or v == "":
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------ converters
def _same(v: Any, ctx: Context) -> Any:
    return v


def _sd_clip_skip(v: Any, ctx: Context) -> Any:
    # sd-scripts: clip_skip N = hidden_states[-N] + final LN; None/0/1 = last_hidden_state.
    n = _int_or_none(v)
    if n is None or n <= 1:
        return "last"
    return "penultimate" if n == 2 else -n


def _sd_clip_skip_back(p: Any, ctx: Context) -> Any:
    if p == "last":
        return REMOVE
    if p == "penultimate":
        return 2
    if isinstance(p, int) and p < 0:
        return -p
    raise LookupError


def _sd_tokens(v: Any, ctx: Context) -> Any:
    # sd-scripts --max_token_length None/75 -> 77; 150/225 -> BOS + n*75 + EOS (chunked).
    n = _int_or_none(v)
    return 77 if n is None or n <= 75 else n + 2


def _sd_tokens_back(p: Any, ctx: Context) -> Any:
    if p == 77:
        return REMOVE
    if isinstance(p, int) and p in (152, 227):
        return p - 2
    raise LookupError


def _nonempty(v: Any, ctx: Context) -> Any:
    return v if isinstance(v, str) and v else None


def _nonempty_back(p: Any, ctx: Context) -> Any:
    return REMOVE if p in (None, "") else p


def _ot_skip(base: int) -> tuple[Callable[[Any, Context], Any], Callable[[Any, Context], Any]]:
    # OneTrainer encode_clip: hidden_states[default_layer - layer_skip]; default_layer -1 (SD1/2) or -2 (SDXL/SD3).
    names = {-1: "last", -2: "penultimate"}

    def to(v: Any, ctx: Context) -> Any:
        idx = base - (_int_or_none(v) or 0)
        return names.get(idx, idx)

    def back(p: Any, ctx: Context) -> Any:
        idx = {"last": -1, "penultimate": -2}.get(p, p)
        if not isinstance(idx, int) or idx > base:
            raise LookupError
        return base - idx

    return to, back


def _st_sd3_len(v: Any, ctx: Context) -> Any:
    # SimpleTuner SD3 check_user_config: default 154, capped at 154 unless i_know_what_i_am_doing.
    n = _int_or_none(v)
    if n is None:
        return 154
    if n > 154 and not _truthy(ctx.values.get("i_know_what_i_am_doing")):
        return 154
    return n


def _st_padding(v: Any, ctx: Context) -> Any:
    return v == "zero"


def _st_padding_back(p: Any, ctx: Context) -> Any:
    return "zero" if p else REMOVE


def _st_flux_len(v: Any, ctx: Context) -> Any:
    # SimpleTuner Flux check_user_config: forces 512, then 256 when model_flavour == "schnell".
    return 256 if ctx.values.get("model_flavour") == "schnell" else 512


def _ot_nullable_len(v: Any, ctx: Context) -> Any:
    # OneTrainer Flux: null -> tokenizer_2.model_max_length (512 for the T5-XXL tokenizer).
    n = _int_or_none(v)
    return 512 if n is None else n


def _st_aura_len(v: Any, ctx: Context) -> Any:
    # SimpleTuner AuraFlow check_user_config: unset/0 = 120 (pony: 768), capped there unless i_know_what_i_am_doing.
    cap = 768 if ctx.values.get("model_flavour") == "pony" else 120
    n = _int_or_none(v)
    if not n:
        return cap
    if n > cap and not _truthy(ctx.values.get("i_know_what_i_am_doing")):
        return cap
    return n


#: What SimpleTuner passes as Sana's instruction when the key is unset (its own text, not the pipeline's).
ST_SANA_DEFAULT = "SimpleTuner's own 10-line instruction (field_registry/sana.py:14-27)"


def _st_sana_instruction(v: Any, ctx: Context) -> Any:
    # SimpleTuner _normalize_sana_complex_instruction: a list or text -> non-empty lines, each stripped;
    # the pipeline joins them with "\n". None/"None"/"" -> no instruction.
    if v is None:
        return ST_SANA_DEFAULT
    if isinstance(v, list):
        lines = [str(x).strip() for x in v if x not in (None, "", "None") and str(x).strip()]
    elif isinstance(v, str):
        if v.strip() in ("", "None"):
            return None
        lines = [line.strip() for line in v.splitlines() if line.strip()]
    else:
        return v
    return "\n".join(lines) if lines else None


def _aitk_pixart_len(v: Any, ctx: Context) -> Any:
    # ai-toolkit: arch pixart -> 300 if is_pixart_sigma else 120; arch pixart_sigma -> the generic T5 branch's 256.
    if ctx.values.get("model._pixart_route") == "pixart_sigma":
        return 256
    return 300 if _truthy(v) else 120


def _aitk_pixart_len_back(p: Any, ctx: Context) -> Any:
    if p == 300:
        return True
    raise LookupError


def _aitk_pixart_zero(v: Any, ctx: Context) -> Any:
    return ctx.values.get("model._pixart_route") == "pixart_sigma"


def _aitk_pixart_denoiser(v: Any, ctx: Context) -> Any:
    return ctx.values.get("model._pixart_route") != "pixart_sigma"


def _bool(v: Any, ctx: Context) -> Any:
    return _truthy(v)


def _bool_back(p: Any, ctx: Context) -> Any:
    return True if p else REMOVE


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _unsettable(p: Any, ctx: Context) -> Any:
    raise LookupError


_OT_LAST = _ot_skip(-1)
_OT_PENULT = _ot_skip(-2)

#: name -> (trainer value -> profile value, profile value -> trainer value or REMOVE; LookupError = no value works)
CONVERTERS: dict[str, tuple[Callable[[Any, Context], Any], Callable[[Any, Context], Any]]] = {
    "same": (_same, _same),
    "bool": (_bool, _bool_back),
    "sd_clip_skip": (_sd_clip_skip, _sd_clip_skip_back),
    "sd_tokens": (_sd_tokens, _sd_tokens_back),
    "nonempty": (_nonempty, _nonempty_back),
    "ot_skip_last": _OT_LAST,
    "ot_skip_penultimate": _OT_PENULT,
    "st_sd3_len": (_st_sd3_len, _same),
    "st_padding": (_st_padding, _st_padding_back),
    "st_flux_len": (_st_flux_len, _unsettable),
    "ot_nullable_len": (_ot_nullable_len, _same),
    "aitk_pixart_len": (_aitk_pixart_len, _aitk_pixart_len_back),
    "aitk_pixart_zero": (_aitk_pixart_zero, _bool_back),
    "aitk_pixart_denoiser": (_aitk_pixart_denoiser, _bool_back),
    "st_aura_len": (_st_aura_len, _same),
    "st_sana_instruction": (_st_sana_instruction, _unsettable),
}


# ------------------------------------------------------------------------------------ value types
_INT_CONVERTERS = {"sd_clip_skip", "sd_tokens", "ot_skip_last", "ot_skip_penultimate", "st_sd3_len", "ot_nullable_len",
                   "st_aura_len"}
_TRUE_FALSE = ("1", "0", "true", "false", "yes", "no", "on", "off")


def expected_type(rule: Rule, profile_name: str) -> str | None:
    """What a rule's config value must be: ``int``, ``bool``, ``fraction`` (0..1), ``str``, ``choice:a,b`` or None."""
    if rule.convert in _INT_CONVERTERS:
        return "int"
    if rule.convert in ("bool", "aitk_pixart_len", "aitk_pixart_zero", "aitk_pixart_denoiser"):
        return "bool"
    if rule.convert == "nonempty":
        return "str"
    if rule.convert == "st_padding":
        return "choice:unmodified,zero"
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


def value_problem(kind: str | None, v: Any) -> str | None:
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
    fix_set: Callable[[str, Any], str]
    fix_remove: Callable[[str], str]
    key_line: Callable[[str], int | None] = lambda key: None
    #: What "no key can fix this" says for this trainer (te-align patches sd-scripts and ai-toolkit only).
    not_settable: str = NOT_SETTABLE


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return a == b


_TRAINER_SOURCE = re.compile(r"trainer choice|onetrainer|simpletuner|ai-toolkit|sd-scripts|kohya", re.I)


def _severity(profile: Any, path: str, effective: Any) -> str:
    """``warning`` when a model or pipeline source (not another trainer) documents the effective value
    as an alternative (FLUX.1 schnell at 512: the diffusers default); ``error`` otherwise."""
    pv = profile.provenance_of(f"slots.{path}")
    if pv is not None and any(
        _same_value(_plain(a.value), effective) and not _TRAINER_SOURCE.search(a.source) for a in pv.alternatives
    ):
        return "warning"
    return "error"


def _plain(v: Any) -> Any:
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return v


def evaluate(trainer: Trainer, profile: Any, ctx: Context) -> tuple[list[Finding], dict[str, Any]]:
    """Apply the trainer's table: effective values per profile path, and the findings."""
    findings: list[Finding] = []
    effective: dict[str, Any] = {}
    slots = set(profile.slot_names)
    reported: set[str] = set()
    for rule in trainer.rules:
        if not rule.applies(profile.name, profile.family):
            continue
        if rule.path is not None and rule.path.split(".", 1)[0] not in slots:
            continue
        to_profile, to_trainer = CONVERTERS[rule.convert]
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
            if _differs(to_profile, raw, default, ctx) and rule.key not in reported:
                reported.add(rule.key)
                when = "" if rule.honoured == "never" else " while text-encoder outputs are not cached"
                findings.append(Finding(
                    kind="unused-value",
                    severity=rule.severity if rule.severity in ("error",) else "warning",
                    setting=rule.key,
                    effective=raw,
                    message=f"{rule.key} = {_show(raw)} is accepted but never used{when}: {rule.meaning}",
                    fix=trainer.fix_remove(rule.key) if rule.honoured == "never" else _cached_fix(trainer, rule),
                    key=rule.key,
                    trainer_source=rule.source,
                    line=trainer.key_line(rule.key),
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
        severity = rule.severity or _severity(profile, rule.path, eff)
        meaning = rule.meaning
        if rule.captions:
            severity, meaning = _by_captions(rule.captions, ctx.extra.get("captions"), meaning)
        findings.append(Finding(
            kind="deviation",
            severity=severity,
            setting=rule.path,
            effective=eff,
            profile=expected,
            source=f"{pv.status}: {pv.source}" if pv else "",
            fix=_fix(trainer, rule, to_trainer, expected, ctx),
            message=meaning,
            key=rule.key,
            trainer_source=rule.source,
            line=trainer.key_line(rule.key) if present and rule.key else None,
        ))
    return findings, effective


def _by_captions(which: str, stats: Any, meaning: str) -> tuple[str, str]:
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


def _differs(to_profile: Callable[[Any, Context], Any], raw: Any, default: Any, ctx: Context) -> bool:
    try:
        return not _same_value(to_profile(raw, ctx), to_profile(default, ctx))
    except Exception:  # a value the converter cannot read still counts as set
        return raw != default


def _cached_fix(trainer: Trainer, rule: Rule) -> str:
    return (f"{trainer.fix_remove(rule.key or '')}, or turn on text-encoder output caching "
            "(then the flag reaches the encoders)")


def _fix(trainer: Trainer, rule: Rule, to_trainer: Callable[[Any, Context], Any], expected: Any, ctx: Context) -> str:
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


def _literal(v: Any) -> str:
    import json

    return json.dumps(v, ensure_ascii=False)


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _literal(v)
    return "-" if v is None else str(v)


# -------------------------------------------------------------------------------- profile guess
#: (pattern over a lower-cased model path/name, bundled profile); first match wins.
_NAME_HINTS: tuple[tuple[str, str], ...] = (
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
    (r"xl|pony|illustrious|noobai", "sdxl"),
    (r"(sd|stable[-_ ]?diffusion)[-_ ]?(v?2[._-]?[01]?)\b|768-v", "sd21"),
    (r"(sd|stable[-_ ]?diffusion)[-_ ]?v?1[._-]?[45]|v1-5", "sd15"),
)


def guess_from_name(*names: Any) -> str | None:
    """A bundled profile name guessed from model paths / repo ids, or None."""
    for name in names:
        if not isinstance(name, str) or not name:
            continue
        low = name.lower()
        for pat, prof in _NAME_HINTS:
            if re.search(pat, low):
                return prof
    return None


def family_of(profile_name: str) -> str:
    """The family of a bundled profile (loads that one profile file only)."""
    from te_align.profiles.registry import _load_bundled

    return _load_bundled(profile_name).family
