"""The TTFT prediction (serving/llm/ttft.py) on constructed load snapshots: no engine, no Ray."""

from __future__ import annotations

import pickle

import pytest

from serving.engine.load import LoadSnapshot, QueueSummary, expected_output_tokens
from serving.llm.ttft import decode_step_s, predict_ttft, prefill_s


def load(running=(), waiting=None, slots=2, fixed=0.01, per_token=0.001, budget=64, at=100.0):
    return LoadSnapshot(
        taken_s=at,
        step_fixed_s=fixed,
        step_per_token_s=per_token,
        max_batched_tokens=budget,
        slots=slots,
        running_remaining_tokens=running,
        waiting=waiting or {},
    )


def test_an_idle_engine_predicts_one_step_plus_the_prefill():
    snap = load()
    p = predict_ttft(snap, "interactive", 10, now=100.0)
    assert p.wait_s == 0.0 and p.next_free_s == 0.0
    step = 0.01 + 0.001 * 2  # a full decode step
    assert p.ttft_s == pytest.approx(step + 0.01 + 0.001 * (10 + 1))


def test_full_slots_wait_for_the_first_running_sequence_to_finish():
    snap = load(running=(40, 10))  # two slots, both busy: the one with 10 tokens left frees first
    p = predict_ttft(snap, "interactive", 4, now=100.0)
    assert p.wait_s == pytest.approx(10 * decode_step_s(snap))
    assert p.next_free_s == pytest.approx(p.wait_s)
    later = predict_ttft(snap, "interactive", 4, now=100.05)  # time passed: the wait shrinks
    assert later.ttft_s == pytest.approx(p.ttft_s - 0.05)
    gone = predict_ttft(snap, "interactive", 4, now=101.0)
    assert gone.wait_s == 0.0


def test_interactive_work_counts_offline_slots_as_free_other_tiers_wait_for_them():
    # both slots busy: one interactive sequence with 40 tokens left, one offline with 10 (last)
    snap = LoadSnapshot(100.0, 0.01, 0.001, 64, 2, (40, 10), num_running_offline=1)
    assert predict_ttft(snap, "interactive", 4, now=100.0).wait_s == 0.0  # offline yields
    analytical = predict_ttft(snap, "analytical", 4, now=100.0)
    assert analytical.wait_s == pytest.approx(10 * decode_step_s(snap))
    assert pickle.loads(pickle.dumps(snap)) == snap


def test_requests_waiting_in_this_and_higher_tiers_are_ahead_lower_tiers_are_not():
    queue = QueueSummary(num=2, prompt_tokens_mean=8, output_tokens_mean=20)
    busy = (10, 30)
    alone = predict_ttft(load(running=busy), "analytical", 4, 100.0)
    behind_interactive = predict_ttft(
        load(running=busy, waiting={"interactive": queue}), "analytical", 4, 100.0
    )
    behind_offline = predict_ttft(
        load(running=busy, waiting={"offline": queue}), "analytical", 4, 100.0
    )
    assert behind_offline.ttft_s == pytest.approx(alone.ttft_s)
    # Two ahead: the first takes the slot freeing at 10 steps, the second the one at 30 steps,
    # the new request the slot the first frees again: 10 steps + its prefill + 20 decode steps.
    snap = load(running=busy)
    step = decode_step_s(snap)
    expected_wait = 10 * step + prefill_s(snap, 8) + 20 * step
    assert behind_interactive.wait_s == pytest.approx(expected_wait)
    assert behind_interactive.ttft_s > alone.ttft_s


def test_a_slower_measured_step_predicts_a_longer_wait():
    fast = predict_ttft(load(running=(20, 20)), "interactive", 4, 100.0)
    slow = predict_ttft(load(running=(20, 20), fixed=0.05), "interactive", 4, 100.0)
    assert slow.wait_s > 3 * fast.wait_s


def test_a_long_prompt_prefills_in_chunks():
    snap = load(budget=16)
    assert prefill_s(snap, 40) == pytest.approx(3 * 0.01 + 0.001 * (40 + 3 * 1))
    assert prefill_s(snap, 16) == pytest.approx(0.01 + 0.001 * (16 + 1))


def test_free_in_is_the_excess_over_the_budget():
    p = predict_ttft(load(running=(100, 100)), "interactive", 4, 100.0)
    assert p.free_in_s(p.ttft_s - 0.3) == pytest.approx(0.3)
    assert p.free_in_s(p.ttft_s + 1.0) == 0.0


def test_no_measured_steps_yet_predicts_zero_and_the_snapshot_pickles():
    snap = load(running=(5, 5), fixed=0.0, per_token=0.0)
    assert predict_ttft(snap, "interactive", 4, 100.0).ttft_s == 0.0
    snap = load(waiting={"interactive": QueueSummary(1, 2.0, 3.0)})
    again = pickle.loads(pickle.dumps(snap))
    assert again == snap and again.waiting["interactive"].num == 1


def test_expected_output_is_capped_by_the_recent_mean():
    assert expected_output_tokens(256, None) == 256
    assert expected_output_tokens(256, 40.0) == 40
    assert expected_output_tokens(16, 40.0) == 16
