"""The batch-closing rule (R2), length buckets (R10), staggered windows (R7), lanes (R5).

Pure: every test builds a queue and a `now`; nothing sleeps.
"""

from __future__ import annotations

import pytest

from serving.config.dynamic_batching import DynamicBatchingSection
from serving.embed.batching import (
    Batch,
    BatchPolicy,
    Wait,
    Waiting,
    bucket_of,
    next_batch,
    padded_tokens,
    refusal_s,
    required_fill,
)

T0 = 100.0
EDGES = (32, 64, 128, 256)


def policy(size=4, window_s=0.04, slices=1, edges=EDGES) -> BatchPolicy:
    return BatchPolicy(size, window_s, edges, slices)


def reqs(*arrivals, tokens=10, lane=0) -> list[Waiting]:
    return [Waiting(T0 + a, tokens, lane) for a in arrivals]


# --- R2: size or window ---------------------------------------------------------------------------


def test_empty_queue_waits_for_an_arrival():
    assert next_batch([], policy(), T0) == Wait(None)


def test_low_traffic_is_window_driven():
    queue = reqs(0.0, 0.01)
    assert next_batch(queue, policy(), T0 + 0.039) == Wait(pytest.approx(T0 + 0.04))
    assert next_batch(queue, policy(), T0 + 0.04) == Batch((0, 1), 0, 0, "window")


def test_peak_is_size_driven_and_takes_the_oldest_target_size():
    queue = reqs(0.003, 0.0, 0.001, 0.002, 0.004)
    decision = next_batch(queue, policy(size=4), T0 + 0.004)
    assert decision == Batch((1, 2, 3, 0), 0, 0, "full")  # arrival order, the newest stays


def test_zero_window_sends_whatever_is_there():
    assert next_batch(reqs(0.0), policy(window_s=0.0), T0) == Batch((0,), 0, 0, "window")


# --- R10: length buckets --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_tokens", "bucket"), [(1, 0), (32, 0), (33, 1), (64, 1), (200, 3), (256, 3), (999, 3)]
)
def test_bucket_edges_are_inclusive_upper_bounds_and_long_inputs_share_the_last(num_tokens, bucket):
    assert bucket_of(num_tokens, EDGES) == bucket


def test_short_and_long_requests_never_share_a_batch():
    queue = [Waiting(T0, 250), Waiting(T0 + 0.001, 8), Waiting(T0 + 0.002, 12)]
    decision = next_batch(queue, policy(), T0 + 0.04)
    assert decision == Batch((0,), 0, 3, "window")  # the oldest group goes first
    rest = [queue[1], queue[2]]
    assert next_batch(rest, policy(), T0 + 0.041) == Batch((0, 1), 0, 0, "window")


def test_buckets_fill_independently():
    queue = [Waiting(T0 + i * 0.001, 8 if i % 2 else 200) for i in range(8)]
    decision = next_batch(queue, policy(size=4), T0 + 0.008)
    assert decision.reason == "full"
    assert {queue[i].num_tokens for i in decision.indices} == {200}


def test_padding_cost_is_what_buckets_save():
    mixed, short = [8, 250, 10, 12], [8, 10, 12]
    assert padded_tokens(mixed) == 1000
    assert padded_tokens(short) + padded_tokens([250]) == 36 + 250


# --- R7: staggered windows ------------------------------------------------------------------------


def test_required_fill_drops_at_each_stagger_offset():
    p = policy(size=16, window_s=0.04, slices=4)
    fills = [required_fill(w, p) for w in (0.0, 0.009, 0.01, 0.02, 0.03, 0.039, 0.04, 1.0)]
    assert fills == [16, 16, 12, 8, 4, 4, 1, 1]


def test_one_slice_is_the_plain_rule():
    p = policy(size=16, window_s=0.04, slices=1)
    assert [required_fill(w, p) for w in (0.0, 0.039, 0.04)] == [16, 16, 1]


def test_staggered_group_leaves_early_when_fill_allows():
    queue = reqs(*(i * 0.001 for i in range(8)))  # 8 requests, target 16
    staggered = policy(size=16, window_s=0.04, slices=2)
    plain = policy(size=16, window_s=0.04, slices=1)
    assert next_batch(queue, staggered, T0 + 0.019) == Wait(pytest.approx(T0 + 0.02))
    assert next_batch(queue, staggered, T0 + 0.02) == Batch(tuple(range(8)), 0, 0, "window")
    assert next_batch(queue, plain, T0 + 0.02) == Wait(pytest.approx(T0 + 0.04))


def test_thin_staggered_group_still_waits_the_whole_window():
    queue = reqs(0.0, 0.001)
    p = policy(size=16, window_s=0.04, slices=4)
    assert next_batch(queue, p, T0 + 0.035) == Wait(pytest.approx(T0 + 0.04))
    assert isinstance(next_batch(queue, p, T0 + 0.04), Batch)


# --- R5: lanes ------------------------------------------------------------------------------------


def test_lanes_never_mix_and_interactive_goes_first():
    queue = reqs(0.0, 0.001, lane=1) + reqs(0.002, lane=0)
    decision = next_batch(queue, policy(), T0 + 0.05)
    assert decision == Batch((2,), 0, 0, "window")


def test_offline_runs_only_when_other_lanes_are_empty():
    offline = reqs(0.0, 0.001, lane=2)
    interactive = reqs(0.03, lane=0)
    blocked = next_batch(offline + interactive, policy(), T0 + 0.05)
    assert blocked == Wait(
        pytest.approx(T0 + 0.07)
    )  # the interactive one's window; offline is not sent
    assert next_batch(offline, policy(), T0 + 0.05) == Batch((0, 1), 2, 0, "window")


# --- R10: a bounded queue -------------------------------------------------------------------------


def test_queue_refuses_beyond_max_queue_with_the_estimated_wait():
    assert refusal_s(9, 1, 0.1, max_queue=10, max_queue_wait_s=None) is None
    assert refusal_s(10, 1, 0.1, max_queue=10, max_queue_wait_s=None) == pytest.approx(1.1)


def test_queue_refuses_when_estimated_wait_passes_the_budget():
    # 4 waiting + 1 new at 0.1 s each: 0.5 s of model time ahead of the newcomer
    assert refusal_s(4, 1, 0.1, max_queue=100, max_queue_wait_s=0.5) is None
    assert refusal_s(5, 1, 0.1, max_queue=100, max_queue_wait_s=0.5) == pytest.approx(0.6)
    assert refusal_s(0, 8, 0.1, max_queue=100, max_queue_wait_s=0.5) == pytest.approx(0.8)


# --- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_batch_size": 0}, "dynamic_batching.max_batch_size=0 is out of range; allowed: 1 <="),
        ({"max_batch_size": 512}, "max_batch_size <= 256"),
        ({"window_s": -0.01}, "dynamic_batching.window_s=-0.01 is out of range"),
        ({"bucket_edges_tokens": (64, 32)}, "must strictly ascend"),
        ({"bucket_edges_tokens": ()}, "must be a non-empty list"),
        ({"stagger_slices": 9}, "dynamic_batching.stagger_slices=9 is out of range; allowed: 1 <="),
        ({"tuner": "yes"}, "dynamic_batching.tuner='yes' must be true or false"),
        ({"p99_target_s": 0.0}, "dynamic_batching.p99_target_s=0.0 is out of range"),
        ({"max_queue_wait_s": 0}, "dynamic_batching.max_queue_wait_s=0 is out of range"),
    ],
)
def test_config_errors_name_key_value_and_range(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DynamicBatchingSection(**overrides)


def test_app_config_embed_task_and_dynamic_batching_section():
    from serving.config import AppConfig

    args = {"model": {"task": "embed"}, "dynamic_batching": {"window_s": 0.03}}
    cfg = AppConfig.from_args(args)
    assert cfg.dynamic_batching == DynamicBatchingSection(window_s=0.03)
    assert AppConfig.from_args(cfg.to_dict()) == cfg
    assert AppConfig.from_args(None).dynamic_batching is None
    with pytest.raises(ValueError, match=r"applies only to model\.task: embed"):
        AppConfig.from_args({"dynamic_batching": {"window_s": 0.03}})
    with pytest.raises(ValueError, match=r"dynamic_batching\.windw_s.*did you mean 'window_s'"):
        AppConfig.from_args({"model": {"task": "embed"}, "dynamic_batching": {"windw_s": 0.03}})
    with pytest.raises(ValueError, match=r"model.task='rerank' is not allowed"):
        AppConfig.from_args({"model": {"task": "rerank"}})


def test_cluster_yaml_ships_an_embedding_app_next_to_the_llm():
    from pathlib import Path

    from serving.config import load_cluster_yaml

    path = Path(__file__).resolve().parents[3] / "cluster.yaml"
    embed = load_cluster_yaml(path, "embeddings")
    assert (embed.model.task, embed.model.source) == ("embed", "embedded")
    assert embed.dynamic_batching.max_batch_size == 16
    assert embed.dynamic_batching.window_s == 0.02
    assert load_cluster_yaml(path).model.task == "generate"
