"""KV-headroom routing inside one replica group (hot or cold).

Replicas report their KV ledger through Serve's `record_routing_stats` (every
`request_routing_stats_period_s`); the handle's router ranks them by *headroom*, the tokens a
new request can still claim there, and Serve sends the request to the best rank that has a free
slot (`max_ongoing_requests`), picking the shortest queue inside a rank.

Routing stats (what `routing_stats_from_engine` builds and `ModelReplica.record_routing_stats`
returns), all in tokens or sequences:

| key                  | meaning                                                           |
|----------------------|-------------------------------------------------------------------|
| `kv_free_tokens`     | (total - max(used, reserved)) blocks x block size                 |
| `kv_reserved_tokens` | reserved blocks x block size (reserve mode: prompt + max_tokens)  |
| `kv_total_tokens`    | total blocks x block size                                         |
| `queued_tokens`      | tokens the waiting (not yet admitted) requests will claim         |
| `num_waiting`        | sequences waiting for admission                                   |
| `num_running`        | sequences admitted and decoding                                   |
| `slow_start_fraction`| share of its rank a just-ready replica takes (llm/slow_start.py)  |

Headroom = min(kv_free_tokens, kv_total_tokens - kv_reserved_tokens) - queued_tokens.
The min takes out blocks already promised to admitted requests even when a reporter counted only
used blocks as busy (reservations are claims that will turn into used blocks), and the queued
tokens are subtracted because the waiting requests are ahead of a new one: they are admitted
first and take that KV before it can. Headroom <= 0 means a new request would queue there.

PrefixAffinityRouter puts first the replica a request's prompt prefix belongs to (consistent
hashing, serving/llm/prefix_affinity.py) unless that replica is past a load bound; the ranks by
headroom follow. A LoRA adapter's request is keyed on its adapter instead
(serving/llm/adapter_affinity.py): the replica that holds it, or its home replica, or the next
one in its order when the home one is past the bound. The replicas then report which adapters
hold a slot (`lora_in_slots`, a list of names, beside the numbers above).

This module never imports torch or the engine at run time: the ingress and proxy processes load
the router class (Serve pickles this module by value into every handle's process).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from serving.llm.adapter_affinity import IN_SLOTS_KEY, adapter_choice
from serving.llm.pending_calls import adapter_of, oldest_open_with_id, prompt_of
from serving.llm.prefix_affinity import AffinityBound, affinity_choice, prefix_key
from serving.llm.slow_start import apply_slow_start, fraction_of

if TYPE_CHECKING:
    from serving.engine import EngineStats

log = logging.getLogger("ray.serve")

K = TypeVar("K")

ROUTING_STATS_KEYS: tuple[str, ...] = (
    "kv_free_tokens",
    "kv_reserved_tokens",
    "kv_total_tokens",
    "queued_tokens",
    "num_waiting",
    "num_running",
)
_HEADROOM_KEYS = ("kv_free_tokens", "kv_reserved_tokens", "kv_total_tokens", "queued_tokens")

# Replicas whose headroom is within this fraction of a rank's best share that rank, and Serve
# picks the shortest queue among them. Stats are up to one period old, so a strict order would
# send every request of that period to the single best replica; a band keeps near-equal
# replicas balanced by their live queue length instead.
DEFAULT_BAND_FRACTION = 0.1


def headroom_tokens(routing_stats: Mapping[str, Any]) -> float:
    """Tokens a new request can still claim on a replica (formula in the module docstring).

    Raises ValueError naming the key when a headroom key is missing or not a finite number.
    """
    values: dict[str, float] = {}
    for key in _HEADROOM_KEYS:
        if key not in routing_stats:
            raise ValueError(f"routing stats lack {key!r}; got keys {sorted(routing_stats)}")
        value = routing_stats[key]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ValueError(f"routing stats {key}={value!r} must be a finite number")
        values[key] = float(value)
    unreserved = values["kv_total_tokens"] - values["kv_reserved_tokens"]
    return min(values["kv_free_tokens"], unreserved) - values["queued_tokens"]


def _headroom_or_none(routing_stats: Mapping[str, Any] | None) -> float | None:
    if not routing_stats:
        return None
    try:
        return headroom_tokens(routing_stats)
    except ValueError:
        return None


def _band(ordered: list[tuple[K, float]], band_fraction: float) -> list[list[K]]:
    """Split (key, headroom) pairs sorted best first into ranks of near-equal headroom."""
    ranks: list[list[K]] = []
    leader = math.inf
    for key, headroom in ordered:
        if ranks and headroom >= leader * (1.0 - band_fraction):
            ranks[-1].append(key)
        else:
            ranks.append([key])
            leader = headroom
    return ranks


def rank_by_headroom(
    replicas_stats: Sequence[tuple[K, Mapping[str, Any] | None]],
    band_fraction: float = DEFAULT_BAND_FRACTION,
) -> list[list[K]]:
    """Rank replicas by KV headroom, most first; each inner list is one rank.

    - Replicas with positive headroom are sorted best first and grouped into bands
      (`band_fraction` of the band leader's headroom).
    - Replicas without (valid) stats yet, i.e. replicas that just started, form one middle rank:
      after the bands at or above the median headroom of the reporting replicas, before the
      rest. A new replica is empty, so it should take traffic before the busier half, but its
      state is not known yet, so not before the replicas known to have the most room.
    - Replicas with headroom <= 0 (their queue already claims all free KV) form the last rank:
      a request must still go somewhere, and Serve picks the shortest queue among them.

    Ties keep the input order (stable sort), also inside every rank. No replicas, no ranks.
    """
    if not 0.0 <= band_fraction < 1.0:
        raise ValueError(f"band_fraction={band_fraction!r} must be in [0, 1)")
    known: list[tuple[K, float]] = []
    unknown: list[K] = []
    for key, stats in replicas_stats:
        headroom = _headroom_or_none(stats)
        if headroom is None:
            unknown.append(key)
        else:
            known.append((key, headroom))
    known.sort(key=lambda pair: -pair[1])  # stable: equal headroom keeps input order
    positive = [(k, h) for k, h in known if h > 0]
    saturated = [k for k, h in known if h <= 0]

    ranks: list[list[K]] = []
    if positive:
        median = statistics.median(h for _, h in known)
        upper = [(k, h) for k, h in positive if h >= median]
        lower = [(k, h) for k, h in positive if h < median]
        ranks += _band(upper, band_fraction)
        if unknown:
            ranks.append(unknown)
        ranks += _band(lower, band_fraction)
    elif unknown:
        ranks.append(unknown)
    if saturated:
        ranks.append(saturated)
    return ranks


def routing_stats_from_engine(stats: EngineStats, queued_tokens: int) -> dict[str, Any]:
    """The routing-stats dict (keys in ROUTING_STATS_KEYS, and IN_SLOTS_KEY where the engine
    serves adapters) of one engine snapshot.

    `queued_tokens`: tokens the engine's waiting requests will claim when admitted (the replica
    knows its queue; the engine snapshot carries counts only).
    """
    if isinstance(queued_tokens, bool) or not isinstance(queued_tokens, int) or queued_tokens < 0:
        raise ValueError(f"queued_tokens={queued_tokens!r} must be an integer >= 0")
    block = stats.block_size_tokens
    busy_blocks = max(stats.num_kv_blocks_used, stats.num_kv_blocks_reserved)
    lora = {IN_SLOTS_KEY: list(stats.lora_in_slots)} if stats.lora_slots_total else {}
    return {
        **lora,
        "kv_free_tokens": (stats.num_kv_blocks_total - busy_blocks) * block,
        "kv_reserved_tokens": stats.num_kv_blocks_reserved * block,
        "kv_total_tokens": stats.num_kv_blocks_total * block,
        "queued_tokens": queued_tokens,
        "num_waiting": stats.num_waiting,
        "num_running": stats.num_running,
    }


class _ReadsRoutingStats:
    """Says once per replica when its routing stats are present but unusable."""

    _warned_replica_ids: set[Any]

    def _ready_to_rank(
        self, candidates: list[RunningReplica], pending_request: PendingRequest | None
    ) -> bool:
        """What every choose_replicas does first; False when there is nothing to rank."""
        if pending_request is not None:
            # Without this flag Serve's retry loop re-calls choose_replicas with no sleep when
            # every rank is full (the flag is normally set by Serve's locality/multiplex mixins).
            pending_request.routing_context.should_backoff = True
        if not candidates:
            return False
        self._warn_once_about_bad_stats(candidates)
        return True

    @staticmethod
    def _slow_started(
        ranks: list[list[RunningReplica]], candidates: list[RunningReplica]
    ) -> list[list[RunningReplica]]:
        """Replicas in their slow-start window keep their rank only by chance (slow_start.py),
        unless all or none of the candidates are in theirs: then none is warmer than another."""
        started = [fraction_of(r.routing_stats) >= 1.0 for r in candidates]
        if all(started) or not any(started):
            return ranks
        return apply_slow_start(ranks, lambda replica: fraction_of(replica.routing_stats))

    def _warn_once_about_bad_stats(self, replicas: list[RunningReplica]) -> None:
        """Stats that are present but unusable rank a replica as 'no stats yet': say so once."""
        for replica in replicas:
            stats = replica.routing_stats
            if not stats or replica.replica_id in self._warned_replica_ids:
                continue
            try:
                headroom_tokens(stats)
            except ValueError as err:
                self._warned_replica_ids.add(replica.replica_id)
                log.warning("%s: bad routing stats, ranked as new: %s", replica.replica_id, err)


class KVHeadroomRouter(FIFOMixin, _ReadsRoutingStats, RequestRouter):
    """Serve request router: the replica with the most KV headroom first.

    Configure with `RequestRouterConfig(request_router_class="serving.llm.router:KVHeadroomRouter",
    request_routing_stats_period_s=..., request_router_kwargs={"band_fraction": 0.1})`.

    FIFOMixin: the choice does not depend on the request, so whichever routing task finds a
    replica hands it to the oldest waiting request (arrival order), as Serve's default router
    does.
    """

    band_fraction: float = DEFAULT_BAND_FRACTION

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warned_replica_ids: set[Any] = set()

    def initialize_state(self, band_fraction: float = DEFAULT_BAND_FRACTION, **kwargs: Any) -> None:
        if kwargs:
            raise ValueError(
                f"KVHeadroomRouter got unknown request_router_kwargs {sorted(kwargs)}; "
                "allowed: ['band_fraction']"
            )
        if isinstance(band_fraction, bool) or not isinstance(band_fraction, int | float):
            raise ValueError(f"band_fraction={band_fraction!r} must be a number in [0, 1)")
        if not 0.0 <= band_fraction < 1.0:
            raise ValueError(f"band_fraction={band_fraction!r} must be in [0, 1)")
        self.band_fraction = float(band_fraction)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not self._ready_to_rank(candidate_replicas, pending_request):
            return []
        ranks = rank_by_headroom(
            [(replica, replica.routing_stats) for replica in candidate_replicas],
            self.band_fraction,
        )
        return self._slow_started(ranks, candidate_replicas)


def prefix_affinity_ranks(
    prompt_token_ids: Sequence[int] | None,
    replicas: Sequence[tuple[K, Any, Mapping[str, Any] | None]],
    bound: AffinityBound,
    band_fraction: float = DEFAULT_BAND_FRACTION,
    adapter: str | None = None,
    reorder_rest: Callable[[list[list[K]]], list[list[K]]] | None = None,
) -> list[list[K]]:
    """Ranks of (replica, id, routing stats) triples: the affine replica alone first when one
    is within the bound (the adapter's, for a LoRA request; else the prompt prefix's), then
    every other replica ranked by headroom (rank_by_headroom), passed through `reorder_rest`."""
    if adapter is not None:
        chosen = adapter_choice(adapter, replicas, bound)
    elif prompt_token_ids is None:
        chosen = None
    else:
        chosen = affinity_choice(prefix_key(prompt_token_ids, bound.prefix_tokens), replicas, bound)
    rest = [(replica, stats) for replica, _, stats in replicas if replica is not chosen]
    ranks = rank_by_headroom(rest, band_fraction)
    if reorder_rest is not None:
        ranks = reorder_rest(ranks)
    return ranks if chosen is None else [[chosen], *ranks]


class PrefixAffinityRouter(_ReadsRoutingStats, RequestRouter):
    """Serve request router: the replica that probably caches the prompt's prefix (or, for a
    LoRA request, holds its adapter), unless it is past the bound, then the most KV headroom
    (KVHeadroomRouter).

    request_router_kwargs: band_fraction, prefix_tokens, max_waiting, max_kv_use_fraction,
    max_imbalance (AffinityBound). Not FIFO: the choice depends on the request, so Serve
    matches each routing task's replica to its own request.
    """

    band_fraction: float = DEFAULT_BAND_FRACTION
    bound: AffinityBound = AffinityBound()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warned_replica_ids = set()

    def initialize_state(self, band_fraction: float = DEFAULT_BAND_FRACTION, **kwargs: Any) -> None:
        allowed = ("prefix_tokens", "max_waiting", "max_kv_use_fraction", "max_imbalance")
        unknown = sorted(set(kwargs) - set(allowed))
        if unknown:
            raise ValueError(
                f"PrefixAffinityRouter got unknown request_router_kwargs {unknown}; "
                f"allowed: {['band_fraction', *allowed]}"
            )
        KVHeadroomRouter.initialize_state(self, band_fraction)  # type: ignore[arg-type]
        self.bound = AffinityBound(**kwargs)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not self._ready_to_rank(candidate_replicas, pending_request):
            return []
        # The affine replica keeps its first rank even in its slow-start window: the prefix's
        # KV (or the adapter) lives there, and the bound's max_imbalance already caps how much
        # more than the least loaded replica it holds. Slow start reorders only the rest.
        return prefix_affinity_ranks(
            prompt_of(pending_request),
            [(r, r.replica_id, r.routing_stats) for r in candidate_replicas],
            self.bound,
            self.band_fraction,
            adapter_of(pending_request),
            reorder_rest=lambda ranks: self._slow_started(ranks, candidate_replicas),
        )

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata=None) -> None:
        """Serve's exact match by internal request id, then the oldest open request sharing that
        id (oldest_open_with_id): calls made inside one HTTP request share it."""
        pending = None
        if request_metadata is not None:
            pending = self._get_pending_request_matching_internal_request_id(request_metadata)
            if pending is None:
                queue = self._pending_requests_to_fulfill
                pending = oldest_open_with_id(queue, request_metadata.internal_request_id)
        if pending is None:
            return
        self._cancel_routing_task_for_pending_request(pending)
        self._record_queue_wait_time(pending)
        pending.future.set_result(replica)
        self._remove_pending_request_from_indices(pending)
