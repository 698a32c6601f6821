"""Scheduler decisions with no model: outputs are built by hand, time is passed in."""

from __future__ import annotations

import pytest

from serving.engine.config import EngineConfig
from serving.engine.kv_blocks import BlockPool
from serving.engine.ledger import KVLedger
from serving.engine.sampling_params import SamplingParams
from serving.engine.scheduler import Scheduler
from serving.engine.sequence import SeqStatus, Sequence, Tier

NOW = 100.0


def make(kv_mode="reserve", num_blocks=64, block=4, **cfg) -> Scheduler:
    config = EngineConfig(kv_mode=kv_mode, block_size_tokens=block, num_kv_blocks=num_blocks, **cfg)
    ledger = KVLedger(BlockPool(num_blocks, block), kv_mode, config.on_demand_free_fraction)
    return Scheduler(config, ledger)


def req(rid, prompt_len=4, max_tokens=4, tier=Tier.INTERACTIVE, arrival=0.0, deadline=None):
    return Sequence(
        request_id=rid,
        token_ids=[7] * prompt_len,
        params=SamplingParams(max_tokens=max_tokens, temperature=0),
        tier=tier,
        arrival_s=arrival,
        deadline_s=deadline,
        eos_token_ids=frozenset({2}),
        max_total_tokens=4096,
    )


def step(s: Scheduler, now=NOW, token=9):
    """One schedule + postprocess, every sampling row producing `token`."""
    batch = s.schedule(now)
    sampled = [token for i in range(len(batch.seqs)) if batch.samples(i)]
    s.postprocess(batch, sampled, now)
    s.ledger.check_integrity()
    return batch


def ids(batch):
    return [q.request_id for q in batch.seqs]


def test_higher_tier_admitted_first_and_fifo_within_tier():
    s = make(max_num_seqs=3, min_num_seqs=3)
    for rid, tier in [
        ("off1", Tier.OFFLINE),
        ("ana1", Tier.ANALYTICAL),
        ("int1", Tier.INTERACTIVE),
        ("int2", Tier.INTERACTIVE),
        ("ana2", Tier.ANALYTICAL),
    ]:
        s.add(req(rid, tier=tier))
    assert ids(step(s)) == ["int1", "int2", "ana1"]
    assert [q.request_id for q in s.waiting[Tier.ANALYTICAL]] == ["ana2"]


def test_offline_runs_only_on_idle_capacity():
    s = make(num_blocks=10, offline_idle_fraction=0.5)
    s.add(req("busy", prompt_len=16, max_tokens=8))  # reserves 6 of 10 blocks: 60% in use
    s.add(req("night-job", tier=Tier.OFFLINE))
    assert ids(step(s)) == ["busy"]
    assert s.num_waiting(Tier.OFFLINE) == 1
    s.abort("busy")
    assert ids(step(s)) == ["night-job"]


def test_offline_takes_at_most_its_idle_share_of_the_concurrency_window():
    s = make(max_num_seqs=4, min_num_seqs=4, offline_idle_fraction=0.5)
    for i in range(5):
        s.add(req(f"night{i}", tier=Tier.OFFLINE, max_tokens=50))
    assert ids(step(s)) == ["night0", "night1"]  # 2 of 4 slots, though KV and slots are free
    s.add(req("user", max_tokens=50))
    assert ids(step(s))[-1] == "user"  # a free slot was waiting for it
    assert s.num_waiting(Tier.OFFLINE) == 3


def test_long_prompt_is_chunked_and_never_stalls_decodes():
    s = make(max_num_batched_tokens=8, num_blocks=128)
    s.add(req("short", prompt_len=3, max_tokens=50))
    step(s)  # short's prefill
    s.add(req("long", prompt_len=30, max_tokens=2))
    chunks = []
    for _ in range(5):
        batch = step(s)
        assert ids(batch)[0] == "short"  # the decode is first in every step
        assert batch.num_tokens <= 8
        chunks.append(dict(zip(ids(batch), batch.num_new_tokens, strict=True)).get("long"))
    assert chunks[:4] == [7, 7, 7, 7] and sum(c or 0 for c in chunks) >= 30


def test_concurrency_window_shrinks_with_kv_use():
    # 100 blocks; each request reserves 10. Window: 8 at <= 40% use, down to 2 at >= 80%.
    s = make(
        num_blocks=100, max_num_seqs=8, min_num_seqs=2, kv_low_watermark=0.4, kv_high_watermark=0.8
    )
    for i in range(10):
        s.add(req(f"r{i}", prompt_len=20, max_tokens=20))
    step(s)
    # Admission stops once the window, recomputed after each admission, equals the running count:
    # at 50% use the window is 6.5 -> 6 or 7; never the full ceiling of 8.
    assert 5 <= len(s.running) < 8


def test_queue_deadline_fails_the_request_with_a_clear_error():
    s = make(max_num_seqs=1, min_num_seqs=1)
    s.add(req("first", max_tokens=50))
    s.add(req("late", arrival=NOW, deadline=NOW + 2.0))
    step(s, now=NOW)
    step(s, now=NOW + 1.0)
    batch = s.schedule(NOW + 2.5)
    (late,) = batch.timed_out
    assert late.status is SeqStatus.FINISHED_TIMEOUT
    assert "waited 2.500 s in the interactive queue, past its deadline of 2.000 s" in late.error
    assert s.num_waiting() == 0


def test_offline_work_waits_while_an_interactive_prompt_starts():
    s = make()
    for i in range(3):
        s.add(req(f"off{i}", prompt_len=4, max_tokens=20, tier=Tier.OFFLINE))
    step(s)
    step(s)  # three offline decodes running
    s.add(req("int", prompt_len=4, max_tokens=5))
    s.add(req("off-new", prompt_len=4, max_tokens=5, tier=Tier.OFFLINE))
    assert ids(step(s)) == ["int"]  # its first token is computed without the offline rows
    assert sorted(ids(step(s))) == ["int", "off-new", "off0", "off1", "off2"]


def test_an_interactive_head_that_cannot_be_admitted_holds_no_offline_work_back():
    s = make(num_blocks=12)
    for i in range(3):
        s.add(req(f"off{i}", prompt_len=6, max_tokens=10, tier=Tier.OFFLINE))
    step(s)
    s.add(req("int", prompt_len=40, max_tokens=8))  # needs more blocks than are left
    assert sorted(ids(step(s))) == [q.request_id for q in s.running]  # offline goes on


def test_an_interactive_request_waiting_for_a_slot_takes_one_from_offline_work():
    s = make(max_num_seqs=2, min_num_seqs=2)
    s.add(req("off-old", max_tokens=20, tier=Tier.OFFLINE, arrival=1.0))
    s.add(req("int-long", max_tokens=20, arrival=1.5))
    step(s)
    s.add(req("off-new", max_tokens=20, tier=Tier.OFFLINE, arrival=2.0))
    step(s)  # off-new waits: both slots are taken
    s.add(req("int", max_tokens=5, arrival=3.0))
    batch = step(s)
    # the newest offline sequence running gives its slot up and is recomputed later
    assert [q.request_id for q in batch.preempted] == ["off-old"]
    assert "int" in ids(batch) and {q.request_id for q in s.running} == {"int-long", "int"}
    victim = s.waiting[Tier.OFFLINE][0]
    assert victim.request_id == "off-old" and victim.num_preemptions == 1
    assert victim.token_ids == [7, 7, 7, 7, 9]  # its token is kept, only its KV is recomputed
    while s.has_unfinished():
        step(s)
    assert s.ledger.pool.num_used_blocks == 0 and s.ledger.num_reserved_blocks == 0


def test_an_interactive_request_that_kv_holds_back_preempts_no_offline_work():
    s = make(num_blocks=12, max_num_seqs=3, min_num_seqs=3)
    for i in range(3):
        s.add(req(f"off{i}", prompt_len=6, max_tokens=10, tier=Tier.OFFLINE))
    step(s)
    s.add(req("int", prompt_len=40, max_tokens=8))  # more blocks than one offline slot frees
    assert not step(s).preempted


def test_admitted_request_is_not_timed_out_while_generating():
    s = make()
    s.add(req("a", max_tokens=10, arrival=NOW, deadline=NOW + 1.0))
    step(s, now=NOW)
    batch = step(s, now=NOW + 50)
    assert ids(batch) == ["a"] and not batch.timed_out


def test_reserve_mode_never_preempts_and_finishes_everything():
    s = make(num_blocks=12)
    for i in range(6):
        s.add(req(f"r{i}", prompt_len=6, max_tokens=10))  # 4 blocks each: 3 at a time
    for _ in range(200):
        if not s.has_unfinished():
            break
        batch = step(s)
        assert not batch.preempted
        assert len(s.running) <= 3
    assert not s.has_unfinished() and s.ledger.pool.num_used_blocks == 0


def test_on_demand_preempts_lowest_tier_latest_arrival_and_recomputes():
    s = make(kv_mode="on_demand", num_blocks=6, block=4, on_demand_free_fraction=0.0)
    # Offline first, alone: beside an admissible interactive prompt it would not be admitted.
    s.add(req("off-late", prompt_len=4, max_tokens=12, tier=Tier.OFFLINE, arrival=3.0))
    preempted = [q.request_id for q in step(s).preempted]
    s.add(req("int-early", prompt_len=4, max_tokens=12, arrival=1.0))
    s.add(req("int-late", prompt_len=4, max_tokens=12, arrival=2.0))
    for _ in range(12):
        preempted += [q.request_id for q in step(s).preempted]
    assert preempted and preempted[0] == "off-late"
    victim = next(q for q in [*s.waiting[Tier.OFFLINE], *s.running] if q.request_id == "off-late")
    assert victim.num_preemptions >= 1
    assert victim.num_output_tokens >= 1  # recompute keeps what it had generated
    for _ in range(200):
        if not s.has_unfinished():
            break
        step(s)
    assert not s.has_unfinished() and s.ledger.pool.num_used_blocks == 0


def test_eos_stop_token_and_length_finish_a_request():
    s = make()
    eos, stop, length = (
        req("eos", max_tokens=10),
        req("stop", max_tokens=10),
        req("len", max_tokens=2),
    )
    stop.params = SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[9])
    for q in (eos, stop, length):
        s.add(q)
    batch = s.schedule(NOW)
    s.postprocess(batch, [2, 9, 5], NOW)  # eos samples EOS, stop samples its stop id
    assert eos.status is SeqStatus.FINISHED_STOPPED and eos.output_token_ids == [2]
    assert stop.status is SeqStatus.FINISHED_STOPPED
    assert length.status is SeqStatus.RUNNING
    step(s, token=5)
    assert length.status is SeqStatus.FINISHED_LENGTH and length.output_token_ids == [5, 5]
    assert not s.has_unfinished() and s.ledger.num_reserved_blocks == 0


def test_abort_frees_everything_wherever_the_request_is():
    s = make(max_num_seqs=1, min_num_seqs=1)
    s.add(req("running", max_tokens=20))
    s.add(req("waiting"))
    step(s)
    assert s.abort("running").status is SeqStatus.FINISHED_ABORTED
    assert s.abort("waiting").status is SeqStatus.FINISHED_ABORTED
    assert s.abort("unknown") is None
    assert s.ledger.pool.num_used_blocks == 0 and s.ledger.num_reserved_blocks == 0
    s.ledger.check_integrity()


@pytest.mark.parametrize("mode", ["reserve", "on_demand"])
def test_head_of_line_blocks_lower_tiers(mode):
    s = make(kv_mode=mode, num_blocks=8, on_demand_free_fraction=0.0)
    s.add(req("hog", prompt_len=20, max_tokens=8))  # 7 blocks reserved / 5 used at first
    step(s)
    s.add(req("big-interactive", prompt_len=30, max_tokens=4))  # cannot fit now
    s.add(req("small-analytical", prompt_len=2, max_tokens=2, tier=Tier.ANALYTICAL))
    batch = step(s)
    assert "small-analytical" not in ids(batch)


def test_a_chunk_never_exceeds_what_window_reservations_assume():
    """The step budget may be raised at run time; one sequence's chunk stays within the chunk
    its sliding-window reservation was sized for, so reserve-mode growth still cannot fail."""
    config = EngineConfig(block_size_tokens=4, num_kv_blocks=64, max_num_batched_tokens=64)
    pool = BlockPool(64, 4, group_windows=(10,))
    s = Scheduler(config, KVLedger(pool, "reserve", chunk_tokens=8))
    s.add(req("a", prompt_len=40, max_tokens=4))
    chunks = [step(s).num_new_tokens[0] for _ in range(5)]
    assert chunks == [8, 8, 8, 8, 8]
    assert pool.num_live_blocks("a") <= s.ledger.reservation_for(s.running[0])


def _offline_tokens(batch) -> int:
    rows = zip(batch.seqs, batch.num_new_tokens, strict=True)
    return sum(n for q, n in rows if q.tier is Tier.OFFLINE)


def test_offline_steps_are_capped_while_interactive_requests_arrive():
    s = make(num_blocks=256, max_num_seqs=32, min_num_seqs=32, offline_step_tokens=8)
    s.add(req("user", prompt_len=4, max_tokens=1, arrival=NOW - 1.0))
    for i in range(10):
        s.add(req(f"night{i}", prompt_len=16, tier=Tier.OFFLINE, max_tokens=20, arrival=NOW))
    batches = [step(s, now=NOW + k) for k in range(12)]
    assert all(_offline_tokens(b) <= 8 for b in batches), [_offline_tokens(b) for b in batches]
    running = [q for q in s.running if q.tier is Tier.OFFLINE]
    assert 0 < len(running) <= 4  # half the cap in running sequences, half for prompts
    assert any(q.num_output_tokens > 0 for q in running)  # prompts still move


def test_offline_steps_are_not_capped_without_recent_interactive_traffic():
    s = make(num_blocks=256, max_num_seqs=32, min_num_seqs=32, offline_step_tokens=8)
    s.add(req("user", prompt_len=4, max_tokens=1, arrival=NOW - 61.0))
    for i in range(10):
        s.add(req(f"night{i}", prompt_len=16, tier=Tier.OFFLINE, max_tokens=20, arrival=NOW))
    step(s)  # the old interactive request
    assert _offline_tokens(step(s)) > 8


def test_the_offline_cap_leaves_interactive_work_alone():
    s = make(num_blocks=256, max_num_seqs=32, min_num_seqs=32, offline_step_tokens=8)
    for i in range(3):
        s.add(req(f"user{i}", prompt_len=20, max_tokens=5, arrival=NOW))
    assert sum(step(s).num_new_tokens) == 60  # every interactive prompt in one step
