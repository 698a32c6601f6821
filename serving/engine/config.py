"""EngineConfig: the one validated, frozen object that sizes and steers an engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.validate import check_bool, check_choice, check_range

KVMode = Literal["reserve", "on_demand"]
KV_MODES = ("reserve", "on_demand")
RUNNERS = ("auto", "paged", "hf")
DTYPES = ("auto", "float32", "float16", "bfloat16")
DECODE_ATTENTION = ("auto", "gather", "flex", "native")
CPU_LINEAR = ("auto", "native", "onednn", "off")

_OWNER = "EngineConfig"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How one engine admits, schedules and stores KV.

    KV budget: `num_kv_blocks` if given, else `kv_cache_bytes`, else (CUDA) what is left of
    `gpu_memory_utilization` x device memory after the weights and the activation peak of a
    warm-up pass (serving/engine/kv_budget.py), else (CPU) room for `max_num_seqs` full-length
    sequences capped at `cpu_kv_cache_max_bytes`.
    Every byte count goes through `capacity.memory`.
    """

    # R8: "reserve" admits a request only if prompt + max_tokens fits the unreserved budget (never
    # preempts for KV); "on_demand" allocates blocks as tokens arrive and preempts by recompute.
    kv_mode: KVMode = "reserve"
    block_size_tokens: int = 16  # tokens per KV block, the unit of allocation
    # The KV budget as a number of blocks; overrides every other sizing key below.
    num_kv_blocks: int | None = None
    kv_cache_bytes: int | None = None  # the KV budget in bytes (used when num_kv_blocks is null)
    # CUDA, with neither of the above: the share of the device's memory this engine may hold
    # (weights, a warm-up pass's activations and KV; vLLM's meaning), plan --utilization.
    gpu_memory_utilization: float = 0.9
    # CPU, with neither of the above: room for max_num_seqs full-length sequences, capped here.
    cpu_kv_cache_max_bytes: int = 2 * 2**30
    # The concurrency window slides from max_num_seqs (KV use <= kv_low_watermark) down to
    # min_num_seqs (KV use >= kv_high_watermark), R8's "16 to 48 with the watermark".
    max_num_seqs: int = 64
    min_num_seqs: int = 16  # the floor of the concurrency window
    kv_low_watermark: float = 0.6  # KV use up to which the window stays at max_num_seqs
    kv_high_watermark: float = 0.9  # KV use from which the window is at min_num_seqs
    # Per-step token budget: long prompts are prefilled in chunks so running decodes never stall.
    max_num_batched_tokens: int = 512
    # Prompt + completion tokens of one request; null: the model's max_position_embeddings,
    # at most 4096.
    max_model_len: int | None = None
    # Offline work only runs on idle capacity: admitted while KV use is below this fraction.
    offline_idle_fraction: float = 0.5
    # Offline tokens (decode rows + prefill chunk) one step may carry while interactive requests
    # arrived recently: an interactive request arriving mid-step waits for at most such a step
    # (tier isolation of TTFT). null: no cap (offline steps as large as max_num_batched_tokens).
    offline_step_tokens: int | None = 8
    # Share of the engine's time offline-only steps may take while interactive requests arrived
    # recently: after each, the engine idles (until a request arrives) so the next interactive
    # prompt more often finds it free (serving/engine/offline_pacing.py). 1: no idling.
    offline_duty_fraction: float = 0.5
    # on_demand keeps this share of blocks free at admission so running decodes can grow.
    on_demand_free_fraction: float = 0.02
    # Default queue deadline for requests that name none (None: wait as long as it takes).
    max_queue_wait_s: float | None = None
    # R7 for continuous batching (serving/engine/tuner.py): move max_num_seqs and
    # max_num_batched_tokens to keep TTFT and inter-token p99 inside the tiers' SLOs.
    tuner: bool = False
    tuner_interval_s: float = 5.0  # seconds of traffic behind each tuner decision
    # Weights and KV cache. auto: the model's own dtype where the device runs it fast (CUDA; a
    # bfloat16 model on a CPU with AMX-BF16 / AVX512-BF16), float32 on other CPUs
    # (serving/engine/dtypes.py).
    dtype: str = "auto"
    device: str = "auto"  # auto, cpu, cuda or cuda:N; auto: CUDA when one is visible
    # paged: our packed paged-attention runner; hf: one transformers forward per request;
    # auto: paged when the model supports transformers' attention interface.
    runner: str = "auto"
    seed: int = 0  # seeds unseeded sampling (a request's own `seed` still wins)
    # How CPU linear layers multiply. native: weights packed once at load for a C kernel built
    # on this machine (float32, AVX2 + FMA; serving/engine/cpu_matmul.py); onednn: packed once
    # into oneDNN's blocked layout (float32, or bfloat16 where the CPU has native bf16 units;
    # serving/engine/cpu_linear.py); off: plain torch.nn.functional.linear. auto: native when
    # its start-up check passes and it beats onednn on the model's own weights at start, else
    # onednn where it applies, else off, and only for models
    # with 64 MiB of linear weights or more (smaller ones stay in the CPU's caches, where
    # F.linear is as fast). An explicit native or onednn packs any size. CUDA: off.
    cpu_linear: str = "auto"
    # Llama-family models (llama, mistral, qwen2, qwen3) run through the engine's own lean
    # forward, the same arithmetic without transformers' module plumbing
    # (serving/engine/lean_forward.py); false: the model's own forward. Paged runner only.
    lean_forward: bool = True
    # How the paged runner's decode rows read the KV cache. gather: copy each decode group's
    # blocks, then SDPA; flex: FlexAttention reads the cache in place through a block mask built
    # from the block tables (serving/engine/flex_decode.py); native: a C kernel built on this
    # machine reads it in place (CPU, float32 KV; serving/engine/cpu_attention.py); auto: flex
    # on CUDA and native on CPU when their start-up check against gather passes, else gather.
    decode_attention: str = "auto"
    # Automatic prefix caching (decision 9): computed full KV blocks stay cached after their
    # request ends (evicted least-recently-used when the pool needs them), and a new request
    # skips the longest cached run of its prompt. Off by itself (logged) for models with
    # sliding-window layers and for the plain hf runner.
    prefix_caching: bool = True
    # LoRA adapters (serving/engine/lora/): slots on the device for this many adapters at once,
    # each of rank up to max_lora_rank; 0: no adapters. The slots' memory is allocated at start
    # (capacity.adapters.lora_slot_bytes); more adapters may be registered, and the least
    # recently used one no running request uses is evicted when another needs its slot.
    max_loras: int = 0
    max_lora_rank: int = 16  # the largest adapter rank the slots hold

    def __post_init__(self) -> None:
        check_choice(_OWNER, "kv_mode", self.kv_mode, KV_MODES)
        check_choice(_OWNER, "runner", self.runner, RUNNERS)
        check_choice(_OWNER, "dtype", self.dtype, DTYPES)
        check_choice(_OWNER, "decode_attention", self.decode_attention, DECODE_ATTENTION)
        check_choice(_OWNER, "cpu_linear", self.cpu_linear, CPU_LINEAR)
        check_range(_OWNER, "seed", self.seed, 0, 2**63 - 1, integer=True)
        check_range(_OWNER, "block_size_tokens", self.block_size_tokens, 1, 1024, integer=True)
        if self.num_kv_blocks is not None:
            check_range(_OWNER, "num_kv_blocks", self.num_kv_blocks, 1, None, integer=True)
        if self.kv_cache_bytes is not None:
            check_range(_OWNER, "kv_cache_bytes", self.kv_cache_bytes, 1, None, integer=True)
        check_range(
            _OWNER,
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            0.0,
            1.0,
            lo_open=True,
        )
        check_range(
            _OWNER, "cpu_kv_cache_max_bytes", self.cpu_kv_cache_max_bytes, 1, None, integer=True
        )
        check_range(_OWNER, "max_num_seqs", self.max_num_seqs, 1, 65536, integer=True)
        check_range(_OWNER, "min_num_seqs", self.min_num_seqs, 1, self.max_num_seqs, integer=True)
        check_range(_OWNER, "kv_low_watermark", self.kv_low_watermark, 0.0, 1.0)
        check_range(_OWNER, "kv_high_watermark", self.kv_high_watermark, self.kv_low_watermark, 1.0)
        check_range(
            _OWNER, "max_num_batched_tokens", self.max_num_batched_tokens, 1, None, integer=True
        )
        if self.max_model_len is not None:
            check_range(_OWNER, "max_model_len", self.max_model_len, 1, None, integer=True)
        check_range(_OWNER, "offline_idle_fraction", self.offline_idle_fraction, 0.0, 1.0)
        if self.offline_step_tokens is not None:
            check_range(
                _OWNER, "offline_step_tokens", self.offline_step_tokens, 2, None, integer=True
            )
        check_range(
            _OWNER, "offline_duty_fraction", self.offline_duty_fraction, 0.0, 1.0, lo_open=True
        )
        check_range(_OWNER, "on_demand_free_fraction", self.on_demand_free_fraction, 0.0, 0.5)
        if self.max_queue_wait_s is not None:
            check_range(_OWNER, "max_queue_wait_s", self.max_queue_wait_s, 0.0, None, lo_open=True)
        for name in ("lean_forward", "prefix_caching", "tuner"):
            check_bool(_OWNER, name, getattr(self, name))
        check_range(_OWNER, "tuner_interval_s", self.tuner_interval_s, 0.0, 3600.0, lo_open=True)
        check_range(_OWNER, "max_loras", self.max_loras, 0, 256, integer=True)
        check_range(_OWNER, "max_lora_rank", self.max_lora_rank, 1, 512, integer=True)
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"{_OWNER}.device={self.device!r} must be 'auto', 'cpu' or 'cuda[:N]'")
