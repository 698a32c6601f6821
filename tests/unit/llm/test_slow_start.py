"""Slow start: a just-ready replica's share of its rank rises over the window; pure, no Ray."""

from __future__ import annotations

import itertools

import pytest

from serving.llm.slow_start import (
    MIN_FRACTION,
    SLOW_START_KEY,
    apply_slow_start,
    fraction_of,
    slow_start_fraction,
)


def shares(**by_name: float):
    """A replica's slow-start fraction by name; 1.0 (fully started) for the others."""
    return lambda name: by_name.get(name, 1.0)


def test_fraction_rises_linearly_from_the_floor_to_one_over_the_window():
    assert slow_start_fraction(0.0, 10.0) == pytest.approx(MIN_FRACTION)
    assert slow_start_fraction(5.0, 10.0) == pytest.approx(MIN_FRACTION + (1 - MIN_FRACTION) / 2)
    assert slow_start_fraction(10.0, 10.0) == 1.0
    assert slow_start_fraction(1e6, 10.0) == 1.0


def test_a_zero_window_disables_slow_start():
    assert slow_start_fraction(0.0, 0.0) == 1.0


def test_absent_or_unusable_fractions_read_as_fully_started():
    assert fraction_of(None) == 1.0
    assert fraction_of({}) == 1.0
    assert fraction_of({SLOW_START_KEY: 0.3}) == 0.3
    for bad in (0.0, -1.0, 1.5, True, "0.5", float("nan")):
        assert fraction_of({SLOW_START_KEY: bad}) == 1.0


def test_a_replica_keeps_its_rank_when_the_draw_is_below_its_fraction():
    ranks = [["new", "a"], ["b"]]
    assert apply_slow_start(ranks, shares(new=0.4), draw=lambda: 0.39) == [["new", "a"], ["b"]]


def test_otherwise_it_is_tried_after_every_other_rank():
    ranks = [["new", "a"], ["b"]]
    assert apply_slow_start(ranks, shares(new=0.4), draw=lambda: 0.4) == [["a"], ["b"], ["new"]]


def test_a_rank_left_empty_disappears_and_deferred_replicas_keep_their_order():
    ranks = [["n1"], ["a"], ["n2"]]
    out = apply_slow_start(ranks, shares(n1=0.1, n2=0.1), draw=lambda: 0.9)
    assert out == [["a"], ["n1", "n2"]]


def test_fully_started_replicas_never_draw():
    def no_draw() -> float:
        raise AssertionError("a fully started replica drew")

    assert apply_slow_start([["a", "b"]], shares(a=1.0), draw=no_draw) == [["a", "b"]]


def test_over_many_requests_the_new_replica_gets_about_its_fraction_first():
    draws = itertools.cycle([i / 100 for i in range(100)])
    firsts = [
        apply_slow_start([["new", "old"]], shares(new=0.25), lambda: next(draws))[0]
        for _ in range(100)
    ]
    share = sum("new" in first for first in firsts) / len(firsts)
    assert share == pytest.approx(0.25)
