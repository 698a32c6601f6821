"""Every served architecture matches generate() token for token; the others are refused by name.

Tiny random-weight models of each architecture in serving/tiny_models.TINY_ARCHS (float32), with
prompts of 40-200 tokens, longer than every sliding window (16-32 tokens), in both KV modes; the
on_demand budget is small enough to force preemption and recompute. A control run with the
window and soft-cap dropped (what the engine did before it read them) must differ from
generate(), so each test proves its feature matters.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from capacity import memory
from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine import attention as attention_mod
from serving.engine.features import UnsupportedModelError, check_model
from serving.tiny_models import TINY_ARCHS, tiny_model
from tests.conftest import hf_greedy

NUM_PROMPTS = 6
MAX_LEN = 212  # the longest prompt + MAX_TOKENS
MAX_TOKENS = 12
BLOCK, CHUNK = 8, 64
WINDOWED = {"qwen2-sliding", "mistral", "phi3", "gemma2", "mixtral"}


def kv_blocks_for(model, kv_mode: str) -> int:
    """Roomy for reserve; for on_demand 1.5 longest sequences' worth (windows applied, so
    Mistral's is smaller than Llama's), which six running sequences overflow: preemption."""
    windows = memory.paging_layout(model.config).group_windows
    per_seq = memory.seq_blocks(windows, MAX_LEN, BLOCK, CHUNK)
    return 160 if kv_mode == "reserve" else per_seq * 3 // 2


def prompts_longer_than_windows(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(3, 500) for _ in range(rng.randint(40, 200))] for _ in range(NUM_PROMPTS)
    ]


def greedy_refs(model, prompts) -> list[list[int]]:
    return hf_greedy(model, prompts, MAX_TOKENS)


def engine_outputs(model, prompts, kv_mode: str):
    impl = model.config._attn_implementation
    config = EngineConfig(
        kv_mode=kv_mode,
        num_kv_blocks=kv_blocks_for(model, kv_mode),
        block_size_tokens=BLOCK,
        max_num_batched_tokens=CHUNK,  # long prompts prefill in chunks that cross the window
        max_num_seqs=NUM_PROMPTS,
        min_num_seqs=2,
        runner="paged",
    )
    engine = LLMEngine(model, config=config)
    try:
        outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
        engine.check_integrity()
        return [o.token_ids for o in outs], engine.stats()
    finally:
        model.set_attn_implementation(impl)  # the module-scoped model goes back unchanged


@functools.cache
def arch_case(arch: str):
    """(model, prompts, generate() outputs) of one architecture, built once per session."""
    model = tiny_model(arch, seed=1)
    prompts = prompts_longer_than_windows(seed=5)
    return model, prompts, greedy_refs(model, prompts)


@pytest.mark.parametrize("kv_mode", ["reserve", "on_demand"])
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_greedy_equals_generate_for_every_architecture(arch, kv_mode):
    model, prompts, refs = arch_case(arch)
    window = getattr(model.config, "sliding_window", None)
    if arch in WINDOWED:
        assert window is not None and min(len(p) for p in prompts) > window
    outs, stats = engine_outputs(model, prompts, kv_mode)
    mismatched = [i for i, (o, r) in enumerate(zip(outs, refs, strict=True)) if o != r]
    assert not mismatched, f"{arch}/{kv_mode}: prompts {mismatched} differ from generate()"
    assert stats.num_finished == NUM_PROMPTS
    assert stats.num_kv_blocks_used == 0 and stats.num_kv_blocks_reserved == 0
    if kv_mode == "on_demand":
        assert stats.num_preemptions > 0, "the on_demand budget was meant to force preemption"


@pytest.mark.parametrize(
    ("arch", "dropped"), [(a, "window") for a in sorted(WINDOWED)] + [("gemma2", "softcap")]
)
def test_dropping_the_window_or_softcap_would_answer_wrongly(arch, dropped, monkeypatch):
    """The control: attention that ignores sliding_window (or softcap), as the engine once did
    (every block kept, nothing checked), differs from generate()."""
    model, prompts, refs = arch_case(arch)
    real_spec = attention_mod._spec

    def ignoring(*args):
        spec = real_spec(*args)
        if dropped == "window":
            return attention_mod._Spec(spec.scale, None, spec.softcap)
        return attention_mod._Spec(spec.scale, spec.window, None)

    def keep_every_block(config):
        shape = config if isinstance(config, memory.KVShape) else memory.KVShape.from_config(config)
        num_layers = shape.num_layers
        return memory.PagingLayout((None,), num_layers, (0,) * num_layers, tuple(range(num_layers)))

    monkeypatch.setattr(attention_mod, "_spec", ignoring)
    monkeypatch.setattr(memory, "paging_layout", keep_every_block)
    monkeypatch.setattr(attention_mod, "_check_window", lambda *a: None)
    outs, _ = engine_outputs(model, prompts, "reserve")
    assert outs != refs, f"{arch}: prompts do not exercise the {dropped}"


def test_a_layer_cannot_attend_wider_than_its_freed_window(monkeypatch):
    model, prompts, _ = arch_case("mistral")
    real_spec = attention_mod._spec
    monkeypatch.setattr(
        attention_mod, "_spec", lambda *a: attention_mod._Spec(real_spec(*a).scale, None, None)
    )
    with pytest.raises(RuntimeError, match=r"layer 0 attends with sliding_window=None.*24-token"):
        engine_outputs(model, prompts[:1], "reserve")


# --- refused architectures and features --------------------------------------------------------


def _config(model_type: str, **kw):
    from transformers import AutoConfig

    shape = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    return AutoConfig.for_model(model_type, **{**shape, **kw})


@pytest.mark.parametrize(
    ("model_type", "kw", "feature"),
    [
        ("deepseek_v2", dict(kv_lora_rank=16, q_lora_rank=None), "latent attention"),
        ("deepseek_v3", dict(kv_lora_rank=16, q_lora_rank=16), "latent attention"),
        ("gpt_oss", dict(num_local_experts=2, head_dim=16), "attention sinks"),
        ("falcon", dict(alibi=True, new_decoder_architecture=False), "ALiBi"),
        ("bloom", dict(), "ALiBi"),
        ("mpt", dict(attn_config=dict(alibi=True)), "ALiBi"),
        ("llama4_text", dict(attention_chunk_size=16), "chunked attention"),
        ("t5", dict(), "cross-attention"),
        ("qwen3_next", dict(), "linear attention"),
    ],
)
def test_refused_features_name_the_feature_and_the_model(model_type, kw, feature):
    config = _config(model_type, **kw)
    for runner in ("paged", "hf"):
        with pytest.raises(UnsupportedModelError, match=feature) as err:
            check_model(config, runner)
        assert model_type in str(err.value)


def test_unverified_architecture_is_refused_by_the_paged_runner_only():
    config = _config("starcoder2")
    with pytest.raises(UnsupportedModelError, match=r"starcoder2.*not verified.*runner: hf"):
        check_model(config, "paged")
    check_model(config, "hf")  # the model's own attention runs: nothing of ours to drop


def test_engine_refuses_latent_attention_at_load():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        _config(
            "deepseek_v2",
            kv_lora_rank=16,
            q_lora_rank=None,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=8,
            n_routed_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=16,
        )
    )
    with pytest.raises(UnsupportedModelError, match=r"deepseek_v2.*latent attention \(MLA\)"):
        LLMEngine(model, config=EngineConfig(num_kv_blocks=8))


def _call_attention(**kwargs):
    model = tiny_model("llama")
    layer = model.model.layers[0].self_attn
    q = torch.zeros(1, 4, 1, 16)
    meta = attention_mod.PagedMetadata(
        kv_cache=torch.zeros(2, 2, 4, 2, 8, 16), slot_mapping=torch.tensor([0])
    )
    return attention_mod.paged_attention_forward(layer, q, q, q, None, paged=meta, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        (dict(s_aux=torch.zeros(4)), "attention sinks"),
        (dict(position_bias=torch.zeros(1)), "relative position bias"),
        (dict(some_new_flag=True), "some_new_flag=True"),
        (dict(dropout=0.1), "dropout=0.1"),
        (dict(output_attentions=True), "output_attentions"),
    ],
)
def test_attention_refuses_keywords_it_does_not_implement(kwargs, named):
    with pytest.raises(UnsupportedModelError, match=named) as err:
        _call_attention(**kwargs)
    assert "LlamaAttention" in str(err.value) or "llama" in str(err.value)


def test_attention_passes_through_plumbing_keywords():
    out, _ = _call_attention(position_ids=torch.tensor([[0]]), use_cache=False, s_aux=None)
    assert out.shape == (1, 1, 4, 16)


# --- sliding-window layers keep only the blocks inside their window ------------------------------


@pytest.mark.parametrize(
    ("arch", "has_full_group", "window_blocks"),
    [
        ("mistral", False, 12),  # one group, window 24: (24 + 64 - 2) // 8 + 2 blocks at most
        ("gemma2", True, 11),  # full group keeps all; sliding group (window 16): 11 at most
    ],
)
def test_sliding_layers_hold_only_their_window(arch, has_full_group, window_blocks):
    model = tiny_model(arch, seed=2)
    prompt = (prompts_longer_than_windows(seed=9)[0] * 3)[:376]  # far past every window
    (ref,) = greedy_refs(model, [prompt])
    full = -(-(len(prompt) + MAX_TOKENS) // BLOCK)  # 49 blocks: what one layer group holds
    expected = window_blocks + (full if has_full_group else 0)
    impl = model.config._attn_implementation
    config = EngineConfig(
        num_kv_blocks=200, block_size_tokens=BLOCK, max_num_batched_tokens=CHUNK, runner="paged"
    )
    engine = LLMEngine(model, config=config)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    seq = engine.make_sequence(prompt, params, "interactive", None, None)
    assert engine.ledger.reservation_for(seq) == expected  # what reserve mode books
    engine.submit(seq)
    peak = 0
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
        peak = max(peak, engine.pool.num_used_blocks)
    model.set_attn_implementation(impl)
    assert seq.output_token_ids == ref
    assert peak <= expected < full * engine.pool.num_groups  # without freeing: every group, all


def test_from_pretrained_refuses_features_before_reading_weights(tmp_path):
    """A model directory with only config.json: the refusal comes before any weight is read."""
    import shutil
    from pathlib import Path

    configs = Path(__file__).resolve().parents[2] / "data" / "model_configs"
    shutil.copy(configs / "deepseek-v2-lite" / "config.json", tmp_path)
    with pytest.raises(UnsupportedModelError, match=r"deepseek_v2 .*latent attention \(MLA\)"):
        LLMEngine.from_pretrained(str(tmp_path), EngineConfig(device="cpu"))
