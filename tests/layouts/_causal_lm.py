"""Tiny keras-hub causal LMs from configs, their layout maps, and their data.

Shared by the one-process tests (`test_keras_hub_models.py`) and the workers of
the multi-worker ones (`_multi_worker_job.py`).
"""

import contextlib

import keras
import keras_hub
import numpy as np

import keras_replicator as kr

VOCABULARY, LENGTH, ROWS, BATCH = 32, 6, 24, 8


def mesh():
    return keras.distribution.DeviceMesh((2, 2), ["batch", "model"], kr.devices(4))


def gpt2_layout_map(device_mesh):
    layout_map = keras.distribution.LayoutMap(device_mesh)
    layout_map["token_embedding/embeddings"] = ("model", None)
    layout_map[".*self_attention/(query|key|value)/kernel"] = (None, "model", None)
    layout_map[".*self_attention/(query|key|value)/bias"] = ("model", None)
    layout_map[".*attention_output/kernel"] = ("model", None, None)
    layout_map[".*feedforward_intermediate_dense/kernel"] = (None, "model")
    layout_map[".*feedforward_intermediate_dense/bias"] = ("model",)
    layout_map[".*feedforward_output_dense/kernel"] = ("model", None)
    return layout_map


def gpt2():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=32,
        max_sequence_length=LENGTH,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def gemma():
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        head_dim=4,
        dtype="float64",
    )
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def compiled(model):
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    return model


def tokens():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCABULARY, (ROWS, LENGTH + 1))
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((ROWS, LENGTH), bool)}
    return x, ids[:, 1:]


def train(model, x, y):
    return model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history


def max_gap(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


LAYOUT_MAPS = {
    "gpt2": (gpt2, gpt2_layout_map),
    "gemma": (gemma, keras_hub.models.GemmaBackbone.get_layout_map),
}


def fit_then_lora(name, strategy=None):
    """`fit` for 3 steps, then LoRA rank 2 for 3 steps, in `strategy`'s scope.

    Returns:
        The model and, for each phase, its loss history and weights after it.
    """

    def scope():
        return strategy.scope() if strategy is not None else contextlib.nullcontext()

    make = LAYOUT_MAPS[name][0]
    x, y = tokens()
    with scope():
        keras.utils.set_random_seed(0)
        model = compiled(make())
    phases = [(train(model, x, y)["loss"], model.get_weights())]
    with scope():
        keras.utils.set_random_seed(1)
        model.backbone.enable_lora(rank=2)
        compiled(model)
    phases.append((train(model, x, y)["loss"], model.get_weights()))
    return model, phases
