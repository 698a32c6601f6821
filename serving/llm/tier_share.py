"""The lower tiers' share of the ingress's slots. Pure, no Ray.

The ingress deployment relays at most `max_ongoing_requests` HTTP requests at once (the bounded
front door, serving/config/front_door.py); past that, Serve's proxy queues or refuses requests
without knowing their tier. Admitted analytical and offline streams last long (a night job's
request holds its slot for its whole generation), so without a share of their own a flood of them
could fill every ingress slot and leave interactive requests to the proxy's 429. The ingress
therefore holds at most `limit` lower-tier HTTP requests at once, half of its slots, and answers
the next one 429 itself, before tokenizing it: the other half is always there for interactive
work, as a replica keeps half of its Serve slots for it (serving/llm/admission.py).

A `Hold` is released exactly once, however the request ends: the non-streaming path releases it
when the reply is built, a stream when the replica's items end or fail or its client leaves, and
a stream that never started (its client left before the first frame) when its frame generator
is garbage-collected.
"""

from __future__ import annotations


class Hold:
    """One request's place in the share; `release` is idempotent."""

    __slots__ = ("_share",)

    def __init__(self, share: TierShare | None) -> None:
        self._share = share

    def release(self) -> None:
        share, self._share = self._share, None
        if share is not None:
            share.held -= 1


class TierShare:
    """At most `limit` requests of the tiers below interactive held at once."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit={limit} must be >= 1")
        self.limit = limit
        self.held = 0

    def take(self, tier: str) -> Hold | None:
        """A hold for this request, or None when the lower tiers' share is full. Interactive
        requests always get one (it holds nothing: their limit is the ingress's own)."""
        if tier == "interactive":
            return Hold(None)
        if self.held >= self.limit:
            return None
        self.held += 1
        return Hold(self)
