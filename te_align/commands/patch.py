"""``te-align patch | unpatch | status``: on-disk patching of trainer installations."""

from __future__ import annotations

import argparse
import json
from typing import Any

from te_align._lazy import lazy_module
from te_align._version import __version__
from te_align.profiles import profile
from te_align.trainers import specs

# Lazy: what only one command needs, loaded when it runs (the CLI's other commands stay cold).
_patching = lazy_module("te_align.patching")
_patch_trainers = lazy_module("te_align.parts")  # the patchers, resolved once from the registry
_transaction = lazy_module("te_align.patching.transaction")
_environment = lazy_module("te_align.patching.environment")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patch", help="install te-align's drop-in scripts into a trainer folder (a transaction)")
    patched = [s for s in specs() if s.patch]
    p.add_argument("path", help=", ".join(s.patch_path for s in patched))
    p.add_argument("--profile", help="profile name to pin (default: chosen per run from the model trained)")
    p.add_argument("--trainer", default="auto",
                   help="auto (default), " + ", ".join(s.name for s in patched[:-1]) + f" or {patched[-1].name}")
    p.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    p.add_argument("--replan", action="store_true", help="accept patched files that changed since (e.g. after git pull)")
    env = p.add_argument_group(
        "the trainer's environment",
        "te-align's hooks run in the trainer's Python, so patch installs te-align there (the trainer's venv/ or .venv/, "
        "or --python) without changing any package the trainer has; unpatch removes it again",
    )
    env.add_argument("--python", metavar="PATH", help="the trainer's python executable or environment folder "
                     "(default: venv/ or .venv/ in the trainer's folder)")
    env.add_argument("--no-install", action="store_true",
                     help="patch the files only; you make te-align importable by the trainer's Python yourself "
                          "(also: TE_ALIGN_NO_INSTALL=1)")
    env.add_argument("--find-links", metavar="DIR", action="append", default=[],
                     help="passed to pip: wheels of te-align's requirements for an offline install (repeatable)")
    env.add_argument("--no-index", action="store_true", help="passed to pip: do not use a package index")
    p.set_defaults(func=cmd_patch)

    u = sub.add_parser("unpatch", help="restore the original files byte for byte")
    u.add_argument("path")
    u.add_argument("--keep-changed", action="store_true", help="leave files that changed since patching as they are")
    u.set_defaults(func=cmd_unpatch)

    s = sub.add_parser("status", help="what te-align patched in a trainer folder, and whether it changed since")
    s.add_argument("path")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)


def cmd_patch(args: argparse.Namespace) -> int:
    if args.profile:
        args.profile = profile(args.profile).name  # validate early; aliases resolve
    det = _patch_trainers.detect(args.path, args.trainer)
    with _transaction.lock(det.root):  # plan and apply as one step: a second te-align waits or refuses
        recovered = _transaction.recover(det.root)
        if recovered:
            print(recovered)
        plan = _patch_trainers.plan_for(det, args.profile)
        env_plan = None
        if not (args.no_install or _environment.no_install_default()):
            exe = _environment.find_python([args.path, det.root], args.python)
            previous = (_transaction.read_manifest(det.root) or {}).get("environment")
            options = _environment.PipOptions(tuple(args.find_links), args.no_index)
            env_plan = _environment.plan_environment(exe, previous, options)
        # Nothing to do (the files as planned, and an environment that needs nothing): one line, no plan listed.
        if _patching.apply(plan, replan=args.replan, dry_run=True).noop and (
                env_plan is None or (env_plan.noop and env_plan.previous is not None)):
            print(f"{det.trainer} at {det.root}: already patched with this plan: nothing to do")
            if env_plan is not None:
                print(env_plan.one_line())
            return 0
        print(f"{det.trainer} ({det.layout}, version {det.version}) at {det.root}")
        for note in det.notes:
            print(f"  note: {note}")
        for line in plan.describe()[1:]:
            print(line)
        if env_plan is not None:
            for line in env_plan.describe():
                print(line)
        env_lines: list[str] = []

        def prepare() -> dict[str, Any]:
            assert env_plan is not None
            done = _environment.install(det.root, env_plan)
            env_lines.extend(done.lines)
            return done.record

        result = _patching.apply(plan, replan=args.replan, dry_run=args.dry_run,
                                 prepare_environment=prepare if env_plan is not None else None)
    for line in env_lines:
        print(line)
    if args.dry_run:
        print("dry run: nothing changed")
    elif result.noop:
        print("already patched with this plan: nothing to do")
    else:
        print(f"patched {len(result.written)} file(s); undo with: te-align unpatch {args.path}")
    return 0


def cmd_unpatch(args: argparse.Namespace) -> int:
    root = _patch_trainers.patched_root(args.path)
    result = _transaction.revert_report(root, keep_changed=args.keep_changed)
    if result.recovered:
        print(result.recovered)
    print(f"restored {len(result.restored)} file(s) in {root}")
    for line in result.environment:
        print(line)
    for path, why in result.kept:
        print(f"  kept {path} ({why})")
    if result.kept:
        print("te-align no longer tracks the kept files: delete them yourself when you no longer need them")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    root = _patch_trainers.patched_root(args.path)
    st = _patching.status(root)
    record = (st.manifest or {}).get("environment")
    env = _environment.env_status(record) if record else None
    if args.json:
        print(json.dumps({
            "root": str(root), "patched": st.patched, "recovered": st.recovered, "manifest": st.manifest,
            "files": [{"path": f.path, "state": f.state, "detail": f.detail} for f in st.files],
            "environment": env,
        }, indent=2))
        return 0
    if st.recovered:
        print(st.recovered)
    if not st.patched:
        print(f"{root}: not patched by te-align")
        return 0
    m = st.manifest or {}
    print(
        f"{root}: patched by te-align {m.get('te_align_version')} for {m.get('trainer')} {m.get('trainer_version')}"
        f" at {m.get('patched_at')}, profile {m.get('profile') or 'per run'}"
    )
    for f in st.files:
        print(f"  {f.state:<8} {f.path}" + (f"  ({f.detail})" if f.detail else ""))
    if env is None:
        print("environment: not managed by te-align (patched with --no-install)")
    else:
        have = env["te_align_installed"]
        state = ("missing: the python no longer exists" if not env["exists"] else
                 f"te-align {have} installed" + (" (matches this te-align)" if env["matches"] else
                                                  f" (this te-align is {__version__}: run te-align patch {args.path})")
                 if have else "te-align is NOT installed in it" + (
                     f" (te-align {env['te_align_visible']} is visible from outside it)" if env["te_align_visible"] else "")
                 + f": run te-align patch {args.path}")
        added = ", ".join(f"{n} {v}" for n, v in sorted(env["added"].items())) or "none"
        print(f"environment: {env['python']}: {state}; added packages: {added}")
    if env is not None and not env["matches"]:
        return 1
    if st.changed:
        print(f"some patched files changed since; re-plan with: te-align patch {args.path} --replan")
        return 1
    return 0
