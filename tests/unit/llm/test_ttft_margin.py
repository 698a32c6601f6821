"""The TTFT margin the ingress measures (serving/llm/ttft_margin.py) and how admission uses it
(serving/llm/admission.py `ttft_budget_s`, serving/llm/dispatch.py): the margin is an upper
conformal quantile of recent excesses per pool, it expires, and it only tightens the budget."""

from __future__ import annotations

import asyncio

import pytest

from serving.engine import SamplingParams
from serving.llm.admission import ttft_budget_s
from serving.llm.dispatch import open_stream
from serving.llm.messages import Delta, GenerateRequest, Refusal
from serving.llm.ttft_margin import TtftMargins, conformal_upper


def test_conformal_upper_is_the_kth_smallest_and_the_largest_when_few():
    values = [float(i) for i in range(1, 201)]  # 1..200
    assert conformal_upper(values, 0.99) == 199.0  # k = ceil(201 x 0.99) = 199
    assert conformal_upper(values[:50], 0.99) == 50.0  # k = 51 > n: the largest
    assert conformal_upper([3.0, 1.0, 2.0], 0.5) == 2.0  # k = 2


def test_no_margin_until_enough_samples_then_the_upper_quantile_per_pool():
    margins = TtftMargins(min_samples=10)
    for i in range(9):
        margins.observe("hot", 0.1, now=float(i))
    assert margins.margin_s("hot", now=9.0) is None
    margins.observe("hot", 0.6, now=9.0)  # one slow first token among ten
    assert margins.margin_s("hot", now=9.0) == 0.6
    assert margins.margin_s("cold", now=9.0) is None  # pools are measured apart


def test_old_samples_expire_and_early_first_tokens_never_give_a_negative_margin():
    margins = TtftMargins(min_samples=2, max_age_s=60.0)
    margins.observe("hot", 0.8, now=0.0)
    margins.observe("hot", 0.8, now=1.0)
    assert margins.margin_s("hot", now=30.0) == 0.8
    margins.observe("hot", -0.2, now=62.0)
    margins.observe("hot", -0.1, now=63.0)
    assert margins.margin_s("hot", now=63.0) == 0.0  # the overload's samples are gone


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match=r"quantile=1\.5"):
        TtftMargins(quantile=1.5)
    with pytest.raises(ValueError, match="min_samples=0"):
        TtftMargins(min_samples=0)


def test_the_measured_margin_only_tightens_the_budget():
    # SLO 1 s, fixed share 0.5: without a measurement 0.5 s, less what the ingress spent.
    assert ttft_budget_s(1.0, 0.5, 0.1, None) == pytest.approx(0.4)
    assert ttft_budget_s(1.0, 0.5, 0.1, 0.2) == pytest.approx(0.4)  # smaller: the share stands
    assert ttft_budget_s(1.0, 0.5, 0.1, 0.7) == pytest.approx(0.2)  # larger: it tightens
    assert ttft_budget_s(1.0, 0.5, 0.1, 5.0) == 0.0  # never negative


class RecordingHandle:
    """handle.options(stream=True).generate_stream.remote(request), keeping the requests."""

    def __init__(self, item):
        self.item, self.requests = item, []

    def options(self, stream):
        return self

    @property
    def generate_stream(self):
        return self

    def remote(self, request):
        self.requests.append(request)
        item = self.item

        class One:
            async def __anext__(self):
                return item

        return One()


def test_each_pool_gets_the_request_with_its_own_margin():
    margins = TtftMargins(min_samples=1)
    margins.observe("hot", 0.7, now=0.0)
    delta = Delta("a", (5,), True, "length", 1, 1, "hot", predicted_ttft_s=0.3)
    hot = RecordingHandle(delta)
    req = GenerateRequest("r", (1, 2), SamplingParams(max_tokens=1), "interactive")
    opened = asyncio.run(
        open_stream({"hot": hot}, {"hot": True}, req, 2.0, None, now=1.0, margins=margins)
    )
    assert opened.first.predicted_ttft_s == 0.3
    assert hot.requests[0].ttft_margin_s == 0.7


def test_the_replica_counts_the_time_since_the_first_send():
    req = GenerateRequest("r", (1,), SamplingParams(max_tokens=1), spent_s=0.1)
    assert req.hop_s(1000.0) == 0.0  # sent time unknown
    sent = GenerateRequest("r", (1,), SamplingParams(max_tokens=1), sent_unix_s=999.7)
    assert sent.hop_s(1000.0) == pytest.approx(0.3)
    assert sent.hop_s(999.0) == 0.0  # a replica clock behind the ingress's counts nothing


def test_every_pool_sees_the_first_send_time():
    refused = RecordingHandle(Refusal("hot: busy", 1.0, "interactive"))
    cold = RecordingHandle(Delta("a", (5,), True, "length", 1, 1, "cold"))
    req = GenerateRequest("r", (1, 2), SamplingParams(max_tokens=1), "interactive")
    handles, available = {"hot": refused, "cold": cold}, {"hot": True, "cold": True}
    asyncio.run(open_stream(handles, available, req, 2.0, sent_unix_s=1234.5))
    assert refused.requests[0].sent_unix_s == 1234.5 == cold.requests[0].sent_unix_s
