"""The wait bound under overload (serving/llm/arrivals.py): an interactive request may wait for
a slot only as long as the next arrivals take to come; no bound while the rate is unknown or
for the tiers below interactive. Time is passed in."""

from __future__ import annotations

import pytest

from serving.llm.arrivals import ARRIVALS_AHEAD, MIN_ARRIVALS, WINDOW_S, ArrivalRate


def arrivals_every(rate: ArrivalRate, tier: str, gap_s: float, n: int, start: float = 0.0):
    for i in range(n):
        rate.arrive(tier, start + i * gap_s)
    return start + (n - 1) * gap_s


def test_the_bound_is_two_arrival_gaps_at_the_rate_seen_over_the_window():
    rate = ArrivalRate()
    now = arrivals_every(rate, "interactive", 0.1, 40)  # 10 req/s for 4 s
    assert rate.rate_per_s("interactive", now) == pytest.approx(10.0)
    assert rate.max_wait_s("interactive", now) == pytest.approx(ARRIVALS_AHEAD / 10.0)


def test_ten_times_the_overload_apps_capacity_allows_a_wait_of_a_fifteenth_of_a_second():
    rate = ArrivalRate()
    now = arrivals_every(rate, "interactive", 1 / 30, 120)  # 30 req/s: 10 x 3 req/s
    assert rate.max_wait_s("interactive", now) == pytest.approx(2 / 30, rel=0.05)
    # At the capacity itself (3 req/s) the bound is 0.67 s, above a 0.5 s TTFT budget.
    calm = ArrivalRate()
    now = arrivals_every(calm, "interactive", 1 / 3, 12)
    assert calm.max_wait_s("interactive", now) == pytest.approx(2 / 3)


def test_no_bound_below_min_arrivals_in_the_window():
    rate = ArrivalRate()
    now = arrivals_every(rate, "interactive", 0.1, MIN_ARRIVALS - 1)
    assert rate.max_wait_s("interactive", now) is None
    rate.arrive("interactive", now + 0.1)
    assert rate.max_wait_s("interactive", now + 0.1) is not None


def test_old_arrivals_leave_the_window():
    rate = ArrivalRate()
    now = arrivals_every(rate, "interactive", 0.01, 100)  # a burst of 100 in one second
    assert rate.max_wait_s("interactive", now) == pytest.approx(ARRIVALS_AHEAD / 50.0)
    later = now + WINDOW_S + 0.01  # the burst is over: the rate is unknown again
    assert rate.rate_per_s("interactive", later) == 0.0
    assert rate.max_wait_s("interactive", later) is None


def test_lower_tiers_are_never_bounded_and_do_not_count_as_interactive():
    rate = ArrivalRate()
    now = arrivals_every(rate, "offline", 0.01, 200)
    assert rate.rate_per_s("offline", now) == pytest.approx(100.0)
    assert rate.max_wait_s("offline", now) is None
    assert rate.max_wait_s("analytical", now) is None
    assert rate.max_wait_s("interactive", now) is None  # no interactive arrivals seen


@pytest.mark.parametrize(
    "kwargs, field",
    [({"window_s": 0.0}, "window_s"), ({"min_arrivals": 0}, "min_arrivals"),
     ({"arrivals_ahead": -1.0}, "arrivals_ahead")],
)  # fmt: skip
def test_bad_settings_are_errors_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ArrivalRate(**kwargs)
