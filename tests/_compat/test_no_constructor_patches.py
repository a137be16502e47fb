"""Creating an optimizer patches nothing (issue 50).

NLCG once patched Keras' `Trainer._compute_loss` and Neumann its `CallbackList`
when constructed, even on one device; they now take the loss from `scale_loss`
and move the weights in `UseTrueWeights`. Checked in a fresh process, where no
strategy has installed anything yet.
"""

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import inspect, json
    import keras
    from keras_replicator import optimizers
    from keras_replicator._compat import _installer, _patching

    built = []
    for name in optimizers.__all__:
        value = getattr(optimizers, name)
        if inspect.isclass(value) and issubclass(value, keras.optimizers.Optimizer):
            value(0.1)
            built.append(name)
    print("RESULT " + json.dumps({
        "built": built,
        "groups": list(_installer.installed_groups()),
        "replaced": [f"{owner.__name__}.{attr}" for owner, attr in _patching.replaced],
    }))
    """
)


def test_no_optimizer_constructor_installs_a_patch():
    import json

    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert {"LARS", "NLCG", "Neumann"} <= set(result["built"]), result
    assert result["groups"] == [] and result["replaced"] == [], result
