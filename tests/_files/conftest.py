"""Fixtures of the `_files` tests."""

from tests._files._strangers import shared_base

__all__ = ["shared_base"]
