"""The KV ledger's two admission modes and the sliding concurrency window (R8)."""

from __future__ import annotations

import pytest

from serving.engine.kv_blocks import BlockPool, Refused
from serving.engine.ledger import KVLedger, concurrency_limit
from serving.engine.sampling_params import SamplingParams
from serving.engine.sequence import Sequence, Tier


def seq(rid: str, prompt_len: int, max_tokens: int | None, max_total: int = 10_000) -> Sequence:
    return Sequence(
        request_id=rid,
        token_ids=[5] * prompt_len,
        params=SamplingParams(max_tokens=max_tokens, temperature=0),
        tier=Tier.INTERACTIVE,
        arrival_s=0.0,
        deadline_s=None,
        eos_token_ids=frozenset(),
        max_total_tokens=max_total,
    )


def test_reserve_admits_only_what_prompt_plus_max_tokens_allows():
    ledger = KVLedger(BlockPool(10, 4), "reserve")
    a = seq("a", 10, 10)  # 20 tokens -> 5 blocks reserved
    assert ledger.can_admit(a, 10)
    ledger.admit(a)
    assert ledger.num_reserved_blocks == 5
    b = seq("b", 4, 17)  # 21 tokens -> 6 blocks: 5 + 6 > 10
    assert not ledger.can_admit(b, 4)
    c = seq("c", 4, 16)  # 20 tokens -> 5 blocks: exactly full
    assert ledger.can_admit(c, 4)
    ledger.admit(c)
    ledger.check_integrity()


def test_reserve_growth_stays_inside_the_reservation():
    ledger = KVLedger(BlockPool(10, 4), "reserve")
    a = seq("a", 3, 5)  # 8 tokens -> 2 blocks
    ledger.admit(a)
    for n in range(1, 9):
        assert not isinstance(ledger.grow(a, n), Refused)
        ledger.check_integrity()
    ledger.release(a)
    assert ledger.num_reserved_blocks == 0 and ledger.pool.num_used_blocks == 0


def test_reservation_without_max_tokens_covers_the_model_limit():
    ledger = KVLedger(BlockPool(100, 4), "reserve")
    assert ledger.reservation_for(seq("a", 3, None, max_total=64)) == 16


def test_on_demand_admits_on_first_chunk_and_keeps_a_free_margin():
    ledger = KVLedger(BlockPool(100, 4), "on_demand", on_demand_free_fraction=0.1)
    big = seq("a", 300, 500)  # would reserve 200 blocks; on demand needs the chunk only
    assert ledger.can_admit(big, 64)  # 16 blocks + 10 margin <= 100
    ledger.admit(big)
    ledger.grow(big, 360)  # 90 blocks used, 10 free
    assert not ledger.can_admit(seq("b", 4, 4), 4)  # 1 + 10 margin > 10 free
    assert ledger.num_reserved_blocks == 0
    assert ledger.use_fraction == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("use", "expected"),
    [(0.0, 48), (0.5, 48), (0.6, 40), (0.7, 32), (0.8, 24), (0.9, 16), (1.0, 16)],
)
def test_concurrency_window_slides_between_floor_and_ceiling(use, expected):
    # R8's example: concurrency sliding between 16 and 48 with the memory watermark.
    assert concurrency_limit(use, 16, 48, 0.5, 0.9) == expected


def test_sliding_window_reservation_is_bounded_and_growth_stays_inside_it():
    # one paging group with a 10-token window, 4-token blocks, chunks of at most 8 tokens
    ledger = KVLedger(BlockPool(20, 4, group_windows=(10,)), "reserve", chunk_tokens=8)
    a = seq("a", 40, 40)  # 80 tokens: 20 blocks without freeing
    assert ledger.reservation_for(a) == (10 + 8 - 2) // 4 + 2 == 6
    ledger.admit(a)
    for c in range(0, 80, 8):  # prefill/decode in chunks of 8; the window frees the rest
        assert not isinstance(ledger.grow(a, c + 8), Refused)
        a.num_computed_tokens = c + 8
        ledger.check_integrity()
        assert ledger.pool.num_live_blocks("a") <= 6
    ledger.release(a)
    assert ledger.pool.num_used_blocks == 0 and ledger.num_reserved_blocks == 0


def test_without_a_chunk_bound_reservations_cover_the_whole_sequence():
    ledger = KVLedger(BlockPool(30, 4, group_windows=(10,)), "reserve")
    assert ledger.reservation_for(seq("a", 40, 40)) == 20
