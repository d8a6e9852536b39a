"""What a trainer's config reader gives the audit engine (:class:`Parsed`, :class:`CacheSpec`) and the helpers
every reader shares (key lines, unknown keys, caption dropout against the empty-prompt rule).

A reader is the ``check`` module of a trainer package (:mod:`te_align.trainers`): it exposes ``RULES`` (its fact
table), ``CACHES``, ``detect(raw) -> int | None`` and ``parse(raw, extra_args) -> Parsed``."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, SupportsFloat

from te_align.audit.findings import Finding
from te_align.audit.readers import ConfigSyntaxError
from te_align.audit.rules import Context, Trainer

if TYPE_CHECKING:  # pragma: no cover
    from te_align._types import StrPath
    from te_align.audit.findings import Severity
    from te_align.profiles import AlignmentProfile


@dataclass(frozen=True)
class CacheSpec:
    """How a trainer caches text-encoder outputs and what its reuse check compares."""

    glob: tuple[str, ...]
    validates: str
    source: str
    #: How to force a rebuild, in the trainer's terms.
    rebuild: str


@dataclass(frozen=True)
class CaptionSource:
    """A caption folder as the trainer reads it, for ``check --dataset``: which files hold captions and what the
    trainer does to a caption's text before its tokenizers see it (in the trainer's own terms, ``handling``)."""

    folder: str
    #: The caption files' extension (".txt"); None: te-align's default, .txt and .caption.
    extension: str | None = None
    prefix: str = ""
    suffix: str = ""
    #: The text joined between prefix, caption and suffix.
    joiner: str = " "
    #: Only a file's first line is the caption (the rest is ignored).
    first_line: bool = False
    #: The caption's ends are stripped of whitespace.
    strip: bool = True
    #: (separator, joiner): the caption is split at the separator and joined again with the joiner (tags re-joined).
    rejoin: tuple[str, str] | None = None
    #: Each piece of ``rejoin`` is stripped before the join; ``rejoin_drop_empty``: empty pieces are dropped.
    rejoin_strip: bool = False
    rejoin_drop_empty: bool = False
    #: The prefix and suffix are added before the caption is re-joined (they are re-joined with it).
    affix_first: bool = False
    #: A trigger word: it replaces each "[trigger]" and "[name]", and is put before the caption (with a space) when
    #: the caption does not contain it.
    trigger: str = ""
    #: Caption files in sub-folders are read too.
    recursive: bool = True
    #: Each non-empty line of a file is a caption of its own (the trainer picks one of them per step).
    each_line: bool = False
    #: Set when the trainer takes this folder's captions from elsewhere (file names, a fixed prompt): why, in its
    #: terms; the folder is not read.
    skip: str = ""
    #: The trainer's caption handling that keeps the token count (shuffled tags, kept tokens), said in its terms.
    length_invariant: tuple[str, ...] = ()
    #: Where the trainer's handling was read (``owner/repo path:LINE``).
    source: str = ""


@dataclass
class Parsed:
    """A config read the way the trainer reads it."""

    trainer: Trainer
    values: dict[str, object]
    profile_guess: str | None
    family_reason: str
    cached: bool
    cache: CacheSpec | None
    findings: list[Finding] = field(default_factory=list)
    #: Families this trainer can train (profile families); others are reported as unsupported.
    supported: tuple[str, ...] = ()
    #: The guess is only a default (no model named): ``--profile`` of another family is accepted.
    guess_is_default: bool = False
    #: Set when the config cannot be checked: the reason ("te-align has no profile for Z-Image …").
    not_checked: str = ""
    #: ``not-checked`` or ``not-training``.
    not_checked_status: Literal["not-checked", "not-training"] = "not-checked"
    #: Extra facts for converters (``Context.extra``), e.g. caption statistics.
    extra: dict[str, object] = field(default_factory=dict)
    #: Trainer-specific findings computed once the profile is known: ``after(profile, ctx) -> [Finding]``.
    after: Callable[[AlignmentProfile, Context], list[Finding]] | None = None
    #: Folders the config trains on, where ``check`` counts captions (with ``--dataset DIR``).
    caption_dirs: list[str] = field(default_factory=list)
    #: The same folders with the trainer's caption handling (``check --dataset``), where the reader knows it; a folder
    #: of ``caption_dirs`` without one here is read with te-align's defaults.
    caption_sources: list[CaptionSource] = field(default_factory=list)
    #: Model paths the config names (a diffusers folder, a hub repo id, a checkpoint file): where ``check --dataset``
    #: looks for the profile's tokenizers before the Hugging Face cache.
    model_paths: list[str] = field(default_factory=list)
    #: Per encoder slot, where the trainer itself loads that slot's tokenizer from (a tokenizer folder, or a hub repo
    #: id whose snapshot holds the tokenizer's files at its root): looked in before ``model_paths``.
    tokenizer_paths: dict[str, list[str]] = field(default_factory=dict)
    #: Per encoder slot, the text the trainer wraps a caption in ("{prompt}" marks the caption; "{system_prompt}" is
    #: filled from the effective system prompt) where the effective values alone do not say it.
    templates: dict[str, str] = field(default_factory=dict)
    #: Set when no signal in the config decided between ``profile_guess`` and another profile of its family: what
    #: was assumed and why (:func:`te_align.audit.models.assumption`). ``check`` says it instead of a bare "aligned".
    assumed: str = ""


class Reason(str):
    """A reader's family reason (a plain string) that can carry the assumption it rests on (``.assumed``)."""

    assumed: str = ""


def reason(text: str, assumed: str = "") -> Reason:
    """``text`` as a :class:`Reason` carrying ``assumed`` ("" when a signal decided)."""
    r = Reason(text)
    r.assumed = assumed
    return r


#: At most this many unknown keys per file get a "did you mean" suggestion (each one costs a difflib scan of every
#: valid key); the rest say "remove it". Reset by ``check_file``.
MAX_SUGGESTIONS = 50
_budget = {"left": MAX_SUGGESTIONS}


def reset_suggestion_budget() -> None:
    _budget["left"] = MAX_SUGGESTIONS


class KeyLines:
    """1-based line of the first ``key = …`` / ``"key": …`` / ``key: …`` of every key, found in one pass."""

    _PAT = re.compile(r'^[ \t]*(?:-[ \t]*)?["\']?([^"\'=:\s\[\]{},#]+)["\']?[ \t]*[=:]', re.M)

    def __init__(self, text: str) -> None:
        self._lines: dict[str, int] = {}
        line, pos = 1, 0
        for m in self._PAT.finditer(text):
            line += text.count("\n", pos, m.start())
            pos = m.start()
            self._lines.setdefault(m.group(1), line)

    def __call__(self, key: str | None) -> int | None:
        return self._lines.get(key) if key else None


def expect_mapping(value: object, name: str, file: str, lines: KeyLines) -> dict[str, object]:
    """A config section that must be a table: ``{}`` when absent, an unreadable-input error otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigSyntaxError(file, lines(name), None,
                                f"wrong type/value for {name}: expected a table of settings, got {value!r:.60}")
    return value


def dropout_form_finding(
    profile: AlignmentProfile,
    rate: object,
    form: str,
    *,
    key: str,
    trainer: str,
    source: str,
    line: int | None = None,
    fix: str = "",
) -> list[Finding]:
    """Caption dropout against the profile's empty-prompt rule: a trainer that drops captions as ``form``
    ("encode": the empty caption "" is encoded; "zeros": the embeddings are zeroed) where the profile's
    empty/unconditional prompt is the other one teaches the model an unconditional input inference never gives."""
    if not isinstance(rate, (str, SupportsFloat)):  # what float() cannot read (None, a list): no rate
        return []
    try:
        value = float(rate)
    except (TypeError, ValueError):
        return []
    if not value > 0 or profile.empty_prompt == form:
        return []
    pv = profile.provenance_of("empty_prompt")
    said = {"encode": 'encodes the empty caption ""', "zeros": "zeroes the text embeddings"}
    return [Finding(
        kind="deviation", severity="warning", setting="empty_prompt", effective=form, profile=profile.empty_prompt,
        source=f"{pv.status}: {pv.source}" if pv else "",
        message=(f"{key} = {value:g}: a dropped caption {said.get(form, form)}, but {profile.name}'s empty prompt "
                 f"{said.get(profile.empty_prompt, profile.empty_prompt)}"),
        fix=fix or f"set {key} to 0 (or accept an unconditional input that differs from inference)",
        key=key, trainer_source=f"{trainer}: {source}", line=line,
    )]


def unknown_key_finding(
    key: str,
    valid: Iterable[str],
    *,
    trainer: str,
    line: int | None,
    severity: Severity = "warning",
    behaviour: str,
    hint: str | None = None,
    section: str = "",
) -> Finding:
    """An unknown key with the closest valid key (or a trainer-specific hint)."""
    from difflib import get_close_matches

    where = f"{section}.{key}" if section else key
    close: list[str] = []
    if not hint and _budget["left"] > 0 and len(key) <= 200:
        _budget["left"] -= 1
        close = get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    if hint:
        fix = hint
    elif close:
        fix = f"did you mean '{close[0]}'?"
    else:
        fix = "remove it"
    return Finding(
        kind="unknown-key",
        severity=severity if severity in ("error", "info") else "warning",
        setting=where,
        message=f"unknown key '{where}': {behaviour}",
        fix=fix,
        key=where,
        line=line,
        trainer_source=trainer,
    )


def cli_scalar(s: str) -> bool | int | float | str:
    """A command-line value as a TOML reader would type it: true / false, an int, a float, else the string."""
    low = s.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    return s


def parse_cli(args: list[str]) -> tuple[dict[str, bool | int | float | str], str | None, list[str]]:
    """``--key value`` / ``--key=value`` / ``--flag`` -> values (dashes as underscores), the first ``*.py``
    positional (the script, its file name), and the order the options were written in."""
    values: dict[str, bool | int | float | str] = {}
    order: list[str] = []
    script = None
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            name, eq, val = a[2:].partition("=")
            name = name.replace("-", "_")
            if eq:
                values[name] = cli_scalar(val)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                values[name] = cli_scalar(args[i + 1])
                i += 1
            else:
                values[name] = True
            order.append(name)
        elif a.endswith(".py") and script is None:
            script = a.replace("\\", "/").rsplit("/", 1)[-1]
        i += 1
    return values, script, order


def checkout_commit(root: StrPath, args: Iterable[str] = ()) -> str:
    """The HEAD commit of the git checkout ``root`` (for the header of a generated key table), or the one given as
    ``--commit SHA`` in ``args`` (a checkout extracted without its git folder)."""
    import subprocess

    args = list(args)
    if "--commit" in args and args.index("--commit") + 1 < len(args):
        return str(args[args.index("--commit") + 1])

    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"


def emit_key_table(lines: list[str], args: list[str], target: Path) -> int:
    """A generated key table: written to ``target`` with ``--write`` in ``args``, else printed."""
    import sys

    text = "\n".join(lines) + "\n"
    if "--write" in args:
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    else:
        sys.stdout.write(text)
    return 0


def flatten_sections(data: Mapping[str, object]) -> dict[str, object]:
    """Every table's keys in one namespace, as trainers that read a TOML config into their argparse namespace do
    (a later table's key wins; top-level values kept)."""
    out: dict[str, object] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(v)
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class ScriptOptions:
    """One script's argparse options, as its parser registers them (a section of a generated
    ``data/<name>-options.txt``): every option string in order, the dest of each, and ``allow_abbrev``."""

    strings: tuple[str, ...]
    dests: Mapping[str, str]
    allow_abbrev: bool = True

    def resolve(self, typed: str) -> tuple[str | None, list[str]]:
        """An option word (``--lear``, without ``=value``) as argparse reads it: the option string itself, else,
        with ``allow_abbrev`` on, the one option string it is a prefix of. Returns (that option string or None,
        every option string an ambiguous prefix matches, in the parser's order: argparse's error lists them so)."""
        if typed in self.dests:
            return typed, []
        if not self.allow_abbrev or not typed.startswith("--"):
            return None, []
        hits = [s for s in self.strings if s.startswith(typed)]
        return (hits[0], []) if len(hits) == 1 else (None, hits)


@functools.cache
def option_tables(package: str, name: str) -> dict[str, ScriptOptions]:
    """The sections of ``<package>/data/<name>.txt`` (a trainer's generated argparse option table), by script."""
    from importlib import resources

    out: dict[str, ScriptOptions] = {}
    current: tuple[str, list[str], dict[str, str], list[bool]] | None = None

    def close() -> None:
        if current is not None:
            out[current[0]] = ScriptOptions(tuple(current[1]), current[2], current[3][0])

    for raw in resources.files(package).joinpath("data", f"{name}.txt").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            close()
            current = (line[1:-1], [], {}, [True])
            continue
        if current is None:
            continue
        if line == "!allow_abbrev false":
            current[3][0] = False
            continue
        strings, _, dest = line.partition(" > ")
        opts = strings.split()
        longs = [o for o in opts if o.startswith("--")]
        dest = dest.strip() or (longs[0] if longs else opts[0]).lstrip("-").replace("-", "_")
        current[1].extend(opts)
        current[2].update(dict.fromkeys(opts, dest))
    close()
    return out


def script_options(package: str, name: str, script: str | None) -> ScriptOptions | None:
    """The options of ``script`` (a file name or path) in a trainer's option table; None for a script it has not."""
    if not script:
        return None
    base = script.replace("\\", "/").rsplit("/", 1)[-1]
    tables = option_tables(package, name)
    if base in tables:
        return tables[base]
    return next((t for k, t in tables.items() if k.rsplit("/", 1)[-1] == base), None)


def typed_names(args: Iterable[str]) -> dict[str, str]:
    """How each option of a command line was written (``--t5xxl-max=5`` -> {"t5xxl_max": "t5xxl-max"}), keyed as
    :func:`parse_cli` keys it."""
    out: dict[str, str] = {}
    for a in args:
        if a.startswith("--") and len(a) > 2:
            name = a[2:].partition("=")[0]
            out[name.replace("-", "_")] = name
    return out


def resolve_script_options(values: dict[str, object], order: list[str], options: ScriptOptions, *, trainer: str,
                           typed: Mapping[str, str] | None = None,
                           line: Callable[[str], int | None] = lambda key: None) -> tuple[list[Finding], dict[str, str]]:
    """Rename each abbreviated option of ``values``/``order`` (a command line read by :func:`parse_cli`) to the option
    the script's own parser reads it as (:class:`ScriptOptions`), in place. Returns the findings (a note per
    abbreviation; argparse's own error for a prefix several options start with, which stops the script with exit
    status 2) and {the full name: the prefix as written} of the abbreviated ones. A prefix of no option stays as
    written (the unknown-key check names it)."""
    typed = typed or {}
    out: list[Finding] = []
    short: dict[str, str] = {}
    for name in list(order):
        if name not in values:
            continue
        word = "--" + typed.get(name, name)
        found, matches = options.resolve(word)
        if found is not None and options.dests[found] == "help":  # argparse's -h/--help action
            out.append(Finding(kind="wrong-value", severity="error", setting=found, key=name,
                               line=line(typed.get(name, name)), trainer_source=trainer,
                               message=f"{word} is {found} to argparse: the script prints its help and exits "
                                       "without training", fix=f"remove {word}"))
            values.pop(name, None)
            order.remove(name)
            continue
        if word in options.dests:
            continue
        if found is not None:
            full = found[2:].replace("-", "_")
            value = values.pop(name)
            if full not in order or order.index(full) < order.index(name):  # argparse: the later one wins
                values[full] = value
            order[order.index(name)] = full
            short[full] = typed.get(name, name)
            out.append(Finding(kind="note", severity="info", setting=found, key=full, line=line(typed.get(name, name)),
                               message=f"{word} is an abbreviation: argparse reads it as {found}, the one option "
                                       "it starts",
                               fix=f"write {found} in full", trainer_source=trainer))
        elif len(matches) > 1:
            out.append(ambiguous_finding(typed.get(name, name), [m[2:] for m in matches], trainer=trainer,
                                         line=line(typed.get(name, name))))
            values.pop(name, None)
            order.remove(name)
    return out, short


def written_prefixes(args: Iterable[str], options: ScriptOptions | None, key: str) -> tuple[str, ...]:
    """The prefixes of ``--key`` in a command line's words that the script's argparse reads as it (``t5xxl_max``)."""
    if options is None:
        return ()
    out: list[str] = []
    for a in args:
        if not a.startswith("--"):
            continue
        word = a.partition("=")[0]
        found, _ = options.resolve(word)
        if found is not None and found != word and found[2:].replace("-", "_") == key and word[2:] not in out:
            out.append(word[2:])
    return tuple(out)


def resolve_abbrev(name: str, options: Iterable[str]) -> tuple[str | None, list[str]]:
    """An option name as argparse resolves it (``allow_abbrev`` on, argparse's default, which
    the trainers' parsers keep): the option itself, else the one option it is a
    prefix of. Returns (the option or None, the options an ambiguous prefix could match)."""
    opts = options if isinstance(options, (set, frozenset, dict)) else set(options)
    if name in opts:
        return name, []
    hits = sorted(o for o in opts if name and o.startswith(name))
    if len(hits) == 1:
        return hits[0], []
    return None, hits


def ambiguous_finding(name: str, matches: list[str], *, trainer: str, line: int | None = None) -> Finding:
    """argparse's own error for a prefix that several options start with (exit 2 before training)."""
    could = ", ".join(f"--{m}" for m in matches)
    return Finding(kind="wrong-value", severity="error", setting=f"--{name}", key=name, line=line,
                   message=f"ambiguous option: --{name} could match {could} (argparse's error: the script stops "
                           "with exit status 2 before training)",
                   fix=f"write the option in full ({could})", trainer_source=trainer)


def resolve_cli_abbrevs(values: dict[str, object], order: list[str], options: Iterable[str], *, trainer: str,
                        line: Callable[[str], int | None] = lambda key: None) -> list[Finding]:
    """Rename the abbreviated options of ``values``/``order`` (a command line read by :func:`parse_cli`) to the
    options argparse reads them as, in place; an ambiguous one gives argparse's error. Unknown ones stay."""
    opts = frozenset(options)
    out: list[Finding] = []
    for name in list(order):
        if name in opts or name not in values:
            continue
        full, matches = resolve_abbrev(name, opts)
        if full is not None:
            value = values.pop(name)
            if full not in order or order.index(full) < order.index(name):  # argparse: the later one wins
                values[full] = value
            order[order.index(name)] = full
        elif len(matches) > 1:
            out.append(ambiguous_finding(name, matches, trainer=trainer, line=line(name)))
            values.pop(name, None)
            order.remove(name)
    return out
