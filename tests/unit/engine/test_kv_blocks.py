"""The block pool: check-then-commit, refusal is a value, and it can prove its own integrity."""

from __future__ import annotations

import random

from serving.engine.kv_blocks import BlockPool, Refused


def test_grow_allocates_whole_blocks_in_order():
    pool = BlockPool(num_blocks=8, block_size_tokens=4)
    assert pool.grow("a", 5) == [0, 1]  # 5 tokens -> 2 blocks
    assert pool.grow("a", 8) == [0, 1]  # still fits in 2 blocks
    assert pool.grow("a", 9) == [0, 1, 2]
    assert pool.num_used_blocks == 3 and pool.num_free_blocks == 5
    pool.check_integrity()


def test_refusal_changes_nothing():
    pool = BlockPool(num_blocks=4, block_size_tokens=4)
    pool.grow("a", 12)
    before = (pool.num_free_blocks, list(pool.table("a")))
    result = pool.grow("b", 9)
    assert result == Refused(num_needed_blocks=3, num_free_blocks=1)
    assert (pool.num_free_blocks, list(pool.table("a"))) == before
    assert pool.table("b") == []
    pool.check_integrity()


def test_free_returns_every_block():
    pool = BlockPool(num_blocks=6, block_size_tokens=2)
    pool.grow("a", 5)
    pool.grow("b", 2)
    assert pool.free("a") == 3
    assert pool.free("a") == 0  # freeing twice is harmless
    assert pool.num_used_blocks == 1
    pool.check_integrity()


def test_integrity_holds_under_random_operations():
    rng = random.Random(7)
    pool = BlockPool(num_blocks=32, block_size_tokens=4)
    lengths: dict[str, int] = {}
    for step in range(2000):
        seq = f"s{rng.randrange(12)}"
        if rng.random() < 0.2:
            pool.free(seq)
            lengths.pop(seq, None)
        else:
            target = lengths.get(seq, 0) + rng.randint(1, 9)
            if not isinstance(pool.grow(seq, target), Refused):
                lengths[seq] = target
        pool.check_integrity()
        for s, n in lengths.items():
            assert len(pool.table(s)) == -(-n // 4), f"step {step}: {s}"
    assert pool.num_used_blocks == sum(-(-n // 4) for n in lengths.values())


def test_integrity_check_catches_a_double_owned_block():
    pool = BlockPool(num_blocks=4, block_size_tokens=4)
    pool.grow("a", 4)
    pool.tables()["b"] = list(pool.table("a"))  # corrupt on purpose
    try:
        pool.check_integrity()
    except AssertionError:
        return
    raise AssertionError("corruption went unnoticed")


# --- sliding windows: paging groups free what their window has left ----------------------------


def test_trim_frees_blocks_behind_the_window_and_leaves_null_entries():
    pool = BlockPool(num_blocks=16, block_size_tokens=4, group_windows=(6,))
    pool.grow("a", 20)  # 5 blocks, tokens 0..19
    # the next query at position 20 sees 15..20: blocks 0..2 (tokens 0..11) are behind it
    assert pool.trim("a", 20) == 3
    assert pool.table("a")[:3] == [pool.null_block] * 3 and pool.null_block == 16
    assert pool.num_live_blocks("a") == 2 and pool.num_used_blocks == 2
    assert pool.trim("a", 20) == 0  # idempotent
    assert pool.grow("a", 21) == [16, 16, 16, 3, 4, 5]
    assert pool.free("a") == 3 and pool.num_used_blocks == 0
    pool.check_integrity()


def test_groups_share_one_pool_and_map_group_zero_ids():
    # two groups (full, window 4): every entry costs one page per group
    pool = BlockPool(num_blocks=12, block_size_tokens=2, group_windows=(None, 4))
    assert pool.blocks_to_grow("a", 6) == 6
    first = pool.grow("a", 6)
    sliding = pool.table("a", group=1)
    assert len(first) == len(sliding) == 3 and not set(first) & set(sliding)
    page_map = pool.group_map(1)
    assert [page_map[b] for b in first] == sliding
    assert pool.trim("a", 6) == 1  # window 4 at position 6 sees 3..6: entry 0 (tokens 0, 1) goes
    assert pool.table("a") == first and pool.table("a", group=1)[0] == pool.null_block
    assert page_map[first[0]] == pool.null_block
    assert pool.num_live_blocks("a") == 5
    assert isinstance(pool.grow("b", 14), Refused)  # 7 + 7 pages > 7 free: nothing changes
    assert pool.num_used_blocks == 5
    pool.check_integrity()


def test_windowed_integrity_under_random_operations():
    rng = random.Random(3)
    pool = BlockPool(num_blocks=40, block_size_tokens=4, group_windows=(None, 9, 5))
    computed: dict[str, int] = {}
    for _ in range(2000):
        seq = f"s{rng.randrange(8)}"
        if rng.random() < 0.15:
            pool.free(seq)
            computed.pop(seq, None)
            continue
        c = computed.get(seq, 0)
        pool.trim(seq, c)
        if not isinstance(pool.grow(seq, c + rng.randint(1, 6)), Refused):
            computed[seq] = c + 1  # the scheduler advances computed tokens after the step
        pool.check_integrity()
        for g in (1, 2):  # every live entry of group g is what group 0's page maps to
            page_map = pool.group_map(g)
            for s, table in pool.tables(g).items():
                for j, page in enumerate(table):
                    if page != pool.null_block:
                        assert page_map[pool.table(s)[j]] == page
