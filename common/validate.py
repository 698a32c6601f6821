"""Field checks shared by every config object: errors name the field, the value, what is allowed."""

from __future__ import annotations

import difflib
import itertools
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any


def check_range(
    owner: str,
    field: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    integer: bool = False,
) -> None:
    """Raise ValueError unless lo <= value <= hi (lo < value when lo_open)."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type:
        raise ValueError(f"{owner}.{field}={value!r} must be {kind}")
    low_ok = lo is None or (value > lo if lo_open else value >= lo)
    high_ok = hi is None or value <= hi
    if not (low_ok and high_ok):
        left = "-inf" if lo is None else f"{lo}"
        bound = f"{left} {'<' if lo_open else '<='} {field} <= {'inf' if hi is None else hi}"
        raise ValueError(f"{owner}.{field}={value!r} is out of range; allowed: {bound}")


def check_bool(owner: str, field: str, value: Any) -> None:
    """Raise ValueError unless value is a bool (1 and "yes" are not)."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{field}={value!r} must be true or false")


def check_choice(owner: str, field: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{owner}.{field}={value!r} is not allowed; choose one of {list(allowed)}")


def check_keys(path: str, given: Mapping[Any, Any], allowed: Iterable[str]) -> None:
    """Raise ValueError on the first key of `given` not in `allowed`, suggesting the closest one.

    Serve's own schema drops unknown keys silently: a typo would otherwise fall back to a default.
    """
    allowed = sorted(allowed)
    for key, value in given.items():
        if key in allowed:
            continue
        where = f"{path}.{key}" if path else f"{key}"
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"{where}={reprlib.repr(value)} is not a known key; allowed keys: {allowed}{hint}"
        )


def check_order(owner: str, *named: tuple[str, Any]) -> None:
    """Raise ValueError unless the (name, value) pairs ascend (ties allowed), naming both."""
    for (a, va), (b, vb) in itertools.pairwise(named):
        if va > vb:
            chain = " <= ".join(name for name, _ in named)
            raise ValueError(f"{owner}.{a}={va!r} must be <= {owner}.{b}={vb!r}; allowed: {chain}")
