"""How long a replica in the replay takes from the ask to serving: a constant, or a draw per start.

A constant cold start (the replay's default, 120 s) makes every start alike, so nothing in the
replay rewards a controller for planning on a high percentile of its starts rather than on their
typical length. `ColdStarts` holds measured samples instead (for example the live starts that
`benchmarks/cold_start.py` records, deploy to ready) and the simulator draws each start from
them, uniformly with replacement, from a generator seeded per replay, so every policy meets the
same distribution and a replay is repeatable. Each controller plans on what it could know:

* tideserve, like the live controller (autoscaling/cold_start.py), on the p95 of the starts,
  nearest rank, plus its `cold_start_margin_s`;
* the oracles, which know the future, on the longest start;
* the next-window yardstick on the p95, as tideserve.

Pure; numpy only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.stats import percentile

_STREAM = 0xC01D  # keys the draws apart from the arrivals' generator, which the seed alone seeds


@dataclass(frozen=True)
class ColdStarts:
    samples_s: tuple[float, ...]
    source: str = "constant"

    def __post_init__(self) -> None:
        if not self.samples_s:
            raise ValueError("samples_s=() is empty; allowed: at least one cold start in seconds")
        bad = [s for s in self.samples_s if not (math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(f"samples_s holds {bad!r}; allowed: finite seconds > 0")

    @classmethod
    def constant(cls, seconds: float) -> ColdStarts:
        return cls((float(seconds),))

    @classmethod
    def from_cold_start_result(cls, path: str | Path) -> ColdStarts:
        """Every trial's deploy-to-ready time in a `benchmarks/cold_start.py` result file (a
        node's first start, with an empty model cache, included as measured)."""
        data = json.loads(Path(path).read_text())
        trials = data.get("trials") if isinstance(data, dict) else None
        if not trials:
            raise ValueError(f"{path}: no 'trials' list; expected a cold_start.py result file")
        samples = tuple(float(t["deploy_to_ready_s"]) for t in trials if "deploy_to_ready_s" in t)
        if len(samples) != len(trials):
            raise ValueError(f"{path}: a trial has no 'deploy_to_ready_s'")
        machine = (data.get("machine") or {}).get("cpu", "a machine not recorded")
        return cls(samples, f"{Path(path).name}: {len(samples)} starts measured on {machine}")

    @classmethod
    def load(cls, path: str | Path | None, constant_s: float) -> ColdStarts:
        """A `--cold-starts FILE` flag's starts: the file's trials, or every start `constant_s`
        when no file was given."""
        return cls.constant(constant_s) if path is None else cls.from_cold_start_result(path)

    @property
    def is_constant(self) -> bool:
        return len(set(self.samples_s)) == 1

    @property
    def median_s(self) -> float:
        return percentile(self.samples_s, 50.0)

    @property
    def p95_s(self) -> float:
        return percentile(self.samples_s, 95.0)

    @property
    def max_s(self) -> float:
        return max(self.samples_s)

    def sampler(self, seed: int) -> Callable[[int], list[float]]:
        """`draw(n)`: n cold starts, each one of the samples, from a generator seeded by `seed`."""
        if self.is_constant:
            return lambda n: [self.samples_s[0]] * n  # no generator: the constant replay as before
        rng = np.random.default_rng([seed, _STREAM])  # not the stream of the Poisson arrivals
        pool = np.asarray(self.samples_s, dtype=float)
        return lambda n: rng.choice(pool, size=n).tolist() if n > 0 else []

    def describe(self) -> dict:
        return {
            "source": self.source,
            "samples_s": list(self.samples_s),
            "median_s": self.median_s,
            "p95_s": self.p95_s,
            "max_s": self.max_s,
        }
