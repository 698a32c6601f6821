"""Cached partial blocks (serving/engine/partial_blocks.py): the last, not yet full block of a
finished sequence stays cached, and the next turn of its conversation continues in it instead of
recomputing its tokens; one request takes a block over, eviction and the per-parent cap free it,
admission stays exact, and a sequence stopped mid-step (abort) offers none."""

from __future__ import annotations

import pytest

from serving.engine.kv_blocks import BlockPool
from serving.engine.partial_blocks import MAX_PER_PARENT, PartialIndex, PartialTail
from serving.engine.prefix_cache import extend_block_hashes, root_hash
from tests.unit.engine.test_prefix_cache import BS, ROOT, hashes, make, req, run_all, step


def finished(pool: BlockPool, seq_id: str, tokens: list[int], num_computed: int) -> PartialTail:
    """`seq_id` computed `num_computed` of `tokens` and finished: freed with its tail offered."""
    pool.grow(seq_id, num_computed)
    hs = hashes(tokens)
    pool.commit(seq_id, hs, num_computed)
    index, k = divmod(num_computed, BS)
    tail = PartialTail(index, hs[index - 1] if index else ROOT, tuple(tokens[index * BS :][:k]))
    pool.free(seq_id, tail)
    return tail


def caching_pool(num_blocks=8) -> BlockPool:
    pool = BlockPool(num_blocks, BS)
    pool.enable_caching()
    return pool


# ----- the index --------------------------------------------------------------------------------
def test_the_index_finds_the_block_sharing_the_longest_run_under_the_parent():
    index = PartialIndex()
    index.add(5, b"p", (1, 2, 3))
    index.add(6, b"p", (1, 9))
    index.add(7, b"q", (1, 2, 3))
    assert index.best(b"p", [1, 2, 4]) == (5, 2)
    assert index.best(b"p", [1, 9, 9]) == (6, 2)
    assert index.best(b"p", [2, 2, 3]) is None  # nothing shares the first token
    assert index.best(b"r", [1, 2, 3]) is None  # another parent: another prefix
    index.remove(5)
    assert index.best(b"p", [1, 2, 3]) == (6, 1) and 5 not in index
    index.check_integrity()


def test_a_parent_keeps_at_most_a_few_partial_blocks_and_pushes_out_the_oldest():
    index = PartialIndex()
    pushed = [index.add(b, b"p", (b,)) for b in range(MAX_PER_PARENT + 1)]
    assert pushed == [None] * MAX_PER_PARENT + [0]
    assert len(index) == MAX_PER_PARENT and 0 not in index
    index.check_integrity()


# ----- the pool ---------------------------------------------------------------------------------
def test_a_finished_sequence_leaves_its_partial_block_cached_for_the_prompt_that_continues_it():
    pool = caching_pool()
    tokens = list(range(10, 20))
    tail = finished(pool, "a", tokens, 10)  # 2 full blocks + 2 tokens
    assert pool.num_cached_blocks == 3 and pool.num_used_blocks == 0
    pool.check_integrity()
    follow = [*tokens, 7, 7, 7]
    full = pool.match(hashes(follow), (len(follow) - 1) // BS)
    partial = pool.match_partial(tail.parent, follow[8:11])
    assert len(full) == 2 and partial is not None and partial[1] == 2
    pool.share("b", full, partial[0])
    assert pool.table("b") == [*full, partial[0]] and pool.ref_count(partial[0]) == 1
    assert pool.num_partial_takeovers == 1
    assert pool.match_partial(tail.parent, follow[8:11]) is None  # taken over: one user only
    pool.check_integrity()
    pool.grow("b", len(follow))  # b writes on after the 2 shared tokens
    assert pool.table("b")[2] == partial[0]
    pool.check_integrity()


def test_a_prompt_that_diverges_inside_the_partial_block_takes_only_the_shared_tokens():
    pool = caching_pool()
    tokens = list(range(10, 13))  # 3 tokens: a partial block 0 under the root
    finished(pool, "a", tokens, 3)
    assert pool.match_partial(ROOT, [10, 11, 99]) == (pool.match_partial(ROOT, [10])[0], 2)
    assert pool.match_partial(ROOT, [99, 11, 12]) is None
    assert pool.match_partial(root_hash("other", "float32"), [10, 11, 12]) is None


def test_eviction_takes_a_cached_partial_block_like_any_cached_block():
    pool = caching_pool(num_blocks=3)
    tokens = list(range(10, 16))
    tail = finished(pool, "a", tokens, 6)  # 1 full block + 2 tokens: both cached
    assert pool.num_cached_blocks == 2
    pool.grow("b", 8)  # one free block, then the LRU cached one: the tail, before its prefix
    assert pool.match_partial(tail.parent, tokens[4:6]) is None
    assert len(pool.match(hashes(tokens), 1)) == 1
    assert pool.num_evicted_blocks == 1
    pool.check_integrity()


def test_a_partial_pushed_out_by_the_per_parent_cap_goes_back_to_the_free_list():
    pool = caching_pool(num_blocks=8)
    for i in range(MAX_PER_PARENT + 1):
        finished(pool, f"s{i}", [i + 10, 1], 2)  # each leaves a 2-token block under the root
    assert pool.num_cached_blocks == MAX_PER_PARENT
    assert pool.num_free_blocks == 8
    assert pool.match_partial(ROOT, [10, 1]) is None  # the oldest was pushed out
    assert pool.match_partial(ROOT, [11, 1])[1] == 2
    pool.check_integrity()


def test_without_caching_a_tail_is_simply_freed():
    pool = BlockPool(4, BS)
    pool.grow("a", 6)
    pool.free("a", PartialTail(1, b"p", (1, 2)))
    assert pool.num_cached_blocks == 0 and pool.match_partial(b"p", [1, 2]) is None
    pool.check_integrity()


# ----- the ledger and the scheduler ---------------------------------------------------------------
def test_the_next_turn_continues_in_the_block_its_previous_reply_ended_in():
    s = make()
    first = req("t1", list(range(3, 12)), max_tokens=2)  # 9 prompt tokens, 2 generated
    s.add(first)
    run_all(s)
    assert first.num_computed_tokens == 10  # the last sampled token was never fed back
    follow = [*first.token_ids, 40, 41, 42]  # the history and a new user message: 14 tokens
    second = req("t2", follow)
    s.add(second)
    batch = step(s)
    # 2 full blocks shared, 2 more tokens in the taken-over block: 4 tokens left to compute
    assert batch.num_new_tokens == [4] and second.num_output_tokens == 1
    assert s.ledger.num_hit_tokens == 10 and s.ledger.pool.num_partial_takeovers == 1


@pytest.mark.parametrize("kv_mode", ["reserve", "on_demand"])
def test_a_taken_over_partial_block_is_owned_and_booked_like_a_grown_one(kv_mode):
    s = make(kv_mode=kv_mode, num_blocks=16, on_demand_free_fraction=0.0)
    first = req("t1", list(range(3, 12)), max_tokens=2)
    s.add(first)
    run_all(s)
    second = req("t2", [*first.token_ids, 40, 41, 42], max_tokens=6)
    match = s.ledger.match(second)
    assert len(match.blocks) == 2 and match.num_partial_tokens == 2
    need = s.ledger.need(second, match, 4)
    if kv_mode == "reserve":  # ceil(20 / 4) = 5 booked, none of them held by a running request
        assert need.num_needed_blocks == 5
    else:  # tokens 10-13: 2 revived full blocks, the taken-over block (10-11), a new one (12-13)
        assert need.num_needed_blocks == 2 + 1 + 1
    s.add(second)
    run_all(s)  # integrity checked after every step: held <= reserved, counts exact


def test_an_aborted_sequence_offers_no_partial_block():
    s = make(max_num_batched_tokens=6)
    prompt = list(range(3, 23))
    s.add(req("a", prompt))
    step(s)  # 6 computed: block 1 holds 2 written tokens
    s.abort("a")
    assert s.ledger.pool.num_cached_blocks == 1
    match = s.ledger.match(req("b", prompt))
    assert match.partial_block is None and match.num_tokens(BS) == 4


def test_a_prompt_ending_right_after_its_full_blocks_still_computes_its_last_token():
    s = make()
    first = req("t1", list(range(3, 12)), max_tokens=2)
    s.add(first)
    run_all(s)
    again = req("t2", first.token_ids[:9])  # 9 tokens: 2 full blocks, then 1 token
    match = s.ledger.match(again)
    assert match.num_tokens(BS) == 8  # the partial block would cover the last token: not used
    hs = extend_block_hashes([], again.token_ids, BS, ROOT)
    assert s.ledger.pool.match_partial(hs[1], again.token_ids[8:9]) is not None
