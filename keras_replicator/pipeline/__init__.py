"""GPipe pipeline parallelism for Keras models (Huang et al. 2019).

`GPipe` cuts a chain of layers into stages on devices and streams micro-batches
through them (`gpipe`); `balance_by_size` and `balance_by_time` choose the cut.
Inside: `_partition` (the chain and the cut), `_microbatch` (split / join),
`_schedule` (fill-drain clocks), `_stage` (a stage as a pure function),
`_placement` (which devices each replica on a worker runs its stages on),
`_checkpoint` (re-materialization), `_batchnorm` (deferred moving statistics).
"""

from keras_replicator.pipeline.balance import balance_by_size, balance_by_time
from keras_replicator.pipeline.gpipe import GPipe

__all__ = ["GPipe", "balance_by_size", "balance_by_time"]
