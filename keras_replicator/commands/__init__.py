"""Subcommands of the `keras-replicator` console script, one module each."""
