"""Exact parameter counts from a config alone: transformers builds the model on the `meta` device.

No weight is read or allocated: the meta device records shapes only (Mixtral-8x7B in ~0.1 s).
Counted once per distinct config (cached):

  total        every parameter, tied embeddings once (what the weights occupy in memory)
  active       total minus the routed experts a token does not use: a mixture of experts with E
               experts, k per token, keeps k / E of its expert weights (compute, not memory)
  embedding    the input embedding matrix (a lookup, no FLOPs)
  quantizable  weights of the linear layers inside the decoder blocks, experts included: what
               GPTQ / AWQ / bitsandbytes / FP8 checkpoints store in fewer bits (capacity.memory)

A config transformers does not know (no model_type, or one that needs the model's own code,
which planning never runs) falls back to `capacity.memory.estimate_num_params`, marked inexact.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts")


@dataclass(frozen=True, slots=True)
class ParamCount:
    total: int
    active: int
    embedding: int
    quantizable: int
    tied_embeddings: bool
    exact: bool = True
    source: str = "transformers on the meta device"

    @property
    def flop_params(self) -> int:
        """Parameters a token multiplies through (2 FLOPs each): active minus the embedding
        lookup, unless the same matrix is also the LM head (tied)."""
        return self.active - (0 if self.tied_embeddings else self.embedding)


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    return config.to_dict()


def transformers_config(config: Any):
    """A transformers config object for `config` (dict or object), or None if unknown."""
    if not isinstance(config, dict):
        return config
    return _config_from_json(json.dumps(config, sort_keys=True, default=str))


@functools.lru_cache(maxsize=64)
def _config_from_json(text: str):
    from transformers import AutoConfig

    data = {k: v for k, v in json.loads(text).items() if k != "auto_map"}
    model_type = data.pop("model_type", None)
    if not model_type:
        return None
    try:
        return AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError, TypeError):
        return None


def _first(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def quantization_config(config: Any) -> dict[str, Any] | None:
    """The checkpoint's `quantization_config` as a dict, or None for plain weights."""
    text = config.get("text_config") if isinstance(config, dict) else None
    q = _get(config, "quantization_config") or _get(text or {}, "quantization_config")
    if q is None:
        return None
    return dict(q) if isinstance(q, dict) else q.to_dict()


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def count_params(config: Any) -> ParamCount:
    """Exact counts for any architecture transformers ships; an estimate otherwise."""
    tcfg = transformers_config(config)
    if tcfg is not None:
        data = {k: v for k, v in _as_dict(tcfg).items() if k != "quantization_config"}
        skip = (quantization_config(config) or {}).get("modules_to_not_convert") or ()
        counted = _count_on_meta(json.dumps(data, sort_keys=True, default=str), tuple(skip))
        if counted is not None:
            return counted
    from capacity.memory import estimate_num_params

    total = estimate_num_params(config)
    return ParamCount(
        total=total,
        active=total,
        embedding=0,
        quantizable=0,
        tied_embeddings=False,
        exact=False,
        source="estimated from hidden size, layers and vocabulary (architecture unknown to "
        "transformers)",
    )


@functools.lru_cache(maxsize=64)
def _count_on_meta(config_json: str, skip: tuple[str, ...]) -> ParamCount | None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    try:
        config = AutoConfig.for_model(data.pop("model_type"), **data)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError, ImportError):
        return None
    return _count_model(model, config, frozenset(skip))


def _count_model(model, config, skip: frozenset[str]) -> ParamCount:
    import torch

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    total = sum(p.numel() for p in model.parameters())  # shared (tied) tensors once
    embed = model.get_input_embeddings()
    embedding = embed.weight.numel() if embed is not None else 0
    head = model.get_output_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    experts = quantizable = 0
    expert_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in expert_prefixes):
            continue  # inside an experts container already counted whole
        if name.endswith("experts") and not name.endswith("shared_experts"):
            n = sum(p.numel() for p in module.parameters() if p.dim() >= 2)
            experts += n
            quantizable += n
            expert_prefixes.append(name + ".")
        elif (
            isinstance(module, torch.nn.Linear)
            and module is not head
            and not skip.intersection(name.split("."))
        ):
            quantizable += module.weight.numel()
    num_experts = _first(text, EXPERT_COUNT_KEYS)
    per_token = _first(text, EXPERTS_PER_TOKEN_KEYS)
    active = total
    if experts and num_experts and per_token:
        active = total - experts * (num_experts - per_token) // num_experts
    return ParamCount(
        total=total,
        active=active,
        embedding=embedding,
        quantizable=quantizable,
        tied_embeddings=tied,
    )
