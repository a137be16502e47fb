"""A class-conditional SN-GAN trained with the TF-Replicator two-function API.

The workload of TF-Replicator's paper (Buchlovsky et al. 2019), made small: a
class-conditional GAN with spectral normalization (Miyato et al. 2018) on
scikit-learn's bundled 8x8 handwritten digits, on N replicas. It is written as for
one replica:

* `input_fn(input_context)` returns this worker's shard of the data, batched per
  replica;
* `step_fn(batch)` trains the discriminator, then the generator, with ordinary
  per-replica mean losses and Keras optimizers (which average gradients exactly
  across replicas under keras_replicator strategies);
* where replicas must talk, the step calls `keras_replicator.replica`: the
  discriminator's minibatch-standard-deviation feature is computed over the global
  batch with `replica.all_reduce`, and the generator normalises with
  `SyncBatchNormalization` (statistics over all replicas).

Run: `python examples/sngan_digits.py --replicas 2 --steps 600` (writes
`sngan_digits.png`, a grid of generated digits, one row per class).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NOISE = 32
CLASSES = 10


def load_digits_dataset():
    """Digits scaled to [-1, 1], shape (n, 8, 8, 1), and integer labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 8.0 - 1.0).astype("float32")[..., None]
    return images, digits.target.astype("int32"), np


def build_generator(keras, kr):
    noise = keras.Input((NOISE,))
    label = keras.Input((), dtype="int32")
    embedded = keras.layers.Embedding(CLASSES, NOISE)(label)
    h = keras.layers.Concatenate()([noise, embedded])
    h = keras.layers.Dense(4 * 4 * 64, use_bias=False)(h)
    h = kr.layers.SyncBatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Reshape((4, 4, 64))(h)
    h = keras.layers.Conv2DTranspose(32, 4, strides=2, padding="same")(h)
    h = kr.layers.SyncBatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    image = keras.layers.Conv2D(1, 3, padding="same", activation="tanh")(h)
    return keras.Model([noise, label], image, name="generator")


def make_minibatch_stddev_layer(keras):
    from keras_replicator import replica

    class CrossReplicaMinibatchStddev(keras.layers.Layer):
        """Appends the global batch's mean feature standard deviation as a feature.

        The statistic is over every replica's batch (one all-reduce of the first
        and second moments), so it is the same as on one device at the global batch.
        """

        def call(self, x):
            n = replica.all_reduce(keras.ops.cast(keras.ops.shape(x)[0], x.dtype))
            mean = replica.all_reduce(keras.ops.sum(x, axis=0)) / n
            square = replica.all_reduce(keras.ops.sum(keras.ops.square(x), axis=0)) / n
            stddev = keras.ops.sqrt(keras.ops.maximum(square - mean**2, 0.0) + 1e-8)
            feature = keras.ops.mean(stddev) * keras.ops.ones_like(x[:, :1])
            return keras.ops.concatenate([x, feature], axis=-1)

    return CrossReplicaMinibatchStddev()


def build_discriminator(keras):
    sn = keras.layers.SpectralNormalization
    image = keras.Input((8, 8, 1))
    label = keras.Input((), dtype="int32")
    h = sn(keras.layers.Conv2D(32, 3, strides=2, padding="same"))(image)
    h = keras.layers.LeakyReLU(0.2)(h)
    h = sn(keras.layers.Conv2D(64, 3, strides=2, padding="same"))(h)
    h = keras.layers.LeakyReLU(0.2)(h)
    h = keras.layers.Flatten()(h)
    h = make_minibatch_stddev_layer(keras)(h)
    score = sn(keras.layers.Dense(1))(h)
    # Projection discriminator: add <embedding(label), features>.
    projection = keras.layers.Embedding(CLASSES, h.shape[-1])(label)
    score = score + keras.ops.sum(projection * h, axis=-1, keepdims=True)
    return keras.Model([image, label], score, name="discriminator")


def train(replicas=2, steps=600, global_batch=64, seed=0, verbose=True):
    """Trains the GAN; returns (generator, list of (d_loss, g_loss) per log step)."""
    import keras_replicator as kr

    strategy = kr.MultiDeviceReplicator(num_replicas=replicas)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    images, labels, _ = load_digits_dataset()

    def input_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return (
            dataset.shuffle(2048, seed=seed).repeat().batch(batch, drop_remainder=True)
        )

    with strategy.scope():
        generator = build_generator(keras, kr)
        discriminator = build_discriminator(keras)
        g_optimizer = keras.optimizers.Adam(2e-4, beta_1=0.0, beta_2=0.9)
        d_optimizer = keras.optimizers.Adam(2e-4, beta_1=0.0, beta_2=0.9)
        # Create every variable before the compiled loop (TF cannot create
        # variables inside a replicated while loop).
        g_optimizer.build(generator.trainable_variables)
        d_optimizer.build(discriminator.trainable_variables)

    def step_fn(batch):
        real, label = batch
        size = tf.shape(real)[0]
        noise = tf.random.normal([size, NOISE])
        with tf.GradientTape() as tape:
            fake = generator([noise, label], training=True)
            real_score = discriminator([real, label], training=True)
            fake_score = discriminator([fake, label], training=True)
            d_loss = tf.reduce_mean(tf.nn.relu(1.0 - real_score)) + tf.reduce_mean(
                tf.nn.relu(1.0 + fake_score)
            )  # hinge loss
        grads = tape.gradient(d_loss, discriminator.trainable_variables)
        d_optimizer.apply_gradients(zip(grads, discriminator.trainable_variables))
        with tf.GradientTape() as tape:
            fake = generator([tf.random.normal([size, NOISE]), label], training=True)
            g_loss = -tf.reduce_mean(discriminator([fake, label], training=True))
        grads = tape.gradient(g_loss, generator.trainable_variables)
        g_optimizer.apply_gradients(zip(grads, generator.trainable_variables))
        return d_loss, g_loss

    iterator = iter(strategy.distribute_input(input_fn))
    history = []
    chunk = 50
    for done in range(0, steps, chunk):
        d_loss, g_loss = strategy.run_steps(
            step_fn, iterator, num_steps=min(chunk, steps - done), reduce="mean"
        )
        history.append((float(d_loss), float(g_loss)))
        if verbose:
            print(
                f"step {done + chunk:5d}: d_loss {history[-1][0]:.3f}, "
                f"g_loss {history[-1][1]:.3f}"
            )
    return generator, history


def sample_grid(generator, per_class=8, seed=1):
    """Generated digits, shape (10 * 8, 8 * per_class), one row of digits per class."""
    import numpy as np

    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(CLASSES * per_class, NOISE)).astype("float32")
    labels = np.repeat(np.arange(CLASSES), per_class).astype("int32")
    images = generator.predict([noise, labels], verbose=0)[..., 0]
    rows = [
        np.concatenate(list(images[c * per_class : (c + 1) * per_class]), axis=1)
        for c in range(CLASSES)
    ]
    return np.concatenate(rows, axis=0)


def save_grid(grid, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.figure(figsize=(6, 7))
    plt.imshow(grid, cmap="gray_r", vmin=-1, vmax=1)
    plt.axis("off")
    plt.title("SN-GAN samples, one row per digit class")
    plt.savefig(path, bbox_inches="tight", dpi=100)
    plt.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", default="sngan_digits.png")
    args = parser.parse_args(argv)
    generator, _ = train(args.replicas, args.steps, args.batch_size)
    save_grid(sample_grid(generator), args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
