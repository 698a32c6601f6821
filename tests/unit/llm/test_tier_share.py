"""The lower tiers' share of the ingress's slots (serving/llm/tier_share.py): analytical and
offline requests hold at most half of the ingress, interactive requests are never counted, and a
hold comes back exactly once however the request ends."""

from __future__ import annotations

import gc

import pytest

from serving.llm.tier_share import TierShare


def test_lower_tiers_fill_their_share_then_are_refused_while_interactive_still_enters():
    share = TierShare(limit=2)
    first, second = share.take("offline"), share.take("analytical")
    assert first is not None and second is not None
    assert share.take("offline") is None  # the share is full
    assert share.take("interactive") is not None  # interactive holds none of it
    assert share.held == 2
    first.release()
    assert share.take("offline") is not None  # a freed place is taken again


def test_a_hold_is_released_once_however_often_its_request_ends():
    share = TierShare(limit=1)
    hold = share.take("offline")
    hold.release()
    hold.release()  # the stream's finally and its finalizer both fire
    assert share.held == 0
    share.take("interactive").release()  # an interactive hold never touches the count
    assert share.held == 0


def test_a_stream_that_never_started_gives_its_place_back_when_collected():
    import weakref

    share = TierShare(limit=1)
    hold = share.take("offline")

    async def frames():
        try:
            yield "data"
        finally:
            hold.release()

    stream = frames()  # the client left before the first frame: its finally never runs
    weakref.finalize(stream, hold.release)
    del stream
    gc.collect()
    assert share.held == 0
    assert share.take("offline") is not None


def test_the_share_must_hold_at_least_one_request():
    with pytest.raises(ValueError, match="limit=0"):
        TierShare(0)
