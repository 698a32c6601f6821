"""Pool order with failover and stop strings (serving/llm/dispatch.py), with fake handles."""

from __future__ import annotations

import asyncio

import pytest

from serving.api.errors import ApiError
from serving.engine import SamplingParams
from serving.llm.dispatch import open_stream
from serving.llm.messages import Delta, Failure, GenerateRequest, Refusal
from serving.llm.stop_strings import StopStrings


class FakeStream:
    def __init__(self, items):
        self.items = list(items)
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self):
        self.cancelled = True


class FakeHandle:
    """Mimics handle.options(stream=True).generate_stream.remote(request)."""

    def __init__(self, items):
        self.items = items
        self.calls = 0

    def options(self, stream):
        assert stream is True
        return self

    @property
    def generate_stream(self):
        return self

    def remote(self, request):
        self.calls += 1
        return FakeStream(self.items)


DELTA = Delta("a", (5,), True, "length", 1, 1, "hot")
REFUSED = Refusal("queue full", 3.0)


def request(tier: str) -> GenerateRequest:
    return GenerateRequest("req-1", (1, 2), SamplingParams(max_tokens=1), tier)


def run(handles, tier, available=None):
    available = available or {"hot": True, "cold": True}
    return asyncio.run(open_stream(handles, available, request(tier), 2.0))


def test_interactive_prefers_hot_and_overflows_to_cold():
    hot, cold = FakeHandle([DELTA]), FakeHandle([DELTA])
    assert run({"hot": hot, "cold": cold}, "interactive").pool == "hot"
    hot_full = FakeHandle([REFUSED])
    opened = run({"hot": hot_full, "cold": cold}, "interactive")
    assert opened.pool == "cold" and hot_full.calls == 1


def test_analytical_and_offline_prefer_cold():
    for tier in ("analytical", "offline"):
        assert run({"hot": FakeHandle([DELTA]), "cold": FakeHandle([DELTA])}, tier).pool == "cold"


def test_unavailable_pool_is_skipped():
    cold = FakeHandle([DELTA])
    opened = run(
        {"hot": FakeHandle([DELTA]), "cold": cold}, "analytical", {"hot": True, "cold": False}
    )
    assert opened.pool == "hot" and cold.calls == 0


def test_every_pool_refusing_is_a_429_with_the_longest_retry_after():
    with pytest.raises(ApiError) as err:
        run({"hot": FakeHandle([REFUSED]), "cold": FakeHandle([REFUSED])}, "interactive")
    assert err.value.status == 429 and err.value.retry_after_s == 3.0
    assert err.value.code == "rate_limit_exceeded" and "queue full" in err.value.message


def test_no_pool_running_is_a_503():
    with pytest.raises(ApiError) as err:
        run(
            {"hot": FakeHandle([DELTA]), "cold": FakeHandle([DELTA])},
            "interactive",
            {"hot": False, "cold": False},
        )
    assert err.value.status == 503


def test_replica_error_is_a_400_without_failover():
    cold = FakeHandle([DELTA])
    with pytest.raises(ApiError) as err:
        run(
            {
                "hot": FakeHandle([Failure(400, "too long")]),
                "cold": cold,
            },
            "interactive",
        )
    assert err.value.status == 400 and cold.calls == 0


def test_stop_strings_cut_and_hold_back_partial_matches():
    cut = StopStrings(["END"])
    assert cut.feed("hello E", final=False) == "hello"  # " E" may still become "END"
    assert cut.feed("N", final=False) == " "
    assert not cut.stopped
    assert cut.feed("D and more", final=False) == ""  # the stop string and all after it go
    assert cut.stopped


def test_stop_string_split_across_deltas():
    cut = StopStrings(["\n\n"])
    out = cut.feed("a\n", final=False) + cut.feed("\nb", final=False)
    assert out == "a" and cut.stopped


def test_no_stop_strings_pass_text_through():
    cut = StopStrings([])
    assert cut.feed("abc", final=False) == "abc" and not cut.stopped


def test_final_flushes_held_text():
    cut = StopStrings(["xyz"])
    assert cut.feed("abx", final=False) == "a"
    assert cut.feed("", final=True) == "bx" and not cut.stopped


def test_a_recent_refusal_of_a_lower_tier_is_remembered_briefly():
    from serving.llm.dispatch import RefusalMemo

    memo = RefusalMemo(hold_s=0.5)
    offline_refused = Refusal("offline: queue full", 3.0, "offline")
    cold, hot = FakeHandle([offline_refused]), FakeHandle([offline_refused])
    handles, available = {"hot": hot, "cold": cold}, {"hot": True, "cold": True}

    def attempt(tier, now):
        return asyncio.run(open_stream(handles, available, request(tier), 2.0, memo, now))

    with pytest.raises(ApiError):
        attempt("offline", now=10.0)
    assert (cold.calls, hot.calls) == (1, 1)
    with pytest.raises(ApiError) as info:
        attempt("offline", now=10.4)  # within the hold: answered without asking the replicas
    assert (cold.calls, hot.calls) == (1, 1) and info.value.status == 429
    cold.items = hot.items = [Refusal("interactive: queue full", 1.0, "interactive")]
    with pytest.raises(ApiError):
        attempt("interactive", now=10.4)  # a count limit of offline says nothing of interactive
    assert (cold.calls, hot.calls) == (2, 2)
    hot.items = [DELTA]
    assert attempt("offline", now=10.6).pool == "hot"  # the hold has passed


def busy_load(remaining_tokens: int):
    from serving.engine.load import LoadSnapshot

    # One slot, busy for `remaining_tokens` more 0.1 s steps.
    return LoadSnapshot(0.0, 0.1, 0.0, 256, 1, (remaining_tokens,), {})


def test_the_ingress_skips_a_pool_until_its_refused_load_is_predicted_to_fit():
    """The replica's TTFT rule on the pool's last refused snapshot: requests that would be
    refused are answered at the ingress, with a Retry-After from the prediction, until the
    predicted wait fits the budget; then the replica is asked again."""
    from serving.llm.dispatch import RefusalMemo

    memo = RefusalMemo({"interactive": (1.0, 0.5)}, retry_after_max_s=60.0, snapshot_hold_s=30.0)
    # Busy for 30 steps of 0.1 s: a new request waits 3 s for the slot.
    refused = Refusal("hot: interactive: predicted TTFT", 2.7, "interactive", 3.2, busy_load(30))
    hot = FakeHandle([refused])
    handles, available = {"hot": hot, "cold": FakeHandle([])}, {"hot": True, "cold": False}

    def attempt(now):
        return asyncio.run(open_stream(handles, available, request("interactive"), 2.0, memo, now))

    with pytest.raises(ApiError):
        attempt(now=100.0)
    assert hot.calls == 1
    with pytest.raises(ApiError) as info:
        attempt(now=101.0)  # 2 s of wait left: predicted 2.2 s > 0.5 s, not asked
    assert hot.calls == 1 and info.value.status == 429
    assert "interactive: predicted TTFT" in info.value.message
    assert info.value.retry_after_s == pytest.approx(1.7)  # until it fits: 2.2 - 0.5
    hot.items = [DELTA]
    late = GenerateRequest("r2", (1, 2), SamplingParams(max_tokens=1), "interactive", spent_s=0.3)
    with pytest.raises(ApiError):  # 0.3 s already spent in the ingress: 0.4 s > 0.5 - 0.3 s
        asyncio.run(open_stream(handles, available, late, 2.0, memo, 102.8))
    assert hot.calls == 1
    assert attempt(now=102.8).pool == "hot"  # 0.2 s left + one step: fits, the replica is asked
    assert hot.calls == 2
    attempt(now=102.9)  # admitted once: the snapshot is dropped, the replica decides again
    assert hot.calls == 3


def test_the_ingress_applies_the_requests_wait_bound_to_the_refused_snapshot_too():
    """A pool whose last refused load predicts a wait longer than the request's bound is
    skipped at the ingress, though the TTFT alone would fit the budget."""
    from serving.llm.dispatch import RefusalMemo

    memo = RefusalMemo({"interactive": (1.0, 0.5)}, retry_after_max_s=60.0, snapshot_hold_s=30.0)
    refused = Refusal("hot: interactive: predicted wait", 1.0, "interactive", 0.4, busy_load(3))
    hot = FakeHandle([refused])
    handles, available = {"hot": hot, "cold": FakeHandle([])}, {"hot": True, "cold": False}
    params = SamplingParams(max_tokens=1)
    bounded = GenerateRequest("r", (1, 2), params, "interactive", max_wait_s=0.1)
    with pytest.raises(ApiError):
        asyncio.run(open_stream(handles, available, bounded, 2.0, memo, 100.0))
    assert hot.calls == 1
    with pytest.raises(ApiError) as info:  # 0.3 s wait > 0.1 s: not asked again
        asyncio.run(open_stream(handles, available, bounded, 2.0, memo, 100.0))
    assert hot.calls == 1 and "predicted wait 0.30 s" in info.value.message
    hot.items = [DELTA]
    unbounded = GenerateRequest("r2", (1, 2), params, "interactive")  # 0.4 s fits 0.5 s
    assert asyncio.run(open_stream(handles, available, unbounded, 2.0, memo, 100.0)).pool == "hot"
    assert hot.calls == 2


def test_without_a_snapshot_the_ingress_always_asks_for_interactive():
    from serving.llm.dispatch import RefusalMemo

    memo = RefusalMemo({"interactive": (1.0, 0.5)})
    hot = FakeHandle([Refusal("hot: interactive: queue full", 2.0, "interactive")])
    handles = {"hot": hot, "cold": FakeHandle([])}
    for now in (1.0, 1.1):
        with pytest.raises(ApiError):
            asyncio.run(open_stream(handles, {"hot": True}, request("interactive"), 2.0, memo, now))
    assert hot.calls == 2


class ParkedStream(FakeStream):
    """What Serve's handle does for a deployment whose last replica is gone: waits forever."""

    async def __anext__(self):
        await asyncio.Event().wait()


class ParkingHandle(FakeHandle):
    def remote(self, request):
        self.calls += 1
        self.stream = ParkedStream([])
        return self.stream


def test_a_request_parked_on_an_emptied_cold_pool_goes_on_to_hot(monkeypatch):
    import serving.llm.dispatch as dispatch

    monkeypatch.setattr(dispatch, "POOL_GONE_CHECK_S", 0.01)
    cold, hot = ParkingHandle([]), FakeHandle([DELTA])
    available = {"hot": True, "cold": True}

    async def scenario():
        opening = asyncio.ensure_future(
            open_stream({"hot": hot, "cold": cold}, available, request("analytical"), 2.0)
        )
        await asyncio.sleep(0.05)  # parked on cold: no answer, not failed
        assert not opening.done() and cold.calls == 1
        available["cold"] = False  # the ingress's watcher: no running cold replica any more
        return await asyncio.wait_for(opening, 5)

    opened = asyncio.run(scenario())
    assert opened.pool == "hot" and cold.stream.cancelled and hot.calls == 1


def test_the_ingress_counts_its_interactive_429s_and_bounds_the_next_requests_wait():
    """Ingress._open counts arrivals and 429s: after enough refusals the next request carries
    the wait bound."""
    from types import SimpleNamespace

    from serving.llm.arrivals import ARRIVALS_AHEAD, MIN_REFUSALS, WINDOW_S, WaitBound
    from serving.llm.ingress import Ingress
    from serving.llm.ttft_margin import TtftMargins

    class Recording(FakeHandle):
        def remote(self, request):
            self.sent.append(request)
            return super().remote(request)

    hot = Recording([Refusal("hot: interactive: queue full", 1.0, "interactive")])
    hot.sent = []
    ingress = Ingress.__new__(Ingress)  # no model, no Ray: only what _open reads
    ingress.num_requests = ingress.num_refused = 0
    ingress.handles, ingress.available = {"hot": hot, "cold": FakeHandle([])}, {"hot": True}
    ingress.config = SimpleNamespace(server=SimpleNamespace(retry_after_s=2.0))
    ingress.refusals, ingress.margins, ingress.wait_bound = None, TtftMargins(), WaitBound()

    async def already_watching() -> None:
        pass

    ingress.ensure_watching = already_watching

    async def refused_requests(n: int):
        for _ in range(n):
            with pytest.raises(ApiError):
                await ingress._open([1, 2], SamplingParams(max_tokens=1), "interactive")

    asyncio.run(refused_requests(MIN_REFUSALS))
    # the autoscaling policy reads both counts (a refusal share past 2% is an emergency)
    assert (ingress.num_requests, ingress.num_refused) == (MIN_REFUSALS, MIN_REFUSALS)
    assert hot.sent[0].max_wait_s is None  # nothing refused yet: no bound
    assert hot.sent[MIN_REFUSALS - 1].max_wait_s is None  # 3 refusals: not yet sustained
    hot.items = [DELTA]
    asyncio.run(ingress._open([1, 2], SamplingParams(max_tokens=1), "interactive"))
    # 5 arrivals within the 2 s window, 4 of them refused: a wait of 2 arrival gaps is 0.8 s.
    arrival_rate = (MIN_REFUSALS + 1) / WINDOW_S
    assert hot.sent[-1].max_wait_s == pytest.approx(ARRIVALS_AHEAD / arrival_rate)
    # offline work waits for idle replicas by design: its refusals are not a shortfall
    hot.items = [Refusal("hot: offline: not idle", 1.0, "offline")]
    with pytest.raises(ApiError):
        asyncio.run(ingress._open([1, 2], SamplingParams(max_tokens=1), "offline"))
    assert (ingress.num_requests, ingress.num_refused) == (MIN_REFUSALS + 2, MIN_REFUSALS)
