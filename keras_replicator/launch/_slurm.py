"""`python -m keras_replicator.launch._slurm`: this Slurm task's TF_CONFIG, as JSON.

Runs in a short-lived child of the launcher, because it imports TensorFlow (the
launcher must not). It asks TensorFlow's own `SlurmClusterResolver` for the
cluster, so node lists, tasks per node and ports follow TensorFlow's rules.

On nodes without NVIDIA GPUs the stock resolver fails (it runs `nvidia-smi` to
count GPUs, then divides by zero GPUs per task); there we tell it one pseudo-GPU
per task and not to touch `CUDA_VISIBLE_DEVICES`, which yields the same cluster.
Prints one JSON line: `{"tf_config": {...}, "env": {...}}`, where `env` carries
the GPU assignment the resolver made for this task.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys


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
        if _has_nvidia_gpus():
            resolver = resolver_class(port_base=args.port_base)
        else:
            tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
            resolver = resolver_class(
                port_base=args.port_base,
                gpus_per_node=tasks,
                gpus_per_task=1,
                auto_set_gpu=False,
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
