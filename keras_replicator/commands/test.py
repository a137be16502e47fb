"""`keras-replicator test`: the strategy conformance suite as a table.

Every factory runs by default, the GPU ones too, so one command gives a user with
GPUs the table on their machine. Without the GPUs a factory needs, its column says
"n/a" and why; that fails the command only when the factory was asked for by name
(`--factories`), since then nothing the user asked for was checked.
"""

from __future__ import annotations

import argparse
import sys

from keras_replicator.testing import (
    CHECK_NAMES,
    FACTORIES,
    LAYOUT_CHECK_NAMES,
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
    gpu = [name for name, factory in FACTORIES.items() if factory.gpus]
    parser.add_argument(
        "--factories",
        default=None,
        help=f"comma-separated factory names (default: all: {', '.join(FACTORIES)}; "
        f"the GPU factories {', '.join(gpu)} report 'n/a' on a machine without "
        "enough GPUs)",
    )
    parser.add_argument(
        "--checks",
        default=None,
        help=f"comma-separated check names (default: all {len(CHECK_NAMES)} "
        "checks, and the layout checks on the layout factories: "
        f"{', '.join(LAYOUT_CHECK_NAMES)})",
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
    named = args.factories is not None
    factories = [f for f in (args.factories or ",".join(FACTORIES)).split(",") if f]
    checks = [c for c in args.checks.split(",") if c] if args.checks else None
    rows = []
    for name in factories:
        isolate = args.isolate_stock and FACTORIES[name].stock
        rows += run_conformance(
            [name], checks, isolate=isolate, timeout=args.timeout, echo=args.verbose
        )
        own = [r for r in rows if r.factory == name]
        missing = [r for r in own if not r.available]
        if missing:
            summary = f"{missing[0].detail}; its checks did not run"
        else:
            summary = f"{sum(r.passed for r in own)}/{len(own)} checks pass"
        print(f"{name}: {summary}", file=sys.stderr)
    print(format_table(rows))
    failed = [row for row in rows if _fails_the_command(row, named)]
    for row in failed:
        print(f"FAILED {row.factory} {row.check}: {row.detail}", file=sys.stderr)
    return 1 if failed else 0


def _fails_the_command(row, named: bool) -> bool:
    if not row.available:
        return named  # asked for by name, and nothing was checked
    return not row.passed and not FACTORIES[row.factory].stock


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="keras-replicator")
    add_parser(parser.add_subparsers())
    return run(parser.parse_args(["test", *(argv or sys.argv[1:])]))


if __name__ == "__main__":
    sys.exit(main())
