"""LoraLinear: a projection plus a batched low-rank update gathered by each row's adapter slot.

    y = base(x) + (x @ A[slot]) @ B[slot]      A: [num_slots, in, r_max], B: [num_slots, r_max, out]

the scale folded into B, ranks below r_max padded with zeros (adding exact zeros). Rows of the
base model (slot -1) get no update. One LoraStep, set once per step for every wrapped layer (they
share one LoraState), says which packed rows use which slot, in two shapes:

  runs   contiguous rows of one adapter, at least RUN_MIN_TOKENS long (a prefill chunk): two
         plain matmuls on the slice;
  rows   every other adapter row (decodes, one row per sequence, in the runner's order), taken
         together (a slice when they are the first rows, as decodes are), then for each adapter
         present: (rows @ A[slot]) masked to that adapter's rows, @ B[slot], added.

Grouping vs gathering each row's A/B then bmm (Punica's shape): benchmarks/lora_multiplex.py
times both at 16 decode rows of SmolLM2-135M on this project's CPU (docs/engine.md, "Adapters"):
grouping wins with one adapter present (14 vs 33 ms a step) and loses from four (50 vs 35 ms;
204 vs 45 ms with 16), so the layer should pick by the step's adapter count; it does not yet.
Not a weight merge: the base weights are never touched, so
any mix of adapters and the base model runs in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A run of rows of one adapter at least this long is multiplied as a slice (see module doc).
RUN_MIN_TOKENS = 8


@dataclass(frozen=True, slots=True)
class LoraStep:
    runs: tuple[tuple[int, int, int], ...]  # (start row, end row, slot)
    rows: torch.Tensor | None  # [n] row indices of the grouped part (None: rows 0..n-1)
    num_rows: int  # n
    groups: tuple[tuple[int, torch.Tensor], ...]  # (slot, [n, 1] mask of its rows)


def plan_step(token_slots: list[int], device: torch.device) -> LoraStep | None:
    """The step's plan from each packed token's slot (-1: base model); None when no row has an
    adapter (the layers then cost one attribute read)."""
    runs: list[tuple[int, int, int]] = []
    rows: list[int] = []
    row_slots: list[int] = []
    start = 0
    n = len(token_slots)
    while start < n:
        slot = token_slots[start]
        end = start + 1
        while end < n and token_slots[end] == slot:
            end += 1
        if slot >= 0:
            if end - start >= RUN_MIN_TOKENS:
                runs.append((start, end, slot))
            else:
                rows.extend(range(start, end))
                row_slots.extend([slot] * (end - start))
        start = end
    if not runs and not rows:
        return None
    groups: list[tuple[int, torch.Tensor]] = []
    if rows:
        slots_t = torch.tensor(row_slots, dtype=torch.long)
        for slot in sorted(set(row_slots)):
            groups.append((slot, (slots_t == slot).unsqueeze(1).to(device)))
    prefix = rows == list(range(len(rows)))
    index = None if prefix else torch.tensor(rows, dtype=torch.long).to(device)
    return LoraStep(tuple(runs), index, len(rows), tuple(groups))


class LoraState:
    """The one plan every LoraLinear of a model reads; the manager sets it before each forward."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step: LoraStep | None = None


class LoraLinear(torch.nn.Module):
    def __init__(
        self,
        base: torch.nn.Module,
        in_features: int,
        out_features: int,
        num_slots: int,
        max_rank: int,
        state: LoraState,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.base = base
        self.in_features = in_features
        self.out_features = out_features
        self.state = state
        # Buffers: never trained, and `model.parameters()` keeps naming the base weights' dtype.
        a = torch.zeros(num_slots, in_features, max_rank, dtype=dtype, device=device)
        b = torch.zeros(num_slots, max_rank, out_features, dtype=dtype, device=device)
        self.register_buffer("lora_a", a, persistent=False)
        self.register_buffer("lora_b", b, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """The base projection's weight, for code that reads it (dtype probes, tied checks)."""
        return self.base.weight

    def set_slot(self, slot: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Write one adapter's [in, r] and [r, out] into `slot` (zeros where None or past r)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        if a is not None and b is not None:
            r = a.shape[1]
            self.lora_a[slot, :, :r].copy_(a)
            self.lora_b[slot, :r, :].copy_(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.state.step
        if step is None:
            return y
        flat_x = x.reshape(-1, self.in_features)
        flat_y = y.view(-1, self.out_features)
        for start, end, slot in step.runs:
            h = flat_x[start:end] @ self.lora_a[slot]
            flat_y[start:end].addmm_(h, self.lora_b[slot])
        if not step.groups:
            return y
        n = step.num_rows
        xs = flat_x[:n] if step.rows is None else flat_x.index_select(0, step.rows)
        ys = flat_y[:n] if step.rows is None else torch.zeros_like(flat_y[:n])
        for slot, mask in step.groups:
            h = (xs @ self.lora_a[slot]).mul_(mask)  # other adapters' rows get zero
            ys.addmm_(h, self.lora_b[slot])
        if step.rows is not None:
            flat_y.index_add_(0, step.rows, ys)
        return y

    def extra_repr(self) -> str:
        slots, _, rank = self.lora_a.shape
        return f"in={self.in_features}, out={self.out_features}, slots={slots}, max_rank={rank}"
