"""The paged KV cache tensor, and the view of it a model with several paging groups needs.

One tensor [layers_per_group, 2 (K, V), kv_heads, num_blocks + 1, block_size, head_dim]: a page
(block) holds one paging group's layers (capacity.memory.paging_layout); the extra block at
index num_blocks is NULL, where trimmed table entries point (serving/engine/kv_blocks.py).
With one group (every layer full, or every layer sliding) the tensor is the cache and layer l
is tensor[l]. With several, `GroupedKVCache` maps layer l to tensor[layer_slot[l]] and turns
group 0's block ids, which the runner plans with, into the layer's own group's ids.
"""

from __future__ import annotations

import torch

from capacity import memory
from serving.engine import host_memory
from serving.engine.kv_blocks import BlockPool


class GroupedKVCache:
    """Layer l -> its group's slot of the shared tensor; group 0 ids -> group ids."""

    def __init__(self, tensor: torch.Tensor, layout: memory.PagingLayout, pool: BlockPool):
        self.tensor = tensor
        self.layout = layout
        self.device = tensor.device
        self.dtype = tensor.dtype
        self.block_size = pool.block_size_tokens
        # zero-copy views of the pool's maps: the pool updates them in place as it allocates
        self._maps = [None] + [
            torch.frombuffer(pool.group_map(g), dtype=torch.int64)
            for g in range(1, layout.num_groups)
        ]

    def __getitem__(self, layer: int) -> torch.Tensor:
        return self.tensor[self.layout.layer_slot[layer]]

    def group_of(self, layer: int) -> int:
        return self.layout.layer_group[layer]

    def page_map(self, group: int) -> torch.Tensor:
        """Group 0 block id -> this group's block id, on the cache's device (copied per call)."""
        page_map = self._maps[group]
        assert page_map is not None, "group 0 needs no map"
        return page_map.to(self.device, non_blocking=True)

    def translate_blocks(self, group: int, blocks: torch.Tensor, page_map=None) -> torch.Tensor:
        page_map = self.page_map(group) if page_map is None else page_map
        return page_map[blocks]

    def translate_slots(self, group: int, slots: torch.Tensor, page_map=None) -> torch.Tensor:
        page_map = self.page_map(group) if page_map is None else page_map
        bs = self.block_size
        return page_map[slots // bs] * bs + slots % bs


def allocate(
    model_config, dtype: torch.dtype, device: torch.device, pool: BlockPool
) -> torch.Tensor | GroupedKVCache:
    """num_blocks x capacity.memory.block_bytes bytes, plus the NULL block."""
    shape = memory.KVShape.from_config(model_config)
    layout = memory.paging_layout(model_config)
    if layout.group_windows != pool.group_windows:
        raise ValueError(f"pool groups {pool.group_windows} != layout {layout.group_windows}")
    dims = (
        layout.layers_per_group,
        2,
        shape.num_kv_heads,
        pool.num_blocks + 1,
        pool.block_size_tokens,
        shape.head_dim,
    )
    if device.type == "cpu":  # read at scattered blocks every step: huge pages spare the TLB
        tensor = host_memory.zeros(dims, dtype)
    else:
        tensor = torch.zeros(dims, dtype=dtype, device=device)
    return tensor if layout.num_groups == 1 else GroupedKVCache(tensor, layout, pool)
