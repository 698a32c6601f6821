"""Large CPU tensors on huge pages (serving/engine/host_memory.py): zeros of the asked shape
and dtype, writable, starting on a 2 MiB boundary, and plain torch.zeros when small."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from serving.engine import host_memory
from serving.engine.host_memory import HUGE_PAGE_BYTES

needs_thp = pytest.mark.skipif(
    not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this platform"
)


@needs_thp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_tensor_is_zero_aligned_and_writable(dtype):
    shape = (3, 2, 5, 4097, 64)  # not a multiple of the huge page
    t = host_memory.zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE_BYTES == 0
    assert not t.any()
    t[-1, -1, -1, -1, -1] = 7  # the last element is inside the mapping
    t[0].fill_(1)
    assert t.count_nonzero().item() == 1 + t[0].numel() and t[-1, -1, -1, -1, -1].item() == 7


@needs_thp
def test_views_outlive_the_call_that_made_them():
    row = host_memory.zeros((1024, 1024), torch.float32)[5]  # 4 MiB; keep only a view
    gc.collect()
    row += 2
    assert torch.equal(row, torch.full((1024,), 2.0))


def test_small_tensor_is_plain_zeros():
    t = host_memory.zeros((4, 8), torch.float16)
    assert t.shape == (4, 8) and t.dtype == torch.float16 and not t.any()
