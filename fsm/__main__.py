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
    prog = "retry-fsm" if os.path.basename(sys.argv[0]) == "retry-fsm" else "python -m fsm"
    parser = argparse.ArgumentParser(prog=prog, description="retry-fsm command line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        mod = _module(name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
