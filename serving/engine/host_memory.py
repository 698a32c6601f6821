"""Large CPU tensors on transparent huge pages (2 MiB), where the kernel offers them.

Why: the paged KV cache is gigabytes, and a decode step reads each running sequence's blocks at
scattered places in it, per layer; with 4 KiB pages nearly every block read misses the TLB. On
this project's 2-vCPU AMD EPYC VM (THP in `madvise` mode, the common default) the per-layer
gather of 16 sequences' blocks took 1.0-1.7 ms on 4 KiB pages in five of six profiles (0.2 ms
in the first) and 0.3-0.4 ms on huge pages (benchmarks/engine_embedded.py measures the engine
end to end). PyTorch's own allocator does
the same for every allocation of 2 MiB or more when THP_MEM_ALLOC_ENABLE=1 is set before it
starts; this module asks for it only where the engine knows the access pattern needs it.

The memory is an anonymous private mapping advised MADV_HUGEPAGE; it comes zero-filled and is
committed page by page as it is first written, like torch.zeros' calloc. Where the platform has
no MADV_HUGEPAGE (not Linux), the tensor is plain torch.zeros.
"""

from __future__ import annotations

import logging
import math
import mmap

import torch

log = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 * 2**20


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor of `shape`; on huge pages when it spans at least one and THP exists."""
    nbytes = math.prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE_BYTES or advice is None:
        return torch.zeros(shape, dtype=dtype)
    # One huge page of slack so the data can start on a 2 MiB boundary: a huge page maps only an
    # aligned 2 MiB range, and mmap returns 4 KiB alignment.
    buf = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advice)
    except OSError as err:  # THP compiled out or disabled: plain pages, same tensor
        log.info("madvise(MADV_HUGEPAGE) refused (%s): %d bytes on normal pages", err, nbytes)
    flat = torch.frombuffer(buf, dtype=torch.uint8)  # holds the mapping alive
    offset = -flat.data_ptr() % HUGE_PAGE_BYTES
    return flat[offset : offset + nbytes].view(dtype).view(shape)
