"""Violation episodes of a replay, and whether a step up of the trace's rate started them."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.replay.episodes import episodes, step_ratio_at, summarise

BIN_S = 100


def test_episodes_are_the_maximal_runs_of_bad_seconds():
    bad = np.array([0, 1, 1, 0, 0, 1, 0, 1, 1, 1], dtype=bool)
    assert episodes(bad) == [(1, 3), (5, 6), (7, 10)]
    assert episodes(np.zeros(5, dtype=bool)) == []


def test_step_ratio_compares_a_window_with_the_one_before_it():
    arrivals = np.r_[np.full(BIN_S, 10.0), np.full(BIN_S, 15.0)]
    assert step_ratio_at(arrivals, 130, BIN_S) == pytest.approx(1.5)
    assert np.isnan(step_ratio_at(arrivals, 30, BIN_S))  # the first window has none before it


def traffic_with_a_step_and_a_blip() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three windows at 10, 20, 20 rps; TTFT misses the SLO for 40 s after the step up (a
    shortfall) and for 10 s in the calm third window (a blip no step explains)."""
    arrivals = np.r_[np.full(BIN_S, 10.0), np.full(BIN_S, 20.0), np.full(BIN_S, 20.0)]
    ttft = np.full(3 * BIN_S, 0.3)
    ttft[105:145] = 2.0
    ttft[250:260] = 2.0
    return arrivals, ttft, np.ones(len(arrivals), dtype=bool)  # every second scored


def test_the_violations_after_a_step_up_are_told_apart_from_the_rest():
    arrivals, ttft, scored = traffic_with_a_step_and_a_blip()
    out = summarise(ttft, arrivals, scored, 1.0, BIN_S, reaction_floor_s=50.0)
    assert out["num_episodes"] == 2
    assert out["num_after_step_up"] == 1
    assert out["violations_after_step_up_share"] == pytest.approx(40 * 20 / (40 * 20 + 10 * 20))
    assert out["duration_s_after_step_up_by_violation"] == 40


def test_an_episode_starting_after_the_reaction_floor_is_not_blamed_on_the_step():
    arrivals, ttft, scored = traffic_with_a_step_and_a_blip()
    # with a 4 s floor, an episode starting 5 s into the window was the policy's own doing
    out = summarise(ttft, arrivals, scored, 1.0, BIN_S, reaction_floor_s=4.0)
    assert out["num_after_step_up"] == 0
    assert out["violations_after_step_up_share"] == 0.0
    assert out["duration_s_after_step_up_by_violation"] is None


def test_unscored_seconds_are_neither_violations_nor_episodes():
    arrivals, ttft, scored = traffic_with_a_step_and_a_blip()
    scored[240:300] = False  # a trace gap over the blip
    out = summarise(ttft, arrivals, scored, 1.0, BIN_S, reaction_floor_s=50.0)
    assert out["num_episodes"] == 1
    assert out["violations_after_step_up_share"] == 1.0


def test_the_typical_episode_is_weighted_by_its_violations_not_counted():
    arrivals = np.r_[np.full(BIN_S, 10.0), np.full(BIN_S, 20.0), np.full(BIN_S, 40.0)]
    ttft = np.full(3 * BIN_S, 0.3)
    ttft[105:145] = 2.0  # 40 s at 20 rps: 800 violations
    ttft[205:215] = 2.0  # 10 s at 40 rps: 400 violations
    scored = np.ones(len(arrivals), dtype=bool)
    out = summarise(ttft, arrivals, scored, 1.0, BIN_S, reaction_floor_s=50.0)
    assert out["num_after_step_up"] == 2
    assert out["duration_s_after_step_up_by_violation"] == pytest.approx(
        (800 * 40 + 400 * 10) / 1200
    )
