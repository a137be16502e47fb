"""`keras-replicator test`: the strategy conformance suite as a table."""

from __future__ import annotations

import argparse
import sys

from keras_replicator.testing import (
    CHECK_NAMES,
    FACTORIES,
    format_table,
    run_conformance,
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "test",
        help="run the strategy conformance suite",
        description=(
            "Runs every conformance check on each strategy factory (ours and stock "
            "TensorFlow's for comparison) and prints a Markdown table."
        ),
    )
    parser.add_argument(
        "--factories",
        default=",".join(FACTORIES),
        help="comma-separated factory names (default: all: %(default)s)",
    )
    parser.add_argument(
        "--checks",
        default=",".join(CHECK_NAMES),
        help="comma-separated check names (default: all)",
    )
    parser.add_argument(
        "--isolate-stock",
        action="store_true",
        help="run each check on a stock strategy in its own processes, so one "
        "stock failure cannot disturb the next check",
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--verbose", action="store_true", help="show worker output")
    parser.set_defaults(command=run)
    return parser


def run(args) -> int:
    factories = [f for f in args.factories.split(",") if f]
    checks = [c for c in args.checks.split(",") if c]
    rows = []
    for name in factories:
        isolate = args.isolate_stock and FACTORIES[name].stock
        rows += run_conformance(
            [name], checks, isolate=isolate, timeout=args.timeout, echo=args.verbose
        )
        print(
            f"{name}: {sum(r.passed for r in rows if r.factory == name)}/"
            f"{len(checks)} checks pass",
            file=sys.stderr,
        )
    print(format_table(rows))
    ours_failed = [r for r in rows if not r.passed and not FACTORIES[r.factory].stock]
    for row in ours_failed:
        print(f"FAILED {row.factory} {row.check}: {row.detail}", file=sys.stderr)
    return 1 if ours_failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="keras-replicator")
    add_parser(parser.add_subparsers())
    return run(parser.parse_args(["test", *(argv or sys.argv[1:])]))


if __name__ == "__main__":
    sys.exit(main())
