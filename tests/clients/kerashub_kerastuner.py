"""keras-hub and keras-tuner, as their guides use them, under a strategy (issue 53).

keras-hub's "Getting started" and LoRA fine-tuning guides: a backbone from its
config (no weights download), compiled and fit in the strategy's scope, with the
boolean `padding_mask` its models take (stock `MirroredStrategy` cannot reduce
it before the first step); the GPT-2 LoRA recipe with `global_clipnorm`, the
Transformer recipes' clipping. keras-tuner's "Getting started": `RandomSearch`
with `distribution_strategy=`, which builds every trial's model in the scope.
Token ids come from a fixed generator: nothing downloads, everything is offline.
"""

from tests.clients._registry import client_case

GLOBAL_BATCH = 8
VOCABULARY = 50
SEQUENCE = 12
# A backbone's config, small enough to train in seconds (no preset, no download).
TINY_BACKBONE = dict(
    vocabulary_size=VOCABULARY,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.0,
)


def _tokens(num_samples=32, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCABULARY, size=(num_samples, SEQUENCE)).astype("int32")
    mask = np.ones_like(tokens, dtype=bool)
    mask[:, 9:] = False  # padding, as a preprocessor leaves it
    return tokens, mask, rng


@client_case(
    "keras-hub: a BertBackbone from its config with a classification head, "
    "token ids / segment ids / boolean padding mask, fit"
)
def kerashub_bert_classifier(strategy, workdir):
    import keras
    import keras_hub

    tokens, mask, rng = _tokens()
    labels = rng.integers(0, 2, size=(len(tokens),)).astype("int32")
    inputs = {
        "token_ids": tokens,
        "segment_ids": (tokens % 2).astype("int32"),
        "padding_mask": mask,
    }
    with strategy.scope():
        backbone = keras_hub.models.BertBackbone(**TINY_BACKBONE)
        pooled = backbone(backbone.input)["pooled_output"]
        model = keras.Model(backbone.input, keras.layers.Dense(2)(pooled))
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(
        inputs, labels, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0
    )
    return {"weights": model.get_weights(), "loss": history.history["loss"]}


@client_case(
    "keras-hub LoRA guide: GPT2Backbone from its config, enable_lora(2), "
    "language-model head tied to the embedding, SGD with global_clipnorm"
)
def kerashub_gpt2_lora_clipnorm(strategy, workdir):
    import keras
    import keras_hub

    tokens, mask, rng = _tokens()
    labels = rng.integers(0, VOCABULARY, size=tokens.shape).astype("int32")
    inputs = {"token_ids": tokens, "padding_mask": mask}
    with strategy.scope():
        backbone = keras_hub.models.GPT2Backbone(**TINY_BACKBONE)
        backbone.enable_lora(rank=2)
        hidden = backbone(backbone.input)
        logits = backbone.token_embedding(hidden, reverse=True)
        model = keras.Model(backbone.input, logits)
        model.compile(
            # Tight enough that every step clips (the recipes use 1.0 at scale).
            optimizer=keras.optimizers.SGD(0.5, global_clipnorm=0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(
        inputs, labels, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0
    )
    return {
        "lora_weights": [v.numpy() for v in model.trainable_weights],
        "loss": history.history["loss"],
    }


@client_case(
    "keras-tuner getting started: RandomSearch(distribution_strategy=...), "
    "max_trials=2, each trial's model built in the scope"
)
def kerastuner_random_search(strategy, workdir):
    import keras
    import keras_tuner
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")

    def build_model(hp):
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(hp.Choice("units", [8, 16]), activation="relu"),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(hp.Choice("learning_rate", [0.1, 0.3])),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    tuner = keras_tuner.RandomSearch(
        build_model,
        objective="loss",
        max_trials=2,
        seed=1,
        distribution_strategy=strategy,
        directory=workdir,
        project_name="search",
        overwrite=True,
    )
    tuner.search(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    trials = sorted(tuner.oracle.trials.values(), key=lambda t: t.trial_id)
    best = tuner.get_best_models(1)[0]
    return {
        "scores": [float(t.score) for t in trials],
        "best_weights": best.get_weights(),
    }
