"""Random-weight LoRA adapters written by PEFT itself, for tests and benchmarks.

PEFT (a dev dependency) builds and saves them exactly as a fine-tune would be saved
(`save_pretrained`: adapter_config.json + adapter_model.safetensors). `init_lora_weights=False`
draws B at random too (PEFT's default zeros it), so an adapter changes the model's outputs.
"""

from __future__ import annotations

import os
import pathlib

import torch

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_random_lora(
    base_model: torch.nn.Module,
    path: str | os.PathLike,
    rank: int = 8,
    lora_alpha: float = 16,
    target_modules: tuple[str, ...] = ALL_PROJECTIONS,
    seed: int = 0,
    use_rslora: bool = False,
    b_std: float | None = None,
) -> pathlib.Path:
    """Save a random LoRA of `base_model` to `path`. The model is wrapped by PEFT in place, so
    pass a copy you will not use again. `b_std` rescales B to that standard deviation (PEFT's
    random B can swamp a small model's own weights)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=lora_alpha,
        target_modules=list(target_modules),
        init_lora_weights=False,
        use_rslora=use_rslora,
    )
    peft_model = get_peft_model(base_model, config)
    if b_std is not None:
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, b_std)
    path = pathlib.Path(path)
    peft_model.save_pretrained(path)
    return path
