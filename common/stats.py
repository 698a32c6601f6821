"""The one percentile of the project: nearest rank, as the SLO tables and histograms read it."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

D = TypeVar("D", float, None)


def percentile(values: Iterable[float], q: float, *, empty: D = 0.0) -> float | D:
    """The smallest value with at least q% of the values at or below it (q in [0, 100]).

    Nearest rank: p99 of 1..100 is 99 and p50 of 1..4 is 2; a value that was really observed
    is returned, never an interpolation. `empty` is returned for no values.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q={q!r} is out of range; allowed: 0 <= q <= 100")
    ordered = sorted(values)
    if not ordered:
        return empty
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
