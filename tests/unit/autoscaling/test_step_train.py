"""step.train: what the replay's training days teach, and what they leave to the live ticks."""

from __future__ import annotations

import pytest

from autoscaling import step
from autoscaling.forecast import Forecaster
from autoscaling.headroom import HeadroomConfig, HeadroomLearner
from autoscaling.policy import PolicyConfig

DAY_S = 86400.0
BIN_S = 600.0


def week_of_windows() -> list[float | None]:
    """Seven days of 10-minute means: 100 rps, 180 at every third window (jumps to learn)."""
    return [180.0 if i % 3 == 2 else 100.0 for i in range(7 * 144)]


def trained(**headroom) -> tuple[Forecaster, HeadroomLearner]:
    f, h = Forecaster(), HeadroomLearner(HeadroomConfig(**headroom))
    cfg = PolicyConfig(replica_capacity_rps=20.0)
    step.train(f, h, cfg, 0.0, BIN_S, week_of_windows(), lead_s=180.0)
    return f, h


def test_by_default_the_training_days_teach_the_forecaster_and_not_the_headroom():
    f, h = trained()
    assert f.history_days(7 * DAY_S) == pytest.approx(7.0)
    assert h.num_scores() == 0
    # nothing learned: the policy plans with R6's factor until live plans are scored
    assert h.headroom(7 * DAY_S).factor is None
    # ... but the volatility of the training week is known, so live scores fall into classes
    assert h.volatility.sigma() is not None and h.volatility.sigma() > 0


def test_scoring_the_training_windows_starts_the_headroom_from_their_errors():
    _, h = trained(score_training_windows=True)
    assert h.num_scores() == 7 * 144 - 1  # every window but the first, with no forecast yet
    head = h.headroom(7 * DAY_S)
    assert head.factor is not None and head.factor > 1.0  # the jumps the forecast missed


def test_score_training_windows_must_be_a_bool():
    with pytest.raises(ValueError, match="score_training_windows=1"):
        HeadroomConfig(score_training_windows=1)
