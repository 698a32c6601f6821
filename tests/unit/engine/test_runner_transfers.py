"""Step metadata transfers and forward timing (serving/engine/runner.py), on CPU."""

from __future__ import annotations

import pytest
import torch

from serving.engine.runner import ForwardTimer, to_device


def test_to_device_on_cpu_makes_the_tensor_directly():
    t = to_device([3, 1, 2], torch.device("cpu"))
    assert t.dtype == torch.long and t.tolist() == [3, 1, 2]
    assert not t.is_pinned()  # pinning is for host->GPU copies only
    assert to_device([], torch.device("cpu")).numel() == 0


def test_forward_timer_on_cpu_is_wall_time():
    timer = ForwardTimer(torch.device("cpu"))
    timer.begin()
    elapsed = timer.stop()
    assert elapsed is not None and 0 <= elapsed < 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_device_on_cuda_goes_through_pinned_memory_and_times_with_events():
    dev = torch.device("cuda")
    t = to_device([5, 6], dev)
    assert t.device.type == "cuda" and t.tolist() == [5, 6]
    timer = ForwardTimer(dev)
    timer.begin()
    (torch.ones(256, 256, device=dev) @ torch.ones(256, 256, device=dev)).sum()
    assert timer.stop() is None
    assert timer.elapsed_s() >= 0
