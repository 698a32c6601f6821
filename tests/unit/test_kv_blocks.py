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
