"""``check_file``: read a trainer config the way the trainer does, compare its effective text-encoder
settings with an alignment profile, and collect findings. No torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from te_align._lazy import lazy_module
from te_align.audit import readers
from te_align.audit.findings import CheckResult, Finding, combine_exit_codes
from te_align.audit.parsed import reset_suggestion_budget
from te_align.audit.rules import Context, evaluate
from te_align.errors import TeAlignError
from te_align.profiles import profile as resolve

if TYPE_CHECKING:  # pragma: no cover
    from te_align.audit import cachefiles as _cachefiles
    from te_align.audit import captions as _captions
    from te_align.audit import cmdline as _cmdline
    from te_align.audit import dataset as _dataset
    from te_align.audit import policy as _policy
    from te_align.audit.captions import CaptionStats
    from te_align.audit.parsed import CacheSpec
    from te_align.profiles import AlignmentProfile
    from te_align.profiles import overrides as _overrides
    from te_align.trainers.api import CheckDialect, CheckLanguages, CheckParts
else:
    # Lazy: what only some ``check`` runs need (a command line, --set, --dataset, --cache-dir), loaded
    # when used so that ``te-align --help`` and a plain ``check`` stay cold.
    _cachefiles = lazy_module("te_align.audit.cachefiles")
    _captions = lazy_module("te_align.audit.captions")
    _dataset = lazy_module("te_align.audit.dataset")  # check --dataset: the captions' token counts (tokenizers on use)
    _cmdline = lazy_module("te_align.audit.cmdline")
    _overrides = lazy_module("te_align.profiles.overrides")
    _policy = lazy_module("te_align.audit.policy")


def check_path(
    path: str,
    languages: CheckLanguages,
    *,
    profile: AlignmentProfile | str | None = None,
    extra_args: Sequence[str] = (),
    cache_dir: str | None = None,
    dataset: Sequence[str] = (),
    command: Sequence[str] | None = None,
    overrides: Mapping[str, object] | None = None,
    at_line: int | None = None,
    dataset_report: bool = False,
    tokenizer_dirs: Sequence[str] = (),
) -> CheckResult:
    """Check one config file: read it, resolve its language once (``languages``: the one ``--trainer`` names, or
    the best-scoring for ``auto``) and :func:`check_file` it. Unreadable input becomes a ``syntax`` finding (exit
    code 2). ``command``: a training command line given as words instead of a file (``path`` is then only its
    label). ``at_line``: in a file of several command lines, check the one that starts at this line (default: the
    last; see :func:`check_files`, which checks each). The other options are :func:`check_file`'s."""
    label = str(path) if at_line is None else f"{path}:{at_line}"
    try:
        raw = read_config(str(path), languages.scripts, at_line=at_line, command=command, extra_args=extra_args)
        parts = resolve_parts(raw, languages)
    except TeAlignError as e:
        return failed(CheckResult(file=label), e)
    return check_file(raw, parts, profile, extra_args=extra_args, cache_dir=cache_dir, dataset=dataset,
                      overrides=overrides, dataset_report=dataset_report, tokenizer_dirs=tokenizer_dirs,
                      label=label)


def read_config(path: str, scripts: str, *, at_line: int | None = None, command: Sequence[str] | None = None,
                extra_args: Sequence[str] = ()) -> readers.RawConfig:
    """The config ``check`` reads (``command``: a command line given as words, ``path`` its label); an empty one
    is refused. ``scripts``: the training scripts whose command lines are read (:attr:`CheckLanguages.scripts`)."""
    pattern = _cmdline.script_pattern(scripts)
    raw = readers.load(path, at_line, pattern) if command is None else _cmdline.from_argv(list(command), pattern,
                                                                                           path)
    if raw.data in (None, {}, [], "") and not extra_args:
        raise readers.UnreadableConfig("empty config: nothing to check", file=raw.file)
    return raw


def resolve_parts(raw: readers.RawConfig, languages: CheckLanguages) -> CheckParts:
    """The parts of ``raw``'s language: the one ``--trainer`` names, or the best-scoring reader's (``auto``)."""
    if languages.trainer == "auto":
        return readers.detect_trainer(raw, languages.candidates())
    try:
        return languages.parts(languages.trainer)
    except LookupError:
        raise readers.UnreadableConfig(f"unknown trainer '{languages.trainer}'; choose one of "
                                       f"{', '.join(languages.names)}") from None


def failed(result: CheckResult, e: TeAlignError) -> CheckResult:
    """``result`` for a config that could not be checked: unreadable (a ``syntax`` finding, exit 2), or not
    checked / not a training job (exit 3)."""
    if isinstance(e, readers.ConfigSyntaxError):
        result.status = "unreadable"
        result.findings.append(Finding(kind="syntax", severity="error", setting="", message=str(e),
                                       line=e.line, column=e.column))
    elif isinstance(e, readers.NotChecked):
        result.status = "not-training" if e.status == "not-training" else "not-checked"
        result.reason = e.reason
        result.findings.append(Finding(kind="not-checked", severity="info", setting="", message=e.reason))
    else:
        result.status = "unreadable"
        result.findings.append(Finding(kind="syntax", severity="error", setting="", message=str(e)))
    return result


def check_file(
    raw: readers.RawConfig,
    parts: CheckParts,
    profile: AlignmentProfile | str | None = None,
    *,
    extra_args: Sequence[str] = (),
    cache_dir: str | None = None,
    dataset: Sequence[str] = (),
    overrides: Mapping[str, object] | None = None,
    dataset_report: bool = False,
    tokenizer_dirs: Sequence[str] = (),
    label: str | None = None,
) -> CheckResult:
    """Check one read config (``raw``) with the parts of its language (``parts``, resolved by the caller). A
    config te-align cannot check (no profile, no rules, not a training job) has status
    ``not-checked``/``not-training`` (exit 3); one it cannot read, ``unreadable`` (exit 2). ``dataset``: caption
    folders to count captions in (besides the ones the config names). ``overrides``: profile overrides
    (``--set``) applied to the profile the file is checked against (given or detected). ``dataset_report``: read
    the captions (``dataset``, else the folders the config names) with the trainer's caption handling and count
    their tokens per encoder slot with the profile's tokenizers (found in ``tokenizer_dirs``, the config's model
    paths or the hub cache): ``result.dataset``, and the policy's length findings measured on them
    (:mod:`te_align.audit.dataset`). ``label``: the result's file (default: ``raw.file``)."""
    reset_suggestion_budget()
    result = CheckResult(file=raw.file if label is None else label)
    try:
        result.trainer = parts.name
        _check(raw, parts, profile, list(extra_args), cache_dir, result, list(dataset), dict(overrides or {}),
               (list(tokenizer_dirs),) if dataset_report else None)
    except TeAlignError as e:
        return failed(result, e)
    return result


def _refuse_unbundled(guess: str, why: str, file: str) -> None:
    """A model te-align knows by name but has no profile for (a newer version of a family, a family not profiled
    yet) is "not checked", naming the nearest bundled profile: it is never checked against another version's."""
    from te_align.profiles.registry import bundled_names

    names = bundled_names()
    if guess in names:
        return
    from te_align.profiles.registry import bundled_name

    if bundled_name(guess) is not None:  # an alias (wan22 -> wan21, flux-kontext -> flux-dev)
        return
    nearest = max(names, key=lambda n: (_common_prefix(n, guess), -abs(len(n) - len(guess))))
    near = f"; the nearest it has, {nearest}, is not used in its place" if _common_prefix(nearest, guess) >= 3 else ""
    raise readers.NotChecked(
        f"not checked: te-align has no profile for {guess}" + (f" ({why.strip()})" if why.strip() else "")
        + f"{near}; pass --profile NAME to check against a profile you choose", file=file)


def _common_prefix(a: str, b: str) -> int:
    """How many leading characters two names share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _check(
    raw: readers.RawConfig,
    parts: CheckParts,
    profile: AlignmentProfile | str | None,
    extra_args: list[str],
    cache_dir: str | None,
    result: CheckResult,
    dataset: list[str] | None = None,
    overrides: dict[str, object] | None = None,
    report: tuple[list[str]] | None = None,
) -> None:
    name, mod = parts.name, parts.reader
    if raw.fmt == "cmdline" and not parts.command_line and not mod.detect(raw):
        readers_of_lines = " or ".join(parts.line_readers)
        raise readers.UnreadableConfig(f"a command line; te-align reads {name} configs from their config file, and "
                                       f"command lines for --trainer {readers_of_lines} only", file=raw.file)
    parsed = mod.parse(raw, extra_args)
    result.cached = parsed.cached
    findings = list(parsed.findings)
    if parsed.not_checked:
        # the key findings still count (exit 1 if any); the alignment itself is not checked (exit 3)
        result.status = parsed.not_checked_status
        result.reason = parsed.not_checked
        result.family_reason = parsed.family_reason
        result.findings = _sorted([*findings, Finding(kind="not-checked", severity="info", setting="",
                                                      message=parsed.not_checked)])
        return
    if profile is not None:
        prof = resolve(profile) if isinstance(profile, str) else profile
        result.family_reason = f"--profile {prof.name}"
        if parsed.profile_guess and parsed.profile_guess != prof.name and not parsed.guess_is_default:
            guessed = resolve(parsed.profile_guess)
            if guessed.family != prof.family:
                raise readers.UnreadableConfig(
                    f"--profile {prof.name} is a {prof.family} profile, but this config trains {guessed.family} "
                    f"({parsed.family_reason}); pass a {guessed.family} profile or leave --profile out", file=raw.file)
    else:
        if not parsed.profile_guess:
            # a readable config whose model nothing names: its keys are still checked (exit 1 if any finding), the
            # alignment is not (exit 3), and the line says what would decide it
            result.status = "not-checked"
            result.reason = ("cannot work out the model family" + (f" from {parsed.family_reason}" if
                             parsed.family_reason else "") + "; pass --profile NAME")
            result.family_reason = parsed.family_reason
            result.findings = _sorted([*findings, Finding(kind="not-checked", severity="info", setting="",
                                                          message=result.reason)])
            return
        _refuse_unbundled(parsed.profile_guess, parsed.family_reason, raw.file)
        prof = resolve(parsed.profile_guess)
        result.family_reason = parsed.family_reason
        if parsed.assumed:
            result.assumed = parsed.assumed
            findings.append(Finding(kind="note", severity="info", setting="profile", message=parsed.assumed,
                                    fix="pass --profile NAME to check against the model you train"))
    if overrides:
        prof = _overrides.apply_overrides(prof, overrides, origin="--set")
        result.overrides = dict(overrides)
    result.profile = prof.name
    if prof.family not in parsed.supported:
        raise readers.UnreadableConfig(f"{name} does not train {prof.family} models (profile {prof.name})", file=raw.file)
    ctx = Context(values=parsed.values, profile_name=prof.name, cached=parsed.cached, file=raw.file,
                  extra=dict(parsed.extra), trainer_words=parts.source_words)
    if dataset:
        for d in dataset:
            if not Path(d).is_dir():
                raise readers.UnreadableConfig("--dataset: no such folder", file=d)
    captions: CaptionStats | None  # ctx.extra["captions"], typed: the rules read it there, nothing replaces it
    if report is None:
        caption_dirs = list(dataset or []) + [str(d) for d in parsed.caption_dirs]
        captions = _captions.read_captions(caption_dirs)
    else:
        sources, missing = _dataset.sources(list(dataset or []), parsed.caption_sources, parsed.caption_dirs)
        captions = _captions.read_dataset(sources) if sources else None
    ctx.extra["captions"] = captions
    deviations, effective = evaluate(parsed.trainer, prof, ctx)
    deviations = _community_hooks(deviations, prof, parsed.trainer.not_settable)
    if report is not None:
        result.dataset = _dataset.report(captions, missing, prof, effective, parsed.model_paths, report[0], sources,
                                        parsed.tokenizer_paths, parsed.templates)
        findings += _dataset.unreadable_findings(captions)
    after = parsed.after(prof, ctx) if parsed.after is not None else []
    # one severity policy for every trainer's deviations (te_align.audit.policy, docs/severity.md)
    deviations = _policy.apply(deviations, prof, captions)
    after = _policy.apply(after, prof, captions)
    findings += deviations
    findings += after
    result.effective = effective
    result.rules_ran = list(ctx.ran)
    if not ctx.ran:
        result.status = "not-checked"
        result.reason = f"not checked: te-align has no rules for {name}/{prof.family}"
        findings.append(Finding(kind="not-checked", severity="info", setting="", message=result.reason))
    spec = cast("CacheSpec | None", parts.reader.CACHES.get(prof.family))
    if cache_dir is not None:
        findings += _scan_cache(cache_dir, name, mod, prof, effective, spec)
    if parsed.cached and spec is not None and any(
            f.kind == "deviation" and f.severity in ("error", "warning") for f in deviations):
        findings.append(Finding(
            kind="stale-cache", severity="warning", setting="text-encoder cache",
            message=(f"text-encoder outputs are cached and {name} reuses cached files by {spec.validates}: "
                     "files made before you change the settings above will be used as they are"),
            fix=f"after fixing, {spec.rebuild}", trainer_source=spec.source,
        ))
    result.findings = _sorted(findings)


def _community_hooks(findings: list[Finding], prof: AlignmentProfile, not_settable: str) -> list[Finding]:
    """A community base's hard-coded deviations: te-align's hooks pick a profile by architecture, so where the base's
    recipe differs from it the fix names the environment variable that makes them use this one."""
    import dataclasses

    from te_align.audit.models import community_bases

    base = community_bases().get(prof.name)
    if base is None or resolve(base[0]).fingerprint() == prof.fingerprint():
        return findings
    add = (f" (with {_overrides.ENV_PROFILE}={prof.name} in the environment: the hooks otherwise use {base[0]}'s "
           "recipe, the architecture's)")
    return [dataclasses.replace(f, fix=f.fix + add) if f.fix == not_settable else f for f in findings]


_ORDER = {"syntax": 0, "wrong-value": 0, "not-checked": 1, "deviation": 1, "missing-key": 1, "effect": 2, "unused-value": 2,
          "unknown-key": 3, "stale-cache": 4, "note": 5}
_SEV = {"error": 0, "warning": 1, "info": 2}


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (_ORDER[f.kind], _SEV[f.severity]))


def _scan_cache(
    cache_dir: str,
    name: str,
    mod: CheckDialect,
    prof: AlignmentProfile,
    effective: dict[str, object],
    spec: CacheSpec | None,
) -> list[Finding]:
    """The cached text-encoder files in ``cache_dir``: read by the reader's ``scan_cache`` where it has one (the
    lengths they record), else counted by the file patterns of its cache spec."""
    if not Path(cache_dir).is_dir():
        raise readers.UnreadableConfig("no such cache folder", file=cache_dir)
    if hasattr(mod, "scan_cache"):
        res = mod.scan_cache(cache_dir, prof)
    else:
        patterns = dict.fromkeys(g.rsplit("/", 1)[-1] for g in (spec.glob if spec else ()))
        res = _cachefiles.scan(cache_dir, [(g, None, "") for g in patterns])
    found, lengths, bad, path_of = res[:4]
    fingerprints = res.fingerprints if hasattr(res, "fingerprints") else {}
    out: list[Finding] = []
    where = spec.source if spec else ""
    if not found:
        out.append(Finding(kind="note", severity="info", setting="text-encoder cache",
                           message=f"no cached text-encoder files found in {cache_dir}"))
        return out
    want = effective.get(path_of)
    stale = {n: c for n, c in lengths.items() if want is not None and n != want}
    if stale:
        made = ", ".join(f"{c} with {n}" for n, c in sorted(stale.items()))
        out.append(Finding(
            kind="stale-cache", severity="error", setting=path_of, effective=want,
            profile=prof.get(f"slots.{path_of}"),
            message=(f"{sum(stale.values())} of {found} cached files in {cache_dir} were made with another "
                     f"{path_of} ({made}) than this config gives ({want}); {name} does not notice "
                     f"(its reuse check compares {spec.validates if spec else 'nothing'})"),
            fix=spec.rebuild if spec else f"delete the cached files in {cache_dir}", trainer_source=where,
        ))
    elif not lengths and not fingerprints:
        out.append(Finding(
            kind="note", severity="info", setting="text-encoder cache",
            message=(f"{found} cached files in {cache_dir} record no readable settings"
                     + (f" ({bad} unreadable)" if bad else "")
                     + "; they are stale whenever they were made under other settings"),
            trainer_source=where,
        ))
    out += _fingerprint_findings(cache_dir, found, fingerprints, prof, spec)
    return out


def _fingerprint_findings(cache_dir: str, found: int, fingerprints: Mapping[str, int], prof: AlignmentProfile,
                          spec: CacheSpec | None) -> list[Finding]:
    """Cache files te-align's hooks stamped with another profile's fingerprint (stale: a hooked run re-encodes
    them), and files made without the hooks (the trainer's own encoding, with the deviations above)."""
    out: list[Finding] = []
    other = {fp: n for fp, n in fingerprints.items() if fp and fp != prof.fingerprint()}
    plain = fingerprints.get("", 0)
    where = spec.source if spec else ""
    if other:
        made = ", ".join(f"{n} with {fp}" for fp, n in sorted(other.items()))
        out.append(Finding(
            kind="stale-cache", severity="warning", setting="text-encoder cache", effective=sorted(other),
            profile=prof.fingerprint(),
            message=(f"{sum(other.values())} of {found} cached files in {cache_dir} were encoded by te-align's hooks "
                     f"under another profile ({made}) than {prof.name} ({prof.fingerprint()})"),
            fix="run the trainer's caching step again with te-align's hooks (they re-encode files of another "
                "fingerprint)" + (f"; or {spec.rebuild}" if spec else ""), trainer_source=where,
        ))
    if plain:
        out.append(Finding(
            kind="note", severity="info", setting="text-encoder cache",
            message=(f"{plain} of {found} cached files in {cache_dir} carry no te-align fingerprint: made without "
                     "te-align's hooks, by the trainer's own encoding"),
            trainer_source=where,
        ))
    return out


def check_files(paths: Sequence[str], languages: CheckLanguages, **kw: Any) -> list[CheckResult]:
    """Check each file (:func:`check_path`); a file of several command lines (a caching command and its training
    command, a script that trains twice) gives one result per command, labelled ``FILE:LINE``."""
    out: list[CheckResult] = []
    for p in paths:
        starts = command_starts(p, languages.scripts)
        if len(starts) < 2:
            out.append(check_path(p, languages, **kw))
            continue
        out += several_commands([check_path(p, languages, at_line=n, **kw) for n in starts])
    return out


def several_commands(results: list[CheckResult]) -> list[CheckResult]:
    """The checks of a file's commands, marked for :func:`exit_code`: a command that runs no text encoder (latent
    caching) or that te-align cannot check says so, and does not make the file "not checked" when another
    command of it was."""
    if any(r.status == "checked" for r in results):
        for r in results:
            if r.exit_code == 3:
                r.in_exit = False
    return results


def command_starts(path: str, scripts: str) -> list[int]:
    """The first line of every training/caching command in a command-line file ([] for any other file).
    ``scripts``: the training scripts whose command lines are read (:attr:`CheckLanguages.scripts`)."""
    p = Path(path)
    if readers.config_suffix(p) not in _cmdline.SUFFIXES and readers.config_suffix(p):
        return []
    try:
        raw = readers.load(path, scripts=_cmdline.script_pattern(scripts))
    except TeAlignError:
        return []
    data = raw.data if isinstance(raw.data, dict) else {}
    starts = data.get("commands") if raw.fmt == "cmdline" else None
    return [n for n in starts if isinstance(n, int)] if isinstance(starts, list) else []


def exit_code(results: Sequence[CheckResult]) -> int:
    """The exit code of several files: the most serious (2 unreadable > 1 deviations > 3 not checked > 0). A
    command of a several-command file that was not checked while another was (``in_exit`` False) counts not."""
    counted = [r.exit_code for r in results if getattr(r, "in_exit", True)]
    return combine_exit_codes(counted or [r.exit_code for r in results])
