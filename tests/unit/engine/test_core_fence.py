"""The core fence: a pinned replica moves the rest of its Ray node (the raylet's process tree)
off its model cores. `descendants` is pure; the fence itself runs on real processes: a stand-in
raylet with a worker and the replica as children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from serving.engine.core_fence import descendants


def test_descendants_walks_the_whole_tree_below_the_root_only():
    parent_of = {2: 1, 3: 2, 4: 2, 5: 3, 6: 1, 7: 6}
    assert descendants(parent_of, 2) == {2, 3, 4, 5}
    assert descendants(parent_of, 5) == {5}
    assert descendants({}, 9) == {9}


def test_descendants_survives_a_cycle():
    assert descendants({1: 2, 2: 1}, 1) == {1, 2}


RAYLET = textwrap.dedent(
    """
    import json, os, subprocess, sys
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    replica = subprocess.run(
        [sys.executable, "-c",
         "from serving.engine.core_fence import fence_node; print(fence_node([0], [1]))"],
        capture_output=True, text=True, check=True,
    )
    print(json.dumps({
        "moved": int(replica.stdout.split()[-1]),
        "raylet": sorted(os.sched_getaffinity(0)),
        "worker": sorted(os.sched_getaffinity(worker.pid)),
    }))
    worker.kill()
    """
)


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or not {0, 1} <= os.sched_getaffinity(0),
    reason="needs Linux and cores 0 and 1",
)
def test_the_replica_moves_its_raylet_and_sibling_workers_off_the_model_core():
    out = subprocess.run(
        [sys.executable, "-c", RAYLET], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["raylet"] == [1] and got["worker"] == [1], got
    assert got["moved"] >= 2, got  # at least the raylet's and the worker's main threads
    assert 0 in os.sched_getaffinity(0)  # the test process, outside the tree, keeps its cores
