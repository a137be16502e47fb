"""What the GPipe benchmark measures: the throughput, memory and cap configurations.

A config is a plain dict (it travels to the worker process as JSON).
"""

from __future__ import annotations

BATCH = 4096  # 512-row micro-batches at M = 8
SMALL_BATCH = 512  # 64-row micro-batches at M = 8


def plain(batch: int, steps: int, intra: int = 1) -> dict:
    return {
        "model": "mlp",
        "batch": batch,
        "steps": steps,
        "checkpoint": "never",
        "pipeline": False,
        "M": 1,
        "intra": intra,
    }


def gpipe(batch: int, steps: int, m: int) -> dict:
    return {**plain(batch, steps), "pipeline": True, "M": m}


def throughput_configs(steps: int) -> dict:
    """name -> (config, copies run at once). `steps` is for the large batch."""
    small_steps = steps * BATCH // SMALL_BATCH
    configs = {
        "plain, 1 thread/op": (plain(BATCH, steps), 1),
        "plain, 2 threads/op": (plain(BATCH, steps, intra=2), 1),
    }
    for m in (1, 2, 4, 8):
        configs[f"GPipe K=2 M={m}"] = (gpipe(BATCH, steps, m), 1)
    configs["2 plain processes at once, 1 thread/op"] = (plain(BATCH, steps), 2)
    configs["small batch: plain, 1 thread/op"] = (plain(SMALL_BATCH, small_steps), 1)
    configs["small batch: plain, 1 thread/op, batch 64"] = (
        plain(SMALL_BATCH // 8, small_steps * 8),
        1,
    )
    configs["small batch: 2 plain processes at once"] = (
        plain(SMALL_BATCH, small_steps),
        2,
    )
    for m in (1, 8):
        configs[f"small batch: GPipe K=2 M={m}"] = (
            gpipe(SMALL_BATCH, small_steps, m),
            1,
        )
    return configs


BFC = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


MEMORY_MODELS = {
    # name: (model, width, batch). Activations dominate the first two, as in
    # GPipe's setting; in the third, weight gradients weigh as much as activations
    # (each micro-batch's weight gradient is held until the tape sums all M).
    "deep_mlp 24x256, batch 4096": ("deep_mlp", 256, 4096),
    "resnet 8 blocks, batch 64": ("resnet", None, 64),
    "deep_mlp 24x512, batch 2048": ("deep_mlp", 512, 2048),
}


def memory_configs() -> dict:
    configs = {}
    for label, (model, width, batch) in MEMORY_MODELS.items():
        for checkpoint in ("never", "except_last", "always"):
            configs[f"{label}, M=4, checkpoint={checkpoint}"] = {
                "model": model,
                "width": width or 512,
                "batch": batch,
                "steps": 2,
                "pipeline": True,
                "M": 4,
                "checkpoint": checkpoint,
                "intra": 1,
            }
    return configs


CAP_MB = 256
CAP_DEPTHS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
