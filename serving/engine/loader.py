"""Device, dtype, model loading and KV sizing: the engine's start-up decisions, in one place."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from capacity import adapters, memory
from serving.engine import dtypes, kv_cache
from serving.engine.config import EngineConfig
from serving.engine.kv_blocks import BlockPool
from serving.engine.kv_budget import MemoryReading, kv_budget_bytes

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 4096


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"EngineConfig.device={name!r} but no CUDA device is visible")
    return dev


def resolve_dtype(
    name: str,
    device: torch.device,
    model_dtype: torch.dtype | None = None,
    cpu_flags: frozenset[str] | None = None,
) -> torch.dtype:
    """An explicit dtype as named; `auto` by the rule in serving/engine/dtypes.py: the model's own
    half dtype on CUDA and on CPUs with bf16 units, float32 elsewhere."""
    if name == "auto":
        flags = dtypes.read_cpu_flags() if cpu_flags is None else cpu_flags
        return dtypes.auto_dtype(device.type, model_dtype, flags)
    return getattr(torch, name)


def saved_dtype(path_or_model, trust_remote_code: bool = False) -> torch.dtype | None:
    """The dtype the model was saved in: a loaded model's config, or the directory's config.json."""
    if not isinstance(path_or_model, str | os.PathLike):
        return dtypes.config_dtype(path_or_model.config)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path_or_model), trust_remote_code=trust_remote_code)
    return dtypes.config_dtype(config)


def load_model(
    path_or_model, dtype: torch.dtype, device: torch.device, trust_remote_code: bool = False
):
    """A loaded model passes through (moved and cast); a path or hub id is loaded from disk.

    trust_remote_code is passed explicitly: a model directory's own Python code runs only when
    the operator opted in (model.trust_remote_code), and transformers never prompts for it."""
    from transformers import AutoModelForCausalLM

    if isinstance(path_or_model, str | os.PathLike):
        model = AutoModelForCausalLM.from_pretrained(
            str(path_or_model), dtype=dtype, trust_remote_code=trust_remote_code
        )
    else:
        model = path_or_model
    return model.to(device=device, dtype=dtype).eval()


def load_checked(path_or_model, cfg: EngineConfig, tokenizer, trust_remote_code: bool):
    """(model, tokenizer) at the config's device and dtype; a directory is checked first
    (`preflight`), before a weight is read."""
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device, saved_dtype(path_or_model, trust_remote_code))
    if isinstance(path_or_model, str | os.PathLike):
        preflight(path_or_model, cfg, dtype, device, trust_remote_code)
    model = load_model(path_or_model, dtype, device, trust_remote_code)
    return model, load_tokenizer(path_or_model, tokenizer, trust_remote_code)


def load_tokenizer(path_or_model, tokenizer, trust_remote_code: bool = False):
    if tokenizer is not None or not isinstance(path_or_model, str | os.PathLike):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            str(path_or_model), trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:  # weights without a tokenizer still serve token ids
        log.warning("no tokenizer at %s (%s); only token-id prompts will work", path_or_model, err)
        return None


def device_memory_bytes(device: torch.device) -> int:
    """What the device holds in all: the GPU's memory, or this machine's RAM on CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    import psutil

    return psutil.virtual_memory().total


def preflight(path, cfg: EngineConfig, dtype: torch.dtype, device: torch.device, trust: bool):
    """Before a weight is read: refuse by name a model whose features the engine cannot serve
    (serving/engine/features.py), and, in GiB, one that cannot fit this device with its reserve
    and one max_model_len sequence of KV (capacity/fit.py, the planner's own check)."""
    from transformers import AutoConfig

    from capacity.fit import FitInputs, check_fits
    from capacity.params import count_params, quantization_config
    from serving.engine.features import check_model, model_name

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust)
    check_model(config, "hf")  # the architecture is checked once the model class is known
    params = count_params(config)
    weights = memory.weight_bytes(params, dtype, quantization_config(config))
    weights += adapters.lora_slot_bytes(config, dtype, cfg.max_loras, cfg.max_lora_rank)
    max_len = resolve_max_model_len(cfg, config)
    bs = cfg.block_size_tokens
    windows = memory.paging_layout(config).group_windows
    one_seq = memory.seq_blocks(windows, max_len, bs, cfg.max_num_batched_tokens)
    dtype_name = str(dtype).removeprefix("torch.")
    fit = FitInputs(
        what=f"model {model_name(config)} ({params.total / 1e9:.2f} B parameters, {dtype_name})",
        weight_bytes=weights,
        one_seq_kv_bytes=one_seq * memory.block_bytes(config, dtype, bs),
        max_model_len=max_len,
        utilization=1.0,
    )
    where = f"this {'GPU' if device.type == 'cuda' else 'machine'} ({device})"
    check_fits(fit, where, device_memory_bytes(device), gpu=None)


def resolve_max_model_len(cfg: EngineConfig, model_config) -> int:
    limit = getattr(model_config, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
    if cfg.max_model_len is None:
        return min(limit, DEFAULT_MAX_MODEL_LEN)
    if cfg.max_model_len > limit:
        raise ValueError(
            f"EngineConfig.max_model_len={cfg.max_model_len} is out of range; allowed: "
            f"1 <= max_model_len <= {limit} (the model's max_position_embeddings)"
        )
    return cfg.max_model_len


def num_kv_blocks(
    cfg: EngineConfig,
    model_config,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    read_memory: Callable[[], MemoryReading] | None = None,
) -> int:
    """Blocks in the KV region, each sized by capacity.memory (the one formula).

    On CUDA with no explicit size, `read_memory` (a warm-up pass, then the device's free memory:
    kv_budget.measure_cuda) gives what is left for KV."""
    bs = cfg.block_size_tokens
    per_block = memory.block_bytes(model_config, dtype, bs)
    if cfg.num_kv_blocks is not None:
        return cfg.num_kv_blocks
    if cfg.kv_cache_bytes is not None:
        budget = cfg.kv_cache_bytes
    elif device.type == "cuda":
        if read_memory is None:
            raise ValueError("sizing KV on a GPU needs a memory reading after the warm-up pass")
        budget = kv_budget_bytes(read_memory(), cfg.gpu_memory_utilization)
    else:
        windows = memory.paging_layout(model_config).group_windows
        per_seq = memory.seq_blocks(windows, max_model_len, bs, cfg.max_num_batched_tokens)
        budget = min(cfg.max_num_seqs * per_seq * per_block, cfg.cpu_kv_cache_max_bytes)
    blocks = memory.num_blocks_in_budget(budget, model_config, dtype, bs)
    if blocks < 1:
        raise ValueError(
            f"KV budget of {budget} bytes holds no block of {per_block} bytes "
            f"({bs} tokens); raise EngineConfig.kv_cache_bytes or lower block_size_tokens"
        )
    return blocks


def make_block_pool(cfg: EngineConfig, model_config, num_blocks: int) -> BlockPool:
    """The pool, with one paging group per window (capacity.memory.paging_layout)."""
    windows = memory.paging_layout(model_config).group_windows
    return BlockPool(num_blocks, cfg.block_size_tokens, windows)


def allocate_kv_cache(model_config, dtype, device, pool: BlockPool):
    """The cache tensor (or its grouped view): pool.num_blocks x block_bytes, + the NULL block.

    The layout is explained in serving/engine/kv_cache.py and serving/engine/attention.py.
    """
    return kv_cache.allocate(model_config, dtype, device, pool)


def eos_token_ids(model, tokenizer) -> frozenset[int]:
    """EOS ids as `generate()` sees them: generation config, then model config, then tokenizer."""
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list | tuple) else [eos])
