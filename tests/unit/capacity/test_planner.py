"""Capacity planner (R4 + R6, docs/requirements.md): pure arithmetic on config.json fixtures, no
weights."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
from pathlib import Path

import pytest

from capacity import cli, memory
from capacity.fit import DoesNotFit
from capacity.gpus import GPUS, get_gpu
from capacity.params import count_params
from capacity.planner import (
    PlanInputs,
    default_reserve_bytes,
    format_plan,
    hot_cold_split,
    model_view,
    plan,
    replicas_for_peak,
    requests_per_s_per_gpu,
)

REPO = Path(__file__).resolve().parents[3]
GIB = 1024**3

LLAMA2_7B = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    vocab_size=32000,
    hidden_act="silu",
    torch_dtype="float16",
)
LLAMA2_70B = dict(
    model_type="llama",
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    vocab_size=32000,
    hidden_act="silu",
)
LLAMA3_8B = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    hidden_act="silu",
)
MISTRAL_7B = dict(
    model_type="mistral",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    hidden_act="silu",
)
QWEN2_7B = dict(
    model_type="qwen2",
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    hidden_act="silu",
)
GEMMA_7B = dict(  # explicit head_dim 256 although hidden / heads = 192
    model_type="gemma",
    hidden_size=3072,
    intermediate_size=24576,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=16,
    head_dim=256,
    vocab_size=256000,
    hidden_act="gelu_pytorch_tanh",
    tie_word_embeddings=True,
)

QWEN2_0_5B = dict(
    model_type="qwen2",
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    hidden_act="silu",
    tie_word_embeddings=True,
)

R6 = dict(avg_input_tokens=600, avg_output_tokens=120, peak_qps=2000)


def write_config(tmp_path: Path, config: dict, name: str = "model") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def inputs(config=LLAMA3_8B, gpu="H100-SXM", **kw) -> PlanInputs:
    args = dict(R6, max_model_len=8192, dtype="bf16") | kw
    return PlanInputs(model_config=config, gpu=gpu, **args)


# --- GPU catalogue ----------------------------------------------------------------------------


def test_gpu_catalogue_values_and_aliases():
    h100 = get_gpu("h100")
    assert h100 is get_gpu("H100-SXM") is get_gpu("h100_sxm")
    assert (h100.memory_bytes, h100.bandwidth_bytes_per_s, h100.bf16_flops_per_s) == (
        80 * GIB,
        3.35e12,
        989e12,
    )
    assert get_gpu("A100-80GB").bandwidth_bytes_per_s == 2.039e12
    assert get_gpu("a100-40gb").bandwidth_bytes_per_s == 1.555e12
    assert get_gpu("H200").memory_bytes == 141 * GIB
    assert get_gpu("l4").bf16_flops_per_s == 121e12
    assert not get_gpu("T4").bf16_supported
    assert all(spec.source for spec in GPUS.values())
    assert "UNCERTAIN" in get_gpu("A10G").source


def test_unknown_gpu_lists_known_names():
    with pytest.raises(ValueError, match=r"not in the catalogue.*H100-SXM"):
        get_gpu("rtx-9090")


# --- R6 worked example -----------------------------------------------------------------------


def test_r6_worked_example_reproduces_document_numbers():
    # 35 ms per request measured at the achieved utilisation (eff 1.0), safety 0.7 -> 20 req/s.
    per_gpu = requests_per_s_per_gpu(0.035, 1.0, 0.7)
    assert per_gpu == pytest.approx(20.0)
    assert replicas_for_peak(2000, per_gpu) == 100
    assert hot_cold_split(100, 0.7) == (70, 30)


def test_r6_literal_reading_is_documented_discrepancy():
    # Applying 40 % on top of 35 ms does not give ~20 req/s (see requests_per_s_per_gpu).
    assert requests_per_s_per_gpu(0.035, 0.4, 0.8) == pytest.approx(9.14, abs=0.01)
    assert replicas_for_peak(2000, requests_per_s_per_gpu(0.035, 0.4, 0.8)) == 219


def test_r6_helpers_validate():
    with pytest.raises(ValueError, match="safety"):
        requests_per_s_per_gpu(0.035, 0.4, 0)
    with pytest.raises(ValueError, match="compute_s_per_request"):
        requests_per_s_per_gpu(0, 0.4, 0.8)
    assert hot_cold_split(0, 0.7) == (0, 0)
    assert hot_cold_split(3, 1.0) == (3, 0)


# --- plan() ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "dtype", "kv_per_token"),
    [
        (LLAMA2_7B, "fp16", 524_288),  # MHA
        (LLAMA3_8B, "bf16", 131_072),  # GQA
        (MISTRAL_7B, "bf16", 131_072),
        (QWEN2_7B, "bf16", 28 * 4 * 128 * 2 * 2),
        (GEMMA_7B, "bf16", 28 * 16 * 256 * 2 * 2),  # explicit head_dim wins
    ],
)
def test_plan_uses_the_one_memory_formula(config, dtype, kv_per_token):
    p = plan(inputs(config, dtype=dtype))
    s = p.split
    assert s.kv_bytes_per_token == kv_per_token == memory.kv_bytes_per_token(config, dtype)
    assert s.weight_bytes == count_params(model_view(config)).total * 2
    assert s.reserve_bytes == default_reserve_bytes(80 * GIB) == 2 * GIB + int(0.05 * 80 * GIB)
    expected = memory.split_memory(
        80 * GIB, s.weight_bytes, s.reserve_bytes, 0.9, config, dtype, 16
    )
    assert s == expected
    # transformers' MistralConfig fills in its 4096-token window: sequences hold at most that
    layout = memory.paging_layout(model_view(config))
    assert layout.group_windows == ((4096,) if config is MISTRAL_7B else (None,))
    assert p.max_concurrency_avg == memory.max_concurrency(s.num_blocks, 720, 16)
    assert p.max_concurrency_max_len == memory.max_concurrency(
        s.num_blocks, 8192, 16, layout.group_windows
    )


@pytest.mark.parametrize("gpu", ["H200", "H100-SXM", "A100-80GB", "L40S"])
@pytest.mark.parametrize("config", [LLAMA2_7B, LLAMA3_8B, QWEN2_7B])
def test_plan_invariants(gpu, config):
    p = plan(inputs(config, gpu, max_model_len=4096))
    assert p.memory_watermark <= 0.9
    assert p.memory_watermark > 0.85  # KV fills the budget up to whole blocks
    assert p.hot_replicas + p.cold_max_replicas == p.replicas_at_peak
    assert p.hot_replicas == math.ceil(0.7 * p.replicas_at_peak - 1e-9)
    assert p.replicas_at_peak == math.ceil(2000 / p.replica_requests_per_s)
    assert p.replica_requests_per_s == pytest.approx(p.raw_requests_per_s * 0.9 * 0.8)
    assert p.replica_tokens_per_s == pytest.approx(p.replica_requests_per_s * 120)
    assert p.max_concurrency_avg >= p.max_concurrency_max_len >= 1
    more = plan(inputs(config, gpu, max_model_len=4096, peak_qps=8000))
    assert more.replicas_at_peak > p.replicas_at_peak


def test_plan_throughput_orders_gpus_and_gqa():
    gpus = ("H200", "H100", "L4")
    h200, h100, l4 = (plan(inputs(LLAMA3_8B, g, max_model_len=4096)) for g in gpus)
    assert h200.replica_requests_per_s > h100.replica_requests_per_s > l4.replica_requests_per_s
    # Same GPU: GQA (4x smaller KV) fits more sequences than MHA.
    mha = plan(inputs(LLAMA2_7B, "H100"))
    assert plan(inputs(MISTRAL_7B, "H100")).max_concurrency_avg > 3 * mha.max_concurrency_avg


def test_r6_roofline_example_llama3_8b_h100():
    p = plan(inputs(LLAMA3_8B, "H100-SXM"))
    assert p.num_params == pytest.approx(8.03e9, rel=0.01)
    assert p.decode_bound == "memory"
    # decode step = (weights + C x 660 x 131072) / 3.35 TB/s
    kv_read = p.max_concurrency_avg * 660 * 131_072
    assert p.decode_step_s == pytest.approx((p.split.weight_bytes + kv_read) / 3.35e12)
    # compute counts the parameters a token multiplies through: not the embedding lookup
    assert p.params.flop_params == p.num_params - 128256 * 4096
    assert p.prefill_s_per_request == pytest.approx(2 * p.params.flop_params * 600 / 989e12)


def test_effective_utilization_and_ttft_warning():
    base = plan(inputs())
    derated = plan(inputs(effective_utilization=0.4))
    assert derated.replica_requests_per_s == pytest.approx(base.raw_requests_per_s * 0.4 * 0.8)
    assert derated.replicas_at_peak > base.replicas_at_peak
    assert any("ttft_p99_s" in w for w in plan(inputs(gpu="L4", ttft_p99_s=0.01)).warnings)
    assert any("BF16" in w for w in plan(inputs(QWEN2_0_5B, "T4", max_model_len=1024)).warnings)


def test_does_not_fit_names_shortfall_and_fix():
    with pytest.raises(DoesNotFit, match=r"short by \d+\.\d\d GiB.*over 8 x L4.*smaller dtype"):
        plan(inputs(LLAMA2_70B, "L4", dtype="fp16"))


def test_max_model_len_that_does_not_fit():
    with pytest.raises(DoesNotFit, match=r"max_model_len of at most \d+"):
        plan(inputs(LLAMA2_7B, "L4", dtype="fp16", max_model_len=1_000_000))


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(safety=0), "safety"),
        (dict(safety=1.2), "safety"),
        (dict(utilization=1.5), "utilization"),
        (dict(hot_fraction=-0.1), "hot_fraction"),
        (dict(peak_qps=0), "peak_qps"),
        (dict(avg_input_tokens=0), "avg_input_tokens"),
        (dict(max_model_len=100), "max_model_len"),
        (dict(block_size_tokens=0), "block_size_tokens"),
        (dict(dtype="int3"), "dtype"),
        (dict(gpu="nope"), "gpu"),
    ],
)
def test_inputs_validation_names_field(kw, field):
    with pytest.raises(ValueError, match=field):
        inputs(**kw)


def test_format_plan_has_budget_table():
    text = format_plan(plan(inputs()))
    for needle in (
        "device memory",
        "80.00 GiB",
        "KV bytes per token",
        "131,072 B",
        "memory watermark",
        "replicas at peak",
        "hot pool",
        "cold pool max",
    ):
        assert needle in text


# --- CLI ---------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m capacity plan ...` in this process (the exit code is main's return value;
    tests.unit.capacity.test_public_configs.py runs it as a real subprocess once)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", *args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


R6_ARGS = ("--avg-input", "600", "--avg-output", "120", "--peak-qps", "2000")


def test_cli_text_and_json_agree(tmp_path):
    model = write_config(tmp_path, LLAMA3_8B)
    args = ("--model", str(model), "--gpu", "H100-SXM", "--max-model-len", "8192", *R6_ARGS)
    text = run_cli(*args)
    assert text.returncode == 0, text.stderr
    assert "Memory budget" in text.stdout and "replicas at peak" in text.stdout
    out = run_cli(*args, "--json", "--safety", "0.8", "--hot-fraction", "0.7")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    p = plan(inputs())
    assert data["kv_bytes_per_token"] == 131_072
    assert data["kv_region_bytes"] == p.split.kv_region_bytes
    assert data["max_concurrency_avg"] == p.max_concurrency_avg
    assert data["max_concurrency_max_len"] == p.max_concurrency_max_len
    assert data["replica_tokens_per_s"] == pytest.approx(p.replica_tokens_per_s)
    assert data["replicas_at_peak"] == p.replicas_at_peak
    assert data["hot_replicas"] + data["cold_max_replicas"] == data["replicas_at_peak"]


def test_cli_accepts_config_json_path(tmp_path):
    model = write_config(tmp_path, QWEN2_7B)
    out = run_cli(
        "--model",
        str(model / "config.json"),
        "--gpu",
        "a100-80gb",
        "--max-model-len",
        "4096",
        "--json",
        *R6_ARGS,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kv_bytes_per_token"] == 28 * 4 * 128 * 2 * 2


def test_cli_does_not_fit_exits_nonzero(tmp_path):
    model = write_config(tmp_path, LLAMA2_70B)
    out = run_cli(
        "--model", str(model), "--gpu", "L4", "--dtype", "fp16", "--max-model-len", "4096", *R6_ARGS
    )
    assert out.returncode != 0
    assert out.stdout == ""
    assert "does not fit" in out.stderr and "short by" in out.stderr


def test_cli_unknown_model_exits_nonzero(tmp_path):
    out = run_cli(
        "--model", "no-such-org/no-such-model", "--gpu", "H100", "--max-model-len", "4096", *R6_ARGS
    )
    assert out.returncode != 0
    assert "not in the local Hugging Face cache" in out.stderr
