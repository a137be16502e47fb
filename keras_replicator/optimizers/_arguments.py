"""Argument checks shared by the optimizers (errors name the argument)."""

from __future__ import annotations

import numbers


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_float(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    exclusive_low: bool = False,
) -> float:
    """`value` as a float in `[low, high]` (or `(low, high]`), else an error."""
    if not is_number(value):
        raise TypeError(
            f"`{name}` must be a float. Received: {name}={value!r} "
            f"(of type {type(value).__name__}). Pass a Python float."
        )
    value = float(value)
    too_low = low is not None and (value <= low if exclusive_low else value < low)
    too_high = high is not None and value > high
    if too_low or too_high or value != value:
        parts = []
        if low is not None:
            parts.append(("> " if exclusive_low else ">= ") + str(low))
        if high is not None:
            parts.append(f"<= {high}")
        raise ValueError(
            f"`{name}` must be {' and '.join(parts)}. Received: {name}={value}. "
            "Pass a value in that range."
        )
    return value


def check_int(name: str, value, low: int, *, allow_none: bool = False) -> int | None:
    """`value` as an int >= `low` (or `None` if allowed), else an error."""
    if value is None and allow_none:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        extra = " or None" if allow_none else ""
        raise TypeError(
            f"`{name}` must be an int{extra}. Received: {name}={value!r} "
            f"(of type {type(value).__name__}). Pass a Python int{extra}."
        )
    if value < low:
        raise ValueError(
            f"`{name}` must be >= {low}. Received: {name}={value}. "
            "Pass a value in that range."
        )
    return int(value)


def check_choice(name: str, value, choices: tuple) -> object:
    """`value` if it is one of `choices`, else a `ValueError` listing them."""
    if value not in choices:
        raise ValueError(
            f"`{name}` must be one of {list(choices)}. Received: {name}={value!r}. "
            f"Pass one of {', '.join(repr(c) for c in choices)}."
        )
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(
            f"`{name}` must be a bool. Received: {name}={value!r}. Pass True or False."
        )
    return value


def check_learning_rate(learning_rate):
    """Python numbers become floats (Keras rejects ints); negative ones fail early."""
    if is_number(learning_rate):
        return check_float("learning_rate", learning_rate, 0.0)
    return learning_rate
