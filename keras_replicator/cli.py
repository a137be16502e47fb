"""The `keras-replicator` console script: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import sys

from keras_replicator.commands import demo, env, launch, test


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-replicator",
        description="Distributed Keras 3 training that is correct, fast and boring.",
    )
    subparsers = parser.add_subparsers(metavar="COMMAND")
    for module in (demo, env, launch, test):
        module.add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "command") or not callable(args.command):
        parser.print_help()
        return 2
    return args.command(args)


if __name__ == "__main__":
    sys.exit(main())
