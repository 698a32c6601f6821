"""Trace loading for the replay: per-request CSVs (Azure) and rate series (ServeGen) -> a RateTrace.

Both become a per-second arrival series in replay.py; here they are kept at their own resolution:
a per-request trace is binned to 1 s counts, a rate series keeps its windows. Missing windows
(ServeGen's all-zero collection gaps) become NaN and are never read as zero traffic.
"""

from __future__ import annotations

import csv
import gzip
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class RateTrace:
    name: str
    kind: str  # "rate_series" (window means) or "per_request" (1 s arrival counts)
    bin_s: float
    start_s: float  # time of day of the first bin, seconds after midnight
    rates_rps: np.ndarray  # one value per bin; NaN = missing window

    @property
    def span_s(self) -> float:
        return len(self.rates_rps) * self.bin_s

    @property
    def num_gaps(self) -> int:
        return int(np.isnan(self.rates_rps).sum())

    def gaps_filled(self) -> np.ndarray:
        """Rates with missing windows linearly interpolated (for simulated traffic only)."""
        r = self.rates_rps.copy()
        bad = np.isnan(r)
        if bad.all():
            raise ValueError(f"trace {self.name}: every window is missing")
        idx = np.arange(len(r))
        r[bad] = np.interp(idx[bad], idx[~bad], r[~bad])
        return r


def _open(path: Path):
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")


def load_trace(path: str | Path) -> RateTrace:
    """Read a ServeGen total (`window_start_s,total_rate_rps`) or an Azure per-request CSV."""
    path = Path(path)
    with _open(path) as f:
        header = next(csv.reader(f))
    cols = [c.strip() for c in header]
    if "window_start_s" in cols and ("total_rate_rps" in cols or "rate_rps" in cols):
        return _load_rate_series(path, "total_rate_rps" if "total_rate_rps" in cols else "rate_rps")
    if "TIMESTAMP" in cols:
        return _load_per_request(path)
    raise ValueError(
        f"{path}: unknown trace columns {cols}; expected window_start_s,total_rate_rps (ServeGen) "
        "or TIMESTAMP,ContextTokens,GeneratedTokens (Azure)"
    )


def _load_rate_series(path: Path, column: str) -> RateTrace:
    starts, rates = [], []
    with _open(path) as f:
        for row in csv.DictReader(f):
            starts.append(float(row["window_start_s"]))
            rates.append(float(row[column]))
    if len(starts) < 2:
        raise ValueError(f"{path}: need at least 2 windows, found {len(starts)}")
    bin_s = starts[1] - starts[0]
    if bin_s <= 0 or not np.allclose(np.diff(starts), bin_s):
        raise ValueError(f"{path}: windows must be evenly spaced")
    r = np.asarray(rates, dtype=float)
    r[r <= 0] = np.nan  # an all-zero window is a collection gap, not idle time (traces/README)
    return RateTrace(_trace_name(path), "rate_series", bin_s, starts[0] % 86400.0, r)


def _load_per_request(path: Path) -> RateTrace:
    with _open(path) as f:
        stamps = [
            datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]) for row in csv.DictReader(f)
        ]
    if not stamps:
        raise ValueError(f"{path}: no requests")
    t0 = min(stamps)
    secs = np.array([(s - t0).total_seconds() for s in stamps])
    counts = np.bincount(np.floor(secs).astype(int)).astype(float)
    midnight = t0.replace(hour=0, minute=0, second=0, microsecond=0)
    start = math.floor((t0 - midnight).total_seconds())
    return RateTrace(_trace_name(path), "per_request", 1.0, float(start), counts)


def _trace_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv"):
        name = name.removesuffix(suffix)
    return name
