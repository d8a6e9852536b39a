"""``te-align patch | unpatch | status``: on-disk patching of trainer installations."""

from __future__ import annotations

import argparse
import json

from te_align._lazy import lazy_module
from te_align.profiles import profile
from te_align.trainers import specs

# Lazy: what only one command needs, loaded when it runs (the CLI's other commands stay cold).
_patching = lazy_module("te_align.patching")
_patch_trainers = lazy_module("te_align.patching.trainers")
_transaction = lazy_module("te_align.patching.transaction")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patch", help="install te-align's drop-in scripts into a trainer folder (a transaction)")
    patched = [s for s in specs() if s.patch]
    p.add_argument("path", help=", ".join(s.patch_path for s in patched))
    p.add_argument("--profile", help="profile name to pin (default: chosen per run from the model trained)")
    p.add_argument("--trainer", default="auto",
                   help="auto (default), " + ", ".join(s.name for s in patched[:-1]) + f" or {patched[-1].name}")
    p.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    p.add_argument("--replan", action="store_true", help="accept patched files that changed since (e.g. after git pull)")
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
        print(f"{det.trainer} ({det.layout}, version {det.version}) at {det.root}")
        for note in det.notes:
            print(f"  note: {note}")
        for line in plan.describe()[1:]:
            print(line)
        result = _patching.apply(plan, replan=args.replan, dry_run=args.dry_run)
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
    for path, why in result.kept:
        print(f"  kept {path} ({why})")
    if result.kept:
        print("te-align no longer tracks the kept files: delete them yourself when you no longer need them")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    root = _patch_trainers.patched_root(args.path)
    st = _patching.status(root)
    if args.json:
        print(json.dumps({
            "root": str(root), "patched": st.patched, "recovered": st.recovered, "manifest": st.manifest,
            "files": [{"path": f.path, "state": f.state, "detail": f.detail} for f in st.files],
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
    if st.changed:
        print(f"some patched files changed since; re-plan with: te-align patch {args.path} --replan")
        return 1
    return 0
