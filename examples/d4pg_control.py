"""Command line for the D4PG example: `python examples/d4pg_control.py --episodes 24`.

The agent lives in the `d4pg` package next to this file (`examples/d4pg/`, one
module per concept); this script parses flags, picks a strategy and trains.
`SMALL_CONFIG` on 2 replicas takes about 2-3 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from d4pg import SMALL_CONFIG, D4PGConfig, train  # noqa: E402

import keras_replicator as kr  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Command line: trains D4PG and prints the first and last returns."""
    parser = argparse.ArgumentParser(
        description="D4PG on the DeepMind Control Suite, learner on keras_replicator."
    )
    parser.add_argument("--domain", default="cartpole")
    parser.add_argument("--task", default="balance")
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--preset",
        choices=["small", "paper"],
        default="small",
        help="`small`: SMALL_CONFIG (minutes on a CPU); `paper`: D4PGConfig().",
    )
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--action-repeat", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # MirroredStrategy's INFO lines
    strategy = kr.auto(num_replicas=args.replicas)
    config = SMALL_CONFIG if args.preset == "small" else D4PGConfig()
    overrides = {"batch_size": args.batch_size, "action_repeat": args.action_repeat}
    config = dataclasses.replace(
        config, **{k: v for k, v in overrides.items() if v is not None}
    )
    run = train(
        args.domain,
        args.task,
        episodes=args.episodes,
        num_envs=args.num_envs,
        config=config,
        strategy=strategy,
        seed=args.seed,
    )
    k = max(args.num_envs, len(run.episode_returns) // 6)
    first = np.mean(run.episode_returns[:k])
    last = np.mean(run.episode_returns[-k:])
    print(
        f"mean return of the first {k} episodes {first:.1f}, of the last {k} "
        f"{last:.1f}; {run.learner_steps} learner steps in {run.seconds:.0f} s"
    )


if __name__ == "__main__":
    main()
