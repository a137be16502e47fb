"""`keras-replicator launch -n N -- python train.py`: N workers on this machine."""

from __future__ import annotations

import argparse
import sys

from keras_replicator.launch import run_workers


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "launch",
        help="run a script as N workers of one cluster on 127.0.0.1",
        description=(
            "Starts N copies of the command with a TF_CONFIG each (free ports on "
            "127.0.0.1), prefixes their output with the worker index and stops all "
            "of them when one fails."
        ),
    )
    parser.add_argument("-n", "--num-workers", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    parser.set_defaults(command=run)
    return parser


def run(args) -> int:
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "keras-replicator launch: give the program after `--`, e.g. "
            "`keras-replicator launch -n 2 -- python train.py`.",
            file=sys.stderr,
        )
        return 2
    result = run_workers(command, args.num_workers, timeout=args.timeout)
    if not result.ok:
        print(result.describe_failure(), file=sys.stderr)
        failure = result.first_failure
        return (failure.returncode if failure and failure.returncode else 1) or 1
    return 0
