"""The statsmodels forecast peers of benchmarks/forecast_accuracy.py (a benchmark extra: skipped
where statsmodels is not installed, as in CI)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("statsmodels")

from benchmarks._statsmodels_peers import DAY, HoltWinters, MSTLPeer


def daily(n: int) -> np.ndarray:
    t = np.arange(n)
    return 100.0 + 30.0 * np.sin(2 * np.pi * t / DAY)


@pytest.mark.parametrize("peer", [HoltWinters, MSTLPeer])
def test_last_value_until_two_days_then_the_season(peer):
    p = peer()
    # around two whole days, where MSTL drops a period that is not under half the series and
    # then fails with none left: the peer must keep answering
    for n in (DAY, 2 * DAY - 1, 2 * DAY, 2 * DAY + 1):
        assert np.isfinite(p.predict(daily(n), steps=2))
    assert p.predict(daily(DAY), steps=2) == pytest.approx(daily(DAY)[-1])
    # after three days it follows the season two windows ahead, not the last value
    n = 3 * DAY + 30
    truth = daily(n + 2)[-1]
    assert p.predict(daily(n), steps=2) == pytest.approx(truth, rel=0.03)
