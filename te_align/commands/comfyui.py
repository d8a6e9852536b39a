"""``te-align comfyui install | uninstall | status PATH``: te-align's nodes in a ComfyUI checkout (a transaction)."""

from __future__ import annotations

import argparse

from te_align._lazy import lazy_module

# Lazy: what only one command needs, loaded when it runs (the CLI's other commands stay cold).
_install = lazy_module("te_align.integrations.comfyui.install")
_transaction = lazy_module("te_align.patching.transaction")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("comfyui", help="install te-align's ComfyUI nodes (te-align Text Encode, Empty Negative)")
    s = p.add_subparsers(dest="comfyui_command", metavar="COMMAND", required=True)
    i = s.add_parser("install", help="write custom_nodes/te-align into a ComfyUI checkout (a transaction)")
    i.add_argument("path", help="the ComfyUI folder (holds main.py and custom_nodes/)")
    i.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    i.set_defaults(func=cmd_install)
    u = s.add_parser("uninstall", help="restore the ComfyUI checkout byte for byte")
    u.add_argument("path")
    u.set_defaults(func=cmd_uninstall)
    st = s.add_parser("status", help="whether te-align's nodes are installed, and intact")
    st.add_argument("path")
    st.set_defaults(func=cmd_status)


def cmd_install(args: argparse.Namespace) -> int:
    pl = _install.plan(args.path)
    print(f"ComfyUI {pl.trainer_version} at {pl.root}")
    for line in pl.describe()[1:]:
        print(line)
    result = _transaction.apply(pl, dry_run=args.dry_run)
    if result.recovered:
        print(result.recovered)
    if args.dry_run:
        print("dry run: nothing changed")
    elif result.noop:
        print("already installed: nothing to do")
    else:
        print("installed; restart ComfyUI, then add 'te-align Text Encode' (conditioning/te-align). "
              f"te-align must be importable by ComfyUI's Python. Undo with: te-align comfyui uninstall {args.path}")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    root = _install.comfyui_root(args.path)
    manifest = _transaction.read_manifest(root)
    if manifest is None or manifest.get("trainer") not in (None, "comfyui"):
        raise _transaction.PatchError(f"te-align's nodes are not installed in {root}: nothing to undo")
    result = _transaction.revert_report(root)
    if result.recovered:
        print(result.recovered)
    print(f"restored {len(result.restored)} file(s) in {root}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = _transaction.status(_install.comfyui_root(args.path))
    if st.recovered:
        print(st.recovered)
    if not st.patched:
        print(f"te-align's nodes are not installed in {st.root}")
        return 1
    for f in st.files:
        print(f"  {f.state:<8} {f.path}" + (f"  ({f.detail})" if f.detail else ""))
    return 0 if not st.changed else 1
