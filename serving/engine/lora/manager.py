"""LoraManager: an engine's adapters. Wraps the model's projections once, keeps the registered
adapters (validated, on the host), moves them in and out of the bounded slot pool, pins a slot
for each running request and sets each step's row -> slot plan.

Lifecycle of one request of adapter `x`:
  add_request   `x` must be registered (else ValueError naming it and the known ones)
  admission     can_pin: x holds a slot, or one is free, or an unpinned one can be evicted (LRU);
                pin: load x into that slot if needed, count the request as a user of it
  each step     begin_step: the packed rows of the request read slot_of[x]
  finish/abort/preemption  unpin (the slot stays loaded until LRU evicts it)
Registration and removal run on the torch thread (LLMEngine hops there), between steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import torch

from capacity import adapters as capacity_adapters
from serving.engine.lora.adapter import LoraAdapter, load_adapter
from serving.engine.lora.adapter_config import TARGET_MODULES
from serving.engine.lora.layer import LoraLinear, LoraState, SharedShrink, plan_step
from serving.engine.lora.slots import AllPinned, Load, SlotPool
from serving.engine.sequence import Sequence


def _features(module: torch.nn.Module) -> tuple[int, int]:
    return int(module.in_features), int(module.out_features)


# Projections that read one input tensor in the decoder layers of the supported models (one
# module calls them on the same hidden state): their A stacks are one SharedShrink.
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def wrap_projections(
    model: torch.nn.Module, num_slots: int, max_rank: int, state: LoraState
) -> tuple[dict[str, LoraLinear], list[SharedShrink]]:
    """Replace every decoder layer's q/k/v/o and gate/up/down projection by a LoraLinear, and
    give q/k/v (and gate/up) of one parent module one SharedShrink.

    Refuses (naming it) a model whose layers lack one of them (fused qkv_proj, experts): the slot
    memory is sized by capacity.adapters.lora_slot_bytes for exactly these seven."""
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    found: dict[str, tuple[torch.nn.Module, str, torch.nn.Module]] = {}
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            if name in TARGET_MODULES and hasattr(child, "in_features"):
                full = f"{parent_name}.{name}" if parent_name else name
                found[full] = (parent, name, child)
    num_layers = model.config.get_text_config().num_hidden_layers
    for leaf in TARGET_MODULES:
        count = sum(1 for full in found if full.rsplit(".", 1)[-1] == leaf)
        if count != num_layers:
            raise ValueError(
                f"LoRA adapters need {list(TARGET_MODULES)} in each of the model's {num_layers} "
                f"layers; {type(model).__name__} has {count} {leaf!r} modules. Set "
                "EngineConfig.max_loras=0 to serve it without adapters"
            )
    shared: dict[str, tuple[SharedShrink, int]] = {}
    groups: list[SharedShrink] = []
    for full, (_parent, name, child) in found.items():
        prefix = full[: -len(name)]
        for members in SHARED_INPUT:
            fulls = [prefix + m for m in members]
            if name != members[0] or not all(f in found for f in fulls):
                continue
            if len({_features(found[f][2])[0] for f in fulls}) != 1:
                continue  # inputs of different widths cannot be one tensor
            group = SharedShrink(
                len(members), num_slots, _features(child)[0], max_rank, dtype, device
            )
            groups.append(group)
            shared.update({f: (group, k) for k, f in enumerate(fulls)})
    layers: dict[str, LoraLinear] = {}
    for full, (parent, name, child) in found.items():
        in_f, out_f = _features(child)
        layer = LoraLinear(
            child, in_f, out_f, num_slots, max_rank, state, dtype, device, shared.get(full)
        )
        setattr(parent, name, layer)
        layers[full] = layer
    return layers, groups


class LoraManager:
    def __init__(self, model: torch.nn.Module, max_loras: int, max_lora_rank: int) -> None:
        self.max_lora_rank = max_lora_rank
        self.state = LoraState()
        self.layers, self._shared = wrap_projections(model, max_loras, max_lora_rank, self.state)
        self.shapes = {name: (m.in_features, m.out_features) for name, m in self.layers.items()}
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.slot_bytes = sum(
            layer.lora_a.numel() * layer.lora_a.element_size()
            + layer.lora_b.numel() * layer.lora_b.element_size()
            for layer in self.layers.values()
        )
        expected = capacity_adapters.lora_slot_bytes(
            model.config, self.dtype, max_loras, max_lora_rank
        )
        assert self.slot_bytes == expected, "slot stacks differ from capacity.adapters' formula"
        self.pool = SlotPool(max_loras)
        self.adapters: dict[str, LoraAdapter] = {}
        self._pinned: dict[str, str] = {}  # request id -> adapter it pins
        # seconds spent writing adapters into slots (the step waits for them), ever: the cost
        # of slot misses the autoscaler's capacity model charges to each request
        self.load_s_total = 0.0

    # ----- registration (torch thread, between steps) ------------------------------------
    def add(self, name: str, path: str | Path) -> LoraAdapter:
        """Validate and register an adapter (host copy); ValueError naming what is wrong."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"adapter name={name!r} must be a non-empty string")
        adapter = load_adapter(name, path, self.shapes, self.max_lora_rank, self.dtype)
        if name in self.pool.slot_of:  # re-registered: the slot's weights must follow
            if self.pool.pins.get(name):
                raise ValueError(f"adapter {name!r} is in use by running requests; retry later")
            self.pool.remove(name)
        self.adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(f"adapter {name!r} is not loaded; loaded: {sorted(self.adapters)}")
        if not self.pool.remove(name):
            raise ValueError(f"adapter {name!r} is in use by running requests; retry later")
        del self.adapters[name]

    def check_known(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(
                f"adapter={name!r} is not loaded on this engine; loaded: {sorted(self.adapters)}"
            )

    # ----- admission (the ledger's gate) ----------------------------------------------
    def can_pin(self, seq: Sequence) -> bool:
        return seq.adapter is None or not isinstance(self.pool.plan(seq.adapter), AllPinned)

    def pin(self, seq: Sequence) -> None:
        """Commit what can_pin approved: load into a slot if needed, then count the user."""
        name = seq.adapter
        if name is None:
            return
        plan = self.pool.plan(name)
        assert not isinstance(plan, AllPinned), "can_pin approved a full pool"
        slot = self.pool.commit(name, plan)
        if isinstance(plan, Load):
            start_s = time.perf_counter()
            self._write_slot(slot, self.adapters[name])
            self.load_s_total += time.perf_counter() - start_s
        self.pool.pin(name)
        self._pinned[seq.request_id] = name

    def unpin(self, seq: Sequence) -> None:
        name = self._pinned.pop(seq.request_id, None)
        if name is not None:
            self.pool.unpin(name)

    def _write_slot(self, slot: int, adapter: LoraAdapter) -> None:
        for module, layer in self.layers.items():
            w = adapter.modules.get(module)
            layer.set_slot(slot, None if w is None else w.a, None if w is None else w.b)

    # ----- the step ---------------------------------------------------------------------
    def begin_step(self, rows: Iterable[tuple[Sequence, int]]) -> None:
        """Set the plan for a forward over `rows`: (sequence, tokens it packs), in packed order."""
        slot_of = self.pool.slot_of
        token_slots: list[int] = []
        for seq, n in rows:
            slot = -1 if seq.adapter is None else slot_of[seq.adapter]
            token_slots.extend([slot] * n)
        self.state.step = plan_step(token_slots, self.state)

    def end_step(self) -> None:
        self.state.step = None
        for group in self._shared:
            group.clear()  # drop the step's inputs the shrink cache holds

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        counts: dict[str, int] = {}
        for name in self._pinned.values():
            counts[name] = counts.get(name, 0) + 1
        assert counts == self.pool.pins, "pins out of step with the requests that hold them"
