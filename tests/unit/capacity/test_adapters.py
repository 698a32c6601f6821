"""How many LoRA slots a replica needs (capacity/adapters.py slots_per_replica): from the
adapters' count and popularity, the replicas, and the requests each runs at once."""

from __future__ import annotations

import pytest

from capacity.adapters import _che_miss, lora_slot_bytes, slots_per_replica
from serving.tiny_models import tiny_config

ZIPF_50 = [1 / (k + 1) for k in range(50)]


def test_uniform_popularity_needs_nearly_every_adapter_in_a_slot():
    # LRU over 8 equally popular adapters misses 1 - S/8 of requests (Che's approximation)
    assert _che_miss([1 / 8] * 8, 4) == pytest.approx(0.5, abs=1e-6)
    plan = slots_per_replica([1.0] * 8, num_replicas=1, running_per_replica=1)
    assert plan.slots == 8 and plan.miss_fraction == 0.0


def test_skewed_popularity_needs_fewer_slots_than_adapters():
    plan = slots_per_replica(ZIPF_50, num_replicas=2, running_per_replica=4)
    assert plan.adapters_per_replica == 25
    assert plan.slots < 25 and plan.miss_fraction <= 0.05
    looser = slots_per_replica(ZIPF_50, 2, 4, max_miss_fraction=0.2)
    assert looser.slots < plan.slots and looser.miss_fraction <= 0.2


def test_more_replicas_mean_fewer_adapters_and_slots_each():
    two = slots_per_replica(ZIPF_50, 2, 4)
    five = slots_per_replica(ZIPF_50, 5, 4)
    assert five.adapters_per_replica == 10 and five.slots < two.slots


def test_running_requests_pin_their_adapters_slots():
    # 16 running requests over 10 equally popular adapters use ~8.1 of them at once
    plan = slots_per_replica([1.0] * 10, 1, running_per_replica=16, max_miss_fraction=1.0)
    assert plan.distinct_running == pytest.approx(10 * (1 - 0.9**16))
    assert plan.slots == 9  # ceil of the pinned ones, though any miss rate is allowed


def test_one_adapter_needs_one_slot_and_bytes_follow_the_slots():
    cfg = tiny_config("llama")
    plan = slots_per_replica([3.0], 1, 8, config=cfg, dtype="float32", max_lora_rank=8)
    assert plan.slots == 1 and plan.slot_bytes == lora_slot_bytes(cfg, "float32", 1, 8)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (([], 1, 1), "popularity"),
        (([0.0, 0.0], 1, 1), "not all 0"),
        (([1.0, float("nan")], 1, 1), "popularity"),
        (([1.0], 0, 1), "num_replicas"),
        (([1.0], 1, 0), "running_per_replica"),
    ],
)
def test_bad_inputs_are_errors_naming_them(args, says):
    with pytest.raises(ValueError, match=says):
        slots_per_replica(*args)


def test_zipf_popularity_is_one_over_rank_to_the_exponent_and_names_bad_fields():
    from capacity.adapters import zipf_popularity

    assert zipf_popularity(50) == ZIPF_50
    assert zipf_popularity(3, 2.0) == [1.0, 0.25, 1 / 9]
    with pytest.raises(ValueError, match="num_adapters"):
        zipf_popularity(0)
    with pytest.raises(ValueError, match="exponent"):
        zipf_popularity(5, -1.0)
