"""The planner on six public configs (tests/data/model_configs, see its README for the hub ids).

Parameter counts are exact (transformers on the meta device) and within 1 % of the totals the
model cards publish; KV bytes per token are checked against the shapes by hand; Mixtral-8x7B is
refused on one H100-80GB with the GiB figures and a non-zero exit code, and nothing is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from capacity import cli, memory
from capacity.fit import DoesNotFit
from capacity.params import count_params
from capacity.planner import PlanInputs, model_view, plan

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "tests" / "data" / "model_configs"
GIB = 2**30

# name: (published total, published active or None, KV bytes per token in bf16 by hand)
PUBLISHED = {
    "llama-3-8b": (8.03e9, None, 32 * 8 * 128 * 2 * 2),  # 131,072
    "qwen2.5-14b": (14.7e9, None, 48 * 8 * 128 * 2 * 2),  # 196,608
    "mixtral-8x7b": (46.7e9, 12.9e9, 32 * 8 * 128 * 2 * 2),  # 131,072
    # MLA caches one latent per token and layer: kv_lora_rank 512 + qk_rope_head_dim 64
    "deepseek-v2-lite": (15.7e9, 2.4e9, 27 * (512 + 64) * 2),  # 31,104
    "gemma-2-9b": (9.24e9, None, 42 * 8 * 256 * 2 * 2),  # 344,064
    "phi-3-mini": (3.8e9, None, 32 * 32 * 96 * 2 * 2),  # 393,216
    "mistral-7b-v0.1": (7.24e9, None, 32 * 8 * 128 * 2 * 2),  # 131,072, window 4096
}


def load(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_within_one_percent_of_the_model_cards(name):
    total, active, _ = PUBLISHED[name]
    count = count_params(load(name))
    assert count.exact
    assert count.total == pytest.approx(total, rel=0.01)
    if active is None:
        assert count.active == count.total
    elif name == "mixtral-8x7b":  # 2 of 8 experts: the card's 12.9 B includes the embeddings
        assert count.active == pytest.approx(active, rel=0.01)
    else:  # DeepSeek's card counts what a token computes through (no embedding lookup)
        assert count.flop_params == pytest.approx(active, rel=0.025)


def test_exact_totals_where_the_cards_print_them():
    assert count_params(load("llama-3-8b")).total == 8_030_261_248
    assert count_params(load("gemma-2-9b")).total == 9_241_705_984
    assert count_params(load("phi-3-mini")).total == 3_821_079_552


def test_tied_embeddings_are_counted_once():
    gemma = load("gemma-2-9b")  # ties input and output embeddings (transformers' default)
    tied = count_params(gemma)
    untied = count_params({**gemma, "tie_word_embeddings": False})
    assert tied.tied_embeddings and not untied.tied_embeddings
    assert untied.total - tied.total == 256_000 * 3584 == tied.embedding


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_kv_bytes_per_token_exact(name):
    expected = PUBLISHED[name][2]
    cfg = model_view(load(name))
    assert memory.kv_bytes_per_token(cfg, "bf16") == expected
    p = plan(PlanInputs(cfg_dict := load(name), "H200", 600, 120, 4096, 10.0))
    assert p.split.kv_bytes_per_token == expected
    assert p.num_params == count_params(cfg_dict).total


def test_sliding_window_kv_is_bounded_by_the_window():
    gemma, phi3 = model_view(load("gemma-2-9b")), model_view(load("phi-3-mini"))
    # Gemma 2: 21 of 42 layers slide over 4096 tokens; 8,192 B per token and layer
    assert memory.seq_kv_bytes(gemma, "bf16", 8192) == 21 * 8192 * 8192 + 21 * 8192 * 4096
    assert memory.seq_kv_bytes(gemma, "bf16", 8192) / (344_064 * 8192) == 0.75
    # Phi-3-mini: every layer slides over 2047 tokens
    assert memory.seq_kv_bytes(phi3, "bf16", 4096) == 393_216 * 2047
    layout = memory.paging_layout(gemma)
    assert layout.group_windows == (None, 4096) and layout.layers_per_group == 21
    assert memory.block_bytes(gemma, "bf16", 16) == 21 * 8192 * 16
    assert (
        memory.seq_blocks(layout.group_windows, 8192, 16) == 512 + 257
    )  # full group + window bound
    one = memory.paging_layout(gemma, max_groups=1)  # a backend that reads one table: keep all
    assert one.group_windows == (None,) and one.layers_per_group == 42


def test_moe_plans_memory_on_total_and_compute_on_active():
    p = plan(PlanInputs(load("mixtral-8x7b"), "H200", 600, 120, 4096, 10.0))
    assert p.split.weight_bytes == p.params.total * 2
    assert p.params.flop_params == p.params.active - 32000 * 4096
    compute_s = 2 * p.params.flop_params * 600 / 989e12  # 12.75 B, not 46.7 B, per token
    assert p.prefill_s_per_request == pytest.approx(max(compute_s, p.split.weight_bytes / 4.8e12))
    assert "12.88 B active per token" in p.budget_rows()[1][0]


def test_quantised_weights_take_their_bits():
    gptq = {
        **load("llama-3-8b"),
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128},
    }
    count = count_params(gptq)
    p = plan(PlanInputs(gptq, "L4", 600, 120, 4096, 10.0))
    bits = 4 + (16 + 4) / 128  # 4-bit weights, a 16-bit scale and a 4-bit zero per 128
    rest = count.total - count.quantizable  # embeddings, LM head, norms stay bf16
    assert rest == 2 * 128256 * 4096 + 65 * 4096
    assert p.split.weight_bytes == -(-count.quantizable * bits // 8) + rest * 2
    assert p.split.weight_bytes < 0.4 * count.total * 2
    with pytest.raises(ValueError, match="quant_method='mystery'"):
        plan(
            PlanInputs(
                {**gptq, "quantization_config": {"quant_method": "mystery"}}, "L4", 6, 1, 64, 1
            )
        )


def test_planner_says_the_engine_refuses_latent_attention():
    p = plan(PlanInputs(load("deepseek-v2-lite"), "H100", 600, 120, 4096, 10.0))
    assert any("latent attention (MLA)" in w for w in p.warnings)


MIXTRAL_ON_H100 = (
    "plan",
    "--model",
    str(CONFIGS / "mixtral-8x7b"),
    "--gpu",
    "H100-80GB",
    "--avg-input",
    "600",
    "--avg-output",
    "120",
    "--max-model-len",
    "32768",
    "--peak-qps",
    "20",
)


def test_mixtral_is_refused_on_one_h100_with_a_gib_message_and_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "capacity", *MIXTRAL_ON_H100],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode != 0 and proc.stdout == ""
    err = proc.stderr
    for needle in (
        "mixtral-8x7b (46.70 B parameters, bf16) does not fit on one H100-SXM",
        "weights 86.99 GiB",
        "reserve 6.00 GiB",
        "leave -20.99 GiB for the KV cache",
        "tensor parallelism over 2 x H100-SXM",
        "one H200 (141 GiB)",
    ):
        assert needle in err, err


def test_write_cluster_yaml_is_refused_and_leaves_the_file(tmp_path):
    target = tmp_path / "cluster.yaml"
    shutil.copy(REPO / "cluster.yaml", target)
    before = target.read_text()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main([*MIXTRAL_ON_H100, "--write-cluster-yaml", str(target)])
    assert code != 0 and "does not fit" in err.getvalue()
    assert target.read_text() == before


def test_the_same_model_fits_where_the_message_says():
    mixtral = load("mixtral-8x7b")
    fits = plan(PlanInputs(mixtral, "H200", 600, 120, 32768, 20.0))
    assert fits.max_concurrency_max_len >= 1
    with pytest.raises(DoesNotFit):
        plan(PlanInputs(mixtral, "H100-80GB", 600, 120, 32768, 20.0))


def test_a_replica_refuses_at_start_up_before_reading_weights(tmp_path, monkeypatch):
    """Only config.json is there: a refusal that came after loading would fail on the weights."""
    from serving.engine import loader
    from serving.llm.replica import ModelReplica

    model_dir = tmp_path / "mixtral-8x7b"
    model_dir.mkdir()
    shutil.copy(CONFIGS / "mixtral-8x7b" / "config.json", model_dir)
    monkeypatch.setattr(loader, "device_memory_bytes", lambda device: 80 * GIB)  # an H100
    args = {"model": {"source": str(model_dir)}, "engine": {"device": "cpu", "dtype": "bfloat16"}}
    with pytest.raises(DoesNotFit) as err:
        ModelReplica(args, "hot")
    message = str(err.value)
    for needle in (
        "46.70 B parameters, bfloat16) does not fit on this machine (cpu)",
        "100% of 80.00 GiB",
        "weights 86.99 GiB + reserve 6.00 GiB leave -12.99 GiB for the KV cache",
        "A single device needs at least",
    ):
        assert needle in message, message


def test_the_committed_sliding_window_figures_are_what_the_formula_derives():
    """docs quote benchmarks/results/sliding_window_kv.json; its derived half must stay true."""
    from benchmarks.sliding_window_kv import PUBLIC, derived

    committed = json.loads((REPO / "benchmarks/results/sliding_window_kv.json").read_text())
    assert committed["derived"] == [derived(name) for name in PUBLIC]
    mistral = committed["derived"][0]["per_sequence"][-1]
    assert (mistral["tokens"], mistral["saving"]) == (32768, 1 - 257 / 2048)
