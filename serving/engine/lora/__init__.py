"""LoRA adapters in the engine: many fine-tunes of one base model batched in one forward.

adapter_config.py  adapter_config.json validated (refuses by name what is not implemented)
adapter.py         adapter_model.safetensors read and checked against the base model
layer.py           LoraLinear: base projection + per-row low-rank update gathered by slot
slots.py           the bounded slot pool: LRU, pins, check-then-commit
manager.py         an engine's adapters: registration, slot loads, the per-step plan
ledger.py          admission gated on a slot as well as KV
"""
