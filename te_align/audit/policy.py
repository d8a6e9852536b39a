"""``te-align check``'s severity policy: one written rule, applied here to every trainer's deviation findings, that
decides how serious a deviation is from what it costs and from what te-align measured (``docs/effects.md``). Imports
no torch. The same policy, in words, is in ``docs/severity.md``.

1. **error**: the deviation loses information the user gave, or te-align measured a harm.

   * *Tokens cut*: the trainer's tokenizer length is shorter than the profile's. With ``--dataset`` and the slot's
     tokenizer found, the captions' real token counts decide (:mod:`te_align.audit.dataset`): an error when at least
     one caption has more tokens than the trainer keeps; when no caption reaches either length (this holds for any
     length finding, longer or shorter) a note that only padding differs, or at most a warning where the model sees
     the padding (no mask). Else, with captions in view (``--dataset``
     or the config's own data folders) this is counted on them: an error when at least one caption certainly has
     more tokens than the trainer keeps (more words than fit), else a warning that says how many might and how many
     captions were read. Without captions it stays an error unless the effects matrix measured it (rule 2), and the
     finding says to pass ``--dataset``.
   * *Image shrunk*: a condition image reaches the vision encoder at a smaller pixel area than the profile's.
   * *Measured harm*: the effects matrix reads "profile better" in the row's pre-registered Holm family **and** in one
     family of all deviation and inference rows. A verdict that holds only in its own family is read as a null.
2. **A measured null is at most a warning**, shown with its interval (Holm-adjusted, in the verdict's terms).
3. **An official alternative is a note** (``info``): a value the model's authors published (the rules decide that,
   :func:`te_align.audit.rules.official_alternative`); a measured harm still makes it an error.
4. **Where the trainer's default measured better** ("trainer default better" in both families) the finding is a
   note that says so, its fix keeps the trainer's value, and ``check --fix`` does not write the profile's value.
5. **Not measured and losing nothing** (a mask flag, a padding convention): at most a warning. An *uninformative*
   verdict (its gating positive control not seen) is read as not measured, unless the row has a confirmatory
   instrument-2 verdict (amendment 11 of the plan), which then counts in its place
   (:func:`te_align.audit.evidence.measured_direction`); a post-hoc instrument-2 reading is shown, never acted on.
6. ``check --fix`` never writes a key that switches off a trainer's own safety checks (a trainer's rule names it in
   :attr:`te_align.audit.rules.Rule.unsafe`) unless
   ``--allow-unsafe-keys`` asks for it; without the flag the finding says what the fix would take.

Only ``deviation`` findings go through the policy; a misspelled key, a wrong value or a stale cache is a fact about
the config, not a recipe choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from te_align._lazy import lazy_module
from te_align.audit.findings import Finding, Severity

if TYPE_CHECKING:  # pragma: no cover
    from te_align.audit import evidence as _evidence
    from te_align.audit.captions import CaptionStats
    from te_align.profiles import AlignmentProfile
else:
    _evidence = lazy_module("te_align.audit.evidence")

__all__ = ["apply", "decide", "image_shrunk", "tokens_cut", "unsafe_keys", "unsafe_why"]

_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2}


def _at_most(severity: str, cap: Severity) -> Severity:
    return cap if _RANK[severity] > _RANK[cap] else severity  # type: ignore[return-value]


def image_shrunk(f: Finding) -> bool:
    """A deviation that loses part of a condition image the user gave: the vision encoder's pixel area smaller than
    the profile's (the original Qwen-Image-Edit's image given at 384x384, where its pipeline gives 1024x1024)."""
    if not f.setting.endswith("images.area"):
        return False
    eff, prof = f.effective, f.profile
    return isinstance(eff, int) and isinstance(prof, int) and not isinstance(eff, bool) and eff < prof


def tokens_cut(f: Finding) -> bool:
    """A deviation that cuts prompt tokens: a tokenizer length shorter than the profile's."""
    if not f.setting.endswith(("tokenizer.max_length", "tokenizer.tokenize_max_length")):
        return False
    eff, prof = f.effective, f.profile
    return isinstance(eff, int) and isinstance(prof, int) and not isinstance(eff, bool) and eff < prof


def unsafe_keys(f: Finding) -> list[str]:
    """The keys a finding's fix would write that switch off the trainer's own safety checks (its rule says which,
    :attr:`te_align.audit.rules.Rule.unsafe`)."""
    return [k for k, _ in (f.edit.unsafe if f.edit is not None else ())]


def unsafe_why(f: Finding) -> str:
    """What the first such key does, in the trainer rule's words."""
    return next((why for _, why in (f.edit.unsafe if f.edit is not None else ())), "")


def decide(f: Finding, evidence: Mapping[str, object] | None, captions: CaptionStats | None) -> Finding:
    """One deviation finding with the severity, message and fix the policy gives it (others unchanged)."""
    if f.kind != "deviation":
        return f
    severity: Severity = f.severity
    why: list[str] = []
    fix, edit = f.fix, f.edit
    direction = _evidence.measured_direction(evidence) if evidence is not None else ""
    official = "official alternative of" in f.message
    if direction == "profile better":
        severity = "error"
        why.append("te-align measured a harm: the profile's value gave the better LoRA (docs/effects.md)")
    elif direction == "trainer default better":
        severity = "info"
        why.append(f"te-align measured the trainer's value ({_show(f.effective)}) better than the profile's "
                   f"({_show(f.profile)}) (docs/effects.md), so this is a note and `check --fix` keeps it")
        fix = (f"keep {_show(f.effective)}: it measured better than the profile's {_show(f.profile)} "
               f"(the profile's fix would be: {f.fix})")
        edit = None
    elif direction == "null":
        severity = _at_most(severity, "warning")
        if f.severity == "error":
            why.append("a measured null (no difference this study resolves), so at most a warning (its interval: the measured line below)")
    elif official:
        severity = "info"
    counts = _counted(f, captions)
    if counts is not None and direction != "trainer default better":
        severity = _by_counts(f, counts, captions, severity, direction, why)  # type: ignore[arg-type]
    elif tokens_cut(f) and direction != "trainer default better":
        length = int(f.effective)  # type: ignore[call-overload]
        if captions is not None and captions.captions:
            certain, maybe = captions.cut_at(length)
            if certain:
                severity = "error"
                why.append(f"{certain} of {captions.describe()} have more words than the {length} tokens kept: "
                           "their ends are cut")
            else:
                severity = _at_most(severity, "warning")
                why.append(f"no caption of {captions.describe()} certainly passes {length} tokens"
                           + (f" ({maybe} might: more than {length - 2} bytes)" if maybe else ""))
        elif not direction and not official:
            severity = "error"
            why.append(f"captions longer than {length} tokens lose their ends; pass --dataset DIR to count yours")
    elif image_shrunk(f) and direction not in ("trainer default better", "null"):
        severity = "error"
        why.append(f"the condition image reaches the encoder at {f.effective} pixels instead of {f.profile}: detail "
                   "of every larger image you give is lost")
    elif not direction and not official and severity == "error":
        severity = "warning"
        why.append("not measured by te-align's effects matrix and it cuts no token, so a warning")
    bad = unsafe_keys(f)
    if bad and edit is not None:
        why.append(f"the fix also sets {', '.join(f'{k} = true' for k in bad)}, which {unsafe_why(f)}; "
                   "`check --fix` writes it only with --allow-unsafe-keys")
    if severity == f.severity and not why and fix == f.fix:
        return f
    message = f.message + (". Severity: " + "; ".join(why) if why else "")
    return dataclasses.replace(f, severity=severity, message=message, fix=fix, edit=edit)


def _counted(f: Finding, captions: CaptionStats | None) -> list[int] | None:
    """The token counts of the user's captions in the finding's slot (``check --dataset`` with its tokenizer found),
    for a length finding; None otherwise."""
    if captions is None or not captions.tokens or not f.setting.endswith("tokenizer.max_length"):
        return None
    eff, prof = f.effective, f.profile
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (eff, prof)):
        return None
    return captions.tokens.get(f.setting.split(".", 1)[0])


def _by_counts(f: Finding, counts: list[int], captions: CaptionStats, severity: Severity, direction: str,
               why: list[str]) -> Severity:
    """A length finding measured on the user's captions: tokens cut → an error with the count; no caption reaching
    either length → a note (only padding differs) unless the model sees the padding (then at most a warning);
    captions past the profile's shorter length kept by a longer trainer length → the rules' severity, with the count."""
    eff, prof = int(f.effective), int(f.profile)  # type: ignore[call-overload]
    slot = f.setting.split(".", 1)[0]
    total = len(counts)
    short = min(eff, prof) if captions.official_tokens.get(slot) is None else f"{eff} (trainer) or {prof} (profile)"
    official = captions.official_tokens.get(slot) or counts
    cut = sum(n > eff for n in counts)
    past = sum(n > prof for n in official)
    if tokens_cut(f) and cut:
        why.append(f"{cut} of your {total} captions ({_pct(cut, total)}) lose tokens past {eff} (counted with the "
                   f"{slot} tokenizer)")
        return "error"
    if cut == 0 and past == 0:
        if direction == "profile better":
            why.append(f"none of your {total} captions has more than {short} tokens ({slot} tokenizer), but the "
                       "padding difference measured a harm")
            return severity
        if slot in captions.padding_seen:
            why.append(f"none of your {total} captions has more than {short} tokens ({slot} tokenizer): no token is "
                       f"cut, only padding differs ({eff} against {prof} positions), and the model sees the padding "
                       "(no mask), so at most a warning")
            return _at_most(severity, "warning")
        why.append(f"none of your {total} captions has more than {short} tokens ({slot} tokenizer): only padding "
                   "differs and the model does not see it, so this changes nothing for this dataset")
        return "info"
    if eff > prof:
        why.append(f"{past} of your {total} captions ({_pct(past, total)}) have more than {prof} tokens ({slot} "
                   f"tokenizer): training sees tokens past {prof} that the official pipeline cuts")
    else:
        why.append(f"no caption of your {total} loses tokens past {eff}; {past} have more than {prof} tokens with "
                   "the profile's template ({slot} tokenizer)")
    if not direction and severity == "error":
        why.append("not measured by te-align's effects matrix and it cuts no token, so a warning")
        return "warning"
    return severity


def _pct(n: int, total: int) -> str:
    p = 100 * n / total if total else 0.0
    return f"{p:.0f}%" if p >= 1 or n == 0 else f"{p:.1f}%"


def apply(findings: Sequence[Finding], profile: AlignmentProfile, captions: CaptionStats | None,
          evidence: Callable[[Finding], Mapping[str, object] | None] | None = None) -> list[Finding]:
    """Every finding through :func:`decide`; ``evidence`` (default: the shipped effects summary) gives a deviation's
    measured row."""
    def shipped(f: Finding) -> Mapping[str, object]:
        return _evidence.evidence_for(profile.family, profile.name, f.setting, f.effective)

    look = evidence or shipped
    return [decide(f, look(f), captions) if f.kind == "deviation" else f for f in findings]


def _show(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
