"""The pieces of `NLCG`'s update, one function each (see `nlcg.py`).

Every function works on lists of per-variable tensors and returns new values; global
quantities (dot products) are summed in float64, in variable order.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from keras_replicator.optimizers._whole_list import _raw

#: `(relative loss increase above, multiplier factor, share of the previous step
#: taken back)`, checked from the top; the thresholds are scaled by
#: `step_control_threshold`. Below the last one the multiplier grows by
#: `STEP_GROWTH` (up to 1). Values from the authors' "Step" line search.
STEP_CONTROL_BANDS = (
    (0.15, 0.5, 0.9),
    (0.125, 0.7, 0.7),
    (0.10, 0.8, 0.5),
    (0.075, 0.9, 0.3),
    (0.05, 0.95, 0.2),
    (0.025, 0.975, 0.1),
    (0.01, 1.0, 0.1),
)
STEP_GROWTH = 1.05
MIN_MULTIPLIER = 1e-4

#: Private, not API: the step-control timing, one switch per part of commit
#: 1e9b5d4 ("NLCG step control follows the authors' code"). `True` follows the
#: authors' code (apple/ml-ncg's graph in dataflow order), `False` the timing
#: before it. The default departs from the authors' code in (a) and (b) only: on
#: mnist1d at batch 2,000 the authors' timing scored 26.2 +- 16.1% test accuracy,
#: this default 58.9 +- 5.7 (5 seeds, docs/optimizers.md). Every part changes
#: updates only once a check has cut the step. Read by `NLCG.build`; set only
#: through `timing` (the large-batch benchmark's `--nlcg-variant`) and the tests.
AUTHORS_TIMING = {
    # (a) a check compares the loss average *before* this update's loss (False:
    #     after it, ours) with the one saved at the previous check;
    "a": False,
    # (b) a new multiplier takes effect at the next update (False: at this one,
    #     ours);
    "b": False,
    # (c) a take-back applies the authors' blend `(1 - p) * d - p * (c_old /
    #     c_new) * d_prev` at the applied rate (with (b) False it takes back
    #     `p * lr * c_old * d_prev`) (False: `p` times the previous update,
    #     `prev_scale * d_prev`);
    "c": True,
    # (d) the stored direction is `d` (False: the blend actually applied);
    "d": True,
    # (e) the BFGS `s` is this update's `lr * c` times `d_prev` (False: the
    #     previous update's rate, `prev_scale * d_prev`).
    "e": True,
}


@contextlib.contextmanager
def timing(reverted: str | None):
    """Private: `NLCG`s built inside use the pre-1e9b5d4 timing for `reverted`.

    `reverted` names parts of `AUTHORS_TIMING` (`"ac"`, `"abcde"`; `""` is the
    authors' code throughout, `None` leaves the default). Only the large-batch
    benchmark and tests use it.
    """
    if reverted is None:
        yield
        return
    unknown = set(reverted) - set(AUTHORS_TIMING)
    if unknown:
        raise ValueError(
            f"Unknown NLCG timing parts {sorted(unknown)}; use letters of "
            f"{''.join(AUTHORS_TIMING)}. Received: reverted={reverted!r}."
        )
    saved = dict(AUTHORS_TIMING)
    AUTHORS_TIMING.update({k: k not in reverted for k in AUTHORS_TIMING})
    try:
        yield
    finally:
        AUTHORS_TIMING.update(saved)


def lars(gradient, weight, eta):
    """`gradient * eta * norm(weight) / norm(gradient)` (unchanged if a norm is 0)."""
    w_norm = tf.sqrt(tf.cast(tf.reduce_sum(tf.square(weight)), "float64"))
    g_norm = tf.sqrt(tf.cast(tf.reduce_sum(tf.square(gradient)), "float64"))
    positive = tf.logical_and(w_norm > 0, g_norm > 0)
    safe = tf.where(positive, g_norm, tf.ones_like(g_norm))
    trust = tf.where(positive, eta * w_norm / safe, tf.ones_like(safe))
    return tf.cast(trust, gradient.dtype) * gradient


def bfgs_diagonal(first, grads, previous_grads, d_prev, scale, b, epsilon):
    """The diagonal BFGS update of `b` from the pair `(y, s)` (ones at step 0).

    `s = scale * d_prev`: the stored direction times this update's rate, as in
    the authors' code (the previous update itself when neither the rate nor the
    step multiplier changed and nothing was taken back).
    """
    s = [tf.cast(scale, dp.dtype) * dp for dp in d_prev]
    y = [g - gp for g, gp in zip(grads, previous_grads)]
    ys = dot(y, s)
    bs = [bi * si for bi, si in zip(b, s)]
    sbs = dot(s, bs)
    update = tf.logical_and(
        tf.logical_not(first), tf.logical_and(ys > epsilon, sbs > epsilon)
    )
    safe_ys = tf.where(update, ys, tf.ones_like(ys))
    safe_sbs = tf.where(update, sbs, tf.ones_like(sbs))
    new_b = []
    for bi, bsi, yi in zip(b, bs, y):
        dtype = bi.dtype
        candidate = tf.abs(
            bi
            - tf.square(bsi) / tf.cast(safe_sbs, dtype)
            + tf.square(yi) / tf.cast(safe_ys, dtype)
        )
        kept = tf.where(first, tf.ones_like(bi), bi)
        new_b.append(tf.where(update, candidate, kept))
    return new_b


def step_control(
    first, check, multiplier, loss, ema, ema_old, smoothing, threshold, lagged=True
):
    """One step of the loss-trend control.

    With `lagged` (the authors' code: their TF1 graph reads the average before its
    assign runs) the check compares the loss average *before* this update's loss
    is folded in with the one saved at the previous check (which included that
    check's loss); without, the average after it.

    Returns:
        `(new multiplier, share taken back, ema, ema_old)` after this update.
    """
    new_ema = tf.where(first, loss, smoothing * ema + (1.0 - smoothing) * loss)
    current = ema if lagged else new_ema
    known = tf.abs(ema_old) > 0
    safe_old = tf.where(known, tf.abs(ema_old), tf.ones_like(ema))
    rise = tf.where(known, (current - ema_old) / safe_old, tf.zeros_like(ema))
    grow = rise < STEP_CONTROL_BANDS[-1][0] * threshold
    # Exactly on the lowest threshold: keep the multiplier, take nothing back.
    factor = tf.ones((), "float64")
    share = tf.zeros((), "float64")
    # Bands are nested: walk from the smallest threshold, the largest hit wins.
    for above, band_factor, band_share in reversed(STEP_CONTROL_BANDS):
        hit = rise > above * threshold
        factor = tf.where(hit, tf.constant(band_factor, "float64"), factor)
        share = tf.where(hit, tf.constant(band_share, "float64"), share)
    grown = tf.minimum(multiplier * STEP_GROWTH, 1.0)
    cut = tf.maximum(multiplier * factor, MIN_MULTIPLIER)
    new_multiplier = tf.where(check, tf.where(grow, grown, cut), multiplier)
    cutting = tf.logical_and(check, tf.logical_not(grow))
    share = tf.where(cutting, share, tf.zeros_like(share))
    ema_old = tf.where(tf.logical_or(first, check), new_ema, ema_old)
    return new_multiplier, share, new_ema, ema_old


def take_back(d, d_prev, scale, new_scale, prev_scale, share, timing):
    """`(per-variable updates, stored directions, applied rate)` of one update.

    `scale` and `new_scale` are `lr * c` before and after this update's check,
    `prev_scale` the previous update's rate (used when `timing["c"]` is False),
    `share` the share `p` taken back (0 without a cut). The rate applied is
    `scale` with `timing["b"]` (the new `c` from the next update), else
    `new_scale`. The authors' code (`timing["c"]`) forms the blend
    `(1 - p) * new_scale * d - p * scale * d_prev`, divides it by the new rate into
    a direction and multiplies that by the applied rate: `applied * ((1 - p) * d -
    p * (scale / new_scale) * d_prev)` (nothing taken back when `new_scale` is 0).
    Otherwise `(1 - p) * applied * d - p * prev_scale * d_prev`: a share of the
    previous update. The stored direction is `d` with `timing["d"]`, else the
    update over the applied rate.
    """
    applied = scale if timing["b"] else new_scale
    if timing["c"]:
        taking = tf.logical_and(share > 0, new_scale > 0)
        safe_new = tf.where(taking, new_scale, tf.ones_like(new_scale))
        remove = share * applied * scale / safe_new
        remove = tf.where(taking, remove, tf.zeros_like(share))
    else:
        taking = share > 0
        remove = tf.where(taking, share * prev_scale, tf.zeros_like(share))
    keep = tf.where(taking, (1.0 - share) * applied, applied)
    updates = [
        tf.cast(keep, di.dtype) * di - tf.cast(remove, di.dtype) * dp
        for di, dp in zip(d, d_prev)
    ]
    if timing["d"]:
        return updates, d, applied
    blended = tf.logical_and(taking, applied > 0)
    safe = tf.where(blended, applied, tf.ones_like(applied))
    stored = [
        tf.where(blended, u / tf.cast(safe, u.dtype), di) for u, di in zip(updates, d)
    ]
    return updates, stored, applied


def read(slots):
    """The current values of `slots` (or `None` when the slots do not exist)."""
    return None if slots is None else [tf.convert_to_tensor(_raw(s)) for s in slots]


def dot(a, b):
    """Global dot product over lists of tensors, summed in float64 in list order."""
    total = tf.zeros((), "float64")
    for x, y in zip(a, b):
        total = total + tf.cast(tf.reduce_sum(x * y), "float64")
    return total


def refuse_parameter_servers(strategy) -> None:
    # Async workers apply gradients taken at different (stale) weights one after
    # another: the conjugate direction, the BFGS pair and the loss trend would mix
    # them, so none of NLCG's global quantities would mean anything.
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ValueError(
            "`NLCG` cannot train under parameter-server (asynchronous) training: "
            "its conjugate directions, BFGS pairs and loss trend need every update "
            "to use the gradient at the current weights. Received: strategy="
            f"{type(strategy).__name__}. Use a synchronous Replicator "
            "(`kr.MultiDeviceReplicator`, `kr.MultiWorkerReplicator`), or an "
            "optimizer without global state (SGD, LARS, Neumann) for async."
        )
