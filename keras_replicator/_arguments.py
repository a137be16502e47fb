"""Argument checks shared by the public API, with Keras-style messages.

Every public function and class validates its arguments before doing any work and
raises an error naming the argument, the value received and what to pass instead.
"""

from __future__ import annotations


def check_int(
    name: str,
    value,
    *,
    minimum: int = 1,
    allow_none: bool = False,
    hint: str = "",
) -> None:
    """Raises a `ValueError` unless `value` is an int >= `minimum` (or allowed None).

    Example:
    >>> check_int("epochs", 3)
    >>> check_int("epochs", 0)
    Traceback (most recent call last):
    ...
    ValueError: `epochs` must be an integer of at least 1. Received: epochs=0.
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "an integer" + (" or None" if allow_none else "")
        message = (
            f"`{name}` must be {kind} of at least {minimum}. "
            f"Received: {name}={value!r}."
        )
        raise ValueError(f"{message} {hint}".rstrip())
