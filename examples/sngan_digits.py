"""A class-conditional SN-GAN trained with the TF-Replicator two-function API.

The workload of TF-Replicator's paper (Buchlovsky et al. 2019), made small: a
class-conditional GAN with spectral normalization (Miyato et al. 2018) on
scikit-learn's bundled 8x8 handwritten digits, on N replicas. It is written as for
one replica:

* `input_fn(input_context)` returns this worker's shard of the data, batched per
  replica (`make_input_fn`);
* `step_fn(batch)` trains the discriminator, then the generator, with ordinary
  per-replica mean losses and Keras optimizers, which average gradients exactly
  across replicas under keras_replicator strategies (`make_step_fn`);
* where replicas must talk, the step calls `keras_replicator.replica`: the
  discriminator's minibatch-standard-deviation feature is computed over the global
  batch with `replica.all_reduce`, and the generator normalises with
  `SyncBatchNormalization` (statistics over all replicas).

The pieces are module-level so `notebooks/sngan_replica_api.ipynb` can import and
show them; `train()` puts them together.

Run: `python examples/sngan_digits.py --replicas 2 --steps 600` (writes
`sngan_digits.png`, a grid of generated digits, one row per class).
"""

# No `from __future__ import annotations`: tests load this file without adding it to
# `sys.modules`, and `dataclasses` then cannot resolve string annotations.
import argparse
import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CLASSES = 10


@dataclasses.dataclass(frozen=True)
class GANConfig:
    """Hyperparameters of the GAN.

    The learning rates are five times the usual SN-GAN 2e-4: in 600 steps at 2e-4
    each class's samples spread about 0.7 as much as the real digits of that class
    (mean pairwise distance in the real digits' 12 leading principal components);
    at 1e-3 about 0.9, with samples still classified as their class about 98% of
    the time. Two discriminator steps per generator step help as much but cost
    twice the time.

    Args:
        noise_dim: Length of the generator's noise vector. Defaults to `32`.
        g_learning_rate: Generator's Adam learning rate. Defaults to `1e-3`.
        d_learning_rate: Discriminator's Adam learning rate. Defaults to `1e-3`.
        n_critic: Discriminator updates per generator update. Defaults to `1`.
    """

    noise_dim: int = 32
    g_learning_rate: float = 1e-3
    d_learning_rate: float = 1e-3
    n_critic: int = 1

    def __post_init__(self):
        for name in ("noise_dim", "n_critic"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"`{name}` must be a positive integer. Received: {name}={value!r}."
                )


def load_digits_dataset():
    """Digits scaled to [-1, 1], shape (n, 8, 8, 1), and integer labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 8.0 - 1.0).astype("float32")[..., None]
    return images, digits.target.astype("int32")


def make_input_fn(images, labels, global_batch, seed=0):
    """An `input_fn(input_context)` giving this worker's shard, batched per replica."""
    import tensorflow as tf

    def input_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        dataset = dataset.shuffle(2048, seed=seed).repeat()
        return dataset.batch(batch, drop_remainder=True)

    return input_fn


def build_generator(noise_dim=32):
    """(noise, label) -> 8x8 image in [-1, 1], batch norm synchronised over replicas."""
    import keras

    import keras_replicator as kr

    noise = keras.Input((noise_dim,))
    label = keras.Input((), dtype="int32")
    embedded = keras.layers.Embedding(CLASSES, noise_dim)(label)
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


def make_minibatch_stddev_layer():
    """A layer appending the global batch's feature spread (Karras et al. 2018)."""
    import keras

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


def build_discriminator():
    """(image, label) -> score: spectral norm, projection onto the label embedding."""
    import keras

    sn = keras.layers.SpectralNormalization
    image = keras.Input((8, 8, 1))
    label = keras.Input((), dtype="int32")
    h = sn(keras.layers.Conv2D(32, 3, strides=2, padding="same"))(image)
    h = keras.layers.LeakyReLU(0.2)(h)
    h = sn(keras.layers.Conv2D(64, 3, strides=2, padding="same"))(h)
    h = keras.layers.LeakyReLU(0.2)(h)
    h = keras.layers.Flatten()(h)
    h = make_minibatch_stddev_layer()(h)
    score = sn(keras.layers.Dense(1))(h)
    # Projection discriminator: add <embedding(label), features>.
    projection = keras.layers.Embedding(CLASSES, h.shape[-1])(label)
    score = score + keras.ops.sum(projection * h, axis=-1, keepdims=True)
    return keras.Model([image, label], score, name="discriminator")


def build_gan(config=GANConfig()):
    """Generator, discriminator and their optimizers; call under `strategy.scope()`."""
    import keras

    generator = build_generator(config.noise_dim)
    discriminator = build_discriminator()
    g_optimizer = keras.optimizers.Adam(config.g_learning_rate, beta_1=0.0, beta_2=0.9)
    d_optimizer = keras.optimizers.Adam(config.d_learning_rate, beta_1=0.0, beta_2=0.9)
    # Create every variable before the compiled loop (TF cannot create variables
    # inside a replicated while loop).
    g_optimizer.build(generator.trainable_variables)
    d_optimizer.build(discriminator.trainable_variables)
    return generator, discriminator, g_optimizer, d_optimizer


def make_step_fn(generator, discriminator, g_optimizer, d_optimizer, config):
    """A `step_fn(batch)` for one replica: `n_critic` D updates, one G update.

    Every D update reuses the replica's batch of real digits with fresh noise. The
    losses are plain means over this replica's samples; the optimizers' gradient
    all-reduce makes the update the one-device update at the global batch.
    """
    import tensorflow as tf

    def d_update(real, label):
        noise = tf.random.normal([tf.shape(real)[0], config.noise_dim])
        with tf.GradientTape() as tape:
            fake = generator([noise, label], training=True)
            real_score = discriminator([real, label], training=True)
            fake_score = discriminator([fake, label], training=True)
            d_loss = tf.reduce_mean(tf.nn.relu(1.0 - real_score)) + tf.reduce_mean(
                tf.nn.relu(1.0 + fake_score)
            )  # hinge loss
        grads = tape.gradient(d_loss, discriminator.trainable_variables)
        d_optimizer.apply_gradients(zip(grads, discriminator.trainable_variables))
        return d_loss

    def step_fn(batch):
        real, label = batch
        for _ in range(config.n_critic):  # unrolled: n_critic is a Python int
            d_loss = d_update(real, label)
        noise = tf.random.normal([tf.shape(real)[0], config.noise_dim])
        with tf.GradientTape() as tape:
            fake = generator([noise, label], training=True)
            g_loss = -tf.reduce_mean(discriminator([fake, label], training=True))
        grads = tape.gradient(g_loss, generator.trainable_variables)
        g_optimizer.apply_gradients(zip(grads, generator.trainable_variables))
        return d_loss, g_loss

    return step_fn


def train(
    replicas=2,
    steps=600,
    global_batch=64,
    seed=0,
    verbose=True,
    config=GANConfig(),
    log_every=50,
):
    """Trains the GAN; returns (generator, list of (d_loss, g_loss) per log step)."""
    import keras_replicator as kr

    strategy = kr.MultiDeviceReplicator(num_replicas=replicas)
    import keras

    keras.utils.set_random_seed(seed)
    images, labels = load_digits_dataset()
    input_fn = make_input_fn(images, labels, global_batch, seed)
    with strategy.scope():
        generator, discriminator, g_optimizer, d_optimizer = build_gan(config)
    step_fn = make_step_fn(generator, discriminator, g_optimizer, d_optimizer, config)

    iterator = iter(strategy.distribute_input(input_fn))
    history = []
    for done in range(0, steps, log_every):
        d_loss, g_loss = strategy.run_steps(
            step_fn, iterator, num_steps=min(log_every, steps - done), reduce="mean"
        )
        history.append((float(d_loss), float(g_loss)))
        if verbose:
            print(
                f"step {min(done + log_every, steps):5d}: "
                f"d_loss {history[-1][0]:.3f}, g_loss {history[-1][1]:.3f}"
            )
    return generator, history


def generate(generator, per_class=8, seed=1):
    """`per_class` samples of every class: images (10 * per_class, 8, 8), labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    noise_dim = generator.inputs[0].shape[-1]
    noise = rng.normal(size=(CLASSES * per_class, noise_dim)).astype("float32")
    labels = np.repeat(np.arange(CLASSES), per_class).astype("int32")
    images = generator.predict([noise, labels], verbose=0)[..., 0]
    return images, labels


def as_grid(images, per_class, gap=0):
    """Images sorted by class, (10 * per_class, 8, 8) -> one row of digits per class.

    `gap` pixels of background (-1) separate neighbouring digits.
    """
    import numpy as np

    padded = np.pad(images, ((0, 0), (0, gap), (0, gap)), constant_values=-1.0)
    rows = [
        np.concatenate(list(padded[c * per_class : (c + 1) * per_class]), axis=1)
        for c in range(CLASSES)
    ]
    grid = np.concatenate(rows, axis=0)
    return grid[: grid.shape[0] - gap, : grid.shape[1] - gap]


def sample_grid(generator, per_class=8, seed=1, gap=0):
    """Generated digits, shape (10 * 8, 8 * per_class), one row of digits per class."""
    images, _ = generate(generator, per_class, seed)
    return as_grid(images, per_class, gap)


def real_grid(images, labels, per_class=8, seed=1, gap=0):
    """Real digits laid out as `sample_grid` lays out generated ones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    images = images.reshape(-1, 8, 8)
    chosen = [
        rng.choice(np.flatnonzero(labels == c), per_class, replace=False)
        for c in range(CLASSES)
    ]
    return as_grid(images[np.concatenate(chosen)], per_class, gap)


def within_class_spread(images, labels):
    """Mean pairwise Euclidean distance between images of each class, per class.

    A generator that ignores its noise (mode collapse within a class) scores near
    0; real digits score the natural spread of their class.
    """
    import numpy as np

    flat = images.reshape(len(images), -1).astype("float64")
    spread = []
    for c in range(CLASSES):
        x = flat[labels == c]
        squared = (x**2).sum(1)
        distances = squared[:, None] + squared[None, :] - 2 * x @ x.T
        distances = np.sqrt(np.maximum(distances, 0.0))
        n = len(x)
        spread.append(distances.sum() / (n * (n - 1)))
    return np.array(spread)


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
