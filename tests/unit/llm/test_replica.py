"""The replica's stream relay records every admitted request in the latency histograms: TTFT at
the first token, end-to-end at whichever end comes, with the reason. A fake engine stands in for
the real one (no model, no Ray); the metric objects are the fakes of test_metrics."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from serving.engine import RequestTimeoutError, SamplingParams
from serving.engine.outputs import StreamDelta
from serving.llm import metrics as m
from serving.llm.messages import Failure, GenerateRequest, Refusal
from serving.llm.replica import ModelReplica
from tests.unit.llm.test_metrics import fake_metrics


def delta(finished: bool = False, reason: str | None = None) -> StreamDelta:
    return StreamDelta("r1", [7], "x", finished, reason, 3, 1, queue_wait_s=0.01)


class FakeEngine:
    """Streams the given deltas, then raises `then` if one is given."""

    def __init__(self, deltas: list[StreamDelta], then: BaseException | None = None) -> None:
        self.deltas, self.then = deltas, then
        self.adapters: list[str | None] = []  # the adapter each stream() call named

    async def stream(self, prompt, params, tier, request_id, timeout_s, interval_s, adapter=None):
        self.adapters.append(adapter)
        for d in self.deltas:
            yield d
        if self.then is not None:
            raise self.then


def relay(engine: FakeEngine, take: int | None = None):
    """Runs the replica's relay; the caller stops after `take` items (None: reads to the end).
    Returns the items read, the outcome, the fake metrics and what the relay raised (or None)."""
    replica = ModelReplica.__new__(ModelReplica)  # no model: the relay alone is under test
    replica.engine, replica.pool = engine, "hot"
    replica.metrics, made = fake_metrics()
    replica.config = SimpleNamespace(
        replica=SimpleNamespace(stream_interval_s=0.0), server=SimpleNamespace(retry_after_s=1.0)
    )
    request = GenerateRequest("r1", (1, 2, 3), SamplingParams(max_tokens=4), tier="interactive")
    outcome = ["aborted"]

    async def run():
        stream = replica._relay(request, SimpleNamespace(max_queue_wait_s=5.0), outcome, 0.1)
        try:
            async for item in stream:
                items.append(item)
                if take is not None and len(items) == take:
                    break
        except RuntimeError as err:
            return err
        finally:
            await stream.aclose()  # what Serve does when the ingress cancels the stream
        return None

    items: list = []
    error = asyncio.run(run())
    return items, outcome[0], made, error


def reasons(made) -> list[str]:
    return [tags["finished_reason"] for _, tags in made[m.E2E_LATENCY].observed]


def test_a_finished_request_records_ttft_then_e2e_with_the_finish_reason():
    items, outcome, made, _ = relay(FakeEngine([delta(), delta(True, "length")]))
    assert [i.finished for i in items] == [False, True] and outcome == "ok"
    assert len(made[m.TTFT].observed) == 1  # the first token only, not every delta
    assert len(made[m.QUEUE_WAIT].observed) == 1
    assert reasons(made) == ["length"]
    (ttft_s, _), (e2e_s, _) = made[m.TTFT].observed[0], made[m.E2E_LATENCY].observed[0]
    assert 0 <= ttft_s <= e2e_s
    assert made[m.REQUEST_SUCCESS].total == 1.0


@pytest.mark.parametrize("why", ["the ingress cut a stop string", "the client left"])
def test_a_stream_closed_by_its_caller_is_counted_as_cancelled(why):
    # Both reach the replica as the same close after the first delta; before, neither was counted
    items, outcome, made, _ = relay(FakeEngine([delta(), delta(), delta(True, "stop")]), take=1)
    assert len(items) == 1 and outcome == "aborted"
    assert len(made[m.TTFT].observed) == 1
    assert reasons(made) == ["cancelled"]
    assert len(made[m.DECODE_TIME].observed) == 1
    assert made[m.REQUEST_SUCCESS].total == 0.0  # not an engine finish


def test_a_timeout_before_the_first_token_counts_e2e_without_ttft():
    items, outcome, made, _ = relay(FakeEngine([], then=RequestTimeoutError("waited 5 s")))
    assert isinstance(items[0], Refusal) and outcome == "timeout"
    assert made[m.TTFT].observed == [] and made[m.DECODE_TIME].observed == []
    assert reasons(made) == ["timeout"]


def test_a_request_the_engine_refuses_counts_as_invalid():
    items, outcome, made, _ = relay(FakeEngine([], then=ValueError("prompt too long")))
    assert isinstance(items[0], Failure) and outcome == "invalid"
    assert reasons(made) == ["invalid"]


def test_an_engine_error_mid_stream_is_counted_once_as_error_and_raised():
    items, outcome, made, error = relay(FakeEngine([delta()], then=RuntimeError("loop died")))
    assert isinstance(error, RuntimeError) and len(items) == 1 and outcome == "aborted"
    assert reasons(made) == ["error"]  # once, though the stream's close came after it


# ----- LoRA adapters: registered before the request, named to the engine --------------------------
def test_an_adapter_request_streams_with_its_adapter_and_a_bad_adapter_is_a_400():
    from serving.llm.messages import AdapterRef
    from serving.llm.replica_adapters import ReplicaAdapters
    from tests.unit.llm.test_replica_adapters import FakeEngine as AdapterEngine

    replica = ModelReplica.__new__(ModelReplica)
    replica.pool, (replica.metrics, _) = "hot", fake_metrics()
    replica.adapters = ReplicaAdapters(AdapterEngine(bad_paths={"/bad"}), {})
    bad = GenerateRequest(
        "r1", (1, 2), SamplingParams(max_tokens=4), adapter=AdapterRef("x", "/bad", "load-1")
    )

    async def first_item():
        stream = replica.generate_stream(bad)
        item = await stream.__anext__()
        await stream.aclose()
        return item

    item = asyncio.run(first_item())
    assert isinstance(item, Failure) and item.status == 400
    assert "adapter 'x' at '/bad' cannot be served" in item.message
    assert "no adapter_config.json" in item.message

    engine = FakeEngine([delta(True, "stop")])
    relayed = ModelReplica.__new__(ModelReplica)
    relayed.engine, relayed.pool, (relayed.metrics, _) = engine, "hot", fake_metrics()
    relayed.config = SimpleNamespace(replica=SimpleNamespace(stream_interval_s=0.0))
    good = GenerateRequest(
        "r2", (1, 2), SamplingParams(max_tokens=4), adapter=AdapterRef("y", "/y", "load-2")
    )

    async def run():
        return [i async for i in relayed._relay(good, SimpleNamespace(max_queue_wait_s=5.0),
                                                ["aborted"], 0.1)]  # fmt: skip

    assert asyncio.run(run())[-1].finished and engine.adapters == ["y"]
