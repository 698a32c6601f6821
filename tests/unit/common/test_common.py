"""The shared layer: one nearest-rank percentile and one definition of the tiers."""

from __future__ import annotations

import pytest

from common.stats import percentile
from common.tiers import TIERS, Tier, check_tier, tiers_up_to


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 50) == 50
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile([7.0], 0) == 7.0


def test_percentile_of_nothing_is_the_given_default():
    assert percentile([], 99) == 0.0
    assert percentile([], 99, empty=None) is None


def test_percentile_refuses_a_q_outside_0_to_100():
    with pytest.raises(ValueError, match=r"q=101 is out of range"):
        percentile([1.0], 101)


def test_tiers_are_named_in_serving_order():
    assert TIERS == ("interactive", "analytical", "offline")
    assert [Tier.parse(t) for t in TIERS] == sorted(Tier)
    assert tiers_up_to("analytical") == ("interactive", "analytical")
    assert check_tier("offline") == "offline"
    with pytest.raises(ValueError, match=r"priority='batch' is not one of"):
        check_tier("batch")
