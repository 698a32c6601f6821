"""Dynamic batching for single-pass models (embeddings, rerankers): the batch-closing rule, pure.

R2: queue requests; send a batch when it reaches the target size OR the oldest request has waited
the window. Low traffic: the window rules; peak: the size rules. Never "wait for 128".
On top of that, three refinements, all decided here from the queue and `now` alone:

- Length buckets (R10 "bigger batches got slower"): a batch pads to its longest member, so
  requests batch only with others of similar token length. Bucket b holds lengths in
  (edge[b-1], edge[b]]; lengths above the last edge share the last bucket.
- Staggered windows (R7): a big batch's first request should not wait for its last. The window is
  cut into `stagger_slices` sub-windows; at the end of sub-window j (offset j * window / slices
  from the oldest arrival) a group closes if it holds at least (slices - j) / slices of the
  target. So a nearly full batch leaves early, a thin one waits the whole window:

      waited (slices=4, window 40 ms)   0-10 ms   10-20 ms   20-30 ms   30-40 ms   >= 40 ms
      fill needed (target 16)           16        12         8          4          1

  With stagger_slices = 1 this is exactly the plain R2 rule.
- Priority lanes (R5): interactive, analytical, offline never share a batch; a due interactive
  group goes first; the offline lane is served only when no other lane has anything waiting.

The asyncio loop (serving/embed/batch_loop.py) only awaits and asks `next_batch` what to do.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from common.validate import check_range
from serving.config.dynamic_batching import DynamicBatchingSection

LANES = ("interactive", "analytical", "offline")  # index = priority, 0 first
_OFFLINE = LANES.index("offline")
# Arrival times minus now lose ~1e-14 s to float rounding; a boundary reached within this
# counts as reached, so "waited exactly the window" closes the batch.
_EPS_S = 1e-9


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """The knobs the closing rule reads; the tuner replaces size and window while serving."""

    target_size: int
    window_s: float
    bucket_edges_tokens: tuple[int, ...] = (32, 64, 128, 256)
    stagger_slices: int = 1

    def __post_init__(self) -> None:
        check_range("policy", "target_size", self.target_size, 1, None, integer=True)
        check_range("policy", "window_s", self.window_s, 0.0, None)
        check_range("policy", "stagger_slices", self.stagger_slices, 1, None, integer=True)

    @classmethod
    def of(cls, section: DynamicBatchingSection) -> BatchPolicy:
        """The policy a replica starts from: its `dynamic_batching:` section's knobs."""
        return cls(
            section.max_batch_size,
            section.window_s,
            section.bucket_edges_tokens,
            section.stagger_slices,
        )


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the rule needs to know of one queued request."""

    arrival_s: float
    num_tokens: int
    lane: int = 0  # index into LANES


@dataclass(frozen=True, slots=True)
class Batch:
    """Send these queue positions together (oldest first). reason: "full" | "window"."""

    indices: tuple[int, ...]
    lane: int
    bucket: int
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing is due; look again at `until_s` (None: only when a request arrives)."""

    until_s: float | None


def bucket_of(num_tokens: int, edges: Sequence[int]) -> int:
    """Index of the first edge >= num_tokens; longer than every edge: the last bucket."""
    return min(bisect.bisect_left(edges, num_tokens), len(edges) - 1)


def required_fill(waited_s: float, policy: BatchPolicy) -> int:
    """How many requests a group needs to close after its oldest waited `waited_s` (table above)."""
    if waited_s + _EPS_S >= policy.window_s:
        return 1
    slice_s = policy.window_s / policy.stagger_slices
    passed = int((waited_s + _EPS_S) // slice_s)  # sub-window boundaries already reached
    remaining = policy.stagger_slices - passed
    return max(1, math.ceil(policy.target_size * remaining / policy.stagger_slices))


def _next_boundary_s(oldest_s: float, now: float, policy: BatchPolicy) -> float:
    """The next offset at which the group's fill requirement drops."""
    slice_s = policy.window_s / policy.stagger_slices
    passed = int((now - oldest_s + _EPS_S) // slice_s)
    return oldest_s + (passed + 1) * slice_s


def group(waiting: Sequence[Waiting], edges: Sequence[int]) -> dict[tuple[int, int], list[int]]:
    """Queue positions per (lane, bucket), each list in arrival order."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i in sorted(range(len(waiting)), key=lambda i: waiting[i].arrival_s):
        key = (waiting[i].lane, bucket_of(waiting[i].num_tokens, edges))
        groups.setdefault(key, []).append(i)
    return groups


def next_batch(waiting: Sequence[Waiting], policy: BatchPolicy, now: float) -> Batch | Wait:
    """The batch to send now, or how long nothing is due. Pure: same inputs, same answer.

    Among due groups the lower lane wins, then the one whose oldest request waited longest.
    """
    groups = group(waiting, policy.bucket_edges_tokens)
    busy_lanes = {lane for lane, _ in groups}
    due: list[tuple[int, float, Batch]] = []
    wake_s: float | None = None
    for (lane, bucket), members in groups.items():
        if lane == _OFFLINE and busy_lanes - {_OFFLINE}:
            continue  # offline work runs on idle capacity only (R5)
        oldest_s = waiting[members[0]].arrival_s
        need = required_fill(now - oldest_s, policy)
        if len(members) >= need:
            reason = "full" if len(members) >= policy.target_size else "window"
            batch = Batch(tuple(members[: policy.target_size]), lane, bucket, reason)
            due.append((lane, oldest_s, batch))
        else:
            boundary = _next_boundary_s(oldest_s, now, policy)
            wake_s = boundary if wake_s is None else min(wake_s, boundary)
    if due:
        return min(due, key=lambda d: (d[0], d[1]))[2]
    return Wait(wake_s)


def refusal_s(
    num_waiting: int,
    num_new: int,
    service_s_per_request: float,
    max_queue: int,
    max_queue_wait_s: float | None,
) -> float | None:
    """None to admit `num_new` more requests; else the estimated wait, a Retry-After hint.

    The wait estimate is everything queued ahead served at the recent per-request model time
    (batching amortises little on a CPU, so this is close; on a GPU it is pessimistic).
    """
    wait_s = (num_waiting + num_new) * service_s_per_request
    if num_waiting + num_new > max_queue:
        return wait_s
    if max_queue_wait_s is not None and wait_s > max_queue_wait_s:
        return wait_s
    return None


def padded_tokens(lengths: Sequence[int]) -> int:
    """Tokens a batch computes when every member pads to the longest (the cost buckets cut)."""
    return max(lengths, default=0) * len(lengths)
