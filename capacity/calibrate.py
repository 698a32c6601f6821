"""Calibration: measure the engine's step time on the local device and fit a linear cost model.

    step_s = a + b x (tokens in the step) + c x (KV tokens read in the step)

The engine is driven by hand (add_request / step). To know what each step read, a hook on the
engine (LLMEngine.schedule_hooks) sees every ScheduledBatch before the runner executes it. For
row i of a batch the attention reads the KV of every token before the new ones plus the new ones
themselves, so

    KV tokens read = sum_i (seq_i.num_computed_tokens + num_new_tokens_i)

with num_computed_tokens taken before the step (the scheduler does not advance it; postprocess
does). The step time is the engine's own StepTiming.step_s (schedule + forward + sample +
postprocess), the same number the engine reports in step_log, so the profile predicts what
operators see. a, b, c are fitted by ordinary least squares (numpy.linalg.lstsq); R^2 and the
relative residuals are stored with the profile.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from capacity.step_noise import cell_noise, mixture_quantile


@dataclass(frozen=True)
class StepPoint:
    num_seqs: int
    num_tokens: int
    kv_tokens_read: int
    step_s: float


@dataclass(frozen=True)
class Fit:
    a: float  # seconds per step
    b: float  # seconds per token in the step
    c: float  # seconds per KV token read
    r2: float
    rms_rel_residual: float
    max_abs_rel_residual: float
    num_points: int


@dataclass(frozen=True)
class Profile:
    device: str
    dtype: str
    model: dict[str, Any]
    fit: Fit
    points: tuple[StepPoint, ...] = field(default_factory=tuple)
    settings: dict[str, Any] = field(default_factory=dict)
    # (cell median step_s, step / median) pairs, see capacity/step_noise; () in older profiles.
    noise_samples: tuple[tuple[float, float], ...] = ()

    @property
    def coefficients(self) -> tuple[float, float, float]:
        return (self.fit.a, self.fit.b, self.fit.c)

    def predict_step_s(self, num_tokens: float, kv_tokens_read: float) -> float:
        return self.fit.a + self.fit.b * num_tokens + self.fit.c * kv_tokens_read

    def to_dict(self, with_points: bool = True) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = [asdict(p) for p in self.points] if with_points else len(self.points)
        if not with_points:
            d["noise_samples"] = len(self.noise_samples)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        return cls(
            device=d["device"],
            dtype=d["dtype"],
            model=dict(d["model"]),
            fit=Fit(**d["fit"]),
            points=tuple(StepPoint(**p) for p in d.get("points", [])),
            settings=dict(d.get("settings", {})),
            noise_samples=tuple(tuple(x) for x in d.get("noise_samples", ())),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_dict(json.loads(Path(path).read_text()))


def fit_step_model(points: Sequence[StepPoint]) -> Fit:
    """Least-squares fit of step_s = a + b*num_tokens + c*kv_tokens_read, in relative error.

    Each row is divided by its step time, so a 2 ms decode step counts as much as a 60 ms prefill:
    plain least squares lets the big steps dominate and misses the small-batch regime by ~20%.
    """
    if len(points) < 3:
        raise ValueError(f"need at least 3 step points to fit 3 coefficients, got {len(points)}")
    x = np.array([[1.0, p.num_tokens, p.kv_tokens_read] for p in points], dtype=np.float64)
    y = np.array([p.step_s for p in points], dtype=np.float64)
    w = 1.0 / np.where(y > 0, y, 1.0)
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    rel = (y - pred) / np.where(y > 0, y, 1.0)
    return Fit(
        a=float(coef[0]),
        b=float(coef[1]),
        c=float(coef[2]),
        r2=float(r2),
        rms_rel_residual=float(np.sqrt(np.mean(rel**2))),
        max_abs_rel_residual=float(np.max(np.abs(rel))),
        num_points=len(points),
    )


def device_description(device) -> str:
    import torch

    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu:{name} threads={torch.get_num_threads()}"


def model_summary(model_config) -> dict[str, Any]:
    text = (
        model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    )
    keys = (
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    )
    return {k: getattr(text, k, None) for k in keys}


class StepRecorder:
    """Records each batch's KV tokens read, through the engine's schedule hook."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.kv_reads: list[int] = []
        engine.schedule_hooks.append(self._on_schedule)

    def _on_schedule(self, batch) -> None:
        if batch.seqs:  # before the forward: num_computed_tokens is each row's context
            self.kv_reads.append(
                sum(
                    s.num_computed_tokens + n
                    for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
                )
            )

    def points(self, since_log: int = 0, since_kv: int = 0) -> list[StepPoint]:
        log = list(self.engine.step_log)[since_log:]
        kv = self.kv_reads[since_kv:]
        if len(log) != len(kv):
            raise RuntimeError(f"step_log has {len(log)} steps but {len(kv)} batches were seen")
        return [
            StepPoint(t.num_seqs, t.num_tokens, k, t.step_s) for t, k in zip(log, kv, strict=True)
        ]


def make_tiny_model_dir(path: str | Path) -> Path:
    from serving.tiny_models import SMALL_LLAMA, save_tiny_model_dir

    return save_tiny_model_dir(path, arch="llama", **SMALL_LLAMA)


def engine_config(max_batch: int, max_len: int, **kw):
    from serving.engine import EngineConfig

    return EngineConfig(
        max_num_seqs=max_batch,
        min_num_seqs=max_batch,
        max_model_len=max_len,
        **kw,
    )


def _log(msg: str, verbose: bool) -> None:
    if verbose:
        print(msg, file=sys.stderr, flush=True)


def _run_batch(engine, batch: int, ctx: int, decode_steps: int, rng) -> None:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=decode_steps + 1, temperature=0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([int(t) for t in rng.integers(3, 500, size=ctx)], params)
    while engine.has_unfinished():
        engine.step()


def _open_engine(model, cfg):
    """(engine, temporary dir to clean up or None) for a model dir, "tiny" or a factory."""
    from serving.engine import LLMEngine

    if callable(model):
        return model(cfg), None
    tmp, path = None, model
    if str(model) == "tiny":
        tmp = tempfile.TemporaryDirectory(prefix="tideserve-calib-")
        path = make_tiny_model_dir(tmp.name)
    return LLMEngine.from_pretrained(str(path), cfg), tmp


def _measure_grid(engine, grid: dict[str, Any], verbose: bool):
    """Every (context, batch) cell of the grid, `repeats` times: step points and jitter."""
    recorder = StepRecorder(engine)
    rng = np.random.default_rng(0)
    batch_sizes, context_lens = grid["batch_sizes"], grid["context_lens"]
    _log(f"calibrate: device={engine.device} dtype={engine.dtype} warming up", verbose)
    _run_batch(engine, min(4, max(batch_sizes)), min(context_lens), 4, rng)  # not fitted
    points: list[StepPoint] = []
    noise: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    for _ in range(grid["repeats"]):
        for ctx in context_lens:
            for b in batch_sizes:
                n_log, n_kv = len(engine.step_log), len(recorder.kv_reads)
                _run_batch(engine, b, ctx, grid["decode_steps"], rng)
                new = recorder.points(n_log, n_kv)
                points.extend(new)
                noise += cell_noise([p.step_s for p in new if p.num_tokens == b])
                med = float(np.median([p.step_s for p in new])) if new else math.nan
                _log(
                    f"calibrate: batch={b:3d} ctx={ctx:4d} steps={len(new):3d} "
                    f"median step={med * 1e3:7.2f} ms  ({time.perf_counter() - t0:.1f}s)",
                    verbose,
                )
    return points, noise


def calibrate(
    model: str | Path | Callable[..., Any] = "tiny",
    batch_sizes: Sequence[int] = (1, 4, 16, 32),
    context_lens: Sequence[int] = (64, 256, 512),
    decode_steps: int = 16,
    repeats: int = 1,
    num_threads: int | None = 1,
    verbose: bool = False,
    **engine_kw: Any,
) -> Profile:
    """Run the engine across batch sizes x context lengths and fit the step cost model.

    `model` is a model directory, "tiny" (a few-M-param random Llama written to a temp dir), or
    a factory `f(EngineConfig) -> LLMEngine`. Each grid cell submits `batch` prompts of `ctx`
    tokens with max_tokens = decode_steps + 1, so the cell contributes its (chunked) prefill
    steps and `decode_steps` decode steps at context ctx..ctx+decode_steps.
    """
    import torch

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    cfg = engine_config(max(batch_sizes), max(context_lens) + decode_steps + 2, **engine_kw)
    grid = dict(
        batch_sizes=list(batch_sizes),
        context_lens=list(context_lens),
        decode_steps=decode_steps,
        repeats=repeats,
    )
    engine, tmp = _open_engine(model, cfg)
    try:
        points, noise = _measure_grid(engine, grid, verbose)
        return Profile(
            device=device_description(engine.device),
            dtype=str(engine.dtype).removeprefix("torch."),
            model=model_summary(engine.model.config),
            fit=fit_step_model(points),
            points=tuple(points),
            noise_samples=tuple(noise),
            settings=dict(
                **grid,
                num_threads=torch.get_num_threads(),
                block_size_tokens=cfg.block_size_tokens,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
            ),
        )
    finally:
        if tmp is not None:
            tmp.cleanup()


def format_fit(profile: Profile) -> str:
    f = profile.fit
    return (
        f"device: {profile.device}  dtype: {profile.dtype}\n"
        f"step_s = {f.a * 1e3:.4f} ms + {f.b * 1e6:.4f} us x tokens + "
        f"{f.c * 1e9:.4f} ns x KV tokens read\n"
        f"R^2 = {f.r2:.4f}  rms rel residual = {f.rms_rel_residual:.3f}  "
        f"max |rel residual| = {f.max_abs_rel_residual:.3f}  points = {f.num_points}"
    )


def predict_closed_loop(
    profile: Profile, concurrency: int, avg_input: int, avg_output: int, quantile: float = 0.99
) -> dict[str, float]:
    """Mean and quantile step time at constant concurrency with staggered requests.

    A slot holds a request for avg_output steps (one prefill step that samples the first token,
    then avg_output - 1 decodes), so on average C / avg_output prefills land per step: steps carry
    k = floor(C / O) or k + 1 prefills, the latter in a fraction C / O - k of steps. A step with k
    prefills has (C - k) decodes at average context I + O / 2 plus k x I prefill tokens. The
    quantile is that two-kind mixture times the profile's measured jitter (capacity/step_noise).
    """
    from capacity.planner import throughput_from_profile

    c, i, o = concurrency, avg_input, avg_output
    tokens_per_s, requests_per_s, mean_step = throughput_from_profile(profile, c, i, o)
    ctx = i + o / 2

    def step(k: int) -> float:
        k = min(k, c)
        return profile.predict_step_s((c - k) + k * i, (c - k) * ctx + k * i)

    lo = math.floor(c / o)
    frac_hi = c / o - lo
    q_step = mixture_quantile(
        [step(lo), step(lo + 1)], [1 - frac_hi, frac_hi], profile.noise_samples, quantile
    )
    return dict(
        tokens_per_s=tokens_per_s,
        requests_per_s=requests_per_s,
        mean_step_s=mean_step,
        quantile_step_s=q_step,
    )
