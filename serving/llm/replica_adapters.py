"""A replica's LoRA registrations: which (name, path, load_id) its engine holds, and the lazy
registration of an adapter the ingress loaded after this replica started (or loaded again under
the same name from another path).

    plan(registered, ref)   "ready" | "register" | "replace"  (pure)
    ensure(ref)             registers what plan says, one registration per name at a time

Registration reads the adapter from disk and checks it against the base model; it runs on the
engine's torch thread between steps, awaited from a worker thread so the replica's event loop
keeps streaming meanwhile. A bad adapter raises ValueError saying why (the request gets a 400);
an adapter whose old registration is still used by running requests raises AdapterBusy (the
request is refused: retry later).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Literal

from serving.llm.messages import DECLARED, AdapterRef

Plan = Literal["ready", "register", "replace"]


class AdapterBusy(Exception):
    """The name's previous registration is in use by queued or running requests."""


def plan(registered: Mapping[str, AdapterRef], ref: AdapterRef) -> Plan:
    held = registered.get(ref.name)
    if held is None:
        return "register"
    return "ready" if held == ref else "replace"


class ReplicaAdapters:
    def __init__(self, engine, declared: Mapping[str, str]) -> None:
        """Registers the declared adapters (model.adapters) now: a bad one fails the replica's
        start, naming it, before it takes traffic."""
        self.engine = engine
        self.registered: dict[str, AdapterRef] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        for name, path in declared.items():
            try:
                engine.add_adapter(name, path)
            except ValueError as err:
                raise ValueError(f"model.adapters.{name}={path!r}: {err}") from None
            self.registered[name] = AdapterRef(name, path, DECLARED)

    async def ensure(self, ref: AdapterRef) -> None:
        if plan(self.registered, ref) == "ready":
            return
        lock = self._locks.setdefault(ref.name, asyncio.Lock())
        async with lock:  # concurrent first requests of one adapter register it once
            step = plan(self.registered, ref)
            if step == "ready":
                return
            if step == "replace":
                try:
                    await asyncio.to_thread(self.engine.remove_adapter, ref.name)
                except ValueError as err:
                    raise AdapterBusy(str(err)) from None
                del self.registered[ref.name]
            await asyncio.to_thread(self.engine.add_adapter, ref.name, ref.path)
            self.registered[ref.name] = ref
