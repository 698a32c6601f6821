"""LoraLinear: a projection plus a batched low-rank update gathered by each row's adapter slot.

    y = base(x) + (x @ A[slot]) @ B[slot]      A: [num_slots, in, r_max], B: [num_slots, r_max, out]

the scale (alpha / r, per adapter) folded into B, ranks below r_max padded with zeros (adding
exact zeros). Rows of the base model (slot -1) get no update, and a step without adapter rows
costs one attribute read per layer. One LoraStep, planned once per step for every wrapped layer
(they share one LoraState), says which packed rows use which slot, in two shapes:

  runs   contiguous rows of one adapter, at least RUN_MIN_TOKENS long (a prefill chunk): two
         plain matmuls on the slice;
  rows   every other adapter row (decodes, one row per sequence, in the runner's order), taken
         together (a slice when they are the first rows, as decodes are) through two
         embedding-bag sums that read each row's own slot in place:

           shrink  h[b]  = sum_i  x[b, i] * A_flat[slot_b * in + i]      A_flat: [slots*in, r_max]
           expand  dy[b] = sum_j  h[b, j] * B_flat[slot_b * r_max + j]   B_flat: [slots*r_max, out]

         i.e. x[b] @ A[slot_b] and h[b] @ B[slot_b], two kernel calls per projection whatever the
         number of adapters in the step, no weight copied (the row indices are built once per
         step into LoraState's buffers, not per layer). Projections that read one input
         (q/k/v, gate/up) share one A stack and one shrink sum (SharedShrink).

Why embedding bags (benchmarks/lora_multiplex.py times the ways at 16 decode rows of SmolLM2-135M,
docs/engine.md "Adapters"): grouping rows by adapter costs a pair of matmuls per adapter present,
so it grows with the mix; gathering each row's A and B then bmm copies 16 rows' weights every
step; multiplying by every slot's A at once (shrink-all) does slots x the useful flops. The bag
sums do the useful flops only, reading each adapter present once per projection.
Not a weight merge: the base weights are never touched, so any mix of adapters and the base model
runs in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A run of rows of one adapter at least this long is multiplied as a slice (see module doc).
RUN_MIN_TOKENS = 8
_SUM = 0  # torch.embedding_bag's mode: sum (the only mode taking per-row weights)


@dataclass(frozen=True, slots=True)
class LoraStep:
    """One step's plan. Its index tensors are views of LoraState's buffers: valid until the
    next plan_step on the same state."""

    runs: tuple[tuple[int, int, int], ...]  # (start row, end row, slot)
    rows: torch.Tensor | None  # [n] row indices of the bag part (None: rows 0..n-1)
    num_rows: int  # n (0: no bag part)
    shrink: dict[int, tuple[torch.Tensor, torch.Tensor]]  # in -> ([n*in] A_flat rows, [n] offsets)
    expand: tuple[torch.Tensor, torch.Tensor] | None  # ([n*r_max] B_flat rows, [n] offsets)


class _BagIndex:
    """Bag indices for one width w (an in_features, or r_max): row b's bag is
    slot_b * w + (0 .. w-1), the rows of its slot's block in a flat [slots*w, d] stack. Written
    into a buffer kept across steps."""

    __slots__ = ("_arange", "_index", "_offsets", "width")

    def __init__(self, width: int, capacity_rows: int, device: torch.device) -> None:
        self.width = width
        self._arange = torch.arange(width, dtype=torch.long, device=device)
        self._index = torch.empty(capacity_rows * width, dtype=torch.long, device=device)
        self._offsets = torch.arange(
            0, capacity_rows * width, width, dtype=torch.long, device=device
        )

    def fill(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices [n*w], offsets [n]) for the [n, 1] row slots; n <= capacity_rows."""
        num = slots.shape[0]
        index = self._index[: num * self.width]
        torch.add(self._arange, slots, alpha=self.width, out=index.view(num, self.width))
        return index, self._offsets[:num]


class LoraState:
    """The one plan every LoraLinear of a model reads; the manager sets it before each forward.
    Holds the bag-index buffers the plans are written into, regrown only when a step has more
    bag rows than any before (a steady decode batch allocates none)."""

    __slots__ = ("_capacity_rows", "_expand", "_shrink", "_widths", "device", "max_rank", "step")

    def __init__(self) -> None:
        self.step: LoraStep | None = None
        self.max_rank = 0
        self.device = torch.device("cpu")
        self._widths: set[int] = set()
        self._shrink: dict[int, _BagIndex] = {}
        self._expand: _BagIndex | None = None
        self._capacity_rows = 0

    def register(self, in_features: int, max_rank: int, device: torch.device) -> None:
        """A LoraLinear of this width reads the plans (called by its constructor)."""
        if self._widths and (max_rank != self.max_rank or device != self.device):
            raise ValueError(
                f"LoraLinear max_rank={max_rank} on {device}: the layers sharing a LoraState "
                f"have max_rank={self.max_rank} on {self.device}"
            )
        self.max_rank, self.device = max_rank, device
        self._widths.add(in_features)
        self._capacity_rows = 0  # the next plan builds the buffers for every width

    def bag_indices(
        self, slots: torch.Tensor
    ) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
        """Shrink indices per in_features and the expand indices, for [n, 1] row slots."""
        num = slots.shape[0]
        if num > self._capacity_rows:
            cap = max(num, 2 * self._capacity_rows, 16)
            self._shrink = {w: _BagIndex(w, cap, self.device) for w in sorted(self._widths)}
            self._expand = _BagIndex(self.max_rank, cap, self.device)
            self._capacity_rows = cap
        assert self._expand is not None, "no LoraLinear registered with this state"
        shrink = {w: bag.fill(slots) for w, bag in self._shrink.items()}
        return shrink, self._expand.fill(slots)


def plan_step(token_slots: list[int], state: LoraState) -> LoraStep | None:
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
    if not rows:
        return LoraStep(tuple(runs), None, 0, {}, None)
    num = len(rows)
    slots = torch.tensor(row_slots, dtype=torch.long).to(state.device).unsqueeze(1)
    shrink, expand = state.bag_indices(slots)
    prefix = rows == list(range(num))
    index = None if prefix else torch.tensor(rows, dtype=torch.long).to(state.device)
    return LoraStep(tuple(runs), index, num, shrink, expand)


class SharedShrink:
    """One A stack for projections that read the same input tensor (q/k/v; gate/up):
    [num_slots, in, members*r_max], member k's A in columns k*r_max .. (k+1)*r_max. The first
    member called in a step computes every member's h with one bag sum (rows of members*r_max
    floats: a third of the lookups and kernel calls of three separate sums for q/k/v) and the
    others take their columns. Keyed by the input tensor itself and the step, so a member
    called on another input (a model that does not share it) computes its own: slower, never
    wrong."""

    def __init__(
        self,
        num_members: int,
        num_slots: int,
        in_features: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.max_rank = max_rank
        self.a = torch.zeros(
            num_slots, in_features, num_members * max_rank, dtype=dtype, device=device
        )
        self.a_flat = self.a.view(-1, num_members * max_rank)
        self._key: tuple[torch.Tensor, LoraStep] | None = None
        self._h: torch.Tensor | None = None

    def member_a(self, member: int) -> torch.Tensor:
        """Member k's [num_slots, in, r_max] view (writes land in the shared stack)."""
        return self.a[:, :, member * self.max_rank : (member + 1) * self.max_rank]

    def h(self, member: int, x: torch.Tensor, step: LoraStep, xs: torch.Tensor) -> torch.Tensor:
        """[n, r_max] h of member k for the bag rows xs of input x (contiguous)."""
        key = self._key
        if key is None or key[0] is not x or key[1] is not step:
            index, offsets = step.shrink[self.a.shape[1]]
            self._h = torch.embedding_bag(
                self.a_flat, index, offsets, False, _SUM, False, xs.reshape(-1)
            )[0]
            self._key = (x, step)
        assert self._h is not None
        return self._h[:, member * self.max_rank : (member + 1) * self.max_rank].contiguous()

    def clear(self) -> None:
        """Drop the cached input and h (the step is over)."""
        self._key = self._h = None


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
        shared: tuple[SharedShrink, int] | None = None,
    ) -> None:
        """`shared`: (the SharedShrink of the projections reading this one's input, this
        projection's member index in it), or None for an A stack of its own."""
        super().__init__()
        self.base = base
        self.in_features = in_features
        self.out_features = out_features
        self.max_rank = max_rank
        self.state = state
        self.shared = shared
        state.register(in_features, max_rank, torch.device(device))
        # Buffers: never trained, and `model.parameters()` keeps naming the base weights' dtype.
        if shared is None:
            a = torch.zeros(num_slots, in_features, max_rank, dtype=dtype, device=device)
        else:
            a = shared[0].member_a(shared[1])
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
        n = step.num_rows
        if n == 0:
            return y
        xs = flat_x[:n] if step.rows is None else flat_x.index_select(0, step.rows)
        if self.shared is not None:
            h = self.shared[0].h(self.shared[1], x, step, xs)
        else:
            index, offsets = step.shrink[self.in_features]
            a_flat = self.lora_a.view(-1, self.max_rank)
            h = torch.embedding_bag(a_flat, index, offsets, False, _SUM, False, xs.reshape(-1))[0]
        index, offsets = step.expand
        b_flat = self.lora_b.view(-1, self.out_features)
        dy = torch.embedding_bag(b_flat, index, offsets, False, _SUM, False, h.view(-1))[0]
        if step.rows is None:
            flat_y[:n] += dy
        else:
            flat_y.index_add_(0, step.rows, dy)
        return y

    def extra_repr(self) -> str:
        slots, _, rank = self.lora_a.shape
        return f"in={self.in_features}, out={self.out_features}, slots={slots}, max_rank={rank}"
