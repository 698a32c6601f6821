"""The engine's adapter calls, apart from the request path: which manager serves them, and
removal only while no queued or running request uses the adapter."""

from __future__ import annotations

from collections.abc import Iterable

from serving.engine.ledger import KVLedger
from serving.engine.lora.manager import LoraManager
from serving.engine.sequence import Sequence


def require(adapters: LoraManager | None) -> LoraManager:
    if adapters is None:
        raise ValueError("this engine serves no adapters; set EngineConfig.max_loras >= 1")
    return adapters


def check_adapter(adapters: LoraManager | None, adapter: str | None) -> None:
    """A request's `adapter` names one this engine has registered (None: the base model)."""
    if adapter is None:
        return
    if adapters is None:
        raise ValueError(
            f"adapter={adapter!r}: this engine serves no adapters (EngineConfig.max_loras=0)"
        )
    adapters.check_known(adapter)


def remove_unused(
    adapters: LoraManager | None, ledger: KVLedger, live: Iterable[Sequence], name: str
) -> None:
    """Forget adapter `name` unless a live request uses it; its cached KV blocks never match
    again (KVLedger.forget_adapter)."""
    manager = require(adapters)
    if any(s.adapter == name for s in live):
        raise ValueError(f"adapter {name!r} is in use by queued or running requests")
    manager.remove(name)
    ledger.forget_adapter(name)
