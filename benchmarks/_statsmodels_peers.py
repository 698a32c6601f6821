"""Holt-Winters and MSTL forecast peers for benchmarks/forecast_accuracy.py (optional extra).

statsmodels is a benchmark extra (`pip install -e .[bench]`); without it `available()` says why and
the benchmark skips these peers. Both see the same known windows as tideserve (gaps linearly
interpolated, for fitting only) and forecast the same target window:
* holt_winters: additive daily seasonality (144 windows), no trend; its parameters are fitted
  once a day, and before every prediction the fixed-parameter model is re-run over all known
  windows (filtering only), so it predicts from the latest data as the others do.
* Both predict the last value until two whole days are known (their seasonal starts need them).
* mstl: MSTL decomposition (daily, and weekly once more than two weeks are known) refitted
  once a day; the prediction is the mean deseasonalised level of the last two known windows
  plus each seasonal component one period before the target.
"""

from __future__ import annotations

import warnings

import numpy as np

DAY = 144


def available() -> str | None:
    """None when statsmodels imports, else the reason to print."""
    try:
        import statsmodels  # noqa: F401
    except ImportError:
        return (
            "statsmodels is not installed (pip install -e .[bench]): Holt-Winters and MSTL skipped"
        )
    return None


def _filled(known: np.ndarray) -> np.ndarray:
    x = known.copy()
    bad = np.isnan(x)
    if bad.any():
        idx = np.arange(len(x))
        x[bad] = np.interp(idx[bad], idx[~bad], x[~bad])
    return x


class HoltWinters:
    def __init__(self) -> None:
        self._params: dict | None = None
        self._fitted_day = -1

    def predict(self, known: np.ndarray, steps: int) -> float:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        y = _filled(known)
        if len(y) < 2 * DAY:  # it needs two whole days to start its seasonals: last value
            return float(y[-1])
        model = ExponentialSmoothing(y, seasonal="add", seasonal_periods=DAY, trend=None)
        day = len(y) // DAY
        if day != self._fitted_day:
            with warnings.catch_warnings():  # a convergence warning per daily fit; the fit stands
                warnings.simplefilter("ignore")
                res = model.fit()
            self._params = {
                "smoothing_level": res.params["smoothing_level"],
                "smoothing_seasonal": res.params["smoothing_seasonal"],
            }
            self._fitted_day = day
        else:
            res = model.fit(optimized=False, **self._params)
        return float(res.forecast(steps)[-1])


class MSTLPeer:
    def __init__(self) -> None:
        self._fitted_day = -1
        self._seasonal: np.ndarray | None = None  # (n, k) seasonal components at fit time
        self._periods: tuple[int, ...] = ()

    def predict(self, known: np.ndarray, steps: int) -> float:
        from statsmodels.tsa.seasonal import MSTL

        y = _filled(known)
        # MSTL drops a period that is not under half the series (and then fails with no
        # period left): it needs more than two whole days; last value until then
        if len(y) <= 2 * DAY:
            return float(y[-1])
        day = len(y) // DAY
        if day != self._fitted_day:
            self._periods = (DAY, 7 * DAY) if len(y) > 14 * DAY else (DAY,)
            res = MSTL(y, periods=self._periods).fit()
            seasonal = np.asarray(res.seasonal)
            self._seasonal = seasonal.reshape(len(y), -1)
            self._fitted_day = day
        seas = self._seasonal
        n_fit = len(seas)
        target = len(y) - 1 + steps

        def component(k: int, t: int) -> float:
            period = self._periods[k]
            back = t - period * -(-(t - n_fit + 1) // period)  # whole periods back, in the fit
            return float(seas[back, k])

        level = np.mean([y[t] - sum(component(k, t) for k in range(seas.shape[1]))
                         for t in (len(y) - 2, len(y) - 1)])  # fmt: skip
        return float(level + sum(component(k, target) for k in range(seas.shape[1])))
