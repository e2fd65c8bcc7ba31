"""``python -m fsm diagrams``: write the lifecycle diagrams generated from the declaration.

Writes into ``--out``: the review diagram ``retry_lifecycle_review.dot``, ``.mmd`` and
``.svg`` (its legend card states the policy drawn: the default settings, or ``--settings
FILE``, a team's settings file); one small diagram per state, ``states/<state>.dot`` and
``.svg``; the table ``retry_lifecycle.md``; the declaration as ``retry_lifecycle.json``. Every
file but the SVGs is byte-stable. ``--check`` writes nothing and exits 1 when the committed
text files differ from the declaration (drawn with the default settings).

``--diff OLD.json`` / ``--diff-ref GIT_REF`` write the changes since that version instead:
``retry_lifecycle_diff.svg`` (the review diagram with the changes marked), ``.dot`` and
``.md`` (a table and Mermaid to paste in a pull request), into ``--out`` (default
``build/diagrams-diff``).
"""

from __future__ import annotations

import argparse
import sys

HELP = "write the lifecycle diagrams (review and one per state; DOT, SVG, Mermaid, JSON) or a diff"
DIFF_OUT = "build/diagrams-diff"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"folder to write into (default: diagrams; with --diff: {DIFF_OUT})")
    p.add_argument("--settings", metavar="FILE", default=None,
                   help="draw the policy of this settings file ({\"retry\": {...}}) in the review "
                        "diagram's legend card (default: the default settings)")
    p.add_argument("--no-svg", action="store_true",
                   help="skip the SVG (which needs Graphviz's dot program)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 if the text files in DIR are stale")
    mode.add_argument("--diff", metavar="OLD.json", default=None,
                      help="draw the changes since the declaration in OLD.json (a "
                           "retry_lifecycle.json written by this command)")
    mode.add_argument("--diff-ref", metavar="GIT_REF", default=None,
                      help="draw the changes since the declaration at that git revision "
                           "(its diagrams/retry_lifecycle.json)")


def run(args: argparse.Namespace) -> int:
    from fsm.review import diagrams

    if args.diff is not None or args.diff_ref is not None:
        return _diff(args)
    out = args.out or "diagrams"
    settings, source = None, "the defaults"
    if args.settings is not None:
        if args.check:
            print("error: --check compares the committed diagrams, drawn with the default "
                  "settings; leave out --settings", file=sys.stderr)
            return 2
        from fsm.commands.common import load_settings
        from fsm.core.settings import SettingsError

        try:
            settings = load_settings(args.settings, prog="fsm diagrams")
        except (SettingsError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        source = f"settings file {args.settings}"
    if args.check:
        stale = diagrams.check(out)
        if stale:
            print(f"stale diagrams in {out}: {', '.join(stale)}; they no longer match "
                  "fsm/core/lifecycle.py: run 'make diagrams' (python -m fsm diagrams) and commit "
                  "the result", file=sys.stderr)
            return 1
        print(f"diagrams in {out} match the declaration")
        return 0
    try:
        for path in diagrams.write_all(out, svg=not args.no_svg, settings=settings,
                                       source=source):
            print(f"wrote {path}")
    except diagrams.DiagramError as exc:
        print(f"error: {exc} (the text files were written; --no-svg skips the SVG)",
              file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write the diagrams into {out}: {exc}", file=sys.stderr)
        return 2
    return 0


def _diff(args: argparse.Namespace) -> int:
    from fsm.review import diagrams
    from fsm.review import diagrams_diff as DD

    out = args.out or DIFF_OUT
    try:
        if args.diff is not None:
            from fsm.commands.common import check_input_file
            try:  # a FIFO or /dev/zero is refused at once
                check_input_file(args.diff, what="--diff")
            except ValueError as exc:
                raise DD.DiffError(str(exc)) from None
            old, old_name = DD.load_file(args.diff), args.diff
        else:
            old, old_name = DD.load_ref(args.diff_ref), args.diff_ref
    except DD.DiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    new = DD.current()
    result = DD.compare(old, new, old_name=old_name, new_name="working tree")
    try:
        written = DD.write(result, diagrams.extract(new), out, svg=not args.no_svg)
    except diagrams.DiagramError as exc:
        print(f"error: {exc} (the .md and .dot files were written; --no-svg skips the SVG)",
              file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write the diff into {out}: {exc}", file=sys.stderr)
        return 2
    print(f"changes from {old_name} to the working tree: {result.summary()}")
    for path in written:
        print(f"wrote {path}")
    return 0
