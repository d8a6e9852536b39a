"""The ``te-align`` command: thin argument parsing over library calls.

Each command group lives in ``te_align/commands/<name>.py`` with ``register(subparsers)``; this file
only wires them up and turns user errors into one-line messages (``--debug`` shows tracebacks).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from te_align._extras import MissingExtra
from te_align._version import __version__
from te_align.errors import TeAlignError

#: Command modules under te_align.commands, in --help order.
COMMAND_MODULES = ("profile", "cache", "inspect", "patch", "train", "swap", "check", "probe", "ab", "comfyui")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="te-align",
        description="Align diffusion-model training with the text conditioning each model was trained with.",
    )
    parser.add_argument("--version", action="version", version=f"te-align {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"te_align.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):  # no command: the list of commands, and exit 2 as for any missing argument
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TeAlignError as e:
        if args.debug:
            raise
        if isinstance(e, MissingExtra):  # said of the command the user ran, with the extra that command needs
            e = e.said_of(f"te-align {args.command}", args.command)
        print(f"te-align: error: {e}", file=sys.stderr)
        return e.exit_code
    except ModuleNotFoundError as e:  # a library of an extra that is not installed: the pip install, in one line
        from te_align._extras import missing_extra

        err = missing_extra(e, args.command, f"te-align {args.command}")
        if err is None or args.debug:
            raise
        print(f"te-align: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("te-align: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
