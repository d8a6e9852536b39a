"""``te-align check CONFIG [more…] [--trainer T] [--profile NAME] [--json] [--cache-dir DIR] [--dataset DIR] [-- EXTRA]``.

Exit codes: 0 aligned (at least one rule for the trainer and model family ran and all passed), 1 deviations
found, 2 unreadable input (syntax error, empty config, a value of the wrong type), 3 not checked (te-align has no
profile for the model or no rules for this trainer and family, or the file is not a training job or no trainer
config at all). Several files: the most serious code, 2 > 1 > 3 > 0. Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from te_align._lazy import lazy_module
from te_align.audit import check_files, check_path, exit_code
from te_align.audit.readers import backup_of, config_suffix
from te_align.profiles import profile
from te_align.trainers import dialects, registry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from te_align.audit.findings import CheckResult
    from te_align.fixing.fix import FixReport
    from te_align.integrations.targets import InferenceNote

# Lazy: what only some check runs need (--set, --for, the effects matrix), loaded when used.
_overrides = lazy_module("te_align.profiles.overrides")
_ab_evidence = lazy_module("te_align.audit.evidence")
_targets = lazy_module("te_align.integrations.targets")
_fix = lazy_module("te_align.fixing.fix")  # check --fix / --diff (tomlkit, ruamel.yaml): only when asked


def trainer_choices() -> tuple[str, ...]:
    """``auto`` and every config language of the trainer registry."""
    return ("auto", *(d.name for d, _ in dialects()))


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trainer", choices=trainer_choices(), default="auto",
                   help="which trainer reads the config (default: tell from the file's shape)")
    p.add_argument("--profile", metavar="NAME", help="compare with this profile instead of the one for the detected family")
    p.add_argument("--json", action="store_true", help="machine-readable findings")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of the profile checked against (repeatable), e.g. t5_max_length=512")
    p.add_argument("--cache-dir", metavar="DIR", help="also read cached text-encoder files here and flag stale ones")
    p.add_argument("--dataset", metavar="DIR", action="append", nargs="?", const="", default=[],
                   help="your captions (repeatable): the token lengths per text encoder with the profile's tokenizers "
                        "and the trainer's caption handling, how many the trainer's and the official length cut, and "
                        "the length findings measured on them; without DIR, the dataset folders the config names")
    p.add_argument("--tokenizer-dir", dest="tokenizer_dir", metavar="DIR", action="append", default=[],
                   help="--dataset: a model folder with tokenizer/, tokenizer_2/ … or a tokenizer's own folder "
                        "(repeatable), looked in before the config's model path and the Hugging Face cache")
    p.add_argument("--for", dest="for_tool", metavar="TOOL", choices=("comfyui", "forge", "diffusers"),
                   help="also say where sampling in comfyui, forge or diffusers gives other conditioning than this "
                        "training (notes; the exit code is unchanged)")
    p.add_argument("--fix", action="store_true",
                   help="write the profile's values into the config where a key or flag the trainer reads "
                        "sets them (comments and layout kept; backup beside it as NAME.te-align-original); "
                        "the rest stay findings")
    p.add_argument("--diff", action="store_true",
                   help="with or without --fix: print the fix as a unified diff, write nothing")
    p.add_argument("--no-backup", dest="no_backup", action="store_true",
                   help="--fix: keep no backup beside the file")
    p.add_argument("--allow-unsafe-keys", dest="allow_unsafe_keys", action="store_true",
                   help="--fix: also write a fix that needs a key switching off the trainer's own safety checks "
                        "(i_know_what_i_am_doing); without it such a fix is left and says so")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="audit trainer configs against the model's alignment profile "
             "(exit 0 aligned, 1 deviations, 2 unreadable, 3 not checked)",
        description=f"Read {_reads()} (command lines in a .sh/.bat/.cmd/.ps1/.txt file, several per file each "
                    "checked, with their line continuations and variables, or after `--` with no CONFIG; a trainer's "
                    "config.env through its own variable names); "
                    "work out the model family and the trainer's effective text-encoder settings; "
                    "compare them with the alignment profile. Extra CLI args (and the script name) go "
                    "after `--`. Exit codes: 0 aligned (rules for this trainer and family ran and passed), "
                    "1 deviations, 2 unreadable input (syntax error, empty config, wrong type/value), 3 not checked "
                    "(no profile or no rules for the model, not a training job, or no trainer config at all); "
                    "several files: 2 > 1 > 3 > 0.",
        usage="te-align check CONFIG [CONFIG ...] [--trainer T] [--profile NAME] [--set KEY=VALUE] [--json] "
              "[--cache-dir DIR] [--dataset [DIR]] [--tokenizer-dir DIR] [--fix [--no-backup] [--allow-unsafe-keys]] [--diff] [-- EXTRA_ARGS]\n       "
              "te-align check [OPTIONS] -- accelerate launch train_*.py ARGS",
    )
    _options(p)
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="CONFIG", help="config files, then `--` and extra CLI args")
    p.set_defaults(func=cmd_check)


def _reads() -> str:
    reads = [d.reads for d, _ in dialects()]
    return ", ".join(reads[:-1]) + f" or {reads[-1]}" if len(reads) > 1 else "".join(reads)


def _split(args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    rest = list(args.args)
    extra: list[str] = []
    if "--" in rest:
        i = rest.index("--")
        rest, extra = rest[:i], rest[i + 1:]
    inner = argparse.ArgumentParser(prog="te-align check")
    _options(inner)
    inner.add_argument("configs", nargs="*", metavar="CONFIG")
    ns = inner.parse_args(rest)
    for name in ("trainer", "profile", "json", "cache_dir", "for_tool", "fix", "diff", "no_backup", "allow_unsafe_keys"):
        outer = getattr(args, name)
        if outer not in (None, False, "auto"):
            setattr(ns, name, outer)
    ns.dataset = list(getattr(args, "dataset", []) or []) + list(ns.dataset)
    ns.tokenizer_dir = list(getattr(args, "tokenizer_dir", []) or []) + list(ns.tokenizer_dir)
    # `check --dataset CONFIG`: argparse gave a config to the valueless --dataset; a file is a config, not a folder
    files = [d for d in ns.dataset if d and Path(d).is_file()]
    if files:
        ns.configs = files + list(ns.configs)
        ns.dataset = ["" if d in files else d for d in ns.dataset]
    if not ns.configs and not extra:
        inner.error("the following arguments are required: CONFIG (or `-- accelerate launch train_*.py ARGS`)")
    ns.set = list(getattr(args, "set", []) or []) + list(ns.set)
    return ns, extra


def cmd_check(args: argparse.Namespace) -> int:
    ns, extra = _split(args)
    overrides = _overrides.parse_set(ns.set)
    report = bool(ns.dataset)  # --dataset, with or without DIR: the captions' token lengths
    if ns.tokenizer_dir and not report:
        print("te-align: error: --tokenizer-dir goes with --dataset (it says where the tokenizers that count your "
              "captions are)", file=sys.stderr)
        return 2
    ns.dataset = [d for d in ns.dataset if d]
    if ns.fix or ns.diff or ns.no_backup or ns.allow_unsafe_keys:
        return _cmd_fix(ns, extra, overrides)
    languages = registry().check_languages(ns.trainer)  # the trainer, resolved once: its parts go down
    if not ns.configs:  # te-align check -- accelerate launch SCRIPT ARGS (a command line instead of a file)
        results = [check_path("<command line>", languages, profile=ns.profile, cache_dir=ns.cache_dir,
                              dataset=ns.dataset, command=extra, overrides=overrides, dataset_report=report,
                              tokenizer_dirs=ns.tokenizer_dir)]
    else:
        for c in ns.configs:  # stderr: one line each, beside the report (and --json) on stdout
            original = backup_of(c)
            if original is not None and Path(c).is_file():
                kind = config_suffix(Path(c)) or "command-line"
                print(f"te-align: {c} is te-align's backup of {original}; checked as a {kind} config, as {original} "
                      "was before te-align changed it", file=sys.stderr)
        results = check_files(ns.configs, languages, profile=ns.profile, extra_args=extra, cache_dir=ns.cache_dir,
                              dataset=ns.dataset, overrides=overrides, dataset_report=report,
                              tokenizer_dirs=ns.tokenizer_dir)
    code = exit_code(results)
    notes = [_inference(r, ns.for_tool) for r in results]
    evidence = [_evidence(r) for r in results]
    if ns.json:
        dicts = [r.to_dict() for r in results]
        for d, ev in zip(dicts, evidence, strict=True):
            found = d.get("findings", [])
            for f, e in zip(found if isinstance(found, list) else [], ev, strict=True):  # to_dict's list of dicts
                if e is not None:
                    f["evidence"] = e
        if ns.for_tool:
            for d, n, r in zip(dicts, notes, results, strict=True):
                d["inference"] = {"tool": ns.for_tool, "notes": [{**x.to_dict(), "evidence": _note_evidence(r, ns.for_tool, x)} for x in n]}
        print(json.dumps({"exit_code": code, "results": dicts}, indent=2, ensure_ascii=False, default=str))
        return code
    for i, r in enumerate(results):
        if i:
            print()
        _print_result(r, evidence[i])
        _print_dataset(r)
        if ns.for_tool and r.profile is not None:
            _print_inference(ns.for_tool, notes[i])
            for note in notes[i]:
                note_ev = _note_evidence(r, ns.for_tool, note)
                print(f"  measured ({note.setting}): {note_ev['text']}")
                for line in _lines(note_ev):
                    print(f"  {'':<9}  {line}")
    return code


def _print_dataset(r: CheckResult) -> None:
    """``--dataset``: the captions' token lengths, after the findings."""
    if r.dataset is None:
        return
    for line in _lines(r.dataset):
        print(f"  {line}")


def _lines(d: Mapping[str, object]) -> list[object]:
    """The ``lines`` a measured row or a ``--dataset`` report prints (:mod:`te_align.audit.evidence`,
    :func:`te_align.audit.dataset.report`): a list, or none."""
    lines = d.get("lines")
    return lines if isinstance(lines, list) else []


def _cmd_fix(ns: argparse.Namespace, extra: list[str], overrides: dict[str, object]) -> int:
    """``--fix`` / ``--diff``: per file, the fix (or its diff), then the check of the file as it now
    stands."""
    if not ns.configs:
        print("te-align: error: --fix and --diff edit config files; a command line after `--` alone has no "
              "file to edit (put it in a .sh/.txt file)", file=sys.stderr)
        return 2
    if ns.no_backup and not ns.fix:
        print("te-align: error: --no-backup goes with --fix", file=sys.stderr)
        return 2
    if ns.allow_unsafe_keys and not (ns.fix or ns.diff):
        print("te-align: error: --allow-unsafe-keys goes with --fix or --diff", file=sys.stderr)
        return 2
    languages = registry().check_languages(ns.trainer)
    reports = [_fix.fix_file(c, languages, profile=ns.profile, extra_args=extra,
                             cache_dir=ns.cache_dir, dataset=ns.dataset, overrides=overrides,
                             write=not ns.diff, backup=not ns.no_backup,
                             allow_unsafe=ns.allow_unsafe_keys) for c in ns.configs]
    code = exit_code([x for r in reports for x in (r.results or [r.result])]) if not any(r.refused for r in reports) else 2
    if ns.json:
        dicts = []
        for r in reports:
            d = r.result.to_dict()
            d["exit_code"] = r.exit_code  # a --fix refused: 2, as the process exits
            if r.results:  # a file of several commands: the check of each
                d["commands"] = [x.to_dict() for x in r.results]
            left = [{"setting": f.setting, "kind": f.kind, "why": _fix.why_left(f)} for f in r.left]
            d["fix"] = {"written": r.written, "changes": [c.describe() for c in r.changes],
                        "refused": r.refused, "backups": r.backups, "diff": r.diff, "left": left}
            dicts.append(d)
        print(json.dumps({"exit_code": code, "results": dicts}, indent=2, ensure_ascii=False, default=str))
        return code
    for i, r in enumerate(reports):
        if r.refused:
            print(f"te-align: error: {r.refused}", file=sys.stderr)
            continue
        if ns.diff:  # stdout stays a patch; why nothing is checked, or what --fix would leave: stderr, as --fix says it
            sys.stdout.write(r.diff)
            if r.result.status in ("not-checked", "not-training") and r.result.profile is None:
                head = f"{r.result.trainer} · " if r.result.trainer else ""
                print(f"{r.file}: {head}{r.result.reason}", file=sys.stderr)
            left_line = _left_line(r)
            if left_line:
                print(f"{r.file}: {left_line}", file=sys.stderr)
            continue
        if i:
            print()
        if r.written:
            said = ", ".join(c.describe() for c in r.changes)
            bak = f" (backup: {', '.join(r.backups)})" if r.backups else ""
            print(f"{r.file}: fixed {len(r.fixed)} finding(s): {said}{bak}")
            for a in r.after:
                print(f"  cache: {a} (made with the settings before this fix)")
        for j, x in enumerate(r.results or [r.result]):
            if j:
                print()
            _print_result(x)
        _print_left(r)
    return code


def _print_left(r: FixReport) -> None:
    """One line: what --fix could not write, and why (te-align patch / the hooks, hard-coded, or the user's
    choice)."""
    left = _left_line(r)
    if left:
        print(f"  {left}")


def _left_line(r: FixReport) -> str:
    """What --fix leaves (or, with --diff, would leave), in one line; "" when it leaves nothing."""
    left = r.left
    if not left:
        return ""
    patch = [f.setting for f in left if _fix.patch_fixes(f)]
    fixed = [f.setting for f in left if _fix.needs_patch(f) and not _fix.patch_fixes(f)]
    risky = [f for f in left if not _fix.needs_patch(f) and f.edit is not None and _fix.unsafe(f)]
    yours = [f.setting for f in left if not _fix.needs_patch(f) and f not in risky]
    parts = []
    if risky:
        keys = sorted({k for f in risky for k in _fix.unsafe(f)})
        parts.append(f"{len(risky)} not written ({', '.join(f.setting for f in risky)}): the fix also sets "
                     f"{', '.join(k + ' = true' for k in keys)}, which switches off the trainer's own safety "
                     "checks; --allow-unsafe-keys writes it")
    if patch:
        parts.append(f"{len(patch)} no key sets ({', '.join(patch)}): `te-align patch` or the hooks, see "
                     "its fix")
    if fixed:
        parts.append(f"{len(fixed)} hard-coded ({', '.join(fixed)}): see its fix")
    if yours:
        parts.append(f"{len(yours)} left to you ({', '.join(yours)}): see its fix")
    return f"--fix left {len(left)} finding(s): " + "; ".join(parts)


def _family(r: CheckResult) -> str:
    if r.profile is None:  # no profile resolves: the check said so
        return ""
    try:
        return str(profile(r.profile).family)
    except Exception:  # a profile that does not resolve was reported by the check itself
        return ""


def _evidence(r: CheckResult) -> list[dict[str, object] | None]:
    """Per finding of a checked result: what the committed effects matrix measured about it (deviations only)."""
    if r.profile is None:
        return [None] * len(r.findings)
    fam = _family(r)
    return [
        _ab_evidence.evidence_for(fam, r.profile, f.setting, f.effective, trainer=r.trainer) if f.kind == "deviation"
        else None
        for f in r.findings
    ]


def _note_evidence(r: CheckResult, tool: str, note: InferenceNote) -> dict[str, object]:
    return _ab_evidence.evidence_for(_family(r), r.profile, note.setting, None, tool=tool)


def _inference(r: CheckResult, tool: str | None) -> list[InferenceNote]:
    """``--for TOOL``: the inference notes for a checked result (none without a profile)."""
    if not tool or r.profile is None:
        return []
    return _targets.inference_notes(profile(r.profile, **(r.overrides or {})), tool, r.effective or {})


def _print_inference(tool: str, notes: list[InferenceNote]) -> None:
    if not notes:
        print(f"  sampling in {_targets.TOOLS[tool]}: conditioning as trained (no known difference)")
        return
    print(f"  sampling in {_targets.TOOLS[tool]}:")
    for n in notes:
        print(f"  note     {n.message}" + (f", unless you {n.fix}" if n.fix and n.setting != "prompt syntax" else ""))
        if n.fix and n.setting == "prompt syntax":
            print(f"  {'':<9}  {n.fix}")
        print(f"  {'':<9}  source: {n.source}")


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "-"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False) if (v == "" or len(v) > 24 or " " in v) else v
    return str(v)


def _clip(s: str, n: int) -> str:
    """At most ``n`` characters, cut at a word boundary (never mid-word)."""
    if len(s) <= n:
        return s
    cut = s[: n - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > n // 2 else cut).rstrip(" ,;:") + "…"


def _clip_pair(a: str, b: str, na: int, nb: int) -> tuple[str, str]:
    """Two different values clipped so that the texts shown differ too: where a clip would hide the difference
    (Lumina 2's system prompts all begin "You are an assistant designed to generate"), both start at the word
    where they part ("…high-quality…" / "…superior images with…")."""
    ca, cb = _clip(a, na), _clip(b, nb)
    if a == b:
        return ca, cb
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    shown = [len(c) - 1 if c != full else len(c) for c, full in ((ca, a), (cb, b))]
    if min(shown) > k and ca != cb:
        return ca, cb
    start = a.rfind(" ", 0, k) + 1 or max(0, k - 3)  # the word where they part, else a few characters before
    return ("…" + _clip(a[start:], na - 1) if start else ca), ("…" + _clip(b[start:], nb - 1) if start else cb)


def _print_result(r: CheckResult, evidence: list[dict[str, object] | None] | None = None) -> None:
    # unreadable input (a file that cannot be read or parsed, a value of the wrong type): one line each on stderr,
    # with the prefix every te-align command uses for errors; the rest of the report stays on stdout
    for f in r.findings:
        if f.kind in ("syntax", "wrong-value"):
            print(f"te-align: error: {f.message}", file=sys.stderr)
    if any(f.kind == "syntax" for f in r.findings):
        return
    if r.status in ("not-checked", "not-training") and r.profile is None:
        print(f"{r.file}: {r.trainer} · {r.reason}" if r.trainer else f"{r.file}: {r.reason}")
        if all(f.kind == "not-checked" for f in r.findings):
            return  # nothing but why it was not checked: that one line
    else:
        given = "".join(f", {k}={_fmt(v)}" for k, v in r.overrides.items())
        print(f"{r.file}: {r.trainer} · profile {r.profile}{' with --set ' + given[2:] if given else ''} "
              f"({r.family_reason})")
    table = [f for f in r.findings if f.kind == "deviation"]
    others = [f for f in r.findings if f.kind not in ("deviation", "not-checked", "wrong-value")]
    if r.assumed and r.profile is not None:  # the assumption up front, before any finding that rests on it
        print(f"  {r.assumed}")
    if r.exit_code == 0 and r.assumed:
        print(f"  aligned if the model is {r.profile} (assumed, see the note): {len(r.rules_ran)} rule(s) for "
              f"{r.trainer}/{r.profile} ran; no error or warning")
    elif r.exit_code == 0 and not table and not others:
        print(f"  aligned: {len(r.rules_ran)} rule(s) for {r.trainer}/{r.profile} ran and every one matches the profile")
        return
    elif r.exit_code == 0:
        print(f"  aligned: {len(r.rules_ran)} rule(s) for {r.trainer}/{r.profile} ran; no error or warning, "
              "but these notes:")
    if table:
        w = max(len(f.setting) for f in table) + 2
        print(f"  {'severity':<9}{'setting':<{w}}{'effective':<18}{'profile':<18}")
        for f in table:
            loc = f"  (line {f.line})" if f.line else ""
            eff, prof = _clip_pair(_fmt(f.effective), _fmt(f.profile), 16, 40)
            print(f"  {f.severity:<9}{f.setting:<{w}}{eff:<18}{prof:<18}{loc}")
            print(f"  {'':<9}  trainer: {f.message} [{f.trainer_source}]")
            print(f"  {'':<9}  profile: {f.source}")
            print(f"  {'':<9}  fix: {f.fix}")
            ev = evidence[r.findings.index(f)] if evidence else None
            if ev is not None:
                print(f"  {'':<9}  measured: {ev['text']}")
                for line in _lines(ev):
                    print(f"  {'':<9}    {line}")
    for f in others:
        loc = f" (line {f.line})" if f.line and f.kind != "wrong-value" else ""
        print(f"  {f.severity:<9}{f.kind}: {f.message}{loc}")
        if f.fix:
            print(f"  {'':<9}  fix: {f.fix}")
    if r.status in ("not-checked", "not-training") and r.profile is not None:
        print(f"  {r.reason}")
    n_err = sum(f.severity == "error" for f in r.findings)
    n_warn = sum(f.severity == "warning" for f in r.findings)
    n_info = sum(f.severity == "info" for f in r.findings)
    print(f"  {n_err} error(s), {n_warn} warning(s), {n_info} note(s)")
