"""``te-align profile list | show | diff | build``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from te_align._lazy import lazy_module
from te_align.errors import ProfileError
from te_align.profiles import profile, profiles
from te_align.profiles.resolve import build, classify

# Lazy: what only one command needs, loaded when it runs (the CLI's other commands stay cold).
_atomic = lazy_module("te_align._atomic")
_overrides = lazy_module("te_align.profiles.overrides")
_paths = lazy_module("te_align._paths")
_reach = lazy_module("te_align.audit.reach")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="list, show, compare and build alignment profiles")
    ps = p.add_subparsers(dest="profile_command", metavar="SUBCOMMAND", required=True)

    lst = ps.add_parser("list", help="list the bundled profiles")
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    lst.set_defaults(func=cmd_list)

    show = ps.add_parser("show", help="show every value of a profile with its source")
    show.add_argument("name", help="bundled name or alias, profile file, model folder, checkpoint or hub repo id")
    show.add_argument("--json", action="store_true",
                      help="the whole profile as JSON (a profile file: --profile FILE reads it back)")
    show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a value (repeatable), e.g. t5_max_length=512")
    show.set_defaults(func=cmd_show)

    diff = ps.add_parser("diff", help="behaviour differences between two profiles")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(func=cmd_diff)

    build = ps.add_parser("build", help="build a profile from a model folder, hub repo id[@revision] or .safetensors checkpoint")
    build.add_argument("source", metavar="PATH_OR_REPO")
    build.add_argument("-o", "--output", help="write the profile here (.toml or .json; the folder must exist); default: print TOML")
    build.add_argument("--force", action="store_true",
                       help="replace an existing output file (written atomically; the old one is kept as FILE.bak)")
    build.set_defaults(func=cmd_build)


def parse_set(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs (see :func:`te_align.profiles.overrides.parse_set`)."""
    return _overrides.parse_set(items)


def reach_cells() -> list[_reach.Cell]:
    """Every trainer × bundled family: rules, not checked (and why) or not trained (:mod:`te_align.audit.reach`)."""
    from te_align import trainers

    families: dict[str, list[str]] = {}
    for p in profiles():
        families.setdefault(p.family, []).append(p.name)
    return _reach.reach(((spec.name, spec.reader(d.name)) for d, spec in trainers.dialects()), families)


def cmd_list(args: argparse.Namespace) -> int:
    cells = reach_cells()
    checked: dict[str, list[str]] = {}
    unchecked: dict[str, list[str]] = {}
    for c in cells:
        if c.status == "rules":
            checked.setdefault(c.family, []).append(c.trainer)
        elif c.status == "not-checked":
            unchecked.setdefault(c.family, []).append(f"{c.trainer} ({c.why})")
    rows = [
        {"name": p.name, "display_name": p.display_name, "family": p.family, "repo": p.repo,
         "slots": list(p.slot_names), "aliases": list(p.aliases), "fingerprint": p.fingerprint(),
         "checked_for": checked.get(p.family, []),
         "not_checked_for": [{"trainer": c.trainer, "why": c.why} for c in cells
                             if c.family == p.family and c.status == "not-checked"]}
        for p in profiles()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("NAME", "FAMILY", "ENCODERS", "CHECKED FOR")]
    table += [(r["name"], r["family"], "+".join(r["slots"]), ", ".join(r["checked_for"]) or "no trainer") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row[:3], widths, strict=True)) + f"  {row[3]}")
    if unchecked:
        print("\nnot checked (the trainer trains the family; te-align has no rules for it):")
        for family, why in sorted(unchecked.items()):
            print(f"  {family}: " + "; ".join(why))
    return 0


def _fmt(v: object) -> str:
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False) if (v == "" or v != v.strip() or "\n" in v or len(v) > 60) else v
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def cmd_show(args: argparse.Namespace) -> int:
    p = _overrides.resolve(args.name, ("--set", parse_set(args.set)))
    if args.json:
        data = p.to_dict()
        data["fingerprint"] = p.fingerprint()
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return 0
    print(f"{p.name} — {p.display_name}")
    print(f"  repo {p.repo or '-'} · pipeline {p.pipeline or '-'} · family {p.family} · fingerprint {p.fingerprint()}")
    if p.aliases:
        print(f"  aliases: {', '.join(p.aliases)}")
    if p.description:
        print(f"  {p.describe()}")
    paths = p.behaviour_paths()
    width = max(len(x.split(".", 2)[-1]) for x in paths if x.startswith("slots.")) + 2
    last_group = None
    for path in paths:
        if path.startswith("slots."):
            _, slot, rest = path.split(".", 2)
            sp = p.slot(slot)
            group = f"slot {slot} ({sp.tokenizer_subfolder}/, tokenized only)" if sp.tokenizer_only else (
                f"slot {slot} ({sp.tokenizer_subfolder}/ + {sp.encoder_subfolder}/)")
            label = rest
        elif path.startswith("outputs."):
            group, label = "outputs", path.split(".", 1)[1]
        else:
            group, label = "model", path
        if group != last_group:
            print(f"\n[{group}]")
            last_group = group
        value = _fmt(p.get(path))
        pv = p.provenance_of(path)
        src = f"{pv.status}: {pv.source}" if pv else "no source recorded"
        if len(value) > 40:
            print(f"  {label:<{width}}{value}")
            print(f"  {'':<{width}}  └ {_clip(src, 160)}")
        else:
            print(f"  {label:<{width}}{value:<24} {_clip(src, 140)}")
        if pv:
            for alt in pv.alternatives:
                print(f"  {'':<{width}}  ≠ {_fmt(alt.value)} ({alt.status}: {_clip(alt.source, 120)})")
            own = dict(p.provenance).get(path)
            if pv.note and own is pv:
                print(f"  {'':<{width}}  note: {_clip(pv.note, 150)}")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    a, b = profile(args.a), profile(args.b)
    ba, bb = a.behaviour(), b.behaviour()
    rows = [(k, ba.get(k, "<absent>"), bb.get(k, "<absent>")) for k in dict.fromkeys([*ba, *bb]) if ba.get(k, "<absent>") != bb.get(k, "<absent>")]
    if args.json:
        print(json.dumps({"a": a.name, "b": b.name, "differences": [{"path": k, "a": x, "b": y} for k, x, y in rows]}, indent=2))
        return 0
    if not rows:
        print(f"{a.name} and {b.name} behave identically (fingerprint {a.fingerprint()})")
        return 0
    w = max(len(k) for k, _, _ in rows) + 2
    print(f"{'field':<{w}}{_clip(a.name, 30):<32}{_clip(b.name, 30)}")
    for k, x, y in rows:
        print(f"{k:<{w}}{_clip(_fmt(x), 30):<32}{_clip(_fmt(y), 60)}")
    return 0


def check_output(output: str, source: str, *, force: bool) -> Path:
    """Where ``profile build -o`` may write: a .toml/.json file in an existing folder, outside the model
    it reads, and not an existing file unless ``force`` (one :class:`ProfileError` line otherwise)."""
    import os
    import stat

    out = Path(output).expanduser()
    if out.suffix.lower() not in (".toml", ".json"):
        raise ProfileError("the output must be a .toml or .json file", file=output, key="--output")
    src = classify(source, bundled_names=False)
    if src.path is not None:
        model = src.path.resolve()
        target = out.resolve()
        if target == model or model in target.parents or (src.kind == "single-file" and target.parent == model.parent
                                                          and target.name == model.name):
            raise ProfileError(f"is inside the model {'folder' if src.kind == 'folder' else 'file'} it reads ({src.path}); "
                               "write the profile somewhere else", file=output, key="--output")
    parent = out.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist (create it first; build creates no folders)"
        raise ProfileError(f"the output folder {what}", file=str(parent), key="--output")
    try:
        st = os.stat(out)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ProfileError(f"cannot use as output: {e.strerror}", file=output, key="--output") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise ProfileError(
                f"is {_paths.describe(st.st_mode)}, not a file to write", file=output, key="--output"
            )
        if not force:
            raise ProfileError("exists: pass --force to replace it (the old file is kept as "
                               f"{out.name}.bak), or choose another file", file=output, key="--output")
    return out


def _write_with_backup(out: Path, text: str) -> None:
    """Atomic write; an existing file is first kept as ``FILE.bak`` (hard link, else a copy)."""
    def backup() -> None:
        if out.exists():
            _atomic.link_or_copy(out, out.with_name(out.name + ".bak"))

    try:
        mode_from = out if out.exists() else None
        with _atomic.atomic_file(
            out, "w", error=ProfileError, mode_from=mode_from, before_replace=backup
        ) as f:
            f.write(text)
    except OSError as e:
        raise ProfileError(f"cannot write: {e.strerror or e} (free space or choose a writable folder)", file=str(out)) from None


def cmd_build(args: argparse.Namespace) -> int:
    import sys

    out = check_output(args.output, args.source, force=args.force) if args.output else None
    report = build(args.source)
    for line in report.summary_lines():
        print(line, file=sys.stderr)
    if out is not None:
        text = report.profile.to_json() + "\n" if out.suffix.lower() == ".json" else report.profile.to_toml()
        check_output(args.output, args.source, force=args.force)  # again: nothing appeared there meanwhile
        _write_with_backup(out, text)
        print(f"wrote {args.output}" + (f" (the old file is kept as {out.name}.bak)" if args.force and
              out.with_name(out.name + ".bak").exists() else ""), file=sys.stderr)
    else:
        print(report.profile.to_toml(), end="")
    return 0
