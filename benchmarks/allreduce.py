"""Gradient all-reduce speed: stock packings vs `kr.AllReduceOptions`, vs a raw socket.

The gradient set has the shapes of Keras' ResNet-50 trainable weights (214 tensors,
25.6M float32 values, 102 MB). Between N worker processes on 127.0.0.1 (started by
`keras_replicator.launch.run_workers`, one `MultiWorkerReplicator` each) it times,
interleaved round by round (median over rounds):

* `raw socket`: the same processes exchange the bytes a ring all-reduce moves
  (2(N-1)/N of the buffer out to the right neighbour and in from the left) over
  plain loopback TCP, with no arithmetic: the transport's ceiling on this machine;
* `stock per-tensor`: one `ReplicaContext.all_reduce` per tensor;
* `stock 1 pack`: the whole list in one call (TensorFlow's default);
* `stock pack=XMB`: one call with `CommunicationOptions(bytes_per_pack=X MB)`;
* `ours default`: `_all_reduce.all_reduce_sum` with `kr.AllReduceOptions()`
  on a `MultiWorkerReplicator` built with the defaults (which picks the socket
  ring for CPU workers, checked);
* `collective ...`: the same with `transport="collective"` (TensorFlow's
  collectives) and each bucket size / compression;
* `ours local_then_global g=2` / `ours 2d g=2`: the hierarchical schemes with
  rows of 2 workers (one row on 2 workers, a 2 x 2 grid on 4);
* `socket ...`: the same with `transport="socket"` (our TCP ring).

`--devices N` instead times, in one process with N logical CPUs, a flat
all-reduce against both hierarchies with rows of N/2 devices (and a memcpy of
the bytes for scale).

Reports time, effective rate (float32 bytes / time), bus bandwidth
(2(N-1)/N x bytes / time, NCCL's convention) and the effective rate / socket rate.

`--fit` then measures Keras `fit` of a 6.3M-parameter MLP (784-2048-2048-256-10,
25 MB of gradients a step, global batch 256) on 2 worker processes (1 intra-op
thread each) and of ResNet-20 (`--fit-model resnet20` or `both`: 0.27M parameters,
compute-bound) against one process with 2 threads, and against two processes that
train on half the batch each at the same time with no communication at all (the
ceiling of any transport on these cores), for stock
packing (our strategy with `bucket_mb=0`: one pack, as stock; stock
`MultiWorkerMirroredStrategy` itself cannot run Keras 3 `fit`, keras-team/keras#20585)
and our strategy per option. Steady state only: the
median time of steps 10..N of a `fit` call (a callback timestamps every batch);
the time to the first step (tracing, setup) is reported separately. Each
configuration is a fresh process group; configurations alternate over `--rounds`.

    python -m benchmarks.allreduce [--workers 2 4] [--rounds 5] [--fit]
    python -m benchmarks.allreduce --devices 4
    python -m benchmarks.allreduce --fit-only --fit-model resnet20
    python -m benchmarks.allreduce --timeline benchmarks/allreduce_timeline.png
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness
from benchmarks._allreduce_common import MODULE
from benchmarks._allreduce_devices import devices_worker
from benchmarks._allreduce_fit import fit_benchmark, fit_worker
from benchmarks._allreduce_raw import plot, report, worker
from benchmarks._allreduce_timeline import timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--png", default="benchmarks/allreduce.png")
    parser.add_argument("--only", default=None, help="regex of method names")
    parser.add_argument("--fit", action="store_true")
    parser.add_argument("--fit-rounds", type=int, default=2)
    parser.add_argument("--fit-only", action="store_true", help="skip the all-reduce")
    parser.add_argument(
        "--fit-model", choices=["mlp", "resnet20", "both"], default="mlp"
    )
    parser.add_argument(
        "--devices", type=int, default=0, help="only: N logical CPUs, one process"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fit-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inter-op", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--timeline",
        default=None,
        metavar="PNG",
        help="only: when the fit step's buckets travel (1 MB vs one pack), + PNG",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.fit_worker is not None:
        fit_worker(
            args.fit_worker,
            trace=args.trace,
            inter_op=args.inter_op,
            model_name=args.fit_model,
        )
        return
    if args.timeline:
        timeline(args.timeline)
        return
    if args.devices:
        devices_worker(args.devices, args.rounds)
        return

    tables = {}
    for n in [] if args.fit_only else args.workers:
        command = harness.module_command(MODULE, "--worker", "--rounds", args.rounds)
        if args.only:
            command += ["--only", args.only]
        what = f"{n}-worker run"
        (result,) = harness.fresh_workers(command, n, what, reporting=[0])
        tables[n] = report(result)
    if args.png and tables:
        plot(tables, args.png)
    if args.fit or args.fit_only:
        models = ["mlp", "resnet20"] if args.fit_model == "both" else [args.fit_model]
        for model_name in models:
            fit_benchmark(args.fit_rounds, model_name)


if __name__ == "__main__":
    main()
