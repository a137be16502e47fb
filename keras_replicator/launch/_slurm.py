"""`python -m keras_replicator.launch._slurm`: this Slurm task's TF_CONFIG, as JSON.

Runs in a short-lived child of the launcher, because it imports TensorFlow (the
launcher must not). It asks TensorFlow's own `SlurmClusterResolver` for the
cluster, so node lists, tasks per node and ports follow TensorFlow's rules.

On nodes without NVIDIA GPUs the stock resolver fails (it runs `nvidia-smi` to
count GPUs, then divides by zero GPUs per task), and when `srun` bound GPUs to
each task (`--gpus-per-task`, `--gpu-bind`) it would undo Slurm's binding; in both
cases it derives only the cluster and leaves `CUDA_VISIBLE_DEVICES` alone (the
rule: `keras_replicator._slurm_gpus`). Prints one JSON line:
`{"tf_config": {...}, "env": {...}}`, where `env` carries this task's GPUs
(TensorFlow's assignment on a node-wide view, else Slurm's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from keras_replicator import _slurm_gpus


def _has_nvidia_gpus() -> bool:
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES")) or bool(
        shutil.which("nvidia-smi")
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port-base", type=int, default=8888)
    args = parser.parse_args(argv)

    import tensorflow as tf

    resolver_class = tf.distribute.cluster_resolver.SlurmClusterResolver
    try:
        resolver = resolver_class(
            port_base=args.port_base, **_slurm_gpus.resolver_arguments()
        )
        cluster = resolver.cluster_spec().as_dict()
    except (RuntimeError, KeyError, ValueError) as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    env = {}
    if _has_nvidia_gpus() and "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    config = {
        "cluster": cluster,
        "task": {"type": resolver.task_type, "index": resolver.task_id},
    }
    print(json.dumps({"tf_config": config, "env": env}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
