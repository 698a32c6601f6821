"""A replica's lazy adapter registration (serving/llm/replica_adapters.py): declared adapters
at start, a loaded one on its first request, once per (name, path, load_id), replaced when the
ingress reloaded the name; a fake engine records the calls (no model)."""

from __future__ import annotations

import asyncio

import pytest

from serving.llm.messages import DECLARED, AdapterRef
from serving.llm.replica_adapters import AdapterBusy, ReplicaAdapters, plan


class FakeEngine:
    def __init__(self, bad_paths=(), busy=()) -> None:
        self.calls: list[tuple] = []
        self.bad_paths, self.busy = set(bad_paths), set(busy)

    def add_adapter(self, name, path):
        self.calls.append(("add", name, path))
        if path in self.bad_paths:
            raise ValueError(f"adapter path {path!r} has no adapter_config.json")

    def remove_adapter(self, name):
        self.calls.append(("remove", name))
        if name in self.busy:
            raise ValueError(f"adapter {name!r} is in use by queued or running requests")


def test_plan_says_what_a_request_of_the_adapter_needs():
    ref = AdapterRef("x", "/x", "load-1")
    assert plan({}, ref) == "register"
    assert plan({"x": ref}, ref) == "ready"
    assert plan({"x": AdapterRef("x", "/x", "load-2")}, ref) == "replace"


def test_declared_adapters_register_at_start_and_a_bad_one_fails_it_naming_the_key():
    engine = FakeEngine()
    adapters = ReplicaAdapters(engine, {"a": "/a", "b": "/b"})
    assert engine.calls == [("add", "a", "/a"), ("add", "b", "/b")]
    assert adapters.registered["a"] == AdapterRef("a", "/a", DECLARED)
    with pytest.raises(ValueError, match=r"model.adapters.b='/b': adapter path"):
        ReplicaAdapters(FakeEngine(bad_paths={"/b"}), {"a": "/a", "b": "/b"})


def test_concurrent_first_requests_register_a_loaded_adapter_once():
    engine = FakeEngine()
    adapters = ReplicaAdapters(engine, {})
    ref = AdapterRef("x", "/x", "load-1")

    async def many():
        await asyncio.gather(*(adapters.ensure(ref) for _ in range(5)))

    asyncio.run(many())
    assert engine.calls == [("add", "x", "/x")]


def test_a_reloaded_name_replaces_the_old_registration():
    engine = FakeEngine()
    adapters = ReplicaAdapters(engine, {"x": "/old"})
    asyncio.run(adapters.ensure(AdapterRef("x", "/new", "load-7")))
    assert engine.calls[1:] == [("remove", "x"), ("add", "x", "/new")]
    assert adapters.registered["x"].path == "/new"


def test_a_replacement_while_old_requests_run_is_busy_and_a_bad_path_raises():
    adapters = ReplicaAdapters(FakeEngine(busy={"x"}, bad_paths={"/bad"}), {"x": "/old"})
    with pytest.raises(AdapterBusy, match="in use"):
        asyncio.run(adapters.ensure(AdapterRef("x", "/new", "load-1")))
    assert adapters.registered["x"].path == "/old"
    with pytest.raises(ValueError, match=r"no adapter_config\.json"):
        asyncio.run(adapters.ensure(AdapterRef("y", "/bad", "load-2")))
    assert "y" not in adapters.registered
