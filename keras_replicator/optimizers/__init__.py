"""Optimizers for large-batch training.

`LARS` (You et al. 2017), `Neumann` (Krishnan et al. 2017, with its `UseTrueWeights`
callback) and `NLCG` (Adya et al. 2018, fed the loss by `observe_loss`); see
docs/optimizers.md.
"""

from keras_replicator.optimizers._loss_aware import observe_loss
from keras_replicator.optimizers.lars import LARS
from keras_replicator.optimizers.neumann import Neumann
from keras_replicator.optimizers.nlcg import NLCG
from keras_replicator.optimizers.use_true_weights import UseTrueWeights

__all__ = ["LARS", "NLCG", "Neumann", "UseTrueWeights", "observe_loss"]
