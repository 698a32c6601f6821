"""Offline pacing: while interactive traffic is live, the engine idles after offline-only steps
for the rest of its duty cycle, and any arrival ends that idle at once."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.offline_pacing import OfflinePacer, rest_after_s
from serving.engine.scheduler import INTERACTIVE_RECENT_S
from serving.engine.sequence import Tier
from serving.tiny_models import tiny_model


def test_an_offline_only_step_at_half_duty_is_followed_by_as_long_a_rest():
    assert rest_after_s(0.04, offline_only=True, interactive_recent=True, duty=0.5) == 0.04
    assert rest_after_s(0.04, True, True, duty=0.25) == pytest.approx(0.12)


@pytest.mark.parametrize(
    ("offline_only", "recent", "duty"),
    [
        (False, True, 0.5),  # the step carried interactive (or analytical) work
        (True, False, 0.5),  # no interactive request lately: batch work runs flat out
        (True, True, 1.0),  # pacing off
    ],
)
def test_no_rest_otherwise(offline_only, recent, duty):
    assert rest_after_s(0.04, offline_only, recent, duty) == 0.0


def test_the_pacer_reads_the_batch_tiers_and_the_schedulers_recent_window():
    pacer = OfflinePacer(duty=0.5)
    recent = SimpleNamespace(scheduler=SimpleNamespace(interactive_recent=lambda now: True))
    row = lambda tier: SimpleNamespace(tier=tier)  # noqa: E731
    offline = SimpleNamespace(seqs=[row(Tier.OFFLINE), row(Tier.OFFLINE)])
    mixed = SimpleNamespace(seqs=[row(Tier.OFFLINE), row(Tier.INTERACTIVE)])
    pacer.on_step(recent, 0.0, 0.03, offline, [])
    assert pacer.rest_s == 0.03
    pacer.on_step(recent, 0.0, 0.03, mixed, [])
    assert pacer.rest_s == 0.0
    pacer.on_step(recent, 0.0, 0.03, SimpleNamespace(seqs=[]), [])  # an empty step owes nothing
    assert pacer.rest_s == 0.0


@pytest.fixture
def engine(tokenizer, clock):
    cfg = EngineConfig(num_kv_blocks=64, block_size_tokens=8, max_model_len=256)
    return LLMEngine(tiny_model("llama", seed=3), tokenizer, cfg, clock=clock)


def run_one(engine, tier: str) -> None:
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    seq = engine.make_sequence([5, 6, 7], params, tier, None, None)
    engine.submit(seq)
    while not seq.finished:
        engine.step()


def test_an_engine_owes_a_rest_after_offline_steps_only_while_interactive_traffic_is_recent(
    engine, clock
):
    pacer = engine._driver._pacer
    run_one(engine, "offline")  # no interactive request yet
    assert pacer.rest_s == 0.0
    run_one(engine, "interactive")
    run_one(engine, "offline")
    assert pacer.rest_s > 0.0  # at the default duty 0.5: as long as the last step took
    clock.advance(INTERACTIVE_RECENT_S + 1)
    run_one(engine, "offline")
    assert pacer.rest_s == 0.0


def test_the_rest_ends_when_a_request_arrives_and_is_skipped_if_one_came_during_the_step(engine):
    driver = engine._driver

    async def main() -> tuple[bool, bool, float]:
        driver._ensure_started()  # the loop's event; the engine idles with nothing to do
        wakes = driver._num_wakes
        driver.wake()  # an arrival while the step ran
        skipped = await driver._rest(30.0, wakes)
        wakes = driver._num_wakes
        asyncio.get_running_loop().call_soon(driver.wake)  # an arrival during the rest
        t0 = time.perf_counter()
        rested = await driver._rest(30.0, wakes)
        return skipped, rested, time.perf_counter() - t0

    skipped, rested, waited_s = asyncio.run(main())
    assert skipped is False
    assert rested is True
    assert waited_s < 10.0  # ended by the arrival, far inside its 30 s
