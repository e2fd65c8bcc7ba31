"""Command line: ``python -m fsm <command> ...``.

Each command lives in ``fsm/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int`` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = ("classify", "demo", "fault-server", "rpc", "chat", "diagrams", "audit", "simulate")


def _module(name: str):
    return importlib.import_module("fsm.commands." + name.replace("-", "_"))


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command; returns the exit status.

    A command that needs an extra that is not installed exits with status 2 and the
    ``pip install 'retry-fsm[EXTRA]'`` line on stderr (:mod:`fsm._extras`).
    """
    from fsm._extras import MissingExtraError
    from fsm._version import __version__

    prog = "retry-fsm" if os.path.basename(sys.argv[0]) == "retry-fsm" else "python -m fsm"
    parser = argparse.ArgumentParser(prog=prog, description="retry-fsm command line")
    parser.add_argument("--version", action="version", version=f"retry-fsm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        mod = _module(name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except MissingExtraError as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
