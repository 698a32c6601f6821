"""The adapter slot pool (check-then-commit, LRU, pins) and the batched LoRA layer's arithmetic."""

from __future__ import annotations

import random

import torch

from serving.engine.lora.layer import (
    RUN_MIN_TOKENS,
    LoraLinear,
    LoraState,
    SharedShrink,
    plan_step,
)
from serving.engine.lora.slots import AllPinned, Hit, Load, SlotPool


def acquire(pool: SlotPool, name: str):
    plan = pool.plan(name)
    if isinstance(plan, AllPinned):
        return plan
    pool.commit(name, plan)
    pool.check_integrity()
    return plan


def test_free_slots_first_then_least_recently_used():
    pool = SlotPool(2)
    assert acquire(pool, "a") == Load(0, None)
    assert acquire(pool, "b") == Load(1, None)
    assert acquire(pool, "a") == Hit(0)  # a is now the most recently used
    assert acquire(pool, "c") == Load(1, "b")
    assert pool.slot_of == {"a": 0, "c": 1}
    assert (pool.num_loads, pool.num_hits, pool.num_evictions) == (3, 1, 1)


def test_plan_changes_nothing():
    pool = SlotPool(1)
    acquire(pool, "a")
    before = (dict(pool.slot_of), pool.num_loads, pool.num_evictions)
    assert pool.plan("b") == Load(0, "a")
    assert (dict(pool.slot_of), pool.num_loads, pool.num_evictions) == before


def test_pinned_adapters_are_skipped_and_a_full_pool_refuses():
    pool = SlotPool(2)
    acquire(pool, "a")
    acquire(pool, "b")
    pool.pin("a")  # a is least recently used but in use
    assert pool.plan("c") == Load(1, "b")
    pool.pin("b")
    assert pool.plan("c") == AllPinned(2)
    assert pool.plan("a") == Hit(0)  # a pinned adapter still serves new requests
    pool.unpin("a")
    assert pool.plan("c") == Load(0, "a")
    pool.check_integrity()


def test_pins_count_requests_and_remove_refuses_pinned():
    pool = SlotPool(1)
    acquire(pool, "a")
    pool.pin("a")
    pool.pin("a")
    pool.unpin("a")
    assert not pool.remove("a")
    pool.unpin("a")
    assert pool.remove("a") and pool.num_free == 1
    pool.check_integrity()


def test_random_operations_keep_the_invariants():
    rng = random.Random(0)
    pool = SlotPool(3)
    pinned: list[str] = []
    for _ in range(2000):
        name = f"x{rng.randrange(6)}"
        op = rng.random()
        if op < 0.5:
            plan = acquire(pool, name)
            if not isinstance(plan, AllPinned) and rng.random() < 0.5:
                pool.pin(name)
                pinned.append(name)
            if isinstance(plan, Load) and plan.evict is not None:
                assert plan.evict not in pinned, "evicted a pinned adapter"
        elif op < 0.9 and pinned:
            pool.unpin(pinned.pop(rng.randrange(len(pinned))))
        else:
            assert pool.remove(name) == (name not in pinned)
        pool.check_integrity()
        assert set(pinned) <= set(pool.slot_of)


def _state(widths=(5, 3), max_rank=4) -> LoraState:
    """A LoraState as the layers of a model with these in_features would register it."""
    state = LoraState()
    for width in widths:
        state.register(width, max_rank, torch.device("cpu"))
    return state


def _bags(index_offsets) -> list[list[int]]:
    index, offsets = index_offsets
    ends = [*offsets.tolist()[1:], index.numel()]
    return [index[s:e].tolist() for s, e in zip(offsets.tolist(), ends, strict=True)]


def test_plan_step_splits_long_runs_from_bag_rows():
    n = RUN_MIN_TOKENS
    slots = [0, 1, -1, 1] + [2] * n + [-1] * 3 + [0] * (n - 1)
    step = plan_step(slots, _state())
    assert step.runs == ((4, 4 + n, 2),)
    short = [0, 1, 3, *range(7 + n, 7 + 2 * n - 1)]
    assert step.rows.tolist() == short and step.num_rows == len(short)
    row_slots = [0, 1, 1] + [0] * (n - 1)
    # each bag row reads its own slot's block: slot * width + (0 .. width-1)
    for width in (5, 3):
        assert _bags(step.shrink[width]) == [
            list(range(s * width, (s + 1) * width)) for s in row_slots
        ]
    assert _bags(step.expand) == [list(range(s * 4, s * 4 + 4)) for s in row_slots]
    assert plan_step([-1, -1], _state()) is None


def test_decode_rows_first_are_sliced_not_indexed():
    state = _state()
    step = plan_step([-1, 0, 3] + [1] * RUN_MIN_TOKENS, state)
    assert step.rows.tolist() == [1, 2]  # row 0 is the base model's: not a prefix
    step = plan_step([3, 0, 3] + [1] * RUN_MIN_TOKENS, state)
    assert step.rows is None and step.num_rows == 3 and step.runs == ((3, 3 + RUN_MIN_TOKENS, 1),)
    step = plan_step([2] * RUN_MIN_TOKENS, state)  # one prefill chunk: no bag part at all
    assert step.num_rows == 0 and step.expand is None and step.runs == ((0, RUN_MIN_TOKENS, 2),)


def test_plan_reuses_its_index_buffers_until_a_step_has_more_rows():
    state = _state()
    first = plan_step([0, 1, 2], state).expand[0]
    again = plan_step([2, 2, 1, 0, 1], state).expand[0]
    assert again.data_ptr() == first.data_ptr(), "a steady batch should write the same buffer"
    grown = plan_step([0, 1] * 20, state)  # past the first capacity (16 rows)
    assert grown.num_rows == 40 and _bags(grown.expand)[39] == [4, 5, 6, 7]


def test_layer_adds_each_rows_own_update_and_nothing_to_base_rows():
    torch.manual_seed(0)
    in_f, out_f, slots, rank = 12, 10, 3, 4
    base = torch.nn.Linear(in_f, out_f)
    state = LoraState()
    layer = LoraLinear(base, in_f, out_f, slots, rank, state, torch.float32, torch.device("cpu"))
    assert plan_step([0, 1], state).shrink.keys() == {in_f}
    weights = {}
    for s, r in enumerate((4, 2, 3)):  # ranks below max are zero-padded
        a, b = torch.randn(in_f, r), torch.randn(r, out_f)
        layer.set_slot(s, a, b)
        weights[s] = (a, b)
    for token_slots in (
        [2, -1, 0, 1] + [1] * RUN_MIN_TOKENS + [-1, 2],  # indexed rows and a run
        [2, 0, 2, 1] + [0] * RUN_MIN_TOKENS,  # decode rows first (a slice) and a run
        [k % 3 for k in range(20)],  # more decode rows than the first index buffers hold
    ):
        x = torch.randn(1, len(token_slots), in_f)
        state.step = plan_step(token_slots, state)
        with torch.no_grad():
            y = layer(x)[0]
            expect = base(x)[0].clone()
        for row, s in enumerate(token_slots):
            if s >= 0:
                a, b = weights[s]
                expect[row] += (x[0, row] @ a) @ b
        torch.testing.assert_close(y, expect, rtol=1e-5, atol=1e-5)


def test_projections_sharing_an_input_share_one_shrink_and_each_get_their_own_update():
    torch.manual_seed(1)
    in_f, outs, slots, rank = 12, (10, 6, 6), 3, 4
    state = LoraState()
    group = SharedShrink(len(outs), slots, in_f, rank, torch.float32, torch.device("cpu"))
    bases = [torch.nn.Linear(in_f, out) for out in outs]
    layers = [
        LoraLinear(b, in_f, out, slots, rank, state, torch.float32, torch.device("cpu"), (group, k))
        for k, (b, out) in enumerate(zip(bases, outs, strict=True))
    ]
    weights = {}
    for k, (layer, out) in enumerate(zip(layers, outs, strict=True)):
        for s, r in enumerate((4, 2, 3)):
            a, b = torch.randn(in_f, r), torch.randn(r, out)
            layer.set_slot(s, a, b)
            weights[k, s] = (a, b)
    assert group.a.abs().sum() > 0, "set_slot must write into the shared stack"
    token_slots = [2, -1, 0, 1, 1, 2] + [0] * RUN_MIN_TOKENS
    x = torch.randn(1, len(token_slots), in_f)
    state.step = plan_step(token_slots, state)
    with torch.no_grad():
        ys = [layer(x)[0] for layer in layers]  # one input tensor: one bag sum for all three
        other = layers[1](x.clone())[0]  # another tensor, same values: computed afresh
        expect = [base(x)[0].clone() for base in bases]
    for row, s in enumerate(token_slots):
        if s >= 0:
            for k in range(len(outs)):
                a, b = weights[k, s]
                expect[k][row] += (x[0, row] @ a) @ b
    for y, e in zip(ys, expect, strict=True):
        torch.testing.assert_close(y, e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(other, expect[1], rtol=1e-5, atol=1e-5)
