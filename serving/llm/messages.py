"""What crosses between the LLM deployments: frozen dataclasses, never string-keyed dicts.

    ingress ──GenerateRequest──▶ replica.generate_stream ──▶ Refusal | Failure | Delta, Delta...
    ingress ──AdapterRef───────▶ replica.load_adapter ──▶ Failure | None   (/v1/load_lora_adapter)
    ingress ◀── ReplicaInfo ──── replica.info()
    doctor  ◀── ReplicaReading ─ replica.reading()   (config, KV ledger, the last step window)
    replica ──ReplicaReport────▶ forecast controller (queue signals for the emergency path)
    ingress ──Completion / Delta──▶ handle callers in other Ray apps

A replica's stream opens with exactly one item that decides the outcome: a `Refusal` (the
ingress tries the next pool, or answers 429), a `Failure` (the request itself is bad: a 4xx), or
the first `Delta` (admitted; more deltas follow until one has `finished`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.tiers import check_tier
from serving.engine.outputs import TokenLogprob
from serving.engine.sampling_params import SamplingParams
from serving.llm.startup import StartupPhases

if TYPE_CHECKING:
    from capacity.probe import GpuSample
    from serving.config import AppConfig
    from serving.engine.load import LoadSnapshot
    from serving.engine.window import WindowSummary


DECLARED = "declared"  # the load_id of the adapters cluster.yaml declares (model.adapters)


@dataclass(frozen=True, slots=True)
class AdapterRef:
    """A LoRA adapter as the ingress knows it: a replica that has not registered this exact
    (name, path, load_id) registers it from `path` before serving the request (lazily: a
    replica started after the load learns it from its first request). `load_id` tells a
    reload under the same name and path apart (DECLARED for model.adapters)."""

    name: str
    path: str
    load_id: str = DECLARED

    def __post_init__(self) -> None:
        for key in ("name", "path", "load_id"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"AdapterRef.{key}={value!r} must be a non-empty string")


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    tier: str = "interactive"
    timeout_s: float | None = None  # queue deadline; None: the tier's max_queue_wait_s
    # Seconds the ingress already spent on it (validation, tokenizing, earlier pools): they
    # count against the tier's TTFT budget at admission.
    spent_s: float = 0.0
    # What the ingress measured for this pool (serving/llm/ttft_margin.py): how much later than
    # predicted first tokens have been reaching it. None: not measured yet.
    ttft_margin_s: float | None = None
    # Wall clock when the ingress first sent it to a pool: the replica counts the hop (and any
    # wait in Serve's router queue or an earlier pool's refusal) as spent too.
    sent_unix_s: float | None = None
    # The longest it may wait for a slot on a replica while the ingress turns the tier away, from
    # its arrival rate (serving/llm/arrivals.py). None: no bound, the TTFT budget alone decides.
    max_wait_s: float | None = None
    # The LoRA adapter the request's `model` named; None: the base model. The router keys its
    # replica affinity on it (serving/llm/adapter_affinity.py).
    adapter: AdapterRef | None = None

    def __post_init__(self) -> None:
        check_tier(self.tier, "tier")
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))

    def hop_s(self, now_unix_s: float) -> float:
        """Seconds since the ingress sent it (0 when unknown; a clock behind counts as 0)."""
        return 0.0 if self.sent_unix_s is None else max(now_unix_s - self.sent_unix_s, 0.0)


@dataclass(frozen=True, slots=True)
class Delta:
    """New text of one request; the last one has `finished` and a `finish_reason`."""

    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    pool: str
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when the request asked
    # On a stream's first delta: the time from the ingress's send to the first token its
    # replica predicted at admission, the hop included (the ingress compares it with what it
    # saw, serving/llm/ttft_margin.py).
    predicted_ttft_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "logprobs", tuple(self.logprobs))


@dataclass(frozen=True, slots=True)
class Refusal:
    """The replica will not take the request now; another pool may, or the client retries.
    An admission refusal names the tier, the predicted TTFT and the replica's load snapshot,
    which the ingress keeps to skip the pool until capacity is predicted to free."""

    reason: str
    retry_after_s: float  # the predicted time until capacity frees, bounded (admission.py)
    tier: str = ""
    predicted_ttft_s: float | None = None
    load: LoadSnapshot | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """The request cannot be served as it is (e.g. longer than max_model_len): an HTTP 4xx."""

    status: int
    message: str


ReplicaItem = Delta | Refusal | Failure


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole generation, as the handle API's `generate` returns it."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    pool: str

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": self.num_output_tokens,
            "total_tokens": self.num_prompt_tokens + self.num_output_tokens,
        }


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A replica's identity and KV ledger, for operators and tests."""

    pool: str
    fingerprint: str
    warmup_s: float  # the constructor's total: load, self-check and warm-up (startup.total_s)
    max_model_len: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_reserved: int
    running: int
    waiting: int
    live_requests: int
    pid: int
    startup: StartupPhases = field(default_factory=StartupPhases)
    # Share of its routing rank the replica takes now: below 1.0 in its slow-start window.
    slow_start_fraction: float = 1.0


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """A replica's queue numbers, pushed to its app's forecast controller every routing period."""

    pool: str
    replica_id: str
    num_waiting: int = 0
    num_running: int = 0
    queue_wait_p99_s: float = 0.0
    kv_use_fraction: float = 0.0
    # over the replica's last closed step window: requests that got their first token, and the
    # engine seconds LoRA slot loads took (the autoscaler's capacity model charges them per
    # request, autoscaling/policy.py)
    window_requests: int = 0
    lora_load_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LoraCounts:
    """A replica's LoRA slot traffic: adapter requests admitted, of which `loads` found their
    adapter in no slot (and `evictions` of those first evicted another adapter); `load_s` is
    the engine time those loads took (the steps waited for them)."""

    admissions: int = 0
    loads: int = 0
    evictions: int = 0
    load_s: float = 0.0

    def minus(self, earlier: LoraCounts) -> LoraCounts:
        return LoraCounts(
            self.admissions - earlier.admissions,
            self.loads - earlier.loads,
            self.evictions - earlier.evictions,
            self.load_s - earlier.load_s,
        )

    @property
    def loads_per_admission(self) -> float:
        return self.loads / self.admissions if self.admissions else 0.0


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    """What `tideserve doctor` reads from one replica: its config and the numbers its metrics
    export (KV ledger now, latencies and rates over its last completed step window)."""

    pool: str
    replica_id: str
    fingerprint: str
    config: AppConfig
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_reserved: int
    block_size_tokens: int
    kv_bytes_per_token: int
    max_num_seqs: int  # the ceiling now (the tuner may have moved it)
    max_num_batched_tokens: int
    concurrency_limit: int  # the ceiling after the KV watermark slide
    num_running: int
    num_waiting: int
    avg_seq_len_tokens: float  # running sequences, now
    num_preemptions: int
    num_timeouts: int
    window: WindowSummary | None  # None until the first window closed
    refused_per_s: float = 0.0  # admission refusals over that window: demand turned away
    tuner_last: str | None = None  # the tuner's last move and why; None: tuner off
    # Prefix caching, since the engine started: prompt tokens looked up and found (tokens).
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    gpus: tuple[GpuSample, ...] = field(default=())
    # LoRA slots (0 slots: no adapters): admissions, loads and evictions since the engine
    # started, and over the last closed step window (what `doctor` judges thrashing by).
    lora_slots_total: int = 0
    lora: LoraCounts = field(default_factory=LoraCounts)
    lora_window: LoraCounts = field(default_factory=LoraCounts)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_blocks_total * self.block_size_tokens

    @property
    def kv_use_fraction(self) -> float:
        return max(self.kv_blocks_used, self.kv_blocks_reserved) / max(self.kv_blocks_total, 1)
