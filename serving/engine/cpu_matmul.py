"""Linear layers for CPU decode through a small C matmul kernel, built per machine (float32).

Why: a decode step multiplies a few rows (one per running sequence) by every weight matrix, and
at 16 rows on one thread of this project's AVX2 machine oneDNN's packed matmul ran SmolLM2-135M's
30 layers of projections at about 48 GFLOP/s (the weights stream from DRAM every step) against
65 on a cache-resident matrix. This kernel (cpu_matmul.c) holds each weight in panels of 6 output
columns, k-major, and computes 16 rows x 6 columns per pass with the rows transposed into L1:
every weight is read once, in address order, and feeds 16 rows. By hand on that machine, one
thread, 16 rows: the 30 layers' projections 41.5 ms vs oneDNN's 70.2, the LM head 10.5 vs 16.4;
faster at every row count measured from 1 to 512 (1.02x at 1 row, 1.15x at 512).
benchmarks/engine_embedded.py measures the engine with it against oneDNN's packing in one run.

Threads: the panels are split among the torch thread's count of OpenMP threads. The library
links libgomp, which resolves to the copy torch already loaded where torch links libgomp under
that soname (PyPI's CPU wheels), so the kernel and torch's own ops share one thread pool; beside
a torch built with another OpenMP (Intel's libiomp5) it runs libgomp's own pool.

Built once per machine with the system's C compiler (serving/engine/native_build.py); a CPU
without AVX2 and FMA fails the build, and the engine keeps oneDNN's packing (serving/engine/
cpu_linear.py chooses). Results differ from F.linear in summation order only (about 1e-6
relative in float32).
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import torch

from serving.engine.cpu_linear import PackedLinear
from serving.engine.native_build import NativeKernel

SOURCE = Path(__file__).with_name("cpu_matmul.c")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
PANEL_COLUMNS, CHUNK_ROWS = 6, 16  # NR and ROWS of cpu_matmul.c
_P, _I = ctypes.c_void_p, ctypes.c_int64


def _bind(lib: ctypes.CDLL):
    fn = lib.tideserve_linear_f32
    fn.argtypes = [_P] * 5 + [_I] * 4
    fn.restype = ctypes.c_int
    return fn


KERNEL = NativeKernel("cpu_matmul", SOURCE, CFLAGS, _bind)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> [ceil(N / 6), K, 6]: panels of 6 output columns, k-major, zero-padded."""
    out_features, in_features = weight.shape
    panels = -(-out_features // PANEL_COLUMNS)
    padded = torch.zeros(panels * PANEL_COLUMNS, in_features, dtype=torch.float32)
    padded[:out_features] = weight.detach()
    return padded.view(panels, PANEL_COLUMNS, in_features).transpose(1, 2).contiguous()


class NativeLinear(torch.nn.Module):
    """y = x W^T + b through cpu_matmul.c; float32 CPU input of any leading shape."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        if linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu":
            raise ValueError(
                f"NativeLinear takes float32 CPU weights, not {linear.weight.dtype} on "
                f"{linear.weight.device}"
            )
        fn, why = KERNEL.get()
        if fn is None:
            raise RuntimeError(f"the CPU matmul kernel is unavailable: {why}")
        self._fn = fn
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        # Buffers, not parameters (as PackedLinear): they never train, and the model's
        # parameters keep naming its dtype and device.
        self.register_buffer("packed_weight", pack(linear.weight), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"NativeLinear({self.in_features} -> {self.out_features}) got {x.dtype} input "
                f"of shape {tuple(x.shape)}"
            )
        lead = x.shape[:-1]
        rows = x.contiguous().view(-1, self.in_features)
        out = torch.empty(*lead, self.out_features, dtype=torch.float32)
        num_rows = rows.shape[0]
        if num_rows == 0:
            return out
        chunks = -(-num_rows // CHUNK_ROWS)
        scratch = torch.empty(chunks * self.in_features * CHUNK_ROWS, dtype=torch.float32)
        bias = self.bias
        rc = self._fn(
            rows.data_ptr(), self.packed_weight.data_ptr(),
            None if bias is None else bias.data_ptr(), out.data_ptr(), scratch.data_ptr(),
            num_rows, self.out_features, self.in_features, torch.get_num_threads(),
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"the CPU matmul kernel refused {tuple(x.shape)} (code {rc})")
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=native"


def probe() -> str | None:
    """None when the kernel builds here and agrees with F.linear at the row counts that take
    each of its paths (1, 8 and 16 rows, a ragged 37) on a width that is not a multiple of 6,
    with a bias; else why not."""
    fn, why = KERNEL.get()
    if fn is None:
        return why
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(40, 13)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(13, 40, generator=gen))
        linear.bias.copy_(torch.randn(13, generator=gen))
        native = NativeLinear(linear)
        for rows in (1, 8, 16, 37):
            x = torch.randn(rows, 40, generator=gen)
            err = (native(x) - linear(x)).abs().max().item()
            if err > 1e-4:
                return f"the kernel differs from F.linear by {err:.3g} at {rows} rows"
    return None


def race_onednn(
    weights: list[torch.Tensor], rows: int = 16, budget_bytes: int = 48 * 2**20, rounds: int = 3
) -> tuple[float, float]:
    """(native seconds, oneDNN seconds): the best of `rounds` passes of `rows` rows through the
    model's weights (float32 [N, K], in its order) up to `budget_bytes`, each packed both ways;
    a weight larger than the budget is skipped unless none is smaller. More bytes than most
    CPUs' caches hold, so they stream from memory as in a decode step: the engine's
    `cpu_linear: auto` keeps the faster on this machine, not on the one it was measured on."""
    fitting = [w for w in weights if size(w) <= budget_bytes] or [min(weights, key=size)]
    chosen, total = [], 0
    for w in fitting:
        if total >= budget_bytes:
            break
        chosen.append(w)
        total += size(w)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layers = [torch.nn.Linear(w.shape[1], w.shape[0], bias=False) for w in chosen]
        for layer, w in zip(layers, chosen, strict=True):
            layer.weight.copy_(w)
        inputs = [torch.randn(rows, w.shape[1], generator=gen) for w in chosen]
        # the race runs the very modules the engine would install (PackedLinear: oneDNN)
        native = [NativeLinear(layer) for layer in layers]
        onednn = [PackedLinear(layer) for layer in layers]
        return _best(native, inputs, rounds), _best(onednn, inputs, rounds)


def size(weight: torch.Tensor) -> int:
    return weight.numel() * weight.element_size()


def _best(modules: list[torch.nn.Module], inputs: list[torch.Tensor], rounds: int) -> float:
    """Seconds of the fastest of `rounds` passes of each input through its module."""

    def one_pass() -> None:
        for module, x in zip(modules, inputs, strict=True):
            module(x)

    one_pass()  # first touch of the packed copies
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return min(times)
