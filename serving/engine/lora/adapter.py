"""Load a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) into
per-module (A, B) pairs shaped for the engine's slot stacks, checked against the base model.

PEFT saves `base_model.model.<module>.lora_A.weight` of shape [r, in] and `...lora_B.weight` of
shape [out, r]; the forward it defines is  y = base(x) + scale * (x @ A^T) @ B^T.  Here A is kept
as [in, r] and B as [r, out] with the scale folded in, the layout layer.py multiplies by.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from serving.engine.lora.adapter_config import TARGET_MODULES, AdapterConfig, read_adapter_config

PREFIX = "base_model.model."
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True, slots=True)
class LoraWeights:
    """One module's update: a [in, r] and b [r, out], scale already in b."""

    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return self.a.shape[1]


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    name: str
    path: str
    config: AdapterConfig
    modules: dict[str, LoraWeights]  # by the model's module name: "model.layers.0.mlp.up_proj"

    @property
    def max_rank(self) -> int:
        return max(w.rank for w in self.modules.values())

    @property
    def num_bytes(self) -> int:
        return sum(
            w.a.numel() * w.a.element_size() + w.b.numel() * w.b.element_size()
            for w in self.modules.values()
        )


def _split_key(key: str, file: str) -> tuple[str, str]:
    """('model.layers.0.self_attn.q_proj', 'A') from a PEFT weight name; ValueError otherwise."""
    if not key.startswith(PREFIX):
        raise ValueError(f"{file}: weight {key!r} does not start with {PREFIX!r} (not a PEFT LoRA)")
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if key.endswith(suffix):
            return key[len(PREFIX) : -len(suffix)], part
    raise ValueError(
        f"{file}: weight {key!r} is not a lora_A/lora_B weight; tideserve loads LoRA on "
        f"{list(TARGET_MODULES)} only (no embeddings, biases or modules_to_save)"
    )


def load_adapter(
    name: str,
    path: str | Path,
    shapes: dict[str, tuple[int, int]],
    max_rank: int,
    dtype: torch.dtype,
) -> LoraAdapter:
    """Read and check an adapter against the model's targetable modules.

    `shapes` maps each wrapped module name to its (in_features, out_features); a module the
    adapter names that is not there, a shape that differs, or a rank above `max_rank` is a
    ValueError naming it."""
    from safetensors.torch import load_file

    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(f"adapter {name!r}: path {str(root)!r} is not a directory")
    config = read_adapter_config(root)
    file = root / WEIGHTS_FILE
    if not file.is_file():
        raise ValueError(f"adapter {name!r}: {str(root)!r} has no {WEIGHTS_FILE}")
    raw = load_file(str(file))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in raw.items():
        module, part = _split_key(key, str(file))
        pairs.setdefault(module, {})[part] = tensor
    if not pairs:
        raise ValueError(f"adapter {name!r}: {file} holds no LoRA weights")
    modules = {
        m: _check_pair(name, m, pair, shapes, max_rank, config, dtype) for m, pair in pairs.items()
    }
    return LoraAdapter(name, str(root), config, modules)


def _check_pair(
    name: str,
    module: str,
    pair: dict[str, torch.Tensor],
    shapes: dict[str, tuple[int, int]],
    max_rank: int,
    config: AdapterConfig,
    dtype: torch.dtype,
) -> LoraWeights:
    if module not in shapes:
        leaf = module.rsplit(".", 1)[-1]
        raise ValueError(
            f"adapter {name!r}: module {module!r} is not a LoRA target of this model; "
            f"allowed: {list(TARGET_MODULES)} of its decoder layers (got {leaf!r})"
        )
    if set(pair) != {"A", "B"}:
        raise ValueError(f"adapter {name!r}: module {module!r} lacks lora_A or lora_B")
    a, b = pair["A"], pair["B"]
    in_f, out_f = shapes[module]
    rank = a.shape[0]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_f or b.shape != (out_f, rank):
        raise ValueError(
            f"adapter {name!r}: {module} has lora_A {tuple(a.shape)} and lora_B "
            f"{tuple(b.shape)}; this model needs [r, {in_f}] and [{out_f}, r]: "
            "was it trained on another base model?"
        )
    if rank > max_rank:
        raise ValueError(
            f"adapter {name!r}: rank {rank} of {module} exceeds EngineConfig.max_lora_rank="
            f"{max_rank}; raise max_lora_rank to at least {rank}"
        )
    scale = config.scale(rank)
    # A^T and scale * B^T in float32 first, then the model's dtype (one rounding, as PEFT's
    # bf16 forward rounds once per matmul anyway).
    a_t = a.to(torch.float32).t().contiguous().to(dtype)
    b_t = (b.to(torch.float32).t() * scale).contiguous().to(dtype)
    return LoraWeights(a_t, b_t)
