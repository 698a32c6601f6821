"""One thread per process for the engine's torch work (serving/engine/torch_thread.py): the
engine is built and stepped there, whichever thread calls, and a call made there runs inline."""

from __future__ import annotations

import asyncio
import threading

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams, torch_thread
from serving.tiny_models import tiny_model


def test_calls_from_any_thread_run_on_one_thread_and_raise_there():
    here = threading.get_ident()
    seen = {torch_thread.call(threading.get_ident) for _ in range(3)}
    other: list[int] = []
    t = threading.Thread(target=lambda: other.append(torch_thread.call(threading.get_ident)))
    t.start()
    t.join()
    assert len(seen) == 1 and seen == set(other) and here not in seen
    assert torch_thread.call(torch_thread.on_torch_thread) and not torch_thread.on_torch_thread()
    # a call made on the torch thread runs inline (a submit-and-wait there would deadlock)
    assert torch_thread.call(lambda: torch_thread.call(threading.get_ident)) in seen
    with pytest.raises(ValueError, match="bad"):
        torch_thread.call(int, "bad")


def test_engine_builds_and_steps_on_the_torch_thread_sync_and_async(monkeypatch):
    threads: set[int] = set()
    engine = LLMEngine(tiny_model("llama"), config=EngineConfig(num_kv_blocks=16))
    runner_run = engine.runner.run

    def spy(batch):
        threads.add(threading.get_ident())
        return runner_run(batch)

    monkeypatch.setattr(engine.runner, "run", spy)
    params = SamplingParams(max_tokens=4, temperature=0)
    (out,) = engine.generate([[3, 17, 42]], params)

    async def streamed() -> list[int]:
        return [t async for d in engine.stream([3, 17, 42], params) for t in d.token_ids]

    assert asyncio.run(streamed()) == out.token_ids
    assert threads == {torch_thread.call(threading.get_ident)}


# ----- core layout (decision 10) ------------------------------------------------------------
def test_auto_on_a_node_the_replica_holds_pins_the_model_and_leaves_one_core():
    two = torch_thread.core_layout("auto", num_cpus=2, node_cores=[0, 1])
    assert two == torch_thread.CoreLayout(threads=1, model_cores=(0,), other_cores=(1,))
    eight = torch_thread.core_layout("auto", num_cpus=8, node_cores=range(8))
    assert eight.threads == 7 and eight.model_cores == tuple(range(7))
    assert eight.other_cores == (7,) and eight.pinned


def test_auto_beside_other_replicas_takes_its_ray_cpus_unpinned():
    # Ray may place another replica on the same node and does not say which cores are whose
    shared = torch_thread.core_layout("auto", num_cpus=3.5, node_cores=range(8))
    assert shared == torch_thread.CoreLayout(threads=3) and not shared.pinned
    assert torch_thread.core_layout("auto", num_cpus=0, node_cores=range(8)).threads == 1
    assert torch_thread.core_layout("auto", num_cpus=1, node_cores=[0]).threads == 1


def test_a_number_of_threads_is_taken_as_given_unpinned():
    assert torch_thread.core_layout(2, num_cpus=2, node_cores=[0, 1]) == torch_thread.CoreLayout(2)


def test_node_cores_are_this_process_allowed_cores():
    import os

    assert set(torch_thread.node_cores()) == os.sched_getaffinity(0)
