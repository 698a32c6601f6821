"""The engine's KV side, built once at start: context length, block pool, ledger, prefix cache,
cache tensor and runner, sized for the model and device the engine already holds.

Kept apart from LLMEngine so that the engine file holds the request path (add, step, stream)
and this one the start-up arithmetic (how many blocks fit, which runner serves the model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serving.engine import loader
from serving.engine.config import EngineConfig
from serving.engine.features import check_model
from serving.engine.kv_budget import measure_cuda
from serving.engine.ledger import KVLedger
from serving.engine.lora.ledger import AdapterLedger
from serving.engine.lora.manager import LoraManager
from serving.engine.prefix_cache import setup_prefix_cache
from serving.engine.runner import HFRunner, PagedRunner, Runner


@dataclass(frozen=True, slots=True)
class StepTiming:
    num_seqs: int
    num_tokens: int
    step_s: float
    forward_s: float


@dataclass(frozen=True, slots=True)
class KVParts:
    max_model_len: int
    pool: object  # BlockPool
    ledger: KVLedger
    prefix_caching: bool
    kv_cache: object  # tensor, GroupedKVCache (serving/engine/kv_cache.py), or None (hf runner)
    runner: Runner


def _warmup_reader(model, cfg: EngineConfig, device: torch.device):
    """On CUDA: a warm-up forward of the largest step, then free memory (kv_budget.py)."""
    # Logits for as many rows as a step can hold tokens: the tuner may raise max_num_seqs,
    # never the token budget past this (serving/engine/tuning.py).
    tokens = cfg.max_num_batched_tokens
    return lambda: measure_cuda(model, device, tokens, tokens)


def build_kv(
    model, cfg: EngineConfig, dtype: torch.dtype, device: torch.device, adapters: LoraManager | None
) -> KVParts:
    """Refuse by name what the runner cannot serve, then size and allocate the KV side. Adapter
    slots are allocated before this call: on CUDA they come out of the KV budget."""
    mc = model.config
    use_paged = cfg.runner == "paged" or (
        cfg.runner == "auto" and type(model)._supports_attention_backend
    )
    check_model(mc, "paged" if use_paged else "hf")
    max_model_len = loader.resolve_max_model_len(cfg, mc)
    num_blocks = loader.num_kv_blocks(
        cfg, mc, dtype, device, max_model_len, _warmup_reader(model, cfg, device)
    )
    pool = loader.make_block_pool(cfg, mc, num_blocks)
    ledger_args = (pool, cfg.kv_mode, cfg.on_demand_free_fraction, cfg.max_num_batched_tokens)
    ledger = (
        KVLedger(*ledger_args)
        if adapters is None
        else AdapterLedger(*ledger_args, adapters=adapters)
    )
    prefix_caching = setup_prefix_cache(ledger, cfg, mc, str(dtype), use_paged)
    kv_cache = None
    runner: Runner
    if use_paged:
        kv_cache = loader.allocate_kv_cache(mc, dtype, device, pool)
        runner = PagedRunner(model, kv_cache, pool, cfg.decode_attention, cfg.lean_forward)
    else:
        runner = HFRunner(model, device)
    runner.adapters = adapters
    return KVParts(max_model_len, pool, ledger, prefix_caching, kv_cache, runner)
