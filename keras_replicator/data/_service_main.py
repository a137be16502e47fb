"""One tf.data service task in a process of its own (started by the launcher).

    python -m keras_replicator.data._service_main dispatcher --port P
    python -m keras_replicator.data._service_main worker --port Q --dispatcher-port P

`keras-replicator launch --data-service-workers N` starts one dispatcher and N
workers this way, beside the training workers. There is no host argument: the
dispatcher is reached at, and the worker advertises, `127.0.0.1` only.

How a task ends is the parameter-server serving tasks' way
(`parameter_server/_serving.py`): TF's servers block in C++ where Python signal
handlers cannot run, so the task sleeps in Python and exits 0 on SIGTERM or
SIGINT, which is how the launcher stops it once training is done; and it calls
`exit_with_launcher()` so that it never outlives a launcher that was SIGKILLed.
A worker that cannot reach its dispatcher keeps retrying (TF's behaviour) until
the launcher stops it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_replicator._worker.watchdog import exit_with_launcher  # noqa: E402
from keras_replicator.data.service import LOOPBACK  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=("dispatcher", "worker"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dispatcher-port", type=int, default=None)
    args = parser.parse_args(argv)
    if args.kind == "worker" and args.dispatcher_port is None:
        parser.error("a worker needs --dispatcher-port")
    label = "data dispatcher" if args.kind == "dispatcher" else "data worker"

    def finish(signum, frame):
        print(
            f"keras_replicator: {label} stopped ({signal.Signals(signum).name}); "
            "exiting with 0.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(0)  # TF's server threads cannot be joined; skip atexit hooks.

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    exit_with_launcher()

    import tensorflow as tf

    api = tf.data.experimental.service
    if args.kind == "dispatcher":
        server = api.DispatchServer(api.DispatcherConfig(port=args.port))
    else:
        server = api.WorkerServer(
            api.WorkerConfig(
                dispatcher_address=f"{LOOPBACK}:{args.dispatcher_port}",
                worker_address=f"{LOOPBACK}:%port%",
                port=args.port,
            )
        )
    print(
        f"keras_replicator: {label} serving on {LOOPBACK}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    while server is not None:  # the reference keeps it serving (`__del__` stops it)
        time.sleep(3600)


if __name__ == "__main__":
    main()
