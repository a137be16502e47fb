"""The preemption agreement between real workers rides the step (issue 48, item 14).

`BackupAndRestore` used to agree after every batch in a collective of its own:
an eager 4-byte all-reduce and a `.numpy()`, a host sync between steps. Here 2
worker processes on 127.0.0.1 count, through a whole `fit`, the collectives that
run eagerly outside the step function (the ring's `all_reduce` or `strategy.run`
called from Python, not from a step's `py_function`): none may come from the
callback. That the workers still stop after one agreed step, back up at it and
resume exactly is `test_preemption_multi_worker.py`.
"""

import json
import sys
import textwrap

import pytest

from keras_replicator.launch import run_workers
from tests.callbacks._float64_worker import PRELUDE

pytestmark = pytest.mark.multi_worker

_COUNTING = PRELUDE + textwrap.dedent(
    """
    import traceback
    from keras_replicator._worker import preemption as _preemption
    from keras_replicator._replicator_state import replicator_state

    signals = None if sys.argv[1] == "none" else ("SIGTERM",)
    # Float32 logs: the flag must still be a replica's own value to TF's collectives.
    keras.backend.set_floatx("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    eager_collectives = []

    def counted(function, name):
        # Eager and not under a step's `py_function` (where the ring's calls of
        # the step itself run): a collective of its own, from Python.
        def call(*args, **kwargs):
            frames = traceback.extract_stack()
            in_step = any(f.filename.endswith("script_ops.py") for f in frames)
            if tf.executing_eagerly() and not in_step:
                eager_collectives.append(name)
            return function(*args, **kwargs)
        return call

    state = replicator_state(strategy)
    ring = getattr(state.transport, "ring", None)
    if ring is not None:
        ring.all_reduce = counted(ring.all_reduce, "ring")
    strategy.run = counted(strategy.run, "strategy.run")

    class Watch(keras.callbacks.Callback):
        carried = []
        def on_train_batch_end(self, batch, logs=None):
            agreement = getattr(_preemption, "step_agreement", None)
            self.carried.append(agreement is not None and agreement(model) is not None)

    backup = kr.callbacks.BackupAndRestore(
        sys.argv[2], preemption_signals=signals, exit_on_preemption=False
    )
    model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
              callbacks=[backup, Watch()])
    print("COUNTS " + json.dumps({"eager": eager_collectives,
                                  "batches": len(Watch.carried),
                                  "carried": sum(Watch.carried)}), flush=True)
    """
)


def _counts(output):
    line = next(ln for ln in output.splitlines() if ln.startswith("COUNTS "))
    return json.loads(line[len("COUNTS ") :])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "which", ["ours", pytest.param("collective", marks=pytest.mark.slow)]
)
def test_the_agreement_adds_no_eager_collective_per_batch(tmp_path, which):
    command = [sys.executable, "-c", _COUNTING]
    listening = run_workers(
        command + ["sigterm", str(tmp_path / "a"), which], 2, timeout=180, echo=False
    )
    assert listening.ok, [w.output[-2000:] for w in listening.workers]
    for worker in listening.workers:
        counts = _counts(worker.output)
        assert counts["batches"] == 18
        # Before: one eager all-reduce after each of the 18 batches.
        assert counts["eager"] == [], counts["eager"][:3]
        assert counts["carried"] == 18  # the flag rode every training step
    # Without preemption signals the steps are the plain ones.
    plain = run_workers(
        command + ["none", str(tmp_path / "b"), which], 2, timeout=180, echo=False
    )
    assert plain.ok, [w.output[-2000:] for w in plain.workers]
    assert all(_counts(w.output)["carried"] == 0 for w in plain.workers)
