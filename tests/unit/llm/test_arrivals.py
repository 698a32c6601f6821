"""The wait bound under overload (serving/llm/arrivals.py): while the ingress turns interactive
requests away, one may wait for a slot only as long as the next arrivals take to come; no bound
without sustained refusals (a burst that is queued) or for the tiers below interactive. Time is
passed in."""

from __future__ import annotations

import pytest

from serving.llm.arrivals import ARRIVALS_AHEAD, MIN_REFUSALS, WINDOW_S, WaitBound


def traffic(bound: WaitBound, tier: str, gap_s: float, n: int, refuse_every: int | None = 1):
    """`n` arrivals `gap_s` apart from t=0; every `refuse_every`-th of them refused."""
    for i in range(n):
        bound.arrived(tier, i * gap_s)
        if refuse_every and i % refuse_every == 0:
            bound.refused(tier, i * gap_s)
    return (n - 1) * gap_s


def test_under_sustained_refusals_the_bound_is_two_arrival_gaps():
    bound = WaitBound()
    now = traffic(bound, "interactive", 0.1, 40, refuse_every=2)  # 10 req/s, half refused
    assert bound.arrival_rate_per_s("interactive", now) == pytest.approx(10.0)
    assert bound.max_wait_s("interactive", now) == pytest.approx(ARRIVALS_AHEAD / 10.0)


def test_ten_times_the_overload_apps_capacity_allows_a_wait_of_a_fifteenth_of_a_second():
    bound = WaitBound()
    now = traffic(bound, "interactive", 1 / 30, 120)  # 30 req/s, most of them refused
    assert bound.max_wait_s("interactive", now) == pytest.approx(2 / 30, rel=0.05)


def test_a_burst_that_is_queued_and_not_refused_gets_no_bound():
    # 40 requests within 0.4 s, none refused: the replicas hold them within the TTFT budget,
    # and no later arrival is known to come and take a freed slot.
    bound = WaitBound()
    now = traffic(bound, "interactive", 0.01, 40, refuse_every=None)
    assert bound.arrival_rate_per_s("interactive", now) == pytest.approx(20.0)
    assert bound.max_wait_s("interactive", now) is None


def test_no_bound_below_min_refusals_in_the_window():
    bound = WaitBound()
    now = traffic(bound, "interactive", 0.1, 20, refuse_every=None)
    for i in range(MIN_REFUSALS - 1):
        bound.refused("interactive", now - i * 0.1)
    assert bound.max_wait_s("interactive", now) is None
    bound.refused("interactive", now)
    assert bound.max_wait_s("interactive", now) == pytest.approx(ARRIVALS_AHEAD / 10.0)


def test_the_bound_ends_when_the_refusals_leave_the_window():
    bound = WaitBound()
    now = traffic(bound, "interactive", 0.05, 40)
    assert bound.max_wait_s("interactive", now) is not None
    later = now + WINDOW_S + 0.01
    for i in range(20):  # traffic goes on, admitted: the overload is over
        bound.arrived("interactive", later + i * 0.05)
    assert bound.max_wait_s("interactive", later + 19 * 0.05) is None


def test_lower_tiers_are_never_bounded_and_do_not_count_as_interactive():
    bound = WaitBound()
    now = traffic(bound, "offline", 0.01, 200)
    assert bound.max_wait_s("offline", now) is None
    assert bound.max_wait_s("analytical", now) is None
    assert bound.max_wait_s("interactive", now) is None  # no interactive traffic seen


def test_events_nobody_asks_about_are_forgotten_as_new_ones_come():
    # An ingress runs for weeks: the offline tier is never asked for a bound, and interactive
    # only after its first refusal, so adding must drop what left the window.
    bound = WaitBound()
    for i in range(10_000):  # 10 events/s for 1000 s, never queried
        bound.arrived("offline", i * 0.1)
        bound.arrived("interactive", i * 0.1)
    for tier in ("offline", "interactive"):
        assert len(bound._arrived[tier]._times) <= WINDOW_S / 0.1 + 1  # the window's, no more


@pytest.mark.parametrize(
    "kwargs, field",
    [({"window_s": 0.0}, "window_s"), ({"min_refusals": 0}, "min_refusals"),
     ({"arrivals_ahead": -1.0}, "arrivals_ahead")],
)  # fmt: skip
def test_bad_settings_are_errors_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        WaitBound(**kwargs)
