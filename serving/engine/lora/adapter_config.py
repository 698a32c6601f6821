"""A PEFT `adapter_config.json`, validated: what the engine implements, and a refusal naming the
field and its value for everything it does not (decision 7: a silently different answer is the
worst failure).

Implemented: plain LoRA on the attention and MLP projections (q/k/v/o, gate/up/down), scale
lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, per-module ranks (rank_pattern: each
module's rank is read from its weights). Refused when set: DoRA, LoRA biases, trained biases,
modules_to_save, per-module alphas, fan_in_fan_out, and every other PEFT feature that changes the
forward (listed in MUST_BE_OFF, plus any key this version does not know, unless it is null,
false or empty).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capacity.adapters import LORA_TARGETS

# The projections an adapter may target (Llama-style names, as in PEFT's defaults for Llama,
# Mistral, Qwen2/3, Gemma): the engine wraps exactly these, and capacity.memory sizes their slots.
TARGET_MODULES = LORA_TARGETS

# Keys that describe training or bookkeeping, not the forward: any value is accepted.
IGNORED = frozenset(
    {
        "auto_mapping",
        "base_model_name_or_path",
        "corda_config",
        "eva_config",
        "exclude_modules",  # the weights file says which modules the adapter holds
        "inference_mode",
        "init_lora_weights",
        "kasa_config",
        "layers_pattern",
        "layers_to_transform",
        "loftq_config",  # initialisation only; the saved weights are what runs
        "lora_dropout",  # a no-op at inference
        "lora_ga_config",
        "megatron_config",
        "megatron_core",
        "peft_version",
        "qalora_group_size",  # read only with use_qalora, which is refused
        "rank_pattern",  # ranks are read from the weights' shapes
        "revision",
        "target_modules",  # checked against the weights' module names instead
        "task_type",
        "ensure_weight_tying",
    }
)
# Features that change the forward and are not implemented: each must be off (null/false/empty).
MUST_BE_OFF = (
    "use_dora",
    "lora_bias",
    "modules_to_save",
    "alpha_pattern",
    "fan_in_fan_out",
    "use_qalora",
    "use_bdlora",
    "alora_invocation_tokens",
    "trainable_token_indices",
    "target_parameters",
    "layer_replication",
    "arrow_config",
    "monteclora_config",
    "velora_config",
)
HANDLED = frozenset({"peft_type", "r", "lora_alpha", "use_rslora", "bias"})


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """What the forward needs from adapter_config.json."""

    rank: int  # the config's r; a module's own rank comes from its weights (rank_pattern)
    lora_alpha: float
    use_rslora: bool

    def scale(self, rank: int) -> float:
        """PEFT's scaling for a module of `rank`: alpha / r, or alpha / sqrt(r) (rsLoRA)."""
        return self.lora_alpha / (math.sqrt(rank) if self.use_rslora else rank)


def _is_off(value: Any) -> bool:
    return value is None or value is False or value in ({}, [], (), "")


def parse_adapter_config(data: dict, where: str = "adapter_config.json") -> AdapterConfig:
    """Validate a parsed adapter_config.json; ValueError naming field, value and what is allowed."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be a JSON object, got {type(data).__name__}")
    peft_type = data.get("peft_type")
    if peft_type != "LORA":
        raise ValueError(f"{where}: peft_type={peft_type!r} is not supported; allowed: 'LORA'")
    for key in MUST_BE_OFF:
        if not _is_off(data.get(key)):
            raise ValueError(
                f"{where}: {key}={data[key]!r} is not supported by tideserve's LoRA layers; "
                "allowed: null, false or empty"
            )
    bias = data.get("bias", "none")
    if bias != "none":
        raise ValueError(f"{where}: bias={bias!r} is not supported; allowed: 'none'")
    for key, value in data.items():
        if key in IGNORED or key in HANDLED or key in MUST_BE_OFF or _is_off(value):
            continue
        raise ValueError(
            f"{where}: {key}={value!r} is a PEFT option tideserve does not implement; "
            "allowed: null, false or empty"
        )
    rank = data.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{where}: r={rank!r} must be an integer >= 1")
    alpha = data.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise ValueError(f"{where}: lora_alpha={alpha!r} must be a number > 0")
    rslora = data.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise ValueError(f"{where}: use_rslora={rslora!r} must be true or false")
    return AdapterConfig(rank=rank, lora_alpha=float(alpha), use_rslora=rslora)


def read_adapter_config(path: Path) -> AdapterConfig:
    """Read and validate `path`/adapter_config.json."""
    file = path / "adapter_config.json"
    if not file.is_file():
        raise ValueError(f"adapter path {str(path)!r} has no adapter_config.json")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from e
    return parse_adapter_config(data, str(file))
