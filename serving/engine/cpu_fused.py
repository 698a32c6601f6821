"""Sibling projections that read the same input, run as one packed matmul on CPU.

Why: a decode step multiplies a few rows by each weight matrix, and at a few rows oneDNN's cost
per call is a visible share of the matmul itself; attention's q, k and v projections (and the
MLP's gate and up) all read the same hidden states. vLLM fuses them at load (QKVParallelLinear,
MergedColumnParallelLinear); here the transformers model's own forward still calls q_proj,
k_proj and v_proj one by one, so each becomes a `FusedPart` of one `FusedProjection`: the first
part asked for on an input computes the concatenated product once, and its siblings on the
same input take their slices.

"The same input" is the same tensor object, unchanged since (`_version`): any other call,
whatever its order, computes the product afresh, so the result never depends on the call
pattern, only the speed does. The product is dropped once every part has taken its slice.
Results equal the separate packed matmuls up to summation order (tests/unit/test_cpu_fused.py).
"""

from __future__ import annotations

import logging

import torch

from serving.engine.cpu_linear import PackedLinear

log = logging.getLogger(__name__)

# (parent module's children fused together); each set only where all are plain nn.Linear
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedProjection(torch.nn.Module):
    """One packed weight for several projections of the same input."""

    def __init__(self, linears: list[torch.nn.Linear]) -> None:
        super().__init__()
        biases = [lin.bias for lin in linears]
        whole = torch.nn.Linear(linears[0].in_features, sum(lin.out_features for lin in linears))
        with torch.no_grad():
            whole.weight = torch.nn.Parameter(torch.cat([lin.weight for lin in linears]))
            whole.bias = None if biases[0] is None else torch.nn.Parameter(torch.cat(biases))
        self.packed = PackedLinear(whole)
        self.sizes = [lin.out_features for lin in linears]
        self._input: torch.Tensor | None = None
        self._version = -1
        self._parts: tuple[torch.Tensor, ...] = ()
        self._taken: set[int] = set()

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if self._input is not x or self._version != x._version or index in self._taken:
            self._parts = self.packed(x).split(self.sizes, dim=-1)
            self._input, self._version, self._taken = x, x._version, set()
        out = self._parts[index]
        self._taken.add(index)
        if len(self._taken) == len(self.sizes):  # all served: free the product and the input
            self._input, self._parts = None, ()
        return out


class FusedPart(torch.nn.Module):
    """Stands where one projection was; its forward is its slice of the fused product."""

    def __init__(self, fused: FusedProjection, index: int, in_features: int, out_features: int):
        super().__init__()
        self.fused = fused
        self.index = index
        self.in_features = in_features
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(x, self.index)

    def extra_repr(self) -> str:
        return f"part {self.index} of a fused projection, out_features={self.out_features}"


def _fusable(linears: list[torch.nn.Module]) -> bool:
    if not all(type(m) is torch.nn.Linear for m in linears):
        return False  # a packed, quantized or LoRA layer: its forward is its own
    first = linears[0]
    return all(
        m.in_features == first.in_features
        and (m.bias is None) == (first.bias is None)
        and m.weight.dtype == first.weight.dtype
        for m in linears
    )


def fuse_siblings(model: torch.nn.Module) -> int:
    """Replace each set of SIBLINGS of `model` by parts of one packed projection; returns how
    many sets were fused. Run before the other linears are packed (it needs plain nn.Linear)."""
    count = 0
    for parent in list(model.modules()):
        for names in SIBLINGS:
            linears = [getattr(parent, n, None) for n in names]
            if any(m is None for m in linears) or not _fusable(linears):
                continue
            fused = FusedProjection(linears)
            for i, (name, lin) in enumerate(zip(names, linears, strict=True)):
                part = FusedPart(fused, i, lin.in_features, lin.out_features)
                setattr(parent, name, part)
            count += 1
    if count:
        log.info("fused %d sets of sibling projections into one packed matmul each (CPU)", count)
    return count
