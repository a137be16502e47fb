"""Benchmarks of keras_replicator, each run as `python -m benchmarks.<name>`.

Every benchmark measures its arms against a baseline or ceiling from the same run,
on the one harness in `benchmarks.harness`; `benchmarks/README.md` lists them.
"""
