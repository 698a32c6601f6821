"""Prefix caching in the block pool and the ledger (decision 9): block identity, reference counts,
LRU eviction of cached blocks only, exact admission, and nothing half-written ever cached."""

from __future__ import annotations

import random

import pytest

from serving.engine.config import EngineConfig
from serving.engine.kv_blocks import BlockPool, Refused
from serving.engine.ledger import KVLedger
from serving.engine.prefix_cache import (
    block_hash,
    caching_refusal,
    extend_block_hashes,
    root_hash,
)
from serving.engine.sampling_params import SamplingParams
from serving.engine.scheduler import Scheduler
from serving.engine.sequence import Sequence, Tier

ROOT = root_hash("llama:tiny", "torch.float32")
BS = 4


def hashes(tokens, bs=BS, root=ROOT):
    return extend_block_hashes([], tokens, bs, root)


def caching_pool(num_blocks=8, bs=BS) -> BlockPool:
    pool = BlockPool(num_blocks, bs)
    pool.enable_caching()
    return pool


def computed(pool, seq_id, tokens):
    """A sequence that grew to hold `tokens` and computed them all (what a step leaves)."""
    pool.grow(seq_id, len(tokens))
    pool.commit(seq_id, hashes(tokens), len(tokens))


# ----- block identity ------------------------------------------------------------------------
def test_a_block_hash_covers_its_whole_prefix_and_everything_that_changes_the_kv():
    a = hashes([1, 2, 3, 4, 5, 6, 7, 8])
    b = hashes([9, 2, 3, 4, 5, 6, 7, 8])
    assert len(a) == 2 and a[0] != b[0]
    assert a[1] != b[1]  # same tokens in block 1, different parent
    assert hashes([1, 2, 3, 4, 5, 6, 7, 8, 9]) == a  # a partial block has no hash
    assert hashes([1, 2, 3, 4], root=root_hash("llama:tiny", "torch.bfloat16")) != a[:1]
    assert hashes([1, 2, 3, 4], root=root_hash("llama:tiny", "torch.float32", "lora-7")) != a[:1]
    assert block_hash(ROOT, [1, 2, 3, 4]) == a[0]


def test_hashes_extend_without_rehashing_what_is_there():
    tokens = list(range(10))
    hs = hashes(tokens[:5])
    assert extend_block_hashes(hs, tokens, BS, ROOT) is hs
    assert hs == hashes(tokens)


def test_caching_is_refused_for_windowed_groups_and_the_plain_runner():
    assert caching_refusal((None,), paged=True) is None
    assert "sliding-window" in caching_refusal((None, 16), paged=True)
    assert "sliding-window" in caching_refusal((24,), paged=True)
    assert "HF runner" in caching_refusal((None,), paged=False)
    with pytest.raises(ValueError, match="one full-attention paging group"):
        BlockPool(8, BS, (None, 16)).enable_caching()


# ----- the pool --------------------------------------------------------------------------------
def test_finished_blocks_stay_cached_and_a_new_prompt_maps_the_longest_run():
    pool = caching_pool()
    computed(pool, "a", list(range(10)))  # 2 full blocks + 2 tokens
    first = pool.table("a")
    pool.free("a")
    assert (pool.num_cached_blocks, pool.num_used_blocks, pool.num_free_blocks) == (2, 0, 8)
    pool.check_integrity()
    again = hashes([*list(range(8)), 99, 98, 97, 96])
    assert pool.match(again, 3) == first[:2]
    assert pool.match(again, 1) == first[:1]  # never past max_blocks
    assert pool.match(hashes([0, 1, 2, 5]), 1) == []  # block 0 differs: nothing after it counts


def test_sharing_counts_references_and_a_shared_block_is_used_once():
    pool = caching_pool()
    computed(pool, "a", list(range(8)))
    blocks = pool.match(hashes(list(range(8))), 2)
    pool.share("b", blocks)
    assert [pool.ref_count(b) for b in blocks] == [2, 2]
    assert pool.num_used_blocks == 2 and pool.num_extra_refs == 2
    pool.free("a")
    assert pool.num_used_blocks == 2 and pool.num_cached_blocks == 0  # b still holds them
    pool.free("b")
    assert pool.num_cached_blocks == 2 and pool.num_used_blocks == 0
    pool.check_integrity()


def test_only_full_computed_blocks_are_registered():
    pool = caching_pool()
    tokens = list(range(12))
    pool.grow("a", 12)
    assert pool.commit("a", hashes(tokens), 6) == 1  # block 1 is half-written: not offered
    assert pool.commit("a", hashes(tokens), 7) == 0
    pool.free("a")  # as an abort mid-prefill does
    assert pool.num_cached_blocks == 1
    assert pool.match(hashes(tokens), 3) == pool.match(hashes(tokens[:4]), 1)
    pool.check_integrity()


def test_two_equal_prompts_computed_at_once_keep_one_copy_cached():
    pool = caching_pool()
    tokens = list(range(8))
    pool.grow("a", 8)
    pool.grow("b", 8)
    assert pool.commit("a", hashes(tokens), 8) == 2
    assert pool.commit("b", hashes(tokens), 8) == 0  # b's copy stays private
    pool.free("b")
    assert pool.num_cached_blocks == 0  # b's blocks went back to the free list
    pool.check_integrity()


def test_eviction_takes_free_blocks_first_then_the_least_recently_cached():
    pool = caching_pool(num_blocks=6)
    computed(pool, "old", [1] * 4)
    computed(pool, "new", [2] * 4)
    pool.free("old")
    pool.free("new")  # cached: old (LRU), new
    pool.grow("c", 16)  # takes the 4 free blocks
    assert pool.num_cached_blocks == 2
    pool.grow("c", 20)  # one more: evicts old, keeps new
    assert pool.match(hashes([1] * 4), 1) == [] and len(pool.match(hashes([2] * 4), 1)) == 1
    pool.check_integrity()


def test_eviction_never_takes_a_block_a_running_sequence_holds():
    pool = caching_pool(num_blocks=4)
    computed(pool, "a", [1] * 8)  # a holds 2 registered blocks
    assert pool.grow("b", 8) == [2, 3]
    assert pool.grow("b", 12) == Refused(1, 0)  # no free, none cached: a's blocks are safe
    assert pool.table("a") == [0, 1] and pool.match(hashes([1] * 8), 2) == [0, 1]
    pool.check_integrity()


def test_the_tail_of_a_finished_sequence_is_evicted_before_its_prefix():
    pool = caching_pool(num_blocks=3)
    computed(pool, "a", [1] * 12)
    pool.free("a")
    pool.grow("b", 4)  # evicts one cached block: the deepest
    assert len(pool.match(hashes([1] * 12), 3)) == 2
    pool.check_integrity()


def test_integrity_holds_under_random_sharing_growth_and_eviction():
    rng = random.Random(3)
    pool = caching_pool(num_blocks=24)
    prompts = [[rng.randrange(3) for _ in range(12)] for _ in range(4)]
    live: dict[str, list[int]] = {}
    num_hits = max_cached = 0
    for step in range(3000):
        seq = f"s{rng.randrange(10)}"
        if seq in live and rng.random() < 0.25:
            pool.free(seq)
            del live[seq]
        elif seq not in live:
            tokens = list(rng.choice(prompts))
            cached = pool.match(hashes(tokens), (len(tokens) - 1) // BS)
            revived = len(cached) - pool.num_live_shared(cached)  # leave the cached set
            if pool.num_free_blocks < pool.blocks_to_grow(seq, len(tokens)) - len(cached) + revived:
                continue
            pool.share(seq, cached)
            num_hits += bool(cached)
            assert not isinstance(pool.grow(seq, len(tokens)), Refused)
            pool.commit(seq, hashes(tokens), len(tokens))
            live[seq] = tokens
        else:
            tokens = live[seq] + [rng.randrange(3) for _ in range(rng.randint(1, 5))]
            if not isinstance(pool.grow(seq, len(tokens)), Refused):
                pool.commit(seq, hashes(tokens), len(tokens))
                live[seq] = tokens
        pool.check_integrity()
        max_cached = max(max_cached, pool.num_cached_blocks)
        for s, toks in live.items():
            assert len(pool.table(s)) == -(-len(toks) // BS), f"step {step}: {s}"
    assert num_hits > 100 and max_cached > 4  # the walk shared, cached and evicted


# ----- the ledger and the scheduler ---------------------------------------------------------------
def req(rid, tokens, max_tokens=4, tier=Tier.INTERACTIVE):
    return Sequence(
        request_id=rid,
        token_ids=list(tokens),
        params=SamplingParams(max_tokens=max_tokens, temperature=0),
        tier=tier,
        arrival_s=0.0,
        deadline_s=None,
        eos_token_ids=frozenset({2}),
        max_total_tokens=4096,
    )


def make(kv_mode="reserve", num_blocks=16, **cfg) -> Scheduler:
    config = EngineConfig(kv_mode=kv_mode, block_size_tokens=BS, num_kv_blocks=num_blocks, **cfg)
    ledger = KVLedger(BlockPool(num_blocks, BS), kv_mode, config.on_demand_free_fraction)
    ledger.enable_prefix_caching(ROOT)
    return Scheduler(config, ledger)


def step(s: Scheduler, token=9):
    batch = s.schedule(100.0)
    s.postprocess(batch, [token for i in range(len(batch.seqs)) if batch.samples(i)], 100.0)
    s.ledger.check_integrity()
    return batch


def run_all(s: Scheduler):
    while s.has_unfinished():
        step(s)


def test_a_repeated_prompt_prefills_only_its_uncached_tail_and_computes_one_token_at_least():
    s = make()
    prompt = list(range(3, 15))  # 12 tokens: 3 full blocks
    s.add(req("a", prompt))
    run_all(s)
    b = req("b", prompt)
    s.add(b)
    batch = step(s)
    # 3 full blocks cached, but the last prompt token must run for its logits: 2 blocks mapped
    assert batch.num_new_tokens == [4] and b.num_output_tokens == 1
    assert (s.ledger.num_query_tokens, s.ledger.num_hit_tokens) == (24, 8)


def test_reserve_mode_books_a_shared_block_once():
    s = make(num_blocks=16)
    prompt = list(range(3, 15))
    s.add(req("a", prompt, max_tokens=8))  # reservation ceil(20 / 4) = 5 blocks
    step(s)
    assert s.ledger.num_reserved_blocks == 5
    s.add(req("b", prompt, max_tokens=8))
    step(s)  # b maps a's 2 leading blocks, which a still holds
    assert s.ledger.num_reserved_blocks == 5 + 5 - 2
    need = s.ledger.need(req("c", prompt, max_tokens=8), s.ledger.match(req("c", prompt)), 4)
    assert (need.num_needed_blocks, need.num_available_blocks) == (3, 16 - 8)


def test_reserve_mode_admits_more_with_a_shared_prefix_and_never_preempts():
    system = [5] * 40  # 10 full blocks shared by every request
    s = make(num_blocks=40, max_num_seqs=8, min_num_seqs=8)
    s.add(req("warm", [*system, 9, 7, 7], max_tokens=1))
    run_all(s)  # the system prompt's blocks are cached, no request holds them
    for i in range(6):
        s.add(req(f"r{i}", [*system, i + 10, 7, 7], max_tokens=6))
    admitted = []
    while s.has_unfinished():
        batch = step(s)
        assert not batch.preempted
        admitted.append(len(s.running))
    # Without the cache each needs ceil(49/4) = 13 of 40 blocks: at most 3 at once. With it the
    # first revives the 10 cached blocks (13 booked), every later one books 13 - 10 = 3.
    assert admitted[0] == 6


def test_on_demand_counts_revived_cached_blocks_against_the_free_ones():
    s = make(kv_mode="on_demand", num_blocks=8, on_demand_free_fraction=0.0)
    prompt = list(range(3, 15))
    s.add(req("a", prompt, max_tokens=1))
    run_all(s)
    assert s.ledger.pool.num_cached_blocks == 3
    b = req("b", prompt)
    match = s.ledger.match(b)
    need = s.ledger.need(b, match, 4)
    assert len(match.blocks) == 2 and need.num_needed_blocks == 1 + 2  # a new block + 2 revived


def test_an_abort_mid_prefill_leaves_no_half_written_block_cached():
    s = make(max_num_batched_tokens=6)
    prompt = list(range(3, 23))  # 20 tokens, prefilled 6 per step
    s.add(req("a", prompt))
    step(s)  # 6 tokens computed: block 0 full, block 1 half-written
    s.abort("a")
    s.ledger.check_integrity()
    pool = s.ledger.pool
    assert pool.num_cached_blocks == 1
    match = s.ledger.match(req("b", prompt))
    assert len(match.blocks) == 1 and match.partial_block is None  # an abort offers no tail


def test_the_admission_refusal_is_a_value_naming_the_limit_and_what_was_needed():
    s = make(num_blocks=4, max_num_seqs=4, min_num_seqs=4)
    s.add(req("a", list(range(3, 11)), max_tokens=4))  # 3 blocks
    s.add(req("b", list(range(20, 28)), max_tokens=4))
    batch = step(s)
    stop = batch.admission_stop
    assert (stop.reason, stop.tier, stop.unit) == ("kv", Tier.INTERACTIVE, "blocks")
    assert (stop.needed, stop.available) == (3, 1)
    s2 = make(max_num_seqs=1, min_num_seqs=1)
    s2.add(req("a", [3, 4]))
    s2.add(req("b", [5, 6]))
    stop = step(s2).admission_stop
    assert (stop.reason, stop.needed, stop.available, stop.unit) == ("ceiling", 2, 1, "seqs")
    assert step(make()).admission_stop.reason == "empty"
