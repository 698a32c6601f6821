"""The validation protocol (autoscaling/replay/protocol.py): settings are chosen on rolling
origins and synthetic shapes; the shared traces' judged days (8 on) are a test set that the
tuning gate refuses."""

from __future__ import annotations

import pytest

from autoscaling.replay.protocol import (
    Split,
    for_tuning,
    rolling_origins,
    shared_test_split,
    validation_splits,
)
from autoscaling.replay.runner import ReplaySettings


def test_rolling_origins_train_then_judge_the_next_days_to_the_end():
    got = [(s.train_days, s.judge_days) for s in rolling_origins("smooth", 14, 7, 3)]
    assert got == [(7, 3), (10, 4)]  # train 1-7 judge 8-10; train 1-10 judge 11-14
    assert [(s.train_days, s.judge_days) for s in rolling_origins("m-small", 7, 5, 2)] == [(5, 2)]
    with pytest.raises(ValueError, match="first_train_days=7"):
        rolling_origins("x", 7, 7, 2)


def test_no_validation_split_judges_a_shared_traces_test_day():
    splits = validation_splits(["smooth", "weak_daily_ar"])
    shared = [s for s in splits if s.source in ("m-small", "m-large")]
    assert shared and all(s.train_days + s.judge_days <= 7 for s in shared)
    assert {s.role for s in splits} == {"validation"}
    assert len(splits) == 2 * 2 + 2


def test_the_tuning_gate_refuses_the_test_set_by_name():
    with pytest.raises(ValueError, match=r"m-large \(test\): train 1-7, judge 8-end"):
        for_tuning([shared_test_split("m-large")])
    # a "validation" split that reaches day 8 of a shared trace is refused too
    with pytest.raises(ValueError, match="m-small"):
        for_tuning([Split("m-small", 7, 3, "validation")])
    ok = [Split("smooth", 7, 3, "validation")]
    assert for_tuning(ok) == ok


def test_a_split_sets_the_replays_days():
    s = Split("smooth", 10, 4, "validation").settings(ReplaySettings(seed=3))
    assert (s.train_days, s.judge_days, s.seed) == (10.0, 4, 3)
    with pytest.raises(ValueError, match="role='train'"):
        Split("smooth", 7, 3, "train")


def test_the_defaults_say_what_they_were_fit_on_and_name_real_settings():
    from autoscaling.fit_on import FIT_ON
    from autoscaling.forecast import ForecastConfig
    from autoscaling.headroom import HeadroomConfig
    from autoscaling.policy_config import PolicyConfig

    owners = {
        "HeadroomConfig": HeadroomConfig,
        "ForecastConfig": ForecastConfig,
        "ReplaySettings": ReplaySettings,
        "PolicyConfig": PolicyConfig,
    }
    for key, fit_on in FIT_ON.items():
        owner, name = key.split(".")
        assert name in owners[owner].__dataclass_fields__, key
        assert fit_on  # every entry says something
    tuned = ("feedback_gain_per_s", "num_volatility_classes", "hot_quantile", "stabilization")
    tuned += ("score_window_s", "score_training_windows", "trend_window_s", "queue_tail_share")
    tuned += ("rate_window_s", "carry_window_s", "profile_weight", "num_bands")
    assert all(any(t in k for k in FIT_ON) for t in tuned)
