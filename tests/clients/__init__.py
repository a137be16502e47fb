"""Client compatibility: existing tf.distribute and Keras code, unchanged, on ours.

Each case is code written the way TensorFlow's distribute tutorials, the keras-io
guides or Keras' own tests write it; the strategy is its only input. It runs on one
device, under the stock strategy and under ours at the same global batch, and ours
must give one device's numbers (`test_clients.py`). `python -m tests.clients.table`
(`make clients`) runs every case in every mode in fresh processes and prints the
"Existing code: stock vs ours" table (docs/guide.md).
"""
