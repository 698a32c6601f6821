"""A replica's start-up phases: marked in order, each once, time passed in."""

from __future__ import annotations

import pytest

from serving.llm.startup import PHASES, StartupClock, StartupPhases


def test_each_phase_is_the_time_since_the_previous_mark():
    clock = StartupClock(now_s=100.0)
    for phase, at_s in zip(PHASES, (100.5, 101.0, 104.0, 104.25, 104.75), strict=True):
        clock.mark(phase, now_s=at_s)
    phases = clock.phases()
    assert phases == StartupPhases(0.5, 0.5, 3.0, 0.25, 0.5)
    assert phases.total_s == pytest.approx(4.75)
    assert phases.as_dict() == {
        "setup": 0.5,
        "resolve": 0.5,
        "load": 3.0,
        "self_check": 0.25,
        "warm": 0.5,
    }


def test_phases_out_of_order_or_unknown_are_refused_naming_them():
    clock = StartupClock(now_s=0.0)
    with pytest.raises(ValueError, match="'load' out of order: expected 'setup'"):
        clock.mark("load", now_s=1.0)
    with pytest.raises(ValueError, match="'compile' is not one of"):
        clock.mark("compile", now_s=1.0)


def test_a_clock_going_backwards_counts_zero_not_negative():
    clock = StartupClock(now_s=10.0)
    clock.mark("setup", now_s=9.0)
    assert clock.phases().setup_s == 0.0
