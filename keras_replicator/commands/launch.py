"""`keras-replicator launch [-n N] [options] -- python train.py args...`.

The command form of `keras_replicator.launch.launch()`: every flag is a keyword of
that function. Exit code: 0 when every worker succeeded (or all were preempted
and backed up at one step, with no restart left: a note says so); else the exit code of
the worker that failed first (128 + N when a signal N ended it), 124 on
`--timeout`, 2 for invalid options, 129 / 130 / 143 when the launcher itself got
SIGHUP / SIGINT / SIGTERM (the workers are stopped first: SIGTERM, then SIGKILL
after `--grace-seconds`; a second signal cannot cut that short).
"""

from __future__ import annotations

import argparse
import sys

from keras_replicator._environment import DATA_SERVICE
from keras_replicator.launch import LaunchOptions
from keras_replicator.launch._launcher import launch_with_options
from keras_replicator.launch._options import (
    CLUSTER_MODES,
    parse_gpus_per_worker,
    parse_ports,
)
from keras_replicator.launch._output import note
from keras_replicator.launch._signals import StopSignal, stop_on_signals

EXIT_TIMEOUT = 124
EXIT_USAGE = 2


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "launch",
        help="run a script as the workers of one cluster (local, TF_CONFIG, Slurm)",
        description=(
            "Starts N copies of the command on 127.0.0.1 with a TF_CONFIG each "
            "(or, under a scheduler's TF_CONFIG or `srun`, this task's worker), "
            "prefixes their output with the worker index, stops all of them when "
            "one fails and, with --max-restarts, restarts the group so training "
            "resumes from the last BackupAndRestore backup."
        ),
        epilog="example: keras-replicator launch -n 2 --max-restarts 1 -- "
        "python train.py --epochs 5",
    )
    parser.add_argument(
        "-n",
        "--num-workers",
        type=int,
        default=None,
        help="worker processes on this machine (required outside a cluster)",
    )
    parser.add_argument(
        "--ps",
        type=int,
        default=0,
        dest="num_ps",
        help="parameter servers: run a chief, N workers and K ps for "
        "ParameterServerReplicator (asynchronous training; default 0)",
    )
    parser.add_argument(
        "--cluster",
        choices=CLUSTER_MODES,
        default="auto",
        help="where the workers are (default: auto = TF_CONFIG, Slurm, else local)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart the whole group up to K times after a failure or a "
        "preemption (default 0)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds for all runs together"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address local workers advertise (default 127.0.0.1; IPv6 such as "
        "::1 is written bracketed, [::1]:PORT)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow addresses other machines can reach (TF's gRPC has no auth)",
    )
    parser.add_argument(
        "--ports", default=None, help="comma-separated port per local worker"
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=8888,
        help="first port per node in Slurm mode (default 8888)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when stopping workers",
    )
    parser.add_argument(
        "--resize-grace-seconds",
        type=float,
        default=60.0,
        help="seconds the workers get to back up and exit when an elastic launch "
        "resizes (SIGTERM, then SIGKILL; default 60)",
    )
    parser.add_argument(
        "--data-service-workers",
        type=int,
        default=0,
        help="also start a tf.data service dispatcher and N service workers on "
        f"127.0.0.1; the workers get its address as {DATA_SERVICE} "
        "(default 0)",
    )
    parser.add_argument(
        "--min-workers",
        type=int,
        default=None,
        help="elastic: go on with as few as M workers (-n is the most) when "
        "slots are lost; needs --discover (default: -n)",
    )
    parser.add_argument(
        "--discover",
        default=None,
        metavar="CMD",
        help="elastic: a shell command printing one line per worker slot that "
        "can run now; the group shrinks after a failure and is resized (SIGTERM: "
        "a backup at an agreed step) when the slots change",
    )
    parser.add_argument(
        "--discover-seconds",
        type=float,
        default=5.0,
        help="seconds between two runs of --discover (default 5)",
    )
    parser.add_argument(
        "--gpus-per-worker",
        default=None,
        metavar="K",
        help="GPUs each local worker sees through its own CUDA_VISIBLE_DEVICES "
        "(0: none, 'all': every GPU, unpinned); default: the visible GPUs "
        "(CUDA_VISIBLE_DEVICES, else nvidia-smi) split evenly",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print each worker's TF_CONFIG (and CUDA_VISIBLE_DEVICES) and "
        "start nothing",
    )
    parser.add_argument("program", nargs=argparse.REMAINDER)
    parser.set_defaults(command=run)
    return parser


def run(args) -> int:
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _say(
            "give the program after `--`, e.g. "
            "`keras-replicator launch -n 2 -- python train.py`."
        )
        return EXIT_USAGE
    try:
        options = LaunchOptions(
            num_workers=args.num_workers,
            num_ps=args.num_ps,
            cluster=args.cluster,
            max_restarts=args.max_restarts,
            timeout=args.timeout,
            host=args.host,
            allow_remote=args.allow_remote,
            ports=parse_ports(args.ports),
            port_base=args.port_base,
            grace_seconds=args.grace_seconds,
            resize_grace_seconds=args.resize_grace_seconds,
            dry_run=args.dry_run,
            data_service_workers=args.data_service_workers,
            min_workers=args.min_workers,
            discover=args.discover,
            discover_seconds=args.discover_seconds,
            gpus_per_worker=parse_gpus_per_worker(args.gpus_per_worker),
        )
    except (TypeError, ValueError) as error:
        _say(f"error: {error}")
        return EXIT_USAGE
    try:
        with stop_on_signals():
            result = launch_with_options(command, options)
    except (TypeError, ValueError) as error:
        _say(f"error: {error}")
        return EXIT_USAGE
    except StopSignal as stop:
        _say(f"{stop}; the workers were stopped.")
        return stop.exit_code
    except KeyboardInterrupt:  # outside the main thread
        _say("interrupted; the workers were stopped.")
        return 130
    if args.dry_run:
        return 0
    if result.preempted:
        _say(f"{result.headline()}.")
        return 0
    if result.ok:
        if result.restarts or result.resizes:
            resizes = f" and {result.resizes} resize(s)" if result.resizes else ""
            _say(
                f"all {len(result.workers)} workers succeeded after "
                f"{result.restarts} restart(s){resizes}, "
                f"{result.total_seconds:.1f} s in all."
            )
        return 0
    return _report_failure(result)


def _report_failure(result) -> int:
    failure = result.first_failure
    detail = failure.traceback if failure is not None else ""
    if not detail and failure is not None:
        detail = "\n".join(failure.output.rstrip().splitlines()[-20:])
    restarts = f" (after {result.restarts} restart(s))" if result.restarts else ""
    _say(f"{result.headline()}{restarts}.")
    if detail:
        try:
            print(f"--- {failure.name}, last output ---\n{detail}", file=sys.stderr)
        except (OSError, ValueError):
            pass
    if result.timed_out:
        return EXIT_TIMEOUT
    code = failure.returncode if failure is not None else None
    if code is None or code == 0:
        return 1
    return 128 - code if code < 0 else code


def _say(message: str) -> None:
    note(message)
