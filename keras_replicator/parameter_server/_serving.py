"""Serving on `worker` and `ps` tasks: start the gRPC server and block until the end.

Under parameter-server training only the chief runs the user's training code; the
workers execute the functions the chief's `ClusterCoordinator` schedules and the
parameter servers hold the variables. The same script runs on every task, so
constructing the strategy on a worker or ps task must serve instead of returning.

How such a task ends: `tf.distribute.Server.join()` never returns, and it blocks in
C++ where Python signal handlers cannot run. So the task sleeps in Python instead,
and exits 0 on SIGTERM or SIGINT: that is how `keras-replicator launch` ends the
serving tasks once the chief has exited (the chief's exit code is the job's). Under
another scheduler (a Kubernetes TFJob), the scheduler stops them the same way.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import tensorflow as tf

from keras_replicator._worker.watchdog import exit_with_launcher

SERVING_TASKS = ("worker", "ps")


def serve_forever(cluster_resolver) -> None:
    """Runs this task's server until SIGTERM / SIGINT, then exits the process with 0."""
    task_type, task_id = cluster_resolver.task_type, int(cluster_resolver.task_id)
    server = tf.distribute.Server(
        cluster_resolver.cluster_spec(),
        job_name=task_type,
        task_index=task_id,
        protocol=cluster_resolver.rpc_layer or "grpc",
        start=True,
    )
    del server  # Kept alive by TensorFlow until the process exits.

    def finish(signum, frame):
        print(
            f"keras_replicator: {task_type} {task_id} stopped serving "
            f"({signal.Signals(signum).name}); exiting with 0.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(0)  # TF's server threads cannot be joined; skip atexit hooks.

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    # If the launcher is SIGKILLed this task would serve forever on all
    # interfaces: the watchdog SIGTERMs this process (-> `finish`, exit 0) once it
    # is gone. Outside `keras-replicator launch` it does nothing.
    exit_with_launcher()
    print(
        f"keras_replicator: {task_type} {task_id} is serving for the chief's "
        "ClusterCoordinator; it blocks until the job ends.",
        file=sys.stderr,
        flush=True,
    )
    while True:
        time.sleep(3600)
