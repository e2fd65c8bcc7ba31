"""``python -m fsm diagrams``: write the lifecycle diagrams generated from the declaration.

Writes ``retry_lifecycle.dot``, ``.mmd``, ``.md`` (byte-stable) and ``.svg`` (Graphviz) into
``--out``. ``--check`` writes nothing and exits 1 when the committed text files differ from
the declaration.
"""

from __future__ import annotations

import argparse
import sys

HELP = "write the lifecycle diagrams (DOT, SVG, Mermaid, Markdown table) from the declaration"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="diagrams", metavar="DIR",
                   help="folder to write into (default: diagrams)")
    p.add_argument("--no-svg", action="store_true",
                   help="skip the SVG (which needs Graphviz's dot program)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the .dot/.mmd/.md files in DIR are stale")


def run(args: argparse.Namespace) -> int:
    from .. import diagrams

    if args.check:
        stale = diagrams.check(args.out)
        if stale:
            print(f"stale diagrams in {args.out}: {', '.join(stale)}; they no longer match "
                  "fsm/lifecycle.py: run 'make diagrams' (python -m fsm diagrams) and commit "
                  "the result", file=sys.stderr)
            return 1
        print(f"diagrams in {args.out} match the declaration")
        return 0
    try:
        for path in diagrams.write_all(args.out, svg=not args.no_svg):
            print(f"wrote {path}")
    except diagrams.DiagramError as exc:
        print(f"error: {exc} (the .dot, .mmd and .md files were written; --no-svg skips the "
              "SVG)", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write the diagrams into {args.out}: {exc}", file=sys.stderr)
        return 2
    return 0
