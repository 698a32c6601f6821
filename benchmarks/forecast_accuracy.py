"""Forecast accuracy 20 minutes ahead on ServeGen m-small and m-large, against two naive peers.

    python benchmarks/forecast_accuracy.py [--quick] [--json PATH]

For every 10-minute window j (the target) the forecasters know windows up to j - 3, i.e. the
prediction is made at the start of window j - 2, 20 minutes before the target window starts:
* tideserve: autoscaling.forecast.Forecaster fed every known window (gaps as None), asked for
  rate_at_lead at the target window's centre (lead 25 min).
* seasonal_naive: the same window yesterday (j - 144); if that was a gap, two days ago; else last.
* last_value: the latest known non-gap window.
* holt_winters, mstl: statsmodels peers (benchmarks/_statsmodels_peers.py), an optional extra:
  skipped with a message when statsmodels is not installed.
Targets that are gaps are not scored; scoring starts on day 2 (the seasonal peer needs a day).
Errors: MAPE and the p90 of the absolute percentage error, over days 2-14 and days 8-14.
--quick scores only days 8-10 (same code path, fewer windows).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaling.forecast import ForecastConfig, Forecaster
from autoscaling.replay.traces import load_trace
from benchmarks import _statsmodels_peers as sm_peers
from benchmarks._common import TRACES_DIR, log, write_json

BIN = 600.0
DAY = 144  # windows per day
AHEAD = 2  # windows between the prediction time and the target window's start (20 min)


def _errors(pred: list[float], actual: list[float]) -> dict:
    p, a = np.asarray(pred), np.asarray(actual)
    ape = np.abs(p - a) / a * 100
    return {"mape_pct": float(ape.mean()), "p90_ape_pct": float(np.percentile(ape, 90))}


def evaluate(name: str, first_day: int, last_day: int, with_statsmodels: bool) -> dict:
    r = load_trace(TRACES_DIR / f"servegen_language_{name}_total.csv").rates_rps
    fc = Forecaster(ForecastConfig(bin_s=BIN))
    preds = {"tideserve": [], "seasonal_naive": [], "last_value": []}
    peers = {"holt_winters": sm_peers.HoltWinters(), "mstl": sm_peers.MSTLPeer()}
    peers = peers if with_statsmodels else {}
    preds.update({k: [] for k in peers})
    actual, days = [], []
    known = 0  # windows fed to the forecaster so far
    last_valid = np.nan
    for j in range(first_day * DAY, min(last_day * DAY, len(r))):
        now_idx = j - AHEAD  # prediction made at the start of this window
        while known < now_idx:
            v = r[known]
            fc.observe((known + 0.5) * BIN, None if np.isnan(v) else float(v))
            last_valid = v if not np.isnan(v) else last_valid
            known += 1
        if np.isnan(r[j]) or j < DAY:
            continue
        now_s = now_idx * BIN
        preds["tideserve"].append(fc.predict(now_s, (AHEAD + 0.5) * BIN, 0.0).rate_at_lead_rps)
        seasonal = r[j - DAY]
        if np.isnan(seasonal) and j >= 2 * DAY:
            seasonal = r[j - 2 * DAY]
        preds["seasonal_naive"].append(last_valid if np.isnan(seasonal) else seasonal)
        preds["last_value"].append(last_valid)
        for peer_name, peer in peers.items():  # known: windows before now_idx; target: j
            preds[peer_name].append(peer.predict(r[:now_idx], j - now_idx + 1))
        if j % DAY == 0:
            log(f"{name}: day {j // DAY + 1} of {last_day}")
        actual.append(r[j])
        days.append(j // DAY + 1)
    days_arr = np.asarray(days)
    out = {"trace": name, "num_scored_windows": len(actual), "systems": {}}
    for sysname, p in preds.items():
        row = {"all_scored_days": _errors(p, actual)}
        late = days_arr >= 8
        if late.any():
            row["days_8_14"] = _errors(np.asarray(p)[late], np.asarray(actual)[late])
        out["systems"][sysname] = row
    ours = out["systems"]["tideserve"]["all_scored_days"]["mape_pct"]
    out["ratios"] = {
        f"mape_{peer}_over_tideserve": out["systems"][peer]["all_scored_days"]["mape_pct"] / ours
        for peer in preds
        if peer != "tideserve"
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    first, last = (7, 10) if args.quick else (1, 14)
    skipped = sm_peers.available()
    if skipped:
        print(skipped)
    results = [evaluate(n, first, last, skipped is None) for n in ("m-small", "m-large")]
    for res in results:
        print(f"{res['trace']}: {res['num_scored_windows']} windows scored")
        for sysname, row in res["systems"].items():
            a = row["all_scored_days"]
            late = row.get("days_8_14", {})
            print(
                f"  {sysname:<15} MAPE {a['mape_pct']:6.2f}%  p90 APE {a['p90_ape_pct']:6.2f}%"
                + (
                    f"   (days 8-14: {late['mape_pct']:.2f}% / {late['p90_ape_pct']:.2f}%)"
                    if late
                    else ""
                )
            )
    report = {
        "benchmark": "forecast_accuracy",
        "quick": args.quick,
        "horizon": "20 min ahead of the target 10-minute window (known data ends 20 min before)",
        "scored_days": f"{first + 1}-{last}",
        "statsmodels_peers": skipped or "holt_winters and mstl included",
        "results": results,
        "wall_s": time.perf_counter() - t0,
    }
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
